"""The reproduction scorecard: the claims list, the status logic, and the page
against the executed chapters and the recorded runs.

``book/claims.yaml`` is the one list of the papers' claims; ``nnk_book.scorecard`` computes
each status from its tolerance; ``book/tools/scorecard_page.py`` writes the page at build
time. The status logic is checked on hand-made claims (every rule and every status), the
list against the chapters (every name it reads is glued, every section exists), and the
page against the executed notebooks: each claim's row shows the value the chapter glued
and the status that value gives, a claim without a measurement says "not yet run".
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import nbformat
import pytest
import yaml

import scorecard_page
from nnk_book.results import read_glued
from nnk_book import scorecard as sc
from test_chapters import load_expected
from test_runs import recorded_name_patterns

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted(p.stem for p in (ROOT / "chapters").glob("*.ipynb"))


def _claim(**kw):
    base = {"id": "c", "paper": "p", "where": "Table 1", "quote": "q", "statement": "s", "paper_value": 2.0,
            "setting": "x", "data": {"paper": "d", "ours": "d", "stand_in": False}, "chapter": "01_ntk",
            "section": "sec", "measure": "m", "tolerance": {"rtol": 0.1}, "tolerance_why": "w"}
    base.update(kw)
    return base


# --------------------------------------------------------------------------- the rules
@pytest.mark.parametrize("tolerance, paper, value, expected", [
    ({"rtol": 0.1}, 2.0, 2.19, True), ({"rtol": 0.1}, 2.0, 2.21, False),
    ({"rtol": 0.1}, -0.5, -0.54, True), ({"rtol": 0.1}, -0.5, 0.5, False),
    ({"atol": 0.1}, -0.5, -0.41, True), ({"atol": 0.1}, -0.5, -0.39, False),
    ({"min": 1.0}, None, 1.0, True), ({"min": 1.0}, None, 0.99, False),
    ({"max": 0.03}, 0.0, 0.031, False), ({"min": 0, "max": 1}, None, 0.5, True),
    ({"equals": True}, None, True, True), ({"equals": True}, None, False, False),
    ({"equals": "tied"}, None, "tied", True), ({"equals": "ahead"}, None, "tied", False),
    ({"equals": 1}, 1, 1.0, True), ({"equals": 1}, 1, 4, False),
])
def test_meets_each_rule(tolerance, paper, value, expected) -> None:
    claim = _claim(tolerance=tolerance, paper_value=paper if paper is not None else 1.0)
    assert sc.meets(value, claim) is expected
    # the independent reading of each rule
    if "rtol" in tolerance:
        assert expected == (abs(value - paper) <= tolerance["rtol"] * abs(paper))


@pytest.mark.parametrize("tolerance, paper, value, half, expected", [
    # an interval decides: inside -> met, outside -> not met, across an edge -> inconclusive
    ({"atol": 0.1}, -0.5, -0.5, 0.05, sc.MET), ({"atol": 0.1}, -0.5, -0.5, 0.15, sc.INCONCLUSIVE),
    ({"atol": 0.1}, -0.5, -0.2, 0.05, sc.NOT_MET), ({"atol": 0.1}, -0.5, -0.62, 0.05, sc.INCONCLUSIVE),
    ({"rtol": 0.1}, 2.0, 2.1, 0.05, sc.MET), ({"rtol": 0.1}, 2.0, 2.1, 0.2, sc.INCONCLUSIVE),
    ({"rtol": 0.1}, -2.0, -2.1, 0.05, sc.MET), ({"rtol": 0.1}, 2.0, 3.0, 0.2, sc.NOT_MET),
    ({"max": -0.5}, None, -0.87, 0.04, sc.MET), ({"max": -0.5}, None, -0.52, 0.04, sc.INCONCLUSIVE),
    ({"max": -0.5}, None, -0.3, 0.1, sc.NOT_MET), ({"min": 0, "max": 1}, None, 0.5, 0.6, sc.INCONCLUSIVE),
    ({"min": 1.0}, None, 1.5, None, sc.MET), ({"min": 1.0}, None, 0.5, None, sc.NOT_MET),
])
def test_an_interval_decides(tolerance, paper, value, half, expected) -> None:
    claim = _claim(tolerance=tolerance, paper_value=paper, paper_text=None if paper is not None else "t")
    assert sc.judge(value, half, claim) == expected
    # the independent reading: the interval [value - h, value + h] against the accepted range
    lo, hi = sc.allowed_range(claim)
    h = half or 0.0
    want = sc.MET if lo <= value - h and value + h <= hi else sc.NOT_MET if (value + h < lo or value - h > hi) \
        else sc.INCONCLUSIVE
    assert want == expected


@pytest.mark.parametrize("tolerance, null", [
    # for every kind of tolerance, a null or wrong result fails it
    ({"atol": 0.1}, 0.0),          # paper -0.5: a rate of zero (no decay)
    ({"rtol": 0.1}, -0.25),        # paper -0.5: half the rate
    ({"min": 2.0}, 1.0),               # a ratio of one (no gain)
    ({"max": -0.4}, 0.0),              # a slope of zero
    ({"min": 0.9, "max": 1.1}, 0.5),   # half the predicted variance
    ({"equals": "ahead"}, "tied"),     # a tie is not the paper's "outperforms"
    ({"equals": True}, False),
])
def test_each_tolerance_kind_fails_a_null(tolerance, null) -> None:
    claim = _claim(tolerance=tolerance, paper_value=-0.5)
    assert sc.judge(null, None, claim) == sc.NOT_MET
    assert sc.judge(null, 0.01 if not isinstance(null, (str, bool)) else None, claim) == sc.NOT_MET
    with pytest.raises(ValueError, match="met by its own null"):
        sc.validate_claims({"papers": {"p": {}}, "claims": [
            _claim(tolerance=tolerance, paper_value=-0.5, null_result={"value": -0.5 if "atol" in tolerance
                   or "rtol" in tolerance else (1.0 if "min" in tolerance and "max" in tolerance else
                   (3.0 if "min" in tolerance else -1.0 if "max" in tolerance else tolerance["equals"])),
                   "what": "a result that meets it"})]})
    sc.validate_claims({"papers": {"p": {}}, "claims": [
        _claim(tolerance=tolerance, paper_value=-0.5, null_result={"value": null, "what": "the null"})]})


@pytest.mark.parametrize("value", [None, "n/a", float("nan"), "inf", float("inf"), "not measured"])
def test_meets_without_a_usable_value_is_none(value) -> None:
    assert sc.meets(value, _claim()) is None
    assert sc.meets(value, _claim(tolerance={"equals": True})) is None


def test_meets_a_number_rule_with_a_word_is_none() -> None:
    assert sc.meets("tied", _claim(tolerance={"min": 1})) is None


def test_a_prediction_is_the_reference_when_the_paper_states_no_number() -> None:
    claim = _claim(paper_value=None, paper_text="falls", prediction={"value": -0.5, "why": "Monte Carlo"},
                   tolerance={"atol": 0.1})
    assert sc.reference_value(claim) == -0.5 and sc.meets(-0.45, claim) and not sc.meets(0.0, claim)
    assert "prediction" in sc.format_tolerance(claim) and "paper" in sc.format_tolerance(_claim(tolerance={"atol": 1}))
    assert sc.ratio_to_paper(-0.45, claim) is None  # no paper number: nothing to divide by


def _scales(teaching=None, record=None, paper=None, record_current=True, paper_deviation=None, params=None):
    out = []
    if teaching is not None:
        out.append(sc.Scale("teaching", {"m": teaching}, parameters=params or {}))
    if record is not None:
        out.append(sc.Scale("record", {"m": record}, date="2026-11-28", current=record_current))
    if paper is not None:
        out.append(sc.Scale("paper", {"m": paper}, date="2026-11-28", deviation=paper_deviation))
    return out


def test_every_status() -> None:
    c = _claim()
    assert sc.claim_status(c, _scales()).status == sc.NOT_RUN
    assert sc.claim_status(c, _scales(teaching="n/a")).status == sc.NOT_RUN
    assert sc.claim_status(c, _scales(teaching="not measured")).status == sc.NOT_RUN
    assert sc.claim_status(_claim(measure=None, not_run="GPU"), _scales(teaching=2.0)).status == sc.NOT_RUN
    assert sc.claim_status(c, _scales(teaching=2.0)).status == sc.SMALLER
    assert sc.claim_status(_claim(exact=True), _scales(teaching=2.0)).status == sc.REPRODUCED
    assert sc.claim_status(c, _scales(teaching=1.0, paper=2.05)).status == sc.REPRODUCED
    # a paper run that departs from the paper's setting (not_on_cpu, --set) is a smaller scale
    assert sc.claim_status(c, _scales(teaching=1.0, paper=2.05, paper_deviation="GPU")).status == sc.SMALLER
    assert sc.claim_status(c, _scales(teaching=1.0)).status == sc.UNEXPLAINED
    explained = _claim(differs={"section": "s", "why": "w"})
    assert sc.claim_status(explained, _scales(teaching=1.0)).status == sc.DIFFERS
    inconclusive = _claim(interval="m_hw", tolerance={"atol": 0.1})
    r = sc.claim_status(inconclusive, [sc.Scale("teaching", {"m": 2.0, "m_hw": 0.5})])
    assert r.status == sc.INCONCLUSIVE and r.measurements[0].met is None
    # stand-in data: met only there is a status of its own; real_when parameters make it the paper's data
    stand_in = _claim(data={"paper": "MNIST", "ours": "digits", "stand_in": True, "real_when": {"use_real_data": True}})
    assert sc.claim_status(stand_in, _scales(teaching=2.0)).status == sc.STAND_IN
    assert sc.claim_status(stand_in, _scales(teaching=2.0, params={"use_real_data": False})).status == sc.STAND_IN
    assert sc.claim_status(stand_in, _scales(teaching=2.0, params={"use_real_data": True})).status == sc.SMALLER
    assert sc.claim_status(stand_in, _scales(teaching=1.0)).status == sc.STAND_IN  # whatever the outcome
    assert sc.claim_status(stand_in, _scales(teaching=1.0)).outcome == sc.NOT_MET
    # the largest current scale decides; a stale record is shown but does not count
    r = sc.claim_status(c, _scales(teaching=1.0, record=2.0))
    assert (r.status, r.decided_by, r.trend) == (sc.SMALLER, "record", "toward")
    assert r.disagreement == [("teaching", sc.NOT_MET), ("record", sc.MET)]
    r = sc.claim_status(c, _scales(teaching=2.0, record=5.0))
    assert (r.status, r.trend) == (sc.UNEXPLAINED, "away from")
    r = sc.claim_status(c, _scales(teaching=1.0, record=2.0, record_current=False))
    assert (r.status, r.decided_by, r.trend, r.disagreement) == (sc.UNEXPLAINED, "teaching", None, None)
    assert [m.value for m in r.measurements] == [1.0, 2.0]
    r = sc.claim_status(_claim(tolerance={"equals": True}), [
        sc.Scale("teaching", {"m": False}), sc.Scale("record", {"m": True})])
    assert (r.status, r.trend) == (sc.SMALLER, None) and r.disagreement


def test_a_necessary_condition_refutes_but_does_not_confirm() -> None:
    """refutes_only: met is inconclusive (the check cannot confirm the claim); not met differs."""
    claim = _claim(tolerance={"max": -12.0}, paper_value=None, paper_text="super-exponential", refutes_only=True)
    assert sc.claim_status(claim, _scales(teaching=-16.0)).status == sc.INCONCLUSIVE
    assert sc.claim_status(claim, _scales(teaching=-5.0)).status == sc.UNEXPLAINED
    with pytest.raises(ValueError, match="refutes_only"):
        sc.validate_claims({"papers": {"p": {}}, "claims": [_claim(refutes_only="yes")]})


def test_one_of_accepts_each_listed_value() -> None:
    claim = _claim(tolerance={"one_of": ["a: larger; b: larger", "a: larger; b: tied"]}, paper_value=None, paper_text="t")
    assert sc.judge("a: larger; b: tied", None, claim) == sc.MET and sc.judge("a: tied; b: tied", None, claim) == sc.NOT_MET
    assert "one of" in sc.format_tolerance(claim)
    with pytest.raises(ValueError, match="one_of"):
        sc.validate_claims({"papers": {"p": {}}, "claims": [_claim(tolerance={"one_of": ["only"]})]})


def test_no_trend_for_a_bound() -> None:
    """A bound has no 'toward the paper': a slope well inside {max: -0.5} is not 'away' from it."""
    bound = _claim(paper_value=-0.5, tolerance={"max": -0.5})
    r = sc.claim_status(bound, _scales(teaching=-0.6, record=-0.9))
    assert r.status == sc.SMALLER and r.trend is None and r.disagreement is None


def test_interval_is_read_beside_the_value() -> None:
    r = sc.claim_status(_claim(interval="m_hw"), [sc.Scale("teaching", {"m": 2.0, "m_hw": 0.1})])
    assert r.measurements[0].interval == pytest.approx(0.1)


def test_unknown_scale_is_refused() -> None:
    with pytest.raises(ValueError, match="scales"):
        sc.claim_status(_claim(), [sc.Scale("huge", {"m": 1.0})])


def test_quotes_are_found_with_whitespace_normalised() -> None:
    text = "The error\n  decays like\tp^(-1/2) in Fig. 2.\n| TNN | 47.33 |"
    assert sc.missing_quotes(_claim(quote="error decays like p^(-1/2)"), text) == []
    assert sc.missing_quotes(_claim(quote=["The error decays", "| TNN | 47.33 |"]), text) == []
    assert sc.missing_quotes(_claim(quote="error decays like p^(-1)"), text) == ["error decays like p^(-1)"]
    assert sc.missing_quotes(_claim(quote="The Error decays"), text) == ["The Error decays"]  # case counts


def test_record_cell_and_provenance_say_run_time_over_all_starts(tmp_path: Path, monkeypatch) -> None:
    import scorecard_page as page

    runs = tmp_path / "runs"
    runs.mkdir()
    one = {"chapter": "06_mlp_fusion", "profile": "record", "recorded": "2026-11-29", "commit": "abc1234",
           "seconds": 600.0, "machine": {"cpu": "cpu", "threads": 1}, "values": {"m": 1.0}, "parameters": {}}
    (runs / "06_mlp_fusion.record.json").write_text(json.dumps({**one, "earlier_starts_seconds": [1200.0, 1800.0]}))
    (runs / "07_ffn_replacements.record.json").write_text(json.dumps({**one, "chapter": "07_ffn_replacements"}))
    import nnk_book.records as records
    monkeypatch.setattr(records, "RUNS", runs)
    monkeypatch.setattr(records, "code_hash", lambda path: "h")
    monkeypatch.setattr(records, "_code_hash_at", lambda commit, chapter: "h")
    profiles = {"record": {"06_mlp_fusion": {"parameters": {}}, "07_ffn_replacements": {"parameters": {}}}}
    resumed, single = (page.scales_for(c, None, profiles=profiles)[0] for c in ("06_mlp_fusion", "07_ffn_replacements"))
    assert (resumed.seconds, resumed.starts, single.seconds, single.starts) == (3600.0, 3, 600.0, 1)
    assert resumed.current is None and "fingerprint" in resumed.stale_why
    for scale, text in ((resumed, "60 min in 3 starts"), (single, "10 min;")):
        line = page.provenance("06_mlp_fusion", [scale])
        assert text in line and "starts" not in line.replace(text, ""), line


def test_ratio_or_difference() -> None:
    assert sc.ratio_to_paper(3.0, _claim()) == ("ratio", 1.5)
    assert sc.ratio_to_paper(0.1, _claim(paper_value=0.0, tolerance={"atol": 1})) == ("difference", 0.1)
    assert sc.ratio_to_paper(-1.0, _claim()) == ("difference", -3.0)
    assert sc.ratio_to_paper(2.5, _claim(tolerance={"atol": 1})) == ("difference", 0.5)
    assert sc.ratio_to_paper(True, _claim(tolerance={"equals": True})) is None
    assert sc.ratio_to_paper(None, _claim()) is None


def test_counts_cover_every_status() -> None:
    results = [sc.claim_status(_claim(), _scales(teaching=v)) for v in (2.0, 1.0, None)]
    counts = sc.count_statuses(results)
    assert list(counts) == list(sc.STATUSES) and sum(counts.values()) == 3
    assert counts[sc.SMALLER] == counts[sc.UNEXPLAINED] == counts[sc.NOT_RUN] == 1


@pytest.mark.parametrize("change, message", [
    ({"tolerance": {"near": 1}}, "tolerance"),
    ({"tolerance": {"rtol": 0.1}, "paper_value": 0}, "non-zero"),
    ({"tolerance": {"atol": 0.1}, "paper_value": None, "paper_text": "x"}, "paper_value or prediction"),
    ({"paper": "nope"}, "paper 'nope'"),
    ({"paper_value": None, "tolerance": {"min": 1}}, "paper_text"),
    ({"differs": {"section": "s"}}, "differs"),
    ({"quote": ""}, "quote"),
    ({"quote": ["a", 3]}, "quote"),
    ({"tolerance_why": " "}, "tolerance_why"),
    ({"data": {"paper": "MNIST", "ours": "digits"}}, "stand_in"),
    ({"measure": None}, "not_run"),
    ({"not_run": "GPU"}, "not_run"),
    ({"paper_value": "0.5"}, "paper_value"),
    ({"prediction": {"value": -0.5}}, "prediction"),
    ({"colour": "red"}, "unknown field"),
])
def test_validate_names_the_problem(change, message) -> None:
    claim = _claim(**change)
    with pytest.raises(ValueError, match=re.escape(message)):
        sc.validate_claims({"papers": {"p": {}}, "claims": [claim]})


def test_validate_refuses_missing_fields_duplicates_and_unglued_names() -> None:
    for field in ("setting", "quote", "data", "tolerance_why"):
        claim = _claim()
        del claim[field]
        with pytest.raises(ValueError, match=field):
            sc.validate_claims({"papers": {"p": {}}, "claims": [claim]})
    with pytest.raises(ValueError, match="duplicate"):
        sc.validate_claims({"papers": {"p": {}}, "claims": [_claim(), _claim()]})
    with pytest.raises(ValueError, match="measure 'm' is not glued by 01_ntk"):
        sc.validate_claims({"papers": {"p": {}}, "claims": [_claim()]}, {"01_ntk": ["x"]})


# --------------------------------------------------------------------------- the list
CLAIMS = yaml.safe_load(sc.CLAIMS.read_text())


def _glued_names(chapter: str) -> set[str]:
    """Names the chapter glues: its record(...) calls (f-strings expanded against the names
    that tests/expected lists), plus the expected file's names."""
    expected = load_expected(chapter)
    listed = {name for section, body in expected.items() if section.endswith("checks")
              for name in (body or {})}
    patterns = recorded_name_patterns(chapter)
    candidates = listed | {c.get(k) for c in CLAIMS["claims"] if c["chapter"] == chapter
                           for k in ("measure", "interval", "seeds", "steps")} - {None}
    return {name for name in candidates if any(p.fullmatch(name) for p in patterns)}


