"""Shared helpers of the tests of :mod:`kernels.ntk` (imported by its test modules)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from kernels.ntk import NTKLinear


F64 = torch.float64


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def randn(*shape: int, seed: int, dtype=F64) -> torch.Tensor:
    return torch.randn(*shape, generator=gen(seed), dtype=dtype)


def nt_mlp(stax, width, depth, out_dim, activation, W_std, b_std, parameterization):
    act = {"relu": stax.Relu, "erf": stax.Erf}[activation]
    layers = []
    for _ in range(depth):
        layers += [stax.Dense(width, W_std, b_std, parameterization=parameterization), act()]
    layers.append(stax.Dense(out_dim, W_std, b_std, parameterization=parameterization))
    return stax.serial(*layers)


def torch_params_to_nt(net: nn.Sequential, jnp) -> list:
    """NT Dense params are (W of shape (in, out), b of shape (1, out)); activations ()."""
    params = []
    for layer in net:
        if isinstance(layer, NTKLinear):
            w = jnp.asarray(layer.weight.detach().numpy().T)
            b = jnp.asarray(layer.bias.detach().numpy()[None, :])
            params.append((w, b))
        else:
            params.append(())
    return params


def rel_err(a, b) -> float:
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-300))


def _fast_linear_or_skip():
    from kernels.ntk import _onednn_linear_available

    if not _onednn_linear_available():
        pytest.skip("torch has no working oneDNN inner product here")
