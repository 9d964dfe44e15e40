"""Tests of :mod:`kernels.ntk.analytic` (the infinite-width NNGP and NTK, fc_kernel, against neural-tangents).

Independent references: neural-tangents (``stax`` kernels, ``empirical_ntk_fn``,
``predict.gradient_descent_mse``, ``linearize``) with jax in float64, naive per-sample
autograd loops, explicit gradient descent, and finite differences."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from kernels.ntk import NTKResult, empirical_ntk, fc_kernel, fc_network

from ntk_helpers import F64, gen, nt_mlp, randn, rel_err


@pytest.mark.parametrize("activation", ["relu", "erf"])
@pytest.mark.parametrize("W_std, b_std", [(1.0, 0.0), (1.5, 0.2), (0.8, 1.0)])
def test_fc_kernel_matches_neural_tangents(nt_ref, activation, W_std, b_std):
    stax = nt_ref["stax"]
    x1 = randn(9, 6, seed=10)
    x2 = randn(5, 6, seed=11)
    for depth in (1, 2, 3, 4):
        _, _, kernel_fn = nt_mlp(stax, 64, depth, 1, activation, W_std, b_std, "ntk")
        ref = kernel_fn(x1.numpy(), x2.numpy(), ("nngp", "ntk"))
        ours = fc_kernel(x1, x2, depth=depth, activation=activation, W_std=W_std, b_std=b_std)
        assert isinstance(ours, NTKResult)
        assert ours.nngp.shape == (9, 5) and ours.ntk.shape == (9, 5)
        assert rel_err(ours.nngp, ref.nngp) <= 1e-5, (depth, "nngp")
        assert rel_err(ours.ntk, ref.ntk) <= 1e-5, (depth, "ntk")
        ref_sym = kernel_fn(x1.numpy(), None, ("nngp", "ntk"))
        sym = fc_kernel(x1, depth=depth, activation=activation, W_std=W_std, b_std=b_std)
        assert rel_err(sym.ntk, ref_sym.ntk) <= 1e-5 and rel_err(sym.nngp, ref_sym.nngp) <= 1e-5


def test_fc_kernel_row_blocks_match_neural_tangents(nt_ref):
    # 300 x 150 and 300 x 300 entries: several row blocks, shared among threads.
    stax = nt_ref["stax"]
    x1, x2 = randn(300, 8, seed=14), randn(150, 8, seed=15)
    for activation in ("relu", "erf"):
        _, _, kernel_fn = nt_mlp(stax, 64, 3, 1, activation, 1.2, 0.1, "ntk")
        for a, b in ((x1, x2), (x1, None)):
            ref = kernel_fn(a.numpy(), None if b is None else b.numpy(), ("nngp", "ntk"))
            ours = fc_kernel(a, b, depth=3, activation=activation, W_std=1.2, b_std=0.1)
            assert rel_err(ours.nngp, ref.nngp) <= 1e-5 and rel_err(ours.ntk, ref.ntk) <= 1e-5


def test_fc_kernel_symmetric_case_dtype_and_diagonal_safety():
    x = randn(6, 4, seed=2)
    x = torch.cat([x, x[:2], torch.zeros(1, 4, dtype=F64)])  # duplicates and a zero row
    for activation in ("relu", "erf"):
        sym = fc_kernel(x, depth=3, activation=activation, b_std=0.0)
        full = fc_kernel(x, x.clone(), depth=3, activation=activation, b_std=0.0)
        for a, b in zip(sym, full):
            assert torch.isfinite(a).all()
            torch.testing.assert_close(a, a.T, rtol=1e-12, atol=1e-14)
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)
        assert torch.linalg.eigvalsh(sym.ntk).min() > -1e-10
    res32 = fc_kernel(x.float(), depth=2)
    assert res32.ntk.dtype == torch.float32 and res32.nngp.dtype == torch.float32
    torch.testing.assert_close(res32.ntk, fc_kernel(x, depth=2).ntk.float())


def test_fc_kernel_relu_depth_one_closed_form():
    # One hidden ReLU layer, b_std = 0, unit-norm inputs at angle phi:
    # Theta = cos(phi)(pi - phi)/(2 pi) + (sin(phi) + (pi - phi) cos(phi))/(2 pi).
    phi = 1.1
    d = 3
    x = torch.tensor([[1.0, 0.0, 0.0], [math.cos(phi), math.sin(phi), 0.0]], dtype=F64)
    x = x * math.sqrt(d)
    res = fc_kernel(x, depth=1)
    c = math.cos(phi)
    nngp = (math.sin(phi) + (math.pi - phi) * c) / (2 * math.pi)
    ntk = c * (math.pi - phi) / (2 * math.pi) + nngp
    assert abs(float(res.nngp[0, 1]) - nngp) < 1e-12
    assert abs(float(res.ntk[0, 1]) - ntk) < 1e-12
    assert abs(float(res.ntk[0, 0]) - 1.0) < 1e-12  # 1/2 + 1/2 on the diagonal


@pytest.mark.parametrize("activation", ["relu", "erf"])
def test_wide_network_empirical_ntk_approaches_fc_kernel(activation):
    # Jacot et al.: the empirical NTK at initialization concentrates around the limit.
    x = randn(6, 5, seed=4)
    net = fc_network(5, 4096, 2, activation=activation, W_std=1.4, b_std=0.3, generator=gen(9))
    emp = empirical_ntk(net, x)
    limit = fc_kernel(x, depth=2, activation=activation, W_std=1.4, b_std=0.3).ntk
    assert rel_err(emp, limit) < 0.1
    narrow = fc_network(5, 4, 2, activation=activation, W_std=1.4, b_std=0.3, generator=gen(9))
    assert rel_err(empirical_ntk(narrow, x), limit) > rel_err(emp, limit)


@pytest.mark.parametrize(
    "x1, x2, kwargs, exc, match",
    [
        (torch.ones(3, 2, dtype=torch.int64), None, {}, TypeError, "x1"),
        (np.ones((3, 2)), None, {}, TypeError, "x1"),
        (torch.ones(3), None, {}, ValueError, "x1"),
        (torch.tensor([[1.0, float("nan")]]), None, {}, ValueError, "x1"),
        (torch.ones(3, 2), torch.ones(2, 3), {}, ValueError, "feature dimension"),
        (torch.ones(3, 2), torch.ones(2, 2, dtype=torch.int32), {}, TypeError, "x2"),
        (torch.ones(3, 2, dtype=torch.float16), None, {}, TypeError, "float32 or float64"),
        (torch.ones(3, 2), None, {"depth": 0}, ValueError, "depth"),
        (torch.ones(3, 2), None, {"activation": "tanh"}, ValueError, "activation"),
        (torch.ones(3, 2), None, {"W_std": 0.0}, ValueError, "W_std"),
        (torch.ones(3, 2), None, {"b_std": -0.1}, ValueError, "b_std"),
    ],
)
def test_fc_kernel_bad_arguments(x1, x2, kwargs, exc, match):
    kwargs = {"depth": 2, **kwargs}
    with pytest.raises(exc, match=match):
        fc_kernel(x1, x2, **kwargs)
