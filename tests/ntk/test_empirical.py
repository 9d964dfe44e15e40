"""Tests of :mod:`kernels.ntk.empirical` (empirical_ntk of any model against a naive loop and neural-tangents).

Independent references: neural-tangents (``stax`` kernels, ``empirical_ntk_fn``,
``predict.gradient_descent_mse``, ``linearize``) with jax in float64, naive per-sample
autograd loops, explicit gradient descent, and finite differences."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from kernels.ntk import (
    Erf,
    NTKLinear,
    empirical_ntk,
    fc_kernel,
    fc_network,
    gd_mse_predictor,
    linearize,
)

from ntk_helpers import F64, gen, nt_mlp, randn, rel_err, torch_params_to_nt


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


def test_empirical_ntk_float32_matches_float64():
    net = fc_network(6, 64, 3, generator=gen(0))
    x = randn(20, 6, seed=1)
    ref = empirical_ntk(net, x)
    net32 = net.float()
    for method in ("gram", "jacobian", "jvp"):
        got = empirical_ntk(net32, x.float(), method=method)
        assert got.dtype == torch.float32
        assert rel_err(got, ref) < 1e-5


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
