"""The chapter runner: parameters injected, failures, budgets and the offline guard."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import run_chapters
from glued import read_glued
from nbfactory import write_notebook

SPEC = {"budget_s": 120, "parameters": {"n": 3}}


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("chapters")
    params = ("code", "n = 1000", ["parameters"])
    glue = "from myst_nb import glue\nglue('square', n * n, display=False)"
    write_notebook(src / "ok.ipynb", [("md", "# ok"), params, ("code", glue)])
    write_notebook(src / "raises.ipynb", [params, ("code", "raise RuntimeError('boom in cell')")])
    write_notebook(src / "slow.ipynb", [params, ("code", "import time\ntime.sleep(60)")])
    net = ("import socket\n"
           "socket.create_connection(('192.0.2.1', 80), timeout=1)")  # TEST-NET-1: never routed
    write_notebook(src / "network.ipynb", [params, ("code", net)])
    return src


def _run(fixtures: Path, tmp_path: Path, name: str, spec=SPEC, block=True):
    return run_chapters.run_one(name, "ci", spec, tmp_path, threads=1, block_network=block,
                                chapters_dir=fixtures)


def test_parameters_are_injected_and_glued(fixtures, tmp_path) -> None:
    result = _run(fixtures, tmp_path, "ok")
    assert result.status == "ok", result.message
    assert read_glued(result.output) == {"square": 9}
    assert "ok" in run_chapters.format_table([result])


def test_raising_notebook_is_an_error(fixtures, tmp_path) -> None:
    result = _run(fixtures, tmp_path, "raises")
    assert result.status == "error"
    assert "boom in cell" in result.message or "RuntimeError" in result.message


def test_budget_is_enforced(fixtures, tmp_path) -> None:
    result = _run(fixtures, tmp_path, "slow", spec={"budget_s": 8, "parameters": {}})
    assert result.status == "timeout"
    assert result.seconds < 30


def test_network_is_blocked_inside_the_kernel(fixtures, tmp_path) -> None:
    result = _run(fixtures, tmp_path, "network")
    assert result.status == "error"
    log = Path(result.output).with_suffix(".log").read_text()
    assert "network access" in log and "blocked" in log


def test_guard_allows_loopback() -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    threading.Thread(target=lambda: server.accept()[0].close(), daemon=True).start()
    code = (f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=5).close();"
            "import sys\n"
            "try:\n socket.getaddrinfo('example.org', 80)\nexcept OSError as e:\n"
            " sys.exit(0 if 'blocked' in str(e) else 3)\nsys.exit(4)")
    env = run_chapters.runner_env(threads=1, block_network=True)
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    server.close()
    assert proc.returncode == 0, proc.stderr


def test_ci_profile_names_only_real_chapters() -> None:
    specs = run_chapters.load_profile("ci")
    assert set(specs) == set(run_chapters.chapter_names())
    for name, spec in specs.items():
        assert 0 < spec["budget_s"] <= 300, f"{name}: ci budget must be at most 5 minutes"


def test_set_overrides_are_parsed_as_yaml() -> None:
    assert run_chapters.parse_overrides(["use_real_data=false", "seed=1", "sizes=[8, 16]", "name=a=b"]) == {
        "use_real_data": False, "seed": 1, "sizes": [8, 16], "name": "a=b"}
    for bad in ("no_equals", "=1", "not an identifier=1"):
        with pytest.raises(SystemExit, match="NAME=VALUE"):
            run_chapters.parse_overrides([bad])
