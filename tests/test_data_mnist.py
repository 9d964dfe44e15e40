"""Tests for data_scripts.mnist on the tiny IDX files in tests/fixtures/mnist_tiny.

The fixture (tests/fixtures/make_mnist_fixture.py) draws a vertical bar at a column that
encodes the label, so the loaded images can be checked against the loaded labels
independently of the reader.
"""

from __future__ import annotations

import gzip
import hashlib
import shutil
from pathlib import Path

import numpy as np
import pytest

from data_scripts.fetch import ChecksumError, DatasetUnavailableError
from data_scripts.mnist import MNIST_FILES, fetch_mnist, load_mnist, read_idx

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "mnist_tiny"
URL = FIXTURE.as_uri() + "/"


def fixture_md5() -> dict:
    return {name: hashlib.md5((FIXTURE / name).read_bytes()).hexdigest() for name in MNIST_FILES.values()}


def test_load_from_file_url(tmp_path: Path) -> None:
    data = load_mnist(tmp_path, base_url=URL, md5=fixture_md5())
    assert data.x_train.shape == (5, 28, 28) and data.x_test.shape == (3, 28, 28)
    assert data.x_train.dtype == np.uint8 and data.y_train.dtype == np.int64
    assert data.y_train.tolist() == [0, 3, 5, 7, 9] and data.y_test.tolist() == [1, 4, 8]
    for x, y in zip(np.concatenate([data.x_train, data.x_test]), np.concatenate([data.y_train, data.y_test])):
        bright_columns = np.flatnonzero(x.max(axis=0) == 255)
        assert bright_columns.tolist() == [2 + 2 * y, 3 + 2 * y]
    assert sorted(p.name for p in (tmp_path / "mnist").iterdir()) == sorted(MNIST_FILES.values())


def test_checksum_mismatch_is_reported(tmp_path: Path) -> None:
    with pytest.raises(ChecksumError, match="MD5"):
        fetch_mnist(tmp_path, base_url=URL)  # the published digests are not the fixture's


def test_offline_error_names_url_and_folder(tmp_path: Path) -> None:
    with pytest.raises(DatasetUnavailableError) as info:
        fetch_mnist(tmp_path, base_url="http://127.0.0.1:9/mnist/", timeout=5)
    msg = str(info.value)
    assert "127.0.0.1:9" in msg and str(tmp_path / "mnist") in msg and "offline" in msg


def test_files_placed_by_hand_are_used(tmp_path: Path) -> None:
    shutil.copytree(FIXTURE, tmp_path / "mnist")
    data = load_mnist(tmp_path, base_url="http://127.0.0.1:9/", md5=None)
    assert len(data.y_train) == 5


def test_read_idx_rejects_bad_files(tmp_path: Path) -> None:
    bad_magic = tmp_path / "bad.gz"
    with gzip.open(bad_magic, "wb") as fh:
        fh.write(bytes([0, 0, 0x0D, 1, 0, 0, 0, 1, 0, 0, 0, 0]))
    with pytest.raises(ValueError, match="unsigned bytes"):
        read_idx(bad_magic)
    short = tmp_path / "short.gz"
    with gzip.open(short, "wb") as fh:
        fh.write(bytes([0, 0, 0x08, 1, 0, 0, 0, 5, 1, 2]))
    with pytest.raises(ValueError, match="needs 5"):
        read_idx(short)
    not_gzip = tmp_path / "plain.gz"
    not_gzip.write_bytes(b"hello")
    with pytest.raises(ValueError, match="not a readable"):
        read_idx(not_gzip)


def test_bad_arguments() -> None:
    with pytest.raises(TypeError, match="base_url"):
        fetch_mnist(base_url="")
    with pytest.raises(TypeError, match="md5"):
        fetch_mnist(md5="abc")
