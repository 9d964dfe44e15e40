"""Bracket counting over long sequences: the second long-range task of chapter 4.

Two binary classification tasks on sequences of ``length`` tokens made of brackets
``(`` and ``)`` among filler symbols (each position is a filler with probability
``filler_fraction``). Both ask for the running *height* -- the number of ``(`` minus
the number of ``)`` so far -- which depends on every earlier bracket:

* **Bracket query** (:func:`generate_bracket_query`, the teaching-scale task): one
  position holds a query marker ``?``; the label is 1 when the height at the marker is
  positive (more ``(`` than ``)`` before it) and 0 when it is negative.
* **Bracket balance** (:func:`generate_bracket_balance`, the hard variant): the label is
  1 when the brackets form a Dyck word (no prefix with more ``)`` than ``(``, equal
  counts at the end).

Counting languages are the standard probe of whether a sequence model can keep a count
over long spans: a^n b^n and related languages in Weiss, Goldberg & Yahav (2018), "On
the Practical Computational Power of Finite Precision RNNs for Language Recognition"
(ACL); Dyck-1 (balanced brackets) in Suzgun, Belinkov, Shieber & Gehrmann (2019), "LSTM
Networks Can Perform Dynamic Counting" (ACL Workshop on Deep Learning and Formal
Languages) and in Bhattamishra, Ahuja & Goyal (2020), "On the Ability and Limitations
of Transformers to Recognize Formal Languages" (EMNLP). The query task is our
classification form of that probe, built so that nothing but the long-range count
decides the label.

**Why this task next to ListOps.** Chapter 4 needs a second long-sequence task that a
small TNN learns on a CPU in a minute or two at n = 512-1024, and whose learned
Toeplitz kernels mean something:

* *Long range by construction.* Every sequence has as many ``(`` as ``)`` (so no count
  over the whole sequence, no bag of tokens, tells the classes apart), and the marker
  lies in the middle half, so the height at the marker sums at least n/4 tokens. Each
  bracket before the marker weighs the same in the label: a model that only counts
  the last ``W`` tokens before the marker at position ``m`` scores roughly
  ``1/2 + arcsin(sqrt(W/m))/pi`` (Gaussian approximation of the random walk, a little
  optimistic; measured at n = 512: 58 %, 64 % and 73 % for W = 32, 64 and 128), so
  accuracy measures how far back the model counts.
* *Solved exactly by a Toeplitz operator.* The height is ``h = T x`` with ``T`` the
  lower-triangular all-ones Toeplitz matrix and ``x = +1/-1/0`` for ``(``/``)``/other.
  One gated Toeplitz unit -- gate = "this is the marker", value = ``x``, kernel constant
  over lags ``>= 0`` -- followed by mean pooling computes ``h`` at the marker: the
  learned kernels can be compared with that ideal, and the decay bias
  ``lambda^|i-j|`` has a visible cost, since it forgets brackets further back than
  about ``1 / (1 - lambda)`` tokens. The label is the sign of a *linear* function of
  the tokens, which is why a small model learns it within a few hundred to a thousand
  steps.
* *It is ListOps' bracket bookkeeping on its own.* ListOps mixes bracket tracking with
  arithmetic; this task keeps the tracking only, so the two rows of the accuracy table
  separate the two difficulties.
* *Pathfinder* (Linsley, Kim, Veerabadran, Windolf & Serre 2018, "Learning long-range
  spatial dependencies with horizontal gated recurrent units", NeurIPS; LRA's
  image-like task) would match a column of the paper's Table 2, but it needs long
  accelerator training: the Transformers of LRA (Table 1) reach only about 65-77 % on
  its 32 x 32 version and stay at chance on the 128 x 128 one, so a short CPU run would
  show little more than 50 %. The real Pathfinder files can be fetched with
  :mod:`data_scripts.lra`.

The balance task is harder to *learn* although a TNN can represent it (height, then a
ReLU detector of negative heights, then pooling): the detector gets no gradient until
the count is nearly exact. In short CPU runs small TNNs stay around 60-70 % on it; use
it for longer runs or as an exercise.

**Query sequences.** The marker position ``m`` is uniform in ``[n/4, 3n/4)``; bracket
positions are the non-marker positions that are not fillers, cut to an even total with
an odd number before the marker (so the height there is never 0); the signs are a
uniform random arrangement of equally many ``(`` and ``)``, negated as a whole when
their height at the marker disagrees with the label drawn for that sequence (negation
maps one class onto the other, so both classes have the same distribution of
everything else).

**Balance sequences.** Positives are random walks on the height that must open at
height 0, open or close with probability 1/2 otherwise, and close when the remaining
brackets equal the height; such walks return to 0 about sqrt(number of brackets)
times, all along the sequence. A negative is a positive with one ``(`` at a height-0
point in the middle half of the brackets swapped with a uniformly chosen later ``)``:
same bracket counts, same filler positions, two tokens changed, and the height drops
to -1 right after the swapped ``(``, at least a quarter of the brackets into the
sequence.

Both generators give exactly ``n_samples // 2`` positives, shuffled, and are
deterministic under ``seed``. Vocabulary (:data:`BRACKET_VOCAB`): ``<pad>`` (id 0, never
produced: all sequences have exactly ``length`` tokens; kept so that id 0 means padding
in every task), ``(`` (1), ``)`` (2), ``?`` (3, the query marker), then filler letters
``a``, ``b``, ... (ids 4 .. 3 + n_fillers). Embed ``vocab_size(n_fillers)`` ids.
"""

