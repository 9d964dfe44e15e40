"""Bracket balance: is a long sequence of brackets (among filler symbols) well nested?

The task: a sequence of ``length`` tokens holds an even number of brackets ``(`` and
``)``, each bracket slot being a filler symbol (``a``, ``b``, ...) with probability
``filler_fraction``. The label is 1 when the brackets form a *Dyck word* (every prefix
has at least as many ``(`` as ``)``, and the counts agree at the end) and 0 otherwise.
Membership in the Dyck language D1 is the textbook test of whether a sequence model can
*count* over long spans: see Suzgun, Belinkov, Shieber & Gehrmann (2019), "LSTM Networks
Can Perform Dynamic Counting" (ACL Workshop on Deep Learning and Formal Languages), and
Bhattamishra, Ahuja & Goyal (2020), "On the Ability and Limitations of Transformers to
Recognize Formal Languages" (EMNLP), which both train classifiers and recognisers on
Dyck languages.

**Why this task next to ListOps.** Chapter 4 needs a second long-sequence task that a small
TNN learns on a CPU in a minute or two at n = 512-1024, and whose learned Toeplitz
kernels mean something:

* *Long range by construction.* A negative is a positive with one ``(`` at a point of
  height zero swapped with a later ``)``: the two sequences have the same bracket counts,
  the same filler positions and differ in two tokens only. Deciding needs the running
  height at the swapped position, a sum over *every* earlier bracket, and the swapped
  position lies in the middle half of the sequence, so at least n/4 tokens back. No
  bag-of-tokens statistic and no local window separates the classes.
* *Solvable by a Toeplitz operator.* The running height is ``h = T x`` with ``T`` the
  lower-triangular all-ones Toeplitz matrix and ``x = +1/-1/0`` for ``(``/``)``/filler,
  so one token-mixing layer (a causal kernel that is constant over lags) followed by a
  ReLU detector and mean pooling solves the task exactly. A trained TNN's kernels can
  be compared with that ideal, and the decay bias ``lambda^|i-j|`` has a visible cost: it
  forgets brackets further back than about ``1 / (1 - lambda)`` tokens.
* *It is ListOps' bracket bookkeeping on its own.* ListOps mixes bracket tracking with
  arithmetic; this task keeps the bracket tracking only, so the two rows of the accuracy
  table separate the two difficulties.
* *Pathfinder* (Linsley et al. 2018; LRA's image-like task) would match a column of the
  paper's Table 2, but even large models need hours of accelerator training to leave
  chance level on it (LRA, Table 1), so at teaching scale on a CPU it would only show
  50 %. The real Pathfinder files can still be fetched with :mod:`data_scripts.lra`.

**Positives** are drawn as a random walk on the height that must open at height 0, opens
or closes with probability 1/2 otherwise, and closes when the remaining brackets equal
the height. Such walks return to height 0 about sqrt(number of brackets) times, spread
over the whole sequence, which gives the negatives places to break. **Negatives** pick
one height-0 point in the middle half of the brackets uniformly, and one later ``)``
uniformly, and swap them: the height drops by 2 between the two, so it reaches -1 right
after the first. Classes are exactly balanced (``n_samples // 2`` positives) and shuffled.

Vocabulary (:data:`BRACKET_VOCAB`): ``<pad>`` (id 0, unused because every sequence has
exactly ``length`` tokens; kept so that id 0 means padding in every task), ``(`` (1),
``)`` (2), then ``n_fillers`` filler letters.
"""

from __future__ import annotations

from typing import List, Sequence, Tuple, Union

import numpy as np
import torch

__all__ = [
    "BRACKET_VOCAB",
    "OPEN_ID",
    "CLOSE_ID",
    "PAD_ID",
    "bracket_heights",
    "is_balanced",
    "decode_brackets",
    "generate_bracket_balance",
]

#: Id of the padding token (never produced: all sequences have the full length).
PAD_ID = 0
#: Id of ``(``.
OPEN_ID = 1
#: Id of ``)``.
CLOSE_ID = 2
_MAX_FILLERS = 26
#: Token of id i is ``BRACKET_VOCAB[i]``: ``<pad>``, ``(``, ``)``, then filler letters ``a``-``z``
#: (a call with ``n_fillers = k`` uses the first k letters, ids 3..k+2).
BRACKET_VOCAB: Tuple[str, ...] = ("<pad>", "(", ")") + tuple(chr(ord("a") + i) for i in range(_MAX_FILLERS))


def _check_int(name: str, value: object, *, low: int) -> int:
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"{name} must be an integer, got {value!r}")
    value = int(value)  # type: ignore[call-overload]
    if value < low:
        raise ValueError(f"{name} must be >= {low}, got {value}")
    return value


def bracket_heights(tokens: torch.Tensor) -> torch.Tensor:
    """Running height after each token: +1 for ``(``, -1 for ``)``, 0 otherwise.

    Shapes: (..., n) integer ids -> (..., n) int64. This is ``T x`` with ``T`` the
    lower-triangular all-ones Toeplitz matrix, computed as a cumulative sum, O(n).
    """
    if not isinstance(tokens, torch.Tensor) or tokens.dtype.is_floating_point or tokens.dtype == torch.bool:
        raise TypeError("tokens must be an integer torch.Tensor of token ids")
    steps = (tokens == OPEN_ID).to(torch.int64) - (tokens == CLOSE_ID).to(torch.int64)
    return steps.cumsum(dim=-1)