def test_claims_list_is_valid_and_every_name_is_glued() -> None:
    claims = sc.validate_claims(CLAIMS, {c: _glued_names(c) for c in CHAPTERS})
    for key in CLAIMS["papers"]:
        assert sum(c["paper"] == key for c in claims) >= 5, f"{key}: fewer than 5 headline claims"


def _paper_text(key: str) -> str:
    path = sc.PAPERS / CLAIMS["papers"][key]["file"]
    if not path.exists():
        pytest.skip(f"the papers are not beside this checkout ({sc.PAPERS}): the quotes cannot be checked here")
    return path.read_text()


@pytest.mark.parametrize("claim", CLAIMS["claims"], ids=[c["id"] for c in CLAIMS["claims"]])
def test_every_quote_is_the_papers_text(claim) -> None:
    """Each row quotes its paper verbatim: every fragment is found in the paper's text, with runs of
    whitespace collapsed and nothing else changed."""
    missing = sc.missing_quotes(claim, _paper_text(claim["paper"]))
    assert not missing, f"{claim['id']}: not in {CLAIMS['papers'][claim['paper']]['file']}: {missing}"


def test_no_tolerance_is_met_by_its_null() -> None:
    """A chance or trivial result, where a row states one, fails its tolerance (validate_claims
    refuses it too); a row without one states why its width rejects a wrong result."""
    for claim in CLAIMS["claims"]:
        null = claim.get("null_result")
        if null is not None:
            assert sc.judge(null["value"], null.get("interval"), claim) == sc.NOT_MET, claim["id"]
        if claim["measure"] is not None:
            assert len(claim["tolerance_why"].split()) >= 8, f"{claim['id']}: tolerance_why says too little"


