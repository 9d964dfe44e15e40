"""Shared helpers of the tests of :mod:`kernels.toeplitz` (imported by its test modules)."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.func import functional_call



F64 = torch.float64


LENGTHS = [1, 2, 3, 8, 13]


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def randn(*shape: int, seed: int, dtype=F64) -> torch.Tensor:
    return torch.randn(*shape, generator=gen(seed), dtype=dtype)


def naive_toeplitz(coeffs: np.ndarray, causal: bool = False) -> np.ndarray:
    """T[i, j] = t_{i-j} with an explicit double loop (layout of the module docstring)."""
    n = coeffs.shape[-1] if causal else (coeffs.shape[-1] + 1) // 2
    out = np.zeros(coeffs.shape[:-1] + (n, n))
    for i in range(n):
        for j in range(n):
            if causal:
                if i >= j:
                    out[..., i, j] = coeffs[..., i - j]
            else:
                out[..., i, j] = coeffs[..., n - 1 + i - j]
    return out


def per_channel_matmul(t: np.ndarray, x: np.ndarray) -> np.ndarray:
    """(c, n, n) matrices times (b, n, c) sequences, channel by channel."""
    return np.einsum("cij,bjc->bic", t, x)


def shift_future(x: torch.Tensor, k: int, seed: int) -> torch.Tensor:
    """Copy of x with the tokens k, k+1, ... replaced by fresh noise."""
    out = x.clone()
    out[..., k:, :] = randn(*out[..., k:, :].shape, seed=seed, dtype=x.dtype)
    return out


def _gradcheck_module(module: nn.Module, x: torch.Tensor) -> None:
    """gradcheck of the forward with respect to the input and every parameter."""
    names = [name for name, _ in module.named_parameters()]
    params = tuple(p.detach().clone().requires_grad_() for _, p in module.named_parameters())

    def fn(inp, *ps):
        return functional_call(module, dict(zip(names, ps)), (inp,))

    inputs = (x.detach().clone().requires_grad_(),) + params
    assert torch.autograd.gradcheck(fn, inputs, fast_mode=True)
