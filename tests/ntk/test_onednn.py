"""Tests of :mod:`kernels.ntk.onednn` (the oneDNN float32 linear mode).

Independent references: neural-tangents (``stax`` kernels, ``empirical_ntk_fn``,
``predict.gradient_descent_mse``, ``linearize``) with jax in float64, naive per-sample
autograd loops, explicit gradient descent, and finite differences."""

from __future__ import annotations

import pytest
import torch
from torch import nn


from ntk_helpers import _fast_linear_or_skip, randn


@pytest.mark.parametrize("x_shape, bias, w_grad, x_grad", [
    ((6, 7), True, True, True), ((3, 5, 7), True, False, True), ((2, 3, 4, 7), False, True, False),
    ((5, 7), False, False, True), ((4, 7), True, True, False),
])
def test_onednn_linear_mode_matches_f_linear(x_shape, bias, w_grad, x_grad):
    # Values, first and second derivatives of F.linear routed through oneDNN against
    # torch's own F.linear (float32: different summation order, so a tolerance).
    from kernels.ntk import _OneDNNLinearMode

    _fast_linear_or_skip()
    f = nn.functional.linear
    x = randn(*x_shape, seed=1, dtype=torch.float32).requires_grad_(x_grad)
    w = randn(5, 7, seed=2, dtype=torch.float32).requires_grad_(w_grad)
    b = randn(5, seed=3, dtype=torch.float32).requires_grad_(w_grad) if bias else None
    v = randn(*x_shape[:-1], 5, seed=4, dtype=torch.float32)
    wanted = [t for t in (x, w, b) if t is not None and t.requires_grad]

    def derivatives():
        y = f(torch.tanh(x), w, b)  # tanh: a second derivative that is not zero
        loss = (y * v).sum() + (y ** 2).sum()
        grads = torch.autograd.grad(loss, wanted, create_graph=True)
        second = torch.autograd.grad(sum((gr ** 2).sum() for gr in grads), wanted)
        return y, grads, second

    ref = derivatives()
    with _OneDNNLinearMode():
        got = derivatives()
        assert type(got[0].grad_fn).__name__ == "_OneDNNLinearBackward"  # it was routed
    torch.testing.assert_close(got[0], ref[0], rtol=1e-5, atol=1e-5)
    for g_got, g_ref in zip(got[1] + got[2], ref[1] + ref[2]):
        torch.testing.assert_close(g_got, g_ref, rtol=1e-4, atol=1e-4)


def test_onednn_linear_mode_leaves_other_calls_alone():
    from torch.func import vmap

    from kernels.ntk import _OneDNNLinearMode

    _fast_linear_or_skip()
    f = nn.functional.linear
    x64, w64 = randn(4, 3, seed=1), randn(2, 3, seed=2)
    x32, w32 = x64.float(), w64.float()
    with _OneDNNLinearMode():
        assert torch.equal(f(x64, w64), x64 @ w64.T)  # float64: torch's own
        assert f(x32[0], w32).grad_fn is None and torch.equal(f(x32[0], w32), f(x32, w32)[0])  # 1-D input
        torch.testing.assert_close(vmap(lambda r: f(r, w32))(x32), x32 @ w32.T)  # under vmap: torch's own
        with pytest.raises(RuntimeError):  # F.linear's own error for mismatched shapes
            f(x32, randn(2, 4, seed=3, dtype=torch.float32))
        y = f(x32, w32.requires_grad_(True))
        assert type(y.grad_fn).__name__ == "_OneDNNLinearBackward"
