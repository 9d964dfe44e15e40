"""Tests of :mod:`kernels.ntk.gram` (linear_gram_ntk, the Gram trick, against torch.func and neural-tangents).

Independent references: neural-tangents (``stax`` kernels, ``empirical_ntk_fn``,
``predict.gradient_descent_mse``, ``linearize``) with jax in float64, naive per-sample
autograd loops, explicit gradient descent, and finite differences."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from kernels.ntk import Erf, NTKLinear, empirical_ntk, linear_gram_ntk

from ntk_helpers import F64, _fast_linear_or_skip, gen, randn, rel_err


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