def is_balanced(tokens: torch.Tensor) -> torch.Tensor:
    """True where the brackets of a sequence form a Dyck word.

    Shapes: (..., n) -> (...) bool. A sequence without brackets is balanced.
    """
    h = bracket_heights(tokens)
    if h.shape[-1] == 0:
        return torch.ones(h.shape[:-1], dtype=torch.bool)
    return (h.min(dim=-1).values >= 0) & (h[..., -1] == 0)


def _positive_walk(rng: np.random.Generator, n_brackets: int) -> np.ndarray:
    """A random Dyck word of n_brackets (even) steps, +1/-1, with many returns to 0."""
    coins = rng.random(n_brackets) < 0.5
    steps = np.empty(n_brackets, dtype=np.int8)
    h = 0
    for i in range(n_brackets):
        remaining = n_brackets - i
        if h == 0:
            step = 1
        elif h == remaining:
            step = -1
        else:
            step = 1 if coins[i] else -1
        steps[i] = step
        h += step
    return steps


def generate_bracket_balance(
    n_samples: int,
    *,
    length: int,
    seed: int,
    filler_fraction: float = 0.0,
    n_fillers: int = 8,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Balanced and minimally unbalanced bracket sequences among filler symbols.

    See the module docstring for the construction and why it needs long-range counting.

    Args:
        n_samples: number of sequences, >= 2 (half of them, rounded down, are positives).
        length: tokens per sequence, >= 16. Chapter scale: 512 to 1024.
        seed: seed of ``numpy.random.default_rng``; the same arguments give the same data.
        filler_fraction: probability that a token is a filler rather than a bracket, in
            [0, 0.9]. 0 gives pure bracket strings.
        n_fillers: number of distinct filler symbols, 1..26 (ignored when
            ``filler_fraction == 0``).

    Returns:
        ``(tokens, labels)``: ``tokens`` int64 (n_samples, length) with ids from
        :data:`BRACKET_VOCAB` (no padding); ``labels`` int64 (n_samples,), 1 for balanced.
        Vocabulary size to embed: ``3 + n_fillers``.

    Cost: O(n_samples * length) (a Python loop over the brackets of each positive).

    Raises:
        ValueError / TypeError naming the argument when an argument is out of range.
    """
    n_samples = _check_int("n_samples", n_samples, low=2)
    length = _check_int("length", length, low=16)
    seed = _check_int("seed", seed, low=0)
    if isinstance(filler_fraction, bool) or not isinstance(filler_fraction, (int, float)):
        raise TypeError(f"filler_fraction must be a real number, got {filler_fraction!r}")
    if not 0.0 <= float(filler_fraction) <= 0.9:
        raise ValueError(f"filler_fraction must lie in [0, 0.9], got {filler_fraction!r}")
    n_fillers = _check_int("n_fillers", n_fillers, low=1)
    if n_fillers > _MAX_FILLERS:
        raise ValueError(f"n_fillers must be <= {_MAX_FILLERS}, got {n_fillers}")

    rng = np.random.default_rng(seed)
    labels = np.zeros(n_samples, dtype=np.int64)
    labels[: n_samples // 2] = 1
    rng.shuffle(labels)

    tokens = np.empty((n_samples, length), dtype=np.int64)
    for i in range(n_samples):
        while True:
            is_bracket = rng.random(length) >= filler_fraction
            slots = np.flatnonzero(is_bracket)
            if len(slots) % 2:
                # Keep an even number of brackets: the last one becomes a filler.
                is_bracket[slots[-1]] = False
                slots = slots[:-1]
            n_brackets = len(slots)
            if n_brackets < 8:
                continue
            steps = _positive_walk(rng, n_brackets)
            if labels[i] == 0:
                heights_before = np.concatenate(([0], np.cumsum(steps)[:-1]))
                lo, hi = n_brackets // 4, (3 * n_brackets) // 4
                zeros = np.flatnonzero(heights_before[lo:hi] == 0) + lo
                if len(zeros) == 0:
                    continue  # no height-0 point in the middle half: draw again
                t = zeros[rng.integers(len(zeros))]
                closes = np.flatnonzero(steps[t + 1 :] == -1) + t + 1
                s = closes[rng.integers(len(closes))]
                steps[t], steps[s] = -1, 1  # steps[t] was +1 (height 0), steps[s] was -1
            break
        row = rng.integers(3, 3 + n_fillers, size=length)
        row[slots] = np.where(steps > 0, OPEN_ID, CLOSE_ID)
        tokens[i] = row
    return torch.from_numpy(tokens), torch.from_numpy(labels)


def decode_brackets(tokens: Union[torch.Tensor, Sequence[int]]) -> str:
    """String of a sequence of ids (padding skipped), e.g. ``"(a)b(()"``."""
    if isinstance(tokens, torch.Tensor):
        tokens = tokens.tolist()
    chars: List[str] = []
    for i in tokens:
        if not 0 <= int(i) < len(BRACKET_VOCAB):
            raise ValueError(f"tokens must lie in [0, {len(BRACKET_VOCAB)}), got {i}")
        if int(i) != PAD_ID:
            chars.append(BRACKET_VOCAB[int(i)])
    return "".join(chars)
