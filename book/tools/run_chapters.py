"""Execute chapters headless with papermill under a named profile.

    python book/tools/run_chapters.py                      # every chapter, ci profile
    python book/tools/run_chapters.py --profile full 01_ntk
    python book/tools/run_chapters.py --jobs 1 --out /tmp/run
    python book/tools/run_chapters.py --profile full --set use_real_data=false 02_random_features

Each notebook in ``chapters/`` runs in its own papermill process with the parameters
of ``book/profiles.yaml`` injected after its ``parameters`` cell, a wall-clock budget
(``budget_s``; the process group is killed when it runs over), network access blocked
(see ``netguard/sitecustomize.py``) and ``OMP_NUM_THREADS`` set so that parallel jobs
share the cores instead of oversubscribing them (``NN_KERNELS_THREADS=1`` forces one
thread per chapter, the safe choice on a machine busy with other work). Executed copies go to
``<out>/<profile>/<chapter>.ipynb`` (outside the source tree); a summary table
(chapter, profile, seconds, status) is printed and written as ``summary.json``.
The exit status is non-zero when any chapter fails or runs over its budget.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterable

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHAPTERS = ROOT / "chapters"
PROFILES = ROOT / "book" / "profiles.yaml"
NETGUARD = Path(__file__).resolve().parent / "netguard"
DEFAULT_OUT = ROOT / "_build" / "executed"
FULL_BUDGET_S = 6 * 3600


@dataclasses.dataclass
class Result:
    chapter: str
    profile: str
    seconds: float
    status: str  # "ok", "error", "timeout"
    threads: int
    output: str
    message: str = ""


def chapter_names() -> list[str]:
    """Stems of every notebook in chapters/, in book order."""
    return sorted(p.stem for p in CHAPTERS.glob("*.ipynb"))


def load_profile(profile: str) -> dict[str, dict[str, Any]]:
    """Return ``{chapter: {"budget_s": int, "parameters": dict}}`` for a profile."""
    data = yaml.safe_load(PROFILES.read_text()) or {}
    if profile not in data:
        raise SystemExit(f"unknown profile {profile!r}; {PROFILES.name} defines {sorted(data)}")
    section = data[profile] or {}
    out: dict[str, dict[str, Any]] = {}
    for name in chapter_names():
        entry = section.get(name) or {}
        out[name] = {
            "budget_s": int(entry.get("budget_s", FULL_BUDGET_S)),
            "parameters": dict(entry.get("parameters") or {}),
        }
    unknown = sorted(set(section) - set(out))
    if unknown:
        raise SystemExit(f"{PROFILES.name}: profile {profile!r} names unknown chapters {unknown}")
    return out


def runner_env(threads: int, block_network: bool = True) -> dict[str, str]:
    """Environment for a papermill process: thread count, offline guard, quiet TF/JAX."""
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[var] = str(threads)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.setdefault("JAX_PLATFORMS", "cpu")
    env.setdefault("PYTHONHASHSEED", "0")
    env.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    env["NN_KERNELS_PROFILE"] = env.get("NN_KERNELS_PROFILE", "")
    if block_network:
        env["NN_KERNELS_NO_NETWORK"] = "1"
        env["PYTHONPATH"] = os.pathsep.join(
            [str(NETGUARD)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
        )
    return env


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run_one(
    chapter: str,
    profile: str,
    spec: dict[str, Any],
    out_dir: Path,
    threads: int,
    block_network: bool = True,
    chapters_dir: Path = CHAPTERS,
) -> Result:
    """Execute one chapter; never raises for a failing notebook (the Result says so)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    output = out_dir / f"{chapter}.ipynb"
    log = out_dir / f"{chapter}.log"
    env = runner_env(threads, block_network)
    env["NN_KERNELS_PROFILE"] = profile
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as fh:
        yaml.safe_dump(spec["parameters"], fh)
        params_file = fh.name
    cmd = [
        sys.executable, "-m", "papermill", str(chapters_dir / f"{chapter}.ipynb"), str(output),
        "-f", params_file, "--cwd", str(chapters_dir), "-k", "python3",
        "--no-progress-bar", "--log-level", "WARNING",
    ]
    start = time.perf_counter()
    status, message = "ok", ""
    with open(log, "w") as logfh:
        proc = subprocess.Popen(cmd, stdout=logfh, stderr=subprocess.STDOUT, env=env,
                                cwd=ROOT, start_new_session=True)
        try:
            rc = proc.wait(timeout=spec["budget_s"])
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            proc.wait()
            status, message = "timeout", f"ran over its budget of {spec['budget_s']} s"
        else:
            _kill_group(proc)  # stray kernel processes, if any
            if rc != 0:
                status = "error"
                message = _last_error(log)
    os.unlink(params_file)
    return Result(chapter, profile, round(time.perf_counter() - start, 1), status, threads,
                  str(output), message)


