"""A character-level language-modelling corpus that ships with Python: the pydoc topics.

Chapter 4 (``chapters/04_toeplitz.ipynb``) trains a small causal TNN / FD-TNN language
model next to the paper's WikiText-103 results (Table 1). WikiText-103 is a download of
several hundred megabytes (see :mod:`data_scripts.wikitext`); the default profile
uses this corpus instead, which is already on every machine that runs Python.

**Provenance.** The standard-library module ``pydoc_data.topics`` holds the English text
that ``help("assert")``, ``help("with")``, ... print: the language-reference sections of
the Python documentation, rendered as plain text (about 80 topics, roughly 0.45 million
characters in Python 3.11; the exact text, and so the sizes below, depend on the Python
version -- :func:`char_corpus_info` reports them, with a digest). The documentation is
under the PSF licence, distributed with Python itself.

**Normalisation** (:func:`normalise_text`, shared with the WikiText loader): typographic
quotes, dashes, ellipses and non-breaking spaces become their ASCII spellings; other
accented letters lose their accents (NFKD); line breaks become ``\\n`` and tabs four
spaces; any character still outside printable ASCII becomes U+FFFD, the Unicode
replacement character, which every vocabulary contains and which stands for "unknown".

**Split.** Topics are concatenated in sorted order of their names, separated by a blank
line, and the text is cut by characters: the first ``1 - valid_fraction -
test_fraction`` for training, then validation, then test (by default 90 / 5 / 5 %), as
enwik8 and text8 are split. Fixed, no randomness. The vocabulary is the set of
characters of the whole normalised text (plus U+FFFD), sorted by code point.
"""

from __future__ import annotations

import hashlib
import math
import re
import sys
import unicodedata
from dataclasses import dataclass, field
from typing import Dict, Tuple

import numpy as np
import torch

from data_scripts._checks import check_int as _check_int

__all__ = [
    "UNKNOWN_CHAR",
    "CharVocab",
    "normalise_text",
    "build_vocab",
    "split_text",
    "char_corpus_text",
    "char_corpus_info",
    "load_char_corpus",
    "lm_blocks",
    "random_lm_batch",
]

#: Stands for every character outside the vocabulary (U+FFFD REPLACEMENT CHARACTER).
UNKNOWN_CHAR = "\ufffd"

_ASCII_SPELLINGS = {
    "\u2018": "'", "\u2019": "'", "\u201a": "'", "\u201b": "'", "\u2032": "'",
    "\u201c": '"', "\u201d": '"', "\u201e": '"', "\u201f": '"', "\u2033": '"',
    "\u2013": "-", "\u2012": "-", "\u2010": "-", "\u2011": "-", "\u2212": "-",
    "\u2014": "--", "\u2015": "--", "\u2026": "...", "\u00a0": " ", "\u202f": " ",
    "\u2009": " ", "\u200b": "", "\u00df": "ss", "\u00e6": "ae", "\u00c6": "AE",
    "\u0153": "oe", "\u0152": "OE", "\u00f8": "o", "\u00d8": "O", "\u0142": "l",
    "\u0141": "L", "\u00d7": "x", "\t": "    ",
}
_NOT_KEPT = re.compile(r"[^\n\x20-\x7e]")