from __future__ import annotations

from typing import List, Sequence, Tuple, Union

import numpy as np
import torch

from data_scripts._checks import check_int as _check_int

__all__ = [
    "BRACKET_VOCAB",
    "OPEN_ID",
    "CLOSE_ID",
    "QUERY_ID",
    "PAD_ID",
    "vocab_size",
    "generate_bracket_query",
    "height_at_query",
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
#: Id of the query marker ``?`` (bracket-query task only).
QUERY_ID = 3
_FIRST_FILLER = 4
_MAX_FILLERS = 26
#: Token of id i is ``BRACKET_VOCAB[i]``: ``<pad>``, ``(``, ``)``, ``?``, then filler letters
#: ``a``-``z`` (a call with ``n_fillers = k`` uses the first k letters, ids 4..k+3).
BRACKET_VOCAB: Tuple[str, ...] = (
    ("<pad>", "(", ")", "?") + tuple(chr(ord("a") + i) for i in range(_MAX_FILLERS))
)


def vocab_size(n_fillers: int) -> int:
    """Number of token ids to embed for a call with ``n_fillers`` filler symbols."""
    return _FIRST_FILLER + _check_int("n_fillers", n_fillers, low=1)




def _check_task_args(n_samples: object, length: object, seed: object, filler_fraction: object,
                     n_fillers: object, *, min_length: int) -> Tuple[int, int, int, float, int]:
    n_samples = _check_int("n_samples", n_samples, low=2)
    length = _check_int("length", length, low=min_length)
    seed = _check_int("seed", seed, low=0)
    if isinstance(filler_fraction, bool) or not isinstance(filler_fraction, (int, float)):
        raise TypeError(f"filler_fraction must be a real number, got {filler_fraction!r}")
    if not 0.0 <= float(filler_fraction) <= 0.9:
        raise ValueError(f"filler_fraction must lie in [0, 0.9], got {filler_fraction!r}")
    n_fillers = _check_int("n_fillers", n_fillers, low=1)
    if n_fillers > _MAX_FILLERS:
        raise ValueError(f"n_fillers must be <= {_MAX_FILLERS}, got {n_fillers}")
    return n_samples, length, seed, float(filler_fraction), n_fillers


def _balanced_labels(rng: np.random.Generator, n_samples: int) -> np.ndarray:
    labels = np.zeros(n_samples, dtype=np.int64)
    labels[: n_samples // 2] = 1
    rng.shuffle(labels)
    return labels


def bracket_heights(tokens: torch.Tensor) -> torch.Tensor:
    """Running height after each token: +1 for ``(``, -1 for ``)``, 0 otherwise.

    Shapes: (..., n) integer ids -> (..., n) int64. This is ``T x`` with ``T`` the
    lower-triangular all-ones Toeplitz matrix, computed as a cumulative sum, O(n).
    """
    if (not isinstance(tokens, torch.Tensor) or tokens.dtype.is_floating_point
            or tokens.dtype == torch.bool):
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


def height_at_query(tokens: torch.Tensor) -> torch.Tensor:
    """Height (``(`` minus ``)``) before the first ``?`` of each sequence.

    Shapes: (..., n) -> (...) int64. Raises ValueError if a sequence has no ``?``.
    """
    h = bracket_heights(tokens)
    is_query = tokens == QUERY_ID
    if not bool(is_query.any(dim=-1).all()):
        raise ValueError("tokens must contain the query marker '?' (id 3) in every sequence")
    first = is_query.to(torch.int64).argmax(dim=-1, keepdim=True)
    return h.gather(-1, first).squeeze(-1)  # the marker itself does not move the height


def generate_bracket_query(
    n_samples: int,
    *,
    length: int,
    seed: int,
    filler_fraction: float = 0.0,
    n_fillers: int = 8,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Bracket sequences with one query marker; label = "more ``(`` than ``)`` before the marker".

    See the module docstring for the construction: equal bracket counts overall, the
    marker uniform in the middle half, an odd number of brackets before it, classes
    mapped onto each other by swapping ``(`` and ``)``.

    Args:
        n_samples: number of sequences, >= 2 (half of them, rounded down, are positives).
        length: tokens per sequence, >= 8. Chapter scale: 512 to 1024.
        seed: seed of ``numpy.random.default_rng``; the same arguments give the same data.
        filler_fraction: probability that a token is a filler rather than a bracket, in
            [0, 0.9]. 0 gives pure bracket strings (plus the marker).
        n_fillers: number of distinct filler symbols, 1..26 (ignored when
            ``filler_fraction == 0``).

    Returns:
        ``(tokens, labels)``: ``tokens`` int64 (n_samples, length) with ids from
        :data:`BRACKET_VOCAB`, exactly one ``?`` per row, no padding; ``labels`` int64
        (n_samples,), 1 where the height at the marker is positive (it is never 0).
        Ids to embed: ``vocab_size(n_fillers)``.

    Cost: O(n_samples * length), vectorised per sequence.

    Raises:
        ValueError / TypeError naming the argument when an argument is out of range.
    """
    n_samples, length, seed, filler_fraction, n_fillers = _check_task_args(
        n_samples, length, seed, filler_fraction, n_fillers, min_length=8)
    rng = np.random.default_rng(seed)
    labels = _balanced_labels(rng, n_samples)
    tokens = np.empty((n_samples, length), dtype=np.int64)
    for i in range(n_samples):
        while True:
            marker = int(rng.integers(length // 4, (3 * length) // 4))
            slots = np.flatnonzero(rng.random(length) >= filler_fraction)
            slots = slots[slots != marker]
            before, after = slots[slots < marker], slots[slots > marker]
            if len(before) % 2 == 0:
                before = before[:-1]  # odd count before the marker: the height is never 0
            slots = np.concatenate([before, after])
            if len(slots) % 2:
                slots = slots[:-1]  # even count overall: as many "(" as ")"
            if len(before) >= 1 and len(slots) >= 2:
                break
        steps = np.repeat(np.array([1, -1], dtype=np.int64), len(slots) // 2)
        rng.shuffle(steps)
        if (steps[: len(before)].sum() > 0) != bool(labels[i]):
            steps = -steps
        row = rng.integers(_FIRST_FILLER, _FIRST_FILLER + n_fillers, size=length)
        row[slots] = np.where(steps > 0, OPEN_ID, CLOSE_ID)
        row[marker] = QUERY_ID
        tokens[i] = row
    return torch.from_numpy(tokens), torch.from_numpy(labels)


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
        :data:`BRACKET_VOCAB` (no padding, no ``?``); ``labels`` int64 (n_samples,), 1 for
        balanced. Ids to embed: ``vocab_size(n_fillers)``.

    Cost: O(n_samples * length) (a Python loop over the brackets of each positive).

    Raises:
        ValueError / TypeError naming the argument when an argument is out of range.
    """
    n_samples, length, seed, filler_fraction, n_fillers = _check_task_args(
        n_samples, length, seed, filler_fraction, n_fillers, min_length=16)
    rng = np.random.default_rng(seed)
    labels = _balanced_labels(rng, n_samples)

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
        row = rng.integers(_FIRST_FILLER, _FIRST_FILLER + n_fillers, size=length)
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
