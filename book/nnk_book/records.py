"""Readers for what chapters show but do not compute: benchmark results and recorded runs.

Both live in the repository (``benchmarks/results/<name>.json`` written by the
``bench_*.py`` scripts, ``book/runs/<chapter>.<profile>.json`` written by
``book/tools/record_run.py``), located through this package, so a chapter needs no
relative path and works from any working directory.
"""

from __future__ import annotations

import hashlib
import json
import math
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


def file_at(commit: str, path: str) -> str | None:
    """The text of the repository file ``path`` at ``commit`` (``None`` when git cannot show it)."""
    try:
        return subprocess.run(["git", "-C", str(ROOT), "show", f"{commit}:{path}"],
                              capture_output=True, text=True, check=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None


def _code_hash_at(commit: str, chapter: str) -> str | None:
    import nbformat

    text = file_at(commit, f"chapters/{chapter}.ipynb")
    return None if text is None else hash_cells(nbformat.reads(text, as_version=4))


def recorded_run(chapter: str, profile: str, runs: Path | None = None) -> dict[str, Any] | None:
    """The recorded run of ``chapter`` under ``profile`` (``record`` or ``paper``), or ``None``
    when there is none. ``runs``: the folder of records (default ``book/runs``).

    Adds ``current``: whether the chapter's code cells are still those the run executed
    (``code_hash`` in the record, or the chapter at the record's ``commit``); ``False``
    means the record predates changes to the experiments and should be re-recorded with
    ``make record``; ``None`` when that cannot be told (also for a chapter that has no
    notebook in ``chapters/``). The scorecard's finer rule is :func:`record_currency`.
    """
    path = (RUNS if runs is None else Path(runs)) / f"{_check_name(chapter, 'chapter')}.{_check_name(profile, 'profile')}.json"
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    notebook = ROOT / "chapters" / f"{chapter}.ipynb"
    then = data.get("code_hash") or _code_hash_at(str(data.get("commit", "")), chapter)
    now = code_hash(notebook) if notebook.exists() else None
    data["current"] = None if then is None or now is None else then == now
    return data


# --------------------------------------------------------------------------- is a record current?
#: relative and absolute tolerance of the fingerprint comparison: a float glued by the teaching
#: run may move by rounding between thread counts and CPUs (chapter 6: under 1e-6 relative);
#: anything larger is a change of the computation
FINGERPRINT_RTOL = 1e-5
FINGERPRINT_ATOL = 1e-9
EXPECTED = ROOT / "tests" / "expected"


def machine_dependent(chapter: str) -> dict[str, str]:
    """The chapter's glued names (``fnmatch`` patterns) whose teaching value depends on the
    machine or the moment, not on the code (wall-clock timings, speed ratios), with the reason:
    section ``machine_dependent`` of ``tests/expected/<chapter>.yaml``. They are left out of a
    record's fingerprint."""
    import yaml

    path = EXPECTED / f"{_check_name(chapter, 'chapter')}.yaml"
    data = yaml.safe_load(path.read_text()) if path.exists() else {}
    section = (data or {}).get("machine_dependent") or {}
    if not isinstance(section, Mapping):
        raise ValueError(f"{path}: machine_dependent must map name patterns to reasons")
    return dict(section)


def _is_machine_dependent(name: str, patterns: Sequence[str]) -> bool:
    from fnmatch import fnmatchcase

    return any(fnmatchcase(name, p) for p in patterns)


def fingerprint(values: Mapping[str, Any], patterns: Sequence[str]) -> dict[str, Any]:
    """The teaching-scale glued values that depend only on the code and its inputs: ``values``
    without the names matching ``patterns`` (:func:`machine_dependent`)."""
    return {k: v for k, v in sorted(values.items()) if not _is_machine_dependent(k, patterns)}


def _same(then: Any, now: Any) -> bool:
    def number(x: Any) -> bool:
        return isinstance(x, (int, float)) and not isinstance(x, bool)

    if number(then) and number(now):
        a, b = float(then), float(now)
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return a == b or abs(a - b) <= FINGERPRINT_ATOL + FINGERPRINT_RTOL * max(abs(a), abs(b))
    return type(then) is type(now) and then == now


def fingerprint_changes(then: Mapping[str, Any], now: Mapping[str, Any], patterns: Sequence[str] = ()) -> list[str]:
    """What differs between a record's teaching fingerprint ``then`` and this build's teaching
    values ``now`` (names matching ``patterns`` left out): one line per changed name. A name the
    chapter glues only now is not a change (a new result); one it no longer glues is."""
    changes = []
    for name, old in then.items():
        if _is_machine_dependent(name, patterns):
            continue
        if name not in now:
            changes.append(f"{name} is no longer glued")
        elif not _same(old, now[name]):
            changes.append(f"{name}: {old!r} then, {now[name]!r} now")
    return changes


def parameter_deviations(parameters: Mapping[str, Any], profile: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """``{name: (run's value, profile's value)}`` for every parameter where a run departs from
    its profile (a name missing on one side counts, as ``None``)."""
    return {k: (parameters.get(k), profile.get(k)) for k in sorted(set(parameters) | set(profile))
            if parameters.get(k) != profile.get(k)}


def record_currency(data: Mapping[str, Any], teaching: Mapping[str, Any] | None,
                    profile_parameters: Mapping[str, Any] | None,
                    patterns: Sequence[str] = (), threads: int | None = None) -> tuple[bool | None, str | None]:
    """Whether a record is current: its numbers would be the same if it ran today.

    A record stores the teaching-scale values of the commit it ran at (``teaching_fingerprint``).
    It stays current while this build's teaching values (``teaching``) agree with them (to
    :data:`FINGERPRINT_RTOL`; names matching ``patterns`` left out) and its parameters are still
    its profile's (``profile_parameters``) plus the overrides it declared (``set``). Returns
    ``(current, why)``: ``why`` says what changed for a stale record, or why currency cannot be
    told (``current`` ``None``: no fingerprint, no teaching run in this build, or values that
    differ where this build's teaching run used another number of threads (``threads``) than
    the fingerprint's: training in float32 rounds differently per thread count)."""
    if profile_parameters is not None:
        declared = dict(data.get("set") or {})
        moved = parameter_deviations(data.get("parameters", {}), {**profile_parameters, **declared})
        if moved:
            return False, ("the profile's parameters changed since the run: " + "; ".join(
                f"{k} = {run!r} in the run, {now!r} in the profile now" for k, (run, now) in moved.items()))
    stored = data.get("teaching_fingerprint")
    if not stored:
        return None, "the record has no teaching fingerprint"
    if teaching is None:
        return None, "this build has no teaching run of the chapter to compare with"
    changes = fingerprint_changes(stored.get("values", {}), teaching, patterns)
    if changes and threads is not None and stored.get("threads") not in (None, threads):
        return None, (f"this build ran the chapter at {threads} thread(s), its fingerprint at {stored['threads']}, "
                      f"and {len(changes)} value(s) differ, as rounding across thread counts can make them")
    if changes:
        shown = changes[:5] + ([f"and {len(changes) - 5} more"] if len(changes) > 5 else [])
        return False, (f"the teaching values changed since commit {stored.get('commit', data.get('commit'))}: "
                       + "; ".join(shown))
    return True, None


#: Recorded scales, largest first: ``paper`` (the papers' settings) and ``record`` (the largest
#: that fit about 90 min on two cores).
RECORD_PROFILES = ("paper", "record")


def run_seconds(data: Mapping[str, Any]) -> float | None:
    """A record's wall time over all its starts: a run resumed from the result store keeps the
    wall times of its earlier starts in ``earlier_starts_seconds``."""
    if data.get("seconds") is None:
        return None
    return data["seconds"] + sum(data.get("earlier_starts_seconds", []))


def run_starts(data: Mapping[str, Any]) -> int:
    """How many starts a record's run took (see :func:`run_seconds`)."""
    return 1 + len(data.get("earlier_starts_seconds", []))


def largest_recorded_run(chapter: str, runs: Path | None = None) -> dict[str, Any] | None:
    """The chapter's record at the largest scale that has one, preferring a current record
    (:func:`recorded_run`'s ``current``); ``None`` when the chapter has no record."""
    found = [r for r in (recorded_run(chapter, p, runs) for p in RECORD_PROFILES) if r is not None]
    current = [r for r in found if r["current"]]
    return (current or found or [None])[0]


PROFILES = ROOT / "book" / "profiles.yaml"


def profile_parameters(chapter: str, profile: str) -> dict[str, Any]:
    """The parameters ``book/profiles.yaml`` gives ``chapter`` under ``profile`` (``{}`` when none)."""
    import yaml

    profiles = yaml.safe_load(PROFILES.read_text()) if PROFILES.exists() else {}
    return dict(((profiles or {}).get(profile) or {}).get(chapter, {}).get("parameters") or {})


def provenance_anchor(chapter: str) -> str:
    """The HTML id of the chapter's line on the scorecard page that says where its records come from."""
    return f"provenance-{_check_name(chapter, 'chapter')}"


def current_record(chapter: str, teaching: Mapping[str, Any] | None, threads: int | None = None,
                   runs: Path | None = None) -> tuple[dict[str, Any] | None, bool | None, str | None]:
    """The chapter's record the book shows, by the scorecard's currency rule: the largest
    current record (:func:`record_currency` against this build's teaching values ``teaching``,
    run at ``threads``), else the largest whose currency cannot be told, else the largest
    stale one. Returns ``(record, current, why)``; ``(None, None, None)`` when the chapter has
    no record. ``runs``: the folder of records (default ``book/runs``)."""
    patterns = list(machine_dependent(chapter))
    found = []
    for profile in RECORD_PROFILES:
        data = recorded_run(chapter, profile, runs)
        if data is not None:
            current, why = record_currency(data, teaching, profile_parameters(chapter, profile), patterns, threads)
            found.append((data, current, why))
    for wanted in (True, None, False):
        for entry in found:
            if entry[1] is wanted:
                return entry
    return None, None, None
