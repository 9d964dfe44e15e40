"""One claim language and its checker: "the glued value X must satisfy Y".

Both lists of claims use it: ``tests/expected/<chapter>.yaml`` (the regression checks of
each chapter, checked by ``tests/test_chapters.py`` and, against the recorded runs, by
``tests/test_runs.py``) and ``book/claims.yaml`` (the papers' claims, whose ``tolerance``
is a check of this language, judged by :mod:`nnk_book.scorecard`).

A check is a mapping of these keys (every key present must hold):

==================  ==================================================================
``value``           with ``atol`` and/or ``rtol``: ``|x - value| <= atol + rtol |value|``
                    (in ``claims.yaml`` the claim supplies ``value``: the paper's number,
                    or the book's prediction where the paper states none)
``min``, ``max``    closed bounds: ``min <= x <= max``
``less_than``,      the glued name of another value: ``x < other`` (``x > other``)
``greater_than``
``equals``          ``x == v`` (a number, a bool or a word)
``one_of``          ``x`` equals one of a list of at least two accepted values
``verdict_of``      ``{a, b[, higher_is_better][, word]}``: ``x`` is the verdict that the
                    glued 95 % intervals ``a ± a_hw`` and ``b ± b_hw`` give
                    (:func:`nnk_book.stats.verdict`'s rule); with ``word``, ``x`` is a
                    bool, whether that verdict is ``word``
``all_tied_of``     a list of glued names: ``x`` is ``"tied"`` when no pair of their
                    intervals separates, else ``"not all tied (...)"`` naming one pair per
                    ``;``-separated item for each pair that separates
``when``            ``{name: v}``: the check applies only where the glued ``name`` is ``v``
                    (a condition not glued fails; a condition not met makes the check hold)
==================  ==================================================================

The numeric keys (``value``, ``min``, ``max``, ``less_than``, ``greater_than``) need a
finite number that is not a bool. With a 95 % half-width ``h`` (the scorecard's
intervals), the whole of ``[x - h, x + h]`` must satisfy them to be met, none of it to be
not met; an interval across an edge is inconclusive (``met is None``).

Pure functions on plain values: nothing here reads a notebook.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, NamedTuple

from nnk_book.stats import intervals_separate

#: every key of the claim language
KEYS = ("value", "atol", "rtol", "min", "max", "less_than", "greater_than", "equals", "one_of",
        "verdict_of", "all_tied_of", "when")
#: keys that compare a number (the value checked must be a finite number)
NUMERIC = frozenset({"value", "min", "max", "less_than", "greater_than"})
#: keys that only qualify another key: a check made only of them asserts nothing
QUALIFIERS = frozenset({"atol", "rtol", "when"})
VERDICT_KEYS = frozenset({"a", "b", "higher_is_better", "word"})
VERDICTS = ("ahead", "behind", "tied")


@dataclass(frozen=True)
class Check:
    """A parsed check: :attr:`spec` holds only keys of :data:`KEYS`, each validated."""

    spec: Mapping[str, Any]

    @property
    def numeric(self) -> bool:
        """Whether the check compares a number (then a non-number fails it)."""
        return bool(NUMERIC & set(self.spec))


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _is_scalar(x: Any) -> bool:
    return x is None or isinstance(x, (bool, int, float, str))


def parse(spec: Any, where: str = "check") -> Check:
    """Validate ``spec`` (a mapping in the language of this module) and return its :class:`Check`.

    ``ValueError`` names ``where`` and the offending key: an unknown key, a value of the
    wrong type, ``atol``/``rtol`` without ``value`` (or the reverse), ``min`` above ``max``,
    or a check with no criterion."""
    if not isinstance(spec, Mapping):
        raise ValueError(f"{where}: a check is a mapping of {list(KEYS)}, got {spec!r}")
    unknown = sorted(set(spec) - set(KEYS), key=str)
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown}; a check has keys among {list(KEYS)}")
    if not set(spec) - QUALIFIERS:
        raise ValueError(f"{where}: no criterion (only {sorted(spec)}): a check needs one of "
                         f"{[k for k in KEYS if k not in QUALIFIERS]}")
    for key in ("value", "min", "max"):
        if key in spec and not _is_number(spec[key]):
            raise ValueError(f"{where}: {key} must be a finite number, got {spec[key]!r}")
    for key in ("atol", "rtol"):
        if key in spec and not (_is_number(spec[key]) and spec[key] >= 0):
            raise ValueError(f"{where}: {key} must be a non-negative number, got {spec[key]!r}")
        if key in spec and "value" not in spec:
            raise ValueError(f"{where}: {key} needs value (the number it is a tolerance around)")
    if "value" in spec and not {"atol", "rtol"} & set(spec):
        raise ValueError(f"{where}: value needs atol or rtol (its tolerance)")
    if "min" in spec and "max" in spec and spec["min"] > spec["max"]:
        raise ValueError(f"{where}: min {spec['min']} is above max {spec['max']}")
    for key in ("less_than", "greater_than"):
        if key in spec and not (isinstance(spec[key], str) and spec[key]):
            raise ValueError(f"{where}: {key} must be the glued name of the value compared with, got {spec[key]!r}")
    if "equals" in spec and not _is_scalar(spec["equals"]):
        raise ValueError(f"{where}: equals must be a number, a bool or a word, got {spec['equals']!r}")
    if "one_of" in spec:
        accepted = spec["one_of"]
        if not (isinstance(accepted, list) and len(accepted) >= 2 and all(map(_is_scalar, accepted))):
            raise ValueError(f"{where}: one_of needs a list of at least two accepted values, got {accepted!r}")
    if "verdict_of" in spec:
        v = spec["verdict_of"]
        if not (isinstance(v, Mapping) and {"a", "b"} <= set(v) <= VERDICT_KEYS
                and all(isinstance(v[k], str) for k in ("a", "b"))):
            raise ValueError(f"{where}: verdict_of needs glued names a and b (optional higher_is_better, word), got {v!r}")
        if not isinstance(v.get("higher_is_better", True), bool):
            raise ValueError(f"{where}: verdict_of.higher_is_better must be true or false")
        if "word" in v and v["word"] not in VERDICTS:
            raise ValueError(f"{where}: verdict_of.word must be one of {VERDICTS}, got {v['word']!r}")
    if "all_tied_of" in spec:
        names = spec["all_tied_of"]
        if not (isinstance(names, list) and len(names) >= 2 and all(isinstance(n, str) for n in names)):
            raise ValueError(f"{where}: all_tied_of needs a list of at least two glued names, got {names!r}")
    if "when" in spec:
        when = spec["when"]
        if not (isinstance(when, Mapping) and when and all(isinstance(k, str) for k in when)):
            raise ValueError(f"{where}: when must map glued names to the values the check applies at, got {when!r}")
    return Check(dict(spec))


# --------------------------------------------------------------------------- evaluation
def separation(a: tuple[float, float], b: tuple[float, float], higher_is_better: bool = True) -> str:
    """The verdict of mean ``a[0]`` (95 % half-width ``a[1]``) against ``b``: ``"ahead"`` or
    ``"behind"`` only when the intervals separate, else ``"tied"``; a nan half-width
    separates from nothing (:func:`nnk_book.stats.intervals_separate`, the rule of
    :func:`nnk_book.stats.verdict`)."""
    if not intervals_separate(a, b):
        return "tied"
    return "ahead" if (a[0] > b[0]) == higher_is_better else "behind"


def _interval(glued: Mapping[str, Any], name: str) -> tuple[float, float] | None:
    if name not in glued or f"{name}_hw" not in glued:
        return None
    return float(glued[name]), float(glued[f"{name}_hw"])


def _verdict_errors(name: str, got: Any, spec: Mapping[str, Any], glued: Mapping[str, Any]) -> list[str]:
    errors = []
    if "verdict_of" in spec:
        v = spec["verdict_of"]
        a, b = _interval(glued, v["a"]), _interval(glued, v["b"])
        if a is None or b is None:
            errors.append(f"{name}: the intervals of {v['a']!r} and {v['b']!r} (and their _hw) were not both glued")
        else:
            want: Any = separation(a, b, bool(v.get("higher_is_better", True)))
            if "word" in v:
                want = want == v["word"]
            if got != want:
                errors.append(f"{name} = {got!r}, but the glued intervals {v['a']} = {a[0]:.4g} ± {a[1]:.3g} and "
                              f"{v['b']} = {b[0]:.4g} ± {b[1]:.3g} give {want!r}")
    if "all_tied_of" in spec:
        names = spec["all_tied_of"]
        intervals = {n: _interval(glued, n) for n in names}
        missing = [n for n, i in intervals.items() if i is None]
        if missing:
            return errors + [f"{name}: the intervals of {missing} were not glued"]
        separated = sum(separation(intervals[a], intervals[b]) != "tied"  # type: ignore[arg-type]
                        for i, a in enumerate(names) for b in names[i + 1:])
        if separated == 0 and got != "tied":
            errors.append(f"{name} = {got!r}, but no pair of {names} separates: expected 'tied'")
        if separated and not (isinstance(got, str) and got.startswith("not all tied (")
                              and got.count(";") + 1 == separated):
            errors.append(f"{name} = {got!r}, but {separated} pair(s) of {names} separate: expected "
                          f"'not all tied (...)' naming {separated}")
    return errors


class _Bound(NamedTuple):
    """One numeric criterion: ``lo <= x <= hi`` (``lo < x < hi`` when ``strict``), or, with a
    ``centre``, ``|x - centre| <= radius`` (a tolerance, computed as a distance so that a
    point on the edge is judged as the tolerance states it). ``words``: how it fails."""

    lo: float
    hi: float
    strict: bool
    words: str
    centre: float | None = None
    radius: float = 0.0


def _bounds(spec: Mapping[str, Any], glued: Mapping[str, Any], name: str, errors: list[str]) -> list[_Bound]:
    out = []
    if "value" in spec:
        v = spec["value"]
        tol = spec.get("atol", 0.0) + spec.get("rtol", 0.0) * abs(v)
        out.append(_Bound(v - tol, v + tol, False, f", expected {v} ± {tol:.3g}", v, tol))
    if "min" in spec:
        out.append(_Bound(spec["min"], math.inf, False, f" < min {spec['min']}"))
    if "max" in spec:
        out.append(_Bound(-math.inf, spec["max"], False, f" > max {spec['max']}"))
    for key, word in (("less_than", "<"), ("greater_than", ">")):
        if key in spec:
            other = glued.get(spec[key])
            if other is None:
                errors.append(f"{name}: the compared value {spec[key]!r} was not glued")
                continue
            o = float(other)
            lo, hi = (-math.inf, o) if key == "less_than" else (o, math.inf)
            out.append(_Bound(lo, hi, True, f" is not {word} {spec[key]} = {o:.6g}"))
    return out


def _side(x: float, h: float, b: _Bound) -> bool | None:
    """``True`` when all of ``[x - h, x + h]`` meets ``b``, ``False`` when none of it does,
    ``None`` across an edge (never for ``h == 0``: a point meets a criterion or not)."""
    if b.centre is not None:
        d, tol = abs(x - b.centre), b.radius
        inside, outside = d + h <= tol, d - h > tol
    elif b.strict:
        inside, outside = b.lo < x - h and x + h < b.hi, x + h <= b.lo or x - h >= b.hi
    else:
        inside, outside = b.lo <= x - h and x + h <= b.hi, x + h < b.lo or x - h > b.hi
    if inside:
        return True
    return False if (outside or h == 0) else None


def applies(check: Check, glued: Mapping[str, Any]) -> bool:
    """Whether the check's ``when`` conditions all hold in ``glued`` (a condition not glued
    does not hold); a check without ``when`` always applies."""
    return all(k in glued and glued[k] == v for k, v in check.spec.get("when", {}).items())


def evaluate(check: Check, got: Any, glued: Mapping[str, Any] | None = None, *,
             half_width: float | None = None, name: str = "value") -> tuple[bool | None, str]:
    """``(met, why)`` for the value ``got`` of the glued ``name`` against ``check``.

    ``glued``: every glued value of the run (the names that ``less_than``, ``verdict_of``,
    ``all_tied_of`` and ``when`` read). ``half_width``: the 95 % half-width of ``got``, or
    ``None`` for a point value. ``met`` is ``True``, ``False``, or ``None`` (inconclusive:
    only with a half-width, an interval across an edge of a numeric criterion). ``why``
    says which criteria failed, or why the check holds vacuously."""
    spec, glued = check.spec, glued or {}
    for other, wanted in spec.get("when", {}).items():
        if other not in glued:
            return False, f"{name}: the condition's value {other!r} was not glued"
        if glued[other] != wanted:
            return True, f"{name}: does not apply ({other} = {glued[other]!r}, not {wanted!r})"
    errors = _verdict_errors(name, got, spec, glued)
    if "equals" in spec and got != spec["equals"]:
        errors.append(f"{name} = {got!r}, expected {spec['equals']!r}")
    if "one_of" in spec and not any(got == w for w in spec["one_of"]):
        errors.append(f"{name} = {got!r}, expected one of {spec['one_of']!r}")
    inconclusive = []
    if check.numeric:
        if not _is_number(got):
            return False, "; ".join(errors + [f"{name} = {got!r} is not a finite number"])
        x = float(got)
        h = abs(float(half_width)) if _is_number(half_width) else 0.0
        for bound in _bounds(spec, glued, name, errors):
            side = _side(x, h, bound)
            shown = f"{name} = {x:.6g}" + (f" ± {h:.3g}" if h else "")
            if side is False:
                errors.append(shown + bound.words)
            elif side is None:
                inconclusive.append(f"{shown} lies across an edge ({bound.words.lstrip(', ')})")
    if errors:
        return False, "; ".join(errors)
    if inconclusive:
        return None, "; ".join(inconclusive)
    return True, f"{name}: holds"
