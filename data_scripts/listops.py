"""ListOps: nested MAX/MIN/MED/SUM_MOD expressions over the digits, labelled by their value.

ListOps was introduced by Nangia & Bowman (2018, "ListOps: A Diagnostic Dataset for
Latent Tree Learning", NAACL SRW) and its long version is the ListOps task of the Long
Range Arena (Tay et al. 2021, "Long Range Arena: A Benchmark for Efficient
Transformers", ICLR), one of the 1-D tasks of Table 2 in the SKI/FD-TNN paper. Chapter 4
(``chapters/04_toeplitz.ipynb``) trains TNN, SKI-TNN and FD-TNN on sequences made here
and, in the full profile, on the real LRA files read by :func:`read_listops_tsv`.

An expression is a tree written in prefix form::

    [MAX 2 9 [MIN 4 7 ] 0 ]          value 9

The operators take two or more arguments (digits or sub-expressions) and are closed by
``]``:

* ``[MAX`` / ``[MIN``: largest / smallest argument;
* ``[MED``: median, as an integer: ``int(np.median(args))``, i.e. the floor of the mean of
  the two middle values when the count is even (this is what LRA's labels use);
* ``[SM``: sum modulo 10.

The label is the value of the whole expression, one of the 10 digits.

**Generator.** :func:`generate_listops` follows LRA's ``lra_benchmarks/data/listops.py``:
each node below ``max_depth`` is an operator with probability 1/4 and a digit otherwise;
an operator draws its argument count uniformly from ``2..max_args`` and its type
uniformly from the four operators; a node at ``max_depth`` is a digit. Trees are drawn
until enough distinct ones fall in the length window (LRA: ``max_depth=10``,
``max_args=10``, 500 < length < 2000). Two differences, neither of which changes the
distribution of accepted trees: the root is always an operator (LRA's root is a single
digit with probability 3/4, and such one-token sequences are then rejected by the length
window), and a tree is abandoned as soon as it grows past ``max_length`` instead of being
built in full and rejected.

**Tokens.** LRA's TSV files write a tree with one pair of parentheses per application
(``( ( ( [MAX 2 ) 9 ) ] )``); the parentheses carry no information beyond the brackets and
are dropped, as in the S4 code base's ListOps loader. The vocabulary
(:data:`LISTOPS_VOCAB`) is ``<pad>`` (id 0), the digits ``0``-``9`` (ids 1-10), the four
operators and ``]``: 16 ids. The official LRA input pipeline tokenises with a
``tfds`` tokenizer that drops ``]`` altogether; we keep it, as later work does, because
the closing brackets are what make the tree readable.
"""

from __future__ import annotations

import csv
import itertools
import os
import random
from pathlib import Path
from typing import Iterable, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from data_scripts._checks import check_int as _check_int

__all__ = [
    "LISTOPS_VOCAB",
    "LISTOPS_OPERATORS",
    "PAD_ID",
    "N_LISTOPS_CLASSES",
    "tokenize_listops",
    "encode_listops",
    "decode_listops",
    "evaluate_listops",
    "to_lra_source",
    "generate_listops",
    "read_listops_tsv",
    "write_listops_tsv",
]

#: The four operators of LRA's ListOps (LRA's generator also defines FIRST and LAST but
#: leaves them out of the released data).
LISTOPS_OPERATORS: Tuple[str, ...] = ("[MIN", "[MAX", "[MED", "[SM")
#: Closing bracket of every operator.
END = "]"
#: Token of id i is ``LISTOPS_VOCAB[i]``; id 0 is padding.
LISTOPS_VOCAB: Tuple[str, ...] = (
    ("<pad>",) + tuple(str(d) for d in range(10)) + LISTOPS_OPERATORS + (END,)
)
#: Id of the padding token.
PAD_ID = 0
#: Number of labels (the value of an expression is a digit).
N_LISTOPS_CLASSES = 10

