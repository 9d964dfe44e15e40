"""Recorded runs of chapters (``book/runs/*.json``, written by ``book/tools/record_run.py``).

A paper-scale run takes too long for CI, so its results are recorded once and shown by the
chapter beside its own run. These tests keep the records honest: each names an existing
chapter and profile, holds only results the chapter still records (a renamed result
would otherwise vanish from the chapter's table without notice), and meets the claims
that ``tests/expected/<chapter>.yaml`` makes for that profile (section ``<profile>_checks``:
``record_checks`` or ``paper_checks``).
The recorder itself is tested on a synthetic executed notebook.
"""

from __future__ import annotations

import json
import sys
import re
from pathlib import Path

import nbformat
import pytest
import yaml

from record_run import record
from nnk_book import checks as claim_checks
from nnk_book.records import RECORD_PROFILES
from test_chapters import load_expected, parse_expected

ROOT = Path(__file__).resolve().parents[1]
RECORDS = sorted((ROOT / "book" / "runs").glob("*.json"))
REQUIRED = {"chapter", "profile", "note", "recorded", "seconds", "commit", "parameters", "machine", "values"}


def recorded_name_patterns(chapter: str) -> list[re.Pattern]:
    """Names the chapter's source passes to ``record(...)``; f-string fields match any word.

    A name recorded through a variable (``for key, ... in (("tnn_lr_fd_verdict", ...), ...):
    record(key, ...)``) counts when it stands in the code as a string literal of a glued
    name's shape (``prefix_rest``)."""
    nb = nbformat.read(str(ROOT / "chapters" / f"{chapter}.ipynb"), as_version=4)
    source = "\n".join(cell.source for cell in nb.cells if cell.cell_type == "code")
    patterns = []
    for name in re.findall(r'record\(\s*f?"([^"]+)"', source):
        pieces = re.split(r"\{[^}]*\}", name)
        patterns.append(re.compile(r"\w*".join(re.escape(p) for p in pieces)))  # a tag may be ""
    for literal in set(re.findall(r'["\']([a-z]+_[a-z0-9_]+)["\']', source)):
        patterns.append(re.compile(re.escape(literal)))
    return patterns


def test_names_recorded_through_a_variable_count(tmp_path, monkeypatch) -> None:
    import nbformat.v4 as v4

    chapters = tmp_path / "chapters"
    chapters.mkdir()
    nb = v4.new_notebook(cells=[v4.new_code_cell(
        'record("a_plain", 1)\nrecord(f"b_{k}_hw", 2)\nrecord(f"t_sing{tag}", 3)\n'
        'for key in ("c_by_loop", "d_too"):\n    record(key, 3)')])
    nbformat.write(nb, str(chapters / "toy.ipynb"))
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    patterns = recorded_name_patterns("toy")
    for name in ("a_plain", "b_x_hw", "c_by_loop", "d_too", "t_sing", "t_sing_l5"):
        assert any(p.fullmatch(name) for p in patterns), name
    for name in ("a_plainer", "b_x", "e_never"):
        assert not any(p.fullmatch(name) for p in patterns), name


def test_there_are_records_to_check() -> None:
    assert RECORDS, "book/runs/ holds no recorded runs"


@pytest.mark.parametrize("path", RECORDS, ids=[p.stem for p in RECORDS])
def test_record_is_well_formed(path: Path) -> None:
    data = json.loads(path.read_text())
    assert REQUIRED <= set(data), f"missing fields: {sorted(REQUIRED - set(data))}"
    assert path.name == f"{data['chapter']}.{data['profile']}.json"
    assert (ROOT / "chapters" / f"{data['chapter']}.ipynb").exists()
    profiles = yaml.safe_load((ROOT / "book" / "profiles.yaml").read_text())
    assert data["profile"] in profiles and data["profile"] in RECORD_PROFILES
    patterns = recorded_name_patterns(data["chapter"])
    stale = [name for name in data["values"] if not any(p.fullmatch(name) for p in patterns)]
    assert not stale, f"{path.name} holds results the chapter no longer records: {stale}"


#: the keys of a ``<profile>_checks`` section that are not checks
META = ("inherit", "scale_specific", "failed")


