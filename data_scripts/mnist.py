"""MNIST handwritten digits: fetcher and loader for chapter 2's full profile.

Chapter 2 (``chapters/02_random_features.ipynb``) compares an MLP with its ReLU-SNNK
version on MNIST (LeCun & Cortes 2010), as in Fig. 9 of Sehanobish et al. (2024). The
default (ci) profile uses scikit-learn's offline 8x8 digits instead; this module is only
called with ``use_real_data = True``.

The dataset is four gzipped IDX files (60 000 training and 10 000 test images of 28x28
grey levels, and their labels)::

    train-images-idx3-ubyte.gz  train-labels-idx1-ubyte.gz
    t10k-images-idx3-ubyte.gz   t10k-labels-idx1-ubyte.gz

**URL.** Yann LeCun's original page no longer serves the files reliably, so the default
:data:`MNIST_URL` is the mirror that torchvision uses
(``https://ossci-datasets.s3.amazonaws.com/mnist/``); pass ``base_url=`` for another
mirror. The MD5 digests in :data:`MNIST_MD5` are the ones published with the original
files (and checked by torchvision); pass ``md5=None`` to skip the check. For the default
URL the files' sizes and SHA-256 digests (:data:`MNIST_SIZES`, :data:`MNIST_SHA256`, from
TensorFlow Datasets' ``url_checksums/mnist.txt`` for the same four files; the sizes are
also those on LeCun's page) are checked as well, so a truncated download is never
kept.

Offline: copy the four ``.gz`` files into ``<root>/mnist/`` (root: the ``root=`` argument,
``$NN_KERNELS_DATA`` or ``~/.cache/nn-kernels-book``); files already there are used as
they are (after the checksum). Without them and without network the fetcher raises
:class:`~data_scripts.fetch.DatasetUnavailableError` with the URL and that folder.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional, Union

import numpy as np

from data_scripts.fetch import ChecksumError, DatasetUnavailableError, cache_dir, download

__all__ = [
    "MNIST_URL",
    "MNIST_FILES",
    "MNIST_MD5",
    "MNIST_SHA256",
    "MNIST_SIZES",
    "MNIST",
    "read_idx",
    "fetch_mnist",
    "load_mnist",
]

#: Default base URL (torchvision's mirror of the original files).
MNIST_URL = "https://ossci-datasets.s3.amazonaws.com/mnist/"
#: Role -> file name.
MNIST_FILES = {
    "x_train": "train-images-idx3-ubyte.gz",
    "y_train": "train-labels-idx1-ubyte.gz",
    "x_test": "t10k-images-idx3-ubyte.gz",
    "y_test": "t10k-labels-idx1-ubyte.gz",
}
#: File name -> MD5 of the published file.
MNIST_MD5 = {
    "train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
    "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
    "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
    "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c",
}
#: File name -> size in bytes (TensorFlow Datasets' url_checksums/mnist.txt, LeCun's page).
MNIST_SIZES = {
    "train-images-idx3-ubyte.gz": 9912422,
    "train-labels-idx1-ubyte.gz": 28881,
    "t10k-images-idx3-ubyte.gz": 1648877,
    "t10k-labels-idx1-ubyte.gz": 4542,
}
#: File name -> SHA-256 (TensorFlow Datasets' url_checksums/mnist.txt).
MNIST_SHA256 = {
    "train-images-idx3-ubyte.gz": "440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609",
    "train-labels-idx1-ubyte.gz": "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c",
    "t10k-images-idx3-ubyte.gz": "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6",
    "t10k-labels-idx1-ubyte.gz": "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6",
}
_DATASET = "MNIST"
_SUBDIR = "mnist"
PathLike = Union[str, os.PathLike]


@dataclass(frozen=True)
class MNIST:
    """Images as uint8 arrays (n, 28, 28) and labels as int64 arrays (n,)."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray


def read_idx(path: PathLike) -> np.ndarray:
    """Read a (gzipped) IDX file of unsigned bytes: magic ``0x0000 08 nd``, ``nd`` big-endian
    int32 sizes, then the data. Returns a uint8 array of those sizes.

    Raises:
        ValueError: not an IDX file of unsigned bytes, or the data length does not match.
    """
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as fh:
            raw = fh.read()
    except (OSError, EOFError) as err:
        raise ValueError(f"{path} is not a readable (gzipped) IDX file: {err}") from err
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08 or not 1 <= raw[3] <= 4:
        raise ValueError(f"{path} is not an IDX file of unsigned bytes (bad magic {raw[:4]!r})")
    nd = raw[3]
    header = 4 + 4 * nd
    if len(raw) < header:
        raise ValueError(f"{path} is truncated: {len(raw)} bytes, header needs {header}")
    shape = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(nd))
    expected = int(np.prod(shape))
    if len(raw) - header != expected:
        raise ValueError(
            f"{path} holds {len(raw) - header} data bytes but its header {shape} needs {expected}"
        )
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(shape).copy()


