"""Tests for kernels.ntk (chapter 1).

Independent references: neural-tangents (``stax`` kernels, ``empirical_ntk_fn``,
``predict.gradient_descent_mse``, ``linearize``) with jax in float64, naive per-sample
autograd loops, explicit gradient descent, and finite differences.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from kernels.ntk import (
    Erf,
    LinearizedModel,
    NTKLinear,
    NTKResult,
    empirical_ntk,
    fc_kernel,
    GaussianPrediction,
    fc_network,
    gd_mse_ensemble,
    gd_mse_predictor,
    linear_gram_ntk,
    linearize,
    mse_loss_curve,
)

F64 = torch.float64


# --------------------------------------------------------------------------------------
# fixtures and references
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def nt_ref():
    """neural-tangents with jax in float64; the previous x64 setting is restored after."""
    nt = pytest.importorskip("neural_tangents", reason="neural-tangents is the reference")
    import jax
    import jax.numpy as jnp
    from neural_tangents import stax

    previous = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    yield {"jax": jax, "jnp": jnp, "nt": nt, "stax": stax}
    jax.config.update("jax_enable_x64", previous)


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def randn(*shape: int, seed: int, dtype=F64) -> torch.Tensor:
    return torch.randn(*shape, generator=gen(seed), dtype=dtype)


def naive_ntk(model: nn.Module, x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
    """(n1, n2, k, k) NTK from one autograd call per sample and output."""
    params = [p for p in model.parameters() if p.requires_grad]

    def rows(x):
        out = []
        for i in range(x.shape[0]):
            fi = model(x[i : i + 1]).reshape(-1)
            per_output = []
            for a in range(fi.shape[0]):
                grads = torch.autograd.grad(fi[a], params, retain_graph=True, allow_unused=True)
                per_output.append(
                    torch.cat(
                        [
                            (g if g is not None else torch.zeros_like(p)).reshape(-1)
                            for g, p in zip(grads, params)
                        ]
                    )
                )
            out.append(torch.stack(per_output))
        return torch.stack(out)  # (n, k, P)

    j1, j2 = rows(x1), rows(x2)
    return torch.einsum("iap,jbp->ijab", j1, j2).detach()


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


# --------------------------------------------------------------------------------------
# NTKLinear, Erf, fc_network
# --------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------
# fc_kernel
# --------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------
# empirical_ntk
# --------------------------------------------------------------------------------------

METHODS = ["gram", "jacobian", "jvp", "auto"]


@pytest.mark.parametrize(
    "out_dim, parameterization, activation",
    [(1, "ntk", "relu"), (3, "ntk", "erf"), (3, "standard", "relu"), (1, "standard", "erf")],
)
def test_empirical_ntk_methods_match_naive_loop(out_dim, parameterization, activation):
    net = fc_network(
        4, 12, 2, out_dim, activation=activation, W_std=1.3, b_std=0.5,
        parameterization=parameterization, generator=gen(1),
    )
    x1, x2 = randn(5, 4, seed=2), randn(3, 4, seed=3)
    ref = naive_ntk(net, x1, x2)
    ref_sym = naive_ntk(net, x1, x1)
    for method in METHODS:
        for chunk in (None, 2):
            got = empirical_ntk(net, x1, x2, method=method, chunk_size=chunk)
            sym = empirical_ntk(net, x1, method=method, chunk_size=chunk)
            if out_dim == 1:
                torch.testing.assert_close(got, ref[:, :, 0, 0], rtol=1e-10, atol=1e-12)
                torch.testing.assert_close(sym, ref_sym[:, :, 0, 0], rtol=1e-10, atol=1e-12)
            else:
                torch.testing.assert_close(got, ref, rtol=1e-10, atol=1e-12)
                torch.testing.assert_close(sym, ref_sym, rtol=1e-10, atol=1e-12)
                traced = empirical_ntk(net, x1, x2, method=method, trace_outputs=True)
                torch.testing.assert_close(
                    traced, ref.diagonal(dim1=2, dim2=3).sum(-1), rtol=1e-10, atol=1e-12
                )



def test_symmetric_blocks_of_jacobian_and_jvp_match_naive_loop():
    # x2=None with more samples than one block: the row blocks above the diagonal are
    # computed and mirrored (jacobian: 4 blocks from 64 samples; jvp: 32 samples a block).
    net = fc_network(3, 8, 2, 2, activation="erf", b_std=0.3, generator=gen(7))
    x = randn(70, 3, seed=4)
    ref = naive_ntk(net, x, x)
    for method in ("jacobian", "jvp"):
        torch.testing.assert_close(empirical_ntk(net, x, method=method), ref, rtol=1e-10, atol=1e-12)

@pytest.mark.parametrize(
    "act", [nn.Tanh(), nn.GELU(), nn.Sigmoid(), nn.ReLU(inplace=True), nn.SiLU(), nn.Identity()]
)
def test_gram_path_torch_layers_and_activations(act):
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Linear(3, 10), act, nn.Sequential(nn.Linear(10, 10), act), nn.Linear(10, 2)
    ).to(F64)
    x1, x2 = randn(4, 3, seed=5), randn(6, 3, seed=6)
    ref = naive_ntk(net, x1, x2)
    torch.testing.assert_close(empirical_ntk(net, x1, x2, method="gram"), ref)
    torch.testing.assert_close(empirical_ntk(net, x1, x2, method="jvp"), ref)


def test_frozen_parameters_are_excluded():
    net = fc_network(3, 8, 2, 2, b_std=0.4, generator=gen(2))
    net[0].weight.requires_grad_(False)
    net[2].bias.requires_grad_(False)
    x = randn(4, 3, seed=7)
    ref = naive_ntk(net, x, x)
    for method in METHODS:
        torch.testing.assert_close(empirical_ntk(net, x, method=method), ref)
    full = fc_network(3, 8, 2, 2, b_std=0.4, generator=gen(2))
    assert not torch.allclose(empirical_ntk(full, x), ref)


class _Residual(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(3, 6)
        self.hidden = nn.Linear(6, 6)
        self.out = nn.Linear(6, 1)

    def forward(self, x):
        h = torch.tanh(self.inp(x))
        h = h + torch.relu(self.hidden(h))
        return self.out(h).squeeze(-1)  # (n,) output


def test_auto_falls_back_for_unstructured_models_and_gram_refuses():
    torch.manual_seed(1)
    model = _Residual().to(F64)
    x1, x2 = randn(5, 3, seed=8), randn(2, 3, seed=9)
    ref = naive_ntk(model, x1, x2)[:, :, 0, 0]
    # Not a Sequential, but every trainable parameter is in an nn.Linear: the hook-based
    # Gram route applies.
    for method in ("auto", "gram", "jacobian", "jvp"):
        torch.testing.assert_close(empirical_ntk(model, x1, x2, method=method), ref)
    model.register_parameter("gain", nn.Parameter(torch.ones((), dtype=F64)))
    with pytest.raises(ValueError, match="gram.*'gain'"):
        empirical_ntk(model, x1, x2, method="gram")
    torch.testing.assert_close(empirical_ntk(model, x1, x2), ref)  # auto: jacobian
    # A Sequential with a non-elementwise layer: the hooks route, not the MLP route.
    softmax_net = nn.Sequential(nn.Linear(3, 4), nn.Softmax(-1), nn.Linear(4, 2)).to(F64)
    torch.testing.assert_close(
        empirical_ntk(softmax_net, x1, x2, method="gram"), naive_ntk(softmax_net, x1, x2)
    )


def _reused_layer_net() -> nn.Sequential:
    shared = nn.Linear(3, 3).to(F64)
    return nn.Sequential(shared, nn.Tanh(), shared, nn.Tanh(), nn.Linear(3, 1).to(F64))


def _tied_weight_net() -> nn.Sequential:
    first, second = nn.Linear(3, 3).to(F64), nn.Linear(3, 3).to(F64)
    second.weight = first.weight
    return nn.Sequential(first, nn.Tanh(), second, nn.Tanh(), nn.Linear(3, 1).to(F64))


@pytest.mark.parametrize("make", [_reused_layer_net, _tied_weight_net])
def test_shared_parameters(make):
    # A parameter used by two layers needs cross-layer terms that the per-layer gram
    # formula lacks, so "auto" must take the generic path; the generic paths must swap
    # every use of the parameter and leave the model intact afterwards.
    torch.manual_seed(2)
    net = make()
    x1, x2 = randn(5, 3, seed=8), randn(2, 3, seed=9)
    ref = naive_ntk(net, x1, x2)[:, :, 0, 0]
    for method in ("auto", "jacobian", "jvp"):
        torch.testing.assert_close(empirical_ntk(net, x1, x2, method=method), ref)
        assert all(type(p) is nn.Parameter for p in (net[0].weight, net[2].weight))
    torch.testing.assert_close(naive_ntk(net, x1, x2)[:, :, 0, 0], ref)
    if make is _reused_layer_net:
        # One layer called twice: the hook-based Gram route sums both calls' terms.
        torch.testing.assert_close(empirical_ntk(net, x1, x2, method="gram"), ref)
    else:
        with pytest.raises(ValueError, match="shared with layer"):
            empirical_ntk(net, x1, method="gram")
    lin = linearize(net)
    torch.testing.assert_close(lin(x1), net(x1))
    torch.testing.assert_close(empirical_ntk(lin, x1, x2), ref)


@pytest.mark.parametrize(
    "parameterization, activation", [("ntk", "relu"), ("standard", "erf")]
)
def test_empirical_ntk_matches_neural_tangents(nt_ref, parameterization, activation):
    nt, stax, jnp = nt_ref["nt"], nt_ref["stax"], nt_ref["jnp"]
    net = fc_network(
        5, 16, 2, 3, activation=activation, W_std=1.2, b_std=0.3,
        parameterization=parameterization, generator=gen(4),
    )
    _, apply_fn, _ = nt_mlp(stax, 16, 2, 3, activation, 1.2, 0.3, parameterization)
    params = torch_params_to_nt(net, jnp)
    x1, x2 = randn(6, 5, seed=12), randn(4, 5, seed=13)
    np.testing.assert_allclose(apply_fn(params, x1.numpy()), net(x1).detach().numpy(), rtol=1e-12)
    full_fn = nt.empirical_ntk_fn(apply_fn, trace_axes=(), vmap_axes=0)
    traced_fn = nt.empirical_ntk_fn(apply_fn, vmap_axes=0)
    ref_full = np.asarray(full_fn(x1.numpy(), x2.numpy(), params))
    ref_traced = np.asarray(traced_fn(x1.numpy(), x2.numpy(), params))
    for method in ("gram", "jacobian", "jvp"):
        assert rel_err(empirical_ntk(net, x1, x2, method=method), ref_full) < 1e-10
        traced = empirical_ntk(net, x1, x2, method=method, trace_outputs=True)
        # neural-tangents averages the diagonal output pairs, we sum them (a trace).
        assert rel_err(traced / 3, ref_traced) < 1e-10


# --------------------------------------------------------------------------------------
# linear_gram_ntk: trainable nn.Linear layers inside an arbitrary module
# --------------------------------------------------------------------------------------


class _TokenFFNModel(nn.Module):
    """A frozen embedding-like map and LayerNorm, ``depth`` residual FFN blocks applied
    over tokens, a frozen token-mixing step, mean pooling and a linear readout."""

    def __init__(self, p, width, depth, out_dim, bias, generator):
        super().__init__()
        self.inp = nn.Linear(p, p)
        self.norm = nn.LayerNorm(p)
        self.blocks = nn.ModuleList(
            nn.ModuleDict({"up": nn.Linear(p, width, bias=bias), "down": nn.Linear(width, p, bias=bias)})
            for _ in range(depth)
        )
        self.readout = nn.Linear(p, out_dim, bias=bias)
        with torch.no_grad():
            for prm in self.parameters():
                prm.copy_(torch.randn(prm.shape, generator=generator) / max(1, prm.shape[-1]) ** 0.5)
        self.to(F64)
        for prm in (*self.inp.parameters(), *self.norm.parameters()):
            prm.requires_grad_(False)

    def forward(self, x):  # (n, T, p) -> (n,) or (n, k)
        h = self.norm(self.inp(x))
        for block in self.blocks:
            h = h + block["down"](nn.functional.gelu(block["up"](h)))
            h = h + 0.5 * h.flip(1)  # frozen mixing across tokens within a sample
        out = self.readout(h.mean(1))
        return out[:, 0] if out.shape[1] == 1 else out


def funcjac_ntk(model: nn.Module, x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
    """(n1, n2, k, k) by torch.func Jacobians of the trainable parameters, contracted."""
    from torch.func import functional_call, jacrev, vmap

    params = {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}

    def f(prm, x):
        return functional_call(model, prm, (x[None],)).reshape(-1)

    def jac(x):
        j = vmap(jacrev(f), in_dims=(None, 0))(params, x)
        return torch.cat([v.reshape(x.shape[0], v.shape[1], -1) for v in j.values()], 2)

    return torch.einsum("iap,jbp->ijab", jac(x1), jac(x2))


@pytest.mark.parametrize(
    "p, width, depth, out_dim, bias, tokens",
    [
        (5, 7, 1, 1, True, 1),     # one token: the token-pair (MLP) form
        (5, 7, 2, 3, True, 6),     # small layers, many tokens: the per-sample-gradient form
        (4, 9, 3, 1, False, 4),
        (40, 80, 1, 2, True, 2),   # large layers, few tokens: the token-pair form
        (6, 12, 2, 2, False, 9),
    ],
)
def test_linear_gram_ntk_matches_torch_func_jacobian(p, width, depth, out_dim, bias, tokens):
    model = _TokenFFNModel(p, width, depth, out_dim, bias, gen(depth + 10 * tokens))
    x1, x2 = randn(5, tokens, p, seed=1), randn(3, tokens + 1, p, seed=2)
    ref = funcjac_ntk(model, x1, x2)
    got = linear_gram_ntk(model, x1, x2)
    got_sym = linear_gram_ntk(model, x1)
    traced = linear_gram_ntk(model, x1, x2, trace_outputs=True)
    ref_sym = funcjac_ntk(model, x1, x1)
    if out_dim == 1:
        ref, ref_sym = ref[:, :, 0, 0], ref_sym[:, :, 0, 0]
        torch.testing.assert_close(traced, ref, rtol=1e-10, atol=1e-12)
    else:
        torch.testing.assert_close(traced, ref.diagonal(dim1=2, dim2=3).sum(-1), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(got, ref, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(got_sym, ref_sym, rtol=1e-10, atol=1e-12)
    # The same kernel through empirical_ntk on flattened inputs (gram via hooks).
    flat = _Flattened(model, tokens, p)
    torch.testing.assert_close(
        empirical_ntk(flat, x1.reshape(5, -1), method="gram"), ref_sym, rtol=1e-10, atol=1e-12
    )


class _Flattened(nn.Module):
    def __init__(self, inner, tokens, p):
        super().__init__()
        self.inner, self.tokens, self.p = inner, tokens, p

    def forward(self, x):
        return self.inner(x.reshape(x.shape[0], self.tokens, self.p))


@pytest.mark.parametrize("activation", ["relu", "erf"])
@pytest.mark.parametrize("out_dim", [1, 2])
def test_linear_gram_ntk_matches_neural_tangents_over_tokens(nt_ref, activation, out_dim):
    # A token-wise MLP (Dense over the last axis), mean pooling over tokens, a readout:
    # neural-tangents' stax (Dense, GlobalAvgPool) with the same weights.
    nt, stax, jnp = nt_ref["nt"], nt_ref["stax"], nt_ref["jnp"]
    p, width, tokens = 4, 12, 5
    act_nt = {"relu": stax.Relu, "erf": stax.Erf}[activation]
    act_t = {"relu": nn.ReLU(), "erf": Erf()}[activation]
    g = gen(3)
    up, mid = NTKLinear(p, width, W_std=1.3, b_std=0.4, generator=g), NTKLinear(width, width, W_std=1.1, b_std=0.2, generator=g)
    head = NTKLinear(width, out_dim, W_std=0.9, b_std=0.5, generator=g)

    class TokenMLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.up, self.mid, self.head, self.act = up, mid, head, act_t

        def forward(self, x):
            h = self.act(self.mid(self.act(self.up(x))))
            return self.head(h.mean(1))

    model = TokenMLP().to(F64)
    _, apply_fn, _ = stax.serial(
        stax.Dense(width, 1.3, 0.4), act_nt(), stax.Dense(width, 1.1, 0.2), act_nt(),
        stax.GlobalAvgPool(), stax.Dense(out_dim, 0.9, 0.5),
    )
    params = [
        (jnp.asarray(layer.weight.detach().numpy().T), jnp.asarray(layer.bias.detach().numpy()[None, :]))
        if layer is not None else ()
        for layer in (model.up, None, model.mid, None, None, model.head)
    ]
    x1, x2 = randn(4, tokens, p, seed=5), randn(3, tokens, p, seed=6)
    np.testing.assert_allclose(
        np.asarray(apply_fn(params, x1.numpy())), model(x1).detach().numpy(), rtol=1e-10
    )
    ref = np.asarray(nt.empirical_ntk_fn(apply_fn, trace_axes=(), vmap_axes=0)(x1.numpy(), x2.numpy(), params))
    got = linear_gram_ntk(model, x1, x2)
    assert rel_err(got if out_dim > 1 else got[..., None, None], ref) < 1e-10


@pytest.mark.parametrize("n, tokens, rows", [(1, 3, 2), (5, 1, 2), (7, 3, 4), (8, 4, 8), (6, 5, 64), (9, 2, 5)])
def test_pair_product_sum_matches_loops(monkeypatch, n, tokens, rows):
    # The token-pair sum sum_{t,s} (a_t . a'_s)(g_t . g'_s) against a loop over sample
    # pairs; the symmetric path (x2 = None) with row blocks of `rows` tokens, blocks
    # that split samples unevenly and one block holding every sample.
    from kernels.ntk import gram as ntk_mod  # the module that reads _SYM_BLOCK_ROWS

    monkeypatch.setattr(ntk_mod, "_SYM_BLOCK_ROWS", rows)
    a, g = randn(n, tokens, 6, seed=1), randn(n, tokens, 4, seed=2)
    a2, g2 = randn(3, tokens + 1, 6, seed=3), randn(3, tokens + 1, 4, seed=4)

    def loop(u1, v1, u2, v2):
        out = torch.zeros(u1.shape[0], u2.shape[0], dtype=F64)
        for i in range(u1.shape[0]):
            for j in range(u2.shape[0]):
                out[i, j] = ((u1[i] @ u2[j].T) * (v1[i] @ v2[j].T)).sum()
        return out

    sym = ntk_mod._pair_product_sum(a, g, a, g, True)
    torch.testing.assert_close(sym, loop(a, g, a, g), rtol=1e-12, atol=1e-12)
    assert torch.equal(sym, sym.T)
    torch.testing.assert_close(ntk_mod._pair_product_sum(a, g, a2, g2, False), loop(a, g, a2, g2),
                               rtol=1e-12, atol=1e-12)


def _fast_linear_or_skip():
    from kernels.ntk import _onednn_linear_available

    if not _onednn_linear_available():
        pytest.skip("torch has no working oneDNN inner product here")


@pytest.mark.parametrize("x_shape, bias, w_grad, x_grad", [
    ((6, 7), True, True, True), ((3, 5, 7), True, False, True), ((2, 3, 4, 7), False, True, False),
    ((5, 7), False, False, True), ((4, 7), True, True, False),
])
def test_onednn_linear_mode_matches_f_linear(x_shape, bias, w_grad, x_grad):
    # Values, first and second derivatives of F.linear routed through oneDNN against
    # torch's own F.linear (float32: different summation order, so a tolerance).
    from kernels.ntk import _OneDNNLinearMode

    _fast_linear_or_skip()
    f = nn.functional.linear
    x = randn(*x_shape, seed=1, dtype=torch.float32).requires_grad_(x_grad)
    w = randn(5, 7, seed=2, dtype=torch.float32).requires_grad_(w_grad)
    b = randn(5, seed=3, dtype=torch.float32).requires_grad_(w_grad) if bias else None
    v = randn(*x_shape[:-1], 5, seed=4, dtype=torch.float32)
    wanted = [t for t in (x, w, b) if t is not None and t.requires_grad]

    def derivatives():
        y = f(torch.tanh(x), w, b)  # tanh: a second derivative that is not zero
        loss = (y * v).sum() + (y ** 2).sum()
        grads = torch.autograd.grad(loss, wanted, create_graph=True)
        second = torch.autograd.grad(sum((gr ** 2).sum() for gr in grads), wanted)
        return y, grads, second

    ref = derivatives()
    with _OneDNNLinearMode():
        got = derivatives()
        assert type(got[0].grad_fn).__name__ == "_OneDNNLinearBackward"  # it was routed
    torch.testing.assert_close(got[0], ref[0], rtol=1e-5, atol=1e-5)
    for g_got, g_ref in zip(got[1] + got[2], ref[1] + ref[2]):
        torch.testing.assert_close(g_got, g_ref, rtol=1e-4, atol=1e-4)


def test_onednn_linear_mode_leaves_other_calls_alone():
    from torch.func import vmap

    from kernels.ntk import _OneDNNLinearMode

    _fast_linear_or_skip()
    f = nn.functional.linear
    x64, w64 = randn(4, 3, seed=1), randn(2, 3, seed=2)
    x32, w32 = x64.float(), w64.float()
    with _OneDNNLinearMode():
        assert torch.equal(f(x64, w64), x64 @ w64.T)  # float64: torch's own
        assert f(x32[0], w32).grad_fn is None and torch.equal(f(x32[0], w32), f(x32, w32)[0])  # 1-D input
        torch.testing.assert_close(vmap(lambda r: f(r, w32))(x32), x32 @ w32.T)  # under vmap: torch's own
        with pytest.raises(RuntimeError):  # F.linear's own error for mismatched shapes
            f(x32, randn(2, 4, seed=3, dtype=torch.float32))
        y = f(x32, w32.requires_grad_(True))
        assert type(y.grad_fn).__name__ == "_OneDNNLinearBackward"


def test_linear_gram_ntk_float32_fast_path_skips_weight_gradients(monkeypatch):
    # float32: oneDNN GEMMs for the model's linear layers and the Gram blocks, the
    # symmetric path in several row blocks; against torch.func in float64 on the same
    # weights. The backward passes ask for the layers' output gradients only, so no
    # weight gradient is formed (the engine query says so on this torch).
    from kernels.ntk import gram as ntk_mod, onednn

    _fast_linear_or_skip()
    monkeypatch.setattr(ntk_mod, "_SYM_BLOCK_ROWS", 8)
    asked: list[tuple[int, bool]] = []
    real = onednn._engine_will_run

    def spy(ctx, index):
        out = real(ctx, index)
        asked.append((index, out))
        return out

    monkeypatch.setattr(onednn, "_engine_will_run", spy)
    model = _TokenFFNModel(6, 40, 2, 1, True, gen(4))
    x = randn(9, 5, 6, seed=5)
    ref = funcjac_ntk(model, x, x)[:, :, 0, 0]
    model32, x32 = model.float(), x.float()
    got = linear_gram_ntk(model32, x32)
    got2 = linear_gram_ntk(model32, x32, x32.clone())
    scale = ref.abs().max()
    torch.testing.assert_close(got.double(), ref, rtol=0, atol=1e-5 * scale)
    torch.testing.assert_close(got2.double(), ref, rtol=0, atol=1e-5 * scale)
    assert torch.equal(got, got.T)
    assert asked and not any(out for index, out in asked if index == 1)  # no weight gradient


def test_linear_gram_ntk_output_fn_frozen_layers_and_errors():
    model = _TokenFFNModel(5, 7, 2, 1, True, gen(0))
    x = randn(4, 3, 5, seed=3)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 1]], dtype=F64)

    def masked_output(m, batch):  # padding tokens zeroed before the model: they carry no gradient
        inputs, mask_ = batch
        return m(inputs * mask_[..., None])

    got = linear_gram_ntk(model, (x, mask), output_fn=masked_output)
    torch.testing.assert_close(got, funcjac_ntk(model, x * mask[..., None], x * mask[..., None])[:, :, 0, 0])
    # Freezing a layer removes exactly its terms.
    for prm in model.blocks[0].parameters():
        prm.requires_grad_(False)
    torch.testing.assert_close(linear_gram_ntk(model, x), funcjac_ntk(model, x, x)[:, :, 0, 0])
    # Errors name the first unsupported trainable parameter and its module.
    model.norm.weight.requires_grad_(True)
    with pytest.raises(ValueError, match="'norm.weight' belongs to LayerNorm"):
        linear_gram_ntk(model, x)
    model.norm.weight.requires_grad_(False)

    class Scaled(nn.Linear):
        def forward(self, x):
            return 2.0 * super().forward(x)

    sub = nn.Sequential(Scaled(5, 1)).to(F64)
    with pytest.raises(ValueError, match="subclass of nn.Linear"):
        linear_gram_ntk(sub, randn(3, 5, seed=1))
    with pytest.raises(ValueError, match="no trainable"):
        linear_gram_ntk(nn.Sequential(nn.ReLU()), randn(3, 5, seed=1))
    with pytest.raises(TypeError, match="output_fn"):
        linear_gram_ntk(model, x, output_fn=3)
    with pytest.raises(TypeError, match="model"):
        linear_gram_ntk("model", x)
    with pytest.raises(TypeError, match="trace_outputs"):
        linear_gram_ntk(model, x, trace_outputs=1)
    with pytest.raises(ValueError, match="output_fn must return"):
        linear_gram_ntk(model, x, output_fn=lambda m, b: m(b)[:, None, None])


def test_empirical_ntk_float32_matches_float64():
    net = fc_network(6, 64, 3, generator=gen(0))
    x = randn(20, 6, seed=1)
    ref = empirical_ntk(net, x)
    net32 = net.float()
    for method in ("gram", "jacobian", "jvp"):
        got = empirical_ntk(net32, x.float(), method=method)
        assert got.dtype == torch.float32
        assert rel_err(got, ref) < 1e-5


# ---- per-layer paths of "jacobian" and "jvp" ------------------------------------------


def func_jacobian_ntk(model: nn.Module, x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
    """(n1, n2, k, k) NTK from torch.func per-sample Jacobians of *all* trainable
    parameters, written here independently of kernels.ntk (no hooks, no per-layer rows)."""
    from torch.func import functional_call, jacrev, vmap

    names = [n for n, p in model.named_parameters() if p.requires_grad]
    params = {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}

    def f(p, x):
        return functional_call(model, p, (x[None],)).reshape(-1)  # (k,)

    def rows(x):
        jac = vmap(jacrev(f), in_dims=(None, 0))(params, x)
        return torch.cat([jac[n].reshape(x.shape[0], jac[n].shape[1], -1) for n in names], -1)

    return torch.einsum("iap,jbp->ijab", rows(x1), rows(x2)).detach()


def as_4d(theta: torch.Tensor) -> torch.Tensor:
    return theta[:, :, None, None] if theta.ndim == 2 else theta


class _Spy:
    """Replaces kernels.ntk.empirical._func_jacobian_ntk and records the parameter names it got."""

    def __init__(self, monkeypatch):
        import kernels.ntk.empirical as ntk_module

        self.calls: list[list[str]] = []
        original = ntk_module._func_jacobian_ntk

        def spy(model, params, *args, **kwargs):
            self.calls.append(sorted(params))
            return original(model, params, *args, **kwargs)

        monkeypatch.setattr(ntk_module, "_func_jacobian_ntk", spy)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("out_dim", [1, 3])
@pytest.mark.parametrize("layer", ["linear", "ntk"])
def test_per_layer_jacobian_and_jvp_match_torch_func_float64(bias, out_dim, layer, monkeypatch):
    torch.manual_seed(3)
    if layer == "linear":
        net = nn.Sequential(nn.Linear(4, 9, bias=bias), nn.Tanh(), nn.Linear(9, 7, bias=bias),
                            nn.GELU(), nn.Linear(7, out_dim, bias=bias)).to(F64)
    else:
        kw = dict(W_std=1.4, b_std=0.3, bias=bias, dtype=F64)
        net = nn.Sequential(NTKLinear(4, 9, generator=gen(1), **kw), Erf(),
                            NTKLinear(9, out_dim, generator=gen(2), **kw))
    x1, x2 = randn(7, 4, seed=10), randn(5, 4, seed=11)
    spy = _Spy(monkeypatch)
    for second in (x2, None):
        ref = func_jacobian_ntk(net, x1, x1 if second is None else second)
        for method in ("jacobian", "jvp"):
            for chunk in (None, 3):  # 3: a last block smaller than the others
                got = as_4d(empirical_ntk(net, x1, second, method=method, chunk_size=chunk))
                torch.testing.assert_close(got, ref, rtol=1e-10, atol=1e-12)
    assert spy.calls == []  # every parameter took the per-layer path


class _TokenModel(nn.Module):
    """(n, T*d) -> (n, k): a linear layer over T tokens, called twice, mean-pooled."""

    def __init__(self, d=3, t=4, k=2):
        super().__init__()
        self.d, self.t = d, t
        self.mix = nn.Linear(d, d)
        self.out = nn.Linear(d, k)

    def forward(self, x):
        h = x.reshape(x.shape[0], self.t, self.d)
        h = torch.tanh(self.mix(torch.tanh(self.mix(h))))
        return self.out(h.mean(1))


class _HiddenUse(nn.Module):
    """Uses fc.weight a second time outside fc's forward: hooks cannot see that use."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)
        self.out = nn.Linear(3, 1)

    def forward(self, x):
        h = torch.tanh(self.fc(x))
        return self.out(torch.nn.functional.linear(h, self.fc.weight)).squeeze(-1)


