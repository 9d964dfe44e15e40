"""Tests of :mod:`kernels.fusion.clustering` (the sub-MLP view and k-means).

References are independent: a loop over sub-MLPs, scikit-learn's KMeans, numpy's SVD,
per-sample autograd loops and :func:`kernels.ntk.empirical_ntk`."""

from __future__ import annotations

import pytest
import torch

from kernels.fusion import (
    averaging_matrix,
    clustering_matrix,
    kmeans,
    scaling_matrix,
    sub_mlp_embeddings,
)

from fusion_helpers import F64, gen, inputs, make_mlp


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


def test_kmeans_random_init_is_deterministic_and_close_to_kmeans_pp():
    pts = torch.randn(150, 4, dtype=F64, generator=gen(9))
    a = kmeans(pts, 6, n_init=3, init="random", generator=gen(2))
    b = kmeans(pts, 6, n_init=3, init="random", generator=gen(2))
    assert torch.equal(a.labels, b.labels)
    assert len(set(a.labels.tolist())) == 6
    pp = kmeans(pts, 6, n_init=3, generator=gen(2))
    assert a.inertia < 1.5 * pp.inertia
