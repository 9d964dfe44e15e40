"""Compressed linear layers: the two ``nn.Linear`` stand-ins that MLP fusion and its
baselines put into a model (:class:`CompressedLinear`, with a fixed input scaling and an
optional pruning mask, and :class:`LowRankLinear`, a factored low-rank map).

They sit below :mod:`kernels.surgery` so that FFN surgery recognises a compressed FFN
without importing :mod:`kernels.fusion` (which builds them and imports the surgery).
Package side of chapter 6 (``chapters/06_mlp_fusion.ipynb``, sections "The fused MLP" and
"The baselines"); :mod:`kernels.fusion` re-exports both.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from kernels._checks import check_input, check_tensor

__all__ = [
    "CompressedLinear",
    "LowRankLinear",
]


class CompressedLinear(nn.Module):
    """An affine map ``y = (x * scale) @ (weight * mask).T + bias`` with fixed buffers.

    ``scale`` (``(in,)``, default ones) is the diagonal of the paper's constant scaling
    matrix :math:`P` of eq. 5 when this is the second layer of a fused MLP: it is a
    buffer, not a parameter, so the optimizer never changes it and the gradient of
    ``weight`` is multiplied by it, exactly as Section 4.2 says ("the gradient of the
    second method is multiplied by the scaling matrix P"). ``mask`` (``(out, in)`` of
    0/1, optional) is the fixed sparsity pattern of magnitude pruning: masked entries
    take no part in the forward pass and receive zero gradient.

    Shapes: ``x`` is ``(..., in)``, the output ``(..., out)``. Cost :math:`O(\\text{in}
    \\cdot \\text{out})` per row, as ``nn.Linear``. Chapter 6, section "The fused MLP".
    """

    def __init__(
        self,
        weight: Tensor,
        bias: Optional[Tensor],
        *,
        scale: Optional[Tensor] = None,
        mask: Optional[Tensor] = None,
    ) -> None:
        super().__init__()
        weight = check_tensor("weight", weight, ndim=2)
        out_features, in_features = weight.shape
        self.weight = nn.Parameter(weight.detach().clone())
        if bias is None:
            self.bias = None
        else:
            bias = check_tensor("bias", bias, ndim=1)
            if bias.shape[0] != out_features:
                raise ValueError(
                    f"bias must have length {out_features} (weight's rows), got {bias.shape[0]}"
                )
            self.bias = nn.Parameter(bias.detach().clone().to(weight.dtype))
        if scale is None:
            scale = torch.ones(in_features, dtype=weight.dtype, device=weight.device)
        scale = check_tensor("scale", scale, ndim=1)
        if scale.shape[0] != in_features:
            raise ValueError(f"scale must have length {in_features} (weight's columns), got {scale.shape[0]}")
        self.register_buffer("scale", scale.detach().clone().to(weight.dtype))
        if mask is not None:
            mask = check_tensor("mask", mask, ndim=2, floating=False)
            if tuple(mask.shape) != tuple(weight.shape):
                raise ValueError(f"mask must have the weight's shape {tuple(weight.shape)}, got {tuple(mask.shape)}")
            mask = mask.detach().clone().to(weight.dtype)
        self.register_buffer("mask", mask)

    @property
    def in_features(self) -> int:
        return self.weight.shape[1]

    @property
    def out_features(self) -> int:
        return self.weight.shape[0]

    def effective_weight(self) -> Tensor:
        """``weight * mask`` (or ``weight``): the matrix the forward pass uses."""
        return self.weight if self.mask is None else self.weight * self.mask

    def forward(self, x: Tensor) -> Tensor:
        check_input("x", x, self.weight.shape[1], self.weight)
        return F.linear(x * self.scale, self.effective_weight(), self.bias)

    def multiply_adds(self) -> int:
        """Multiply-adds per token: :math:`d_{in} d_{out}` (a pruned layer is counted dense,
        as the dense product computes it)."""
        return int(self.in_features) * int(self.out_features)

    def extra_repr(self) -> str:
        pruned = "" if self.mask is None else f", kept={int(self.mask.sum())}"
        return f"in_features={self.in_features}, out_features={self.out_features}{pruned}"


class LowRankLinear(nn.Module):
    """A factored affine map ``y = x @ v.T @ u.T + bias`` with trainable factors
    ``u`` ``(out, r)`` and ``v`` ``(r, in)``: the truncated-SVD baseline of Section 5.3 in
    compressed form, :math:`W \\approx \\widetilde U\\widetilde S\\widetilde V^T` stored as
    ``u = U_r S_r^{1/2}``, ``v = S_r^{1/2} V_r^T`` (the singular values split evenly, so
    neither factor dominates the gradients). It has ``r (in + out)`` weights instead of
    ``in * out`` and costs :math:`O(r(\\text{in} + \\text{out}))` per row.

    Shapes: ``x`` is ``(..., in)``, the output ``(..., out)``. Chapter 6, section "The
    baselines".
    """

    def __init__(self, u: Tensor, v: Tensor, bias: Optional[Tensor]) -> None:
        super().__init__()
        u = check_tensor("u", u, ndim=2)
        v = check_tensor("v", v, ndim=2)
        if u.shape[1] != v.shape[0]:
            raise ValueError(f"u (out, r) and v (r, in) must share r, got {tuple(u.shape)} and {tuple(v.shape)}")
        self.u = nn.Parameter(u.detach().clone())
        self.v = nn.Parameter(v.detach().clone().to(u.dtype))
        if bias is None:
            self.bias = None
        else:
            bias = check_tensor("bias", bias, ndim=1)
            if bias.shape[0] != u.shape[0]:
                raise ValueError(f"bias must have length {u.shape[0]} (u's rows), got {bias.shape[0]}")
            self.bias = nn.Parameter(bias.detach().clone().to(u.dtype))

    @property
    def in_features(self) -> int:
        return self.v.shape[1]

    @property
    def out_features(self) -> int:
        return self.u.shape[0]

    @property
    def rank(self) -> int:
        return self.u.shape[1]

    def effective_weight(self) -> Tensor:
        """``u @ v`` ``(out, in)``: the dense matrix the factors represent."""
        return self.u @ self.v

    def forward(self, x: Tensor) -> Tensor:
        check_input("x", x, self.v.shape[1], self.v)
        out = F.linear(F.linear(x, self.v), self.u)
        return out if self.bias is None else out + self.bias

    def multiply_adds(self) -> int:
        """Multiply-adds per token: :math:`r (d_{in} + d_{out})` for rank ``r``."""
        return self.rank * (self.in_features + self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, rank={self.rank}"
