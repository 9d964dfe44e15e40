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

import warnings

from kernels.features import FeatureOverflowWarning, activation_spectrum
from kernels.snnk import (
    BottleneckAdapter,
    BundledNetwork,
    BundlingBiasWarning,
    FeatureTower,
    FeedForward,
    SNNKAdapter,
    SNNKLinear,
    balanced_input_scale,
    bert_snnk_counts,
    bundle,
    count_trainable,
    least_squares,
    ridge_cv,
    with_bundled_ffn,
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
    with pytest.raises(ValueError, match=r"x must have shape \(\.\.\., 4\)"):
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


# --------------------------------------------------------------------------- input scale
def test_input_scale_keeps_the_estimate_unbiased_and_bundles_exactly() -> None:
    """Phi(x/s)^T Psi(s w, b) has the same mean as Phi(x)^T Psi(w, b): f(w^T x + b)."""
    d, l, n, m, reps = 8, 3, 4, 64, 200
    lin = linear(d, l, 20, scale=0.3)
    x = 3.0 * torch.randn(n, d, generator=gen(21), dtype=F64) / math.sqrt(d)
    exact = FeedForward(lin, "sin")(x).detach()
    s = balanced_input_scale(x, lin.weight.detach(), "sin")
    layers = [SNNKLinear.from_linear(lin, "sin", m, input_scale=s, generator=gen(300 + r)) for r in range(reps)]
    outs = torch.stack([layer(x).detach() for layer in layers])
    se = outs.std(0) / math.sqrt(reps)
    assert float(((outs.mean(0) - exact).abs() / se).max()) <= 5.0
    head = linear(l, 2, 22)
    torch.testing.assert_close(bundle([layers[0], head])(x), head(layers[0](x)), rtol=1e-12, atol=1e-12)
    assert "input_scale" in repr(layers[0])


def test_balanced_input_scale_minimises_the_variance() -> None:
    """Large inputs, small weights (|x| = 3, |w| = 0.3, sin so alpha = 1): the balanced scale
    s* = sqrt(|x|/|w|) cuts the spread of the estimate by orders of magnitude.

    Only scales s <= s* are compared empirically: there the randomness sits in the Gaussian
    tower exp(g^T s w) with log-standard deviation s|w| <= 0.95, so 300 draws estimate the
    spread well. Beyond s* that tower is heavy-tailed and a sample spread underestimates
    the variance (the reason the bound e^{A+B} is minimised instead)."""
    d, m, reps = 6, 32, 300
    lin = linear(d, 1, 30)
    with torch.no_grad():
        lin.weight.copy_(0.3 * lin.weight / lin.weight.norm())
    x = 3.0 * torch.nn.functional.normalize(torch.randn(1, d, generator=gen(31), dtype=F64), dim=-1)
    s_star = balanced_input_scale(x, lin.weight.detach(), "sin")
    assert s_star == pytest.approx(math.sqrt(3.0 / 0.3), rel=1e-9)
    exact = float(FeedForward(lin, "sin")(x).detach())
    spread, bias = {}, {}
    for s in (1.0, s_star / 2, s_star):
        with torch.no_grad():
            outs = np.array([float(SNNKLinear.from_linear(lin, "sin", m, input_scale=s, generator=gen(400 + r))(x))
                             for r in range(reps)])
        spread[s], bias[s] = float(outs.std()), abs(float(outs.mean()) - exact)
    assert spread[s_star] < spread[s_star / 2] < spread[1.0]
    assert spread[s_star] < 0.05 * spread[1.0]
    # the theory: per feature E|phi psi|^2 = exp(A + B), A = |x|^2/s^2, B = s^2|w|^2; std <= sqrt(that / m)
    for s in spread:
        bound = math.sqrt(math.exp(9.0 / s**2 + 0.09 * s**2) / m)
        assert spread[s] <= 1.2 * bound
        assert bias[s] <= 5 * spread[s] / math.sqrt(reps)


def test_input_scale_removes_float32_overflow() -> None:
    lin = linear(16, 4, 40, scale=0.1)
    lin = lin.float()
    x = 5.0 * torch.randn(8, 16, generator=gen(41))  # |x| ~ 20: exp(|x|^2 / 2) overflows float32
    with pytest.warns(FeatureOverflowWarning):
        SNNKLinear.from_linear(lin, "sin", 16, generator=gen(42))(x)
    s = balanced_input_scale(x, lin.weight.detach(), "sin")
    with warnings.catch_warnings():
        warnings.simplefilter("error", FeatureOverflowWarning)
        out = SNNKLinear.from_linear(lin, "sin", 16, input_scale=s, generator=gen(42))(x)
    assert bool(torch.isfinite(out).all())


def test_input_scale_bad_input() -> None:
    with pytest.raises(ValueError, match="input_scale must be 1.0 for activation='relu'"):
        SNNKLinear(4, 3, 5, "relu", input_scale=2.0)
    with pytest.raises(ValueError, match="input_scale must be > 0"):
        SNNKLinear(4, 3, 5, "sin", input_scale=0.0)
    with pytest.raises(TypeError, match="input_scale"):
        SNNKLinear(4, 3, 5, "sin", input_scale="auto")
    with pytest.raises(ValueError, match="'relu' needs no input scale"):
        balanced_input_scale(torch.ones(2, 4), torch.ones(3, 4), "relu")
    with pytest.raises(ValueError, match="x has 5 features but weight has 4 columns"):
        balanced_input_scale(torch.ones(2, 5), torch.ones(3, 4), "sin")
    with pytest.raises(ValueError, match="all zeros"):
        balanced_input_scale(torch.zeros(2, 4), torch.ones(3, 4), "sin")


# --------------------------------------------------------------------------- ridge_cv
def test_ridge_cv_matches_scikit_learn_on_the_same_folds() -> None:
    """The chosen ridge is the argmin of scikit-learn's Ridge cross-validated squared error."""
    from sklearn.linear_model import Ridge

    rng = np.random.default_rng(5)
    n, m = 60, 40
    x = rng.normal(size=(n, m))
    y = x[:, :3] @ np.array([1.0, -2.0, 0.5]) + 0.8 * rng.normal(size=n)
    ridges = [1e-3, 1e-2, 0.1, 1.0, 10.0, 100.0, 1e3, 1e4]
    chosen = ridge_cv(torch.as_tensor(x), torch.as_tensor(y), ridges, folds=5, generator=gen(6))
    chunks = [c.numpy() for c in torch.randperm(n, generator=gen(6)).chunk(5)]
    sse = []
    for lam in ridges:
        total = 0.0
        for k, held in enumerate(chunks):
            kept = np.concatenate([c for j, c in enumerate(chunks) if j != k])
            model = Ridge(alpha=lam, solver="svd").fit(x[kept], y[kept])
            total += float(((model.predict(x[held]) - y[held]) ** 2).sum())
        sse.append(total)
    best = ridges[int(np.argmin(sse))]
    assert chosen == best
    assert best not in (ridges[0], ridges[-1])  # an interior optimum: the test can tell choices apart
    # 2-D targets: the same choice as the 1-D target
    assert ridge_cv(torch.as_tensor(x), torch.as_tensor(y[:, None]), ridges, folds=5, generator=gen(6)) == chosen


def test_ridge_cv_bad_input() -> None:
    x, y = torch.randn(10, 3), torch.randn(10)
    with pytest.raises(ValueError, match="ridges must be a non-empty sequence"):
        ridge_cv(x, y, [])
    with pytest.raises(ValueError, match="ridges\\[1\\] must be >= 0"):
        ridge_cv(x, y, [1.0, -1.0])
    with pytest.raises(ValueError, match="folds must be between 2"):
        ridge_cv(x, y, [1.0], folds=1)
    with pytest.raises(ValueError, match="folds must be between 2"):
        ridge_cv(x, y, [1.0], folds=11)
    with pytest.raises(ValueError, match="same number of rows"):
        ridge_cv(x, y[:9], [1.0])


# --------------------------------------------------------------------------- bias warning
def test_bundling_a_relu_layer_after_another_warns() -> None:
    l1, l2, head = linear(5, 5, 50), linear(5, 5, 51), linear(5, 1, 52)
    with pytest.warns(BundlingBiasWarning, match="layers\\[1\\] is a ReLU-SNNK layer"):
        bundle([FeedForward(l1, "relu"), FeedForward(l2, "relu"), head], num_features=8, generator=gen(0))
    with pytest.warns(BundlingBiasWarning):
        bundle([SNNKLinear.from_linear(l1, "sin", 8, generator=gen(1)), FeedForward(l2, "relu")], num_features=8)
    with warnings.catch_warnings():
        warnings.simplefilter("error", BundlingBiasWarning)
        bundle([FeedForward(l1, "relu"), head], num_features=8, generator=gen(2))  # one ReLU layer: fine
        bundle([SNNKLinear.from_linear(l1, "relu", 8, generator=gen(3)), head])
        bundle([FeedForward(l1, "sin"), FeedForward(l2, "sin"), head], num_features=8, generator=gen(4))


# --------------------------------------------------------------------------- model surgery
def _tiny_bert():
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(
        vocab_size=97, hidden_size=16, num_hidden_layers=3, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=40, type_vocab_size=2, attn_implementation="eager",
    )
    torch.manual_seed(0)
    return transformers.BertModel(config).eval(), config


def test_with_bundled_ffn_replaces_the_ffn_blocks() -> None:
    model, cfg = _tiny_bert()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    nets = {}
    for i in (1, 2):
        snnk = SNNKLinear.from_linear(model.encoder.layer[i].intermediate.dense, "relu", 8, generator=gen(i))
        nets[i] = bundle([snnk, model.encoder.layer[i].output.dense])
    new = with_bundled_ffn(model, nets)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # original untouched
    assert isinstance(new.encoder.layer[2].intermediate, FeatureTower)
    assert not isinstance(new.encoder.layer[0].intermediate, FeatureTower)
    h = torch.randn(2, 5, 16)
    with torch.no_grad():
        block = new.encoder.layer[2].output.dense(new.encoder.layer[2].intermediate(h))
        torch.testing.assert_close(block, nets[2](h))
        ids = torch.randint(0, 97, (2, 7), generator=gen(9))
        assert new(input_ids=ids).last_hidden_state.shape == (2, 7, 16)
    counts = bert_snnk_counts(16, 3, 64, 97, 40, replaced=2, num_features=8)
    assert sum(p.numel() for p in model.parameters()) == counts["params_full"]
    assert sum(p.numel() for p in new.parameters()) == counts["params_infer"]
    with pytest.raises(ValueError, match="layer indices"):
        with_bundled_ffn(model, {3: nets[1]})
    with pytest.raises(TypeError, match="BundledNetwork"):
        with_bundled_ffn(model, {0: nn.Linear(2, 2)})
    with pytest.raises(TypeError, match="model.encoder.layer"):
        with_bundled_ffn(nn.Linear(2, 2), {})
    wrong = BundledNetwork.untrained(16, 4, ["relu"], 8)
    with pytest.raises(ValueError, match="must map 16 inputs to 16 outputs"):
        with_bundled_ffn(model, {0: wrong})


def test_bert_snnk_counts_macs_match_torch_flop_counter() -> None:
    """Multiply-adds of the formula == half the FLOPs torch's FlopCounterMode counts in the real forward."""
    from torch.utils.flop_counter import FlopCounterMode

    model, cfg = _tiny_bert()
    batch, tokens = 3, 11
    nets = {i: bundle([SNNKLinear.from_linear(model.encoder.layer[i].intermediate.dense, "relu", 8, generator=gen(i)),
                       model.encoder.layer[i].output.dense]) for i in (1, 2)}
    ids = torch.randint(0, 97, (batch, tokens), generator=gen(10))
    for replaced, m in ((0, model), (2, with_bundled_ffn(model, nets))):
        counter = FlopCounterMode(display=False)
        with counter, torch.no_grad():
            m(input_ids=ids)
        counts = bert_snnk_counts(16, 3, 64, 97, 40, replaced=replaced, num_features=8, batch=batch, tokens=tokens)
        assert counter.get_total_flops() == 2 * counts["macs_infer"]
    with pytest.raises(ValueError, match="replaced must be an integer in \\[0, layers=3\\]"):
        bert_snnk_counts(16, 3, 64, 97, 40, replaced=4, num_features=8)
    with pytest.raises(ValueError, match="num_features"):
        bert_snnk_counts(16, 3, 64, 97, 40, replaced=1, num_features=0)


def test_degenerate_input_is_named() -> None:
    """Degenerate input gets an error that names it, not a raw matmul error, a torch INTERNAL
    ASSERT or a NaN."""
    from kernels.snnk import SNNKLinear, balanced_input_scale, least_squares

    layer = SNNKLinear(4, 3, 8, generator=torch.Generator().manual_seed(0))
    for dtype in (torch.float64, torch.float16):
        with pytest.raises(TypeError, match="x has dtype .* but the module's parameters are torch.float32"):
            layer(torch.randn(2, 4).to(dtype))
    with pytest.raises(ValueError, match="targets must have at least one column"):
        least_squares(torch.randn(5, 3), torch.randn(5, 0))
    with pytest.raises(ValueError, match="features must have at least one row"):
        least_squares(torch.randn(0, 3), torch.randn(0, 2))
    with pytest.raises(ValueError, match="x must hold at least one input"):
        balanced_input_scale(torch.randn(0, 3), torch.randn(2, 3), "sin")
    with pytest.raises(ValueError, match="weight must have at least one row"):
        balanced_input_scale(torch.randn(4, 3), torch.randn(0, 3), "sin")
