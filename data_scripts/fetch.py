"""Download, verify and unpack dataset archives: the plumbing of the real-data fetchers.

:mod:`data_scripts.lra` and :mod:`data_scripts.wikitext` fetch full-size datasets with
these helpers; the default (ci) profile of the book never calls them, and the chapter
runner blocks the network so that a silent download would fail loudly.

* :func:`cache_dir` -- where data lives: the ``root`` argument, else the environment
  variable ``NN_KERNELS_DATA``, else ``~/.cache/nn-kernels-book``.
* :func:`download` -- one URL (``http``, ``https`` or ``file``) to one file, streamed to a
  hidden ``.part`` file beside the destination and renamed into place only when complete
  and verified: its length must match the expected size (or the server's Content-Length)
  and its digest the expected SHA-256, so a connection dropped mid-way -- with or without
  a Content-Length header -- never becomes a "complete" file. A dropped connection is
  retried a few times, resuming with an HTTP ``Range`` request where the server allows
  it; a byte progress bar (tqdm) shows on stderr. A file already at the destination is
  used as it is after the same checks, which is also how data is placed by hand on a
  machine without internet; a bad one is named in the error with the command that
  deletes it. A download for which no checksum is published needs the user's
  confirmation (``$NN_KERNELS_CONFIRM_UNPINNED=1``), and its size and digest are then
  recorded beside it (``<file>.sha256``) and checked on every later use. A cached file
  with neither a pinned nor a recorded checksum (placed by hand, or by an older version)
  must have the length the server's Content-Length gives (a HEAD request); it is then
  recorded, and a file of another length is refused with the ``rm`` command that
  removes it. Offline it is used with a warning and checked once a server answers.
  A transfer that ends at another length than the Content-Length is never accepted.
* :func:`extract` -- a ``.zip`` or a (compressed) tar archive, recognised by content
  rather than by name (LRA's ``lra_release.gz`` is a gzipped tar). Members that would
  land outside the destination (absolute paths, ``..``), links and device files are
  refused before anything is written; extraction goes to a temporary folder renamed into
  place at the end.
* :func:`download_and_extract` -- both, with a cache check: the common path of a fetcher.

Errors: :class:`DatasetUnavailableError` when the data cannot be obtained (offline, server
error, missing local file), with the dataset, the URL and how to place the files by hand;
:class:`UnconfirmedDownloadError` (a subclass) for an unconfirmed download without a
published checksum; :class:`ChecksumError` when a file's size or SHA-256 differs from the
expected one; :class:`CorruptArchiveError` for an archive that cannot be unpacked (it
names the file to delete); :class:`UnsafeArchiveError` for a refused archive member.

Pinned sizes and digests live with each fetcher (:mod:`data_scripts.glue`,
:mod:`data_scripts.wikitext`, :mod:`data_scripts.mnist`), each with the listing it was
taken from; they apply to the default download address, and ``sha256=`` overrides them.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import http.client
import math
import os
import shlex
import shutil
import sys
import tarfile
import tempfile
import time
import lzma
import urllib.error
import urllib.parse
import urllib.request
import zipfile
import zlib
from pathlib import Path, PurePosixPath
from typing import Callable, Optional, Union

try:  # POSIX: one download of a file at a time (the .part file is locked)
    import fcntl
except ImportError:  # pragma: no cover - Windows: no lock
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "DATA_ENV_VAR",
    "DEFAULT_CACHE",
    "CONFIRM_ENV_VAR",
    "DEFAULT_RETRIES",
    "DatasetUnavailableError",
    "UnconfirmedDownloadError",
    "ChecksumError",
    "UnsafeArchiveError",
    "CorruptArchiveError",
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

#: Environment variable: ``1`` accepts downloads for which no checksum is published.
CONFIRM_ENV_VAR = "NN_KERNELS_CONFIRM_UNPINNED"
#: Retries after a dropped connection (each resumes where the last one stopped).
DEFAULT_RETRIES = 3

_CHUNK = 1 << 20
_RETRY_BACKOFF_S = 2.0  # times the attempt number
# Some mirrors (wikitext.smerity.com among them) answer 403 to urllib's default agent.
_USER_AGENT = "Mozilla/5.0 (compatible; nn-kernels-book data fetcher)"

PathLike = Union[str, os.PathLike]


class DatasetUnavailableError(RuntimeError):
    """The data could not be obtained: offline, unreachable server, HTTP error, missing file."""


class UnconfirmedDownloadError(DatasetUnavailableError):
    """A download without a published checksum that the user has not confirmed."""


class ChecksumError(RuntimeError):
    """A file's size or SHA-256 digest differs from the expected one."""