def test_stand_in_data_is_named() -> None:
    """A row on stand-in data names both data sets; `real_when` names parameters the chapter has."""
    from nnk_book.records import chapter_parameters

    for claim in CLAIMS["claims"]:
        data = claim["data"]
        if data["stand_in"]:
            assert data["paper"].strip() and data["ours"].strip() and data["paper"] != data["ours"], claim["id"]
        for name in (data.get("real_when") or {}):
            assert name in chapter_parameters(claim["chapter"]), f"{claim['id']}: {name} is no parameter"


def test_every_section_exists() -> None:
    for claim in CLAIMS["claims"]:
        nb = nbformat.read(str(ROOT / "chapters" / f"{claim['chapter']}.ipynb"), as_version=4)
        text = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
        for section in [claim["section"]] + ([claim["differs"]["section"]] if claim.get("differs") else []):
            if scorecard_page.LABEL.match(section):
                assert f"({section})=" in text, f"{claim['id']}: no label ({section})= in {claim['chapter']}"
            else:
                assert re.search(r"^#+ " + re.escape(section) + r"\s*$", text, re.M), (
                    f"{claim['id']}: no heading '{section}' in {claim['chapter']}")


def test_paper_profile_says_what_cannot_run_on_a_cpu() -> None:
    paper = yaml.safe_load((ROOT / "book" / "profiles.yaml").read_text())["paper"]
    for chapter in ("05_lookupffn", "06_mlp_fusion"):
        assert paper[chapter].get("not_on_cpu"), f"{chapter}: the paper's setting does not run on a CPU; say so"


