"""Build and load the compiled CPU kernels of chapter 5 (``kernels/csrc/``: ``hadamard_cpu.cpp``, ``lookup_cpu.cpp``).

The extension holds the fast Walsh-Hadamard transform (:func:`kernels.hadamard.fwht`)
and the fused LookupFFN inference kernel (:func:`kernels.lookup.lookup_forward_fused`).
It is compiled with ``torch.utils.cpp_extension.load`` (g++ and ninja) the first time it
is needed -- or ahead of time by::

    .venv/bin/python -m kernels._ext      # what book/tools/setup_env.sh runs

into ``_build/torch_extensions/`` at the repository root (git-ignored), or into
``$NN_KERNELS_EXT_DIR`` when that is set. Flags: ``-O3 -march=native -fopenmp
-ffast-math`` (``-ffast-math`` lets g++ vectorise ``exp`` with glibc's vector maths
library). Inputs are *not* checked to be finite: with NaN or infinite entries the fast
kernels return unspecified values (they may differ from the pure-torch path), but the
table rows they read are indexed by sign bits, so no input can make them read out of
bounds. Because ``-march=native`` ties the binary to the CPU it was built on, the module
name carries a digest of the CPU's model and flags: another CPU builds its own.
``NN_KERNELS_EXT_DEBUG=1`` builds a separate debug module (``-O1 -g -DNNK_DEBUG``) whose
inner loops also check every index they compute.

Every Python wrapper validates its arguments before calling the kernels, and the C++
entry points check shapes, dtypes and sizes again, so a bad argument is a
``ValueError``/``TypeError`` (or, for a direct call of the compiled module, a
``RuntimeError``), never a crash. (One exception: with a torch built by another C++
toolchain than the local g++, a C++ error cannot reach Python at all and kills the
interpreter; :func:`cpp_errors_propagate` detects that once and warns. The Python checks
still stand in front of every compiled call, so only direct calls are exposed.)

Concurrency and interrupted builds. A compile takes about a minute. It runs in a child
process (``python -m kernels._ext``) that holds an exclusive ``fcntl`` lock on
``<build dir>/nnk_build.lock`` (with its process id in the file) while it builds; other
processes wait for that lock instead of racing. The kernel drops the lock when its owner
dies, so an interrupted build (Ctrl-C, a killed Jupyter kernel) never blocks anybody;
what it may leave behind is ``cpp_extension``'s own lock file ``<build dir>/lock``, on
which ``cpp_extension`` would otherwise wait forever. Whoever holds our lock knows that
nobody is building, so it removes such a stale file with a :class:`RuntimeWarning` that
names it. Waiting and compiling together take at most ``$NN_KERNELS_EXT_TIMEOUT`` seconds
(default 900); past that the child is killed.

When the build fails or times out -- no compiler, say -- :func:`load_extension` returns
``None`` after one :class:`RuntimeWarning` that quotes the error, and the callers fall
back to their pure-torch implementations; :func:`build` (and the ``python -m
kernels._ext`` command) raises instead.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import platform
import signal
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path
from types import ModuleType
from typing import Iterator, Optional

__all__ = [
    "build",
    "cpp_errors_propagate",
    "load_extension",
    "extension_available",
    "build_directory",
    "build_timeout",
    "SOURCE",
    "SOURCES",
    "HEADERS",
    "TIMEOUT_ENV_VAR",
    "DEBUG_ENV_VAR",
    "DEFAULT_TIMEOUT_S",
]

_CSRC = Path(__file__).resolve().parent / "csrc"
#: The source that defines the extension module (the fused LookupFFN kernels).
SOURCE = _CSRC / "lookup_cpu.cpp"
#: Every source compiled into the module: the FWHT of :mod:`kernels.hadamard` has its own.
SOURCES = (SOURCE, _CSRC / "hadamard_cpu.cpp")
#: The headers they share (a change to one rebuilds the module too).
HEADERS = (_CSRC / "common.h", _CSRC / "fwht.h")
_CFLAGS = ["-O3", "-march=native", "-fopenmp", "-ffast-math"]
_DEBUG_CFLAGS = ["-O1", "-g", "-march=native", "-fopenmp", "-DNNK_DEBUG"]
_LDFLAGS = ["-fopenmp", "-lmvec"]

#: Seconds that waiting for another build and compiling may take together.
TIMEOUT_ENV_VAR = "NN_KERNELS_EXT_TIMEOUT"
DEFAULT_TIMEOUT_S = 900.0
#: ``1`` builds the debug module (index checks in the inner loops).
DEBUG_ENV_VAR = "NN_KERNELS_EXT_DEBUG"
#: Extra compiler flags (whitespace-separated), appended after the usual ones; the module
#: name then carries their digest, so such a build never replaces the normal one. Used by
#: the tests to build the AVX2 and portable paths on an AVX-512 machine
#: (``-mno-avx512f``, ``-mno-avx``).
EXTRA_CFLAGS_ENV_VAR = "NN_KERNELS_EXT_EXTRA_CFLAGS"
#: Our lock (fcntl, released by the kernel when its owner dies) and cpp_extension's
#: (a plain file that an interrupted build leaves behind).
_OUR_LOCK = "nnk_build.lock"
#: Set by a parent for its child build: the wall-clock time (``time.time()``) to give up at.
_DEADLINE_ENV_VAR = "_NN_KERNELS_EXT_DEADLINE"
_TORCH_LOCK = "lock"

_lock = threading.Lock()
_module: Optional[ModuleType] = None
_failure: Optional[str] = None


def _debug() -> bool:
    return os.environ.get(DEBUG_ENV_VAR, "") not in ("", "0")


def _cpu_digest() -> str:
    """Digest of the CPU model and feature flags (``-march=native`` depends on them)."""
    text = platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("model name", "flags")):
                text += line
                if line.startswith("flags"):
                    break
    except OSError:
        pass
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def _extra_cflags() -> list[str]:
    return os.environ.get(EXTRA_CFLAGS_ENV_VAR, "").split()


def _module_name() -> str:
    extra = _extra_cflags()
    suffix = "_x" + hashlib.sha256(" ".join(extra).encode()).hexdigest()[:8] if extra else ""
    return f"nnk_lookup_cpu_{_cpu_digest()}" + ("_debug" if _debug() else "") + suffix


def build_directory() -> Path:
    """Where the extension is compiled: ``$NN_KERNELS_EXT_DIR`` or ``<repo>/_build/torch_extensions``."""
    env = os.environ.get("NN_KERNELS_EXT_DIR")
    base = Path(env) if env else Path(__file__).resolve().parents[1] / "_build" / "torch_extensions"
    return base / _module_name()


def build_timeout() -> float:
    """``$NN_KERNELS_EXT_TIMEOUT`` (seconds > 0), else :data:`DEFAULT_TIMEOUT_S`."""
    raw = os.environ.get(TIMEOUT_ENV_VAR)
    if not raw:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0 or value == float("inf"):
        raise RuntimeError(f"{TIMEOUT_ENV_VAR} must be a number of seconds > 0, got {raw!r}")
    return value


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def _build_lock(directory: Path, timeout: float) -> Iterator[None]:
    """Hold the exclusive build lock of ``directory`` (waiting at most ``timeout`` s).

    While it is held nobody else builds here, so a leftover ``cpp_extension`` lock file
    is stale: it is removed with a warning naming it.
    """
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not Linux/macOS: no lock, as before
        yield
        return
    path = directory / _OUR_LOCK
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
                    raise TimeoutError(
                        f"another process (pid {holder}) has been building the extension in "
                        f"{directory} for more than {timeout:.0f} s; gave up waiting "
                        f"(${TIMEOUT_ENV_VAR} sets the limit)"
                    ) from None
                time.sleep(0.2)
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        stale = directory / _TORCH_LOCK
        if stale.exists():
            warnings.warn(
                f"removing the stale build lock {stale}: an earlier build of the extension "
                "was interrupted (Ctrl-C or a killed kernel) and left it behind; nobody is "
                "building now, so it would only block every later build",
                RuntimeWarning,
                stacklevel=3,
            )
            with contextlib.suppress(FileNotFoundError):
                stale.unlink()
        try:
            yield
        finally:
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _load_here(directory: Path, verbose: bool, timeout: float) -> ModuleType:
    """``cpp_extension.load`` in this process, under the build lock."""
    from torch.utils.cpp_extension import load

    with _build_lock(directory, timeout):
        return load(
            name=_module_name(),
            sources=[str(s) for s in SOURCES],
            extra_cflags=(_DEBUG_CFLAGS if _debug() else _CFLAGS) + _extra_cflags(),
            extra_ldflags=_LDFLAGS,
            build_directory=str(directory),
            verbose=verbose,
        )


def _needs_compile(directory: Path) -> bool:
    library = directory / f"{_module_name()}.so"
    try:
        return library.stat().st_mtime < max(f.stat().st_mtime for f in SOURCES + HEADERS)
    except FileNotFoundError:
        return True


def _compile_in_child(directory: Path, timeout: float, verbose: bool) -> None:
    """Run ``python -m kernels._ext --here`` with a time limit; raise on failure."""
    cmd = [sys.executable, "-m", "kernels._ext", "--here"] + (["--verbose"] if verbose else [])
    # The child gives up waiting for another build a little before we stop it, so that
    # its message (who holds the lock) is the one the user sees.
    child_timeout = max(1.0, timeout - max(2.0, 0.05 * timeout))
    env = dict(os.environ, NN_KERNELS_EXT_DIR=str(directory.parent),
               **{TIMEOUT_ENV_VAR: str(child_timeout), _DEADLINE_ENV_VAR: str(time.time() + child_timeout)})
    env["PYTHONPATH"] = os.pathsep.join(
        [str(Path(__file__).resolve().parents[1])] + [p for p in [env.get("PYTHONPATH")] if p]
    )
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # the child, ninja and the compiler
        proc.communicate()
        raise TimeoutError(
            f"the build did not finish within {timeout:.0f} s and was stopped "
            f"(${TIMEOUT_ENV_VAR} sets the limit; `python -m kernels._ext --verbose` shows "
            "the compiler's output)"
        ) from None
    except BaseException:  # Ctrl-C while waiting: stop the child too
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    if verbose and out:
        print(out, file=sys.stderr, end="")
    if proc.returncode != 0:
        lines = (out or "").strip().splitlines()
        last = lines[-1] if lines else ""
        if last.startswith("kernels._ext: "):  # the child's own one-line explanation
            raise RuntimeError(last[len("kernels._ext: "):])
        raise RuntimeError(f"exit status {proc.returncode}:\n" + "\n".join(lines[-15:]))


def build(verbose: bool = False) -> ModuleType:
    """Compile (if needed) and import the extension; raise ``RuntimeError`` on failure.

    A compile runs in a child process limited to :func:`build_timeout` seconds (waiting
    for another process's build included). Idempotent and cheap once built.
    """
    global _module, _failure
    with _lock:
        if _module is not None:
            return _module
        directory = build_directory()
        try:
            timeout = build_timeout()
            directory.mkdir(parents=True, exist_ok=True)
            start = time.monotonic()
            if _needs_compile(directory):
                _compile_in_child(directory, timeout, verbose)
            remaining = max(timeout - (time.monotonic() - start), 5.0)
            _module = _load_here(directory, verbose, remaining)
        except Exception as exc:  # compiler missing, compile error, timeout, ...
            _failure = f"{type(exc).__name__}: {exc}"
            raise RuntimeError(
                f"building the CPU extension {SOURCE.name} in {directory} failed: {_failure}"
            ) from exc
        _failure = None
        return _module


_PROBE = """
import torch
from kernels._ext import build
try:
    build().raise_error(torch.zeros(2))
except RuntimeError:
    print("propagates")
"""


def _probe_error_propagation() -> tuple[bool, str]:
    """Call the module's ``raise_error`` in a child process: ``(True, "")`` when the C++
    error arrives as a ``RuntimeError``, else ``(False, how the child ended)``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(Path(__file__).resolve().parents[1])] + [p for p in [env.get("PYTHONPATH")] if p]
    )
    try:
        proc = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True,
                              text=True, timeout=max(60.0, build_timeout()))
    except subprocess.TimeoutExpired:
        return False, "the probe did not finish"
    if proc.returncode == 0 and proc.stdout.strip() == "propagates":
        return True, ""
    if proc.returncode < 0:
        return False, f"the probe was killed by {signal.Signals(-proc.returncode).name}"
    return False, f"the probe exited with status {proc.returncode}: {proc.stderr.strip()[-300:]}"


