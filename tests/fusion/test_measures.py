"""Tests of :mod:`kernels.fusion.measures` (the NTK measures: per-sample gradients, kernels, errors).

References are independent: a loop over sub-MLPs, scikit-learn's KMeans, numpy's SVD,
per-sample autograd loops and :func:`kernels.ntk.empirical_ntk`."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from kernels.fusion import (
    compress_sequential,
    ffn_output_error,
    kernel_cosine,
    kernel_error,
    mlp_gradients,
    scaled_kernel_error,
    sgd_kernel,
    sign_kernel,
)
from kernels.ntk import empirical_ntk

from fusion_helpers import F64, gen, inputs, make_mlp, tiny_bert


class Head(nn.Module):
    """Scalar output: a fixed projection of an MLP's output."""

    def __init__(self, mlp: nn.Module, u: torch.Tensor) -> None:
        super().__init__()
        self.mlp = mlp
        self.register_buffer("u", u)

    def forward(self, x):
        return self.mlp(x) @ self.u


@pytest.mark.parametrize("n", [3, 8])
def test_scale_invariant_kernel_measures(n):
    a = torch.randn(n, n, dtype=F64, generator=gen(n))
    b = torch.randn(n, n, dtype=F64, generator=gen(n + 1))
    assert kernel_cosine(a, 3.7 * a) == pytest.approx(1.0)
    assert scaled_kernel_error(a, 0.01 * a) == pytest.approx(0.0, abs=1e-7)
    assert kernel_cosine(a, -a) == pytest.approx(-1.0)
    # against the best scalar found by least squares (numpy), independently
    c, *_ = np.linalg.lstsq(b.numpy().reshape(-1, 1), a.numpy().reshape(-1), rcond=None)
    want = np.linalg.norm(c[0] * b.numpy() - a.numpy()) / np.linalg.norm(a.numpy())
    assert scaled_kernel_error(a, b) == pytest.approx(want, rel=1e-10)
    want_cos = float(np.sum(a.numpy() * b.numpy()) / np.linalg.norm(a.numpy()) / np.linalg.norm(b.numpy()))
    assert kernel_cosine(a, b) == pytest.approx(want_cos, rel=1e-12)
    assert scaled_kernel_error(a, b) <= kernel_error(a, b) / float(a.norm()) + 1e-12
    with pytest.raises(ValueError, match="same shape"):
        kernel_cosine(a, b[:2])


def per_example_gradients(model, x, params):
    """The naive reference: one autograd call per example, gradients flattened into a row."""
    rows = []
    for i in range(x.shape[0]):
        gs = torch.autograd.grad(model(x[i : i + 1]).sum(), params)
        rows.append(torch.cat([t.flatten() for t in gs]))
    return torch.stack(rows)


def test_gradients_match_autograd_loop_and_empirical_ntk():
    mlp = compress_sequential(make_mlp(), 8, method="fusion")
    u = torch.randn(6, dtype=F64, generator=torch.Generator().manual_seed(5))
    model = Head(mlp, u)
    x = inputs()
    g = mlp_gradients(mlp, lambda m: m(x) @ u)
    params = [mlp[0].weight, mlp[0].bias, mlp[2].weight, mlp[2].bias]
    rows = per_example_gradients(model, x, params)
    torch.testing.assert_close(g, rows)
    torch.testing.assert_close(sgd_kernel(g), empirical_ntk(model, x, method="jacobian"))
    naive = rows @ torch.sign(rows).T
    torch.testing.assert_close(sign_kernel(g), naive)


@pytest.mark.parametrize("k", [3, 12, 24])
def test_gradients_of_low_rank_layers_match_autograd_and_empirical_ntk(k):
    mlp = compress_sequential(make_mlp(), k, method="svd")
    u = torch.randn(6, dtype=F64, generator=gen(5))
    model = Head(mlp, u)
    x = inputs()
    g = mlp_gradients(mlp, lambda m: m(x) @ u)
    params = [mlp[0].u, mlp[0].v, mlp[0].bias, mlp[2].u, mlp[2].v, mlp[2].bias]
    rows = per_example_gradients(model, x, params)
    torch.testing.assert_close(g, rows)
    torch.testing.assert_close(sgd_kernel(g), empirical_ntk(model, x, method="jacobian"))


