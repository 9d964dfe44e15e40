"""Readers for what chapters show but do not compute: benchmark results and recorded runs.

Both live in the repository (``benchmarks/results/<name>.json`` written by the
``bench_*.py`` scripts, ``book/runs/<chapter>.<profile>.json`` written by
``book/tools/record_run.py``), located through this package, so a chapter needs no
relative path and works from any working directory.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path
from typing import Any, Mapping, Sequence

ROOT = Path(__file__).resolve().parents[2]
BENCH_RESULTS = ROOT / "benchmarks" / "results"
RUNS = ROOT / "book" / "runs"


def _check_name(name: str, what: str) -> str:
    if not isinstance(name, str) or not name or "/" in name or name.startswith("."):
        raise ValueError(f"{what} must be a plain name like '01_ntk' or 'toeplitz', got {name!r}")
    return name


def chapter_parameters(chapter: str) -> dict[str, Any]:
    """The teaching-scale values of ``chapters/<chapter>.ipynb``'s ``parameters`` cell, as a dict.

    The recording tools (``book/tools/record_*.py``) run a chapter with these values and store
    them beside what they record, so the chapter can check that a record matches its settings.
    """
    import nbformat

    _check_name(chapter, "chapter")
    path = ROOT / "chapters" / f"{chapter}.ipynb"
    if not path.exists():
        raise ValueError(f"chapter {chapter!r} has no notebook at {path}")
    nb = nbformat.read(str(path), as_version=4)
    cells = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    if len(cells) != 1:
        raise ValueError(f"chapter {chapter!r} has {len(cells)} cells tagged 'parameters', expected 1")
    ns: dict[str, Any] = {}
    exec(cells[0].source, ns)  # noqa: S102 - the project's own parameters cell (literals only: test_notebook_hygiene)
    return {k: v for k, v in ns.items() if not k.startswith("__")}


def bench_results(name: str) -> dict[str, Any] | None:
    """The committed results of ``benchmarks/bench_<name>.py`` (``machine``, ``rows``, ...).

    ``None`` when that benchmark has not been run (the chapter then says so).
    """
    path = BENCH_RESULTS / f"bench_{_check_name(name, 'name')}.json"
    if not path.exists():
        return None
    return json.loads(path.read_text())


def machine_line(machine: dict[str, Any]) -> str:
    """One line describing the machine of a results file: ``key = value, ...``."""
    return ", ".join(f"{key} = {value}" for key, value in machine.items())


def code_hash(notebook: Path | str) -> str:
    """Hash of a notebook's code cells (not its prose): what a recorded run depends on."""
    import nbformat

    nb = nbformat.reads(Path(notebook).read_text(), as_version=4) if Path(notebook).exists() else None
    if nb is None:
        raise FileNotFoundError(notebook)
    return hash_cells(nb)


def hash_cells(nb: Any) -> str:
    """Hash of the code cells of a notebook object (see :func:`code_hash`)."""
    h = hashlib.sha256()
    for cell in nb.cells:
        if cell.cell_type == "code":
            h.update(b"\0" + cell.source.encode())
    return h.hexdigest()[:16]


