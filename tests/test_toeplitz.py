"""Tests for kernels.toeplitz (chapter 4).

Independent references: explicit double loops for Toeplitz products and interpolation
weights, ``scipy.linalg.toeplitz`` / ``scipy.linalg.matmul_toeplitz``,
``scipy.signal.hilbert``, ``numpy.interp`` for the piecewise-linear RPE,
``torch.autograd.gradcheck`` (float64) for gradients, and causality checks that
perturb future tokens.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.linalg
import scipy.signal
import torch
from torch import nn
from torch.func import functional_call

from kernels.toeplitz import (
    FDTNO,
    GLU,
    GTU,
    SKITNO,
    TNNBlock,
    TNNEncoder,
    TNO,
    PiecewiseLinearRPE,
    causal_kernel_from_real_response,
    discrete_hilbert,
    fft_length,
    frequency_response_decay,
    inducing_points,
    inverse_time_warp,
    linear_interpolation_weights,
    cubic_interpolation_weights,
    interpolation_weights,
    make_tno,
    rpe_mlp,
    ski_matvec,
    toeplitz_dense,
    toeplitz_matvec,
)

F64 = torch.float64
LENGTHS = [1, 2, 3, 8, 13]


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def randn(*shape: int, seed: int, dtype=F64) -> torch.Tensor:
    return torch.randn(*shape, generator=gen(seed), dtype=dtype)


def naive_toeplitz(coeffs: np.ndarray, causal: bool = False) -> np.ndarray:
    """T[i, j] = t_{i-j} with an explicit double loop (layout of the module docstring)."""
    n = coeffs.shape[-1] if causal else (coeffs.shape[-1] + 1) // 2
    out = np.zeros(coeffs.shape[:-1] + (n, n))
    for i in range(n):
        for j in range(n):
            if causal:
                if i >= j:
                    out[..., i, j] = coeffs[..., i - j]
            else:
                out[..., i, j] = coeffs[..., n - 1 + i - j]
    return out


def per_channel_matmul(t: np.ndarray, x: np.ndarray) -> np.ndarray:
    """(c, n, n) matrices times (b, n, c) sequences, channel by channel."""
    return np.einsum("cij,bjc->bic", t, x)


def shift_future(x: torch.Tensor, k: int, seed: int) -> torch.Tensor:
    """Copy of x with the tokens k, k+1, ... replaced by fresh noise."""
    out = x.clone()
    out[..., k:, :] = randn(*out[..., k:, :].shape, seed=seed, dtype=x.dtype)
    return out


# --------------------------------------------------------------------------------------
# toeplitz_matvec and toeplitz_dense
# --------------------------------------------------------------------------------------


def test_fft_length_is_minimal_5_smooth():
    def smooth(v: int) -> bool:
        for p in (2, 3, 5):
            while v % p == 0:
                v //= p
        return v == 1

    for n in range(1, 300):
        length = fft_length(n)
        assert length >= 2 * n - 1 and smooth(length)
        assert not any(smooth(v) for v in range(2 * n - 1, length)), n
    assert fft_length(4096) == 8192 and fft_length(512) == 1024


@pytest.mark.parametrize("n", LENGTHS)
def test_toeplitz_dense_layout_matches_loop_and_scipy(n):
    coeffs = randn(3, 2 * n - 1, seed=n)
    dense = toeplitz_dense(coeffs, n)
    np.testing.assert_array_equal(dense.numpy(), naive_toeplitz(coeffs.numpy()))
    col, row = coeffs[0, n - 1 :].numpy(), coeffs[0, : n].flip(0).numpy()
    np.testing.assert_array_equal(dense[0].numpy(), scipy.linalg.toeplitz(col, row))
    causal = randn(2, n, seed=n + 100)
    np.testing.assert_array_equal(
        toeplitz_dense(causal, causal=True).numpy(), naive_toeplitz(causal.numpy(), True)
    )


@pytest.mark.parametrize("n", LENGTHS + [64, 100])
def test_toeplitz_matvec_matches_dense_and_scipy(n):
    c, b = 3, 2
    coeffs = randn(c, 2 * n - 1, seed=n)
    x = randn(b, n, c, seed=n + 1)
    y = toeplitz_matvec(coeffs, x)
    ref = per_channel_matmul(naive_toeplitz(coeffs.numpy()), x.numpy())
    np.testing.assert_allclose(y.numpy(), ref, rtol=1e-11, atol=1e-11)
    for ch in range(c):
        col = coeffs[ch, n - 1 :].numpy()
        row = coeffs[ch, :n].flip(0).numpy()
        xs = x[..., ch].numpy().T  # (n, b): scipy multiplies columns
        np.testing.assert_allclose(
            y[..., ch].numpy().T, scipy.linalg.toeplitz(col, row) @ xs, rtol=1e-11, atol=1e-11
        )
        np.testing.assert_allclose(
            y[..., ch].numpy().T, scipy.linalg.matmul_toeplitz((col, row), xs),
            rtol=1e-10, atol=1e-10,
        )


@pytest.mark.parametrize("n", LENGTHS + [64])
def test_toeplitz_matvec_causal(n):
    coeffs = randn(4, n, seed=n)
    x = randn(2, n, 4, seed=n + 7)
    y = toeplitz_matvec(coeffs, x, causal=True)
    ref = per_channel_matmul(naive_toeplitz(coeffs.numpy(), causal=True), x.numpy())
    np.testing.assert_allclose(y.numpy(), ref, rtol=1e-11, atol=1e-11)
    # same as the full layout with zero negative lags
    full = torch.cat([torch.zeros(4, n - 1, dtype=F64), coeffs], dim=1)
    torch.testing.assert_close(toeplitz_matvec(full, x), y, rtol=1e-11, atol=1e-11)
    # causal: output i does not depend on tokens > i
    k = n // 2
    y2 = toeplitz_matvec(coeffs, shift_future(x, k, seed=1), causal=True)
    torch.testing.assert_close(y2[:, :k], y[:, :k], rtol=1e-12, atol=1e-12)


def test_toeplitz_matvec_broadcasting_and_float32():
    n, c = 37, 5
    x = randn(2, 3, n, c, seed=0)
    coeffs = randn(3, c, 2 * n - 1, seed=1)  # per (second) batch index
    y = toeplitz_matvec(coeffs, x)
    assert y.shape == (2, 3, n, c)
    for i in range(2):
        for j in range(3):
            ref = per_channel_matmul(naive_toeplitz(coeffs[j].numpy()), x[i, j][None].numpy())[0]
            np.testing.assert_allclose(y[i, j].numpy(), ref, rtol=1e-11, atol=1e-11)
    shared = randn(1, 2 * n - 1, seed=2)  # one kernel for every channel
    torch.testing.assert_close(
        toeplitz_matvec(shared, x), toeplitz_matvec(shared.expand(c, -1), x)
    )
    y32 = toeplitz_matvec(coeffs.float(), x.float())
    assert y32.dtype == torch.float32
    torch.testing.assert_close(y32.double(), y, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("n", [1, 2, 5])
@pytest.mark.parametrize("causal", [False, True])
def test_toeplitz_matvec_gradcheck(n, causal):
    coeffs = randn(2, n if causal else 2 * n - 1, seed=n).requires_grad_()
    x = randn(3, n, 2, seed=n + 1).requires_grad_()
    assert torch.autograd.gradcheck(
        lambda c, v: toeplitz_matvec(c, v, causal=causal), (coeffs, x)
    )
    # coefficients with more batch dimensions than x (x broadcast in the forward)
    batched = randn(2, 2, n if causal else 2 * n - 1, seed=n + 2).requires_grad_()
    single = randn(n, 2, seed=n + 3).requires_grad_()
    assert torch.autograd.gradcheck(
        lambda c, v: toeplitz_matvec(c, v, causal=causal), (batched, single)
    )


# --------------------------------------------------------------------------------------
# TNO
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("causal", [False, True])
def test_tno_coefficients_and_forward(n, causal):
    tno = TNO(4, causal=causal, decay=0.9, rpe_width=8, rpe_depth=2, generator=gen(0), dtype=F64)
    lags = np.arange(-(n - 1), n)
    with torch.no_grad():
        rpe = tno.rpe(torch.tensor(lags, dtype=F64)[:, None]).numpy().T  # (4, 2n-1)
    want = rpe * 0.9 ** np.abs(lags)
    if causal:
        want = want[:, n - 1 :]
    coeffs = tno.toeplitz_coeffs(n).detach().numpy()
    np.testing.assert_allclose(coeffs, want, rtol=1e-12, atol=1e-14)
    x = randn(3, n, 4, seed=n)
    y = tno(x)
    ref = per_channel_matmul(naive_toeplitz(want, causal=causal), x.numpy())
    np.testing.assert_allclose(y.detach().numpy(), ref, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(
        tno.dense_matrix(n).detach(), torch.tensor(naive_toeplitz(want, causal=causal))
    )
    if causal and n > 1:
        y2 = tno(shift_future(x, n // 2, seed=3))
        torch.testing.assert_close(y2[:, : n // 2], y[:, : n // 2], rtol=1e-12, atol=1e-12)


def _gradcheck_module(module: nn.Module, x: torch.Tensor) -> None:
    """gradcheck of the forward with respect to the input and every parameter."""
    names = [name for name, _ in module.named_parameters()]
    params = tuple(p.detach().clone().requires_grad_() for _, p in module.named_parameters())

    def fn(inp, *ps):
        return functional_call(module, dict(zip(names, ps)), (inp,))

    inputs = (x.detach().clone().requires_grad_(),) + params
    assert torch.autograd.gradcheck(fn, inputs, fast_mode=True)


@pytest.mark.parametrize("causal", [False, True])
def test_tno_gradcheck(causal):
    tno = TNO(2, causal=causal, rpe_width=4, rpe_depth=2, generator=gen(1), dtype=F64)
    _gradcheck_module(tno, randn(2, 5, 2, seed=0))


# --------------------------------------------------------------------------------------
# SKI-TNO
# --------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------
# FD-TNO, Hilbert transform
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [1, 2, 3, 16, 17])
def test_discrete_hilbert_matches_scipy(size):
    x = randn(3, size, seed=size)
    np.testing.assert_allclose(
        discrete_hilbert(x).numpy(), scipy.signal.hilbert(x.numpy(), axis=-1).imag,
        rtol=1e-12, atol=1e-12,
    )


def test_discrete_hilbert_of_cosine_is_sine():
    size = 64
    t = torch.arange(size, dtype=F64) * (2 * math.pi * 5 / size)
    torch.testing.assert_close(discrete_hilbert(torch.cos(t)), torch.sin(t), atol=1e-12, rtol=0)


@pytest.mark.parametrize("n", [1, 2, 5, 8, 33])
def test_causal_kernel_from_real_response(n):
    real = randn(3, n + 1, seed=n)
    response = causal_kernel_from_real_response(real)
    # the same thing through scipy: Hilbert transform of the even 2n-periodic extension
    even = np.concatenate([real.numpy(), real.numpy()[:, 1:n][:, ::-1]], axis=1)
    want = real.numpy() - 1j * scipy.signal.hilbert(even, axis=-1).imag[:, : n + 1]
    np.testing.assert_allclose(response.numpy(), want, rtol=1e-11, atol=1e-12)
    np.testing.assert_allclose(response.real.numpy(), real.numpy(), atol=1e-12)
    for spectrum in (response.numpy(), want):
        kernel = np.fft.irfft(spectrum, n=2 * n)
        assert np.abs(kernel[:, n + 1 :]).max(initial=0.0) < 1e-13  # negative lags
        assert np.abs(kernel[:, : n + 1]).max() > 1e-3


@pytest.mark.parametrize("n", [1, 2, 5])
def test_causal_kernel_from_real_response_gradcheck(n):
    real = randn(2, n + 1, seed=n).requires_grad_()
    assert torch.autograd.gradcheck(causal_kernel_from_real_response, (real,))


@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("feature", ["omega", "cos"])
def test_fdtno_forward_equals_its_toeplitz_matrix(n, causal, feature):
    fd = FDTNO(
        3, causal=causal, feature=feature, rpe_width=8, rpe_depth=2, generator=gen(n), dtype=F64
    )
    response = fd.frequency_response(n).detach()
    assert response.shape == (3, n + 1)
    # the RPE at omega = m pi / n
    omega = torch.arange(n + 1, dtype=F64) * math.pi / n
    feat = omega / math.pi if feature == "omega" else torch.cos(omega)
    with torch.no_grad():
        rpe = fd.rpe(feat[:, None]).T
    torch.testing.assert_close(response.real, rpe[:3], rtol=1e-12, atol=1e-12)
    if causal:
        kernel = torch.fft.irfft(response, n=2 * n)
        if n > 1:  # negative lags n+1..2n-1 (none when n = 1)
            assert kernel[:, n + 1 :].abs().max() < 1e-13
    else:
        assert response.imag[:, 0].abs().max() == 0 and response.imag[:, n].abs().max() == 0
        if n > 1:
            torch.testing.assert_close(response.imag[:, 1:n], rpe[3:, 1:n])
    x = randn(2, n, 3, seed=n + 1)
    y = fd(x)
    coeffs = fd.toeplitz_coeffs(n).detach()
    assert coeffs.shape == (3, n if causal else 2 * n - 1)
    ref = per_channel_matmul(naive_toeplitz(coeffs.numpy(), causal=causal), x.numpy())
    np.testing.assert_allclose(y.detach().numpy(), ref, rtol=1e-10, atol=1e-12)
    if causal and n > 1:
        y2 = fd(shift_future(x, n // 2, seed=4))
        torch.testing.assert_close(y2[:, : n // 2], y[:, : n // 2], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("n", [1, 2, 7, 64, 100, 257])
@pytest.mark.parametrize("channels", [1, 5])
@pytest.mark.parametrize("causal", [False, True])
def test_fdtno_forward_matches_scipy_toeplitz_of_its_response(n, channels, causal):
    """The FD-TNO forward (causal: Hilbert projection folded into the spectrum at the
    5-smooth length fft_length(n)) against a reference built from the RPE output alone
    with numpy/scipy: the kernel by numpy's inverse rFFT (causal: of the response
    real - i * Hilbert(real), scipy.signal.hilbert of the even extension), then one dense
    scipy.linalg.toeplitz matrix per channel."""
    fd = FDTNO(channels, causal=causal, rpe_width=8, rpe_depth=2, generator=gen(n + channels),
               dtype=F64)
    omega = np.arange(n + 1) * math.pi / n
    with torch.no_grad():
        rpe = fd.rpe(torch.tensor(omega / math.pi)[:, None]).numpy().T  # (channels or 2c, n+1)
    real = rpe[:channels]
    if causal:
        even = np.concatenate([real, real[:, 1:n][:, ::-1]], axis=1)  # length 2n
        imag = -scipy.signal.hilbert(even, axis=-1).imag[:, : n + 1]
    else:
        imag = rpe[channels:].copy()
        imag[:, 0] = imag[:, n] = 0.0
    kernel = np.fft.irfft(real + 1j * imag, n=2 * n)  # lags 0..n, then -(n-1)..-1
    x = randn(3, n, channels, seed=n + 7)
    ref = np.empty((3, n, channels))
    for c in range(channels):
        column = kernel[c, :n]  # lags 0..n-1
        row = np.concatenate([[kernel[c, 0]], kernel[c, ::-1][: n - 1]])  # lags 0, -1, ..
        if causal:
            row = np.zeros(n)
            row[0] = kernel[c, 0]
            if n > 1:  # the reference's own causality: negative lags vanish
                assert np.abs(kernel[c, n + 1 :]).max() < 1e-12
        dense = scipy.linalg.toeplitz(column, row)
        ref[:, :, c] = x[:, :, c].numpy() @ dense.T
    with torch.no_grad():
        got = fd(x).numpy()
    np.testing.assert_allclose(got, ref, rtol=1e-9, atol=1e-11 * max(1.0, np.abs(ref).max()))


@pytest.mark.parametrize("n", [1, 3, 6, 9])
def test_causal_fdtno_gradcheck_lengths(n):
    """Gradients of the folded causal spectrum at even, odd and non-5-smooth 2n."""
    fd = FDTNO(2, causal=True, rpe_width=4, rpe_depth=1, generator=gen(n), dtype=F64)
    _gradcheck_module(fd, randn(2, n, 2, seed=n + 9))


def test_causal_fdtno_vmaps_over_stacked_parameters():
    """torch.func.vmap over the parameters of several causal FD-TNOs (an ensemble) gives
    each layer's own output (the folded projection has a generated vmap rule)."""
    from torch.func import functional_call, stack_module_state, vmap

    layers = [FDTNO(3, causal=True, rpe_width=4, rpe_depth=1, generator=gen(k), dtype=F64)
              for k in range(3)]
    params, buffers = stack_module_state(layers)
    x = randn(2, 9, 3, seed=5)
    got = vmap(lambda p, b: functional_call(layers[0], (p, b), (x,)))(params, buffers)
    for k, layer in enumerate(layers):
        torch.testing.assert_close(got[k], layer(x).detach(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("n", [1, 2, 5, 12])
def test_toeplitz_matvec_rejects_nonfinite_after_fast_check(n):
    coeffs, x = randn(2, 2 * n - 1, seed=n), randn(3, n, 2, seed=n + 1)
    for bad in (float("nan"), float("inf"), -float("inf")):
        for name, (c, v) in (("x", (coeffs, x.clone())), ("coeffs", (coeffs.clone(), x))):
            target = v if name == "x" else c
            target.view(-1)[-1] = bad
            with pytest.raises(ValueError, match=f"{name} contains NaN or infinite"):
                toeplitz_matvec(c, v)
    toeplitz_matvec(coeffs * 1e300, x)  # huge but finite: accepted


@pytest.mark.parametrize("causal", [False, True])
def test_fdtno_gradcheck(causal):
    fd = FDTNO(2, causal=causal, rpe_width=4, rpe_depth=2, generator=gen(3), dtype=F64)
    _gradcheck_module(fd, randn(2, 6, 2, seed=2))


# --------------------------------------------------------------------------------------
# RPE MLP, decay study
# --------------------------------------------------------------------------------------


def test_rpe_mlp_structure_and_reproducibility():
    mlp = rpe_mlp("gelu", 6, 3, layer_norm=True, out_features=2, generator=gen(0), dtype=F64)
    kinds = [type(layer).__name__ for layer in mlp]
    assert kinds == ["Linear", "LayerNorm", "GELU"] * 3 + ["Linear"]
    no_ln = rpe_mlp("silu", 6, 2, layer_norm=False, generator=gen(0))
    assert [type(layer).__name__ for layer in no_ln] == ["Linear", "SiLU"] * 2 + ["Linear"]
    state = torch.get_rng_state()
    a = rpe_mlp("relu", 5, 2, generator=gen(7), dtype=F64)
    b = rpe_mlp("relu", 5, 2, generator=gen(7), dtype=F64)
    c = rpe_mlp("relu", 5, 2, generator=gen(8), dtype=F64)
    assert torch.equal(torch.get_rng_state(), state)  # the global generator is untouched
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.equal(pa, pb)
    assert not torch.equal(a[0].weight, c[0].weight)


def test_relu_mlp_piecewise_linearity_and_layer_norm():
    # Proposition 1's premise. Without layer norm a ReLU MLP of a scalar is piecewise
    # linear: second differences vanish except at a few breakpoints. With the standard
    # LayerNorm after an affine first layer (bias included) it is NOT: LN(a u + b)
    # divides by sqrt(quadratic in u), so there is curvature almost everywhere.
    u = torch.linspace(-3, 3, 20001, dtype=F64)[:, None]
    for seed in range(3):
        plain = rpe_mlp("relu", 8, 2, layer_norm=False, generator=gen(seed), dtype=F64)
        normed = rpe_mlp("relu", 8, 2, layer_norm=True, generator=gen(seed), dtype=F64)
        with torch.no_grad():
            f_plain = plain(u)[:, 0].numpy()
            f_normed = normed(u)[:, 0].numpy()
        kinks = int((np.abs(np.diff(f_plain, 2)) > 1e-12).sum())
        assert 0 < kinks <= 2 * 8 * 2  # at most two points per ReLU breakpoint
        assert (np.abs(np.diff(f_normed, 2)) > 1e-12).sum() > 5000


def test_frequency_response_decay_orders_activations():
    n = 256
    tails = {}
    for act in ("relu", "silu", "gelu"):
        curves = [
            frequency_response_decay(rpe_mlp(act, 32, 3, generator=gen(s), dtype=F64), n)
            for s in range(3)
        ]
        assert curves[0].response.shape == (n + 1, 1) and curves[0].lags[-1] == n
        np.testing.assert_allclose(curves[0].omega[[0, -1]].numpy(), [0, math.pi])
        tails[act] = max(float(c.kernel_abs[64:, 0].max()) for c in curves)
    assert tails["gelu"] < 1e-12  # faster than exponential (Theorem 2)
    assert tails["silu"] < 1e-8  # faster than polynomial (Theorem 3)
    assert tails["relu"] > 1e-7  # only square summable (Theorem 4)
    # the "omega" input: kinks of the even extension cap the decay for smooth MLPs too
    gelu = rpe_mlp("gelu", 32, 3, generator=gen(0), dtype=F64)
    curve = frequency_response_decay(gelu, n, feature="omega")
    assert float(curve.kernel_abs[64:, 0].max()) > 1e-8


class _Ramp(nn.Module):
    """k_hat(omega) = omega on [0, pi] from the feature omega / pi: the even extension is |omega|."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.tensor(math.pi, dtype=F64))

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        return self.scale * u


@pytest.mark.parametrize("n", [8, 31, 64, 200])
def test_frequency_response_decay_of_a_kink_matches_the_fourier_series(n):
    # |omega| has the Fourier coefficients c[0] = pi / 2, c[t] = -2 / (pi t^2) for odd t, 0 for even t;
    # the kernel of its 2n samples is their aliased sum over t + 2 n m (Poisson summation), in closed form
    # with sum_m (x + m)^-2 = pi^2 / sin^2(pi x): pi / (2 n^2 sin^2(pi t / 2n)) at odd t. A response with
    # a kink gives |k[t]| ~ t^-2: absolutely summable, which is more than the square summability of
    # Theorem 4 (chapter 4, "Smoothness in frequency, decay in time").
    curve = frequency_response_decay(_Ramp(), n, feature="omega")
    t_all = np.arange(n + 1)
    want = np.zeros(n + 1)
    want[0] = np.pi / 2
    odd = t_all % 2 == 1
    want[odd] = np.pi / (2 * n**2 * np.sin(np.pi * t_all[odd] / (2 * n)) ** 2)
    np.testing.assert_allclose(curve.kernel_abs[:, 0].numpy(), want, rtol=1e-10, atol=1e-12)
    t = np.arange(1, n + 1, 2)
    bounded = t**2 * curve.kernel_abs[t, 0].numpy()
    assert bounded.max() <= np.pi / 2 * (1 + 1e-12)  # t^2 |k[t]| <= pi / 2: O(t^-2), summable


def test_relu_response_kernels_decay_like_t_minus_2():
    # Random ReLU RPE MLPs with the periodic input cos(omega): the kink decay t^-2 (log-log slope near -2)
    # and sum_t |k[t]| converges (the partial sums over the last half of the lags add little).
    n = 512
    for s in range(3):
        curve = frequency_response_decay(rpe_mlp("relu", 32, 3, generator=gen(s), dtype=F64), n)
        relative = curve.kernel_abs[:, 0].numpy() / float(curve.kernel_abs[0, 0])
        lags = np.arange(8, n // 4)
        slope = np.polyfit(np.log(lags), np.log(relative[lags]), 1)[0]
        assert -2.4 < slope < -1.6, slope
        assert relative[n // 2:].sum() < 0.05 * relative.sum()


# --------------------------------------------------------------------------------------
# TNN block and encoder
# --------------------------------------------------------------------------------------


SMALL = {"tno": {"rpe_width": 8, "rpe_depth": 2}, "ski": {"rank": 4, "filter_size": 3},
         "fd": {"rpe_width": 8, "rpe_depth": 2}}


@pytest.mark.parametrize(
    "kind,causal", [("tno", False), ("tno", True), ("ski", False), ("fd", False), ("fd", True)]
)
def test_tnn_encoder_shapes_causality_and_training_step(kind, causal):
    enc = TNNEncoder(
        11, 8, 2, tno=kind, causal=causal, n_out=5, tno_options=SMALL[kind], generator=gen(0)
    )
    tokens = torch.randint(0, 11, (3, 16), generator=gen(1))
    out = enc(tokens)
    assert out.shape == (3, 16, 5)
    changed = tokens.clone()
    changed[:, 9:] = (changed[:, 9:] + 1) % 11
    diff = (enc(changed) - out).abs()
    if causal:
        assert diff[:, :9].max() < 1e-5
    else:
        assert diff[:, :9].max() > 1e-4  # bidirectional: the past sees the future
    assert diff[:, 9:].max() > 1e-4
    loss = nn.functional.cross_entropy(out.reshape(-1, 5), torch.zeros(48, dtype=torch.long))
    loss.backward()
    for name, p in enc.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name


def test_tnn_block_structure_and_determinism():
    state = torch.get_rng_state()
    kwargs = dict(tno="fd", causal=True, gtu_expand=2, glu_expand=3, tno_options=SMALL["fd"])
    a = TNNBlock(6, generator=gen(4), **kwargs)
    b = TNNBlock(6, generator=gen(4), **kwargs)
    assert torch.equal(torch.get_rng_state(), state)
    assert isinstance(a.gtu, GTU) and isinstance(a.glu, GLU) and isinstance(a.gtu.mixer, FDTNO)
    assert a.gtu.mixer.channels == 12 and a.glu.gate_proj.out_features == 18
    x = randn(2, 9, 6, seed=0, dtype=torch.float32)
    torch.testing.assert_close(a(x), b(x))
    for kind, cls in (("tno", TNO), ("ski", SKITNO), ("fd", FDTNO)):
        assert isinstance(make_tno(kind, 4, **SMALL[kind]), cls)


@pytest.mark.parametrize("n", [1, 2, 3])
def test_all_mixers_work_at_tiny_lengths(n):
    x = randn(2, n, 4, seed=n)
    mixers = [
        TNO(4, dtype=F64), TNO(4, causal=True, dtype=F64), FDTNO(4, dtype=F64),
        FDTNO(4, causal=True, dtype=F64), SKITNO(4, rank=n, filter_size=n, dtype=F64),
        SKITNO(4, rank=1, filter_size=1, low_rank="dense", dtype=F64),
    ]
    for mixer in mixers:
        y = mixer(x)
        assert y.shape == x.shape and torch.isfinite(y).all()
        torch.testing.assert_close(
            y, torch.einsum("cij,bjc->bic", mixer.dense_matrix(n), x), rtol=1e-10, atol=1e-12
        )


# --------------------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------------------


X4 = torch.zeros(2, 8, 3)
C4 = torch.zeros(3, 15)


@pytest.mark.parametrize(
    "call,exc,match",
    [
        (lambda: toeplitz_matvec(torch.zeros(3, 14), X4), ValueError, "length 15"),
        (lambda: toeplitz_matvec(torch.zeros(3, 15), X4, causal=True), ValueError, "length 8"),
        (lambda: toeplitz_matvec(torch.zeros(4, 15), X4), ValueError, "channels"),
        (lambda: toeplitz_matvec(torch.zeros(5, 3, 15), X4), ValueError, "broadcast"),
        (lambda: toeplitz_matvec(C4, X4.long()), TypeError, "x must have a floating"),
        (lambda: toeplitz_matvec(C4.int(), X4), TypeError, "coeffs must have a floating"),
        (lambda: toeplitz_matvec(C4.double(), X4), TypeError, "same dtype"),
        (lambda: toeplitz_matvec(C4, X4.to(torch.complex64)), TypeError, "floating"),
        (lambda: toeplitz_matvec(C4, torch.zeros(8)), ValueError, "at least 2"),
        (lambda: toeplitz_matvec(C4, [[0.0]]), TypeError, "torch.Tensor"),
        (lambda: toeplitz_matvec(C4, X4, causal=1), TypeError, "causal"),
        (lambda: toeplitz_matvec(C4.fill_(float("nan")), X4), ValueError, "NaN"),
        (lambda: toeplitz_dense(torch.zeros(4)), ValueError, "odd length"),
        (lambda: toeplitz_dense(torch.zeros(5), 4), ValueError, "length 7"),
        (lambda: toeplitz_dense(torch.zeros(5, dtype=torch.long)), TypeError, "floating"),
        (lambda: fft_length(0), ValueError, "n must be a positive"),
        (lambda: TNO(3, decay=1.0), ValueError, "decay"),
        (lambda: TNO(3, decay=0.0), ValueError, "decay"),
        (lambda: TNO(3, decay=-0.5), ValueError, "decay"),
        (lambda: SKITNO(3, decay=1.5), ValueError, "decay"),
        (lambda: TNO(3, decay="0.9"), TypeError, "decay"),
        (lambda: inverse_time_warp(torch.ones(3), 2.0), ValueError, "decay"),
        (lambda: TNO(0), ValueError, "channels"),
        (lambda: TNO(3, activation="tanh"), ValueError, "activation"),
        (lambda: TNO(3, generator=0), TypeError, "generator"),
        (lambda: TNO(3, dtype=torch.int32), TypeError, "dtype"),
        (lambda: TNO(3)(X4.long()), TypeError, "floating"),
        (lambda: TNO(3)(X4.double()), TypeError, "dtype"),
        (lambda: TNO(3)(torch.zeros(2, 8, 4)), ValueError, r"\(\.\.\., n, 3\)"),
        (lambda: FDTNO(3, feature="sin"), ValueError, "feature"),
        (lambda: FDTNO(3)(torch.zeros(2, 0, 3)), ValueError, "at least one token"),
        (lambda: SKITNO(3, rank=9)(X4), ValueError, "rank r = 9 exceeds"),
        (lambda: SKITNO(3, rank=4, filter_size=9)(X4), ValueError, "filter_size m = 9 exceeds"),
        (lambda: SKITNO(3, low_rank="fft"), ValueError, "low_rank"),
        (lambda: SKITNO(3, rank=0), ValueError, "rank"),
        (lambda: ski_matvec(torch.zeros(3, 17), X4), ValueError, "r = 9 inducing points exceeds"),
        (lambda: ski_matvec(torch.zeros(3, 4), X4), ValueError, "odd length"),
        (lambda: ski_matvec(torch.zeros(3, 5), X4, method="fft"), ValueError, "method"),
        (lambda: linear_interpolation_weights(3, 4), ValueError, "exceeds"),
        (lambda: cubic_interpolation_weights(8, 2), ValueError, "r >= 3"),
        (lambda: ski_matvec(torch.zeros(3, 3), X4, interpolation="cubic"), ValueError, "r >= 3"),
        (lambda: ski_matvec(torch.zeros(3, 5), X4, interpolation="spline"), ValueError,
         "interpolation"),
        (lambda: SKITNO(3, rank=2, interpolation="cubic"), ValueError, "r >= 3"),
        (lambda: interpolation_weights(8, 4, interpolation="nearest"), ValueError, "interpolation"),
        (lambda: inducing_points(4, 0), ValueError, "r must be a positive"),
        (lambda: discrete_hilbert(torch.zeros(4, dtype=torch.long)), TypeError, "floating"),
        (lambda: discrete_hilbert(torch.zeros(3, 0)), ValueError, "non-empty"),
        (lambda: causal_kernel_from_real_response(torch.zeros(3, 1)), ValueError, "n \\+ 1 >= 2"),
        (
            lambda: causal_kernel_from_real_response(torch.zeros(3, 4, dtype=torch.int64)),
            TypeError,
            "floating",
        ),
        (lambda: make_tno("ski", 4, causal=True), ValueError, "bidirectional only"),
        (lambda: make_tno("attention", 4), ValueError, "kind"),
        (lambda: TNNEncoder(5, 4, 1, tno="ski", causal=True), ValueError, "bidirectional only"),
        (lambda: TNNEncoder(5, 4, 1)(torch.zeros(2, 3)), TypeError, "integer"),
        (lambda: TNNEncoder(5, 4, 1)(torch.full((2, 3), 5)), ValueError, "vocab_size"),
        (lambda: TNNBlock(4, gtu_expand=0), ValueError, "gtu_expand"),
        (lambda: TNNBlock(4, tno_options=[1]), TypeError, "tno_options"),
        (lambda: rpe_mlp("relu", 0), ValueError, "width"),
        (lambda: rpe_mlp("relu", layer_norm=1), TypeError, "layer_norm"),
        (lambda: frequency_response_decay(lambda u: u, 8), TypeError, "mlp"),
        (lambda: frequency_response_decay(rpe_mlp(), 8, feature="sin"), ValueError, "feature"),
        (lambda: PiecewiseLinearRPE(2, 0), ValueError, "knots"),
    ],
)
def test_bad_input(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


# ------------------------------------------------------------------ empty and odd input
def test_empty_batch_and_zero_channels_give_empty_results_not_fft_errors() -> None:
    """Issue 14: an empty batch raised an MKL FFT error; now the result is empty, with
    gradients, like the dense product's."""
    from kernels.toeplitz import (FDTNO, SKITNO, TNO, causal_kernel_from_real_response,
                                  discrete_hilbert, ski_matvec, toeplitz_dense, toeplitz_matvec)

    gen = torch.Generator().manual_seed(0)
    coeffs = torch.randn(3, 7, dtype=torch.float64, generator=gen, requires_grad=True)
    x = torch.zeros(0, 4, 3, dtype=torch.float64, requires_grad=True)
    y = toeplitz_matvec(coeffs, x)
    assert y.shape == (toeplitz_dense(coeffs) @ x.transpose(-1, -2).unsqueeze(-1)).shape[:1] + (4, 3)
    y.sum().backward()
    assert torch.equal(coeffs.grad, torch.zeros_like(coeffs)) and x.grad.shape == x.shape
    assert toeplitz_matvec(torch.randn(0, 7), torch.randn(2, 4, 0)).shape == (2, 4, 0)
    assert toeplitz_matvec(torch.randn(3, 4), torch.randn(0, 4, 3), causal=True).shape == (0, 4, 3)
    assert ski_matvec(torch.randn(3, 5), torch.randn(0, 8, 3)).shape == (0, 8, 3)
    assert discrete_hilbert(torch.randn(0, 8)).shape == (0, 8)
    response = causal_kernel_from_real_response(torch.randn(0, 5, dtype=torch.float64))
    assert response.shape == (0, 5) and response.dtype == torch.complex128
    for module in (TNO(3, generator=gen), SKITNO(3, rank=4, filter_size=3, generator=gen),
                   FDTNO(3, generator=gen)):
        out = module(torch.zeros(0, 8, 3))
        assert out.shape == (0, 8, 3)
        out.sum().backward()  # connected to the parameters (zero gradients)
    with pytest.raises(ValueError, match="at least one token"):
        toeplitz_matvec(torch.randn(3, 0), torch.randn(2, 0, 3))


def test_unsupported_devices_are_named() -> None:
    from kernels.toeplitz import TNO, toeplitz_matvec

    meta = torch.device("meta")
    with pytest.raises(ValueError, match="x is on the 'meta' device"):
        toeplitz_matvec(torch.randn(3, 7), torch.randn(2, 4, 3, device=meta))
    with pytest.raises(ValueError, match="coeffs is on the 'meta' device"):
        toeplitz_matvec(torch.randn(3, 7, device=meta), torch.randn(2, 4, 3))
    with pytest.raises(ValueError, match="x is on the 'meta' device"):
        TNO(3)(torch.randn(2, 4, 3, device=meta))
