"""Comparing methods over seeds: means with 95 % intervals, and when an ordering is claimed.

The book compares methods over at least three seeds and claims an ordering only where
the 95 % intervals of the two means do not overlap; everything else is a tie at the
chapter's scale. These are the two functions every chapter uses for that.
"""

from __future__ import annotations

import math
from typing import Sequence, Union

import numpy as np

Interval = tuple[float, float]


def mean_interval(values: Sequence[float], confidence: float = 0.95) -> Interval:
    """``(mean, half_width)`` of the Student-t interval for the mean of ``values``.

    ``values`` are independent repetitions (seeds, splits). The half-width is
    ``t_{(1+c)/2, n-1} * s / sqrt(n)`` with the sample standard deviation ``s``; it is
    ``nan`` for a single value (no interval can be given).
    """
    from scipy import stats

    v = np.asarray(values, dtype=np.float64).ravel()
    if v.size == 0:
        raise ValueError("values must hold at least one number")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    if v.size == 1:
        return float(v[0]), float("nan")
    half = stats.t.ppf(0.5 + confidence / 2, v.size - 1) * v.std(ddof=1) / math.sqrt(v.size)
    return float(v.mean()), float(half)


def intervals_separate(a: Union[Interval, Sequence[float]], b: Union[Interval, Sequence[float]]) -> bool:
    """Whether two 95 % intervals do not overlap (so an ordering may be claimed).

    Each argument is either a ``(mean, half_width)`` pair from :func:`mean_interval` or
    the list of per-seed values itself. An interval with a ``nan`` half-width (one seed)
    separates from nothing.
    """
    (ma, ha), (mb, hb) = (_as_interval(x) for x in (a, b))
    if math.isnan(ha) or math.isnan(hb):
        return False
    return bool(abs(ma - mb) > ha + hb)


def _as_interval(x: Union[Interval, Sequence[float]]) -> Interval:
    if isinstance(x, tuple) and len(x) == 2:
        return float(x[0]), float(x[1])
    return mean_interval(x)


#: The fewest seeds per method for which :func:`verdict` may claim an ordering.
MIN_SEEDS = 3


def verdict(a: Sequence[float], b: Sequence[float], higher_is_better: bool = True, paired: bool = False) -> str:
    """``'ahead'``, ``'behind'`` or ``'tied'``: the book's rule for the values ``a`` against ``b``.

    Unpaired (the default; independent runs per method): ``'ahead'`` or ``'behind'`` when both
    have at least :data:`MIN_SEEDS` values and their 95 % intervals separate
    (:func:`intervals_separate`), else ``'tied'``.

    Paired (``paired=True``; ``a[i]`` and ``b[i]`` share seed, split or channel ``i``): the
    95 % Student-t interval of the per-pair differences ``a[i] - b[i]`` must exclude 0 (the
    two-sided paired t-test at level 0.05), with at least :data:`MIN_SEEDS` pairs; ``a`` and
    ``b`` must have the same length.

    ``higher_is_better`` says which direction is ahead (accuracy: True; errors, losses: False).
    """
    a, b = list(a), list(b)
    if paired:
        if len(a) != len(b):
            raise ValueError(f"paired samples need equal lengths, got a: {len(a)} and b: {len(b)}")
        if len(a) < MIN_SEEDS:
            return "tied"
        mean, half = mean_interval([x - y for x, y in zip(a, b)])
        if not abs(mean) > half:  # also False for a nan half-width
            return "tied"
        return "ahead" if (mean > 0) == bool(higher_is_better) else "behind"
    if min(len(a), len(b)) < MIN_SEEDS or not intervals_separate(a, b):
        return "tied"
    return "ahead" if (float(np.mean(a)) > float(np.mean(b))) == bool(higher_is_better) else "behind"


#: The words :func:`verdict` returns; the book-wide prose test (tests/test_claims_prose.py)
#: accepts a glued value among them as a computed verdict.
VERDICTS = ("ahead", "behind", "tied")


def format_interval(values: Sequence[float], spec: str) -> str:
    """``"mean ± half-width"`` of :func:`mean_interval`, both formatted with ``spec`` (such as
    ``".3f"``); one value has no interval and shows a half-width of 0."""
    mean, half = mean_interval(values)
    return f"{mean:{spec}} ± {0.0 if math.isnan(half) else half:{spec}}"


def max_rel_err(got, want) -> float:
    """Largest entrywise difference relative to the largest entry of the reference:
    :math:`\\max |g - w| / \\max(\\max |w|, 10^{-300})`, in the precision of the operands (a
    ``float32`` pair stays ``float32``; a ``float32``/``float64`` pair is compared in
    ``float64``). ``got`` and ``want`` are tensors or arrays (broadcast as torch does). How chapters 4
    (Toeplitz operators) and 5 (LookupFFN) check a hand-built computation against the package."""
    import torch

    got, want = torch.as_tensor(got), torch.as_tensor(want)
    return float((got - want).abs().max() / want.abs().max().clamp_min(1e-300))
