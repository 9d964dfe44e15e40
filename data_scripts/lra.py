"""The Long Range Arena release: fetcher, and a loader for its ListOps task.

Long Range Arena (Tay, Dehghani, Abnar, Shen, Bahri, Pham, Rao, Yang, Ruder & Metzler
2021, "Long Range Arena: A Benchmark for Efficient Transformers", ICLR) is the benchmark
of the paper's Table 2. Its authors publish all task files as one archive,
``lra_release.gz`` (a large gzipped tar archive, despite the name), at the address given
in the README of ``github.com/google-research/long-range-arena``:
:data:`LRA_URL`. No checksum or size is published for it (neither by the authors nor by
a dataset library we could find), so the first download from the network must be
confirmed -- ``NN_KERNELS_CONFIRM_UNPINNED=1`` or ``confirm_unpinned=True`` -- or given
``sha256=``; the digest of a confirmed download is recorded beside the archive and checked
on every later use (see :func:`data_scripts.fetch.download`).

The archive unpacks to ``lra_release/lra_release/`` (the LRA repository's
``dataset_setup.sh`` moves files from there) with, among others:

* ``listops-1000/basic_{train,val,test}.tsv`` -- ListOps, 96 000 / 2 000 / 2 000
  expressions of 500-2000 tokens (read by :func:`load_lra_listops`);
* ``tsv_data/`` -- the byte-level document-retrieval pairs (AAN);
* ``pathfinder32/``, ``pathfinder64/``, ... -- the Pathfinder images.

The byte-level text classification task (IMDb) and the image task (CIFAR-10) are
built from TensorFlow Datasets, not from this archive. :func:`find_lra_folder` locates
any of the folders above after a fetch; only ListOps has a loader here.

Offline: put the archive at ``<root>/lra/lra_release.gz`` (root: the ``root=`` argument,
``$NN_KERNELS_DATA`` or ``~/.cache/nn-kernels-book``), or unpack it yourself under
``<root>/lra/extracted/``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional, Tuple, Union

import torch

from data_scripts.fetch import DatasetUnavailableError, cache_dir, download_and_extract
from data_scripts.listops import read_listops_tsv

__all__ = [
    "LRA_URL",
    "LRA_ARCHIVE",
    "LISTOPS_FILES",
    "fetch_lra",
    "find_lra_folder",
    "load_lra_listops",
]

#: Official address of the LRA release (from the LRA repository's README).
LRA_URL = "https://storage.googleapis.com/long-range-arena/lra_release.gz"
#: File name of the archive in the cache.
LRA_ARCHIVE = "lra_release.gz"
#: Split name -> ListOps file name inside ``listops-1000/``.
LISTOPS_FILES = {"train": "basic_train.tsv", "valid": "basic_val.tsv", "test": "basic_test.tsv"}
_DATASET = "Long Range Arena (lra_release.gz)"
_SUBDIR = "lra"

PathLike = Union[str, os.PathLike]
Split = Tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def fetch_lra(
    *,
    root: Optional[PathLike] = None,
    url: str = LRA_URL,
    sha256: Optional[str] = None,
    timeout: float = 60.0,
    keep_archive: bool = True,
    progress: bool = True,
    confirm_unpinned: Optional[bool] = None,
) -> Path:
    """Download and unpack the LRA release into the cache, once; return the unpacked folder.

    Args:
        root: cache folder (default ``$NN_KERNELS_DATA`` or ``~/.cache/nn-kernels-book``);
            the data go to ``root/lra/``.
        url: where to get the archive; tests pass a ``file://`` URL of a tiny fixture.
        sha256: expected SHA-256 of the archive, or None (no checksum is published).
        timeout: network timeout in seconds.
        keep_archive: keep the archive after unpacking (it is large).
        progress: print download progress to stderr.
        confirm_unpinned: accept the download without a published checksum (None: read
            ``$NN_KERNELS_CONFIRM_UNPINNED``).

    Returns:
        ``root/lra/extracted``, which holds the archive's ``lra_release/`` folder.

    Raises:
        DatasetUnavailableError when offline (with instructions to place the file by
        hand), ChecksumError, UnsafeArchiveError; see :mod:`data_scripts.fetch`.
    """
    return download_and_extract(
        url, cache_dir(root) / _SUBDIR, filename=LRA_ARCHIVE, sha256=sha256, timeout=timeout,
        dataset=_DATASET, keep_archive=keep_archive, progress=progress,
        confirm_unpinned=confirm_unpinned,
    )


def find_lra_folder(name: str, path: PathLike) -> Path:
    """The folder called ``name`` at or below ``path``.

    ``name``: ``"listops-1000"``, ``"tsv_data"``, ``"pathfinder32"``, ...

    Looks in ``lra_release/lra_release/`` first (where the release keeps the task data),
    then ``lra_release/``, then ``path`` itself, then anywhere below ``path``.

    Raises:
        FileNotFoundError naming ``name`` and ``path`` if there is none.
    """
    if not isinstance(name, str) or not name or Path(name).name != name:
        raise ValueError(f"name must be a plain folder name, got {name!r}")
    path = Path(path)
    for base in (path / "lra_release" / "lra_release", path / "lra_release", path):
        if (base / name).is_dir():
            return base / name
    if path.name == name and path.is_dir():
        return path
    found = sorted(p for p in path.rglob(name) if p.is_dir()) if path.is_dir() else []
    if found:
        return found[0]
    raise FileNotFoundError(f"no folder {name!r} found at or below {path}")


def load_lra_listops(
    *,
    root: Optional[PathLike] = None,
    url: str = LRA_URL,
    sha256: Optional[str] = None,
    timeout: float = 60.0,
    download: bool = True,
    max_length: int = 2000,
    limit: Optional[int] = None,
) -> Tuple[Split, Split, Split]:
    """LRA's ListOps splits, in the format of :func:`data_scripts.listops.generate_listops`.

    Args:
        root, url, sha256, timeout: as in :func:`fetch_lra`.
        download: if False, never touch the network: use the unpacked cache or an archive
            placed by hand at ``root/lra/lra_release.gz``, or raise DatasetUnavailableError.
        max_length: pad every split to this many tokens (LRA: 2000); a longer
            expression raises ValueError.
        limit: read at most this many expressions per split (>= 1), from the top.

    Returns:
        ``(train, valid, test)``, each ``(tokens, lengths, labels)``: int64 (n, max_length),
        (n,), (n,), with the ids of :data:`data_scripts.listops.LISTOPS_VOCAB`.

    Cost: reading is about 0.3 ms per expression (half a minute for the 96 000 training
    expressions); the full training split padded to 2000 tokens takes 1.5 GB as int64,
    so pass ``limit`` on small machines.
    """
    if not isinstance(download, bool):
        raise TypeError(f"download must be True or False, got {download!r}")
    folder = cache_dir(root) / _SUBDIR
    extracted = folder / "extracted"
    # With download=False a hand-placed archive is still unpacked (no network needed).
    if download or extracted.is_dir() or (folder / LRA_ARCHIVE).is_file():
        extracted = fetch_lra(root=root, url=url, sha256=sha256, timeout=timeout)
    else:
        raise DatasetUnavailableError(
            f"{_DATASET} is not in the cache (neither {extracted} nor "
            f"{folder / LRA_ARCHIVE} exists) and download=False. Call with download=True "
            f"on a machine with internet access, or download {url} by hand and put it at "
            f"{folder / LRA_ARCHIVE}."
        )
    listops_dir = find_lra_folder("listops-1000", extracted)
    train, valid, test = (
        read_listops_tsv(listops_dir / LISTOPS_FILES[split], max_length=max_length, limit=limit)
        for split in ("train", "valid", "test")
    )
    return train, valid, test
