"""Download, verify and unpack dataset archives: the plumbing of the real-data fetchers.

:mod:`data_scripts.lra` and :mod:`data_scripts.wikitext` fetch full-size datasets with
these helpers; the default (ci) profile of the book never calls them, and the chapter
runner blocks the network so that a silent download would fail loudly.

* :func:`cache_dir` -- where data lives: the ``root`` argument, else the environment
  variable ``NN_KERNELS_DATA``, else ``~/.cache/nn-kernels-book``.
* :func:`download` -- one URL (``http``, ``https`` or ``file``) to one file, streamed to a
  temporary file in the destination folder and renamed into place only when complete and
  verified, so an interrupted run never leaves a truncated file under the final name.
  There is no resume: a failed download starts again from zero. A file already at the
  destination is used as it is (after the checksum, if one is given), which is also how
  data is placed by hand on a machine without internet.
* :func:`extract` -- a ``.zip`` or a (compressed) tar archive, recognised by content
  rather than by name (LRA's ``lra_release.gz`` is a gzipped tar). Members that would
  land outside the destination (absolute paths, ``..``), links and device files are
  refused before anything is written; extraction goes to a temporary folder renamed into
  place at the end.
* :func:`download_and_extract` -- both, with a cache check: the common path of a fetcher.

Errors: :class:`DatasetUnavailableError` when the data cannot be obtained (offline, server
error, missing local file), with the dataset, the URL and how to place the files by hand;
:class:`ChecksumError` when a file's SHA-256 differs from the expected one;
:class:`UnsafeArchiveError` for a refused archive member.
"""

from __future__ import annotations

import hashlib
import http.client
import math
import os
import shutil
import sys
import tarfile
import tempfile
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from pathlib import Path, PurePosixPath
from typing import Optional, Union

__all__ = [
    "DATA_ENV_VAR",
    "DEFAULT_CACHE",
    "DatasetUnavailableError",
    "ChecksumError",
    "UnsafeArchiveError",
    "cache_dir",
    "sha256sum",
    "download",
    "extract",
    "download_and_extract",
]

#: Environment variable that overrides the default cache folder.
DATA_ENV_VAR = "NN_KERNELS_DATA"
#: Default cache folder (``~`` expanded when used).
DEFAULT_CACHE = "~/.cache/nn-kernels-book"

_CHUNK = 1 << 20
# Some mirrors (wikitext.smerity.com among them) answer 403 to urllib's default agent.
_USER_AGENT = "Mozilla/5.0 (compatible; nn-kernels-book data fetcher)"

PathLike = Union[str, os.PathLike]


class DatasetUnavailableError(RuntimeError):
    """The data could not be obtained: offline, unreachable server, HTTP error, missing file."""


class ChecksumError(RuntimeError):
    """A file's SHA-256 digest differs from the expected one."""


class UnsafeArchiveError(ValueError):
    """An archive member would be written outside the destination, or is a link/device."""


# --------------------------------------------------------------------------- checks
def _check_timeout(timeout: object) -> float:
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"timeout must be a number of seconds, got {timeout!r}")
    if not math.isfinite(timeout) or timeout <= 0:
        raise ValueError(f"timeout must be a finite number of seconds > 0, got {timeout!r}")
    return float(timeout)


def _check_sha256(sha256: object) -> Optional[str]:
    if sha256 is None:
        return None
    if not isinstance(sha256, str):
        raise TypeError(f"sha256 must be a hex string or None, got {sha256!r}")
    digest = sha256.strip().lower()
    if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
        raise ValueError(f"sha256 must be 64 hexadecimal digits, got {sha256!r}")
    return digest


def _normalise_url(url: object) -> str:
    """Return an http(s)/file URL; an absolute local path becomes a file:// URL."""
    if isinstance(url, os.PathLike):
        url = os.fspath(url)
    if not isinstance(url, str) or not url:
        raise TypeError(f"url must be a non-empty string, got {url!r}")
    scheme = urllib.parse.urlsplit(url).scheme.lower()
    if scheme in ("http", "https", "file"):
        return url
    if scheme == "" and os.path.isabs(url):
        return Path(url).as_uri()
    raise ValueError(
        "url must start with http://, https:// or file:// (or be an absolute local path), "
        f"got {url!r}"
    )


def cache_dir(root: Optional[PathLike] = None) -> Path:
    """The data cache folder: ``root``, else ``$NN_KERNELS_DATA``, else the default.

    The default is ``~/.cache/nn-kernels-book``.

    The folder is not created here; :func:`download` creates what it writes into.
    """
    if root is None:
        root = os.environ.get(DATA_ENV_VAR) or DEFAULT_CACHE
    elif not isinstance(root, (str, os.PathLike)):
        raise TypeError(f"root must be a path or None, got {root!r}")
    return Path(root).expanduser()