_TOKEN_TO_ID = {tok: i for i, tok in enumerate(LISTOPS_VOCAB)}
_ENCODE = {tok: i for tok, i in _TOKEN_TO_ID.items() if i != PAD_ID}  # "<pad>" is not a text token
_DIGIT_IDS = tuple(_TOKEN_TO_ID[str(d)] for d in range(10))
_OP_IDS = tuple(_TOKEN_TO_ID[op] for op in LISTOPS_OPERATORS)
_END_ID = _TOKEN_TO_ID[END]
# Probability that a node above the depth limit is an operator (LRA's VALUE_P, despite
# its name: LRA draws a digit when random() > VALUE_P).
_OPERATOR_P = 0.25

Expression = Union[str, Sequence[str]]


# --------------------------------------------------------------------------- checks


# ----------------------------------------------------------------- tokens and values
def tokenize_listops(expression: Expression) -> List[str]:
    """Split an expression into tokens, dropping LRA's parentheses.

    Accepts the compact form (``"[MAX 2 9 ]"``), LRA's parenthesised form
    (``"( ( ( [MAX 2 ) 9 ) ] )"``), or an already split sequence of tokens.
    Tokens are not checked here; :func:`encode_listops` and :func:`evaluate_listops` do.
    """
    if isinstance(expression, str):
        return expression.replace("(", " ").replace(")", " ").split()
    if isinstance(expression, Sequence):
        return [tok for tok in expression if tok not in ("(", ")")]
    raise TypeError(
        f"expression must be a string or a sequence of tokens, got {type(expression).__name__}"
    )


def encode_listops(expression: Expression) -> List[int]:
    """Token ids (see :data:`LISTOPS_VOCAB`) of an expression; parentheses are dropped.

    Raises:
        ValueError naming the first unknown token.
    """
    tokens = tokenize_listops(expression)
    try:
        return [_ENCODE[tok] for tok in tokens]
    except KeyError:
        pos, tok = next((i, t) for i, t in enumerate(tokens) if t not in _ENCODE)
        raise ValueError(
            f"expression has an unknown token {tok!r} at position {pos}; "
            f"expected one of {LISTOPS_VOCAB[1:]}"
        ) from None


def decode_listops(ids: Union[torch.Tensor, Iterable[int]]) -> str:
    """Compact string of a sequence of ids; padding (id 0) is skipped."""
    if isinstance(ids, torch.Tensor):
        ids = ids.tolist()
    out = []
    for i in ids:
        if not 0 <= int(i) < len(LISTOPS_VOCAB):
            raise ValueError(f"ids must lie in [0, {len(LISTOPS_VOCAB)}), got {i}")
        if int(i) != PAD_ID:
            out.append(LISTOPS_VOCAB[int(i)])
    return " ".join(out)


