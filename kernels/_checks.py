"""Argument validation at the package's public boundary.

Every public function checks its inputs with these helpers so that bad input fails
with a ``ValueError``/``TypeError`` naming the argument and what was expected,
instead of a shape error deep inside torch. Internal helpers trust their callers.
"""

from __future__ import annotations

from typing import Any, Collection, Optional, Sequence

import torch

from kernels.device import check_tensor_device

__all__ = [
    "check_tensor",
    "check_same_dtype",
    "check_nonempty",
    "check_positive_int",
    "check_nonnegative_float",
    "check_positive_float",
    "check_choice",
    "check_same_feature_dim",
]


def check_tensor(
    name: str,
    value: Any,
    *,
    ndim: Optional[int | Sequence[int]] = None,
    floating: bool = True,
    finite: bool = True,
) -> torch.Tensor:
    """Check that ``value`` is a tensor on a supported device (CPU or CUDA, see
    :mod:`kernels.device`) of the expected rank, dtype kind and finiteness."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    check_tensor_device(name, value)
    if ndim is not None:
        allowed = (ndim,) if isinstance(ndim, int) else tuple(ndim)
        if value.ndim not in allowed:
            want = " or ".join(str(a) for a in allowed)
            raise ValueError(
                f"{name} must have {want} dimension(s), got shape {tuple(value.shape)}"
            )
    if floating and not value.is_floating_point():
        raise TypeError(
            f"{name} must have a floating-point dtype (float32 or float64), got {value.dtype}"
        )
    if finite and value.is_floating_point() and not bool(torch.isfinite(value).all()):
        raise ValueError(f"{name} contains NaN or infinite values")
    return value


def check_positive_int(name: str, value: Any) -> int:
    """Check that ``value`` is a Python/NumPy integer > 0 (booleans rejected)."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"{name} must be a positive integer, got {value!r}")
    value = int(value)
    if value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value}")
    return value


def _check_real(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) and not hasattr(
        value, "__float__"
    ):
        raise TypeError(f"{name} must be a real number, got {value!r}")
    out = float(value)
    if out != out or out in (float("inf"), float("-inf")):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return out


def check_nonnegative_float(name: str, value: Any) -> float:
    """Check that ``value`` is a finite real number >= 0."""
    out = _check_real(name, value)
    if out < 0:
        raise ValueError(f"{name} must be >= 0, got {value!r}")
    return out


def check_positive_float(name: str, value: Any) -> float:
    """Check that ``value`` is a finite real number > 0."""
    out = _check_real(name, value)
    if out <= 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")
    return out


def check_choice(name: str, value: Any, choices: Collection[str]) -> str:
    """Check that ``value`` is one of the allowed strings."""
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name} must be one of {sorted(choices)}, got {value!r}")
    return value


def check_same_feature_dim(name1: str, x1: torch.Tensor, name2: str, x2: torch.Tensor) -> None:
    """Check that two (n, d) inputs share their trailing feature dimension."""
    if x1.shape[-1] != x2.shape[-1]:
        raise ValueError(
            f"{name1} and {name2} must have the same feature dimension, got "
            f"{x1.shape[-1]} ({name1}) and {x2.shape[-1]} ({name2})"
        )


def check_same_dtype(*named: tuple[str, torch.Tensor]) -> None:
    """Check that ``(name, tensor)`` pairs share one dtype (a mixed float32/float64 or
    float16/float32 pair otherwise fails inside a matmul with a message naming neither)."""
    (first, x), *rest = named
    for name, y in rest:
        if y.dtype != x.dtype:
            raise TypeError(
                f"{first} and {name} must have the same dtype, got {x.dtype} ({first}) and "
                f"{y.dtype} ({name}); convert one of them with .to()"
            )


def check_nonempty(name: str, value: torch.Tensor, dim: int, what: str) -> None:
    """Check that ``value.shape[dim] >= 1`` (``what`` names that dimension: "row", "column")."""
    if value.shape[dim] < 1:
        raise ValueError(f"{name} must have at least one {what}, got shape {tuple(value.shape)}")


def cpu_generator(generator: object) -> "torch.Generator":
    """The package convention for random draws: an explicit CPU ``torch.Generator``; ``None``
    gives a fresh one seeded with 0, so results never depend on torch's global generator."""
    if generator is None:
        return torch.Generator().manual_seed(0)
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
    if generator.device.type != "cpu":
        raise ValueError(f"generator must be a CPU torch.Generator (draws happen on the CPU), got {generator.device}")
    return generator