class CorruptArchiveError(ValueError):
    """A cached archive cannot be unpacked (truncated, not an archive, empty); the message
    names the file and the command that deletes it."""


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


def _remove_command(path: Path) -> str:
    return f"rm {shlex.quote(str(path))}"


def _record_path(dest: Path) -> Path:
    """Where the digest of a confirmed download without a published checksum is kept."""
    return dest.with_name(dest.name + ".sha256")


def _read_record(dest: Path) -> tuple[Optional[str], Optional[int]]:
    try:
        digest, size = _record_path(dest).read_text().split()[:2]
        return _check_sha256(digest), int(size)
    except (OSError, ValueError):
        return None, None


def _check_cached(path: Path, expected: Optional[str], size: Optional[int], *, dataset: str,
                  url: str) -> None:
    """Verify a file already at its destination; name it and the command to fix it if bad."""
    recorded = expected is None and size is None and _record_path(path).is_file()
    if recorded:
        expected, size = _read_record(path)
    actual_size = path.stat().st_size
    problem = None
    if size is not None and actual_size != size:
        problem = f"has {actual_size} bytes, expected {size}"
    elif expected is not None:
        actual = sha256sum(path)
        if actual != expected:
            problem = f"has SHA-256 {actual}, expected {expected}"
    if problem is None:
        return
    source = f"the digest recorded at its first download ({_record_path(path)})" if recorded else url
    raise ChecksumError(
        f"{dataset}: the cached file {path} {problem} (from {source}). It is corrupt, "
        "truncated or not the release expected. Delete it and run again to download a fresh "
        f"copy:\n    {_remove_command(path)}\n(or pass the right sha256=)."
    )


def _server_length(url: str, timeout: float) -> Optional[int]:
    """The server's Content-Length for ``url`` (a HEAD request), or None when the server
    cannot be reached or sends none."""
    request = urllib.request.Request(url, method="HEAD", headers={"User-Agent": _USER_AGENT})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            length = response.headers.get("Content-Length")
    except (OSError, http.client.HTTPException, ValueError):
        return None
    return int(length) if length and length.isdigit() else None


def _check_unrecorded(path: Path, url: str, *, timeout: float, dataset: str) -> None:
    """A cached file with neither a pinned checksum nor a record of its first download
    (copied by hand, or left by an older version): its length must match the server's
    Content-Length, and its size and SHA-256 are then recorded; a file of another length
    is refused with the command that removes it. Offline nothing can be checked: the
    file is used with a warning and stays unrecorded until a check is possible."""
    if urllib.parse.urlsplit(url).scheme.lower() not in ("http", "https"):
        return
    actual_size = path.stat().st_size
    length = _server_length(url, timeout)
    if length is None:
        print(f"[{dataset}] warning: {path} has no pinned or recorded checksum and the server "
              "gave no length to compare it with; it is used unverified", file=sys.stderr)
        return
    if actual_size != length:
        raise ChecksumError(
            f"{dataset}: the cached file {path} has {actual_size} bytes, but the server's "
            f"Content-Length for {url} is {length}: it is truncated or not the file expected. "
            f"Delete it and run again to download a fresh copy:\n    {_remove_command(path)}"
        )
    digest = sha256sum(path)
    _write_record(path, digest, actual_size)
    print(f"[{dataset}] no published checksum: recorded SHA-256 {digest} ({actual_size} bytes) "
          f"of the cached file in {_record_path(path)}", file=sys.stderr)


def _write_record(dest: Path, digest: str, size: int) -> None:
    """Write ``<dest>.sha256`` atomically (a temporary file, then a rename)."""
    record = _record_path(dest)
    tmp = record.with_name(f".{record.name}.tmp")
    tmp.write_text(f"{digest}  {size}\n")
    os.replace(tmp, record)


def _confirmed(confirm_unpinned: Optional[bool]) -> bool:
    if confirm_unpinned is not None:
        return bool(confirm_unpinned)
    return os.environ.get(CONFIRM_ENV_VAR, "").strip().lower() in ("1", "true", "yes")