def _apply(op: str, args: List[int]) -> int:
    if op == "[MAX":
        return max(args)
    if op == "[MIN":
        return min(args)
    if op == "[MED":
        s = sorted(args)
        n = len(s)
        # int(np.median(s)) for non-negative integers: floor of the mean of the middle pair.
        return (s[(n - 1) // 2] + s[n // 2]) // 2
    return sum(args) % 10  # "[SM"


def evaluate_listops(expression: Expression) -> int:
    """Value of a ListOps expression, computed with an explicit stack (no recursion).

    Cost O(L log L) for L tokens (the sort in ``[MED``). Parentheses are ignored, so LRA's
    source strings can be passed as they are.

    Raises:
        ValueError if the expression is empty, has an unknown token, closes a bracket that
        was never opened, applies an operator to no argument, leaves a bracket open, or
        has more than one top-level value.
    """
    tokens = tokenize_listops(expression)
    if not tokens:
        raise ValueError("expression is empty")
    stack: List[Tuple[str, List[int]]] = []
    result: Optional[int] = None
    for pos, tok in enumerate(tokens):
        if tok in LISTOPS_OPERATORS:
            if result is not None:
                raise ValueError(
                    f"expression continues after its top-level value, at position {pos} ({tok!r})"
                )
            stack.append((tok, []))
            continue
        if tok == END:
            if not stack:
                raise ValueError(
                    f"expression closes a bracket that was never opened, at position {pos}"
                )
            op, args = stack.pop()
            if not args:
                raise ValueError(f"operator {op} has no arguments (closed at position {pos})")
            value = _apply(op, args)
        elif len(tok) == 1 and tok.isdigit():
            value = int(tok)
        else:
            raise ValueError(
                f"expression has an unknown token {tok!r} at position {pos}; "
                f"expected one of {LISTOPS_VOCAB[1:]}"
            )
        if stack:
            stack[-1][1].append(value)
        elif result is None:
            result = value
        else:
            raise ValueError(
                f"expression has more than one top-level value (second at position {pos})"
            )
    if stack:
        raise ValueError(
            f"expression leaves {len(stack)} bracket(s) open (innermost {stack[-1][0]})"
        )
    assert result is not None
    return result


def to_lra_source(expression: Expression) -> str:
    """LRA's parenthesised string of an expression, as in the ``Source`` column of its TSVs.

    LRA builds the tree as nested pairs ``((((op, a1), a2), ...), ']')`` and prints one pair
    of parentheses per pair: ``[MAX 2 9 ]`` becomes ``( ( ( [MAX 2 ) 9 ) ] )``. A digit on
    its own is printed bare.
    """
    tokens = tokenize_listops(expression)
    evaluate_listops(tokens)  # validates the structure
    out: List[str] = []
    # An operator with k arguments opens k + 1 parentheses; each argument and the final
    # "]" closes one. Count the arguments first (one pass with a stack of counters).
    n_args = {}
    stack: List[int] = []
    for pos, tok in enumerate(tokens):
        if stack and tok != END:
            n_args[stack[-1]] += 1
        if tok in LISTOPS_OPERATORS:
            n_args[pos] = 0
            stack.append(pos)
        elif tok == END:
            stack.pop()
    open_operators = 0
    for pos, tok in enumerate(tokens):
        if tok in LISTOPS_OPERATORS:
            out.extend(["("] * (n_args[pos] + 1))
            out.append(tok)
            open_operators += 1
            continue
        if tok == END:
            open_operators -= 1
            out.extend([END, ")"])
        else:
            out.append(tok)
        # A finished argument (digit or sub-expression) closes one parenthesis of its parent.
        if open_operators:
            out.append(")")
    return " ".join(out)


# ------------------------------------------------------------------------ generator
class _TooLong(Exception):
    pass


def _grow(rng: random.Random, depth: int, max_depth: int, max_args: int, out: List[int],
          max_length: int, force_operator: bool) -> None:
    """Append a random subtree (LRA's ``generate_tree``) to ``out`` in prefix order."""
    if not force_operator and (depth >= max_depth or rng.random() > _OPERATOR_P):
        out.append(_DIGIT_IDS[rng.randrange(10)])
    else:
        n_children = rng.randint(2, max_args)
        out.append(_OP_IDS[rng.randrange(len(_OP_IDS))])
        for _ in range(n_children):
            _grow(rng, depth + 1, max_depth, max_args, out, max_length, False)
        out.append(_END_ID)
    if len(out) > max_length:
        raise _TooLong


def _pad(seqs: Sequence[Sequence[int]], length: int) -> torch.Tensor:
    lengths = np.fromiter((len(seq) for seq in seqs), dtype=np.int64, count=len(seqs))
    flat = np.fromiter(
        itertools.chain.from_iterable(seqs), dtype=np.int64, count=int(lengths.sum())
    )
    tokens = np.full((len(seqs), length), PAD_ID, dtype=np.int64)
    tokens[np.arange(length) < lengths[:, None]] = flat  # row-major order = concatenation order
    return torch.from_numpy(tokens)


def generate_listops(
    n_samples: int,
    *,
    min_length: int,
    max_length: int,
    max_depth: int = 10,
    max_args: int = 10,
    seed: int,
    return_strings: bool = False,
    max_attempts: Optional[int] = None,
) -> Union[Tuple[torch.Tensor, torch.Tensor, torch.Tensor],
           Tuple[torch.Tensor, torch.Tensor, torch.Tensor, List[str]]]:
    """Draw distinct random ListOps expressions whose length lies in a window.

    Sampling follows LRA's generator (see the module docstring); ``seed`` drives a
    ``random.Random`` so the same arguments give the same data on every platform.
    Expressions are distinct within one call (LRA also de-duplicates).

    Args:
        n_samples: number of expressions, >= 1.
        min_length, max_length: accepted lengths in tokens (parentheses excluded),
            ``min_length <= length <= max_length``; ``max_length >= 4`` (the shortest
            expression, ``[OP d d ]``, has 4 tokens). LRA: 500 and 2000.
        max_depth: depth limit of the tree (the root has depth 1), >= 2. LRA: 10.
        max_args: largest argument count of an operator, >= 2. LRA: 10.
        seed: seed of the generator, >= 0.
        return_strings: also return the compact string of every expression.
        max_attempts: give up after this many trees (default ``1000 * n_samples + 10000``),
            so that an unreachable window fails instead of looping.

    Returns:
        ``(tokens, lengths, labels)``, or ``(tokens, lengths, labels, strings)`` with
        ``return_strings``: ``tokens`` int64 (n_samples, max_length) right-padded with
        :data:`PAD_ID`; ``lengths`` int64 (n_samples,); ``labels`` int64 (n_samples,) in
        0..9, the value of each expression; ``strings`` a list of compact strings.

    Cost: O(n_samples * max_length / acceptance rate) in pure Python; about a second per
    thousand expressions of a few hundred tokens.

    Raises:
        ValueError / TypeError naming the argument when an argument is out of range;
        RuntimeError if ``max_attempts`` trees give too few expressions in the window.
    """
    n_samples = _check_int("n_samples", n_samples, low=1)
    min_length = _check_int("min_length", min_length, low=1)
    max_length = _check_int("max_length", max_length, low=4)
    if min_length > max_length:
        raise ValueError(
            f"min_length must be <= max_length, got min_length={min_length}, "
            f"max_length={max_length}"
        )
    max_depth = _check_int("max_depth", max_depth, low=2)
    max_args = _check_int("max_args", max_args, low=2)
    seed = _check_int("seed", seed, low=0)
    if not isinstance(return_strings, bool):
        raise TypeError(f"return_strings must be True or False, got {return_strings!r}")
    if max_attempts is None:
        max_attempts = 1000 * n_samples + 10000
    max_attempts = _check_int("max_attempts", max_attempts, low=1)

    rng = random.Random(seed)
    seen = set()
    seqs: List[List[int]] = []
    attempts = 0
    while len(seqs) < n_samples:
        if attempts >= max_attempts:
            raise RuntimeError(
                f"generate_listops found only {len(seqs)} of {n_samples} expressions with "
                f"{min_length} <= length <= {max_length} in {max_attempts} attempts "
                f"(max_depth={max_depth}, max_args={max_args}); widen the length window, "
                "raise max_depth or max_args, or raise max_attempts"
            )
        attempts += 1
        out: List[int] = []
        try:
            _grow(rng, 1, max_depth, max_args, out, max_length, True)
        except _TooLong:
            continue
        if len(out) < min_length:
            continue
        key = bytes(out)  # ids < 256
        if key in seen:
            continue
        seen.add(key)
        seqs.append(out)

    strings = [decode_listops(s) for s in seqs]
    labels = torch.tensor([evaluate_listops(s.split()) for s in strings], dtype=torch.int64)
    lengths = torch.tensor([len(s) for s in seqs], dtype=torch.int64)
    tokens = _pad(seqs, max_length)
    if return_strings:
        return tokens, lengths, labels, strings
    return tokens, lengths, labels


# ---------------------------------------------------------------------- LRA's files
def read_listops_tsv(
    path: Union[str, os.PathLike],
    *,
    max_length: Optional[int] = None,
    limit: Optional[int] = None,
    check_labels: bool = False,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Read a ListOps TSV file of LRA (``basic_train.tsv``, ``basic_val.tsv``, ``basic_test.tsv``).

    Format: a header ``Source<TAB>Target``, then one expression per line in LRA's
    parenthesised form and its value, e.g. ``( ( ( [MAX 2 ) 9 ) ] )<TAB>9``. Parentheses
    are dropped and tokens mapped to the ids of :data:`LISTOPS_VOCAB`, so the result has
    the same format as :func:`generate_listops`.

    Args:
        path: the TSV file.
        max_length: pad to this many tokens; a longer expression raises ValueError.
            Default: the longest expression in the file. LRA pads to 2000.
        limit: read at most this many expressions (>= 1), from the top of the file.
        check_labels: recompute every label with :func:`evaluate_listops` and raise
            ValueError on a mismatch.

    Returns:
        ``(tokens, lengths, labels)``: int64 (n, L), (n,), (n,), as in
        :func:`generate_listops`.

    Raises:
        FileNotFoundError if ``path`` does not exist; ValueError naming the line for a
        malformed header, row, token or label.
    """
    path = Path(path)
    if max_length is not None:
        max_length = _check_int("max_length", max_length, low=1)
    if limit is not None:
        limit = _check_int("limit", limit, low=1)
    if not isinstance(check_labels, bool):
        raise TypeError(f"check_labels must be True or False, got {check_labels!r}")
    if not path.is_file():
        raise FileNotFoundError(f"ListOps TSV file not found: {path}")

    seqs: List[List[int]] = []
    labels: List[int] = []
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.reader(f, delimiter="\t")
        header = next(reader, None)
        if header is None or [h.strip() for h in header] != ["Source", "Target"]:
            raise ValueError(
                f"{path}: expected the header 'Source<TAB>Target' on line 1, got {header!r}"
            )
        for line_no, row in enumerate(reader, start=2):
            if limit is not None and len(seqs) >= limit:
                break
            if not row:
                continue
            if len(row) != 2:
                raise ValueError(
                    f"{path}, line {line_no}: expected 2 tab-separated fields, got {len(row)}"
                )
            source, target = row
            try:
                ids = encode_listops(source)
            except ValueError as err:
                raise ValueError(f"{path}, line {line_no}: {err}") from None
            try:
                label = int(target)
            except ValueError:
                raise ValueError(
                    f"{path}, line {line_no}: Target must be an integer, got {target!r}"
                ) from None
            if not 0 <= label < N_LISTOPS_CLASSES:
                raise ValueError(f"{path}, line {line_no}: Target must lie in 0..9, got {label}")
            if max_length is not None and len(ids) > max_length:
                raise ValueError(
                    f"{path}, line {line_no}: expression has {len(ids)} tokens, more than "
                    f"max_length={max_length}"
                )
            if check_labels:
                try:
                    value = evaluate_listops(source)
                except ValueError as err:
                    raise ValueError(f"{path}, line {line_no}: {err}") from None
                if value != label:
                    raise ValueError(
                        f"{path}, line {line_no}: Target is {label} but the expression "
                        f"evaluates to {value}"
                    )
            seqs.append(ids)
            labels.append(label)
    if not seqs:
        raise ValueError(f"{path}: no expressions after the header")
    length = max_length if max_length is not None else max(len(s) for s in seqs)
    return (
        _pad(seqs, length),
        torch.tensor([len(s) for s in seqs], dtype=torch.int64),
        torch.tensor(labels, dtype=torch.int64),
    )


def write_listops_tsv(path: Union[str, os.PathLike], expressions: Sequence[Expression],
                      labels: Optional[Sequence[int]] = None) -> None:
    """Write expressions in LRA's TSV format (header ``Source<TAB>Target``, parenthesised sources).

    Lines end with ``\\r\\n``, the default of Python's ``csv.writer`` that LRA's generator
    used. ``labels`` default to the values of the expressions. Useful to export generated
    data for other code bases, and to make the test fixtures.
    """
    if labels is None:
        labels = [evaluate_listops(e) for e in expressions]
    if len(labels) != len(expressions):
        raise ValueError(
            f"labels must have one entry per expression, got {len(labels)} for "
            f"{len(expressions)}"
        )
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, delimiter="\t")
        writer.writerow(["Source", "Target"])
        for expression, label in zip(expressions, labels):
            writer.writerow([to_lra_source(expression), int(label)])