def _criteria(spec: dict | None) -> dict:
    """A check without its sentence: what it asserts (the sentence may be edited later)."""
    return {k: v for k, v in (spec or {}).items() if k != "claim"}


def profile_checks(expected: dict, profile: str) -> dict:
    """The predictions a record of ``profile`` is checked against: its section ``<profile>_checks``,
    and, when that section says ``inherit: checks``, every teaching-scale check too, except those
    listed under ``scale_specific`` (a teaching-scale number: a count, FLOP arithmetic of a size).
    The section's own entries override same-named checks; ``failed`` lists the predictions the
    record did not meet, with what it found instead."""
    section = dict(expected.get(f"{profile}_checks") or {})
    inherit = section.get("inherit")
    if inherit not in (None, "checks"):
        raise ValueError(f"{profile}_checks: inherit must be 'checks', got {inherit!r}")
    skip = section.get("scale_specific") or {}
    own = {k: v for k, v in section.items() if k not in META}
    base = {k: v for k, v in (expected.get("checks", {}) if inherit else {}).items() if k not in skip}
    return {**base, **own}


def test_profile_checks_inherit_the_teaching_checks() -> None:
    expected = {"checks": {"a": {"min": 0}, "b": {"max": 1}, "c": {"equals": 3}},
                "record_checks": {"inherit": "checks", "b": {"max": 2}, "scale_specific": {"c": "a count"},
                                  "failed": {"a": "found -1"}}}
    assert profile_checks(expected, "record") == {"a": {"min": 0}, "b": {"max": 2}}
    assert profile_checks({"checks": {"a": {}}, "record_checks": {"c": {}}}, "record") == {"c": {}}
    assert profile_checks({"checks": {"a": {}}}, "paper") == {}
    with pytest.raises(ValueError, match="inherit"):
        profile_checks({"record_checks": {"inherit": "everything"}}, "record")


def prediction_outcomes(checks: dict, values: dict) -> tuple[dict[str, list[str]], list[str]]:
    """``({name: failures}, vacuous)``: the predictions the record does not meet (a missing value
    counts), and those whose ``when:`` condition the record does not satisfy (they predict
    nothing about it)."""
    failures, vacuous = {}, []
    for name, spec in checks.items():
        check = parse_expected("record", name, spec)
        if not claim_checks.applies(check, values):
            vacuous.append(name)
            continue
        met, why = claim_checks.evaluate(check, values[name], values, name=name) if name in values \
            else (False, f"{name}: not in the record")
        if not met:
            failures[name] = [why]
    return failures, vacuous


def test_prediction_outcomes_can_fail() -> None:
    checks = {"a": {"min": 0}, "b": {"equals": "tied"}, "c": {"when": {"flag": True}, "max": 1}, "d": {"max": 1}}
    failures, vacuous = prediction_outcomes(checks, {"a": -1.0, "b": "tied", "c": 5, "flag": False})
    assert set(failures) == {"a", "d"} and vacuous == ["c"]
    failures, vacuous = prediction_outcomes(checks, {"a": 1.0, "b": "ahead", "c": 5, "d": 0, "flag": True})
    assert set(failures) == {"b", "c"} and vacuous == []


def record_predictions(data: dict) -> dict:
    """The predictions a record is checked against: :func:`profile_checks`, less the teaching checks
    added after the record's commit (a check written after a run predicts nothing about it; git
    says which existed then). Skips when git has no history of the record's commit."""
    expected = load_expected(data["chapter"])
    checks = profile_checks(expected, data["profile"])
    then = _expected_or_skip(data)
    section = expected.get(f"{data['profile']}_checks") or {}
    own = {k for k in section if k not in META}
    return {k: v for k, v in checks.items() if k in own or k in (then.get("checks") or {})}


def _expected_or_skip(data: dict) -> dict:
    import subprocess

    then = expected_at(data["commit"], data["chapter"])
    if then is None:
        shallow = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--is-shallow-repository"],
                                 capture_output=True, text=True).stdout.strip()
        if shallow == "true":
            pytest.skip(f"a shallow clone: commit {data['commit']} is not in its history")
        pytest.fail(f"git cannot show tests/expected/{data['chapter']}.yaml at the record's commit {data['commit']}")
    return then


