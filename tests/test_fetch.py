"""data_scripts.fetch against a local HTTP server that drops connections.

The server listens on 127.0.0.1 only, answers a bounded number of requests and is shut
down by the fixture (and by a watchdog timer if a test hangs), so it always stops by
itself. Before the fix, a transfer cut short without a Content-Length header was saved
as a complete file, nothing was retried, a bad cached archive gave "archive must be a
zip or tar file" without saying which file to delete, and an all-zero file unpacked as
an empty tar.
"""

from __future__ import annotations

import hashlib
import io
import shlex
import tarfile
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator

import pytest

from data_scripts import bert, fetch, glue, mnist, wikitext
from data_scripts.fetch import (
    ChecksumError,
    CorruptArchiveError,
    DatasetUnavailableError,
    UnconfirmedDownloadError,
    download,
    download_and_extract,
    extract,
)

PAYLOAD = bytes(range(256)) * 4096  # 1 MiB: more than one read chunk
DIGEST = hashlib.sha256(PAYLOAD).hexdigest()


class FlakyServer(ThreadingHTTPServer):
    """Serves PAYLOAD at any path; the first ``drops`` responses stop half-way."""

    daemon_threads = True
    max_requests = 20

    def __init__(self, *, drops: int, content_length: bool, ranges: bool, body: bytes = PAYLOAD):
        super().__init__(("127.0.0.1", 0), Handler)
        self.drops, self.content_length, self.ranges, self.body = drops, content_length, ranges, body
        self.requests: list[dict] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/data.bin"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"  # the body ends when the connection closes

    def log_message(self, *args) -> None:  # keep pytest's output clean
        pass

    def do_GET(self) -> None:
        srv: FlakyServer = self.server  # type: ignore[assignment]
        srv.requests.append({"range": self.headers.get("Range")})
        if len(srv.requests) > srv.max_requests:
            self.send_error(503)
            return
        body, start = srv.body, 0
        rng = self.headers.get("Range")
        if srv.ranges and rng and rng.startswith("bytes="):
            start = int(rng[6:].split("-")[0])
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
        else:
            self.send_response(200)
        if srv.content_length:
            self.send_header("Content-Length", str(len(body) - start))
        self.end_headers()
        rest = body[start:]
        if srv.drops > 0:
            srv.drops -= 1
            self.wfile.write(rest[: len(rest) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        self.wfile.write(rest)

    def do_HEAD(self) -> None:
        srv: FlakyServer = self.server  # type: ignore[assignment]
        srv.requests.append({"method": "HEAD"})
        self.send_response(200)
        if srv.content_length:
            self.send_header("Content-Length", str(len(srv.body)))
        self.end_headers()


def _serve(**kwargs) -> Iterator[FlakyServer]:
    server = FlakyServer(**kwargs)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    watchdog = threading.Timer(60, server.shutdown)  # stops by itself even if a test hangs
    watchdog.start()
    try:
        yield server
    finally:
        watchdog.cancel()
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.fixture(autouse=True)
def no_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fetch, "_RETRY_BACKOFF_S", 0.0)
    monkeypatch.delenv(fetch.CONFIRM_ENV_VAR, raising=False)


@pytest.mark.parametrize("content_length", [False, True], ids=["no-length", "length"])
def test_dropped_transfer_is_resumed_with_range(tmp_path: Path, content_length: bool) -> None:
    for server in _serve(drops=1, content_length=content_length, ranges=True):
        dest = download(server.url, tmp_path / "data.bin", sha256=DIGEST, size=len(PAYLOAD),
                        progress=False)
        assert dest.read_bytes() == PAYLOAD
        assert [r["range"] for r in server.requests] == [None, f"bytes={len(PAYLOAD) // 2}-"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.bin"]


def test_server_without_range_support_restarts_from_zero(tmp_path: Path) -> None:
    for server in _serve(drops=1, content_length=False, ranges=False):
        dest = download(server.url, tmp_path / "data.bin", sha256=DIGEST, size=len(PAYLOAD),
                        progress=False)
        assert dest.read_bytes() == PAYLOAD and len(server.requests) == 2


def test_drop_without_content_length_is_never_saved_as_complete(tmp_path: Path) -> None:
    """The bug: half a file, no Content-Length, no error, saved under the final name."""
    for server in _serve(drops=10, content_length=False, ranges=True):
        with pytest.raises(DatasetUnavailableError, match=r"4 attempt\(s\)") as info:
            download(server.url, tmp_path / "data.bin", sha256=DIGEST, size=len(PAYLOAD),
                     progress=False, retries=3)
        assert len(server.requests) == 4  # bounded
    assert not (tmp_path / "data.bin").exists()
    part = tmp_path / ".data.bin.part"
    assert part.is_file() and str(part) in str(info.value)  # kept for the next call to resume
    for server in _serve(drops=0, content_length=False, ranges=True):
        download(server.url, tmp_path / "data.bin", sha256=DIGEST, size=len(PAYLOAD), progress=False)
        assert server.requests[0]["range"] is not None  # resumed from the partial file
    assert (tmp_path / "data.bin").read_bytes() == PAYLOAD and not part.exists()


def test_wrong_digest_after_download_deletes_the_file(tmp_path: Path) -> None:
    for server in _serve(drops=0, content_length=True, ranges=True):
        with pytest.raises(ChecksumError, match="it was deleted"):
            download(server.url, tmp_path / "data.bin", sha256="0" * 64, progress=False)
    assert list(tmp_path.iterdir()) == []


def test_unpinned_download_needs_confirmation_and_is_recorded(tmp_path: Path, monkeypatch) -> None:
    dest = tmp_path / "data.bin"
    for server in _serve(drops=0, content_length=True, ranges=True):
        with pytest.raises(UnconfirmedDownloadError, match=fetch.CONFIRM_ENV_VAR):
            download(server.url, dest, progress=False)
        assert not dest.exists() and list(tmp_path.iterdir()) == []
        monkeypatch.setenv(fetch.CONFIRM_ENV_VAR, "1")
        download(server.url, dest, progress=False)
    record = tmp_path / "data.bin.sha256"
    assert record.read_text().split() == [DIGEST, str(len(PAYLOAD))]
    # Later uses check the cached file against the recorded digest.
    dest.write_bytes(PAYLOAD[:-1] + b"x")
    with pytest.raises(ChecksumError, match=r"recorded at its first download") as info:
        download("http://127.0.0.1:9/data.bin", dest, progress=False)
    assert f"rm {shlex.quote(str(dest))}" in str(info.value)


def test_bad_cached_file_is_named_with_the_command_to_fix_it(tmp_path: Path) -> None:
    dest = tmp_path / "cache" / "data.bin"
    dest.parent.mkdir()
    dest.write_bytes(PAYLOAD[:1000])  # truncated
    with pytest.raises(ChecksumError) as info:
        download("http://127.0.0.1:9/data.bin", dest, sha256=DIGEST, size=len(PAYLOAD), progress=False)
    message = str(info.value)
    assert str(dest) in message and f"rm {shlex.quote(str(dest))}" in message and "1000 bytes" in message


def test_unrecorded_truncated_cached_file_is_refused_with_the_removal_command(tmp_path: Path) -> None:
    # A file put in the cache by hand (or by an older version) has no pinned checksum and
    # no record: its length is compared with the server's Content-Length.
    dest = tmp_path / "cache" / "data.bin"
    dest.parent.mkdir()
    dest.write_bytes(PAYLOAD[: len(PAYLOAD) // 2])
    for server in _serve(drops=0, content_length=True, ranges=True):
        with pytest.raises(ChecksumError) as info:
            download(server.url, dest, progress=False)
        message = str(info.value)
        assert f"rm {shlex.quote(str(dest))}" in message and str(len(PAYLOAD)) in message
        assert not (tmp_path / "cache" / "data.bin.sha256").exists()
        # the complete file is accepted, and its size and digest recorded for later uses
        dest.write_bytes(PAYLOAD)
        assert download(server.url, dest, progress=False) == dest
        assert [r.get("method") for r in server.requests] == ["HEAD", "HEAD"]
    assert (tmp_path / "cache" / "data.bin.sha256").read_text().split() == [DIGEST, str(len(PAYLOAD))]
    dest.write_bytes(PAYLOAD[:-5])  # later truncated: refused offline too, from the record
    with pytest.raises(ChecksumError, match="recorded at its first download") as info:
        download("http://127.0.0.1:9/data.bin", dest, progress=False)
    assert f"rm {shlex.quote(str(dest))}" in str(info.value)


def test_unrecorded_cached_file_offline_is_used_with_a_warning(tmp_path: Path, capsys) -> None:
    dest = tmp_path / "data.bin"
    dest.write_bytes(PAYLOAD)
    assert download("http://127.0.0.1:9/data.bin", dest, progress=False, timeout=2) == dest
    assert "unverified" in capsys.readouterr().err
    assert not (tmp_path / "data.bin.sha256").exists()  # checked once a server answers


def test_bad_cached_archive_is_named_not_reused_forever(tmp_path: Path) -> None:
    folder = tmp_path / "lra"
    folder.mkdir()
    for content in (b"<html>503 Service Unavailable</html>", b"\0" * 20480):  # error page, all zeros
        archive = folder / "lra_release.gz"
        archive.write_bytes(content)
        with pytest.raises(CorruptArchiveError) as info:
            download_and_extract("http://127.0.0.1:9/lra_release.gz", folder, filename=archive.name,
                                 progress=False)
        message = str(info.value)
        assert str(archive) in message and f"rm {shlex.quote(str(archive))}" in message
        assert not (folder / "extracted").exists()


def test_all_zero_and_empty_archives_are_refused(tmp_path: Path) -> None:
    zeros = tmp_path / "zeros.tar"
    zeros.write_bytes(b"\0" * 10240)
    empty_tar = tmp_path / "empty.tar"
    with tarfile.open(empty_tar, "w"):
        pass
    empty_zip = tmp_path / "empty.zip"
    zipfile.ZipFile(empty_zip, "w").close()
    for archive in (zeros, empty_tar, empty_zip):
        with pytest.raises(CorruptArchiveError, match="not an archive|holds no files"):
            extract(archive, tmp_path / f"out_{archive.name}")
        assert not (tmp_path / f"out_{archive.name}").exists()


def test_truncated_archive_is_corrupt_not_a_crash(tmp_path: Path) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        info = tarfile.TarInfo("data/big.bin")
        info.size = len(PAYLOAD)
        tf.addfile(info, io.BytesIO(hashlib.sha512(PAYLOAD).digest() * (len(PAYLOAD) // 64)))
    archive = tmp_path / "cut.tar.gz"
    archive.write_bytes(buf.getvalue()[: len(buf.getvalue()) // 2])
    with pytest.raises(CorruptArchiveError, match="rm "):
        extract(archive, tmp_path / "out")
    assert [p.name for p in tmp_path.iterdir()] == ["cut.tar.gz"]


def test_progress_bar_counts_bytes(tmp_path: Path, capsys) -> None:
    for server in _serve(drops=0, content_length=True, ranges=True):
        download(server.url, tmp_path / "data.bin", sha256=DIGEST, progress=True, dataset="Fixture")
    err = capsys.readouterr().err
    assert "Fixture" in err and "MiB" in err and "saved" in err


def test_pins_cover_every_remote_file_of_the_full_profile() -> None:
    """Sizes and digests for GLUE, WikiText-103, MNIST and BERT-base; LRA publishes none
    (confirmation)."""
    for spec in (*glue.GLUE_TASKS.values(), bert.BERT_BASE, bert.BERT_VOCAB):
        assert spec["size"] > 10**5 and len(spec["sha256"]) == 64
    assert wikitext.WIKITEXT103_SIZE > 10**8 and len(wikitext.WIKITEXT103_SHA256) == 64
    assert set(mnist.MNIST_SHA256) == set(mnist.MNIST_SIZES) == set(mnist.MNIST_FILES.values())


def test_pinned_fetchers_reject_a_short_file_at_the_default_address(tmp_path: Path) -> None:
    """A file placed at the cache path is checked against the published size and digest."""
    folder = tmp_path / "glue" / "sst2"
    folder.mkdir(parents=True)
    (folder / "SST-2.zip").write_bytes(b"PK\x05\x06" + b"\0" * 18)
    with pytest.raises(ChecksumError, match="expected 7439277"):
        glue.fetch_glue("sst2", root=tmp_path, progress=False)
    (tmp_path / "wikitext-103").mkdir()
    (tmp_path / "wikitext-103" / wikitext.WIKITEXT103_ARCHIVE).write_bytes(b"x")
    with pytest.raises(ChecksumError, match="rm "):
        wikitext.fetch_wikitext103(root=tmp_path, progress=False)
    (tmp_path / "bert-base-uncased").mkdir()
    (tmp_path / "bert-base-uncased" / "model.safetensors").write_bytes(b"{}")
    with pytest.raises(ChecksumError, match="expected 440449768"):
        bert.fetch_bert_base(root=tmp_path, progress=False)
