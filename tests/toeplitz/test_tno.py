"""Tests of :mod:`kernels.toeplitz.tno` (the RPE MLP and the baseline TNO).

Independent references: explicit double loops for Toeplitz products and interpolation
weights, ``scipy.linalg.toeplitz`` / ``scipy.linalg.matmul_toeplitz``,
``scipy.signal.hilbert``, ``numpy.interp`` for the piecewise-linear RPE,
``torch.autograd.gradcheck`` (float64) for gradients, and causality checks that
perturb future tokens."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kernels.toeplitz import TNO, rpe_mlp

from toeplitz_helpers import F64, LENGTHS, _gradcheck_module, gen, naive_toeplitz, per_channel_matmul, randn, shift_future


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


@pytest.mark.parametrize("causal", [False, True])
def test_tno_gradcheck(causal):
    tno = TNO(2, causal=causal, rpe_width=4, rpe_depth=2, generator=gen(1), dtype=F64)
    _gradcheck_module(tno, randn(2, 5, 2, seed=0))


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