@pytest.mark.parametrize("path", RECORDS, ids=[p.stem for p in RECORDS])
def test_record_predictions_hold_or_are_listed_as_failed(path: Path) -> None:
    """Each prediction either holds on the record or is listed under ``failed`` with what the
    record found; a prediction listed as failed that holds, or a failure not listed, fails here,
    and so does a prediction whose ``when:`` never applies to the record (a vacuous entry)."""
    data = json.loads(path.read_text())
    expected = load_expected(data["chapter"])
    section = expected.get(f"{data['profile']}_checks") or {}
    checks = record_predictions(data)
    assert checks, f"tests/expected/{data['chapter']}.yaml has no {data['profile']}_checks for this record"
    failures, vacuous = prediction_outcomes(checks, data["values"])
    listed = section.get("failed") or {}
    problems = [f"{e} -- claim: {checks[n].get('claim', '')}" for n in sorted(set(failures) - set(listed))
                for e in failures[n]]
    problems += [f"{n}: listed as failed, but the record meets it" for n in sorted(set(listed) - set(failures))]
    problems += [f"{n}: its when: {checks[n]['when']} does not apply to the record (a vacuous prediction: "
                 "list it under scale_specific with the reason)" for n in vacuous]
    problems += [f"{n}: failed needs the record's finding in words" for n, text in listed.items()
                 if not (isinstance(text, str) and text.strip())]
    skip = section.get("scale_specific") or {}
    problems += [f"{n}: scale_specific names no teaching check" for n in skip if n not in expected.get("checks", {})]
    problems += [f"{n}: scale_specific needs its reason" for n, why in skip.items()
                 if not (isinstance(why, str) and why.strip())]
    assert not problems, "\n".join(problems)


def expected_at(commit: str, chapter: str) -> dict | None:
    """``tests/expected/<chapter>.yaml`` as it stood at ``commit`` (``None`` when git cannot tell)."""
    from nnk_book.records import file_at

    text = file_at(commit, f"tests/expected/{chapter}.yaml")
    return None if text is None else (yaml.safe_load(text) or {})


def predictions_then(then: dict, profile: str) -> dict:
    """Every check that stood in the expected file at a record's commit and could predict it: the
    teaching checks and the profile's own section (without its meta keys)."""
    section = {k: v for k, v in (then.get(f"{profile}_checks") or {}).items() if k not in META}
    return {**(then.get("checks") or {}), **section}


def late_predictions(now: dict, then: dict) -> list[str]:
    """The predictions in ``now`` whose criteria were not in the expected file ``then`` (at the
    record's commit): checks written or changed after the run they check."""
    return [name for name, spec in now.items() if _criteria(spec) != _criteria(then.get(name))]


def test_late_predictions_are_found() -> None:
    then = {"a": {"min": 0, "claim": "x"}, "b": {"max": 1}}
    now = {"a": {"min": 0, "claim": "x, reworded"}, "b": {"max": 2}, "c": {"equals": True}}
    assert late_predictions(now, then) == ["b", "c"]


@pytest.mark.parametrize("path", RECORDS, ids=[p.stem for p in RECORDS])
def test_predictions_precede_their_record(path: Path) -> None:
    """A prediction must have been written before the run it predicts: each one (criteria, not
    wording) stands in the expected file at the record's commit, read from git. (A teaching check
    added later is not a prediction of the record at all; one changed later is late.)"""
    data = json.loads(path.read_text())
    then = _expected_or_skip(data)
    late = late_predictions(record_predictions(data), predictions_then(then, data["profile"]))
    assert not late, (f"predictions written or changed after the record's commit {data['commit']} (describe "
                      f"them under {data['profile']}_findings instead, or re-record): {late}")


@pytest.mark.parametrize("path", RECORDS, ids=[p.stem for p in RECORDS])
def test_findings_describe_recorded_values(path: Path) -> None:
    """``<profile>_findings`` (descriptions, shown on the scorecard) name values the record holds,
    each with its sentence."""
    data = json.loads(path.read_text())
    findings = load_expected(data["chapter"]).get(f"{data['profile']}_findings") or {}
    problems = [f"{n}: not in the record" for n in findings if n not in data["values"]]
    problems += [f"{n}: no sentence" for n, t in findings.items() if not (isinstance(t, str) and t.strip())]
    assert not problems, problems