# --------------------------------------------------------------------------- the page
ROW = re.compile(r'<tbody class="nnk-claim" id="claim-([\w-]+)" data-status="([a-z-]+)"[^>]*>\s*<tr>(.*?)</tr>', re.S)


def page_rows(page: str) -> dict[str, tuple[str, list[str]]]:
    """``{claim id: (status slug, [cell html, ...])}`` of the claims table rows of the page."""
    return {m.group(1): (m.group(2), re.findall(r"<td>(.*?)</td>", m.group(3), re.S)) for m in ROW.finditer(page)}


def check_page(executed: Path, out: Path, chapters: list[str]) -> list[str]:
    """Generate the pages from ``executed`` into ``out``; return every disagreement between
    the scorecard and the executed notebooks (teaching values and statuses)."""
    import html as html_lib

    results = scorecard_page.write_pages(out, executed, chapters)
    rows = page_rows((out / "scorecard.md").read_text())
    slugs = {scorecard_page._slug(s): s for s in sc.STATUSES}
    problems = []
    glued = {c: read_glued(executed / f"{c}.ipynb") for c in chapters if (executed / f"{c}.ipynb").exists()}
    for r in results:
        claim = r.claim
        if claim["id"] not in rows:
            problems.append(f"{claim['id']}: no row on the page")
            continue
        slug, cells = rows[claim["id"]]
        status = slugs.get(slug)
        if status is None:
            problems.append(f"{claim['id']}: unknown status {slug!r}")
            continue
        if status != r.status or html_lib.escape(status) not in cells[4]:
            problems.append(f"{claim['id']}: the page says {status!r}, the computation {r.status!r}")
        if claim["chapter"] not in glued:
            continue
        value = glued[claim["chapter"]].get(claim["measure"]) if claim["measure"] else None
        if claim["measure"] and value is None:
            problems.append(f"{claim['id']}: {claim['chapter']} did not glue {claim['measure']}")
        if not sc._usable(value):
            if status != sc.NOT_RUN and r.decided_by in (None, "teaching"):
                problems.append(f"{claim['id']}: no measurement, but the page says {status!r}")
            continue
        if not cells[2].startswith(html_lib.escape(sc.format_value(value))):
            problems.append(f"{claim['id']}: page shows {cells[2]!r}, the run glued {value!r}")
        if r.decided_by == "teaching":  # an independent reading of the rule at teaching scale
            tol = claim["tolerance"]
            half = glued[claim["chapter"]].get(claim.get("interval")) if claim.get("interval") else None
            h = float(half) if sc._is_number(half) else 0.0
            if "equals" in tol:
                outcome = sc.MET if value == tol["equals"] else sc.NOT_MET
            else:
                ref = claim["paper_value"] if sc._is_number(claim["paper_value"]) else (claim.get("prediction") or {}).get("value")
                lo, hi = ((ref - tol["atol"], ref + tol["atol"]) if "atol" in tol else
                          tuple(sorted((ref * (1 - tol["rtol"]), ref * (1 + tol["rtol"])))) if "rtol" in tol
                          else (tol.get("min", -math.inf), tol.get("max", math.inf)))
                outcome = (sc.MET if lo <= value - h and value + h <= hi else
                           sc.NOT_MET if value + h < lo or value - h > hi else sc.INCONCLUSIVE)
            stand_in = sc.uses_stand_in(claim, r.measurements[0].scale.parameters)
            if stand_in:
                want = sc.STAND_IN
            elif outcome == sc.INCONCLUSIVE or (outcome == sc.MET and claim.get("refutes_only")):
                want = sc.INCONCLUSIVE
            elif outcome == sc.MET:
                want = sc.REPRODUCED if claim.get("exact") else sc.SMALLER
            else:
                want = sc.DIFFERS if claim.get("differs") else sc.UNEXPLAINED
            if status != want:
                problems.append(f"{claim['id']}: page says {status!r}, the run gives {want!r}")
    return problems


