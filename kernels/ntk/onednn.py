"""oneDNN plumbing of the empirical NTK: the float32 CPU products ``A B^T`` and the
linear layers of a forward pass routed through oneDNN's inner product (a private torch
op, used only where it is available and checked; torch's BLAS otherwise).

Part of :mod:`kernels.ntk` (chapter 1, ``chapters/01_ntk.ipynb``, section on computing
the empirical NTK fast). Not an idea of its own: the speed of :func:`kernels.ntk.empirical_ntk`
and :func:`kernels.ntk.linear_gram_ntk` on CPUs; ``benchmarks/bench_ntk.py`` times it.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Optional

import torch
from torch import Tensor, nn

__all__: list[str] = []


@functools.lru_cache(maxsize=None)
def _onednn_linear_available() -> bool:
    """Whether torch's oneDNN inner product (``torch.ops.mkldnn._linear_pointwise``)
    runs here and agrees with ``torch.mm`` on a small float32 product."""
    try:
        if not torch.backends.mkldnn.is_available():
            return False
        gen = torch.Generator().manual_seed(0)
        a = torch.randn(5, 7, generator=gen)
        b = torch.randn(3, 7, generator=gen)
        bt = torch.randn(7, 3, generator=gen)
        checks = (
            (torch.ops.mkldnn._linear_pointwise(a, b, None, "none", [], ""), a @ b.T),
            # a transposed (column-major) weight, as the backward pass of _OneDNNLinear passes
            (torch.ops.mkldnn._linear_pointwise(a, bt.t(), None, "none", [], ""), a @ bt),
        )
        return all(
            isinstance(got, Tensor) and not got.is_mkldnn and got.shape == (5, 3)
            and torch.allclose(got, ref, rtol=1e-5, atol=1e-6)
            for got, ref in checks
        )
    except (RuntimeError, AttributeError, TypeError):
        return False



def _linear_onednn(x: Tensor, w: Tensor, b: Optional[Tensor]) -> Tensor:
    """``x @ w.T + b`` for float32 CPU ``x`` ``(..., in)``, ``w`` ``(out, in)`` through
    oneDNN's inner product (the GEMM of :func:`_gemm_nt`)."""
    x2 = x.reshape(-1, x.shape[-1]).contiguous()
    if not (w.is_contiguous() or w.t().is_contiguous()):  # a transposed weight needs no copy
        w = w.contiguous()
    y = torch.ops.mkldnn._linear_pointwise(
        x2, w, None if b is None else b.contiguous(), "none", [], ""
    )
    return y.reshape(*x.shape[:-1], w.shape[0])



def _engine_will_run(ctx, index: int) -> bool:
    """Whether the running backward pass needs the gradient of input ``index`` of the
    custom-function node ``ctx``: ``ctx.needs_input_grad`` says only whether it
    *requires* grad (fixed at forward time), not whether this ``autograd.grad`` call
    asked for it. Uses the engine's own query (``torch._C._will_engine_execute_node``,
    private); when that is unavailable or cannot answer, the gradient is computed."""
    if not ctx.needs_input_grad[index]:
        return False
    try:
        node = ctx.next_functions[index][0]
        return node is None or bool(torch._C._will_engine_execute_node(node))
    except (AttributeError, RuntimeError, IndexError):
        return True



class _OneDNNLinear(torch.autograd.Function):
    """``F.linear`` with oneDNN GEMMs forward and backward (float32, CPU). Its backward
    is written with differentiable operations, so higher derivatives work; a
    parameter's gradient is formed only when the backward pass will use it."""

    @staticmethod
    def forward(ctx, x: Tensor, w: Tensor, b: Optional[Tensor]) -> Tensor:
        ctx.save_for_backward(x, w)
        ctx.has_bias = b is not None
        return _linear_onednn(x, w, b)

    @staticmethod
    def backward(ctx, grad: Tensor):
        x, w = ctx.saved_tensors
        g2 = grad.reshape(-1, grad.shape[-1])
        grad_x = grad_w = grad_b = None
        if _engine_will_run(ctx, 0):
            grad_x = _OneDNNLinear.apply(grad, w.t(), None)
        if _engine_will_run(ctx, 1):
            grad_w = g2.t() @ x.reshape(-1, x.shape[-1])
        if ctx.has_bias and _engine_will_run(ctx, 2):
            grad_b = g2.sum(0)
        return grad_x, grad_w, grad_b



class _OneDNNLinearMode(torch.overrides.TorchFunctionMode):
    """Within this mode every ``F.linear`` (so every ``nn.Linear``) on float32 CPU
    tensors runs through :class:`_OneDNNLinear`; every other call, and any linear it
    cannot take (other dtypes or devices, tensor subclasses, functorch transforms,
    shapes ``F.linear`` itself rejects), runs unchanged. Used by
    :func:`_linear_records`, where the forward and backward passes of the model are
    most of the Gram trick's time: torch's own float32 GEMM here is OpenBLAS (AVX2)
    at about 100 GFLOP/s on one core, oneDNN about 210 (``bench_ntk.py``)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.nn.functional.linear:
            routed = self._route(*args, **kwargs)
            if routed is not None:
                return _OneDNNLinear.apply(*routed)
        return func(*args, **kwargs)

    @staticmethod
    def _route(input=None, weight=None, bias=None):
        def plain(t):
            return type(t) in (Tensor, nn.Parameter) and t.dtype == torch.float32 \
                and t.device.type == "cpu" and t.layout == torch.strided
        if not (plain(input) and plain(weight) and (bias is None or plain(bias))):
            return None
        if torch._C._are_functorch_transforms_active():
            return None
        if weight.ndim != 2 or input.ndim < 2 or input.shape[-1] != weight.shape[1] \
                or input.numel() == 0 or weight.numel() == 0:
            return None
        if bias is not None and tuple(bias.shape) != (weight.shape[0],):
            return None
        return input, weight, bias



def _fast_linear_mode():
    """:class:`_OneDNNLinearMode` when oneDNN's inner product works here, else a no-op."""
    if _onednn_linear_available():
        return _OneDNNLinearMode()
    return contextlib.nullcontext()



def _gemm_nt(a: Tensor, b: Tensor) -> Tensor:
    """``a @ b.T`` for ``(m, K)`` and ``(p, K)`` row-major blocks.

    float32 on the CPU goes through oneDNN's inner product when torch has it: on the
    AMD Zen 5 benchmark machine ATen's float32 ``mm`` (MKL) ran these shapes at about
    110 GFLOP/s on one thread and oneDNN at about 250 (``benchmarks/bench_ntk.py``,
    "GEMM floor"). Same product, different summation order (float32 rounding)."""
    if a.dtype == torch.float32 and a.device.type == "cpu" and _onednn_linear_available():
        return torch.ops.mkldnn._linear_pointwise(
            a.contiguous(), b.contiguous(), None, "none", [], ""
        )
    return a @ b.T

