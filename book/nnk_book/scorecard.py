"""The reproduction scorecard: each paper claim's status, computed, never typed (issue 29).

``book/claims.yaml`` lists the papers' headline claims with the glued name that measures
each one and the tolerance that counts as "reproduced", written before the run. This
module turns that list plus measured values (the glued values of the executed chapters at
teaching scale, and ``book/runs/<chapter>.<profile>.json`` at the larger scales) into one
status per claim. ``book/tools/scorecard_page.py`` writes the page from it and
``tests/test_scorecard.py`` checks both.

Pure functions on plain dicts: nothing here reads a notebook.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

ROOT = Path(__file__).resolve().parents[2]
CLAIMS = ROOT / "book" / "claims.yaml"

REPRODUCED = "reproduced"
SMALLER = "reproduced at smaller scale"
DIFFERS = "differs, explained"
UNEXPLAINED = "differs, not yet explained"
NOT_RUN = "not yet run at this scale"
STATUSES = (REPRODUCED, SMALLER, DIFFERS, UNEXPLAINED, NOT_RUN)

#: Scales from smallest to largest. ``full`` is the profile that preceded ``record`` and
#: ``paper`` (its records are kept readable and shown as an older scale).
SCALES = ("teaching", "full", "record", "paper")
TOLERANCE_KEYS = ({"absolute"}, {"relative"}, {"equals"}, {"min"}, {"max"}, {"min", "max"})
REQUIRED = ("id", "paper", "where", "statement", "paper_value", "setting", "chapter", "section",
            "measure", "tolerance")


@dataclass
class Scale:
    """Measured values at one scale: ``name`` (one of :data:`SCALES`), the glued values,
    and where they come from (``date``, ``commit``, ``machine``, ``seconds``: wall time over
    all ``starts`` of a resumed run, ``current``: whether the chapter's code is unchanged
    since; a stale record is shown, not counted)."""

    name: str
    values: Mapping[str, Any]
    date: str | None = None
    commit: str | None = None
    machine: str | None = None
    seconds: float | None = None
    starts: int = 1
    current: bool | None = True
    parameters: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class Measurement:
    scale: Scale
    value: Any
    interval: float | None
    met: bool | None


@dataclass
class ClaimResult:
    claim: Mapping[str, Any]
    status: str
    decided_by: str | None  # the scale whose value gave the status
    measurements: list[Measurement]
    trend: str | None  # "toward" / "away from" / "unchanged": teaching -> largest current record


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
        if claim["id"] in seen:
            raise ValueError(f"{where}: duplicate id")
        seen.add(claim["id"])
        if claim["paper"] not in papers:
            raise ValueError(f"{where}: paper {claim['paper']!r} is not under 'papers'")
        tol = claim["tolerance"]
        if not isinstance(tol, Mapping) or set(tol) not in TOLERANCE_KEYS:
            raise ValueError(f"{where}: tolerance must be one of {[sorted(k) for k in TOLERANCE_KEYS]}, got {tol!r}")
        if set(tol) & {"absolute", "relative"} and not _is_number(claim["paper_value"]):
            raise ValueError(f"{where}: an absolute or relative tolerance needs a numeric paper_value")
        if "relative" in tol and claim["paper_value"] == 0:
            raise ValueError(f"{where}: a relative tolerance needs a non-zero paper_value")
        if claim["paper_value"] is None and not claim.get("paper_text"):
            raise ValueError(f"{where}: a claim without paper_value needs paper_text")
        differs = claim.get("differs")
        if differs is not None and not (isinstance(differs, Mapping) and differs.get("section") and differs.get("why")):
            raise ValueError(f"{where}: differs needs 'section' and 'why'")
        if glued_names is not None:
            names = set(glued_names.get(claim["chapter"], ()))
            for key in ("measure", "interval", "seeds", "steps"):
                name = claim.get(key)
                if name is not None and name not in names:
                    raise ValueError(f"{where}: {key} {name!r} is not glued by {claim['chapter']}")
    return list(data["claims"])


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _usable(value: Any) -> bool:
    return value is not None and not (isinstance(value, str) and value in {"n/a", "nan", "inf", "-inf"}) \
        and not (isinstance(value, float) and not math.isfinite(value))


def meets(value: Any, claim: Mapping[str, Any]) -> bool | None:
    """Whether ``value`` satisfies the claim's tolerance; ``None`` when there is no usable value."""
    if not _usable(value):
        return None
    tol, paper = claim["tolerance"], claim.get("paper_value")
    if "equals" in tol:
        want = tol["equals"]
        if _is_number(want) and _is_number(value):
            return float(value) == float(want)
        return value == want
    if not _is_number(value):
        return None
    value = float(value)
    if "absolute" in tol:
        return abs(value - float(paper)) <= float(tol["absolute"])
    if "relative" in tol:
        return abs(value / float(paper) - 1.0) <= float(tol["relative"])
    return float(tol.get("min", -math.inf)) <= value <= float(tol.get("max", math.inf))