def test_page_without_runs_says_not_yet_run(tmp_path: Path) -> None:
    results = scorecard_page.write_pages(tmp_path, None, CHAPTERS)
    page = (tmp_path / "scorecard.md").read_text()
    assert len(page_rows(page)) == len(CLAIMS["claims"])
    for r in results:
        if r.status != sc.NOT_RUN:  # only a record can decide without a teaching run
            assert r.decided_by in ("record", "paper"), r.claim["id"]
    assert "No runner summary" in (tmp_path / "execution_status.md").read_text()


def test_page_html_is_one_block_per_table() -> None:
    """MyST ends a raw HTML block at a blank line: the claims table has none inside it, and every
    claim row folds out its quote."""
    data = load_claims_for_test()
    results = [sc.claim_status(c, []) for c in data["claims"]]
    lines = scorecard_page.claims_table(results)
    assert all(line.strip() for line in lines) and all("\n" not in line for line in lines)
    text = "\n".join(lines)
    assert text.count("<details>") == len(results) == text.count('class="nnk-claim"')


def load_claims_for_test() -> dict:
    return scorecard_page.load_claims()


def test_execution_status_says_what_was_reused(tmp_path: Path) -> None:
    executed = tmp_path / "ci"
    executed.mkdir()
    (executed / "summary.json").write_text(json.dumps([
        {"chapter": "01_ntk", "profile": "ci", "seconds": 70.0, "threads": 1, "status": "cached"},
        {"chapter": "02_random_features", "profile": "ci", "seconds": 80.0, "threads": 1, "status": "ok"}]))
    (executed / "01_ntk.key").write_text(json.dumps({"key": "k", "date": "2026-11-27 10:00:00"}))
    (executed / "02_random_features.key").write_text(json.dumps({"key": "k", "date": "2026-11-28 06:00:00"}))
    text = scorecard_page.execution_markdown(executed)
    assert "reused from the cache; ran 2026-11-27 10:00:00" in text
    assert "executed for this build, 2026-11-28 06:00:00" in text
    assert "nb-exec-table" not in text


