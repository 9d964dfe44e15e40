"""Tests of :mod:`kernels.toeplitz.ski` (SKI-TNO, Algorithm 1, and its interpolation).

Independent references: explicit double loops for Toeplitz products and interpolation
weights, ``scipy.linalg.toeplitz`` / ``scipy.linalg.matmul_toeplitz``,
``scipy.signal.hilbert``, ``numpy.interp`` for the piecewise-linear RPE,
``torch.autograd.gradcheck`` (float64) for gradients, and causality checks that
perturb future tokens."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg
import scipy.signal
import torch

from kernels.toeplitz import (
    SKITNO,
    PiecewiseLinearRPE,
    inducing_points,
    inverse_time_warp,
    linear_interpolation_weights,
    cubic_interpolation_weights,
    interpolation_weights,
    ski_matvec,
)

from toeplitz_helpers import F64, _gradcheck_module, gen, naive_toeplitz, per_channel_matmul, randn


def naive_weights(n: int, r: int) -> np.ndarray:
    """Linear interpolation from r points evenly spaced on [0, n-1], one token at a time."""
    w = np.zeros((n, r))
    if r == 1:
        w[:, 0] = 1.0
        return w
    h = (n - 1) / (r - 1)
    points = np.arange(r) * h
    for i in range(n):
        k = min(int(np.searchsorted(points, i, side="right")) - 1, r - 2)
        s = (i - points[k]) / h
        w[i, k], w[i, k + 1] = 1.0 - s, s
    return w


@pytest.mark.parametrize("n,r", [(1, 1), (2, 1), (2, 2), (3, 2), (10, 4), (17, 17), (100, 7)])
def test_interpolation_weights(n, r):
    w = linear_interpolation_weights(n, r, dtype=F64).numpy()
    np.testing.assert_allclose(w, naive_weights(n, r), atol=1e-13)
    np.testing.assert_allclose(w.sum(1), 1.0, atol=1e-13)
    assert ((w != 0).sum(1) <= 2).all()
    points = inducing_points(n, r, dtype=F64).numpy()
    if r > 1:
        # linear interpolation is exact on linear functions: W p = positions
        np.testing.assert_allclose(w @ points, np.arange(n), atol=1e-11)
        np.testing.assert_allclose(points[[0, -1]], [0, n - 1])


@pytest.mark.parametrize(
    "n,r,interpolation",
    [(1, 1, "linear"), (2, 2, "linear"), (9, 3, "linear"), (50, 8, "linear"), (257, 16, "linear"),
     (3, 3, "cubic"), (9, 3, "cubic"), (50, 8, "cubic"), (257, 16, "cubic")],
)
def test_ski_sparse_equals_dense_and_naive(n, r, interpolation):
    c = 3
    a = randn(c, 2 * r - 1, seed=r)
    x = randn(2, n, c, seed=n)
    y_sparse = ski_matvec(a, x, method="sparse", interpolation=interpolation)
    y_dense = ski_matvec(a, x, method="dense", interpolation=interpolation)
    torch.testing.assert_close(y_sparse, y_dense, rtol=1e-11, atol=1e-11)
    w = naive_weights(n, r) if interpolation == "linear" else naive_cubic_weights(n, r)
    a_mat = np.stack(
        [scipy.linalg.toeplitz(a[i, r - 1 :].numpy(), a[i, :r].flip(0).numpy()) for i in range(c)]
    )
    t_low = np.einsum("ik,ckl,jl->cij", w, a_mat, w)
    np.testing.assert_allclose(
        y_sparse.numpy(), per_channel_matmul(t_low, x.numpy()), rtol=1e-10, atol=1e-10
    )


def naive_cubic_weights(n: int, r: int) -> np.ndarray:
    """Keys' cubic convolution (a = -1/2) from r points on [0, n-1], written as a loop.

    Row i interpolates s = i (r-1)/(n-1) from the points k-1..k+2 around it with the
    kernel u(d) = 1.5|d|^3 - 2.5|d|^2 + 1 (|d| <= 1), -0.5|d|^3 + 2.5|d|^2 - 4|d| + 2
    (1 < |d| < 2); the virtual points -1 and r are 3 z_0 - 3 z_1 + z_2 and its mirror.
    """

    def u(d: float) -> float:
        d = abs(d)
        if d <= 1:
            return 1.5 * d**3 - 2.5 * d**2 + 1
        if d < 2:
            return -0.5 * d**3 + 2.5 * d**2 - 4 * d + 2
        return 0.0

    w = np.zeros((n, r))
    for i in range(n):
        s = i * (r - 1) / (n - 1)
        k = min(int(np.floor(s)), r - 2)
        for j in range(k - 1, k + 3):
            weight = u(s - j)
            if j == -1:
                w[i, 0] += 3 * weight
                w[i, 1] -= 3 * weight
                w[i, 2] += weight
            elif j == r:
                w[i, r - 1] += 3 * weight
                w[i, r - 2] -= 3 * weight
                w[i, r - 3] += weight
            else:
                w[i, j] += weight
    return w


@pytest.mark.parametrize("n,r", [(3, 3), (4, 3), (10, 4), (17, 17), (100, 7), (257, 16)])
def test_cubic_interpolation_weights(n, r):
    w = cubic_interpolation_weights(n, r, dtype=F64).numpy()
    np.testing.assert_allclose(w, naive_cubic_weights(n, r), atol=1e-12)
    np.testing.assert_allclose(w.sum(1), 1.0, atol=1e-12)
    np.testing.assert_allclose(interpolation_weights(n, r, interpolation="cubic", dtype=F64), w)
    # Keys' kernel with the quadratic end rule reproduces every quadratic exactly
    # (linear weights only reproduce lines).
    p = inducing_points(n, r, dtype=F64).numpy()
    t = np.arange(n, dtype=float)
    for poly in (np.ones_like, lambda v: v, lambda v: (v - 0.3 * n) ** 2):
        np.testing.assert_allclose(w @ poly(p), poly(t), atol=1e-9 * max(1, n**2))
    if n > r:
        lin = linear_interpolation_weights(n, r, dtype=F64).numpy()
        assert np.abs(lin @ (p - 0.3 * n) ** 2 - (t - 0.3 * n) ** 2).max() > 1e-3


def test_cubic_ski_is_third_order_and_differentiable():
    # SKI error ||W A W^T - T||_2 on a smooth kernel: ~r^-2 for linear, ~r^-3 for cubic.
    n, ranks = 512, [16, 32, 64, 128]
    lags = torch.arange(n, dtype=F64)

    def kernel(t):
        return torch.exp(-((t / 40.0) ** 2)) * torch.cos(t / 15.0)

    t_mat = kernel(lags[:, None] - lags[None, :])
    slopes, last = {}, {}
    for interp in ("linear", "cubic"):
        errs = []
        for r in ranks:
            w = interpolation_weights(n, r, interpolation=interp, dtype=F64)
            p = inducing_points(n, r, dtype=F64)
            errs.append(torch.linalg.matrix_norm(w @ kernel(p[:, None] - p[None, :]) @ w.T - t_mat, 2))
        slopes[interp] = np.polyfit(np.log(ranks), np.log(np.array(errs)), 1)[0]
        last[interp] = float(errs[-1])
    assert -2.3 < slopes["linear"] < -1.6, slopes
    assert slopes["cubic"] < -2.7, slopes
    assert last["cubic"] < 0.1 * last["linear"], last
    a = randn(2, 9, seed=3).requires_grad_()
    x = randn(2, 11, 2, seed=4).requires_grad_()
    assert torch.autograd.gradcheck(lambda a, x: ski_matvec(a, x, interpolation="cubic"), (a, x))
    layer = SKITNO(4, rank=8, filter_size=3, interpolation="cubic", generator=gen(5), dtype=F64)
    x = randn(2, 40, 4, seed=6)
    dense = torch.einsum("cnm,bmc->bnc", layer.dense_matrix(40), x)
    torch.testing.assert_close(layer(x), dense, rtol=1e-11, atol=1e-11)
    layer.low_rank = "dense"
    torch.testing.assert_close(layer(x), dense, rtol=1e-11, atol=1e-11)


def test_inverse_time_warp_and_piecewise_linear_rpe():
    t = torch.tensor([-50.0, -2.0, -1.0, 0.0, 1.0, 3.0, 1e4], dtype=F64)
    u = inverse_time_warp(t, 0.9)
    np.testing.assert_allclose(u.numpy(), np.sign(t.numpy()) * 0.9 ** np.abs(t.numpy()))
    assert u.abs().max() <= 1.0 and u[3] == 0.0
    rpe = PiecewiseLinearRPE(2, 3, init_std=1.0, generator=gen(0), dtype=F64)
    knots = rpe.knot_values().detach().numpy()
    grid = np.linspace(-1, 1, 7)
    assert knots.shape == (2, 7) and knots[:, 3].tolist() == [0.0, 0.0]
    probe = torch.linspace(-1, 1, 101, dtype=F64)
    out = rpe(probe).detach().numpy()
    for ch in range(2):
        np.testing.assert_allclose(out[ch], np.interp(probe.numpy(), grid, knots[ch]), atol=1e-13)
    assert rpe(torch.zeros(1, dtype=F64)).abs().max() == 0.0


@pytest.mark.parametrize(
    "n,r,m",
    [(1, 1, 1), (2, 2, 1), (2, 1, 2), (7, 3, 4), (40, 8, 5), (64, 16, 6), (37, 4, 32), (33, 5, 17)],
)
def test_skitno_matches_naive_sparse_plus_low_rank(n, r, m):
    ski = SKITNO(3, rank=r, filter_size=m, decay=0.8, generator=gen(n), dtype=F64)
    with torch.no_grad():
        ski.rpe.values.normal_(generator=gen(5))  # larger than the initial 0.1 scale
    x = randn(2, n, 3, seed=n)
    # band: lags -((m-1)//2) .. m//2 in increasing order
    band = np.zeros((3, 2 * n - 1))
    lags = list(range(-((m - 1) // 2), m // 2 + 1))
    assert lags == list(ski.sparse_lags)
    for k, lag in enumerate(lags):
        band[:, n - 1 + lag] = ski.sparse_coeffs[:, k].detach().numpy()
    # low rank: A_ij = RPE(x(p_i - p_j)), RPE by numpy.interp of the knot values
    h = 0.0 if r == 1 else (n - 1) / (r - 1)
    diffs = np.arange(-(r - 1), r) * h
    warped = np.sign(diffs) * 0.8 ** np.abs(diffs)
    knots = ski.rpe.knot_values().detach().numpy()
    grid = np.linspace(-1, 1, knots.shape[1])
    a = np.stack([np.interp(warped, grid, knots[ch]) for ch in range(3)])
    np.testing.assert_allclose(ski.low_rank_coeffs(n).detach().numpy(), a, atol=1e-13)
    w = naive_weights(n, r)
    t_low = np.einsum("ik,ckl,jl->cij", w, naive_toeplitz(a), w)
    t = naive_toeplitz(band) + t_low
    np.testing.assert_allclose(ski.dense_matrix(n).detach().numpy(), t, rtol=1e-10, atol=1e-12)
    y_sparse = ski(x)
    ski.low_rank = "dense"
    y_dense = ski(x)
    ref = per_channel_matmul(t, x.numpy())
    np.testing.assert_allclose(y_sparse.detach().numpy(), ref, rtol=1e-10, atol=1e-11)
    np.testing.assert_allclose(y_dense.detach().numpy(), ref, rtol=1e-10, atol=1e-11)


def test_ski_low_rank_approximates_smooth_toeplitz():
    # Theorem 1 in action: on a smooth kernel the SKI error shrinks as r grows.
    n = 200
    lags = np.arange(-(n - 1), n)
    kernel = lambda t: np.exp(-((t / 60.0) ** 2))  # noqa: E731
    t_full = naive_toeplitz(kernel(lags)[None])[0]
    errors = []
    for r in (5, 10, 20, 40):
        h = (n - 1) / (r - 1)
        a = kernel(np.arange(-(r - 1), r) * h)
        w = naive_weights(n, r)
        approx = w @ naive_toeplitz(a[None])[0] @ w.T
        errors.append(np.linalg.norm(approx - t_full, 2))
    assert all(e2 < e1 for e1, e2 in zip(errors, errors[1:]))
    assert errors[-1] < 0.05 * errors[0]


def test_skitno_large_batch_matches_dense():
    # more than 16 batch rows take the other copy path of the band's backward
    ski = SKITNO(2, rank=3, filter_size=4, generator=gen(6), dtype=F64)
    x = randn(20, 9, 2, seed=7).requires_grad_()
    y = ski(x)
    ref = torch.einsum("cij,bjc->bic", ski.dense_matrix(9), x)
    torch.testing.assert_close(y, ref, rtol=1e-10, atol=1e-12)
    g = randn(20, 9, 2, seed=8)
    got = torch.autograd.grad(y, [x, ski.sparse_coeffs], g)
    want = torch.autograd.grad(ref, [x, ski.sparse_coeffs], g)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("low_rank", ["sparse", "dense"])
def test_skitno_gradcheck(low_rank):
    ski = SKITNO(
        2, rank=3, filter_size=3, decay=0.7, low_rank=low_rank, generator=gen(2), dtype=F64
    )
    _gradcheck_module(ski, randn(2, 7, 2, seed=1))
