"""Device selection shared by every module.

``kernels`` runs on the CPU everywhere. When torch sees a CUDA device it is used by
default; CuPy is optional and its absence (or the absence of a GPU) is never an error.
"""

from __future__ import annotations

import importlib.util
from typing import Optional, Union

import torch

__all__ = ["default_device", "resolve_device", "cupy_available"]


def default_device() -> torch.device:
    """Return ``cuda`` when torch sees a GPU, otherwise ``cpu``."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def resolve_device(device: Optional[Union[str, torch.device]] = None) -> torch.device:
    """Turn a user's ``device`` argument into a :class:`torch.device`.

    ``None`` means :func:`default_device`. Asking for CUDA on a machine without a GPU
    is a :class:`ValueError` that says so, rather than a failure deep inside torch.
    """
    if device is None:
        return default_device()
    if not isinstance(device, (str, torch.device)):
        raise TypeError(
            f"device must be None, a str or a torch.device, got {type(device).__name__}"
        )
    try:
        dev = torch.device(device)
    except RuntimeError as exc:
        raise ValueError(f"device: cannot parse {device!r} as a torch device ({exc})") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={device!r} was requested but torch sees no CUDA GPU")
    return dev


def cupy_available() -> bool:
    """True when CuPy is importable *and* a CUDA device is usable through it."""
    if importlib.util.find_spec("cupy") is None:
        return False
    try:
        import cupy  # type: ignore[import-not-found]

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # no driver, no device, broken install: all mean "not available"
        return False