@pytest.mark.slow
def test_page_agrees_with_the_executed_chapters(executed_chapters, executed_dir, tmp_path: Path) -> None:
    ran = [c for c, r in executed_chapters.items() if r.ok]
    assert ran, "no chapter executed"
    problems = check_page(executed_dir, tmp_path, ran)
    # a subset build shows the same scorecard: chapters outside it keep their last executed values
    subset = tmp_path / "subset"
    scorecard_page.write_pages(subset, executed_dir, ran[:1])
    if (subset / "scorecard.md").read_text() != (tmp_path / "scorecard.md").read_text():
        problems.append("the scorecard of a one-chapter build differs from the full build's")
    assert not problems, "\n".join(problems)
    staged = scorecard_page.ROOT / "_build" / "stage" / "ci" / "book" / "scorecard.md"
    import run_chapters

    newest_run = max((executed_dir / f"{c}.ipynb").stat().st_mtime for c in ran)
    if (staged.exists() and set(ran) == set(CHAPTERS) and executed_dir == run_chapters.DEFAULT_OUT / "ci"
            and staged.stat().st_mtime >= newest_run):  # a book staged from these runs, not from earlier ones
        assert staged.read_text() == (tmp_path / "scorecard.md").read_text(), (
            "the built book's scorecard differs from the executed chapters and records: rebuild it")