_propagates: Optional[bool] = None


def cpp_errors_propagate() -> bool:
    """Whether an error raised inside the compiled module reaches Python as a ``RuntimeError``.

    It does with the pinned environment. With a torch built by another C++ toolchain than
    the local g++ (seen with a CUDA build of torch 2.11 and Ubuntu's g++ 13.3), *any*
    ``TORCH_CHECK`` that fails inside an extension kills the interpreter with SIGSEGV.
    Normal use is safe there too, because every wrapper in ``kernels`` validates its
    arguments in Python before the compiled call; what is unsafe is a direct call of the
    compiled module with bad arguments, and the debug build (``NN_KERNELS_EXT_DEBUG=1``),
    whose index checks are C++ errors. Checked once per compiled module in a child
    process; the answer is kept beside the module (``<module>.errors``).
    """
    global _propagates
    if _propagates is not None:
        return _propagates
    directory = build_directory()
    library = directory / f"{_module_name()}.so"
    marker = directory / f"{_module_name()}.errors"
    build()
    stamp = str(library.stat().st_mtime_ns)
    try:
        saved = marker.read_text().split()
    except OSError:
        saved = []
    if len(saved) >= 2 and saved[0] == stamp:
        _propagates = saved[1] == "propagate"
        return _propagates
    ok, how = _probe_error_propagation()
    tmp = marker.with_name(f"{marker.name}.{os.getpid()}.tmp")
    tmp.write_text(f"{stamp} {'propagate' if ok else 'crash'}\n")
    os.replace(tmp, marker)
    if not ok:
        import torch

        warnings.warn(
            f"an error raised inside the compiled kernels crashes this interpreter ({how}): "
            f"torch {torch.__version__} and the local C++ compiler do not share a C++ runtime. "
            "kernels checks every argument in Python before a compiled call, so normal use "
            "is safe; direct calls of the compiled module with bad arguments and the debug "
            f"build (${DEBUG_ENV_VAR}=1) are not.",
            RuntimeWarning,
            stacklevel=2,
        )
    _propagates = ok
    return ok


