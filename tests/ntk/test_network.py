"""Tests of :mod:`kernels.ntk.network` (NTK- and standard-parametrized layers, fc_network).

Independent references: neural-tangents (``stax`` kernels, ``empirical_ntk_fn``,
``predict.gradient_descent_mse``, ``linearize``) with jax in float64, naive per-sample
autograd loops, explicit gradient descent, and finite differences."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from kernels.ntk import Erf, NTKLinear, fc_network

from ntk_helpers import F64, gen, randn


def test_ntk_linear_same_function_different_gradients():
    x = randn(5, 7, seed=1)
    ntk_layer = NTKLinear(7, 3, W_std=1.7, b_std=0.4, generator=gen(0), dtype=F64)
    std_layer = NTKLinear(
        7, 3, W_std=1.7, b_std=0.4, parameterization="standard", generator=gen(0), dtype=F64
    )
    torch.testing.assert_close(ntk_layer(x), std_layer(x))
    ntk_layer(x).sum().backward()
    std_layer(x).sum().backward()
    scale = 1.7 / math.sqrt(7)
    torch.testing.assert_close(ntk_layer.weight.grad, scale * std_layer.weight.grad)
    torch.testing.assert_close(ntk_layer.bias.grad, 0.4 * std_layer.bias.grad)
    assert not torch.allclose(ntk_layer.weight.grad, std_layer.weight.grad)


def test_ntk_linear_initialization_statistics_and_reproducibility():
    layer = NTKLinear(400, 300, W_std=2.0, b_std=0.5, generator=gen(3), dtype=F64)
    w = layer.weight.detach()
    assert abs(float(w.mean())) < 0.01 and abs(float(w.var()) - 1.0) < 0.02
    std = NTKLinear(
        400, 300, W_std=2.0, b_std=0.5, parameterization="standard", generator=gen(3), dtype=F64
    )
    assert abs(float(std.weight.detach().var()) - 4.0 / 400) < 0.02 * 4.0 / 400
    again = NTKLinear(400, 300, W_std=2.0, b_std=0.5, generator=gen(3), dtype=F64)
    assert torch.equal(again.weight, layer.weight) and torch.equal(again.bias, layer.bias)
    no_bias = NTKLinear(400, 300, bias=False, generator=gen(3), dtype=F64)
    assert no_bias.bias is None and torch.equal(no_bias.weight, layer.weight)
    assert NTKLinear(2, 2).weight.dtype == torch.get_default_dtype()


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        (dict(in_features=0, out_features=2), ValueError, "in_features"),
        (dict(in_features=2.5, out_features=2), TypeError, "in_features"),
        (dict(in_features=2, out_features=-1), ValueError, "out_features"),
        (dict(in_features=2, out_features=2, W_std=0.0), ValueError, "W_std"),
        (dict(in_features=2, out_features=2, b_std=-1.0), ValueError, "b_std"),
        (dict(in_features=2, out_features=2, parameterization="mup"), ValueError, "parameteriz"),
        (dict(in_features=2, out_features=2, dtype=torch.int64), TypeError, "dtype"),
        (dict(in_features=2, out_features=2, generator=0), TypeError, "generator"),
        (dict(in_features=2, out_features=2, bias=1), TypeError, "bias"),
    ],
)
def test_ntk_linear_bad_arguments(kwargs, exc, match):
    in_f, out_f = kwargs.pop("in_features"), kwargs.pop("out_features")
    with pytest.raises(exc, match=match):
        NTKLinear(in_f, out_f, **kwargs)


def test_erf_module():
    x = torch.linspace(-3, 3, 11, dtype=F64)
    torch.testing.assert_close(Erf()(x), torch.erf(x))


def test_fc_network_structure():
    net = fc_network(4, 8, 3, 2, activation="erf", W_std=1.5, b_std=0.1, generator=gen(0))
    kinds = [type(m) for m in net]
    assert kinds == [NTKLinear, Erf] * 3 + [NTKLinear]
    assert [m.out_features for m in net if isinstance(m, NTKLinear)] == [8, 8, 8, 2]
    assert all(p.dtype == F64 for p in net.parameters())
    assert net(randn(5, 4, seed=0)).shape == (5, 2)
    custom = fc_network(4, 8, 2, activation=nn.Tanh(), generator=gen(0))
    assert sum(isinstance(m, nn.Tanh) for m in custom) == 2
    a = fc_network(4, 8, 2, generator=gen(5))
    b = fc_network(4, 8, 2, generator=gen(5))
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


@pytest.mark.parametrize(
    "args, kwargs, exc, match",
    [
        ((4, 0, 2), {}, ValueError, "width"),
        ((4, 8, 0), {}, ValueError, "depth"),
        ((0, 8, 2), {}, ValueError, "in_dim"),
        ((4, 8, 2, 0), {}, ValueError, "out_dim"),
        ((4, 8, 2), {"activation": "tanh"}, ValueError, "activation"),
        ((4, 8, 2), {"activation": 3}, TypeError, "activation"),
        ((4, 8, 2), {"parameterization": "x"}, ValueError, "parameterization"),
    ],
)
def test_fc_network_bad_arguments(args, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        fc_network(*args, **kwargs)