def test_chapters_show_their_largest_current_record(monkeypatch) -> None:
    """nnk_book.records.largest_recorded_run: paper before record;
    a current record before a stale one of a larger scale."""
    from nnk_book import records

    found = {}
    monkeypatch.setattr(records, "recorded_run", lambda chapter, profile, runs=None: found.get(profile))
    assert records.largest_recorded_run("01_ntk") is None
    found["record"] = {"profile": "record", "current": False}
    assert records.largest_recorded_run("01_ntk")["profile"] == "record"
    found["record"] = {"profile": "record", "current": True}
    assert records.largest_recorded_run("01_ntk")["profile"] == "record"
    found["paper"] = {"profile": "paper", "current": False}
    assert records.largest_recorded_run("01_ntk")["profile"] == "record"
    found["paper"]["current"] = True
    assert records.largest_recorded_run("01_ntk")["profile"] == "paper"


def _executed_chapter(folder: Path, chapter: str, values: dict) -> None:
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("")
    cell.outputs = [nbformat.v4.new_output(
        "display_data", data={"application/papermill.record/text/plain": repr(v)},
        metadata={"scrapbook": {"name": k, "mime_prefix": "application/papermill.record/"}})
        for k, v in values.items()]
    nb.cells = [cell]
    folder.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(folder / f"{chapter}.ipynb"))


def test_check_page_catches_a_missing_measurement(tmp_path: Path) -> None:
    """The check behind test_page_agrees_with_the_executed_chapters fails when a chapter no
    longer glues a claim's measure, and agrees when the values are there."""
    claims = [c for c in CLAIMS["claims"] if c["chapter"] == "03_bundling"]
    values = {c["measure"]: c["paper_value"] if c["paper_value"] is not None else c["tolerance"].get("equals", 1e3)
              for c in claims if c["measure"]}
    _executed_chapter(tmp_path / "ci", "03_bundling", values)
    assert check_page(tmp_path / "ci", tmp_path / "page", ["03_bundling"]) == []
    del values["bnd_t6_bert_gmacs_original"]
    _executed_chapter(tmp_path / "ci", "03_bundling", values)
    problems = check_page(tmp_path / "ci", tmp_path / "page", ["03_bundling"])
    assert problems == ["bnd-t6-macs: 03_bundling did not glue bnd_t6_bert_gmacs_original"]