def load_extension() -> Optional[ModuleType]:
    """The compiled module, or ``None`` (after one warning) when it cannot be built."""
    global _failure
    if _module is not None:
        return _module
    if _failure is not None:
        return None
    try:
        return build()
    except RuntimeError as exc:
        warnings.warn(
            f"{exc}\nFalling back to the pure-torch implementations (slower).",
            RuntimeWarning,
            stacklevel=2,
        )
        return None


def extension_available() -> bool:
    """True when the compiled kernels can be used (building them if needed)."""
    return load_extension() is not None


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(
        prog="python -m kernels._ext",
        description="Compile chapter 5's C++ kernels (kernels/csrc/) now, into "
                    f"{build_directory().parent} (or $NN_KERNELS_EXT_DIR), so that the first "
                    "fwht/LookupFFN call does not pay for it. Idempotent. Gives up after "
                    f"${TIMEOUT_ENV_VAR} seconds (default {DEFAULT_TIMEOUT_S:.0f}); removes "
                    "the stale lock an interrupted build leaves behind.")
    ap.add_argument("--verbose", action="store_true", help="show the compiler's output")
    ap.add_argument("--here", action="store_true",
                    help="compile in this process, without a time limit of its own (what "
                         "the child process of a build runs)")
    args = ap.parse_args(argv)
    try:
        if args.here:
            directory = build_directory()
            directory.mkdir(parents=True, exist_ok=True)
            import torch.utils.cpp_extension  # noqa: F401  (slow; before the clock starts)

            deadline = os.environ.get(_DEADLINE_ENV_VAR)
            timeout = float(deadline) - time.time() if deadline else build_timeout()
            module = _load_here(directory, args.verbose, max(timeout, 0.5))
        else:
            module = build(verbose=args.verbose)
    except Exception as exc:  # compile errors, timeouts, a missing compiler
        print(f"kernels._ext: {type(exc).__name__}: {exc}" if args.here else f"kernels._ext: {exc}",
              file=sys.stderr)
        return 1
    print(f"kernels._ext: built {module.__name__} in {build_directory()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