# --------------------------------------------------------------------------- the recorder
def _executed(tmp_path: Path, *, chapter: str = "02_random_features", exception: bool = False) -> Path:
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("record('x', 1.5)")
    cell.outputs = [nbformat.v4.new_output(
        "display_data",
        data={"application/papermill.record/text/plain": "1.5"},
        metadata={"scrapbook": {"name": "rf_x", "mime_prefix": "application/papermill.record/"}},
    ), nbformat.v4.new_output(
        "display_data",
        data={"application/papermill.record/text/plain": "inf"},
        metadata={"scrapbook": {"name": "rf_y", "mime_prefix": "application/papermill.record/"}},
    )]
    cell.metadata["papermill"] = {"exception": exception}
    nb.cells = [cell]
    nb.metadata["papermill"] = {"input_path": f"chapters/{chapter}.ipynb", "duration": 12.34,
                                "parameters": {"seed": 0}, "start_time": "2026-11-23T00:00:00"}
    path = tmp_path / "executed.ipynb"
    nbformat.write(nb, str(path))
    return path


def test_record_writes_the_glued_values(tmp_path: Path) -> None:
    out = record(_executed(tmp_path), "record", "a note", 2, out_dir=tmp_path / "runs")
    data = json.loads(out.read_text())
    assert out.name == "02_random_features.record.json"
    assert data["values"] == {"rf_x": 1.5, "rf_y": "inf"}
    assert data["seconds"] == 12.3 and data["parameters"] == {"seed": 0} and data["note"] == "a note"
    assert data["machine"]["threads"] == 2 and data["machine"]["logical_cores"] >= 1


def test_a_resumed_run_keeps_its_earlier_starts(tmp_path: Path) -> None:
    out = record(_executed(tmp_path), "record", "", 2, out_dir=tmp_path / "runs", earlier_seconds=[3385.4, 3121])
    data = json.loads(out.read_text())
    assert data["seconds"] == 12.3 and data["earlier_starts_seconds"] == [3385.4, 3121.0]
    assert "earlier_starts_seconds" not in json.loads(record(_executed(tmp_path), "record", "", 2,
                                                             out_dir=tmp_path / "one").read_text())
    for bad in ([0.0], [-5.0], [float("nan")]):
        with pytest.raises(ValueError, match="earlier_seconds"):
            record(_executed(tmp_path), "record", "", 2, out_dir=tmp_path / "bad", earlier_seconds=bad)


def test_record_refuses_failed_or_foreign_runs(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="raised in cell"):
        record(_executed(tmp_path, exception=True), "record", "", None, out_dir=tmp_path / "runs")
    with pytest.raises(ValueError, match="not an executed chapter"):
        record(_executed(tmp_path, chapter="no_such_chapter"), "record", "", None, out_dir=tmp_path / "runs")
    with pytest.raises(ValueError, match="profile"):  # only the recorded scales, largest first: paper, record
        record(_executed(tmp_path), "full", "", None, out_dir=tmp_path / "runs")


def test_record_survives_a_full_disk(tmp_path: Path) -> None:
    """A record is written atomically: written in place, a 1,180-byte record would become 300 bytes
    of invalid JSON when the disk fills up. A file-size limit in a child process stands in for the full disk."""
    import os
    import subprocess
    import sys

    runs = tmp_path / "runs"
    old = record(_executed(tmp_path), "record", "the previous record " + "x" * 600, 2, out_dir=runs)
    before = old.read_bytes()
    assert len(before) > 900
    script = (
        "import resource, signal, sys\n"
        "from pathlib import Path\n"
        "from record_run import record\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (400, 400))\n"
        f"record(Path({str(tmp_path / 'executed.ipynb')!r}), 'record', 'new ' + 'y' * 600, 2, out_dir=Path({str(runs)!r}))\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1",
                                   PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "book" / "tools"),
                                                                            os.environ.get("PYTHONPATH")]))))
    assert proc.returncode != 0 and "OSError" in proc.stderr, proc.stderr[-2000:]
    assert old.read_bytes() == before, "the previous record was damaged"
    json.loads(old.read_text())
    assert sorted(p.name for p in runs.iterdir()) == [old.name], "a temporary file was left behind"