def sha256sum(path: PathLike) -> str:
    """Hex SHA-256 digest of a file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def _manual_hint(url: str, dest: Path) -> str:
    return (
        f"To use the data without downloading it here, fetch {url} on a machine with "
        f"internet access and copy the file to {dest} (the next call finds it there and "
        f"skips the download), or point root= / ${DATA_ENV_VAR} at a folder that already "
        "holds it."
    )


def _verify(path: Path, expected: Optional[str], *, dataset: str, url: str,
            actual: Optional[str] = None) -> None:
    """Raise ChecksumError unless the digest is ``expected`` (``actual``: of a fresh download)."""
    if expected is None:
        return
    fresh = actual is not None
    actual = actual if fresh else sha256sum(path)
    if actual == expected:
        return
    if fresh:
        raise ChecksumError(
            f"{dataset}: the file downloaded from {url} has SHA-256 {actual}, expected "
            f"{expected}; it was deleted. The server holds a different or corrupt file: "
            "try again, use another mirror (url=) or pass the right sha256."
        )
    raise ChecksumError(
        f"{dataset}: {path} has SHA-256 {actual}, expected {expected}. The file is corrupt, "
        f"truncated or not the release expected from {url}; delete it and fetch again, or "
        "pass the right sha256."
    )


def download(
    url: str,
    dest: PathLike,
    *,
    sha256: Optional[str] = None,
    timeout: float = 60.0,
    dataset: str = "the dataset",
    progress: bool = True,
) -> Path:
    """Download ``url`` to the file ``dest`` atomically, verifying its SHA-256 if given.

    If ``dest`` already exists it is not downloaded again (only verified): copying a file
    there by hand is the way to use this code offline.

    Args:
        url: ``http://``, ``https://`` or ``file://`` URL, or an absolute local path.
        dest: the file to write; its folder is created.
        sha256: expected hex digest, or None to skip the check.
        timeout: seconds to wait for the connection and for each read, > 0.
        dataset: name used in messages ("LRA", "WikiText-103", ...).
        progress: print a line to stderr at the start and end of a real download, and
            every 10 % for large files.

    Returns:
        ``dest`` as a :class:`~pathlib.Path`.

    Raises:
        DatasetUnavailableError: the URL cannot be read (offline, refused connection,
            timeout, HTTP error, missing local file); the message names the dataset and
            the URL, and says where to put the file by hand.
        ChecksumError: the downloaded (or already present) file has another SHA-256; a
            freshly downloaded file is deleted.
        ValueError / TypeError naming the argument for a bad argument.
    """
    url = _normalise_url(url)
    if not isinstance(dest, (str, os.PathLike)):
        raise TypeError(f"dest must be a path, got {dest!r}")
    dest = Path(dest).expanduser().absolute()
    expected = _check_sha256(sha256)
    timeout = _check_timeout(timeout)
    if not isinstance(dataset, str) or not dataset:
        raise TypeError(f"dataset must be a non-empty string, got {dataset!r}")

    if dest.is_file():
        _verify(dest, expected, dataset=dataset, url=url)
        return dest
    if dest.exists():
        raise ValueError(f"dest must be a file path, but {dest} exists and is not a file")
    dest.parent.mkdir(parents=True, exist_ok=True)

    scheme = urllib.parse.urlsplit(url).scheme.lower()

    def unavailable(err: BaseException, during: str) -> DatasetUnavailableError:
        reason = getattr(err, "reason", None) or err
        if scheme == "file":
            return DatasetUnavailableError(
                f"Cannot read {dataset} from {url}: {reason}. The local file does not exist "
                "or cannot be read; check the path passed as url=."
            )
        return DatasetUnavailableError(
            f"Cannot download {dataset} from {url} ({during}): {reason}. This machine looks "
            "offline, or the server cannot be reached. " + _manual_hint(url, dest)
        )

    request = urllib.request.Request(url, headers={"User-Agent": _USER_AGENT})
    try:
        response = urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as err:
        raise DatasetUnavailableError(
            f"Cannot download {dataset} from {url}: the server answered HTTP {err.code} "
            f"({err.reason}). The file may have moved; pass url= with a mirror. "
            + _manual_hint(url, dest)
        ) from err
    except (OSError, http.client.HTTPException, ValueError) as err:
        # URLError, refused connections, DNS failures, timeouts and the chapter
        # runner's network guard are all OSErrors.
        raise unavailable(err, "connecting") from err

    fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".part", dir=dest.parent)
    tmp = Path(tmp_name)
    try:
        h = hashlib.sha256()
        with response, os.fdopen(fd, "wb") as out:
            length = response.headers.get("Content-Length")
            total = int(length) if length and length.isdigit() else None
            if progress:
                size = f"{total / 2**20:.1f} MiB" if total is not None else "unknown size"
                print(f"[{dataset}] downloading {url} ({size}) to {dest}", file=sys.stderr)
            done, next_report = 0, 0.1
            while True:
                try:
                    chunk = response.read(_CHUNK)
                except (OSError, http.client.HTTPException) as err:
                    raise unavailable(err, f"connection lost after {done} bytes") from err
                if not chunk:
                    break
                out.write(chunk)  # a full disk raises its own OSError, not "offline"
                h.update(chunk)
                done += len(chunk)
                if progress and total and total > 64 * _CHUNK and done >= next_report * total:
                    print(f"[{dataset}] {100 * done / total:.0f} %", file=sys.stderr)
                    next_report += 0.1
        if total is not None and done != total:
            raise DatasetUnavailableError(
                f"Cannot download {dataset} from {url}: the connection closed after {done} of "
                f"{total} bytes. Try again. " + _manual_hint(url, dest)
            )
        _verify(tmp, expected, dataset=dataset, url=url, actual=h.hexdigest())
        os.replace(tmp, dest)
        if progress:
            print(f"[{dataset}] saved {dest}", file=sys.stderr)
    finally:
        if tmp.exists():
            tmp.unlink()
    return dest


# --------------------------------------------------------------------------- extract
def _check_member_name(name: str, archive: Path) -> None:
    p = PurePosixPath(name.replace("\\", "/"))
    if p.is_absolute() or ".." in p.parts or (p.parts and ":" in p.parts[0]):
        raise UnsafeArchiveError(
            f"{archive}: member {name!r} would be written outside the destination folder; "
            "refusing to extract"
        )


def extract(archive: PathLike, dest: PathLike) -> Path:
    """Unpack a ``.zip`` or a tar archive (plain, gzip, bzip2 or xz) into ``dest``.

    The format is recognised from the content. Every member is checked before anything
    is written: absolute names, ``..`` components, links and device files raise
    :class:`UnsafeArchiveError`. Members are extracted into a temporary sibling of
    ``dest`` that is renamed to ``dest`` at the end, so ``dest`` exists only when
    complete. Cost: O(archive size).

    Returns:
        ``dest`` as a :class:`~pathlib.Path` (the archive's top-level entries lie directly
        inside it).

    Raises:
        FileNotFoundError if ``archive`` is missing; FileExistsError if ``dest`` exists;
        ValueError if the file is neither a zip nor a tar archive; UnsafeArchiveError.
    """
    if not isinstance(archive, (str, os.PathLike)):
        raise TypeError(f"archive must be a path, got {archive!r}")
    if not isinstance(dest, (str, os.PathLike)):
        raise TypeError(f"dest must be a path, got {dest!r}")
    archive, dest = Path(archive).expanduser(), Path(dest).expanduser()
    if not archive.is_file():
        raise FileNotFoundError(f"archive not found: {archive}")
    if dest.exists():
        raise FileExistsError(f"dest already exists: {dest}; remove it to extract again")

    is_zip = zipfile.is_zipfile(archive)
    if not is_zip and not tarfile.is_tarfile(archive):
        raise ValueError(
            f"archive must be a zip or tar file (optionally gz/bz2/xz-compressed): {archive}"
        )
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".partial", dir=dest.parent))
    try:
        if is_zip:
            with zipfile.ZipFile(archive) as zf:
                for info in zf.infolist():
                    _check_member_name(info.filename, archive)
                zf.extractall(tmp)
        else:
            with tarfile.open(archive, "r:*") as tf:
                members = tf.getmembers()
                for m in members:
                    _check_member_name(m.name, archive)
                    if not (m.isfile() or m.isdir()):
                        kind = "link" if (m.issym() or m.islnk()) else "special file"
                        raise UnsafeArchiveError(
                            f"{archive}: member {m.name!r} is a {kind}; refusing to extract"
                        )
                if hasattr(tarfile, "data_filter"):  # Python >= 3.11.4 / 3.12: belt and braces
                    tf.extractall(tmp, members=members, filter="data")
                else:  # pragma: no cover - older Pythons; members were checked above
                    tf.extractall(tmp, members=members)
        os.replace(tmp, dest)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return dest


def download_and_extract(
    url: str,
    folder: PathLike,
    *,
    filename: str,
    sha256: Optional[str] = None,
    timeout: float = 60.0,
    dataset: str = "the dataset",
    keep_archive: bool = True,
    progress: bool = True,
) -> Path:
    """Fetch ``url`` to ``folder/filename`` and unpack it to ``folder/extracted``, once.

    If ``folder/extracted`` exists (it only appears complete, see :func:`extract`) nothing
    is downloaded. Otherwise the archive is downloaded (or taken from ``folder/filename``
    if placed there by hand), verified and extracted; ``keep_archive=False`` deletes it
    afterwards.

    Returns:
        ``folder/extracted``.

    Raises:
        as :func:`download` and :func:`extract`.
    """
    if not isinstance(folder, (str, os.PathLike)):
        raise TypeError(f"folder must be a path, got {folder!r}")
    if not isinstance(filename, str) or not filename or Path(filename).name != filename:
        raise ValueError(f"filename must be a plain file name without folders, got {filename!r}")
    folder = Path(folder).expanduser()
    target = folder / "extracted"
    if target.is_dir():
        return target
    archive = download(url, folder / filename, sha256=sha256, timeout=timeout, dataset=dataset,
                       progress=progress)
    extract(archive, target)
    if not keep_archive:
        archive.unlink()
    return target