class _Progress:
    """Byte progress bar on stderr (tqdm), or nothing."""

    def __init__(self, enabled: bool, dataset: str, total: Optional[int], initial: int) -> None:
        self.bar = None
        if enabled:
            try:
                from tqdm.auto import tqdm
            except ImportError:  # pragma: no cover - tqdm comes with the book's pins
                return
            self.bar = tqdm(total=total, initial=initial, unit="B", unit_scale=True,
                            unit_divisor=1024, desc=dataset, file=sys.stderr, leave=False)

    def update(self, n: int) -> None:
        if self.bar is not None:
            self.bar.update(n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _content_range_start(header: Optional[str]) -> Optional[int]:
    """``bytes START-END/TOTAL`` -> START (None if absent or malformed)."""
    if not header or not header.startswith("bytes "):
        return None
    try:
        return int(header[6:].split("-", 1)[0])
    except ValueError:
        return None


def download(
    url: str,
    dest: PathLike,
    *,
    sha256: Optional[str] = None,
    size: Optional[int] = None,
    timeout: float = 60.0,
    dataset: str = "the dataset",
    progress: bool = True,
    retries: int = DEFAULT_RETRIES,
    confirm_unpinned: Optional[bool] = None,
) -> Path:
    """Download ``url`` to the file ``dest`` atomically, verifying its size and SHA-256.

    The bytes go to a hidden ``.<name>.part`` file beside ``dest``, renamed into place only
    when complete and verified. A transfer is complete when its length matches ``size``
    (or the server's Content-Length) and its digest ``sha256``: a connection dropped
    mid-way -- with or without a Content-Length header -- is never saved as the file.
    After a dropped connection the download is retried up to ``retries`` times, resuming
    with an HTTP ``Range`` request where the server allows it (from zero otherwise); a
    partial file left by an interrupted run is resumed the same way.

    If ``dest`` already exists it is not downloaded again, only verified (copying a file
    there by hand is the way to use this code offline); a bad cached file is named in the
    error with the command that deletes it.

    An ``http(s)`` download with no ``sha256`` (the publisher gives none) must be
    confirmed: ``confirm_unpinned=True`` or ``$NN_KERNELS_CONFIRM_UNPINNED=1``. Its digest
    is then recorded beside the file (``<dest>.sha256``) and checked on every later use.

    Args:
        url: ``http://``, ``https://`` or ``file://`` URL, or an absolute local path.
        dest: the file to write; its folder is created.
        sha256: expected hex digest, or None.
        size: expected size in bytes, or None.
        timeout: seconds to wait for the connection and for each read, > 0.
        dataset: name used in messages ("LRA", "WikiText-103", ...).
        progress: show a byte progress bar (tqdm) on stderr.
        retries: how many times to retry after a dropped connection (>= 0).
        confirm_unpinned: accept an http(s) download without ``sha256`` (None: read
            ``$NN_KERNELS_CONFIRM_UNPINNED``).

    Returns:
        ``dest`` as a :class:`~pathlib.Path`.

    Raises:
        DatasetUnavailableError: the URL cannot be read (offline, refused connection,
            timeout, HTTP error, missing local file, every retry dropped); the message names
            the dataset and the URL, and says where to put the file by hand.
            :class:`UnconfirmedDownloadError` (a subclass) for an unconfirmed download
            without a checksum.
        ChecksumError: the downloaded (or already present) file has another size or
            SHA-256; a freshly downloaded file is deleted.
        ValueError / TypeError naming the argument for a bad argument.
    """
    url = _normalise_url(url)
    if not isinstance(dest, (str, os.PathLike)):
        raise TypeError(f"dest must be a path, got {dest!r}")
    dest = Path(dest).expanduser().absolute()
    expected = _check_sha256(sha256)
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
        raise ValueError(f"size must be a number of bytes >= 1 or None, got {size!r}")
    timeout = _check_timeout(timeout)
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise ValueError(f"retries must be an integer >= 0, got {retries!r}")
    if not isinstance(dataset, str) or not dataset:
        raise TypeError(f"dataset must be a non-empty string, got {dataset!r}")

    if dest.is_file():
        _check_cached(dest, expected, size, dataset=dataset, url=url)
        if expected is None and size is None and not _record_path(dest).is_file():
            _check_unrecorded(dest, url, timeout=timeout, dataset=dataset)
        return dest
    if dest.exists():
        raise ValueError(f"dest must be a file path, but {dest} exists and is not a file")

    scheme = urllib.parse.urlsplit(url).scheme.lower()
    remote = scheme in ("http", "https")
    unpinned = remote and expected is None
    confirmed = _confirmed(confirm_unpinned)
    dest.parent.mkdir(parents=True, exist_ok=True)

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

    part = dest.with_name(f".{dest.name}.part")
    try:
        _download_to_part(url, part, dest, size=size, timeout=timeout, dataset=dataset,
                          progress=progress, retries=retries, remote=remote,
                          confirm=None if not unpinned or confirmed else
                          (lambda: UnconfirmedDownloadError(
                              f"{dataset}: no checksum is published for {url}, so a corrupt or "
                              "tampered download could not be detected. To download it anyway, "
                              f"set {CONFIRM_ENV_VAR}=1 (or pass confirm_unpinned=True): its "
                              "SHA-256 is then recorded beside the file and checked on every "
                              "later use. Or pass sha256= with a digest you trust. "
                              + _manual_hint(url, dest))),
                          unavailable=unavailable)
    finally:
        with contextlib.suppress(FileNotFoundError):
            if part.stat().st_size == 0:
                part.unlink()
    got = part.stat().st_size
    actual = sha256sum(part)
    problem = None
    if size is not None and got != size:
        problem = f"has {got} bytes, expected {size}"
    elif expected is not None and actual != expected:
        problem = f"has SHA-256 {actual}, expected {expected}"
    if problem is not None:
        part.unlink()
        raise ChecksumError(
            f"{dataset}: the file downloaded from {url} {problem}; it was deleted. The server "
            "holds a different or corrupt file: try again, use another mirror (url=) or pass "
            "the right sha256."
        )
    os.replace(part, dest)
    if unpinned:
        _write_record(dest, actual, got)
        print(f"[{dataset}] no published checksum: recorded SHA-256 {actual} ({got} bytes) in "
              f"{_record_path(dest)}; pass sha256={actual!r} to pin it", file=sys.stderr)
    if progress:
        print(f"[{dataset}] saved {dest}", file=sys.stderr)
    return dest


def _download_to_part(url: str, part: Path, dest: Path, *, size: Optional[int], timeout: float,
                      dataset: str, progress: bool, retries: int, remote: bool,
                      confirm: Optional[Callable[[], Exception]],
                      unavailable: Callable[[BaseException, str], Exception]) -> None:
    """Fill ``part`` with the bytes of ``url``: retries, Range resumption, progress.

    ``confirm``: when set, the error to raise once the server answers (a download
    without a published checksum that the user has not confirmed).
    """
    with open(part, "ab") as out:
        try:
            if fcntl is not None:
                fcntl.flock(out.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise DatasetUnavailableError(
                f"another process is downloading {dataset} to {part}; wait for it to finish"
            ) from None
        last_problem = "no attempt"
        for attempt in range(retries + 1):
            if attempt:
                time.sleep(_RETRY_BACKOFF_S * attempt)
            offset = out.seek(0, os.SEEK_END) if remote else 0
            if not remote:
                out.truncate(0)
            if size is not None and offset >= size:
                break  # a complete partial file from an earlier run: verify below
            headers = {"User-Agent": _USER_AGENT}
            if offset:
                headers["Range"] = f"bytes={offset}-"
            try:
                response = urllib.request.urlopen(urllib.request.Request(url, headers=headers),
                                                  timeout=timeout)
            except urllib.error.HTTPError as err:
                if err.code == 416 and offset:  # the partial file does not fit: start over
                    out.truncate(0)
                    last_problem = "the server refused to resume"
                    continue
                if 500 <= err.code < 600:
                    last_problem = f"HTTP {err.code} ({err.reason})"
                    continue
                raise DatasetUnavailableError(
                    f"Cannot download {dataset} from {url}: the server answered HTTP {err.code} "
                    f"({err.reason}). The file may have moved; pass url= with a mirror. "
                    + _manual_hint(url, dest)
                ) from err
            except (OSError, http.client.HTTPException, ValueError) as err:
                # URLError, refused connections, DNS failures, timeouts and the chapter
                # runner's network guard are all OSErrors: offline at the first attempt
                # (no point retrying), a dropped server later on.
                if attempt == 0:
                    raise unavailable(err, "connecting") from err
                last_problem = f"reconnecting failed ({err})"
                continue
            if confirm is not None:
                response.close()
                raise confirm()
            with response:
                status = getattr(response, "status", 200)
                if offset and (status != 206 or _content_range_start(
                        response.headers.get("Content-Range")) != offset):
                    out.truncate(0)  # the server sent the whole file again
                    offset = 0
                length = response.headers.get("Content-Length")
                total = offset + int(length) if length and length.isdigit() else size
                if attempt == 0 and progress:
                    shown = f"{total / 2**20:.1f} MiB" if total else "unknown size"
                    print(f"[{dataset}] downloading {url} ({shown}) to {dest}", file=sys.stderr)
                bar = _Progress(progress, dataset, total, offset)
                done, lost = offset, None
                try:
                    while True:
                        try:
                            chunk = response.read(_CHUNK)
                        except (OSError, http.client.HTTPException) as err:
                            lost = err
                            break
                        if not chunk:
                            break
                        out.write(chunk)  # a full disk raises its own OSError, not "offline"
                        done += len(chunk)
                        bar.update(len(chunk))
                finally:
                    bar.close()
                    out.flush()
            if lost is not None:
                last_problem = f"the connection was lost after {done} bytes ({lost!r})"
                continue
            if total is not None and done < total:
                last_problem = f"the connection closed after {done} of {total} bytes"
                continue
            if total is not None and done != total:  # more than the server announced
                out.truncate(0)
                last_problem = f"the server sent {done} bytes but announced {total}"
                continue
            break
        else:
            raise DatasetUnavailableError(
                f"Cannot download {dataset} from {url}: {last_problem}, {retries + 1} attempt(s). "
                f"The partial file {part} is kept; the next call resumes from it (delete it to "
                f"start over: {_remove_command(part)}). " + _manual_hint(url, dest)
            )
        out.flush()
        os.fsync(out.fileno())


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
        :class:`CorruptArchiveError` (a ValueError) if the file is not a zip or tar
        archive, holds no files (an all-zero file is not an empty tar here) or cannot be
        unpacked -- its message names the file and the command that deletes it;
        UnsafeArchiveError.
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

    def corrupt(why: str) -> CorruptArchiveError:
        return CorruptArchiveError(
            f"{archive} {why}: it is probably a truncated or failed download, or not the "
            "file expected. Delete it and run again to fetch a fresh copy:\n"
            f"    {_remove_command(archive)}"
        )

    is_zip = zipfile.is_zipfile(archive)
    if not is_zip and not _is_tar(archive):
        raise corrupt("is not an archive: an archive must be a zip or tar file (optionally "
                      "gz/bz2/xz-compressed)")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".partial", dir=dest.parent))
    try:
        try:
            if is_zip:
                with zipfile.ZipFile(archive) as zf:
                    infos = zf.infolist()
                    if not infos:
                        raise corrupt("holds no files")
                    for info in infos:
                        _check_member_name(info.filename, archive)
                    zf.extractall(tmp)  # checks each member's CRC (BadZipFile)
            else:
                _extract_tar(archive, tmp, corrupt)
        except (tarfile.TarError, zipfile.BadZipFile, EOFError, zlib.error, lzma.LZMAError,
                OSError) as err:
            if isinstance(err, (FileNotFoundError, PermissionError)) or getattr(err, "errno", None) == errno.ENOSPC:
                raise
            raise corrupt(f"cannot be unpacked ({type(err).__name__}: {err})") from err
        os.replace(tmp, dest)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return dest


