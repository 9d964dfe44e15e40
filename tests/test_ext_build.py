"""kernels._ext: an interrupted build never blocks later ones, and a build that cannot finish
in time falls back to the pure-torch kernels with a clear message.

Each scenario runs in child processes with ``NN_KERNELS_EXT_DIR`` pointing at a temporary
folder, so the repository's own build is never touched. Before the fix, the stale lock
made every later build wait forever (these tests then fail on their time limit).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from isolated import ROOT, describe, run_isolated
from kernels import _ext

CHECK_FALLBACK = """
    import warnings
    import torch
    from kernels import _ext
    from kernels.hadamard import fwht, fwht_torch
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        x = torch.randn(3, 8, dtype=torch.float64)
        y = fwht(x)   # must come back (torch fallback or compiled), never hang
        torch.testing.assert_close(y, fwht_torch(x))
        print("available", _ext.extension_available())
    for w in caught:
        print("WARNING", str(w.message).replace("\\n", " | "))
"""


def _built_copy(tmp_path: Path) -> Path:
    """A copy of the repository's compiled extension in ``tmp_path`` (no compile needed)."""
    src = _ext.build().__file__  # builds the repository's copy if needed
    src_dir = Path(src).parent
    dest = tmp_path / src_dir.name
    shutil.copytree(src_dir, dest, ignore=shutil.ignore_patterns("lock", "nnk_build.lock"))
    return dest


def test_stale_lock_from_an_interrupted_build_is_removed_with_a_warning(tmp_path: Path) -> None:
    build_dir = _built_copy(tmp_path)
    (build_dir / "lock").touch()  # what cpp_extension leaves when its build is killed
    proc = run_isolated(CHECK_FALLBACK, timeout=120, env={"NN_KERNELS_EXT_DIR": str(tmp_path)})
    assert proc.returncode == 0, describe(proc)
    assert "available True" in proc.stdout, proc.stdout
    assert "removing the stale build lock" in proc.stdout and str(build_dir / "lock") in proc.stdout
    assert not (build_dir / "lock").exists()


def test_killed_first_build_then_timeout_falls_back_to_torch(tmp_path: Path) -> None:
    """Kill a real first compile half-way (as Ctrl-C or a dead Jupyter kernel would), then
    build again with a time limit too short to compile: a warning, the torch fallback."""
    env = dict(os.environ, NN_KERNELS_EXT_DIR=str(tmp_path))
    build = subprocess.Popen([sys.executable, "-m", "kernels._ext", "--here"], cwd=ROOT, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    lock = tmp_path / _ext.build_directory().name / "lock"
    try:
        deadline = time.monotonic() + 120
        while not lock.exists() and build.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert lock.exists(), "the build never started"
    finally:
        os.killpg(build.pid, signal.SIGKILL)
        build.wait()
    assert lock.exists(), "the killed build should leave cpp_extension's lock behind"
    start = time.monotonic()
    proc = run_isolated(CHECK_FALLBACK, timeout=120,
                        env={"NN_KERNELS_EXT_DIR": str(tmp_path), "NN_KERNELS_EXT_TIMEOUT": "4"})
    assert proc.returncode == 0, describe(proc)
    assert time.monotonic() - start < 60
    assert "available False" in proc.stdout, proc.stdout
    assert "Falling back to the pure-torch implementations" in proc.stdout
    assert "did not finish within 4 s" in proc.stdout or "removing the stale build lock" in proc.stdout


def test_waiting_for_another_build_is_bounded_and_names_its_pid(tmp_path: Path) -> None:
    build_dir = tmp_path / _ext.build_directory().name
    build_dir.mkdir()
    fd = os.open(build_dir / "nnk_build.lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, str(os.getpid()).encode())
        start = time.monotonic()
        proc = run_isolated(CHECK_FALLBACK, timeout=120,
                            env={"NN_KERNELS_EXT_DIR": str(tmp_path), "NN_KERNELS_EXT_TIMEOUT": "15"})
        elapsed = time.monotonic() - start
    finally:
        os.close(fd)
    assert proc.returncode == 0, describe(proc)
    assert elapsed < 60
    assert "available False" in proc.stdout
    assert f"another process (pid {os.getpid()})" in proc.stdout, proc.stdout


def test_bad_timeout_setting_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NN_KERNELS_EXT_TIMEOUT", "soon")
    with pytest.raises(RuntimeError, match="NN_KERNELS_EXT_TIMEOUT must be a number of seconds"):
        _ext.build_timeout()
    monkeypatch.setenv("NN_KERNELS_EXT_TIMEOUT", "30")
    assert _ext.build_timeout() == 30.0
    monkeypatch.delenv("NN_KERNELS_EXT_TIMEOUT")
    assert _ext.build_timeout() == _ext.DEFAULT_TIMEOUT_S


def test_error_propagation_probe_tells_a_crash_from_an_error(monkeypatch) -> None:
    """The probe answers True with the pinned toolchain (a C++ error arrives as a
    RuntimeError) and False, without crashing us, when the child dies of a signal."""
    import torch

    pinned = [line.split("==")[1].strip() for line in (ROOT / "constraints.txt").read_text().splitlines()
              if line.startswith("torch==")]
    ok, how = _ext._probe_error_propagation()
    if pinned and torch.__version__.split("+")[0] == pinned[0]:
        assert ok and how == "", how  # the pinned torch and the local g++ agree
    else:  # another torch (the GPU machine's torch 2.11 + g++ 13.3 crashes): either answer
        assert ok or "SIGSEGV" in how or "SIGABRT" in how, how
    monkeypatch.setattr(_ext, "_PROBE", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)")
    ok, how = _ext._probe_error_propagation()
    assert not ok and "SIGSEGV" in how
    monkeypatch.setattr(_ext, "_PROBE", "raise SystemExit(3)")
    ok, how = _ext._probe_error_propagation()
    assert not ok and "status 3" in how
