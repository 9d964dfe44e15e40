"""Tests of :mod:`kernels.toeplitz.product` (the FFT Toeplitz product against dense matrices and scipy).

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

from kernels.toeplitz import fft_length, toeplitz_dense, toeplitz_matvec

from toeplitz_helpers import F64, LENGTHS, naive_toeplitz, per_channel_matmul, randn, shift_future


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