# --------------------------------------------------------------------------- checks
def _check_fraction(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a real number, got {value!r}")
    if not math.isfinite(value) or not 0.0 < value < 0.5:
        raise ValueError(f"{name} must lie in (0, 0.5), got {value!r}")
    return float(value)




def _check_ids(ids: object) -> torch.Tensor:
    if not isinstance(ids, torch.Tensor) or ids.dim() != 1 or ids.dtype != torch.int64:
        raise TypeError("ids must be a 1-D int64 torch.Tensor (a split from load_char_corpus)")
    return ids


# ---------------------------------------------------------------------- vocabulary
@dataclass(frozen=True)
class CharVocab:
    """A character vocabulary: id ``i`` is ``chars[i]``; unknown characters map to U+FFFD.

    Attributes:
        chars: the characters, sorted by code point, without repeats, containing
            :data:`UNKNOWN_CHAR`.
    """

    chars: str
    _codes: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.chars, str) or UNKNOWN_CHAR not in self.chars:
            raise ValueError("chars must be a string that contains UNKNOWN_CHAR (U+FFFD)")
        codes = np.array([ord(c) for c in self.chars], dtype=np.int64)
        if len(codes) > 1 and not np.all(np.diff(codes) > 0):
            raise ValueError("chars must be sorted by code point, without repeats")
        object.__setattr__(self, "_codes", codes)

    def __len__(self) -> int:
        return len(self.chars)

    @property
    def unknown_id(self) -> int:
        """Id of :data:`UNKNOWN_CHAR`."""
        return self.chars.index(UNKNOWN_CHAR)

    @property
    def stoi(self) -> Dict[str, int]:
        """Character -> id."""
        return {c: i for i, c in enumerate(self.chars)}

    def encode(self, text: str) -> torch.Tensor:
        """Ids of the characters of ``text`` (int64, shape (len(text),)); O(len(text) log V)."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a string, got {type(text).__name__}")
        codes = np.frombuffer(text.encode("utf-32-le"), dtype="<u4").astype(np.int64)
        ids = np.searchsorted(self._codes, codes)
        ids = np.minimum(ids, len(self._codes) - 1)
        ids[self._codes[ids] != codes] = self.unknown_id
        return torch.from_numpy(ids)

    def decode(self, ids: torch.Tensor) -> str:
        """Text of a 1-D sequence of ids."""
        ids = torch.as_tensor(ids).reshape(-1).tolist()
        if ids and not (0 <= min(ids) and max(ids) < len(self.chars)):
            raise ValueError(f"ids must lie in [0, {len(self.chars)})")
        return "".join(self.chars[i] for i in ids)


def _is_kept(c: str) -> bool:
    return c == "\n" or " " <= c <= "~"


def _fold_char(c: str) -> str:
    """ASCII spelling of one character, or UNKNOWN_CHAR."""
    if c in _ASCII_SPELLINGS:
        return _ASCII_SPELLINGS[c]
    decomposed = "".join(
        ch for ch in unicodedata.normalize("NFKD", c) if not unicodedata.combining(ch)
    )
    if decomposed and all(_is_kept(ch) for ch in decomposed):
        return decomposed
    return UNKNOWN_CHAR


def normalise_text(text: str) -> str:
    """ASCII-fold ``text``: typographic punctuation to ASCII, accents dropped (NFKD),
    ``\\r\\n`` and ``\\r`` to ``\\n``, tabs to four spaces, any other character outside
    printable ASCII to U+FFFD (one per character).

    Cost: O(len(text)) in C (a regular-expression scan) plus a dictionary look-up per
    character outside printable ASCII, so it also runs on WikiText-103 (about 540 M
    characters, mostly ASCII) in tens of seconds.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a string, got {type(text).__name__}")
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    table = {c: _fold_char(c) for c in set(_NOT_KEPT.findall(text))}
    if not table:
        return text
    return _NOT_KEPT.sub(lambda m: table[m.group()], text)


