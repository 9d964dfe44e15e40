"""Tests for kernels.snnk (chapters 2 and 3).

Independent references: the exact layers ``sin(Wx + b)`` / the arc-cosine layer
(:class:`FeedForward`), the sequential network ``classifier(snnk(x))`` for bundling,
``numpy.linalg.lstsq`` (and lstsq on a ridge-augmented system) for the closed form.
Monte-Carlo checks use tolerances from the estimator's own spread (see test_features.py).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from kernels.features import activation_spectrum
from kernels.snnk import (
    BottleneckAdapter,
    BundledNetwork,
    FeedForward,
    SNNKAdapter,
    SNNKLinear,
    bundle,
    count_trainable,
    least_squares,
)

F64 = torch.float64


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def linear(d: int, l: int, seed: int, scale: float = 1.0) -> nn.Linear:
    torch.manual_seed(seed)
    lin = nn.Linear(d, l, dtype=F64)
    with torch.no_grad():
        lin.weight.mul_(scale)
    return lin


def inputs(n: int, d: int, seed: int) -> torch.Tensor:
    return torch.rand(n, d, generator=gen(seed), dtype=F64) / math.sqrt(d)


# --------------------------------------------------------------------------- SNNKLinear
@pytest.mark.parametrize("activation", ["sin", "cos", "relu"])
def test_from_linear_estimates_the_layer(activation: str) -> None:
    """Over independent layers (seeds), the outputs average to the exact layer within 5 SE."""
    d, l, n, m, reps = 12, 3, 4, 64, 200
    lin = linear(d, l, 0)
    x = inputs(n, d, 1)
    exact = FeedForward(lin, activation)(x).detach()
    outs = torch.stack(
        [SNNKLinear.from_linear(lin, activation, m, generator=gen(100 + r))(x).detach() for r in range(reps)]
    )
    se = outs.std(0) / math.sqrt(reps)
    assert float(((outs.mean(0) - exact).abs() / se).max()) <= 5.0


def test_snnk_linear_parameters_and_shapes() -> None:
    layer = SNNKLinear(20, 7, 16, "sin", generator=gen(0))
    assert layer.feature_map.out_features == 2 * 16  # one folded atom, [Re, Im]
    assert count_trainable(layer) == 7 * 32
    assert [n for n, _ in layer.named_parameters()] == ["omega"]
    y = layer(torch.randn(2, 5, 20))
    assert y.shape == (2, 5, 7)
    relu = SNNKLinear(512, 512, 32, "relu", generator=gen(1))
    assert count_trainable(relu) == 512 * 32 < 512 * 513  # O(ml) instead of O(dl)
    y.sum().backward()
    assert layer.omega.grad is not None and layer.omega.grad.shape == layer.omega.shape


def test_snnk_linear_gradcheck() -> None:
    layer = SNNKLinear(4, 3, 5, "cos", generator=gen(2), dtype=F64)
    x = torch.randn(2, 4, dtype=F64, generator=gen(3), requires_grad=True) * 0.3
    assert torch.autograd.gradcheck(lambda inp, om: layer.feature_map.phi(inp) @ om.T, (x, layer.omega))


def test_gelu_snnk_layer_estimates_smoothed_gelu() -> None:
    spec = activation_spectrum("gelu", window=4.0, smoothing=0.3)
    lin = linear(6, 2, 4, scale=0.5)
    x = inputs(3, 6, 5)
    exact = FeedForward(lin, spec)(x).detach()
    outs = torch.stack([SNNKLinear.from_linear(lin, spec, 256, generator=gen(r))(x).detach() for r in range(100)])
    se = outs.std(0) / math.sqrt(100)
    assert float(((outs.mean(0) - exact).abs() / se).max()) <= 5.0


# --------------------------------------------------------------------------- adapters
def test_snnk_adapter_identity_at_init_and_counts() -> None:
    ad = SNNKAdapter(32, 8, "relu", generator=gen(0))
    x = torch.randn(3, 5, 32)
    torch.testing.assert_close(ad(x), x)
    assert count_trainable(ad) == 8 * 32 + 32
    bott = BottleneckAdapter(32, 8, generator=gen(1))
    torch.testing.assert_close(bott(x), x)
    assert count_trainable(bott) == 2 * 32 * 8 + 8 + 32
    # the gate receives a gradient at initialisation, so training can leave the identity
    ad(x).pow(2).sum().backward()
    assert float(ad.gate.grad.abs().sum()) > 0


# --------------------------------------------------------------------------- bundling
def test_bundled_two_layer_net_equals_unbundled_exactly() -> None:
    """Sec. 3.3 / App. E: classifier(SNNK(x)) == x_hat @ (W_c omega)^T + b_c, to rounding."""
    torch.manual_seed(0)
    for act in ("relu", "sin"):
        snnk = SNNKLinear(10, 16, 24, act, generator=gen(5), dtype=F64)
        with torch.no_grad():
            snnk.omega.add_(0.1 * torch.randn_like(snnk.omega))  # "trained"
        head = linear(16, 3, 6)
        x = torch.randn(7, 10, dtype=F64)
        net = bundle([snnk, head])
        torch.testing.assert_close(net(x), head(snnk(x)), rtol=1e-12, atol=1e-12)
        assert net.weight.shape == (3, snnk.feature_map.out_features)
        tokens = torch.randn(2, 5, 10, dtype=F64)  # (batch, sequence, d) as inside a transformer
        torch.testing.assert_close(net(tokens), head(snnk(tokens)), rtol=1e-12, atol=1e-12)
        assert net.parameter_count() == 3 * snnk.feature_map.out_features + 3


def test_bundle_feedforward_matches_from_linear_path() -> None:
    """bundle([FeedForward(l1), head]) builds the same maps as SNNKLinear.from_linear with that seed."""
    l1, head = linear(8, 5, 1), linear(5, 2, 2)
    x = inputs(4, 8, 3)
    net = bundle([FeedForward(l1, "cos"), head], num_features=10, generator=gen(7))
    snnk = SNNKLinear.from_linear(l1, "cos", 10, generator=gen(7))
    torch.testing.assert_close(net(x), head(snnk(x)), rtol=1e-12, atol=1e-12)


def test_deep_bundle_error_falls_with_features() -> None:
    """Eq. 14 for two sine layers and a head: the bundled estimate approaches the exact net."""
    l1, l2, head = linear(6, 5, 10, 0.5), linear(5, 4, 11, 0.5), linear(4, 2, 12)
    x = inputs(20, 6, 13)
    errs = []
    with torch.no_grad():
        exact = head(FeedForward(l2, "sin")(FeedForward(l1, "sin")(x)))
        for m in (4, 64, 1024):
            e = [
                float((bundle([FeedForward(l1, "sin"), FeedForward(l2, "sin"), head], num_features=m,
                              generator=gen(s))(x) - exact).abs().mean())
                for s in range(5)
            ]
            errs.append(np.mean(e))
    assert errs[0] > errs[1] > errs[2]
    assert errs[2] < 0.1 * errs[0]


def test_bundle_bad_input() -> None:
    snnk = SNNKLinear(4, 3, 5, "sin", generator=gen(0), dtype=F64)
    head = linear(3, 2, 0)
    with pytest.raises(ValueError, match="only the first layer"):
        bundle([FeedForward(linear(4, 4, 1), "sin"), snnk], num_features=4)
    with pytest.raises(ValueError, match="only the last layer"):
        bundle([snnk, head, FeedForward(linear(2, 2, 2), "sin")], num_features=4)
    with pytest.raises(ValueError, match="expects 5 inputs"):
        bundle([snnk, linear(5, 2, 3)])
    with pytest.raises(ValueError, match="expects 6 inputs"):
        bundle([snnk, FeedForward(linear(6, 2, 3), "sin")], num_features=4)
    with pytest.raises(ValueError, match="empty"):
        bundle([])
    with pytest.raises(TypeError, match="list of modules"):
        bundle(snnk)
    with pytest.raises(TypeError, match="layers\\[1\\]"):
        bundle([snnk, nn.ReLU()])
    with pytest.raises(ValueError, match="one entry per layer"):
        bundle([FeedForward(linear(4, 4, 1), "sin")], num_features=[3, 4])
    with pytest.raises(TypeError, match="nn.Linear"):
        SNNKLinear.from_linear(nn.Conv1d(2, 2, 1), "sin", 4)
    with pytest.raises(ValueError, match="activation"):
        SNNKLinear(4, 3, 5, "swish")
    with pytest.raises(ValueError, match="num_features"):
        SNNKLinear(4, 3, 0, "relu")
    with pytest.raises(ValueError, match="x must have 4 features"):
        snnk(torch.zeros(2, 5, dtype=F64))


# --------------------------------------------------------------------------- least squares
def test_least_squares_matches_numpy_lstsq() -> None:
    rng = np.random.default_rng(0)
    for n, m in ((50, 8), (12, 30)):  # tall (unique solution) and wide (minimum norm)
        x, y = rng.normal(size=(n, m)), rng.normal(size=(n, 3))
        w, b = least_squares(torch.as_tensor(x), torch.as_tensor(y), fit_bias=False)
        ref = np.linalg.lstsq(x, y, rcond=None)[0]
        np.testing.assert_allclose(w.numpy(), ref.T, rtol=1e-9, atol=1e-10)
        assert float(b.abs().max()) == 0.0
    # with an intercept: same predictions as lstsq on [X, 1]
    x, y = rng.normal(size=(40, 6)), rng.normal(size=(40, 2)) + 3.0
    w, b = least_squares(torch.as_tensor(x), torch.as_tensor(y))
    ref = np.linalg.lstsq(np.hstack([x, np.ones((40, 1))]), y, rcond=None)[0]
    np.testing.assert_allclose(w.numpy(), ref[:-1].T, rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(b.numpy(), ref[-1], rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("n,m", [(40, 6), (10, 25)])
def test_ridge_matches_augmented_lstsq(n: int, m: int) -> None:
    """Ridge = lstsq of [X, 1; sqrt(lam) I, 0] against [Y; 0] (intercept unpenalised)."""
    rng = np.random.default_rng(1)
    x, y, lam = rng.normal(size=(n, m)), rng.normal(size=(n, 2)), 0.7
    w, b = least_squares(torch.as_tensor(x), torch.as_tensor(y), ridge=lam)
    aug_x = np.vstack([np.hstack([x, np.ones((n, 1))]), np.hstack([math.sqrt(lam) * np.eye(m), np.zeros((m, 1))])])
    aug_y = np.vstack([y, np.zeros((m, 2))])
    ref = np.linalg.lstsq(aug_x, aug_y, rcond=None)[0]
    np.testing.assert_allclose(w.numpy(), ref[:-1].T, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(b.numpy(), ref[-1], rtol=1e-8, atol=1e-10)


def test_bundled_network_fit_closed_form() -> None:
    x = torch.randn(200, 3, dtype=F64, generator=gen(0))
    y = torch.sin(2 * x[:, :1]) + x[:, 1:2] ** 2
    net = BundledNetwork.untrained(3, 1, ["relu", "relu"], [64, 64], generator=gen(1), dtype=F64)
    assert net.features(x).shape == (200, 64)
    net.fit(x, y, ridge=1e-6)
    w, b = least_squares(net.features(x), y, ridge=1e-6)
    torch.testing.assert_close(net.weight.detach(), w)
    # no backprop needed and far better than the mean predictor
    mse = float(((net(x).detach() - y) ** 2).mean())
    assert mse < 0.1 * float(y.var())
    # the residual is orthogonal to the features (normal equations) when ridge = 0
    net.fit(x, y)
    resid = (net(x) - y).detach()
    assert float((net.features(x).T @ resid).abs().max()) < 1e-6


def test_least_squares_bad_input() -> None:
    with pytest.raises(ValueError, match="same number of rows"):
        least_squares(torch.zeros(5, 3), torch.zeros(4, 1))
    with pytest.raises(ValueError, match="ridge"):
        least_squares(torch.zeros(5, 3), torch.zeros(5), ridge=-1.0)
    with pytest.raises(ValueError, match="features"):
        least_squares(torch.zeros(5), torch.zeros(5))
    net = BundledNetwork.untrained(3, 2, ["sin"], 4)
    with pytest.raises(ValueError, match="y must have 2 columns"):
        net.fit(torch.zeros(5, 3), torch.zeros(5, 3))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine")
def test_cuda_matches_cpu() -> None:
    snnk = SNNKLinear(10, 6, 16, "sin", generator=gen(0), dtype=F64)
    head = linear(6, 2, 1)
    x = torch.randn(5, 10, dtype=F64)
    ref = bundle([snnk, head])(x)
    got = bundle([snnk.cuda(), head.cuda()])(x.cuda())
    torch.testing.assert_close(got.cpu(), ref, rtol=1e-10, atol=1e-12)
