"""WikiText-103 (raw) for character-level language modelling: fetcher and loader.

WikiText-103 (Merity, Xiong, Bradbury & Socher 2017, "Pointer Sentinel Mixture
Models", ICLR) is the corpus of the paper's causal language-model experiment (Table 1).
Its *raw* variant keeps the original characters (no ``<unk>`` replacement), which is what a
character model needs. The archive ``wikitext-103-raw-v1.zip`` (close to 200 MB
compressed, about 540 M characters of training text) unpacks to::

    wikitext-103-raw/wiki.train.raw
    wikitext-103-raw/wiki.valid.raw
    wikitext-103-raw/wiki.test.raw

**URL.** The original address
``https://s3.amazonaws.com/research.metamind.io/wikitext/wikitext-103-raw-v1.zip`` no
longer serves the file (HTTP 403 since 2024). The default here,
:data:`WIKITEXT103_URL`, is the mirror kept by the dataset's first author at
``https://wikitext.smerity.com/wikitext-103-raw-v1.zip``, which serves the same zip.
Another copy is on the Hugging Face Hub
(``https://huggingface.co/datasets/mattdangerw/wikitext-103-raw/resolve/main/``
``wikitext-103-raw-v1.zip``, one URL);
pass it as ``url=`` if the default is down. The release itself publishes no checksum;
:data:`WIKITEXT103_SIZE` and :data:`WIKITEXT103_SHA256` are the values Hugging Face
``datasets`` records for the original S3 address (``download_checksums`` in
``datasets/wikitext/dataset_infos.json`` of github.com/huggingface/datasets), which the
default mirror serves byte for byte; they are checked for the default ``url``. Pass
``sha256=`` for another copy.

Offline: put the zip at ``<root>/wikitext-103/wikitext-103-raw-v1.zip`` (root: the
``root=`` argument, ``$NN_KERNELS_DATA`` or ``~/.cache/nn-kernels-book``), or its
unpacked ``wikitext-103-raw`` folder under ``<root>/wikitext-103/extracted/``.

The loader returns the same format as :func:`data_scripts.char_corpus.load_char_corpus`,
with the same normalisation, so the chapter's language-model code runs on either.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional, Tuple, Union

import torch

from data_scripts.char_corpus import CharVocab, build_vocab, normalise_text
from data_scripts.fetch import DatasetUnavailableError, cache_dir, download_and_extract

__all__ = [
    "WIKITEXT103_URL",
    "WIKITEXT103_SIZE",
    "WIKITEXT103_SHA256",
    "WIKITEXT103_ARCHIVE",
    "WIKITEXT103_SPLITS",
    "fetch_wikitext103",
    "find_wikitext103_dir",
    "load_wikitext103_chars",
]

#: Default download address (the dataset author's mirror of the original release).
WIKITEXT103_URL = "https://wikitext.smerity.com/wikitext-103-raw-v1.zip"
#: Size and SHA-256 of the zip (Hugging Face ``datasets``' recorded download checksum).
WIKITEXT103_SIZE = 191984949
WIKITEXT103_SHA256 = "91c00ae287f0d699e18605c84afc9e45c192bc6b7797ff8837e5474655a33794"
#: File name of the archive in the cache.
WIKITEXT103_ARCHIVE = "wikitext-103-raw-v1.zip"
#: Split name -> file name inside ``wikitext-103-raw/``.
WIKITEXT103_SPLITS = {"train": "wiki.train.raw", "valid": "wiki.valid.raw", "test": "wiki.test.raw"}
_DATASET = "WikiText-103 (raw)"
_SUBDIR = "wikitext-103"

PathLike = Union[str, os.PathLike]


def fetch_wikitext103(
    *,
    root: Optional[PathLike] = None,
    url: str = WIKITEXT103_URL,
    sha256: Optional[str] = None,
    timeout: float = 60.0,
    keep_archive: bool = True,
    progress: bool = True,
) -> Path:
    """Download and unpack WikiText-103 (raw) into the cache, once; return the unpacked folder.

    Args:
        root: cache folder (default ``$NN_KERNELS_DATA`` or ``~/.cache/nn-kernels-book``);
            the data go to ``root/wikitext-103/``.
        url: where to get the zip; tests pass a ``file://`` URL of a tiny fixture.
        sha256: expected SHA-256 of the zip. None: :data:`WIKITEXT103_SHA256` and
            :data:`WIKITEXT103_SIZE` when ``url`` is the default, no check otherwise.
        timeout: network timeout in seconds.
        keep_archive: keep the zip after unpacking.
        progress: print download progress to stderr.

    Returns:
        the folder that contains ``wikitext-103-raw/`` (``root/wikitext-103/extracted``).

    Raises:
        DatasetUnavailableError when offline (with instructions to place the file by
        hand), ChecksumError, UnsafeArchiveError; see :mod:`data_scripts.fetch`.
    """
    folder = cache_dir(root) / _SUBDIR
    pinned = url == WIKITEXT103_URL and sha256 is None
    return download_and_extract(
        url, folder, filename=WIKITEXT103_ARCHIVE,
        sha256=WIKITEXT103_SHA256 if pinned else sha256,
        size=WIKITEXT103_SIZE if pinned else None, timeout=timeout,
        dataset=_DATASET, keep_archive=keep_archive, progress=progress,
    )


def find_wikitext103_dir(path: PathLike) -> Path:
    """The folder at or below ``path`` that holds the three ``wiki.*.raw`` files.

    Raises:
        FileNotFoundError naming ``path`` if there is none.
    """
    path = Path(path)
    found = sorted(p.parent for p in path.rglob("wiki.train.raw")) if path.is_dir() else []
    candidates = [path, path / "wikitext-103-raw"] + found
    for folder in candidates:
        if all((folder / name).is_file() for name in WIKITEXT103_SPLITS.values()):
            return folder
    raise FileNotFoundError(
        f"no folder with {', '.join(WIKITEXT103_SPLITS.values())} found at or below {path}"
    )


def _read(path: Path, max_chars: Optional[int]) -> str:
    with open(path, encoding="utf-8", newline="") as f:
        return f.read() if max_chars is None else f.read(max_chars)


def load_wikitext103_chars(
    *,
    root: Optional[PathLike] = None,
    url: str = WIKITEXT103_URL,
    sha256: Optional[str] = None,
    timeout: float = 60.0,
    download: bool = True,
    max_chars: Optional[int] = None,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, CharVocab]:
    """Character ids of WikiText-103 (raw): ``(train, valid, test, vocab)`` as in char_corpus.

    The text is normalised with :func:`data_scripts.char_corpus.normalise_text` (ASCII
    folding; the many non-Latin characters of the corpus become U+FFFD) and the
    vocabulary is built from the training text, so an unseen character of the valid or
    test split maps to U+FFFD.

    Args:
        root, url, sha256, timeout: as in :func:`fetch_wikitext103`.
        download: if False, never touch the network: use the unpacked cache or a zip
            placed by hand at ``root/wikitext-103/wikitext-103-raw-v1.zip``, or raise
            DatasetUnavailableError.
        max_chars: read only the first ``max_chars`` characters of each split (>= 1);
            the full training split is ~540 M characters, and encoding it takes a few GB
            of memory and a minute.

    Returns:
        ``(train, valid, test, vocab)``: 1-D int64 id tensors and a :class:`CharVocab`.
    """
    if not isinstance(download, bool):
        raise TypeError(f"download must be True or False, got {download!r}")
    if max_chars is not None and (
        isinstance(max_chars, bool) or not hasattr(max_chars, "__index__")
    ):
        raise TypeError(f"max_chars must be an integer or None, got {max_chars!r}")
    if max_chars is not None and int(max_chars) < 1:
        raise ValueError(f"max_chars must be >= 1, got {max_chars}")
    folder = cache_dir(root) / _SUBDIR
    extracted = folder / "extracted"
    # With download=False a hand-placed archive is still unpacked (no network needed).
    if download or extracted.is_dir() or (folder / WIKITEXT103_ARCHIVE).is_file():
        extracted = fetch_wikitext103(root=root, url=url, sha256=sha256, timeout=timeout)
    else:
        raise DatasetUnavailableError(
            f"{_DATASET} is not in the cache (neither {extracted} nor "
            f"{folder / WIKITEXT103_ARCHIVE} exists) and download=False. Call with download=True "
            f"on a machine with internet access, or download {url} by hand and put it at "
            f"{folder / WIKITEXT103_ARCHIVE}."
        )
    data_dir = find_wikitext103_dir(extracted)
    texts = {
        split: normalise_text(_read(data_dir / name, max_chars))
        for split, name in WIKITEXT103_SPLITS.items()
    }
    vocab = build_vocab(texts["train"])
    train, valid, test = (vocab.encode(texts[split]) for split in ("train", "valid", "test"))
    return train, valid, test, vocab
