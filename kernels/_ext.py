"""Build and load the compiled CPU kernels of chapter 5 (``kernels/csrc/lookup_cpu.cpp``).

The extension holds the fast Walsh-Hadamard transform (:func:`kernels.hadamard.fwht`)
and the fused LookupFFN inference kernel (:func:`kernels.lookup.lookup_forward_fused`).
It is compiled with ``torch.utils.cpp_extension.load`` (g++ and ninja) the first time it
is needed -- or ahead of time by::

    .venv/bin/python -m kernels._ext      # what book/tools/setup_env.sh runs

into ``_build/torch_extensions/`` at the repository root (git-ignored), or into
``$NN_KERNELS_EXT_DIR`` when that is set. Flags: ``-O3 -march=native -fopenmp
-ffast-math`` (``-ffast-math`` lets g++ vectorise ``exp`` with glibc's vector maths
library; the kernels do not rely on IEEE corner cases: their inputs are checked to be
finite). Because ``-march=native`` ties the binary to the CPU it was built on, the
module name carries a digest of the CPU's model and flags: another CPU builds its own.

Concurrency: a lock serialises builds within a process, and ``cpp_extension`` takes a
file lock in the build directory, so parallel processes (pytest workers, several
notebooks) wait for one build instead of racing. When the build fails -- no compiler,
say -- :func:`load_extension` returns ``None`` after one :class:`RuntimeWarning` that
quotes the error, and the callers fall back to their pure-torch implementations;
:func:`build` (and the ``python -m kernels._ext`` command) raises instead.
"""

from __future__ import annotations

import hashlib
import os
import platform
import sys
import threading
import warnings
from pathlib import Path
from types import ModuleType
from typing import Optional

__all__ = ["build", "load_extension", "extension_available", "build_directory", "SOURCE"]

SOURCE = Path(__file__).resolve().parent / "csrc" / "lookup_cpu.cpp"
_CFLAGS = ["-O3", "-march=native", "-fopenmp", "-ffast-math"]
_LDFLAGS = ["-fopenmp", "-lmvec"]

_lock = threading.Lock()
_module: Optional[ModuleType] = None
_failure: Optional[str] = None


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


def _module_name() -> str:
    return f"nnk_lookup_cpu_{_cpu_digest()}"


def build_directory() -> Path:
    """Where the extension is compiled: ``$NN_KERNELS_EXT_DIR`` or ``<repo>/_build/torch_extensions``."""
    env = os.environ.get("NN_KERNELS_EXT_DIR")
    base = Path(env) if env else Path(__file__).resolve().parents[1] / "_build" / "torch_extensions"
    return base / _module_name()


def build(verbose: bool = False) -> ModuleType:
    """Compile (if needed) and import the extension; raise ``RuntimeError`` on failure.

    Idempotent and cheap once built: ninja sees that nothing changed.
    """
    global _module, _failure
    with _lock:
        if _module is not None:
            return _module
        from torch.utils.cpp_extension import load

        directory = build_directory()
        directory.mkdir(parents=True, exist_ok=True)
        try:
            _module = load(
                name=_module_name(),
                sources=[str(SOURCE)],
                extra_cflags=_CFLAGS,
                extra_ldflags=_LDFLAGS,
                build_directory=str(directory),
                verbose=verbose,
            )
        except Exception as exc:  # compiler missing, compile error, ...
            _failure = f"{type(exc).__name__}: {exc}"
            raise RuntimeError(
                f"building the CPU extension {SOURCE.name} in {directory} failed: {_failure}"
            ) from exc
        _failure = None
        return _module


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
        description="Compile chapter 5's C++ kernels (kernels/csrc/lookup_cpu.cpp) now, into "
                    f"{build_directory().parent} (or $NN_KERNELS_EXT_DIR), so that the first "
                    "fwht/LookupFFN call does not pay for it. Idempotent.")
    ap.add_argument("--verbose", action="store_true", help="show the compiler's output")
    args = ap.parse_args(argv)
    try:
        module = build(verbose=args.verbose)
    except RuntimeError as exc:
        print(f"kernels._ext: {exc}", file=sys.stderr)
        return 1
    print(f"kernels._ext: built {module.__name__} in {build_directory()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