def _is_tar(archive: Path) -> bool:
    """A tar archive with at least one real header (tarfile also says yes to all zeros)."""
    try:
        with tarfile.open(archive, "r:*") as tf:
            return tf.next() is not None
    except (tarfile.TarError, EOFError, zlib.error, lzma.LZMAError, OSError):
        return False


def _extract_tar(archive: Path, tmp: Path, corrupt) -> None:
    with tarfile.open(archive, "r:*") as tf:
        members = tf.getmembers()
        if not members:
            raise corrupt("holds no files")
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


def download_and_extract(
    url: str,
    folder: PathLike,
    *,
    filename: str,
    sha256: Optional[str] = None,
    size: Optional[int] = None,
    timeout: float = 60.0,
    dataset: str = "the dataset",
    keep_archive: bool = True,
    progress: bool = True,
    retries: int = DEFAULT_RETRIES,
    confirm_unpinned: Optional[bool] = None,
) -> Path:
    """Fetch ``url`` to ``folder/filename`` and unpack it to ``folder/extracted``, once.

    If ``folder/extracted`` exists (it only appears complete, see :func:`extract`) nothing
    is downloaded. Otherwise the archive is downloaded (or taken from ``folder/filename``
    if placed there by hand), verified and extracted; ``keep_archive=False`` deletes it
    afterwards.

    Returns:
        ``folder/extracted``.

    Raises:
        as :func:`download` and :func:`extract` (a cached archive that cannot be unpacked
        is named in the :class:`CorruptArchiveError`, with the command that deletes it).
    """
    if not isinstance(folder, (str, os.PathLike)):
        raise TypeError(f"folder must be a path, got {folder!r}")
    if not isinstance(filename, str) or not filename or Path(filename).name != filename:
        raise ValueError(f"filename must be a plain file name without folders, got {filename!r}")
    folder = Path(folder).expanduser()
    target = folder / "extracted"
    if target.is_dir():
        return target
    archive = download(url, folder / filename, sha256=sha256, size=size, timeout=timeout,
                       dataset=dataset, progress=progress, retries=retries,
                       confirm_unpinned=confirm_unpinned)
    extract(archive, target)
    if not keep_archive:
        archive.unlink()
    return target
