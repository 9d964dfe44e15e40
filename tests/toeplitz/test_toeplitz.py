"""Tests of :mod:`kernels.toeplitz.toeplitz` (the package's public face: bad input, empty input and devices across its modules).

Independent references: explicit double loops for Toeplitz products and interpolation
weights, ``scipy.linalg.toeplitz`` / ``scipy.linalg.matmul_toeplitz``,
``scipy.signal.hilbert``, ``numpy.interp`` for the piecewise-linear RPE,
``torch.autograd.gradcheck`` (float64) for gradients, and causality checks that
perturb future tokens."""

from __future__ import annotations

import pytest
import torch

from kernels.toeplitz import (
    FDTNO,
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

from toeplitz_helpers import gen


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
    """An empty batch gives an empty result, with gradients, like the dense product's (not an MKL
    FFT error)."""
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
