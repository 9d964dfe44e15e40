"""The environment is the pinned one, and the README's commands are the ones CI runs."""

from __future__ import annotations

import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import lock

ROOT = Path(__file__).resolve().parents[1]


def test_environment_yml_mirrors_constraints() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "book" / "tools" / "lock.py"), "--check"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_installed_versions_match_the_pins() -> None:
    pins = lock.read_pins(ROOT / "constraints.txt")
    wrong = {}
    for name, version in pins.items():
        try:
            got = metadata.version(name)
        except metadata.PackageNotFoundError:
            wrong[name] = (version, "not installed")
            continue
        if got.split("+")[0] != version:
            wrong[name] = (version, got)
    assert not wrong, f"installed versions differ from constraints.txt: {wrong}"


def test_bench_extra_is_pinned_and_optional() -> None:
    # The [bench] extra (make bench) is pinned at the end of constraints.txt, apart from the
    # base environment: installed or not, never a different version than pinned.
    import tomllib

    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]["bench"]
    names = {re.split(r"[<>=!~ ]", r, maxsplit=1)[0].lower() for r in extra}
    bench = lock.read_pins(ROOT / "constraints.txt", bench=True)
    assert names == set(bench), (names, bench)
    assert not names & set(lock.read_pins(ROOT / "constraints.txt"))
    for name, version in bench.items():
        try:
            got = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
        assert got.split("+")[0] == version, (name, got, version)


def test_reference_stack_pins() -> None:
    pins = lock.read_pins(ROOT / "constraints.txt")
    assert pins["torch"] == "2.13.0"
    assert pins["jax"] == pins["jaxlib"] == "0.5.3"
    assert pins["neural-tangents"] == "0.6.5"
    assert pins["jupyter-book"].startswith("1.")


def test_ci_runs_the_readme_test_command() -> None:
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    commands = re.findall(r"^\s*(make \w+.*)$", ci, re.M)
    assert commands == ["make test"], commands
    assert "make test" in readme and "make book" in readme