def _teaching_copy(tmp_path: Path, **meta) -> Path:
    """The synthetic executed chapter as a ci run (no injected parameters) of the same code."""
    nb = nbformat.read(str(_executed(tmp_path)), as_version=4)
    nb.metadata["papermill"]["parameters"] = {}
    nb.metadata["papermill"].update(meta)
    path = tmp_path / "teaching.ipynb"
    nbformat.write(nb, str(path))
    return path


def test_a_record_keeps_the_fingerprint_of_its_teaching_run(tmp_path: Path) -> None:
    teaching = _teaching_copy(tmp_path)
    out = record(_executed(tmp_path), "record", "", 1, out_dir=tmp_path / "runs", teaching=teaching,
                 declared={"seed": 0})
    data = json.loads(out.read_text())
    assert data["teaching_fingerprint"]["values"] == {"rf_x": 1.5, "rf_y": "inf"}
    assert data["teaching_fingerprint"]["commit"] == data["commit"] and data["set"] == {"seed": 0}
    with pytest.raises(ValueError, match="declared"):
        record(_executed(tmp_path), "record", "", 1, out_dir=tmp_path / "runs", declared={"seed": 5})


def test_a_fingerprint_must_be_a_complete_ci_run_of_the_same_code(tmp_path: Path) -> None:
    from record_run import add_fingerprint, teaching_fingerprint

    out = record(_executed(tmp_path), "record", "", 1, out_dir=tmp_path / "runs")
    data = json.loads(out.read_text())
    with pytest.raises(ValueError, match="injected parameters"):
        teaching_fingerprint(_executed(tmp_path), data["chapter"], data["code_hash"], "c", "now")
    with pytest.raises(ValueError, match="other chapter code"):
        teaching_fingerprint(_teaching_copy(tmp_path), data["chapter"], "0" * 16, "c", "now")
    with pytest.raises(ValueError, match="is not an executed"):
        teaching_fingerprint(_teaching_copy(tmp_path), "01_ntk", data["code_hash"], "c", "now")
    add_fingerprint(out, _teaching_copy(tmp_path), "afterwards")
    assert json.loads(out.read_text())["teaching_fingerprint"]["made"] == "afterwards"


@pytest.mark.parametrize("path", RECORDS, ids=[p.stem for p in RECORDS])
def test_every_record_has_a_teaching_fingerprint(path: Path) -> None:
    """Without one, whether a record is current cannot be told (the scorecard then says so)."""
    data = json.loads(path.read_text())
    stored = data.get("teaching_fingerprint") or {}
    assert stored.get("values") and stored.get("commit") == data["commit"], f"{path.name}: no teaching fingerprint"


@pytest.mark.slow
@pytest.mark.parametrize("path", RECORDS, ids=[p.stem for p in RECORDS])
def test_record_is_current(path: Path, executed_chapters, executed_dir) -> None:
    """A record is current while its numbers would be the same if it ran today: this run's teaching
    values agree with the record's fingerprint (timings left out) and the profile still has the
    record's parameters. A change that moves a teaching number stales the record: re-record it
    (make record), or undo the change."""
    from nnk_book.results import read_glued
    from nnk_book.records import machine_dependent, record_currency

    data = json.loads(path.read_text())
    result = executed_chapters.get(data["chapter"])
    if result is None or not result.ok:
        pytest.skip(f"{data['chapter']} did not run here (test_chapter_executes says why)")
    profiles = yaml.safe_load((ROOT / "book" / "profiles.yaml").read_text())
    wanted = ((profiles.get(data["profile"]) or {}).get(data["chapter"]) or {}).get("parameters") or {}
    key = json.loads((executed_dir / f"{data['chapter']}.key").read_text())
    current, why = record_currency(data, read_glued(executed_dir / f"{data['chapter']}.ipynb"), wanted,
                                   list(machine_dependent(data["chapter"])), key.get("threads"))
    assert current, f"{path.name} is stale: {why}"
