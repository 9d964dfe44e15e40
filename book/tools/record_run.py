"""Record the results of an executed chapter so that the book can show them later.

    python book/tools/record_run.py _build/run/record/02_random_features.ipynb --profile record \\
        --note "use_real_data = False: the machine had no network for MNIST"

A ``record`` run of a chapter (the largest settings that fit about 90 minutes on two
cores) or a ``paper`` run (the paper's settings) takes too long to
repeat on every book build. This script reads the values the executed notebook glued
(``myst_nb.glue``), the parameters papermill injected and the run time, adds the date,
the commit, the machine and a free-text note, and writes them to
``book/runs/<chapter>.<profile>.json`` (atomically: a failed write leaves the previous
record intact). The page "Reproduction scorecard" shows each chapter's largest current record,
and the book's prose shows its values through the ``{recorded}`` role (``book/_ext/recorded.py``);
``tests/test_runs.py`` checks the recorded numbers against the claims in
``tests/expected/<chapter>.yaml`` (section ``<profile>_checks``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

import nbformat

from nnk_book.records import RECORD_PROFILES, fingerprint, hash_cells, machine_dependent
from nnk_book.files import atomic_write_text
from nnk_book.results import read_glued

ROOT = Path(__file__).resolve().parents[2]

RUNS = ROOT / "book" / "runs"


def _jsonable(value: Any) -> Any:
    """Glued values as JSON: numbers, booleans and strings; non-finite floats as strings."""
    if isinstance(value, bool) or isinstance(value, (int, str)) or value is None:
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    return str(value)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def executed_code_hash(nb: Any) -> str:
    """:func:`nnk_book.records.code_hash` of the code an executed notebook ran (its
    injected-parameters cell left out, so it compares with the chapter's source)."""
    source = nbformat.v4.new_notebook(cells=[
        c for c in nb.cells if "injected-parameters" not in c.get("metadata", {}).get("tags", [])])
    return hash_cells(source)


def parse_set(items: list[str] | None) -> dict[str, Any]:
    """``["use_real_data=false", "n_test=832"]`` (``run_chapters.py --set``) as a dict of values."""
    import yaml

    out: dict[str, Any] = {}
    for item in items or []:
        name, sep, value = item.partition("=")
        if not sep or not name.isidentifier():
            raise ValueError(f"set: expected NAME=VALUE, got {item!r}")
        out[name] = yaml.safe_load(value)
    return out


def teaching_fingerprint(teaching: Path, chapter: str, code_hash: str, commit: str, made: str) -> dict[str, Any]:
    """The fingerprint a record keeps of the teaching run of its own commit: the values a ``ci``
    run of the same chapter code glued, less the machine-dependent ones
    (:func:`nnk_book.records.machine_dependent`). ``ValueError`` when ``teaching`` is not a
    complete ci run of the same chapter code."""
    nb = nbformat.read(str(teaching), as_version=4)
    meta = nb.metadata.get("papermill", {})
    if Path(meta.get("input_path") or "").stem != chapter:
        raise ValueError(f"teaching: {teaching} is not an executed {chapter}")
    if meta.get("parameters"):
        raise ValueError(f"teaching: {teaching} ran with injected parameters {meta['parameters']}; "
                         "the fingerprint is the ci profile's (the notebook's own parameters)")
    if any(c.get("metadata", {}).get("papermill", {}).get("exception") for c in nb.cells):
        raise ValueError(f"teaching: {teaching} raised; use a complete run")
    if executed_code_hash(nb) != code_hash:
        raise ValueError(f"teaching: {teaching} ran other chapter code than the record (code hash "
                         f"{executed_code_hash(nb)} against {code_hash})")
    values = {name: _jsonable(v) for name, v in read_glued(teaching).items()}
    key = Path(teaching).with_suffix(".key")  # run_chapters.py writes the run's thread count beside it
    threads = json.loads(key.read_text()).get("threads") if key.exists() else None
    return {"commit": commit, "made": made, "threads": threads,
            "values": fingerprint(values, list(machine_dependent(chapter)))}


def add_fingerprint(record_path: Path, teaching: Path, made: str) -> Path:
    """Add a teaching fingerprint to an existing record, from a ci run of the record's commit."""
    data = json.loads(Path(record_path).read_text())
    data["teaching_fingerprint"] = teaching_fingerprint(teaching, data["chapter"], data["code_hash"],
                                                        data["commit"], made)
    atomic_write_text(Path(record_path), json.dumps(data, indent=1, sort_keys=False) + "\n")
    return Path(record_path)


def record(
    executed: Path, profile: str, note: str, threads: int | None, out_dir: Path = RUNS, commit: str | None = None,
    earlier_seconds: list[float] | None = None, teaching: Path | None = None,
    declared: dict[str, Any] | None = None,
) -> Path:
    """Write ``<out_dir>/<chapter>.<profile>.json`` from an executed notebook; return its path.

    ``commit``: the commit whose chapter code was executed (default: the current HEAD).
    ``earlier_seconds``: wall times of the earlier starts of a run resumed from the result
    store (``seconds`` is this start's; the scorecard shows the sum and the number of starts).
    ``teaching``: a ci run of the same commit, whose values become the record's fingerprint
    (the record stays current while a build's teaching values agree with it).
    ``declared``: the parameters set on top of the profile (``run_chapters.py --set``).
    """
    if profile not in RECORD_PROFILES:
        raise ValueError(f"profile must be one of the recorded scales {RECORD_PROFILES}, got {profile!r}")
    earlier = [float(x) for x in (earlier_seconds or [])]
    if any(not math.isfinite(x) or x <= 0 for x in earlier):
        raise ValueError(f"earlier_seconds must be positive numbers of seconds, got {earlier_seconds}")
    nb = nbformat.read(str(executed), as_version=4)
    meta = nb.metadata.get("papermill", {})
    chapter = Path(meta.get("input_path") or executed).stem
    if not (ROOT / "chapters" / f"{chapter}.ipynb").exists():
        raise ValueError(f"{executed} is not an executed chapter: chapters/{chapter}.ipynb does not exist")
    failed = [i for i, c in enumerate(nb.cells) if c.get("metadata", {}).get("papermill", {}).get("exception")]
    if failed:
        raise ValueError(f"{executed} raised in cell(s) {failed}; record only complete runs")
    if threads is None:  # run_chapters.py writes the threads of each run next to the notebooks
        summary = Path(executed).parent / "summary.json"
        if summary.exists():
            threads = next((r.get("threads") for r in json.loads(summary.read_text()) if r.get("chapter") == chapter), None)
    values = read_glued(executed)
    if not values:
        raise ValueError(f"{executed} has no glued values; was it executed?")
    if threads is None:
        threads = int(os.environ.get("OMP_NUM_THREADS", "0")) or None
    duration = meta.get("duration")
    code = executed_code_hash(nb)
    commit = commit or _git("rev-parse", "--short", "HEAD")
    injected = meta.get("parameters", {}) or {}
    for name, value in (declared or {}).items():
        if injected.get(name) != value:
            raise ValueError(f"declared: {name} = {value!r} was not what the run used ({injected.get(name)!r})")
    payload = {
        "chapter": chapter,
        "profile": profile,
        "note": note,
        "recorded": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d"),
        "executed_start": meta.get("start_time"),
        "seconds": round(float(duration), 1) if duration is not None else None,
        **({"earlier_starts_seconds": [round(x, 1) for x in earlier]} if earlier else {}),
        "commit": commit,
        "code_hash": code,
        "parameters": injected,
        **({"set": dict(declared)} if declared else {}),
        "machine": {"cpu": _cpu_model(), "logical_cores": os.cpu_count(), "threads": threads},
        "values": {name: _jsonable(v) for name, v in sorted(values.items())},
    }
    if teaching is not None:
        payload["teaching_fingerprint"] = teaching_fingerprint(
            teaching, chapter, code, commit, f"the ci run beside this run ({payload['recorded']})")
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{chapter}.{profile}.json"
    # Atomically (temporary file, fsync, rename): on a full disk or Ctrl-C the previous
    # record stays whole instead of becoming a truncated JSON file that chapters read.
    atomic_write_text(path, json.dumps(payload, indent=1, sort_keys=False) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("executed", type=Path, help="executed notebook (papermill output)")
    parser.add_argument("--profile", default="record", choices=RECORD_PROFILES,
                        help="profile the notebook ran under (default: record)")
    parser.add_argument("--note", default="", help="how the run departed from the profile, and why")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads the run used (default: from run_chapters.py's summary.json, "
                             "else OMP_NUM_THREADS)")
    parser.add_argument("--commit", default=None,
                        help="commit whose chapter code was executed, when not the current HEAD")
    parser.add_argument("--earlier-seconds", type=float, nargs="+", default=None, metavar="S",
                        help="wall times (s) of the earlier starts of a run resumed from the result store")
    parser.add_argument("--teaching", type=Path, default=None,
                        help="a ci run of the same commit (run_chapters.py --profile ci): its glued values "
                             "become the record's fingerprint, which keeps the record current")
    parser.add_argument("--set", action="append", default=None, metavar="NAME=VALUE",
                        help="a parameter the run set on top of its profile (as given to run_chapters.py)")
    parser.add_argument("--add-fingerprint", type=Path, default=None, metavar="RECORD",
                        help="instead of recording: add --teaching's fingerprint to this existing record "
                             "(the ci run must be of the record's commit)")
    args = parser.parse_args(argv)
    try:
        if args.add_fingerprint is not None:
            if args.teaching is None:
                parser.error("--add-fingerprint needs --teaching")
            import datetime as _dt

            path = add_fingerprint(args.add_fingerprint, args.teaching,
                                   f"afterwards ({_dt.date.today()}), by a ci run of the record's commit")
            print(f"added the teaching fingerprint to {path}")
            return 0
        path = record(args.executed, args.profile, args.note, args.threads, commit=args.commit,
                      earlier_seconds=args.earlier_seconds, teaching=args.teaching, declared=parse_set(args.set))
    except ValueError as err:
        parser.error(str(err))
    print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