class _FoldedSamples(nn.Module):
    """A linear layer sees 2n rows for n samples (samples folded into the first axis)."""

    def __init__(self):
        super().__init__()
        self.pair = nn.Linear(2, 3)
        self.out = nn.Linear(6, 1)

    def forward(self, x):
        h = torch.tanh(self.pair(x.reshape(-1, 2)))
        return self.out(h.reshape(x.shape[0], 6))


class _GainAndUnused(nn.Module):
    """A trainable non-linear parameter (a gain), a LayerNorm, and a layer never called."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 5)
        self.norm = nn.LayerNorm(5)
        self.unused = nn.Linear(5, 5)
        self.gain = nn.Parameter(torch.tensor(1.3))
        self.out = nn.Linear(5, 2)

    def forward(self, x):
        return self.out(self.gain * self.norm(torch.relu(self.fc(x))))


@pytest.mark.parametrize(
    "make, fallback",
    [
        (_TokenModel, []),  # several tokens and calls: the batched-matmul rows
        (_reused_layer_net, []),  # one layer called twice
        (_tied_weight_net, ["0.weight"]),  # a weight held by two layers: torch.func
        (_GainAndUnused, ["gain", "norm.bias", "norm.weight"]),
        (_HiddenUse, ["fc.bias", "fc.weight", "out.bias", "out.weight"]),  # check fails
        (_FoldedSamples, ["out.bias", "out.weight", "pair.bias", "pair.weight"]),
    ],
)
def test_per_layer_paths_on_irregular_models(make, fallback, monkeypatch):
    torch.manual_seed(4)
    model = make().to(F64)
    d = 12 if make is _TokenModel else (4 if make is _FoldedSamples else 3)
    x1, x2 = randn(6, d, seed=12), randn(4, d, seed=13)
    ref = naive_ntk(model, x1, x2)
    ref_sym = naive_ntk(model, x1, x1)
    spy = _Spy(monkeypatch)
    for method in ("jacobian", "jvp"):
        torch.testing.assert_close(as_4d(empirical_ntk(model, x1, x2, method=method)), ref,
                                   rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(as_4d(empirical_ntk(model, x1, method=method)), ref_sym,
                                   rtol=1e-10, atol=1e-12)
    # "jacobian" hands torch.func exactly the parameters the per-layer path cannot take
    # (x1 and x2 together, then x1 alone); "jvp" never calls it.
    assert spy.calls == ([fallback] * 2 if fallback else [])


def test_frozen_weight_trainable_bias_and_zero_bias_scale():
    net = fc_network(3, 6, 2, 2, b_std=0.0, generator=gen(5))  # biases trainable, scale 0
    net[2].weight.requires_grad_(False)
    x1, x2 = randn(5, 3, seed=14), randn(3, 3, seed=15)
    ref = naive_ntk(net, x1, x2)
    for method in ("jacobian", "jvp"):
        torch.testing.assert_close(empirical_ntk(net, x1, x2, method=method), ref,
                                   rtol=1e-10, atol=1e-12)


def test_per_layer_paths_float32_match_float64():
    # float32 on the CPU contracts through oneDNN when torch has it: a different GEMM,
    # the same product up to float32 rounding.
    for make in (lambda: fc_network(6, 96, 2, 2, b_std=0.1, generator=gen(6)),
                 lambda: _TokenModel(d=6, t=3).to(F64)):
        torch.manual_seed(6)
        model = make()
        d = 18 if isinstance(model, _TokenModel) else 6
        x1, x2 = randn(70, d, seed=16), randn(9, d, seed=17)
        ref, ref_sym = naive_ntk(model, x1, x2), func_jacobian_ntk(model, x1, x1)
        model32 = model.float()
        for method in ("jacobian", "jvp"):
            got = empirical_ntk(model32, x1.float(), x2.float(), method=method)
            sym = empirical_ntk(model32, x1.float(), method=method)
            assert got.dtype == torch.float32
            assert rel_err(got, ref) < 2e-5 and rel_err(sym, ref_sym) < 2e-5
            torch.testing.assert_close(sym, sym.transpose(0, 1).transpose(2, 3))


@pytest.mark.parametrize(
    "device",
    [
        "cpu",
        pytest.param(
            "cuda",
            marks=pytest.mark.skipif(
                not torch.cuda.is_available(), reason="torch sees no CUDA GPU"
            ),
        ),
    ],
)
def test_empirical_ntk_and_kernel_on_device(device):
    net = fc_network(4, 32, 2, 2, b_std=0.2, generator=gen(0))
    x1, x2 = randn(6, 4, seed=1), randn(3, 4, seed=2)
    ref = empirical_ntk(net, x1, x2, method="jacobian")
    net_d = net.to(device)
    for method in METHODS:
        got = empirical_ntk(net_d, x1.to(device), x2.to(device), method=method)
        assert got.device.type == device
        torch.testing.assert_close(got.cpu(), ref)
    res = fc_kernel(x1.to(device), x2.to(device), depth=2)
    assert res.ntk.device.type == device
    torch.testing.assert_close(res.ntk.cpu(), fc_kernel(x1, x2, depth=2).ntk)
    theta = fc_kernel(x1.to(device), depth=2).ntk
    f_train, _ = gd_mse_predictor(theta, torch.ones(6, dtype=F64, device=device))(1.0)
    assert f_train.device.type == device


def _bad_calls():
    net = fc_network(3, 4, 1, generator=gen(0))
    x = torch.ones(2, 3, dtype=F64)
    return [
        (lambda: empirical_ntk(lambda z: z, x), TypeError, "model"),
        (lambda: empirical_ntk(net, torch.ones(2, 3, dtype=torch.int64)), TypeError, "x1"),
        (lambda: empirical_ntk(net, x.float()), TypeError, "dtype"),
        (lambda: empirical_ntk(net, x, torch.ones(2, 3)), TypeError, "x2"),
        (lambda: empirical_ntk(net, torch.full((2, 3), float("nan"), dtype=F64)), ValueError,
         "NaN"),
        (lambda: empirical_ntk(net, x, torch.ones(2, 4, dtype=F64)), ValueError,
         "feature dimension"),
        (lambda: empirical_ntk(net, torch.ones(2, 4, dtype=F64)), ValueError, "x1"),
        (lambda: empirical_ntk(net, torch.ones(3, dtype=F64)), ValueError, "x1"),
        (lambda: empirical_ntk(net, x, method="fast"), ValueError, "method"),
        (lambda: empirical_ntk(net, x, chunk_size=0), ValueError, "chunk_size"),
        (lambda: empirical_ntk(net, x, trace_outputs=1), TypeError, "trace_outputs"),
        (lambda: empirical_ntk(nn.Sequential(nn.ReLU()), x), ValueError, "trainable"),
        (lambda: empirical_ntk(nn.Sequential(nn.Linear(3, 4).double(), nn.Unflatten(1, (2, 2))), x),
         ValueError, "outputs"),
    ]


@pytest.mark.parametrize("index", range(13))
def test_empirical_ntk_bad_arguments(index):
    call, exc, match = _bad_calls()[index]
    with pytest.raises(exc, match=match):
        call()


# --------------------------------------------------------------------------------------
# gd_mse_predictor, mse_loss_curve
# --------------------------------------------------------------------------------------


def _regression_problem(n_train=12, n_test=5, k=None, seed=0):
    x = randn(n_train + n_test, 4, seed=seed)
    res = fc_kernel(x, depth=2, b_std=0.1)
    theta = res.ntk
    shape = (n_train,) if k is None else (n_train, k)
    y = randn(*shape, seed=seed + 1)
    f0 = 0.3 * randn(*shape, seed=seed + 2)
    f0_test = 0.3 * randn(*((n_test,) + shape[1:]), seed=seed + 3)
    return theta[:n_train, :n_train], theta[n_train:, :n_train], y, f0, f0_test


@pytest.mark.parametrize("k", [None, 3])
def test_gd_mse_predictor_matches_neural_tangents(nt_ref, k):
    nt, jnp = nt_ref["nt"], nt_ref["jnp"]
    k_tt, k_st, y, f0, f0_test = _regression_problem(k=k)
    n_outputs = 1 if k is None else k
    eta = 0.7
    # float64 times: with float32 ones neural-tangents would form t * lr in float32.
    times = torch.tensor([0.0, 0.5, 3.0, 40.0], dtype=F64)
    # neural-tangents normalises the loss by y_train.size = N k, we by N.
    y_nt = y.numpy() if k is not None else y.numpy()[:, None]
    predict_nt = nt.predict.gradient_descent_mse(
        jnp.asarray(k_tt.numpy()), jnp.asarray(y_nt), learning_rate=eta * n_outputs
    )
    f0_nt = f0.numpy() if k is not None else f0.numpy()[:, None]
    f0t_nt = f0_test.numpy() if k is not None else f0_test.numpy()[:, None]
    ref_train, ref_test = predict_nt(times.numpy(), f0_nt, f0t_nt, jnp.asarray(k_st.numpy()))
    predict = gd_mse_predictor(
        k_tt, y, learning_rate=eta, ntk_test_train=k_st, f0_train=f0, f0_test=f0_test
    )
    f_train, f_test = predict(times)
    assert f_train.shape == (4,) + tuple(y.shape) and f_test.shape == (4,) + tuple(f0_test.shape)
    np.testing.assert_allclose(f_train.reshape(ref_train.shape), ref_train, rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(f_test.reshape(ref_test.shape), ref_test, rtol=1e-7, atol=1e-9)
    inf_train, inf_test = predict(float("inf"))
    ref_inf_train, ref_inf_test = predict_nt(None, f0_nt, f0t_nt, jnp.asarray(k_st.numpy()))
    tol = dict(rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(inf_test.reshape(ref_inf_test.shape), ref_inf_test, **tol)
    np.testing.assert_allclose(inf_train.reshape(ref_inf_train.shape), ref_inf_train, **tol)
    one_train, one_test = predict(3.0)
    torch.testing.assert_close(one_train, f_train[2])
    torch.testing.assert_close(one_test, f_test[2])


def test_gd_mse_predictor_kernel_regression_and_initial_condition():
    k_tt, k_st, y, f0, f0_test = _regression_problem()
    predict = gd_mse_predictor(k_tt, y, ntk_test_train=k_st)
    f_train, f_test = predict(float("inf"))
    torch.testing.assert_close(f_train, y)
    torch.testing.assert_close(f_test, k_st @ torch.linalg.solve(k_tt, y))
    predict0 = gd_mse_predictor(k_tt, y, ntk_test_train=k_st, f0_train=f0, f0_test=f0_test)
    f_train0, f_test0 = predict0(0.0)
    torch.testing.assert_close(f_train0, f0)
    torch.testing.assert_close(f_test0, f0_test)
    only_train, none = gd_mse_predictor(k_tt, y)(2.0)
    assert none is None and only_train.shape == y.shape


def test_gd_mse_predictor_matches_discrete_gradient_descent_of_linear_model():
    # Linear model f(x) = phi(x) . w: its NTK is exactly Phi Phi^T, and GD with step eta on
    # L = ||f - y||^2 / (2N) for s steps approximates the flow at time t = s.
    n, p = 10, 30
    phi = randn(n, p, seed=20) / math.sqrt(p)
    phi_test = randn(4, p, seed=21) / math.sqrt(p)
    y = randn(n, seed=22)
    w = 0.1 * randn(p, seed=23)
    eta, steps = 0.05, 600
    predict = gd_mse_predictor(
        phi @ phi.T, y, learning_rate=eta, ntk_test_train=phi_test @ phi.T,
        f0_train=phi @ w, f0_test=phi_test @ w,
    )
    times = torch.tensor([0.0, float(steps)], dtype=F64)
    curve = mse_loss_curve(phi @ phi.T, y, phi @ w, times, learning_rate=eta)
    w_t = w.clone()
    for _ in range(steps):
        w_t = w_t - eta * phi.T @ (phi @ w_t - y) / n
    f_train, f_test = predict(float(steps))
    torch.testing.assert_close(f_train, phi @ w_t, rtol=2e-3, atol=2e-3)
    torch.testing.assert_close(f_test, phi_test @ w_t, rtol=2e-3, atol=2e-3)
    loss_gd = float(((phi @ w_t - y) ** 2).sum() / (2 * n))
    assert abs(float(curve[1]) - loss_gd) < 2e-3 * max(loss_gd, 1e-3) + 1e-6
    assert abs(float(curve[0]) - float(((phi @ w - y) ** 2).sum() / (2 * n))) < 1e-12


def test_linearized_network_trained_with_sgd_follows_the_predictor():
    # The linearized network under full-batch SGD is discrete GD on a linear model whose
    # kernel is the empirical NTK at initialization (Lee et al. 2019, section 2.2).
    net = fc_network(3, 32, 2, b_std=0.2, generator=gen(30))
    x, x_test = randn(8, 3, seed=31), randn(3, 3, seed=32)
    y = randn(8, seed=33)
    lin = linearize(net)
    theta = empirical_ntk(net, x)
    theta_test = empirical_ntk(net, x_test, x)
    with torch.no_grad():
        f0, f0_test = net(x)[:, 0], net(x_test)[:, 0]
    eta, steps = 0.08, 30
    predict = gd_mse_predictor(
        theta, y, learning_rate=eta, ntk_test_train=theta_test, f0_train=f0, f0_test=f0_test
    )
    opt = torch.optim.SGD(lin.parameters(), lr=eta)
    for _ in range(steps):
        opt.zero_grad()
        loss = ((lin(x)[:, 0] - y) ** 2).sum() / (2 * len(y))
        loss.backward()
        opt.step()
    with torch.no_grad():
        trained, trained_test = lin(x)[:, 0], lin(x_test)[:, 0]
    # Exact discrete-time solution: f_s = y + (I - eta Theta / N)^s (f0 - y).
    step_matrix = torch.linalg.matrix_power(torch.eye(8, dtype=F64) - eta * theta / 8, steps)
    torch.testing.assert_close(trained, y + step_matrix @ (f0 - y), rtol=1e-8, atol=1e-8)
    f_train, f_test = predict(float(steps))
    assert float((trained - f0).abs().max()) > 0.1  # training did move the outputs
    torch.testing.assert_close(trained, f_train, rtol=0.02, atol=0.02)
    torch.testing.assert_close(trained_test, f_test, rtol=0.02, atol=0.02)


@pytest.mark.parametrize("k", [None, 2])
def test_mse_loss_curve_matches_predictor(k):
    k_tt, _, y, f0, _ = _regression_problem(k=k, seed=5)
    times = torch.tensor([0.0, 0.3, 2.0, 25.0, float("inf")])
    curve = mse_loss_curve(k_tt, y, f0, times, learning_rate=1.5)
    f_train, _ = gd_mse_predictor(k_tt, y, learning_rate=1.5, f0_train=f0)(times)
    n = y.shape[0]
    direct = ((f_train - y) ** 2).reshape(len(times), -1).sum(1) / (2 * n)
    torch.testing.assert_close(curve, direct, rtol=1e-9, atol=1e-12)
    assert torch.all(curve[1:] <= curve[:-1])
    assert float(curve[-1]) < 1e-10
    scalar = mse_loss_curve(k_tt, y, f0, 2.0, learning_rate=1.5)
    assert scalar.ndim == 0 and abs(float(scalar) - float(curve[2])) < 1e-12
    zero_f0 = mse_loss_curve(k_tt, y, None, 0.0)
    assert abs(float(zero_f0) - float((y**2).sum() / (2 * n))) < 1e-12


def test_predictor_on_singular_kernel_is_finite():
    # A rank-deficient kernel: the null-space part of the residual must stay put.
    phi = randn(6, 2, seed=40)
    theta = phi @ phi.T
    y = randn(6, seed=41)
    predict = gd_mse_predictor(theta, y, ntk_test_train=randn(2, 2, seed=42) @ phi.T)
    for t in (0.0, 1.0, float("inf")):
        f_train, f_test = predict(t)
        assert torch.isfinite(f_train).all() and torch.isfinite(f_test).all()
    f_inf, _ = predict(float("inf"))
    proj = phi @ torch.linalg.pinv(phi)
    torch.testing.assert_close(f_inf, proj @ y)


def test_predictor_bad_arguments():
    k_tt, k_st, y, f0, f0_test = _regression_problem()
    with pytest.raises(ValueError, match="square"):
        gd_mse_predictor(k_tt[:, :5], y)
    with pytest.raises(ValueError, match="y_train"):
        gd_mse_predictor(k_tt, y[:5])
    with pytest.raises(TypeError, match="y_train"):
        gd_mse_predictor(k_tt, torch.ones(12, dtype=torch.int64))
    with pytest.raises(ValueError, match="learning_rate"):
        gd_mse_predictor(k_tt, y, learning_rate=0.0)
    with pytest.raises(ValueError, match="ntk_test_train"):
        gd_mse_predictor(k_tt, y, ntk_test_train=k_st[:, :3])
    with pytest.raises(ValueError, match="f0_test"):
        gd_mse_predictor(k_tt, y, f0_test=f0_test)
    with pytest.raises(ValueError, match="f0_train"):
        gd_mse_predictor(k_tt, y, f0_train=f0[:3])
    with pytest.raises(ValueError, match="NaN"):
        gd_mse_predictor(k_tt.clone().fill_(float("nan")), y)
    predict = gd_mse_predictor(k_tt, y)
    with pytest.raises(ValueError, match="t must"):
        predict(-1.0)
    with pytest.raises(ValueError, match="t must"):
        predict(torch.tensor([1.0, float("nan")]))
    with pytest.raises(ValueError, match="t must"):
        predict(torch.ones(2, 2))
    with pytest.raises(TypeError, match="t must"):
        predict("1")
    with pytest.raises(ValueError, match="times|t must"):
        mse_loss_curve(k_tt, y, f0, -2.0)


# --------------------------------------------------------------------------------------
# linearize
# --------------------------------------------------------------------------------------


def _perturb(lin: LinearizedModel, scale: float, seed: int) -> list[torch.Tensor]:
    directions = []
    with torch.no_grad():
        for i, p in enumerate(lin.params):
            v = randn(*p.shape, seed=seed + i)
            p.add_(scale * v)
            directions.append(v)
    return directions


def test_linearize_is_the_first_order_taylor_expansion():
    net = fc_network(3, 16, 2, 2, activation="erf", b_std=0.3, generator=gen(50))
    x = randn(5, 3, seed=51)
    lin = linearize(net)
    assert isinstance(lin, nn.Module)
    assert len(list(p for p in lin.parameters() if p.requires_grad)) == len(list(net.parameters()))
    torch.testing.assert_close(lin(x), net(x))
    # Affine in theta: f_lin(theta0 + 2 eps v) - f0 = 2 (f_lin(theta0 + eps v) - f0).
    eps = 1e-4
    v = _perturb(lin, eps, seed=60)
    step1 = lin(x) - net(x)
    _perturb(lin, eps, seed=60)
    step2 = lin(x) - net(x)
    torch.testing.assert_close(step2, 2 * step1, rtol=1e-10, atol=1e-14)
    # Finite difference of the original network in the same direction.
    moved = fc_network(3, 16, 2, 2, activation="erf", b_std=0.3, generator=gen(50))
    with torch.no_grad():
        for p, d in zip(moved.parameters(), v):
            p.add_(eps * d)
    fd = moved(x) - net(x)
    torch.testing.assert_close(step1, fd, rtol=1e-3, atol=1e-9)
    # The original model is untouched and its NTK is the linearized model's NTK.
    fresh = fc_network(3, 16, 2, 2, activation="erf", b_std=0.3, generator=gen(50))
    torch.testing.assert_close(net(x), fresh(x))
    torch.testing.assert_close(empirical_ntk(lin, x, method="jacobian"), empirical_ntk(net, x))


def test_linearize_matches_neural_tangents(nt_ref):
    nt, stax, jnp, jax = nt_ref["nt"], nt_ref["stax"], nt_ref["jnp"], nt_ref["jax"]
    net = fc_network(4, 20, 2, 2, W_std=1.3, b_std=0.2, generator=gen(70))
    _, apply_fn, _ = nt_mlp(stax, 20, 2, 2, "relu", 1.3, 0.2, "ntk")
    params0 = torch_params_to_nt(net, jnp)
    lin = linearize(net)
    _perturb(lin, 0.3, seed=80)
    moved = fc_network(4, 20, 2, 2, W_std=1.3, b_std=0.2, generator=gen(70))
    with torch.no_grad():
        for dst, src in zip(moved.parameters(), lin.params):
            dst.copy_(src)
    params = torch_params_to_nt(moved, jnp)
    f_lin_nt = nt.linearize(apply_fn, params0)
    x = randn(6, 4, seed=81)
    ref = np.asarray(f_lin_nt(params, x.numpy()))
    np.testing.assert_allclose(lin(x).detach().numpy(), ref, rtol=1e-10, atol=1e-12)
    # ... and it differs from the moved nonlinear network (the check is not vacuous).
    assert not np.allclose(moved(x).detach().numpy(), ref, rtol=1e-3)


def test_linearize_bad_arguments():
    with pytest.raises(TypeError, match="model"):
        linearize(lambda z: z)
    frozen = nn.Linear(2, 2)
    frozen.requires_grad_(False)
    with pytest.raises(ValueError, match="trainable"):
        linearize(frozen)


# --------------------------------------------------------------------------------------
# discrete-time predictor, gd_mse_ensemble
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("eta", [0.05, 0.9, 2.5])
@pytest.mark.parametrize("k", [None, 3])
def test_discrete_predictor_matches_explicit_gradient_descent(eta, k):
    # A linear model's GD is exactly f_{s+1} = f_s - eta/N Theta (f_s - Y): iterate it.
    k_tt, k_st, y, f0, f0_test = _regression_problem(k=k, seed=11)
    n = y.shape[0]
    predict = gd_mse_predictor(
        k_tt, y, learning_rate=eta, ntk_test_train=k_st, f0_train=f0, f0_test=f0_test,
        discrete=True,
    )
    steps = [0, 1, 2, 7, 30]
    f_train, f_test = predict(torch.tensor(steps, dtype=F64))
    curve = mse_loss_curve(k_tt, y, f0, torch.tensor(steps, dtype=F64), learning_rate=eta,
                           discrete=True)
    ft, fs = f0.clone(), f0_test.clone()
    for s in range(steps[-1] + 1):
        if s in steps:
            i = steps.index(s)
            scale = 1 + float(ft.abs().max())
            torch.testing.assert_close(f_train[i], ft, rtol=1e-9, atol=1e-9 * scale)
            torch.testing.assert_close(f_test[i], fs, rtol=1e-9, atol=1e-9 * scale)
            loss = float(((ft - y) ** 2).sum() / (2 * n))
            assert abs(float(curve[i]) - loss) <= 1e-9 * (1 + loss)
        residual = ft - y
        ft = ft - eta / n * k_tt @ residual
        fs = fs - eta / n * k_st @ residual


def test_discrete_predictor_approaches_flow_and_diverges_past_two():
    k_tt, k_st, y, f0, f0_test = _regression_problem(seed=12)
    n = y.shape[0]
    lam_max = float(torch.linalg.eigvalsh(k_tt)[-1])
    # Small steps: s steps of size eta/r approximate the flow at time s/r.
    eta = 0.5 * n / lam_max
    flow = gd_mse_predictor(k_tt, y, learning_rate=eta, ntk_test_train=k_st, f0_train=f0,
                            f0_test=f0_test)
    fine = gd_mse_predictor(k_tt, y, learning_rate=eta / 200, ntk_test_train=k_st,
                            f0_train=f0, f0_test=f0_test, discrete=True)
    for a, b in zip(flow(4.0), fine(800.0)):
        torch.testing.assert_close(a, b, rtol=5e-3, atol=5e-3)
    # t = inf: kernel regression below eta lambda_max / N = 2, NaN (divergence) above it.
    stable = gd_mse_predictor(k_tt, y, learning_rate=1.9 * n / lam_max, ntk_test_train=k_st,
                              discrete=True)(float("inf"))
    torch.testing.assert_close(stable[1], k_st @ torch.linalg.solve(k_tt, y))
    unstable = gd_mse_predictor(k_tt, y, learning_rate=2.1 * n / lam_max, ntk_test_train=k_st,
                                discrete=True)
    assert torch.isnan(unstable(float("inf"))[1]).all()
    grown = mse_loss_curve(k_tt, y, None, torch.tensor([0.0, 50.0]), learning_rate=2.1 * n / lam_max,
                           discrete=True)
    assert float(grown[1]) > 10 * float(grown[0])


def test_discrete_predictor_bad_arguments():
    k_tt, k_st, y, _, _ = _regression_problem()
    with pytest.raises(ValueError, match="whole numbers"):
        gd_mse_predictor(k_tt, y, discrete=True)(0.5)
    with pytest.raises(ValueError, match="whole numbers"):
        mse_loss_curve(k_tt, y, None, torch.tensor([1.0, 2.5]), discrete=True)
    with pytest.raises(TypeError, match="discrete"):
        gd_mse_predictor(k_tt, y, discrete=1)
    with pytest.raises(TypeError, match="discrete"):
        mse_loss_curve(k_tt, y, None, 1.0, discrete="yes")


def _ensemble_problem(activation="relu", depth=2, n_train=10, n_test=6, seed=0):
    x = randn(n_train + n_test, 3, seed=seed)
    res = fc_kernel(x, depth=depth, activation=activation, W_std=1.2, b_std=0.1)
    tr, te = slice(0, n_train), slice(n_train, None)
    return x, res, tr, te


@pytest.mark.parametrize("activation,depth", [("relu", 1), ("relu", 3), ("erf", 2)])
@pytest.mark.parametrize("k", [None, 2])
def test_gd_mse_ensemble_matches_neural_tangents(nt_ref, activation, depth, k):
    nt, stax, jnp = nt_ref["nt"], nt_ref["stax"], nt_ref["jnp"]
    x, res, tr, te = _ensemble_problem(activation, depth)
    n_outputs = 1 if k is None else k
    y = randn(*((10,) if k is None else (10, k)), seed=3)
    eta = 0.8
    predict = gd_mse_ensemble(
        res.nngp[tr, tr], res.ntk[tr, tr], y, nngp_test_train=res.nngp[te, tr],
        ntk_test_train=res.ntk[te, tr], nngp_test_test=res.nngp[te, te], learning_rate=eta,
    )
    _, _, kernel_fn = nt_mlp(stax, 64, depth, 1, activation, 1.2, 0.1, "ntk")
    y_nt = y.numpy()[:, None] if k is None else y.numpy()
    predict_nt = nt.predict.gradient_descent_mse_ensemble(
        kernel_fn, jnp.asarray(x[tr].numpy()), jnp.asarray(y_nt), learning_rate=eta * n_outputs,
        diag_reg=0.0,
    )
    for t in (0.0, 0.7, 5.0, 60.0, None):
        ours = predict(float("inf") if t is None else t)
        assert isinstance(ours, GaussianPrediction)
        ref = predict_nt(t=t, x_test=jnp.asarray(x[te].numpy()), get="ntk", compute_cov=True)
        np.testing.assert_allclose(ours.mean.reshape(ref.mean.shape), ref.mean, rtol=1e-6, atol=1e-8)
        np.testing.assert_allclose(ours.covariance, ref.covariance, rtol=1e-6, atol=1e-8)


def test_gd_mse_ensemble_closed_form_limits_and_time_axis():
    x, res, tr, te = _ensemble_problem(seed=4)
    y = randn(10, 3, seed=5)
    args = dict(nngp_test_train=res.nngp[te, tr], ntk_test_train=res.ntk[te, tr],
                nngp_test_test=res.nngp[te, te], learning_rate=1.3)
    predict = gd_mse_ensemble(res.nngp[tr, tr], res.ntk[tr, tr], y, **args)
    # t = 0: the NNGP prior, mean zero.
    start = predict(0.0)
    torch.testing.assert_close(start.mean, torch.zeros(6, 3, dtype=F64))
    torch.testing.assert_close(start.covariance, res.nngp[te, te])
    # t = inf: Lee et al. eq. 16 with A = Theta* Theta^-1, written with explicit inverses.
    a = res.ntk[te, tr] @ torch.linalg.inv(res.ntk[tr, tr])
    k_xx, k_sx = res.nngp[tr, tr], res.nngp[te, tr]
    cov_inf = res.nngp[te, te] + a @ k_xx @ a.T - a @ k_sx.T - k_sx @ a.T
    end = predict(float("inf"))
    torch.testing.assert_close(end.mean, a @ y, rtol=1e-8, atol=1e-9)
    torch.testing.assert_close(end.covariance, cov_inf, rtol=1e-7, atol=1e-9)
    # Time axis, and the mean equals gd_mse_predictor with f0 = 0 (flow and discrete).
    for discrete, times in ((False, [0.0, 2.5, 40.0]), (True, [0.0, 3.0, 40.0])):
        many = gd_mse_ensemble(res.nngp[tr, tr], res.ntk[tr, tr], y, discrete=discrete, **args)(
            torch.tensor(times, dtype=F64))
        assert many.mean.shape == (3, 6, 3) and many.covariance.shape == (3, 6, 6)
        _, f_test = gd_mse_predictor(res.ntk[tr, tr], y, learning_rate=1.3, discrete=discrete,
                                     ntk_test_train=res.ntk[te, tr])(torch.tensor(times, dtype=F64))
        torch.testing.assert_close(many.mean, f_test)
        torch.testing.assert_close(many.covariance, many.covariance.transpose(1, 2))
        assert float(torch.linalg.eigvalsh(many.covariance).min()) > -1e-9


def test_gd_mse_ensemble_matches_monte_carlo_of_linear_model():
    # Independent check of the covariance: a linear model with Gaussian initial outputs
    # f0 ~ N(0, K) trained by discrete GD, sampled many times.
    x, res, tr, te = _ensemble_problem(seed=6, n_train=5, n_test=3)
    k_full, theta = res.nngp, res.ntk
    y = randn(5, seed=7)
    eta, steps, samples = 1.0, 6, 200000
    chol = torch.linalg.cholesky(k_full + 1e-12 * torch.eye(8, dtype=F64))
    f0 = randn(samples, 8, seed=8) @ chol.T  # (S, N + M)
    ft, fs = f0[:, :5].clone(), f0[:, 5:].clone()
    for _ in range(steps):
        residual = ft - y
        ft = ft - eta / 5 * residual @ theta[tr, tr].T
        fs = fs - eta / 5 * residual @ theta[te, tr].T
    pred = gd_mse_ensemble(k_full[tr, tr], theta[tr, tr], y, nngp_test_train=k_full[te, tr],
                           ntk_test_train=theta[te, tr], nngp_test_test=k_full[te, te],
                           learning_rate=eta, discrete=True)(float(steps))
    emp_cov = torch.cov(fs.T)
    scale = float(pred.covariance.diagonal().max())
    torch.testing.assert_close(fs.mean(0), pred.mean, rtol=0, atol=0.02 * math.sqrt(scale))
    torch.testing.assert_close(emp_cov, pred.covariance, rtol=0, atol=0.02 * scale)


def test_gd_mse_ensemble_bad_arguments():
    x, res, tr, te = _ensemble_problem()
    y = randn(10, seed=9)
    good = dict(nngp_test_train=res.nngp[te, tr], ntk_test_train=res.ntk[te, tr],
                nngp_test_test=res.nngp[te, te])
    with pytest.raises(ValueError, match="nngp_train_train"):
        gd_mse_ensemble(res.nngp[:3, :3], res.ntk[tr, tr], y, **good)
    with pytest.raises(ValueError, match="nngp_test_test"):
        gd_mse_ensemble(res.nngp[tr, tr], res.ntk[tr, tr], y, **{**good, "nngp_test_test": res.nngp[:2, :2]})
    with pytest.raises(ValueError, match="ntk_test_train"):
        gd_mse_ensemble(res.nngp[tr, tr], res.ntk[tr, tr], y, **{**good, "ntk_test_train": res.ntk[te, :3]})
    with pytest.raises(ValueError, match="learning_rate"):
        gd_mse_ensemble(res.nngp[tr, tr], res.ntk[tr, tr], y, learning_rate=-1.0, **good)
    with pytest.raises(ValueError, match="whole numbers"):
        gd_mse_ensemble(res.nngp[tr, tr], res.ntk[tr, tr], y, discrete=True, **good)(1.5)
