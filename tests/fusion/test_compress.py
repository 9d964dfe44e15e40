"""Tests of :mod:`kernels.fusion.compress` (fusion of one MLP (eq. 5) and the baselines).

References are independent: a loop over sub-MLPs, scikit-learn's KMeans, numpy's SVD,
per-sample autograd loops and :func:`kernels.ntk.empirical_ntk`."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from kernels.fusion import (
    METHODS,
    CompressedLinear,
    LowRankLinear,
    MMDSupport,
    averaging_matrix,
    clustering_matrix,
    compress_mlp,
    compress_sequential,
    fuse_mlp,
    kmeans,
    mlp_parameter_count,
    mmd2,
    mmd_support,
    scaling_matrix,
    sub_mlp_embeddings,
    svd_rank_for_budget,
)

from fusion_helpers import F64, gen, inputs, make_mlp


def test_fusion_with_k_equal_p_inner_is_exact():
    mlp = make_mlp()
    x = inputs()
    fused = compress_sequential(mlp, 24, method="fusion")
    torch.testing.assert_close(fused(x), mlp(x))
    assert torch.equal(fused[2].scale, torch.ones(24, dtype=F64))


def test_fusion_matches_eq5_and_pulling_c_out():
    mlp = make_mlp()
    x = inputs()
    k = 7
    l1, l2 = fuse_mlp(mlp[0], mlp[2], k, generator=torch.Generator().manual_seed(3))
    res = kmeans(sub_mlp_embeddings(mlp[0], mlp[2]), k, generator=torch.Generator().manual_seed(3))
    c = clustering_matrix(res.labels, k)
    cb = averaging_matrix(c)
    w1, b1 = mlp[0].weight.detach().T, mlp[0].bias.detach()  # (p, p_I), (p_I,)
    w2, b2 = mlp[2].weight.detach().T, mlp[2].bias.detach()  # (p_I, p)
    wt1, bt1, wt2 = w1 @ cb.T, cb @ b1, cb @ w2
    # replace every sub-MLP by its centroid: sigma((X Wt1 + bt1) C) C^T Wt2
    replaced = torch.nn.functional.gelu((x @ wt1 + bt1) @ c) @ (c.T @ wt2) + b2
    eq5 = torch.nn.functional.gelu(x @ wt1 + bt1) @ scaling_matrix(c) @ wt2 + b2
    torch.testing.assert_close(replaced, eq5)
    got = l2(torch.nn.functional.gelu(l1(x)))
    torch.testing.assert_close(got, eq5)
    torch.testing.assert_close(l2.scale, c.sum(1))


def test_p_is_a_fixed_scaling_in_the_gradient():
    mlp = make_mlp()
    x = inputs()
    l1, l2 = fuse_mlp(mlp[0], mlp[2], 5, generator=torch.Generator().manual_seed(0))
    assert "scale" not in dict(l2.named_parameters())
    assert "scale" in dict(l2.named_buffers())
    n_params = sum(p.numel() for p in (*l1.parameters(), *l2.parameters()))
    assert n_params == 5 * 6 + 5 + 6 * 5 + 6
    a = torch.nn.functional.gelu(l1(x)).detach()
    g_out = torch.randn(x.shape[0], 6, dtype=F64)
    (l2(a) * g_out).sum().backward()
    # d/dW2~ of (a P W2~ + b2): (a P)^T g; in torch layout (p, k): g^T (a P)
    want = g_out.T @ (a * l2.scale)
    torch.testing.assert_close(l2.weight.grad, want)
    # folding P into W2~ gives the same forward but a gradient without P
    folded = nn.Linear(5, 6).to(F64)
    with torch.no_grad():
        folded.weight.copy_(l2.weight * l2.scale)
        folded.bias.copy_(l2.bias)
    torch.testing.assert_close(folded(a), l2(a))


@pytest.mark.parametrize("method", ["fusion", "clustering", "pruning", "mmd", "random"])
def test_baselines_exact_at_full_width(method):
    mlp = make_mlp()
    x = inputs()
    out = compress_sequential(mlp, 24, method=method, mmd_steps=5)
    torch.testing.assert_close(out(x), mlp(x), atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("p,p_inner,k", [(6, 24, 24), (6, 24, 12), (5, 7, 7), (8, 32, 20)])
def test_svd_baseline_is_the_factored_eckart_young_truncation(p, p_inner, k):
    mlp = make_mlp(p=p, p_inner=p_inner)
    r = svd_rank_for_budget(p, p_inner, k)
    assert 1 <= r <= min(p, p_inner)
    l1, l2 = compress_mlp(mlp[0], mlp[2], k, method="svd")
    for lin, new in ((mlp[0], l1), (mlp[2], l2)):
        assert isinstance(new, LowRankLinear) and new.rank == r
        w = lin.weight.detach().numpy()
        u, s, vh = np.linalg.svd(w, full_matrices=False)
        want = (u[:, :r] * s[:r]) @ vh[:r]
        np.testing.assert_allclose(new.effective_weight().detach().numpy(), want, atol=1e-12)
        # balanced factors: both carry the square roots of the singular values
        np.testing.assert_allclose(np.linalg.norm(new.u.detach().numpy(), axis=0), np.sqrt(s[:r]), rtol=1e-10)


@pytest.mark.parametrize("p,p_inner", [(2, 4), (6, 24), (5, 3)])
def test_svd_at_full_rank_reproduces_the_ffn(p, p_inner):
    big = make_mlp(p=p, p_inner=p_inner)
    out = compress_sequential(big, p_inner, method="svd", rank=min(p, p_inner))
    torch.testing.assert_close(out(inputs(p=p)), big(inputs(p=p)), atol=1e-12, rtol=1e-12)
    with pytest.raises(ValueError, match="rank"):
        compress_sequential(big, p_inner, method="svd", rank=min(p, p_inner) + 1)


def test_svd_parameter_budget_matches_a_width_k_mlp():
    # p = 384, p_I = 1536, k = 384 (chapter 6): factored SVD within one rank step of fusion
    p, p_inner, k = 384, 1536, 384
    r = svd_rank_for_budget(p, p_inner, k)
    svd_params = 2 * r * (p + p_inner) + p_inner
    fusion_params = k * (2 * p + 1)
    assert abs(svd_params - fusion_params) <= 2 * (p + p_inner)
    mlp = make_mlp(p=8, p_inner=32)
    k = 12
    r = svd_rank_for_budget(8, 32, k)
    svd = compress_sequential(mlp, k, method="svd")
    fused = compress_sequential(mlp, k, method="fusion")
    assert mlp_parameter_count(svd) == 2 * r * (8 + 32) + 32 + 8
    assert abs(mlp_parameter_count(svd) - mlp_parameter_count(fused)) <= 2 * (8 + 32)


def test_random_subset_is_unbiased_and_exact_at_full_width():
    mlp = make_mlp()
    x = inputs()
    ref = mlp(x).detach()
    # k = p_I keeps every sub-MLP with weight 1: the MLP itself, for any draw
    for s in range(3):
        torch.testing.assert_close(compress_sequential(mlp, 24, method="random", generator=gen(s))(x), ref)
    # for k < p_I the rescaled subset sum is an unbiased estimate of the sum over sub-MLPs
    # (any activation): the mean over many draws approaches the MLP
    errs = []
    for n in (8, 512):
        g = gen(11)
        mean = sum(compress_sequential(mlp, 6, method="random", generator=g)(x).detach() for _ in range(n)) / n
        errs.append(float((mean - ref).norm() / ref.norm()))
    assert errs[1] < 0.25 * errs[0]
    # the kept units are rows of W1 and columns of W2 times p_I / k
    l1, l2 = compress_mlp(mlp[0], mlp[2], 6, method="random", generator=gen(3))
    keep = torch.randperm(24, generator=gen(3))[:6]
    torch.testing.assert_close(l1.weight, mlp[0].weight[keep].detach())
    torch.testing.assert_close(l2.weight, mlp[2].weight[:, keep].detach() * 4.0)


def test_sketch_is_unbiased_for_a_linear_mlp():
    mlp = make_mlp(act=nn.Identity())
    x = inputs()
    ref = mlp(x).detach()
    errs = []
    for n in (4, 64):
        mean = sum(compress_sequential(mlp, 24, method="sketch", generator=torch.Generator().manual_seed(s))(x).detach() for s in range(n)) / n
        errs.append(float((mean - ref).norm() / ref.norm()))
    assert errs[1] < 0.5 * errs[0]
    # a fixed seed gives a fixed sketch
    a = compress_sequential(mlp, 8, method="sketch", generator=torch.Generator().manual_seed(3))(x)
    b = compress_sequential(mlp, 8, method="sketch", generator=torch.Generator().manual_seed(3))(x)
    torch.testing.assert_close(a, b)


def test_pruning_keeps_the_budget_and_masks_gradients():
    mlp = make_mlp()
    pruned = compress_sequential(mlp, 6, method="pruning")
    fused = compress_sequential(mlp, 6, method="fusion")
    assert pruned[0].mask.sum() == round(24 * 6 * 6 / 24)
    # same weight budget as the width-6 MLP (biases: p_I vs k differ)
    assert abs(mlp_parameter_count(pruned) - mlp_parameter_count(fused)) == 24 - 6
    kept = pruned[0].mask.bool()
    assert pruned[0].weight[kept].abs().min() >= pruned[0].weight[~kept].abs().max()
    pruned(inputs()).sum().backward()
    assert torch.all(pruned[0].weight.grad[~kept] == 0)


@pytest.mark.parametrize("n,m,d,h", [(5, 3, 2, 0.7), (9, 9, 4, 1.5), (12, 4, 7, 3.0), (1, 1, 3, 0.5)])
def test_mmd2_against_a_naive_double_loop(n, m, d, h):
    x = torch.randn(n, d, dtype=F64, generator=gen(n))
    y = torch.randn(m, d, dtype=F64, generator=gen(m + 100)) + 0.3
    kern = lambda a, b: float(np.exp(-np.sum((a - b) ** 2) / (2 * h * h)))
    xn, yn = x.numpy(), y.numpy()
    kxx = sum(kern(a, b) for a in xn for b in xn) / n**2
    kyy = sum(kern(a, b) for a in yn for b in yn) / m**2
    kxy = sum(kern(a, b) for a in xn for b in yn) / (n * m)
    assert float(mmd2(x, y, h)) == pytest.approx(kxx + kyy - 2 * kxy, rel=1e-10, abs=1e-14)
    assert float(mmd2(x, x, h)) == pytest.approx(0.0, abs=1e-12)
    # the same distribution in another order, or with every point repeated, has MMD 0
    assert float(mmd2(x, torch.cat([x.flip(0), x]), h)) == pytest.approx(0.0, abs=1e-12)


def test_mmd_support_lowers_the_mmd_and_is_used_by_compress_mlp():
    mlp = make_mlp()
    w = sub_mlp_embeddings(mlp[0], mlp[2])
    res = mmd_support(w, 6, steps=300, generator=gen(1))
    assert isinstance(res, MMDSupport)
    start = torch.randperm(24, generator=gen(1))[:6]  # the documented random start
    assert res.history[0] == pytest.approx(float(mmd2(w, w[start], res.bandwidth)), rel=1e-4)
    assert res.history[-1] < 0.5 * res.history[0]
    assert float(mmd2(w, res.points, res.bandwidth)) == pytest.approx(min(res.history), rel=1e-3)
    assert len(res.history) <= 301
    quick = mmd_support(w, 6, steps=5, generator=gen(1))
    assert not quick.converged and len(quick.history) == 6
    # eq. 10: the compressed MLP is the uniform mixture of the support points times p_I / k
    l1, l2 = compress_mlp(mlp[0], mlp[2], 6, method="mmd", support=res)
    y = torch.cat([l1.weight, l1.bias[:, None], l2.weight.T / (24 / 6)], dim=1).detach()
    torch.testing.assert_close(y, res.points)
    again = compress_mlp(mlp[0], mlp[2], 6, method="mmd", mmd_steps=300, generator=gen(1))
    torch.testing.assert_close(again[0].weight, l1.weight)
    full = mmd_support(w, 24, generator=gen(0))
    assert full.history == [pytest.approx(0.0, abs=1e-12)]
    with pytest.raises(ValueError, match="support"):
        compress_mlp(mlp[0], mlp[2], 5, method="mmd", support=res)
    with pytest.raises(ValueError, match="bandwidth"):
        mmd2(w, w, 0.0)


@pytest.mark.parametrize("method", METHODS)
def test_every_method_shapes(method):
    mlp = make_mlp()
    l1, l2 = compress_mlp(mlp[0], mlp[2], 5, method=method, mmd_steps=3)
    kind = LowRankLinear if method == "svd" else CompressedLinear
    assert isinstance(l1, kind) and isinstance(l2, kind)
    width = 24 if method in ("svd", "pruning") else 5
    assert l1.out_features == width and l2.in_features == width
    assert next(l1.parameters()).dtype == F64
    assert mlp[0].weight.shape == (24, 6)  # the original is untouched