def _md5(path: Path) -> str:
    h = hashlib.md5()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch_mnist(
    root: Optional[PathLike] = None,
    *,
    base_url: str = MNIST_URL,
    md5: Optional[Mapping[str, str]] = MNIST_MD5,
    timeout: float = 60.0,
) -> Path:
    """Download the four MNIST files (unless present) into ``<root>/mnist`` and verify them.

    Args:
        root: data folder (default: ``$NN_KERNELS_DATA`` or ``~/.cache/nn-kernels-book``).
        base_url: folder URL (``https://``, ``http://`` or ``file://``) holding the files.
        md5: file name -> expected MD5, or None to skip the check.
        timeout: seconds for the connection and each read.

    Returns:
        the folder holding the four files.

    Raises:
        DatasetUnavailableError: offline or unreachable, with the URL and the folder to
            fill by hand. ChecksumError: a file's MD5 differs (the file is left in place
            so that it can be inspected; delete it to download again).
    """
    if not isinstance(base_url, str) or not base_url:
        raise TypeError(f"base_url must be a non-empty string, got {base_url!r}")
    if md5 is not None and not isinstance(md5, Mapping):
        raise TypeError(f"md5 must be a mapping from file name to digest or None, got {md5!r}")
    folder = cache_dir(root) / _SUBDIR
    base = base_url if base_url.endswith("/") else base_url + "/"
    pinned = base == MNIST_URL
    for name in MNIST_FILES.values():
        dest = folder / name
        try:
            # Without pins (another base_url) the MD5 below is the check; the download
            # itself then needs no confirmation.
            download(base + name, dest, timeout=timeout, dataset=_DATASET,
                     sha256=MNIST_SHA256[name] if pinned else None,
                     size=MNIST_SIZES[name] if pinned else None,
                     confirm_unpinned=True if md5 is not None and name in md5 else None)
        except DatasetUnavailableError as err:
            raise DatasetUnavailableError(
                f"{err} To use MNIST offline, copy the four files {sorted(MNIST_FILES.values())} "
                f"into {folder}."
            ) from err
        if md5 is not None and name in md5:
            got = _md5(dest)
            if got != md5[name].lower():
                raise ChecksumError(
                    f"{dest} has MD5 {got}, expected {md5[name]} for {_DATASET}. Delete the file "
                    f"to download it again:\n    rm {shlex.quote(str(dest))}\n(or pass "
                    "md5=None to accept it)"
                )
    return folder


def load_mnist(
    root: Optional[PathLike] = None,
    *,
    base_url: str = MNIST_URL,
    md5: Optional[Mapping[str, str]] = MNIST_MD5,
    timeout: float = 60.0,
) -> MNIST:
    """Fetch (if needed) and read MNIST: :class:`MNIST` with uint8 images and int64 labels.

    Raises: as :func:`fetch_mnist`; ValueError when the files disagree (image and label
    counts, image size, labels outside 0-9).
    """
    folder = fetch_mnist(root, base_url=base_url, md5=md5, timeout=timeout)
    arrays = {role: read_idx(folder / name) for role, name in MNIST_FILES.items()}
    for split in ("train", "test"):
        x, y = arrays[f"x_{split}"], arrays[f"y_{split}"]
        if x.ndim != 3 or x.shape[1:] != (28, 28):
            raise ValueError(f"MNIST {split} images must have shape (n, 28, 28), got {x.shape}")
        if y.ndim != 1 or y.shape[0] != x.shape[0]:
            raise ValueError(f"MNIST {split}: {x.shape[0]} images but labels of shape {y.shape}")
        if y.size and int(y.max()) > 9:
            raise ValueError(f"MNIST {split} labels must be digits 0-9, got {int(y.max())}")
    return MNIST(
        x_train=arrays["x_train"],
        y_train=arrays["y_train"].astype(np.int64),
        x_test=arrays["x_test"],
        y_test=arrays["y_test"].astype(np.int64),
    )
