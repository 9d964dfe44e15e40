"""Tests for kernels.fusion (chapter 6): sub-MLP view, k-means, MLP fusion (eq. 5), the
baselines of Section 5.3, FFN blocks of models, NTK measures and bad input.

References are independent: a loop over sub-MLPs, scikit-learn's KMeans, numpy's SVD,
per-sample autograd loops and :func:`kernels.ntk.empirical_ntk`.
"""

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
    compress_model,
    compress_sequential,
    ffn_output_error,
    find_ffn_blocks,
    fuse_mlp,
    kernel_cosine,
    kernel_error,
    kmeans,
    layerwise_tuning,
    mlp_gradients,
    mlp_parameter_count,
    mmd2,
    mmd_support,
    scaled_kernel_error,
    scaling_matrix,
    sgd_kernel,
    sign_kernel,
    sub_mlp_embeddings,
    svd_rank_for_budget,
)
from kernels.ntk import empirical_ntk

F64 = torch.float64


def make_mlp(p=6, p_inner=24, seed=0, act=None) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(p, p_inner), act or nn.GELU(), nn.Linear(p_inner, p)).to(F64)


def inputs(n=7, p=6, seed=1) -> torch.Tensor:
    return torch.randn(n, p, dtype=F64, generator=torch.Generator().manual_seed(seed))


class Head(nn.Module):
    """Scalar output: a fixed projection of an MLP's output."""

    def __init__(self, mlp: nn.Module, u: torch.Tensor) -> None:
        super().__init__()
        self.mlp = mlp
        self.register_buffer("u", u)

    def forward(self, x):
        return self.mlp(x) @ self.u