def _last_error(log: Path) -> str:
    lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    for ln in reversed(lines):
        if "Error" in ln or "Exception" in ln:
            return ln.strip()[:300]
    return lines[-1][:300] if lines else "papermill failed without output"


def run(
    chapters: Iterable[str],
    profile: str = "ci",
    out: Path = DEFAULT_OUT,
    jobs: int | None = None,
    block_network: bool = True,
    overrides: dict[str, Any] | None = None,
) -> list[Result]:
    """Run chapters (in parallel where cores allow) and write ``summary.json``.

    ``overrides`` are parameters injected on top of the profile's, in every chapter run
    (e.g. ``{"use_real_data": False}`` for a full run on a machine without network).
    """
    specs = load_profile(profile)
    for spec in specs.values():
        spec["parameters"].update(overrides or {})
    chapters = list(chapters)
    missing = [c for c in chapters if c not in specs]
    if missing:
        raise SystemExit(f"no such chapter(s) {missing}; chapters are {sorted(specs)}")
    cores = os.cpu_count() or 1
    jobs = max(1, min(jobs or cores, len(chapters) or 1, cores))
    # NN_KERNELS_THREADS overrides the split: on a machine shared with other work,
    # 1 thread per chapter avoids OpenMP threads waiting on each other for busy cores.
    threads = int(os.environ.get("NN_KERNELS_THREADS") or max(1, cores // jobs))
    out_dir = Path(out) / profile
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        results = list(pool.map(
            lambda c: run_one(c, profile, specs[c], out_dir, threads, block_network), chapters))
    (out_dir / "summary.json").write_text(
        json.dumps([dataclasses.asdict(r) for r in results], indent=2))
    return results


def parse_overrides(items: Iterable[str]) -> dict[str, Any]:
    """``["use_real_data=false", "seed=1"]`` -> ``{"use_real_data": False, "seed": 1}`` (values as YAML)."""
    out: dict[str, Any] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip().isidentifier():
            raise SystemExit(f"--set expects NAME=VALUE with a Python identifier as NAME, got {item!r}")
        out[name.strip()] = yaml.safe_load(value)
    return out


def format_table(results: list[Result]) -> str:
    rows = [("chapter", "profile", "seconds", "threads", "status")]
    rows += [(r.chapter, r.profile, f"{r.seconds:.1f}", str(r.threads),
              r.status + (f" ({r.message})" if r.message else "")) for r in results]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row[:4], widths)) + "  " + row[4]
             for row in rows]
    lines.insert(1, "-" * max(len(ln) for ln in lines))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("chapters", nargs="*", help="chapter stems (default: all)")
    ap.add_argument("--profile", default="ci", help="profile in book/profiles.yaml (ci, full)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder")
    ap.add_argument("--jobs", type=int, default=None, help="parallel notebooks (default: cores)")
    net = ap.add_mutually_exclusive_group()
    net.add_argument("--allow-network", dest="block", action="store_false", default=None,
                     help="let notebooks reach the network (full-size fetchers)")
    net.add_argument("--block-network", dest="block", action="store_true",
                     help="refuse non-loopback connections (the default for the ci profile)")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="NAME=VALUE",
                    help="inject a parameter on top of the profile's (VALUE is read as YAML); repeatable")
    args = ap.parse_args(argv)
    block = (args.profile == "ci") if args.block is None else args.block
    results = run(args.chapters or chapter_names(), args.profile, args.out, args.jobs,
                  block_network=block, overrides=parse_overrides(args.overrides))
    print(format_table(results))
    return 0 if all(r.status == "ok" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