def _distance(value: Any, claim: Mapping[str, Any]) -> float | None:
    paper = claim.get("paper_value")
    if _is_number(value) and _is_number(paper):
        return abs(float(value) - float(paper))
    return None


def claim_status(claim: Mapping[str, Any], scales: Sequence[Scale]) -> ClaimResult:
    """The claim's status from the largest scale that measured it (stale records are shown
    but do not count): met there, "reproduced" when that scale is the paper's or the claim is
    ``exact``, else "reproduced at smaller scale"; not met, "differs, explained" when the claim
    names the section that explains it, else "differs, not yet explained"; nowhere measured,
    "not yet run at this scale"."""
    order = {name: i for i, name in enumerate(SCALES)}
    unknown = [s.name for s in scales if s.name not in order]
    if unknown:
        raise ValueError(f"scales: unknown scale name(s) {unknown}; expected {SCALES}")
    measure, interval = claim.get("measure"), claim.get("interval")
    rows = []
    for scale in sorted(scales, key=lambda s: order[s.name]):
        value = scale.values.get(measure) if measure else None
        half = scale.values.get(interval) if interval else None
        rows.append(Measurement(scale, value if _usable(value) else None,
                                float(half) if _is_number(half) else None, meets(value, claim)))
    counted = [m for m in rows if m.met is not None and m.scale.current is not False]
    if not counted:
        return ClaimResult(claim, NOT_RUN, None, rows, None)
    last = counted[-1]
    if last.met:
        status = REPRODUCED if (claim.get("exact") or last.scale.name == "paper") else SMALLER
    else:
        status = DIFFERS if claim.get("differs") else UNEXPLAINED
    trend = None
    first = counted[0]
    if first is not last:
        d0, d1 = _distance(first.value, claim), _distance(last.value, claim)
        if d0 is not None and d1 is not None:
            trend = "toward" if d1 < d0 else "away from" if d1 > d0 else "unchanged"
        elif first.met != last.met:
            trend = "toward" if last.met else "away from"
        else:
            trend = "unchanged"
    return ClaimResult(claim, status, last.scale.name, rows, trend)


def ratio_to_paper(value: Any, claim: Mapping[str, Any]) -> tuple[str, float] | None:
    """``("ratio", ours / paper)`` where both are numbers of the same sign and the paper's is
    non-zero, ``("difference", ours - paper)`` where a ratio means nothing (paper value 0 or
    signs differ), ``None`` for a qualitative claim or a non-numeric value."""
    paper = claim.get("paper_value")
    if not (_is_number(value) and _is_number(paper)) or claim["tolerance"].keys() == {"equals"}:
        return None
    value, paper = float(value), float(paper)
    if paper != 0 and value / paper > 0:
        return "ratio", value / paper
    return "difference", value - paper


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
    if "absolute" in tol:
        return f"within ±{format_value(tol['absolute'])} of the paper"
    if "relative" in tol:
        return f"within {100 * float(tol['relative']):.0f} % of the paper"
    if "equals" in tol:
        return f"= {format_value(tol['equals'])}"
    lo, hi = tol.get("min"), tol.get("max")
    if lo is not None and hi is not None:
        return f"between {format_value(lo)} and {format_value(hi)}"
    return f"≥ {format_value(lo)}" if lo is not None else f"≤ {format_value(hi)}"