def _code_hash_at(commit: str, chapter: str) -> str | None:
    import nbformat

    try:
        text = subprocess.run(["git", "-C", str(ROOT), "show", f"{commit}:chapters/{chapter}.ipynb"],
                              capture_output=True, text=True, check=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return hash_cells(nbformat.reads(text, as_version=4))


def recorded_run(chapter: str, profile: str = "full") -> dict[str, Any] | None:
    """The recorded run of ``chapter`` under ``profile``, or ``None`` when there is none.

    Adds ``current``: whether the chapter's code cells are still those the run executed
    (``code_hash`` in the record, or the chapter at the record's ``commit``); ``False``
    means the record predates changes to the experiments and should be re-recorded with
    ``make record``; ``None`` when that cannot be told.
    """
    path = RUNS / f"{_check_name(chapter, 'chapter')}.{_check_name(profile, 'profile')}.json"
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    then = data.get("code_hash") or _code_hash_at(str(data.get("commit", "")), chapter)
    now = code_hash(ROOT / "chapters" / f"{chapter}.ipynb")
    data["current"] = None if then is None else then == now
    return data


#: Recorded scales, largest first: ``paper`` (the papers' settings), ``record`` (the largest
#: that fit about 90 min on two cores) and ``full`` (the profile these two replaced).
RECORD_PROFILES = ("paper", "record", "full")


def run_seconds(data: Mapping[str, Any]) -> float | None:
    """A record's wall time over all its starts: a run resumed from the result store keeps the
    wall times of its earlier starts in ``earlier_starts_seconds``."""
    if data.get("seconds") is None:
        return None
    return data["seconds"] + sum(data.get("earlier_starts_seconds", []))


def run_starts(data: Mapping[str, Any]) -> int:
    """How many starts a record's run took (see :func:`run_seconds`)."""
    return 1 + len(data.get("earlier_starts_seconds", []))


def largest_recorded_run(chapter: str) -> dict[str, Any] | None:
    """The chapter's record at the largest scale that has one, preferring a current record
    (:func:`recorded_run`); ``None`` when the chapter has no record."""
    found = [r for r in (recorded_run(chapter, p) for p in RECORD_PROFILES) if r is not None]
    current = [r for r in found if r["current"]]
    return (current or found or [None])[0]


def _show(value: Any, spec: str) -> str:
    return "—" if value is None else value if isinstance(value, str) else spec.format(value)


def paper_scale_rows(rows: Sequence[tuple[str, str, str]], this_run: dict[str, Any],
                     record: dict[str, Any] | None) -> list[list[str]]:
    """Table rows ``[what, this run, recorded run]`` for ``(what, glued name, format)`` rows."""
    recorded = (record or {}).get("values", {})
    return [[label, _show(this_run.get(key), spec), _show(recorded.get(key), spec)]
            for label, key, spec in rows]


#: what :func:`show_recorded_run` glues about the record itself, as ``<prefix>_full_<name>``
RECORD_META = ("recorded", "minutes", "threads", "current")


def show_recorded_run(chapter: str, prefix: str, rows: Sequence[tuple[str, str, str]],
                      this_run: dict[str, Any], record: Any, profile: str = "full") -> dict[str, Any] | None:
    """Show a chapter's recorded paper-scale run beside this run, and glue its values.

    Prints where the record comes from (date, commit, minutes, threads, note, and whether
    the chapter's code changed since), displays a table ``what | this run | recorded run``
    for ``rows`` of ``(what, glued name, format)``, and records every recorded value of the
    chapter as ``<prefix>_full_<name without prefix>`` (each row's "n/a" when the record lacks it)
    plus
    ``<prefix>_full_recorded``, ``_minutes``, ``_threads`` and ``_current`` for the
    prose. ``record`` is the chapter's :class:`~nnk_book.Recorder`. Returns the record.
    With ``profile="full"`` (the chapters' default) the largest recorded scale is shown
    (:func:`largest_recorded_run`: ``paper``, then ``record``, then the older ``full``).
    """
    from IPython.display import display

    from nnk_book.results import html_table

    data = largest_recorded_run(chapter) if profile == "full" else recorded_run(chapter, profile)
    if data is not None:
        profile = data.get("profile", profile)
    values = (data or {}).get("values", {})
    if data is None:
        print(f"book/runs/{chapter}.{profile}.json is missing: run `make record CHAPTERS={chapter}` "
              "to record the paper-scale version")
    else:
        machine = data.get("machine", {})
        state = {True: "the chapter's code is unchanged since",
                 False: "the chapter's code changed since (re-record with make record to be sure "
                        "the numbers are current)",
                 None: "whether the chapter changed since cannot be told"}[data["current"]]
        starts = run_starts(data)
        print(f"recorded {data['recorded']} at commit {data['commit']}: {run_seconds(data) / 60:.0f} min"
              f"{f' in {starts} starts' if starts > 1 else ''} on "
              f"{machine.get('cpu', '?')} with {machine.get('threads', '?')} thread(s); {state}. "
              f"Note: {data.get('note') or 'none'}")
        display(html_table(["result", "this run", f"recorded {profile} run"],
                           paper_scale_rows(rows, this_run, data)))
    copies = {key: values[key] for key in values if key.startswith(f"{prefix}_")}
    copies.update({key: values.get(key, "n/a") for _, key, _ in rows})
    for key, value in copies.items():
        record(f"{prefix}_full_{key[len(prefix) + 1:]}", value)
    meta = {"recorded": data["recorded"] if data else "n/a",
            "minutes": run_seconds(data) / 60 if data else "n/a",
            "threads": data.get("machine", {}).get("threads", "n/a") if data else "n/a",
            "current": bool(data and data["current"])}
    for name in RECORD_META:
        record(f"{prefix}_full_{name}", meta[name])
    return data