def build_vocab(text: str) -> CharVocab:
    """The vocabulary of the characters of ``text``, plus :data:`UNKNOWN_CHAR`."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a string, got {type(text).__name__}")
    return CharVocab("".join(sorted(set(text) | {UNKNOWN_CHAR})))


def split_text(
    text: str, *, valid_fraction: float = 0.05, test_fraction: float = 0.05
) -> Tuple[str, str, str]:
    """Cut ``text`` into contiguous train / valid / test parts by character counts.

    ``len(valid) = round(valid_fraction * len(text))``, the same for test; train is the rest.
    """
    valid_fraction = _check_fraction("valid_fraction", valid_fraction)
    test_fraction = _check_fraction("test_fraction", test_fraction)
    n = len(text)
    n_valid, n_test = round(valid_fraction * n), round(test_fraction * n)
    n_train = n - n_valid - n_test
    return text[:n_train], text[n_train : n_train + n_valid], text[n_train + n_valid :]


# --------------------------------------------------------------------------- corpus
def char_corpus_text() -> str:
    """The normalised pydoc-topics text: topics in sorted order of name, blank-line separated."""
    from pydoc_data.topics import topics  # standard library

    return "\n\n".join(normalise_text(topics[name]).strip("\n") for name in sorted(topics)) + "\n"


def char_corpus_info() -> Dict[str, object]:
    """Provenance of the corpus on this Python: version, topic count, sizes, SHA-256 of the text."""
    from pydoc_data.topics import topics

    text = char_corpus_text()
    return {
        "source": "pydoc_data.topics (Python standard library)",
        "python_version": ".".join(map(str, sys.version_info[:3])),
        "n_topics": len(topics),
        "n_chars": len(text),
        "vocab_size": len(build_vocab(text)),
        "sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(),
    }


def load_char_corpus(
    *,
    valid_fraction: float = 0.05,
    test_fraction: float = 0.05,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, CharVocab]:
    """Train / valid / test character ids of the pydoc-topics corpus, and the vocabulary.

    Args:
        valid_fraction, test_fraction: shares of the text, each in (0, 0.5) (see
            :func:`split_text`). Default 5 % each.

    Returns:
        ``(train, valid, test, vocab)``: three 1-D int64 tensors of ids (about 420 k,
        23 k and 23 k characters in Python 3.11) and a :class:`CharVocab` (about 95
        characters). Deterministic: the same Python gives the same tensors.
    """
    text = char_corpus_text()
    train, valid, test = split_text(
        text, valid_fraction=valid_fraction, test_fraction=test_fraction
    )
    vocab = build_vocab(text)
    return vocab.encode(train), vocab.encode(valid), vocab.encode(test), vocab


# ------------------------------------------------------------------------- batching
def lm_blocks(ids: torch.Tensor, context_length: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Cut a split into consecutive, non-overlapping (input, target) blocks for evaluation.

    Block ``b`` is ``inputs[b] = ids[bT : bT + T]``, ``targets[b] = ids[bT + 1 : bT + T + 1]``
    with ``T = context_length``: every character except the first is predicted exactly
    once, except a tail of fewer than ``T`` characters that is dropped.

    Shapes: ``ids`` (N,) -> two int64 tensors (B, T), ``B = (N - 1) // T``.

    Raises:
        ValueError if the split is shorter than ``context_length + 1``.
    """
    ids = _check_ids(ids)
    context_length = _check_int("context_length", context_length, low=1)
    n_blocks = (len(ids) - 1) // context_length
    if n_blocks < 1:
        raise ValueError(
            f"context_length must be < len(ids) = {len(ids)}, got {context_length}"
        )
    stop = n_blocks * context_length
    inputs = ids[:stop].reshape(n_blocks, context_length)
    return inputs, ids[1 : stop + 1].reshape(n_blocks, context_length)


def random_lm_batch(
    ids: torch.Tensor,
    context_length: int,
    batch_size: int,
    *,
    generator: torch.Generator,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """A training batch of (input, target) windows at uniformly random offsets.

    ``inputs[b] = ids[o_b : o_b + T]``, ``targets[b] = ids[o_b + 1 : o_b + T + 1]`` with
    offsets ``o_b`` drawn from ``generator``. Shapes: (N,) -> two int64 tensors (B, T).
    """
    ids = _check_ids(ids)
    context_length = _check_int("context_length", context_length, low=1)
    batch_size = _check_int("batch_size", batch_size, low=1)
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator, got {generator!r}")
    n_offsets = len(ids) - context_length
    if n_offsets < 1:
        raise ValueError(f"context_length must be < len(ids) = {len(ids)}, got {context_length}")
    offsets = torch.randint(0, n_offsets, (batch_size,), generator=generator)
    window = offsets[:, None] + torch.arange(context_length + 1)
    chunk = ids[window]
    return chunk[:, :-1], chunk[:, 1:]
