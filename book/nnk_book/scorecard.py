"""The reproduction scorecard: each paper claim's status, computed, never typed.

``book/claims.yaml`` lists the papers' headline claims: the paper's own words (a verbatim
quote and its place), the glued name that measures each one, the data it is measured on,
and the tolerance that counts as reproducing it (a check in the claim language of
:mod:`nnk_book.checks`, the language of ``tests/expected`` too), with the reason for its
width. This module turns that list plus measured values (the glued values of the executed chapters at
teaching scale, and ``book/runs/<chapter>.<profile>.json`` at the larger scales) into one
status per claim. ``book/tools/scorecard_page.py`` writes the page from it and
``tests/test_scorecard.py`` checks both.

The rules, in order (:func:`claim_status`):

* the **largest current scale** with a usable value decides; a stale record is shown, not
  counted;
* where the claim names a 95 % interval, the interval decides: *met* when all of it lies
  inside the tolerance, *not met* when none of it does, otherwise **inconclusive**; a check
  that can refute the claim but not confirm it (``refutes_only``: a necessary condition) is
  inconclusive when met;
* measured only on data that stands in for the paper's data set (the 8 x 8 digits for
  MNIST), whatever the outcome, is **measured on stand-in data only** (the outcome is shown
  beside it): such a measurement neither reproduces the paper nor shows it wrong;
* met on the paper's data at a ``paper`` run without deviations (or an ``exact`` claim:
  an identity, a count) is **reproduced**; met at a smaller scale on the paper's kind of
  data is **reproduced at smaller scale**;
* not met: **differs, explained** when the claim names the chapter section whose
  measurement explains it, else **differs, not yet explained**;
* a claim the book does not measure (``measure: null``, with ``not_run``), or measured at
  no scale, is **not yet run**.

Pure functions on plain dicts: nothing here reads a notebook.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from nnk_book import checks

ROOT = Path(__file__).resolve().parents[2]
CLAIMS = ROOT / "book" / "claims.yaml"
PAPERS = ROOT.parent / "shared" / "papers"

REPRODUCED = "reproduced"
SMALLER = "reproduced at smaller scale"
STAND_IN = "measured on stand-in data only"
INCONCLUSIVE = "inconclusive"
DIFFERS = "differs, explained"
UNEXPLAINED = "differs, not yet explained"
NOT_RUN = "not yet run"
STATUSES = (REPRODUCED, SMALLER, STAND_IN, INCONCLUSIVE, DIFFERS, UNEXPLAINED, NOT_RUN)

#: outcomes of one measurement against the tolerance
MET, NOT_MET = "met", "not met"
OUTCOMES = (MET, NOT_MET, INCONCLUSIVE)

#: Scales from smallest to largest: the executed chapters (``ci`` profile) and the recorded runs.
SCALES = ("teaching", "record", "paper")
#: the shapes a claim's tolerance takes: checks of :mod:`nnk_book.checks` that accept a set of values
#: (``atol``/``rtol`` around the paper's value, the claim's ``value``), so that an interval can be judged
TOLERANCE_KEYS = ({"atol"}, {"rtol"}, {"equals"}, {"one_of"}, {"min"}, {"max"}, {"min", "max"})
REQUIRED = ("id", "paper", "where", "quote", "statement", "paper_value", "setting", "data", "chapter",
            "section", "measure")
#: required of a measured claim; a claim the book does not run may state them (what would count)
MEASURED = ("tolerance", "tolerance_why")
OPTIONAL = MEASURED + ("paper_text", "value_from", "prediction", "interval", "seeds", "steps", "null_result",
                       "exact", "differs", "not_run", "refutes_only")
DATA_KEYS = {"paper", "ours", "stand_in", "real_when"}


@dataclass
class Scale:
    """Measured values at one scale: ``name`` (one of :data:`SCALES`), the glued values, and
    where they come from (``date``, ``commit``, ``machine``, ``seconds``: wall time over all
    ``starts`` of a resumed run). ``current``: whether the record's numbers would be the same
    today (``None``: cannot be told); a stale record is shown, not counted, and ``stale_why``
    says what changed. ``parameters``: the chapter parameters the values were computed with
    (they decide whether the paper's data or a stand-in was used). ``deviation``: how the run
    departs from its profile (``--set`` values, or a ``paper`` profile's ``not_on_cpu``), or
    ``None``."""

    name: str
    values: Mapping[str, Any]
    date: str | None = None
    commit: str | None = None
    machine: str | None = None
    seconds: float | None = None
    starts: int = 1
    current: bool | None = True
    stale_why: str | None = None
    parameters: Mapping[str, Any] = field(default_factory=dict)
    deviation: str | None = None


@dataclass
class Measurement:
    scale: Scale
    value: Any
    interval: float | None
    outcome: str | None  # one of OUTCOMES, None when there is no usable value
    stand_in: bool = False

    @property
    def met(self) -> bool | None:
        """``True``/``False`` for a decided outcome, ``None`` when inconclusive or unmeasured."""
        return None if self.outcome in (None, INCONCLUSIVE) else self.outcome == MET


@dataclass
class ClaimResult:
    claim: Mapping[str, Any]
    status: str
    decided_by: str | None  # the scale whose value gave the status
    measurements: list[Measurement]
    trend: str | None  # "toward" / "away from" / "unchanged": teaching -> largest current record
    disagreement: list[tuple[str, str]] | None = None  # [(scale, outcome), ...] when the scales disagree
    outcome: str | None = None  # the deciding measurement's outcome (one of OUTCOMES)


# --------------------------------------------------------------------------- the claims list
def quote_fragments(claim: Mapping[str, Any]) -> list[str]:
    """The claim's quote as a list of verbatim fragments (a string is one fragment)."""
    quote = claim.get("quote")
    return [quote] if isinstance(quote, str) else list(quote or [])


def normalise_space(text: str) -> str:
    """Every run of whitespace as one space (how quotes are matched against a paper's text)."""
    return re.sub(r"\s+", " ", text).strip()


def missing_quotes(claim: Mapping[str, Any], paper_text: str) -> list[str]:
    """The fragments of the claim's quote not found in ``paper_text`` (whitespace normalised)."""
    text = normalise_space(paper_text)
    return [f for f in quote_fragments(claim) if normalise_space(f) not in text]


def reference_value(claim: Mapping[str, Any]) -> float | None:
    """The number an absolute or relative tolerance is measured from: the paper's value, or,
    where the paper states none, the book's ``prediction``."""
    if _is_number(claim.get("paper_value")):
        return float(claim["paper_value"])
    prediction = claim.get("prediction") or {}
    return float(prediction["value"]) if _is_number(prediction.get("value")) else None


def validate_claims(data: Mapping[str, Any], glued_names: Mapping[str, Iterable[str]] | None = None) -> list[dict]:
    """Check the structure of ``claims.yaml`` and return its claims; ``ValueError`` names the
    claim and the field. With ``glued_names`` (chapter -> names it glues), every measure,
    interval, seeds and steps name must be among them."""
    if not isinstance(data, Mapping) or not isinstance(data.get("claims"), list):
        raise ValueError("claims.yaml: expected a mapping with a 'claims' list")
    papers = data.get("papers") or {}
    seen: set[str] = set()
    for i, claim in enumerate(data["claims"]):
        where = f"claims.yaml claim {i} ({claim.get('id', '?') if isinstance(claim, Mapping) else '?'})"
        if not isinstance(claim, Mapping):
            raise ValueError(f"{where}: expected a mapping")
        missing = [k for k in REQUIRED if k not in claim]
        if missing:
            raise ValueError(f"{where}: missing field(s) {missing}")
        unknown = sorted(set(claim) - set(REQUIRED) - set(OPTIONAL))
        if unknown:
            raise ValueError(f"{where}: unknown field(s) {unknown}")
        if claim["id"] in seen:
            raise ValueError(f"{where}: duplicate id")
        seen.add(claim["id"])
        if claim["paper"] not in papers:
            raise ValueError(f"{where}: paper {claim['paper']!r} is not under 'papers'")
        fragments = quote_fragments(claim)
        if not fragments or not all(isinstance(f, str) and f.strip() for f in fragments):
            raise ValueError(f"{where}: quote must be the paper's words (a string or a list of strings)")
        if claim["measure"] is not None:
            missing = [k for k in MEASURED if k not in claim]
            if missing:
                raise ValueError(f"{where}: missing field(s) {missing}")
        elif "tolerance" not in claim:
            claim = {**claim, "tolerance": {"equals": None}, "tolerance_why": "not measured"}
        tol = claim["tolerance"]
        if not isinstance(tol, Mapping) or set(tol) not in TOLERANCE_KEYS:
            raise ValueError(f"{where}: tolerance must be one of {[sorted(k) for k in TOLERANCE_KEYS]}, got {tol!r}")
        if claim.get("refutes_only") not in (None, True):
            raise ValueError(f"{where}: refutes_only is true or absent")
        if not (isinstance(claim.get("tolerance_why"), str) and claim["tolerance_why"].strip()):
            raise ValueError(f"{where}: tolerance_why must say why the tolerance has its width")
        if claim["paper_value"] is not None and not _is_number(claim["paper_value"]):
            raise ValueError(f"{where}: paper_value must be a number the paper states, or null")
        prediction = claim.get("prediction")
        if prediction is not None and not (isinstance(prediction, Mapping) and _is_number(prediction.get("value"))
                                           and prediction.get("why")):
            raise ValueError(f"{where}: prediction needs a numeric 'value' and a 'why'")
        if set(tol) & {"atol", "rtol"} and reference_value(claim) is None:
            raise ValueError(f"{where}: an atol or rtol tolerance needs a numeric paper_value or prediction")
        if "rtol" in tol and reference_value(claim) == 0:
            raise ValueError(f"{where}: an rtol tolerance needs a non-zero paper_value")
        tolerance_check(claim, f"{where}: tolerance")
        if claim["paper_value"] is None and not claim.get("paper_text"):
            raise ValueError(f"{where}: a claim without paper_value needs paper_text")
        d = claim["data"]
        if not (isinstance(d, Mapping) and {"paper", "ours", "stand_in"} <= set(d) <= DATA_KEYS
                and isinstance(d["stand_in"], bool)):
            raise ValueError(f"{where}: data needs 'paper', 'ours' and a boolean 'stand_in' (optional 'real_when')")
        if d.get("real_when") is not None and not isinstance(d["real_when"], Mapping):
            raise ValueError(f"{where}: data.real_when must map parameter names to values")
        differs = claim.get("differs")
        if differs is not None and not (isinstance(differs, Mapping) and differs.get("section") and differs.get("why")):
            raise ValueError(f"{where}: differs needs 'section' and 'why'")
        if claim["measure"] is None and not claim.get("not_run"):
            raise ValueError(f"{where}: a claim the book does not measure (measure: null) needs not_run: the reason")
        if claim["measure"] is not None and claim.get("not_run"):
            raise ValueError(f"{where}: not_run is only for a claim without a measure")
        null = claim.get("null_result")
        if null is not None:
            if not (isinstance(null, Mapping) and "value" in null and null.get("what")):
                raise ValueError(f"{where}: null_result needs 'value' and 'what'")
            if judge(null["value"], null.get("interval"), claim) != NOT_MET:
                raise ValueError(f"{where}: the tolerance is met by its own null ({null['what']}: {null['value']!r})")
        if glued_names is not None:
            names = set(glued_names.get(claim["chapter"], ()))
            for key in ("measure", "interval", "seeds", "steps"):
                name = claim.get(key)
                if name is not None and name not in names:
                    raise ValueError(f"{where}: {key} {name!r} is not glued by {claim['chapter']}")
    return list(data["claims"])


# --------------------------------------------------------------------------- one measurement
def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


#: what a chapter glues for a study that did not run (never a measured value)
SENTINELS = {"n/a", "nan", "inf", "-inf", "not measured", "not run"}


def _usable(value: Any) -> bool:
    return value is not None and not (isinstance(value, str) and value in SENTINELS) \
        and not (isinstance(value, float) and not math.isfinite(value))


def tolerance_check(claim: Mapping[str, Any], where: str = "tolerance") -> checks.Check:
    """The claim's tolerance as a check of :mod:`nnk_book.checks` (the language of
    ``tests/expected`` too): ``atol``/``rtol`` are around :func:`reference_value`, the
    check's ``value``. ``ValueError`` names the key at fault."""
    spec = dict(claim["tolerance"])
    if set(spec) & {"atol", "rtol"}:
        spec["value"] = reference_value(claim)
    return checks.parse(spec, where)


def allowed_range(claim: Mapping[str, Any]) -> tuple[float, float] | None:
    """The closed interval of values a numeric tolerance accepts (``None`` for ``equals``)."""
    tol = claim["tolerance"]
    if "equals" in tol or "one_of" in tol:
        return None
    if set(tol) & {"atol", "rtol"}:
        ref = float(reference_value(claim))
        half = float(tol.get("atol", 0.0)) + float(tol.get("rtol", 0.0)) * abs(ref)
        return ref - half, ref + half
    return float(tol.get("min", -math.inf)), float(tol.get("max", math.inf))


def judge(value: Any, half_width: Any, claim: Mapping[str, Any]) -> str | None:
    """``"met"``, ``"not met"`` or ``"inconclusive"`` for ``value`` (with its 95 % half-width,
    or ``None``) against the claim's tolerance; ``None`` when there is no usable value.

    A point value is met when it lies inside the tolerance. With an interval, all of
    ``[value - h, value + h]`` must lie inside to be met, none of it to be not met; an
    interval across an edge is inconclusive."""
    if not _usable(value):
        return None
    check = tolerance_check(claim)
    if check.numeric and not _is_number(value):
        return None
    met, _ = checks.evaluate(check, value, half_width=half_width if _is_number(half_width) else None)
    return INCONCLUSIVE if met is None else MET if met else NOT_MET


def meets(value: Any, claim: Mapping[str, Any]) -> bool | None:
    """Whether the point ``value`` satisfies the claim's tolerance; ``None`` without a usable value."""
    outcome = judge(value, None, claim)
    return None if outcome is None else outcome == MET


def uses_stand_in(claim: Mapping[str, Any], parameters: Mapping[str, Any]) -> bool:
    """Whether a measurement with these chapter ``parameters`` is on stand-in data: the claim's
    data is a stand-in, unless ``real_when``'s parameters are all set as it says."""
    data = claim.get("data") or {}
    if not data.get("stand_in"):
        return False
    real_when = data.get("real_when")
    return not (real_when and all(parameters.get(k) == v for k, v in real_when.items()))


def _distance(value: Any, claim: Mapping[str, Any]) -> float | None:
    ref = reference_value(claim)
    if _is_number(value) and ref is not None:
        return abs(float(value) - ref)
    return None


def claim_status(claim: Mapping[str, Any], scales: Sequence[Scale]) -> ClaimResult:
    """The claim's status from the largest current scale that measured it (see the module's rules)."""
    order = {name: i for i, name in enumerate(SCALES)}
    unknown = [s.name for s in scales if s.name not in order]
    if unknown:
        raise ValueError(f"scales: unknown scale name(s) {unknown}; expected {SCALES}")
    measure, interval = claim.get("measure"), claim.get("interval")
    rows = []
    for scale in sorted(scales, key=lambda s: order[s.name]):
        value = scale.values.get(measure) if measure else None
        half = scale.values.get(interval) if interval else None
        outcome = judge(value, half, claim)
        rows.append(Measurement(scale, value if _usable(value) else None,
                                float(half) if _is_number(half) else None, outcome,
                                uses_stand_in(claim, scale.parameters)))
    counted = [m for m in rows if m.outcome is not None and m.scale.current is not False]
    if not counted:
        return ClaimResult(claim, NOT_RUN, None, rows, None)
    last = counted[-1]
    if last.stand_in:
        status = STAND_IN
    elif last.outcome == INCONCLUSIVE or (last.outcome == MET and claim.get("refutes_only")):
        # a check that can refute the claim but not confirm it (a necessary condition) says nothing when met
        status = INCONCLUSIVE
    elif last.outcome == MET:
        if claim.get("exact") or (last.scale.name == "paper" and not last.scale.deviation):
            status = REPRODUCED
        else:
            status = SMALLER
    else:
        status = DIFFERS if claim.get("differs") else UNEXPLAINED
    disagreement = None
    if len({m.outcome for m in counted}) > 1:
        disagreement = [(m.scale.name, m.outcome) for m in counted]
    trend = None
    first = counted[0]
    tol = claim.get("tolerance") or {}
    if first is not last and set(tol) & {"atol", "rtol"}:  # a distance to a number means something
        d0, d1 = _distance(first.value, claim), _distance(last.value, claim)
        if d0 is not None and d1 is not None:
            trend = "toward" if d1 < d0 else "away from" if d1 > d0 else "unchanged"
    return ClaimResult(claim, status, last.scale.name, rows, trend, disagreement, last.outcome)


def ratio_to_paper(value: Any, claim: Mapping[str, Any]) -> tuple[str, float] | None:
    """``("ratio", ours / paper)`` where both are numbers of the same sign and the paper's is
    non-zero, ``("difference", ours - paper)`` where a ratio means nothing (paper value 0, signs
    that differ, or an absolute tolerance, ``atol``), ``None`` for a claim without the paper's number or a
    non-numeric value."""
    paper = claim.get("paper_value")
    if not (_is_number(value) and _is_number(paper)) or set(claim.get("tolerance") or {"equals": None}) & {"equals", "one_of"}:
        return None
    value, paper = float(value), float(paper)
    if paper != 0 and value / paper > 0 and "atol" not in claim["tolerance"]:
        return "ratio", value / paper
    return "difference", value - paper  # an absolute tolerance is in the value's own units


def count_statuses(results: Iterable[ClaimResult]) -> dict[str, int]:
    """``{status: count}`` over :data:`STATUSES` (zeros included, in that order)."""
    counts = dict.fromkeys(STATUSES, 0)
    for r in results:
        counts[r.status] += 1
    return counts


def format_value(value: Any) -> str:
    """A measured or paper value for a table cell."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if value == 0:
            return "0"
        return f"{value:.3g}" if 1e-3 <= abs(value) < 1e4 else f"{value:.2e}"
    return str(value)


def format_tolerance(claim: Mapping[str, Any]) -> str:
    """The tolerance in words, as shown on the page."""
    tol = claim["tolerance"]
    whose = "the paper" if _is_number(claim.get("paper_value")) else "the book's prediction"
    if "atol" in tol:
        return f"within ±{format_value(tol['atol'])} of {whose}"
    if "rtol" in tol:
        return f"within {100 * float(tol['rtol']):.0f} % of {whose}"
    if "equals" in tol:
        return f"= {format_value(tol['equals'])}"
    if "one_of" in tol:
        return "one of: " + "; ".join(format_value(v) for v in tol["one_of"])
    lo, hi = tol.get("min"), tol.get("max")
    if lo is not None and hi is not None:
        return f"between {format_value(lo)} and {format_value(hi)}"
    return f"≥ {format_value(lo)}" if lo is not None else f"≤ {format_value(hi)}"