def test_gradients_of_pruned_layers_are_masked():
    mlp = compress_sequential(make_mlp(), 6, method="pruning")
    x = inputs()
    u = torch.ones(6, dtype=F64)
    g = mlp_gradients(mlp, lambda m: m(x) @ u)
    n1 = mlp[0].weight.numel()
    zero = ~mlp[0].mask.bool().flatten()
    assert torch.all(g[:, :n1][:, zero] == 0)


@pytest.mark.parametrize("method", ["fusion", "clustering", "pruning"])
def test_ntk_error_is_zero_for_the_identity_compression(method):
    mlp = make_mlp()
    comp = compress_sequential(mlp, 24, method=method)
    x = inputs()
    u = torch.randn(6, dtype=F64, generator=torch.Generator().manual_seed(2))
    g_ref = mlp_gradients(mlp, lambda m: m(x) @ u)
    g_new = mlp_gradients(comp, lambda m: m(x) @ u)
    for kern in (sgd_kernel, sign_kernel):
        assert kernel_error(kern(g_ref), kern(g_new)) < 1e-10 * float(kern(g_ref).norm())
    assert ffn_output_error(mlp, comp, x) < 1e-12


def test_fusion_beats_clustering_on_the_sign_kernel_of_a_relu_mlp():
    # For ReLU both have the same forward pass; only P's placement differs, and the
    # sign kernel of fusion keeps the original's scale (Section 4.3).
    mlp = make_mlp(p=8, p_inner=64, act=nn.ReLU())
    x = inputs(n=12, p=8)
    u = torch.randn(8, dtype=F64, generator=torch.Generator().manual_seed(0))
    f = lambda m: m(x) @ u
    g_ref = mlp_gradients(mlp, f)
    fus = compress_sequential(mlp, 16, method="fusion")
    clu = compress_sequential(mlp, 16, method="clustering")
    torch.testing.assert_close(fus(x), clu(x))
    e_f = kernel_error(sign_kernel(g_ref), sign_kernel(mlp_gradients(fus, f)))
    e_c = kernel_error(sign_kernel(g_ref), sign_kernel(mlp_gradients(clu, f)))
    assert e_f < e_c


def test_output_error_matches_naive():
    mlp = make_mlp()
    comp = compress_sequential(mlp, 5)
    x = torch.randn(3, 4, 6, dtype=F64)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]], dtype=F64)
    with torch.no_grad():
        want = np.mean([float((comp(x[i, : int(mask[i].sum())]) - mlp(x[i, : int(mask[i].sum())])).norm())
                        for i in range(3)])
    assert abs(ffn_output_error(mlp, comp, x, mask) - want) < 1e-12


def test_bert_gradients_are_per_sample():
    model = tiny_bert()
    ids = torch.tensor([[2, 5, 7, 9, 3], [2, 4, 6, 0, 0]])
    mask = (ids != 0).long()
    u = torch.randn(8, generator=torch.Generator().manual_seed(0))

    def out(m, i=ids, a=mask):
        h = m(input_ids=i, attention_mask=a).last_hidden_state
        w = a[..., None].float()
        return ((h * w).sum(1) / w.sum(1)) @ u

    g = mlp_gradients(model, out, layers=[0])
    g1 = mlp_gradients(model, lambda m: out(m, ids[1:, :3], mask[1:, :3]), layers=[0])
    torch.testing.assert_close(g[1:], g1, atol=1e-5, rtol=1e-4)
    assert g.shape == (2, 8 * 16 + 16 + 16 * 8 + 8)