def tiny_bert(seed=0):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(seed)
    cfg = transformers.BertConfig(
        vocab_size=40, hidden_size=8, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=16, max_position_embeddings=16, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    model = transformers.BertModel(cfg).eval()
    return model


# ---------------------------------------------------------------- the sub-MLP view


def test_mlp_is_sum_of_sub_mlps():
    mlp = make_mlp()
    x = inputs()
    w = sub_mlp_embeddings(mlp[0], mlp[2])
    p = 6
    assert w.shape == (24, 2 * p + 1)
    total = mlp[2].bias.detach().clone().expand(x.shape[0], p).clone()
    for i in range(24):
        w1, b1, w2 = w[i, :p], w[i, p], w[i, p + 1 :]
        total += torch.nn.functional.gelu(x @ w1 + b1)[:, None] * w2[None, :]
    torch.testing.assert_close(total, mlp(x).detach())


# ---------------------------------------------------------------- k-means


def test_kmeans_deterministic_and_close_to_sklearn():
    from sklearn.cluster import KMeans

    pts = torch.randn(200, 5, dtype=F64, generator=torch.Generator().manual_seed(3))
    a = kmeans(pts, 8, n_init=4, generator=torch.Generator().manual_seed(7))
    b = kmeans(pts, 8, n_init=4, generator=torch.Generator().manual_seed(7))
    assert torch.equal(a.labels, b.labels) and a.inertia == b.inertia
    assert sorted(set(a.labels.tolist())) == list(range(8))
    # inertia is the sum of squared distances to the returned centroids
    d = ((pts - a.centroids[a.labels]) ** 2).sum()
    assert abs(float(d) - a.inertia) < 1e-8 * a.inertia
    sk = KMeans(8, n_init=4, random_state=0).fit(pts.numpy())
    assert a.inertia <= 1.05 * sk.inertia_
    # centroids are the cluster means: C-bar W
    c = clustering_matrix(a.labels, 8)
    torch.testing.assert_close(averaging_matrix(c) @ pts, a.centroids)


@pytest.mark.parametrize("n,d,k,n_init", [(300, 17, 40, 2), (64, 5, 64, 1), (120, 9, 7, 3)])
def test_kmeans_gram_seeding_equals_direct_distances(monkeypatch, n, d, k, n_init):
    # k-means++ seeds from the points' Gram matrix when it fits (chapter 6's speed-up); the
    # direct distances (the path for large n) must give the same clustering
    import kernels.fusion.clustering as clustering

    x = torch.randn(n, d, generator=torch.Generator().manual_seed(n + k), dtype=torch.float64)
    with_gram = kmeans(x, k, n_init=n_init, generator=torch.Generator().manual_seed(3))
    monkeypatch.setattr(clustering, "_GRAM_MAX_ENTRIES", 0)
    direct = kmeans(x, k, n_init=n_init, generator=torch.Generator().manual_seed(3))
    assert torch.equal(with_gram.labels, direct.labels)
    assert torch.allclose(with_gram.centroids, direct.centroids, rtol=0, atol=1e-12)
    assert with_gram.inertia == pytest.approx(direct.inertia, rel=1e-12)


def test_kmeans_restarts_never_worse():
    pts = torch.randn(120, 3, dtype=F64, generator=torch.Generator().manual_seed(4))
    one = kmeans(pts, 10, n_init=1, generator=torch.Generator().manual_seed(2))
    many = kmeans(pts, 10, n_init=6, generator=torch.Generator().manual_seed(2))  # the first restart is the same draw
    assert many.inertia <= one.inertia + 1e-12


def test_kmeans_k_equals_n_gives_singletons():
    pts = torch.randn(15, 4, dtype=F64)
    res = kmeans(pts, 15, generator=torch.Generator().manual_seed(0))
    assert sorted(res.labels.tolist()) == list(range(15))
    assert res.inertia < 1e-12


def test_p_counts_cluster_sizes():
    labels = torch.tensor([0, 2, 2, 1, 2, 0])
    c = clustering_matrix(labels, 3)
    p = scaling_matrix(c)
    torch.testing.assert_close(p, torch.diag(torch.tensor([2.0, 1.0, 3.0], dtype=F64)))
    torch.testing.assert_close(averaging_matrix(c).sum(1), torch.ones(3, dtype=F64))


# ---------------------------------------------------------------- fusion


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


# ---------------------------------------------------------------- baselines


def gen(seed):
    return torch.Generator().manual_seed(seed)


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


# ---------------------------------------------------------------- NTK measures


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


# ---------------------------------------------------------------- transformers


def test_compress_bert_layers():
    model = tiny_bert()
    blocks = find_ffn_blocks(model)
    assert len(blocks) == 2
    ids = torch.tensor([[2, 5, 7, 9, 3], [2, 4, 6, 0, 0]])
    mask = (ids != 0).long()
    ref = model(input_ids=ids, attention_mask=mask).last_hidden_state
    same = compress_model(model, 16, layers=[-1], method="fusion")
    torch.testing.assert_close(same(input_ids=ids, attention_mask=mask).last_hidden_state, ref, atol=1e-5, rtol=1e-5)
    comp = compress_model(model, 4, layers=[1], method="fusion")
    cb = find_ffn_blocks(comp)
    assert isinstance(cb[1].linear1, CompressedLinear) and cb[1].linear1.out_features == 4
    assert isinstance(cb[0].linear1, nn.Linear) and not isinstance(cb[0].linear1, CompressedLinear)
    assert isinstance(find_ffn_blocks(model)[1].linear1, nn.Linear)  # a copy by default
    assert mlp_parameter_count(comp, [1]) == 8 * 4 + 4 + 4 * 8 + 8


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


def test_layerwise_tuning_reduces_the_loss():
    teacher = tiny_bert()
    student = compress_model(teacher, 3, layers=[0, 1], method="sketch", generator=torch.Generator().manual_seed(0))
    ids = torch.randint(1, 40, (8, 6), generator=torch.Generator().manual_seed(0))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    before = {n: p.detach().clone() for n, p in student.named_parameters()}
    losses = layerwise_tuning(student, teacher, [batch] * 30, lr=1e-2)
    assert losses[-1] < 0.7 * losses[0]
    for n, p in student.named_parameters():
        changed = not torch.equal(before[n], p.detach())
        assert changed == (".intermediate.dense." in n or ".output.dense." in n and "attention" not in n), n
        assert p.requires_grad


def test_layerwise_tuning_at_lr_zero_measures_without_moving():
    """lr = 0 gives the eq. 6 losses of the untouched student (chapter 6 relies on it); lr < 0 is refused."""
    teacher = tiny_bert()
    student = compress_model(teacher, 3, layers=[0, 1], method="sketch", generator=torch.Generator().manual_seed(0))
    ids = torch.randint(1, 40, (8, 6), generator=torch.Generator().manual_seed(1))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    before = {n: p.detach().clone() for n, p in student.named_parameters()}
    losses = layerwise_tuning(student, teacher, [batch] * 3, lr=0.0)
    assert all(torch.equal(before[n], p.detach()) for n, p in student.named_parameters())
    assert len(losses) == 3 and losses[0] > 0
    torch.testing.assert_close(torch.tensor(losses), torch.full((3,), losses[0]), rtol=1e-12, atol=0)
    with pytest.raises(ValueError, match="lr"):
        layerwise_tuning(student, teacher, [batch], lr=-1e-3)


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize("k, exc", [(0, ValueError), (-3, ValueError), (25, ValueError), (2.0, TypeError), (True, TypeError)])
def test_bad_k(k, exc):
    mlp = make_mlp()
    with pytest.raises(exc, match="k"):
        fuse_mlp(mlp[0], mlp[2], k)


def test_mismatched_linears():
    a, b = nn.Linear(6, 24), nn.Linear(20, 6)
    with pytest.raises(ValueError, match="mismatched linear layers"):
        fuse_mlp(a, b, 4)
    with pytest.raises(ValueError, match="p -> p_I -> p"):
        fuse_mlp(nn.Linear(6, 24), nn.Linear(24, 5), 4)
    with pytest.raises(TypeError, match="linear1"):
        fuse_mlp(nn.Conv1d(6, 24, 1), nn.Linear(24, 6), 4)


def test_bad_method_and_generator():
    mlp = make_mlp()
    with pytest.raises(ValueError, match="method"):
        compress_mlp(mlp[0], mlp[2], 4, method="quantize")
    with pytest.raises(TypeError, match="generator"):
        compress_mlp(mlp[0], mlp[2], 4, generator=3)
    with pytest.raises(TypeError, match="generator"):
        kmeans(torch.randn(10, 2, dtype=F64), 3, generator=0)
    with pytest.raises(ValueError, match="init"):
        kmeans(torch.randn(10, 2, dtype=F64), 3, init="forgy")
    # the default generator is a fresh one seeded with 0, never torch's global one
    a = compress_sequential(mlp, 4, method="sketch")
    torch.manual_seed(123)
    b = compress_sequential(mlp, 4, method="sketch")
    torch.testing.assert_close(a[0].weight, b[0].weight)


def test_kmeans_random_init_is_deterministic_and_close_to_kmeans_pp():
    pts = torch.randn(150, 4, dtype=F64, generator=gen(9))
    a = kmeans(pts, 6, n_init=3, init="random", generator=gen(2))
    b = kmeans(pts, 6, n_init=3, init="random", generator=gen(2))
    assert torch.equal(a.labels, b.labels)
    assert len(set(a.labels.tolist())) == 6
    pp = kmeans(pts, 6, n_init=3, generator=gen(2))
    assert a.inertia < 1.5 * pp.inertia


def test_model_without_ffn_structure():
    with pytest.raises(ValueError, match="expected structure"):
        find_ffn_blocks(nn.Module())
    with pytest.raises(ValueError, match="Sequential"):
        find_ffn_blocks(nn.Sequential(nn.Linear(3, 4), nn.ReLU()))
    with pytest.raises(TypeError, match="model"):
        find_ffn_blocks("bert")
    with pytest.raises(ValueError, match="layers"):
        compress_model(tiny_bert(), 4, layers=[2])
    with pytest.raises(ValueError, match="repeat"):
        compress_model(tiny_bert(), 4, layers=[0, -2])


def test_bad_kmeans_and_kernel_input():
    with pytest.raises(ValueError, match="k must be at most"):
        kmeans(torch.randn(5, 2), 6)
    with pytest.raises(ValueError, match="points"):
        kmeans(torch.randn(5), 2)
    with pytest.raises(ValueError, match="same shape"):
        kernel_error(torch.zeros(2, 2), torch.zeros(3, 3))
    with pytest.raises(ValueError, match="same number of parameters"):
        sgd_kernel(torch.zeros(2, 3), torch.zeros(2, 4))
    with pytest.raises(ValueError, match="1-D"):
        mlp_gradients(make_mlp(), lambda m: m(inputs()))
    with pytest.raises(ValueError, match="labels must lie"):
        clustering_matrix(torch.tensor([0, 3]), 3)


# ---------------------------------------------------------------- devices


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine")
def test_compression_and_gradients_on_cuda():
    mlp = make_mlp().cuda()
    x = inputs().cuda()
    for method in METHODS:
        out = compress_sequential(mlp, 24, method=method, mmd_steps=3)
        tensors = list(out.parameters()) + list(out.buffers())
        assert tensors and all(t.device.type == "cuda" for t in tensors), method
        assert out(x).device.type == "cuda"
    fused = compress_sequential(mlp, 24, method="fusion")
    torch.testing.assert_close(fused(x), mlp(x))
    u = torch.ones(6, dtype=F64, device="cuda")
    g_ref = mlp_gradients(mlp, lambda m: m(x) @ u)
    g_new = mlp_gradients(fused, lambda m: m(x) @ u)
    assert kernel_error(sign_kernel(g_ref), sign_kernel(g_new)) < 1e-8 * float(sign_kernel(g_ref).norm())
