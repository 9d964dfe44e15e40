"""Tests of :mod:`kernels.toeplitz.fd` (FD-TNO, Algorithm 2, the discrete Hilbert transform, the decay study).

Independent references: explicit double loops for Toeplitz products and interpolation
weights, ``scipy.linalg.toeplitz`` / ``scipy.linalg.matmul_toeplitz``,
``scipy.signal.hilbert``, ``numpy.interp`` for the piecewise-linear RPE,
``torch.autograd.gradcheck`` (float64) for gradients, and causality checks that
perturb future tokens."""

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
    causal_kernel_from_real_response,
    discrete_hilbert,
    frequency_response_decay,
    rpe_mlp,
)

from toeplitz_helpers import F64, LENGTHS, _gradcheck_module, gen, naive_toeplitz, per_channel_matmul, randn, shift_future


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


@pytest.mark.parametrize("causal", [False, True])
def test_fdtno_gradcheck(causal):
    fd = FDTNO(2, causal=causal, rpe_width=4, rpe_depth=2, generator=gen(3), dtype=F64)
    _gradcheck_module(fd, randn(2, 6, 2, seed=2))


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
