"""Small local checks and initialisation helpers shared by the Toeplitz operators
(flags, decay rate, sequence shape -- the generator and dtype checks are
:func:`kernels._checks.check_generator` and :func:`kernels._checks.check_float_dtype`; the initialised linear layers and
activations of the RPE MLPs and the TNN blocks).

Part of :mod:`kernels.toeplitz` (chapter 4, ``chapters/04_toeplitz.ipynb``); private to the package.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Optional

import torch
from torch import Tensor, nn

from kernels._checks import check_tensor

__all__: list[str] = []


# --------------------------------------------------------------------------------------
# Small local checks and initialisation helpers
# --------------------------------------------------------------------------------------


def _check_bool(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {value!r}")
    return value



def _check_decay(decay: object) -> float:
    if isinstance(decay, bool) or not isinstance(decay, numbers.Real):
        raise TypeError(f"decay (lambda) must be a real number in (0, 1), got {decay!r}")
    value = float(decay)
    if not 0.0 < value < 1.0:
        raise ValueError(f"decay (lambda) must lie in the open interval (0, 1), got {decay!r}")
    return value



def _check_sequence(x: Any, channels: int, dtype: torch.dtype) -> Tensor:
    """Module-boundary check of a ``(..., n, channels)`` input (no finiteness pass)."""
    x = check_tensor("x", x, finite=False)
    if x.ndim < 2 or x.shape[-1] != channels:
        raise ValueError(
            f"x must have shape (..., n, {channels}) (channels last), got shape "
            f"{tuple(x.shape)}"
        )
    if x.shape[-2] < 1:
        raise ValueError("x must have at least one token (x.shape[-2] >= 1)")
    if x.dtype != dtype:
        raise TypeError(
            f"x has dtype {x.dtype} but the module's parameters are {dtype}; convert one "
            f"of them (e.g. module.to({x.dtype}))"
        )
    return x



def _linear(
    in_features: int,
    out_features: int,
    generator: Optional[torch.Generator],
    dtype: torch.dtype,
    bias: bool = True,
) -> nn.Linear:
    """``nn.Linear`` with torch's default init, drawn from ``generator`` only."""
    layer = torch.nn.utils.skip_init(nn.Linear, in_features, out_features, bias=bias, dtype=dtype)
    bound = 1.0 / math.sqrt(in_features)  # = kaiming_uniform_(a=sqrt(5)), nn.Linear's default
    with torch.no_grad():
        nn.init.uniform_(layer.weight, -bound, bound, generator=generator)
        if bias:
            nn.init.uniform_(layer.bias, -bound, bound, generator=generator)
    return layer



def _activation(name: str) -> nn.Module:
    return {"relu": nn.ReLU, "gelu": nn.GELU, "silu": nn.SiLU}[name]()

