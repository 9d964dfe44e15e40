"""Device selection and device checks shared by every module.

``kernels`` computes on the CPU everywhere and on CUDA GPUs when torch sees one; other
torch devices (``mps``, ``meta``, ``xla``, ...) are not supported and are refused with a
message naming the argument, rather than failing deep inside torch (a ``meta`` tensor,
for example, cannot answer the finiteness checks). Every public function validates its
tensors through :func:`kernels._checks.check_tensor`, which calls
:func:`check_tensor_device`. CuPy is optional and its absence (or the absence of a GPU)
is never an error.
"""

from __future__ import annotations

import importlib.util
from typing import Any, Optional, Union

import torch

__all__ = [
    "SUPPORTED_DEVICE_TYPES",
    "default_device",
    "resolve_device",
    "check_tensor_device",
    "cupy_available",
]

#: The torch device types kernels computes on.
SUPPORTED_DEVICE_TYPES = ("cpu", "cuda")


def default_device() -> torch.device:
    """Return ``cuda`` when torch sees a GPU, otherwise ``cpu``."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def resolve_device(device: Optional[Union[str, torch.device]] = None) -> torch.device:
    """Turn a user's ``device`` argument into a :class:`torch.device`.

    ``None`` means :func:`default_device`. Accepted: ``"cpu"`` (``"cpu:0"``, the only
    CPU device torch has) and ``"cuda"``/``"cuda:i"`` for a GPU torch sees. Anything else
    -- ``"mps"``, ``"meta"``, ``"cpu:7"``, CUDA on a machine without a GPU, ``"cuda:3"``
    with two GPUs -- is a :class:`ValueError` that says why.
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
    if dev.type not in SUPPORTED_DEVICE_TYPES:
        raise ValueError(
            f"device={device!r} is not supported: kernels runs on 'cpu' and 'cuda' devices only"
        )
    if dev.type == "cpu" and dev.index not in (None, 0):
        raise ValueError(f"device={device!r}: torch has a single CPU device, use 'cpu'")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device={device!r} was requested but torch sees no CUDA GPU")
        count = torch.cuda.device_count()
        if dev.index is not None and dev.index >= count:
            raise ValueError(
                f"device={device!r} was requested but torch sees {count} CUDA GPU(s) "
                f"(cuda:0 .. cuda:{count - 1})"
            )
    return dev


def check_tensor_device(name: str, value: Any) -> None:
    """Refuse a tensor on a device kernels does not compute on (``meta``, ``mps``, ...)."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    kind = value.device.type
    if kind not in SUPPORTED_DEVICE_TYPES:
        raise ValueError(
            f"{name} is on the {kind!r} device; kernels computes on the CPU or a CUDA GPU "
            "(move it with .to('cpu') or .to('cuda'))"
        )


def cupy_available() -> bool:
    """True when CuPy is importable *and* a CUDA device is usable through it."""
    if importlib.util.find_spec("cupy") is None:
        return False
    try:
        import cupy  # type: ignore[import-not-found]

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # no driver, no device, broken install: all mean "not available"
        return False
