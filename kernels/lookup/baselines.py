"""The FFN baselines that chapter 5 compares LookupFFN with, each with its FLOP count.

Part of :mod:`kernels.lookup` (chapter 5, the language model and the paper's Table 1):
:class:`VanillaFFN` (eq. 3, :func:`vanilla_ffn_flops`), :class:`BlockDiagonalFFN`
(grouped linear + channel shuffle, :func:`block_diagonal_ffn_flops`),
:class:`Top1MoEFFN` (switch-style top-1 mixture of experts, :func:`moe_ffn_flops`) and
:class:`LSHSparseFFN` (SLIDE-style hashed neuron selection, :func:`simhash_codes`,
:func:`lsh_active_mask`, :func:`lsh_ffn_flops`). The FLOP formulas reproduce the paper's
MFLOP columns.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from kernels._checks import (
    check_float_dtype,
    check_input,
    check_nonnegative_float,
    check_positive_int,
    check_same_feature_dim,
    check_tensor,
)


__all__ = [
    "VanillaFFN",
    "BlockDiagonalFFN",
    "Top1MoEFFN",
    "LSHSparseFFN",
    "simhash_codes",
    "lsh_active_mask",
    "lsh_ffn_flops",
    "vanilla_ffn_flops",
    "block_diagonal_ffn_flops",
    "moe_ffn_flops",
]

class VanillaFFN(nn.Module):
    """Eq. 3: :math:`y = \\mathrm{GELU}(x W_1 + b_1) W_2 + b_2`, ``d_model -> hidden -> d_model``."""

    def __init__(
        self,
        d_model: int,
        hidden: int,
        *,
        generator: Optional[torch.Generator] = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        check_float_dtype("dtype", dtype)
        self.d_model = check_positive_int("d_model", d_model)
        self.hidden = check_positive_int("hidden", hidden)
        self.w1 = nn.Parameter(torch.randn(d_model, hidden, generator=generator, dtype=dtype) / math.sqrt(d_model))
        self.b1 = nn.Parameter(torch.zeros(hidden, dtype=dtype))
        self.w2 = nn.Parameter(torch.randn(hidden, d_model, generator=generator, dtype=dtype) / math.sqrt(hidden))
        self.b2 = nn.Parameter(torch.zeros(d_model, dtype=dtype))

    def multiply_adds(self) -> int:
        """Multiply-adds per token: :math:`2 d t` (half of :func:`vanilla_ffn_flops`)."""
        return 2 * self.d_model * self.hidden

    def forward(self, x: Tensor) -> Tensor:
        check_input("x", x, self.d_model, self.w1, what="d_model")
        return torch.addmm(self.b2, F.gelu(torch.addmm(self.b1, x.reshape(-1, self.d_model), self.w1)), self.w2).reshape(x.shape)


class BlockDiagonalFFN(nn.Module):
    """Grouped FFN with a channel shuffle (ShuffleNet, Remark 3.2): ``groups`` independent
    ``d/g -> hidden/g`` GELU FFN halves, the hidden channels shuffled between groups
    before the second grouped layer. ``1/groups`` of the vanilla FLOP."""

    def __init__(
        self,
        d_model: int,
        hidden: int,
        groups: int = 2,
        *,
        generator: Optional[torch.Generator] = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        check_float_dtype("dtype", dtype)
        self.d_model = check_positive_int("d_model", d_model)
        self.hidden = check_positive_int("hidden", hidden)
        self.groups = check_positive_int("groups", groups)
        if d_model % groups or hidden % groups:
            raise ValueError(f"groups={groups} must divide d_model={d_model} and hidden={hidden}")
        di, hi = d_model // groups, hidden // groups
        self.w1 = nn.Parameter(torch.randn(groups, di, hi, generator=generator, dtype=dtype) / math.sqrt(di))
        self.b1 = nn.Parameter(torch.zeros(groups, 1, hi, dtype=dtype))
        self.w2 = nn.Parameter(torch.randn(groups, hi, di, generator=generator, dtype=dtype) / math.sqrt(hi))
        self.b2 = nn.Parameter(torch.zeros(d_model, dtype=dtype))

    def multiply_adds(self) -> int:
        """Multiply-adds per token: :math:`2 d t / g` (half of :func:`block_diagonal_ffn_flops`)."""
        return 2 * self.d_model * self.hidden // self.groups

    def forward(self, x: Tensor) -> Tensor:
        check_input("x", x, self.d_model, self.w1, what="d_model")
        g = self.groups
        xs = x.reshape(-1, g, self.d_model // g).transpose(0, 1)  # (g, n, d/g)
        hid = F.gelu(torch.baddbmm(self.b1, xs, self.w1))  # (g, n, hidden/g)
        n = hid.shape[1]
        # channel shuffle: (g, n, g', c) -> (g', n, g, c)
        hid = hid.reshape(g, n, g, -1).permute(2, 1, 0, 3).reshape(g, n, -1)
        out = torch.bmm(hid, self.w2).transpose(0, 1).reshape(x.shape)
        return out + self.b2


class Top1MoEFFN(nn.Module):
    """Switch-style top-1 mixture of experts: a linear router picks one of ``experts``
    GELU FFNs (``d_model -> hidden_per_expert -> d_model``) per token and scales its
    output by the router's softmax probability (Fedus et al., 2022). No capacity limit
    or load-balancing loss (the chapter's models are small)."""

    def __init__(
        self,
        d_model: int,
        hidden_per_expert: int,
        experts: int = 4,
        *,
        generator: Optional[torch.Generator] = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        check_float_dtype("dtype", dtype)
        self.d_model = check_positive_int("d_model", d_model)
        self.hidden = check_positive_int("hidden_per_expert", hidden_per_expert)
        self.experts = check_positive_int("experts", experts)
        e, d, hd = self.experts, self.d_model, self.hidden
        self.router = nn.Parameter(torch.randn(d, e, generator=generator, dtype=dtype) / math.sqrt(d))
        self.w1 = nn.Parameter(torch.randn(e, d, hd, generator=generator, dtype=dtype) / math.sqrt(d))
        self.b1 = nn.Parameter(torch.zeros(e, hd, dtype=dtype))
        self.w2 = nn.Parameter(torch.randn(e, hd, d, generator=generator, dtype=dtype) / math.sqrt(hd))
        self.b2 = nn.Parameter(torch.zeros(e, d, dtype=dtype))

    def multiply_adds(self) -> int:
        """Multiply-adds per token: the router :math:`d e` plus one expert :math:`2 d H_e`
        (the routing softmax not counted)."""
        return self.d_model * self.experts + 2 * self.d_model * self.hidden

    def forward(self, x: Tensor) -> Tensor:
        check_input("x", x, self.d_model, self.router, what="d_model")
        flat = x.reshape(-1, self.d_model)
        probs = torch.softmax(flat @ self.router, dim=-1)
        top_p, top_e = probs.max(dim=-1)
        out = torch.zeros_like(flat)
        for e in range(self.experts):
            idx = (top_e == e).nonzero(as_tuple=True)[0]
            if idx.numel() == 0:
                continue
            xe = flat[idx]
            ye = F.gelu(xe @ self.w1[e] + self.b1[e]) @ self.w2[e] + self.b2[e]
            out.index_copy_(0, idx, ye * top_p[idx, None])
        return out.reshape(x.shape)


def simhash_codes(u: Tensor, planes: Tensor) -> Tensor:
    """Hyperplane (SimHash) codes of ``u`` for ``L`` tables of ``K`` bits each (Charikar, 2002).

    ``u``: ``(..., d)``; ``planes``: ``(L, d, K)`` random directions. Returns int64
    ``(..., L)`` with code :math:`\\sum_j [\\langle u, r_{lj}\\rangle > 0]\\, 2^j` for table
    ``l``: the hash of eq. 4 that SLIDE and the LSH sparse FFN of chapter 5 use
    (section "Feed-forward layers as sums over neurons"). Cost ``O(d L K)`` per row.
    """
    check_tensor("u", u, finite=False)
    check_tensor("planes", planes, ndim=3, finite=False)
    if u.ndim == 0 or u.shape[-1] != planes.shape[1]:
        raise ValueError(f"u must have last dimension {planes.shape[1]} (planes.shape[1]), got shape {tuple(u.shape)}")
    if planes.shape[2] > 62:
        raise ValueError(f"planes.shape[2] (bits) must be at most 62, got {planes.shape[2]}")
    bits = torch.einsum("...d,ldk->...lk", u.to(planes.dtype), planes) > 0
    powers = 2 ** torch.arange(planes.shape[2], device=u.device)
    return (bits.long() * powers).sum(-1)


def lsh_active_mask(x: Tensor, w: Tensor, planes: Tensor) -> Tensor:
    """SLIDE's neuron selection (eq. 4): which neurons share a bucket with each input.

    ``x``: ``(n, d)`` inputs, ``w``: ``(t, d)`` neuron input weights ``[W]_i``, ``planes``:
    ``(L, d, K)``. Returns a bool ``(n, t)`` mask, true where neuron ``i`` lands in the
    bucket of ``x`` in at least one of the ``L`` tables (the union of ``x``'s buckets).
    """
    check_tensor("x", x, ndim=2, finite=False)
    check_tensor("w", w, ndim=2, finite=False)
    check_same_feature_dim("x", x, "w", w)
    query = simhash_codes(x, planes)  # (n, L)
    neuron = simhash_codes(w, planes)  # (t, L)
    return (query[:, None, :] == neuron[None, :, :]).any(-1)


class LSHSparseFFN(nn.Module):
    """An LSH-based sparse FFN in the style of SLIDE (Chen et al., 2020), the baseline of the
    paper's Table 1: :math:`y = \\sum_{i \\in A(x)} \\mathrm{ReLU}(\\langle x, [W]_i\\rangle + b_i)\\, [V]_i + c`,
    where :math:`A(x)` is the union of ``x``'s buckets in ``tables`` SimHash tables of
    ``bits`` bits over the neuron weights :math:`[W]_i` (eq. 4, :func:`lsh_active_mask`).

    The hyperplanes are fixed random directions (SLIDE; Mongoose would learn them). The
    neurons are rehashed at every forward call (SLIDE amortises this over many steps; at
    inference the weights are fixed and the neuron codes are computed once). For clarity the
    active set is applied as a mask on the dense product, so the *time* here is that of a
    dense FFN; :func:`lsh_ffn_flops` counts the FLOP a sparse implementation spends.
    Gradients reach only the active neurons, as in SLIDE. Chapter 5 trains it in the
    language model beside :class:`LookupFFN`.
    """

    def __init__(
        self,
        d_model: int,
        hidden: int,
        tables: int,
        bits: int,
        *,
        generator: Optional[torch.Generator] = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        self.d_model = check_positive_int("d_model", d_model)
        self.hidden = check_positive_int("hidden", hidden)
        self.tables = check_positive_int("tables", tables)
        self.bits = check_positive_int("bits", bits)
        if self.bits > 62:
            raise ValueError(f"bits must be at most 62, got {bits}")
        d, t = self.d_model, self.hidden
        self.w1 = nn.Parameter(torch.randn(t, d, generator=generator, dtype=dtype) / math.sqrt(d))
        self.b1 = nn.Parameter(torch.zeros(t, dtype=dtype))
        self.w2 = nn.Parameter(torch.randn(t, d, generator=generator, dtype=dtype) / math.sqrt(t))
        self.b2 = nn.Parameter(torch.zeros(d, dtype=dtype))
        self.register_buffer("planes", torch.randn(self.tables, d, self.bits, generator=generator, dtype=dtype))

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, hidden={self.hidden}, tables={self.tables}, bits={self.bits}"

    def active_mask(self, x: Tensor) -> Tensor:
        """The ``(tokens, hidden)`` bool mask of the neurons evaluated for each row of ``x``."""
        with torch.no_grad():
            return lsh_active_mask(x.reshape(-1, self.d_model), self.w1, self.planes)

    def forward(self, x: Tensor) -> Tensor:
        check_input("x", x, self.d_model, self.w1, what="d_model")
        flat = x.reshape(-1, self.d_model)
        mask = self.active_mask(flat)
        hid = F.relu(torch.addmm(self.b1, flat, self.w1.T)) * mask
        return torch.addmm(self.b2, hid, self.w2).reshape(x.shape)


def lsh_ffn_flops(d_model: int, tables: int, bits: int, active: float) -> dict[str, float]:
    """FLOP per token of :class:`LSHSparseFFN` as a sparse implementation spends them.

    ``hash``: :math:`2 d L K` to hash the query; ``ffn``: :math:`4 d |A(x)|` for the two
    products restricted to the ``active`` neurons (their mean number per token, measured);
    rehashing the neurons is not counted (done once at inference). Returns
    ``{"hash", "ffn", "total"}``.
    """
    d = check_positive_int("d_model", d_model)
    L = check_positive_int("tables", tables)
    K = check_positive_int("bits", bits)
    a = check_nonnegative_float("active", active)
    hash_f, ffn_f = 2.0 * d * L * K, 4.0 * d * a
    return {"hash": hash_f, "ffn": ffn_f, "total": hash_f + ffn_f}


def vanilla_ffn_flops(d_model: int, hidden: int) -> int:
    """FLOP per token of eq. 3: :math:`2 \\cdot 2 d\\, t` (two GEMMs; activation ignored).

    ``d = 512``, ``t = 2048`` gives the paper's 4.19 MFLOP (Table 1)."""
    return 4 * check_positive_int("d_model", d_model) * check_positive_int("hidden", hidden)


def block_diagonal_ffn_flops(d_model: int, hidden: int, groups: int) -> int:
    """FLOP per token of :class:`BlockDiagonalFFN`: vanilla / ``groups``."""
    return vanilla_ffn_flops(d_model, hidden) // check_positive_int("groups", groups)


def moe_ffn_flops(d_model: int, hidden_per_expert: int, experts: int) -> int:
    """FLOP per token of :class:`Top1MoEFFN`: the router plus one expert."""
    d = check_positive_int("d_model", d_model)
    hidden = check_positive_int("hidden_per_expert", hidden_per_expert)
    return 2 * d * check_positive_int("experts", experts) + vanilla_ffn_flops(d, hidden)
