"""LookupFFN: a feed-forward layer as differentiable table lookups (Zeng et al., 2023).

This module is the second half of the package side of chapter 5
(``chapters/05_lookupffn.ipynb``). For an input :math:`x \\in \\mathbb R^{d}` a LookupFFN
computes ``h`` *soft hash codes* :math:`z_k = x R_k \\in \\mathbb R^{\\tau}` with one
projection :math:`R \\in \\mathbb R^{d \\times h\\tau}` (dense or BH4, see
:mod:`kernels.hadamard`), turns each into an integer (eqs. 7, 12, 14)

.. math:: g(z_k) = \\arg\\max_i \\langle z_k, [S]_i\\rangle = \\mathrm{decimal}(\\mathrm{sign}\\, z_k)
          = \\textstyle\\sum_j [z_{kj} > 0]\\, 2^j,

reads row :math:`g(z_k)` of a learnable table :math:`T_k \\in \\mathbb R^{2^\\tau \\times
d_{out}}` and sums the rows weighted by the top softmax numerator over the closed-form
denominator (eqs. 11, 13):

.. math:: y = \\sum_{k=1}^h w_k\\, [T_k]_{g(z_k)}, \\qquad
          w_k = \\frac{e^{\\langle z_k, S_{g}\\rangle}}{\\prod_j (e^{z_{kj}} + e^{-z_{kj}})}
              = \\prod_{j=1}^{\\tau} \\sigma(2 |z_{kj}|),

times :math:`\\langle z_k, S_g\\rangle = \\sum_j |z_{kj}|` in the linearly scaled
variant of eq. 20 (``scaled=True``, the GELU-like one the paper trains with). Here
:math:`S \\in \\{\\pm 1\\}^{2^\\tau \\times \\tau}` has :math:`[S]_{ij} = +1` when bit
``j`` of ``i`` is set (:func:`sign_matrix`).

What is here:

* the pieces, each checkable on its own: :func:`sign_matrix`, :func:`hash_codes`,
  :func:`lookup_weights`, and the full softmax of eq. 10 (:func:`lookup_softmax`);
* :func:`lookup_gather`: the training path, a custom autograd Function
  (:class:`LookupGatherFunction`) whose forward is one ``embedding_bag`` and whose
  backward gives gradients to the gathered table rows and to ``z`` (hence to the
  projection), checked by ``torch.autograd.gradcheck`` in ``tests/test_lookup.py``;
* :func:`lookup_gather_naive`: the literal formula with every ``(tokens, h, d_out)``
  row materialised -- the reference and the "naive" timing baseline;
* :func:`lookup_forward_fused`: the fused, multi-threaded C++ inference kernel
  (codes, weights and gather-accumulate in one pass per token, nothing per-table
  materialised), built by :mod:`kernels._ext`; it also reads float16/bfloat16 tables
  (:data:`TABLE_DTYPES`) with float32 accumulation, which halves the bytes the gather
  streams, and int8 tables with one float32 scale per row (:func:`quantize_tables`,
  :func:`dequantize_tables`), a quarter of them (:class:`LookupFFN`'s ``table_dtype``;
  chapter 5, section "Narrower tables: what rounding costs in perplexity", bounds the
  error and measures the cost);
* :class:`LookupFFN`, and the baselines of the chapter's language model:
  :class:`VanillaFFN`, :class:`BlockDiagonalFFN` (grouped linear + channel shuffle) and
  :class:`Top1MoEFFN` (switch-style top-1 mixture of experts) and :class:`LSHSparseFFN`
  (SLIDE-style hashed neuron selection, :func:`simhash_codes`, :func:`lsh_active_mask`);
* FLOP accounting that reproduces the paper's MFLOP columns: :func:`lookup_ffn_flops`,
  :func:`vanilla_ffn_flops`, :func:`block_diagonal_ffn_flops`, :func:`moe_ffn_flops`,
  :func:`lsh_ffn_flops`.

Bad input: every entry point, the fused ones included, checks its arguments (type,
shape, dtype, device, contiguity for the C++ kernels, at least one table) and raises a
``ValueError``/``TypeError`` naming the argument before any compiled code runs. NaN and
Inf in ``z`` or ``x`` are not scanned for: in the torch paths a NaN coordinate counts as
negative in the code (``z > 0`` is false) and makes its table's weight NaN, an infinite
one makes it NaN or infinite; in the fused kernels the values are unspecified (the
codes, made from sign bits, always stay in range).

Layout: tokens are rows of ``(..., d)`` tensors; ``z`` is ``(..., h * tau)`` with table
``k`` reading ``z[..., k * tau : (k + 1) * tau]``; tables are ``(h, 2**tau, d_out)``.
Bit ``j`` of a code is coordinate ``j`` of ``z_k``.

Reference: Zeng, Davies, Pulijala, Sankaralingam and Singh (2023), *LookupFFN: Making
Transformers Compute-lite for CPU Inference*, ICML (``zeng2023lookupffn``).

One idea, more than 1,000 lines: LookupFFN as chapter 5 measures it -- the layer, its
torch and compiled paths with their argument checks (about half the module), and the
baselines and FLOP formulas of the paper's comparison, which share the layer's shapes and
checks (:func:`kernels.ffn.multiply_adds` counts all of them).
"""

from __future__ import annotations

import math
from typing import Any, Optional, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from kernels._checks import (
    check_float_dtype,
    check_choice,
    check_input,
    check_nonnegative_float,
    check_positive_int,
    check_same_feature_dim,
    check_tensor,
)
from kernels.hadamard import BHProjection, DenseProjection, projection_flops

__all__ = [
    "sign_matrix",
    "hash_codes",
    "lookup_weights",
    "lookup_softmax",
    "lookup_gather",
    "lookup_gather_naive",
    "lookup_forward_fused",
    "quantize_tables",
    "dequantize_tables",
    "lookup_bh_forward_fused",
    "lookup_bh_hash_fused",
    "gather_fused",
    "LookupGatherFunction",
    "LookupFFN",
    "VanillaFFN",
    "BlockDiagonalFFN",
    "Top1MoEFFN",
    "LSHSparseFFN",
    "simhash_codes",
    "lsh_active_mask",
    "lsh_ffn_flops",
    "table_bytes",
    "lookup_ffn_flops",
    "vanilla_ffn_flops",
    "block_diagonal_ffn_flops",
    "moe_ffn_flops",
    "LOOKUP_BACKENDS",
    "TABLE_DTYPES",
    "MAX_TAU",
    "DEFAULT_MAX_TABLE_BYTES",
]

#: Implementations of :meth:`LookupFFN.forward`.
LOOKUP_BACKENDS = ("auto", "torch", "naive", "fused")
#: Narrow storage the fused kernels can read tables in (float32 inputs, float32
#: accumulation): half-width floats, or int8 with one float32 scale per row
#: (:func:`quantize_tables`); see :class:`LookupFFN`'s ``table_dtype``.
TABLE_DTYPES = (torch.float16, torch.bfloat16, torch.int8)
#: Codes are int64 and a table has ``2**tau`` rows; beyond this nothing fits anyway.
MAX_TAU = 40
#: Default cap on the memory of a LookupFFN's tables (4 GiB).
DEFAULT_MAX_TABLE_BYTES = 4 << 30


def _check_z(z: Any, tau: int) -> Tensor:
    check_tensor("z", z, finite=False)
    if z.ndim == 0 or z.shape[-1] % tau:
        raise ValueError(
            f"z must have a last dimension h * tau divisible by tau={tau}, got shape "
            f"{tuple(z.shape)}"
        )
    return z


def _check_tau(tau: Any) -> int:
    tau = check_positive_int("tau", tau)
    if tau > MAX_TAU:
        raise ValueError(f"tau must be <= {MAX_TAU}, got {tau}")
    return tau


def _check_tables(tables: Any, int8: bool = False) -> tuple[int, int, int]:
    """Shape checks of ``(h, 2**tau, d_out)`` tables (floating, or int8 where ``int8``)."""
    floating = not (int8 and isinstance(tables, Tensor) and tables.dtype == torch.int8)
    check_tensor("tables", tables, ndim=3, finite=False, floating=floating)
    h, rows, d_out = tables.shape
    if rows < 2 or rows & (rows - 1) or h < 1 or d_out < 1:
        raise ValueError(
            "tables must have shape (h, 2**tau, d_out) with h >= 1, tau >= 1 and d_out >= 1, "
            f"got {tuple(tables.shape)}"
        )
    return h, rows.bit_length() - 1, d_out


def _check_z_tables(z: Any, tables: Any, same_dtype: bool = True) -> tuple[int, int, int]:
    h, tau, d_out = _check_tables(tables, int8=not same_dtype)
    _check_z(z, tau)
    if z.shape[-1] != h * tau:
        raise ValueError(
            f"z must have last dimension h * tau = {h} * {tau} = {h * tau} to match tables "
            f"of shape {tuple(tables.shape)}, got {z.shape[-1]}"
        )
    if same_dtype and z.dtype != tables.dtype:
        raise TypeError(f"z and tables must have the same dtype, got {z.dtype} and {tables.dtype}")
    return h, tau, d_out


def sign_matrix(tau: int, dtype: torch.dtype = torch.float64) -> Tensor:
    """:math:`S \\in \\{\\pm1\\}^{2^\\tau \\times \\tau}` of eq. 9: row ``i`` is the binary
    representation of ``i`` (bit ``j`` -> column ``j``, set -> +1, clear -> -1)."""
    check_float_dtype("dtype", dtype)
    tau = _check_tau(tau)
    if tau > 20:
        raise ValueError(f"sign_matrix is for checks; tau={tau} would have 2**{tau} rows")
    i = torch.arange(2**tau)[:, None]
    bits = (i >> torch.arange(tau)[None, :]) & 1
    return (2 * bits - 1).to(dtype)


def hash_codes(z: Tensor, tau: int) -> Tensor:
    """Eq. 7/12: ``decimal(sign z_k)`` for each table: ``(..., h * tau)`` -> ``(..., h)`` int64.

    A coordinate exactly 0 counts as negative (any tie-break is an argmax of eq. 8).
    :math:`O(h\\tau)` per token.
    """
    tau = _check_tau(tau)
    _check_z(z, tau)
    bits = (z > 0).reshape(*z.shape[:-1], z.shape[-1] // tau, tau).to(torch.int64)
    powers = torch.ones(tau, dtype=torch.int64, device=z.device) << torch.arange(
        tau, device=z.device
    )
    return (bits * powers).sum(-1)


def lookup_weights(z: Tensor, tau: int, scaled: bool = True) -> Tensor:
    """Weights of eqs. 13/20: ``(..., h * tau)`` -> ``(..., h)``.

    :math:`w_k = e^{\\langle z_k, S_g\\rangle} / \\prod_j (e^{z_{kj}} + e^{-z_{kj}}) =
    \\prod_j \\sigma(2|z_{kj}|)` (the stable form), times :math:`\\sum_j |z_{kj}|` when
    ``scaled`` (eq. 20). Differentiable by autograd.
    """
    tau = _check_tau(tau)
    _check_z(z, tau)
    a = z.abs().reshape(*z.shape[:-1], z.shape[-1] // tau, tau)
    w = torch.exp(F.logsigmoid(2 * a).sum(-1))
    return w * a.sum(-1) if scaled else w


def lookup_softmax(z: Tensor, tables: Tensor, scaled: bool = False) -> Tensor:
    """Eq. 10: the full softmax over all :math:`2^\\tau` rows of every table.

    :math:`\\hat y^* = \\sum_k \\sum_i \\mathrm{softmax}_i(\\langle z_k, S_i\\rangle) [T_k]_i`;
    with ``scaled`` each term is also multiplied by :math:`\\langle z_k, S_i\\rangle` (the
    extra factor of eq. 16/20). Cost :math:`O(h 2^\\tau (\\tau + d_{out}))` per token: the
    impractical formulation the top-numerator approximation avoids; for checks and for
    Remark 3.1 with small ``tau``.
    """
    h, tau, d_out = _check_z_tables(z, tables)
    s = sign_matrix(tau, dtype=z.dtype).to(z.device)
    logits = z.reshape(*z.shape[:-1], h, tau) @ s.T  # (..., h, 2^tau)
    probs = torch.softmax(logits, dim=-1)
    if scaled:
        probs = probs * logits
    return torch.einsum("...ki,kid->...d", probs, tables)


def lookup_gather_naive(z: Tensor, tables: Tensor, scaled: bool = True) -> Tensor:
    """Eqs. 13/20 written literally, every gathered row materialised.

    Numerator :math:`e^{\\langle z_k, S_g\\rangle}` and denominator
    :math:`\\prod_j (e^{z_{kj}} + e^{-z_{kj}})` are computed as written (they overflow
    for large ``|z|``: use float64 for checks), the rows ``tables[k, g_k]`` are gathered
    into a ``(..., h, d_out)`` tensor and summed. The reference of the tests and the
    "naive" baseline of the benchmark. Differentiable by autograd.
    """
    h, tau, d_out = _check_z_tables(z, tables)
    zk = z.reshape(*z.shape[:-1], h, tau)
    codes = hash_codes(z, tau)
    top = zk.abs().sum(-1)  # <z_k, S_g> = sum_j |z_kj| at the argmax
    w = torch.exp(top) / torch.prod(torch.exp(zk) + torch.exp(-zk), dim=-1)
    if scaled:
        w = w * top
    rows = tables[torch.arange(h, device=z.device), codes]  # (..., h, d_out)
    return (w.unsqueeze(-1) * rows).sum(-2)


class LookupGatherFunction(torch.autograd.Function):
    """``y = sum_k w_k(z_k) T_k[g(z_k)]`` with a hand-written backward.

    Forward: codes and weights, then one ``F.embedding_bag`` (mode ``sum`` with
    per-sample weights) over the flattened tables -- no ``(tokens, h, d_out)`` tensor.
    Backward, with :math:`G` the output gradient of a token (the codes are piecewise
    constant in ``z``, so they carry no gradient):

    * :math:`\\partial L / \\partial [T_k]_{g_k} \\mathrel{+}= w_k G` (a scatter-add);
    * :math:`\\partial L / \\partial z_{kj} = \\langle G, [T_k]_{g_k}\\rangle\\, \\partial w_k /
      \\partial z_{kj}` with :math:`\\partial w_k/\\partial z_{kj} = w_k\\, \\mathrm{sign}(z_{kj})
      (1 - \\tanh|z_{kj}|)` for eq. 13 and, for eq. 20 (:math:`w'_k = s_k w_k`,
      :math:`s_k = \\sum_j |z_{kj}|`),
      :math:`\\mathrm{sign}(z_{kj})\\, w_k\\, (1 + s_k (1 - \\tanh|z_{kj}|))`.

    The scatter-add and the inner products :math:`\\langle G, [T_k]_{g_k}\\rangle` are
    ``embedding_bag``'s native backward (no ``(tokens, h, d_out)`` tensor); the chain rule
    from the weights to ``z`` is written out here. Once differentiable.
    """

    @staticmethod
    def forward(z: Tensor, tables: Tensor, scaled: bool) -> Tensor:  # type: ignore[override]
        h, rows, d_out = tables.shape
        tau = rows.bit_length() - 1
        lead = z.shape[:-1]
        z2 = z.reshape(-1, h * tau)
        codes = hash_codes(z2, tau)
        flat = codes + rows * torch.arange(h, device=z.device)
        w = lookup_weights(z2, tau, scaled)
        y = F.embedding_bag(
            flat, tables.reshape(h * rows, d_out), mode="sum", per_sample_weights=w
        )
        return y.reshape(*lead, d_out)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: Tensor) -> None:
        z, tables, scaled = inputs
        ctx.scaled = scaled
        ctx.save_for_backward(z, tables)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad_y: Tensor) -> tuple[Optional[Tensor], Optional[Tensor], None]:
        z, tables = ctx.saved_tensors
        h, rows, d_out = tables.shape
        tau = rows.bit_length() - 1
        z2 = z.reshape(-1, h, tau)
        g = grad_y.reshape(-1, d_out)
        n = z2.shape[0]
        flat = hash_codes(z2.reshape(n, h * tau), tau) + rows * torch.arange(h, device=z.device)
        a = z2.abs()
        w = torch.exp(F.logsigmoid(2 * a).sum(-1))  # (n, h), eq. 13
        s = a.sum(-1)
        weight = w * s if ctx.scaled else w
        need_z, need_t = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        # The gather's adjoint -- scatter w_k G into the rows read, and the inner products
        # <G, [T_k]_{g_k}> -- is embedding_bag's own backward (native, nothing of size
        # (tokens, h, d_out) is formed); the chain rule to z below is ours.
        with torch.enable_grad():
            rows_leaf = tables.detach().reshape(h * rows, d_out).requires_grad_(need_t)
            weight_leaf = weight.detach().requires_grad_(need_z)
            y = F.embedding_bag(flat, rows_leaf, mode="sum", per_sample_weights=weight_leaf)
            leaves = [t for t, need in ((rows_leaf, need_t), (weight_leaf, need_z)) if need]
            grads = list(torch.autograd.grad(y, leaves, g))
        grad_t = grads.pop(0).reshape(h, rows, d_out) if need_t else None
        grad_z = None
        if need_z:
            dots = grads.pop(0)  # (n, h): <G, [T_k]_{g_k}>
            one_minus_tanh = 1 - torch.tanh(a)
            if ctx.scaled:
                dw = w.unsqueeze(-1) * (1 + s.unsqueeze(-1) * one_minus_tanh)
            else:
                dw = w.unsqueeze(-1) * one_minus_tanh
            grad_z = (dots.unsqueeze(-1) * torch.sign(z2) * dw).reshape(z.shape)
        return grad_z, grad_t, None


def quantize_tables(tables: Tensor) -> tuple[Tensor, Tensor]:
    """Int8 tables with one scale per row: ``tables`` ``(h, 2**tau, d_out)`` float ->
    ``(q, scales)``, ``q`` int8 of the same shape and ``scales`` ``(h, 2**tau)`` float32.

    Symmetric, per row: :math:`s_{kr} = \\max_c |[T_k]_{rc}| / 127` and
    :math:`q_{krc} = \\mathrm{round}([T_k]_{rc} / s_{kr}) \\in [-127, 127]` (a row of zeros
    gets :math:`s = 0`, :math:`q = 0`), with :math:`s` rounded to float32 before :math:`q`
    is rounded against it, so :math:`|[T_k]_{rc} - s_{kr} q_{krc}| \\le s_{kr}/2` entrywise
    and the layer's output moves by at
    most :math:`\\sum_k w_k s_{k g_k} / 2` per column. Not in the paper: a way to quarter
    the bytes the gather streams, derived and measured in chapter 5, section "Narrower
    tables: what rounding costs in perplexity". Inverse: :func:`dequantize_tables`.
    """
    _check_tables(tables)
    if not bool(torch.isfinite(tables).all()):
        raise ValueError("tables contains NaN or infinite values; they cannot be quantized")
    with torch.no_grad():
        amax = tables.detach().abs().amax(dim=-1).to(torch.float64)
        scales = (amax / 127.0).to(torch.float32)  # q is rounded against the stored scale
        safe = torch.where(scales > 0, scales, torch.ones_like(scales)).to(torch.float64)
        q = torch.round(tables.detach().to(torch.float64) / safe[..., None]).clamp_(-127, 127)
        return q.to(torch.int8).contiguous(), scales.contiguous()


def _check_scales(tables: Tensor, scales: Any) -> None:
    """``scales`` must be given exactly for int8 tables: ``(h, 2**tau)`` float32, CPU."""
    if tables.dtype != torch.int8:
        if scales is not None:
            raise ValueError(f"scales are only for int8 tables, got {tables.dtype} tables")
        return
    if scales is None:
        raise ValueError("int8 tables need their scales (see quantize_tables)")
    if not isinstance(scales, Tensor):
        raise TypeError(f"scales must be a torch.Tensor, got {type(scales).__name__}")
    want = tuple(tables.shape[:2])
    if scales.dtype != torch.float32:
        raise TypeError(f"scales must be float32, got {scales.dtype}")
    if tuple(scales.shape) != want:
        raise ValueError(f"scales must have shape (h, 2**tau) = {want}, got {tuple(scales.shape)}")
    if scales.device != tables.device:
        raise ValueError(f"scales must be on the tables' device {tables.device}, got {scales.device}")


def dequantize_tables(q: Tensor, scales: Tensor) -> Tensor:
    """``scales[..., None] * q`` as float32: the tables :func:`quantize_tables` stands for."""
    if not isinstance(q, Tensor) or q.dtype != torch.int8:
        raise TypeError(f"q must be an int8 torch.Tensor, got {getattr(q, 'dtype', type(q).__name__)}")
    _check_tables(q, int8=True)
    _check_scales(q, scales)
    return q.to(torch.float32) * scales[..., None]


def lookup_gather(z: Tensor, tables: Tensor, scaled: bool = True) -> Tensor:
    """Eqs. 13/20 with the top numerator: ``z`` ``(..., h * tau)``, ``tables``
    ``(h, 2**tau, d_out)`` -> ``(..., d_out)``.

    The training path: differentiable in ``z`` and ``tables`` through
    :class:`LookupGatherFunction`. Cost :math:`O(h(\\tau + d_{out}))` per token.
    Derived in chapter 5, section "From hashing to learnable lookups".
    """
    _check_z_tables(z, tables)
    if not isinstance(scaled, bool):
        raise TypeError(f"scaled must be a bool, got {scaled!r}")
    return LookupGatherFunction.apply(z, tables, scaled)


def _check_fused_table_dtype(z_name: str, z: Tensor, tables: Tensor) -> None:
    """Tables of the input's dtype, or float16/bfloat16/int8 tables with float32 inputs."""
    if tables.dtype in TABLE_DTYPES:
        if z.dtype != torch.float32:
            raise TypeError(
                f"{tables.dtype} tables need {z_name} as float32 (the kernel accumulates in "
                f"float32), got {z.dtype}"
            )
    elif tables.dtype != z.dtype:
        raise TypeError(
            f"{z_name} and tables must have the same dtype (or float16/bfloat16/int8 tables with "
            f"float32 {z_name}), got {z.dtype} and {tables.dtype}"
        )


def _check_fused_inputs(z: Any, tables: Any, z_name: str = "z", scales: Any = None) -> None:
    for name, value in ((z_name, z), ("tables", tables)):
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
        allowed = (torch.float32, torch.float64) + (TABLE_DTYPES if name == "tables" else ())
        if value.dtype not in allowed:
            raise TypeError(
                f"the fused kernel needs {name} as "
                + ("float32, float64, float16, bfloat16 or int8" if name == "tables" else "float32 or float64")
                + f", got {value.dtype}"
            )
        if value.device.type != "cpu":
            raise ValueError(f"the fused kernel runs on the CPU; {name} is on {value.device}")
        if not value.is_contiguous():
            raise ValueError(
                f"the fused kernel needs a contiguous {name} (call .contiguous()); got "
                f"strides {value.stride()} for shape {tuple(value.shape)}"
            )
    if z.ndim != 2:
        want = "(tokens, h * tau)" if z_name == "z" else "(tokens, h)"
        raise ValueError(f"{z_name} must have shape {want} for the fused kernel, got {tuple(z.shape)}")
    _check_fused_table_dtype(z_name, z, tables)
    _check_scales(tables, scales)
    if scales is not None and not scales.is_contiguous():
        raise ValueError("the fused kernel needs contiguous scales (call .contiguous())")


def lookup_forward_fused(
    z: Tensor, tables: Tensor, scaled: bool = True, *, scales: Optional[Tensor] = None
) -> Tensor:
    """Fused C++ inference kernel: :func:`lookup_gather`'s forward in one pass per token.

    ``z``: ``(tokens, h * tau)``, ``tables``: ``(h, 2**tau, d_out)``, both contiguous
    CPU float32/float64 of the same dtype -- or float32 ``z`` with float16/bfloat16
    ``tables`` (:data:`TABLE_DTYPES`): each entry is widened to float32 as it is read
    and accumulated in float32, so only the bytes the gather streams halve -- or int8
    ``tables`` with their per-row ``scales`` (:func:`quantize_tables`; required then and
    only then): each row's scale is folded into its weight and the entries widened as
    they are read, a quarter of float32's bytes. Anything else is a clear error; no
    silent copies. Per token it computes the ``h`` codes and
    weights (vectorised exponentials), then accumulates the ``h`` rows into the output
    row (with AVX-512 and float32 compute 128 output columns at a time, 256 for int8
    tables, the partial sums in registers), prefetching rows 64 (token, table) pairs
    ahead; super-tiles of 480
    tokens are spread over torch's threads. The result has ``z``'s dtype. No gradients. Raises
    ``RuntimeError`` when the extension cannot be built.
    """
    _check_fused_inputs(z, tables, scales=scales)
    _check_z_tables(z, tables, same_dtype=False)
    if not isinstance(scaled, bool):
        raise TypeError(f"scaled must be a bool, got {scaled!r}")
    from kernels._ext import build

    with torch.no_grad():
        return build().lookup_forward(z, tables, scaled, scales)


def _check_bh_fused(
    x: Any, projection: Any, tables: Any, scaled: Any, scales: Any = None
) -> tuple[Tensor, int]:
    """Every argument check of :func:`lookup_bh_forward_fused`; returns (blocks, tau)."""
    from kernels.hadamard import check_fused_array, check_fused_projection

    if not isinstance(projection, BHProjection):
        raise TypeError(f"projection must be a BHProjection, got {type(projection).__name__}")
    check_fused_array("x", x)
    if x.ndim != 2:
        raise ValueError(f"x must have shape (tokens, d_model) for the fused kernel, got {tuple(x.shape)}")
    _check_fused_inputs(x, tables, z_name="x", scales=scales)
    h, tau, d_out = _check_tables(tables, int8=True)
    if projection.out_features != h * tau:
        raise ValueError(
            f"projection must map to h * tau = {h * tau} features for tables of shape "
            f"{tuple(tables.shape)}, got out_features={projection.out_features}"
        )
    blocks_dtype = getattr(projection.blocks, "dtype", None)
    if x.dtype != blocks_dtype:
        raise TypeError(
            f"x and the projection must share one dtype, got {x.dtype} and {blocks_dtype}"
        )
    blocks = check_fused_projection(x, projection)
    if not isinstance(scaled, bool):
        raise TypeError(f"scaled must be a bool, got {scaled!r}")
    return blocks, tau


def lookup_bh_forward_fused(
    x: Tensor,
    projection: BHProjection,
    tables: Tensor,
    scaled: bool = True,
    *,
    scales: Optional[Tensor] = None,
) -> Tensor:
    """Fully fused C++ inference of a BH-m LookupFFN: hash and gather in one kernel.

    ``x``: contiguous ``(tokens, d_model)`` CPU float32/float64; ``projection`` a
    :class:`~kernels.hadamard.BHProjection` to ``h * tau`` features with ``block`` a
    multiple of 16; ``tables`` ``(h, 2**tau, d_out)`` contiguous, of ``x``'s dtype or,
    with float32 ``x``, float16/bfloat16 or int8 with ``scales`` (as in
    :func:`lookup_forward_fused`). Per tile
    of 48 tokens (one thread): the ``m`` rounds of block products (a register-blocked
    GEMM micro-kernel, 6 tokens x 64 outputs with AVX-512) and FWHTs (eq. 19), then the
    codes and weights; per super-tile of 480 tokens the gather-accumulate (with AVX-512
    and float32 compute: 128 output columns at a time, 256 for int8 tables, the partial
    sums in registers, rows prefetched 64 (token, table) pairs ahead). The soft codes live only in a
    per-thread buffer. No gradients.
    """
    blocks, tau = _check_bh_fused(x, projection, tables, scaled, scales)
    from kernels._ext import build

    with torch.no_grad():
        return build().lookup_bh_forward(x, blocks, tables, tau, scaled, scales)


def lookup_bh_hash_fused(
    x: Tensor,
    projection: BHProjection,
    tables: Tensor,
    scaled: bool = True,
    *,
    scales: Optional[Tensor] = None,
) -> Tensor:
    """:func:`lookup_bh_forward_fused` without its gather: for timing the hash step.

    Same arguments and checks, same tiles and buffers (projection, codes, weights), but
    the gather-accumulate is replaced by a sum of the weights written to the first row
    of each super-tile; the returned tensor is NOT the layer's output (the rest of it is
    uninitialised). The fused time minus this one is what the gather costs inside the
    fused kernel (the breakdown of ``benchmarks/bench_lookup.py``).
    """
    blocks, tau = _check_bh_fused(x, projection, tables, scaled, scales)
    from kernels._ext import build

    with torch.no_grad():
        return build().lookup_bh_hash(x, blocks, tables, tau, scaled, scales)


def gather_fused(
    codes: Tensor,
    weights: Tensor,
    tables: Tensor,
    out: Optional[Tensor] = None,
    *,
    scales: Optional[Tensor] = None,
) -> Tensor:
    """The gather step alone (C++): ``y_t = sum_k weights[t, k] tables[k, codes[t, k]]``.

    ``codes`` ``(tokens, h)`` int64 in ``[0, 2**tau)``, ``weights`` ``(tokens, h)`` and
    ``tables`` ``(h, 2**tau, d_out)`` contiguous CPU tensors. Used to time the gather
    on its own (the paper's Table 6 breakdown). Codes are range-checked. ``weights``
    have the tables' dtype, or float32 with float16/bfloat16 tables or int8 tables and
    their ``scales`` (:func:`quantize_tables`). ``out``: an
    optional preallocated contiguous ``(tokens, d_out)`` result of the weights' dtype
    (reusing it keeps the first-touch page faults of a fresh output out of timings).
    """
    h, tau, d_out = _check_tables(tables, int8=True)
    if not isinstance(codes, torch.Tensor) or codes.dtype != torch.int64:
        raise TypeError("codes must be an int64 tensor")
    if codes.device.type != "cpu":
        raise ValueError(f"the fused kernel runs on the CPU; codes is on {codes.device}")
    if codes.ndim != 2 or codes.shape[1] != h:
        raise ValueError(f"codes must have shape (tokens, {h}), got {tuple(codes.shape)}")
    if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) >= 2**tau):
        raise ValueError(f"codes must lie in [0, {2**tau}), got values outside")
    _check_fused_inputs(weights, tables, z_name="weights", scales=scales)
    if weights.shape != codes.shape:
        raise ValueError(f"weights must have the shape of codes {tuple(codes.shape)}, got {tuple(weights.shape)}")
    if not codes.is_contiguous():
        raise ValueError("codes must be contiguous")
    if out is None:
        out = torch.empty(codes.shape[0], d_out, dtype=weights.dtype)
    else:
        if (not isinstance(out, torch.Tensor) or out.shape != (codes.shape[0], d_out)
                or out.dtype != weights.dtype or not out.is_contiguous() or out.device.type != "cpu"):
            raise ValueError(
                f"out must be a contiguous CPU tensor of shape ({codes.shape[0]}, {d_out}) "
                f"and dtype {weights.dtype}"
            )
    from kernels._ext import build

    with torch.no_grad():
        build().gather(codes, weights, tables, out, scales)
    return out


def table_bytes(h: int, tau: int, d_out: int, dtype: torch.dtype = torch.float32) -> int:
    """Memory of the tables of a LookupFFN: :math:`h\\, 2^\\tau d_{out}` entries."""
    h = check_positive_int("h", h)
    tau = _check_tau(tau)
    d_out = check_positive_int("d_out", d_out)
    itemsize = torch.empty((), dtype=dtype).element_size()
    return h * (1 << tau) * d_out * itemsize


def _format_bytes(n: int) -> str:
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


class LookupFFN(nn.Module):
    """A LookupFFN layer: projection to ``h`` soft codes of ``tau`` bits, table lookups.

    ``projection``: ``"bh4"`` (eq. 19 with blocks of ``block``), ``"dense"``, or any
    module mapping ``(..., d_model)`` to ``(..., h * tau)`` with an ``out_features``
    attribute. ``scaled``: eq. 20 (default, GELU-like) or eq. 13. Tables are
    ``(h, 2**tau, d_out)``, initialised :math:`\\mathcal N(0, 1/(h\\tau))`; creating them
    fails with a message saying how much memory they would need when that exceeds
    ``max_table_bytes``.

    ``forward(x, backend="auto")``: ``"auto"`` uses the fused C++ kernel for float32/64
    CPU inputs when no gradient is needed (``torch.no_grad`` or ``inference_mode``) and
    the extension is available, the autograd path (:func:`lookup_gather`) otherwise;
    ``"torch"``, ``"naive"`` and ``"fused"`` force one implementation.

    ``table_dtype``: ``None`` (default), ``torch.float16`` / ``torch.bfloat16`` or
    ``torch.int8`` (:data:`TABLE_DTYPES`, float32 layers only; settable after training). Training stays
    in float32: the ``tables`` parameter is the float32 master copy and every forward
    pass that needs gradients uses it. Inference (no gradient enabled) uses a copy of
    the tables rounded to ``table_dtype`` (:meth:`inference_tables`, remade whenever the
    master changes): the fused kernel reads it directly -- half (int8: a quarter of) the
    bytes, float32 accumulation -- and the ``"torch"``/``"naive"`` backends compute with
    the rounded values widened back to float32, so every backend gives the same function
    (up to float32 rounding of the sums). Each table entry then carries a relative
    rounding error of at most ``2**-11`` (float16, entries of magnitude >= ``2**-14``;
    below that an absolute error <= ``2**-25``) or ``2**-8`` (bfloat16), so
    ``|y - y_fp32| <= u * sum_k w_k |[T_k]_{g_k}|`` entrywise; int8 rows
    (:func:`quantize_tables`, one scale :math:`s` per row, :meth:`inference_scales`)
    carry an absolute error of at most :math:`s/2` per entry, so
    ``|y - y_fp32| <= sum_k w_k s_{k g_k} / 2``. Chapter 5 measures what this costs in
    perplexity and buys in time.
    """

    def __init__(
        self,
        d_model: int,
        h: int,
        tau: int,
        *,
        d_out: Optional[int] = None,
        projection: Union[str, nn.Module] = "bh4",
        block: int = 64,
        scaled: bool = True,
        max_table_bytes: int = DEFAULT_MAX_TABLE_BYTES,
        table_dtype: Optional[torch.dtype] = None,
        generator: Optional[torch.Generator] = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        check_float_dtype("dtype", dtype)
        self._table_dtype: Optional[torch.dtype] = None
        self._rounded: Optional[tuple[tuple, Tensor, Optional[Tensor]]] = None
        self.d_model = check_positive_int("d_model", d_model)
        self.h = check_positive_int("h", h)
        self.tau = _check_tau(tau)
        self.d_out = check_positive_int("d_out", d_out if d_out is not None else d_model)
        self.block = check_positive_int("block", block)
        if not isinstance(scaled, bool):
            raise TypeError(f"scaled must be a bool, got {scaled!r}")
        self.scaled = scaled
        need = table_bytes(self.h, self.tau, self.d_out, dtype)
        max_table_bytes = check_positive_int("max_table_bytes", max_table_bytes)
        if need > max_table_bytes:
            raise ValueError(
                f"tau={self.tau} is too large for memory: h * 2**tau * d_out = {self.h} * "
                f"2**{self.tau} * {self.d_out} entries would need {_format_bytes(need)} of "
                f"tables, more than max_table_bytes={_format_bytes(max_table_bytes)}; lower "
                "tau or h, or raise max_table_bytes"
            )
        ht = self.h * self.tau
        if isinstance(projection, nn.Module):
            out = getattr(projection, "out_features", None)
            if out != ht:
                raise ValueError(
                    f"projection must map to h * tau = {self.h} * {self.tau} = {ht} features, "
                    f"got a {type(projection).__name__} with out_features={out}"
                )
            self.projection = projection
            self.projection_kind = "custom"
        else:
            kind = check_choice("projection", projection, ("bh4", "dense"))
            self.projection_kind = kind
            if kind == "bh4":
                self.projection = BHProjection(
                    self.d_model, ht, block, 4, generator=generator, dtype=dtype
                )
            else:
                self.projection = DenseProjection(self.d_model, ht, generator=generator, dtype=dtype)
        tables = torch.randn(self.h, 2**self.tau, self.d_out, generator=generator, dtype=dtype)
        self.tables = nn.Parameter(tables / math.sqrt(ht))
        self.table_dtype = table_dtype

    @property
    def table_dtype(self) -> Optional[torch.dtype]:
        """Storage of the tables at inference: ``None`` (the master's dtype), float16, bfloat16 or int8."""
        return self._table_dtype

    @table_dtype.setter
    def table_dtype(self, value: Optional[torch.dtype]) -> None:
        if value is not None:
            if not isinstance(value, torch.dtype):
                raise TypeError(f"table_dtype must be None or a torch.dtype, got {value!r}")
            if value not in TABLE_DTYPES:
                raise ValueError(
                    "table_dtype must be None, torch.float16, torch.bfloat16 or torch.int8, "
                    f"got {value}"
                )
            if self.tables.dtype != torch.float32:
                raise ValueError(
                    f"table_dtype needs a float32 layer (float32 master tables and inputs), got "
                    f"tables of dtype {self.tables.dtype}"
                )
        self._table_dtype = value
        self._rounded = None

    def _rounded_tables(self) -> tuple[Tensor, Optional[Tensor]]:
        master = self.tables.detach()
        key = (master.data_ptr(), master._version, tuple(master.shape), self._table_dtype)
        if self._rounded is None or self._rounded[0] != key:
            if self._table_dtype == torch.int8:
                self._rounded = (key, *quantize_tables(master))
            else:
                self._rounded = (key, master.to(self._table_dtype).contiguous(), None)
        return self._rounded[1], self._rounded[2]

    def inference_tables(self) -> Tensor:
        """The tables inference reads: ``tables`` rounded to :attr:`table_dtype` (a
        detached copy, cached and remade when the master changes; for int8 the integers
        of :func:`quantize_tables`, whose scales :meth:`inference_scales` gives), or the
        master itself (detached) when ``table_dtype`` is ``None``."""
        if self._table_dtype is None:
            return self.tables.detach()
        return self._rounded_tables()[0]

    def inference_scales(self) -> Optional[Tensor]:
        """The per-row scales of int8 :meth:`inference_tables` (``(h, 2**tau)`` float32),
        ``None`` for any other :attr:`table_dtype`."""
        if self._table_dtype != torch.int8:
            return None
        return self._rounded_tables()[1]

    def _widened_tables(self) -> Tensor:
        """The function inference computes with, as float32 tables (torch/naive backends)."""
        tables, scales = self._rounded_tables()
        if scales is not None:
            return dequantize_tables(tables, scales)
        return tables.to(self.tables.dtype)

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, h={self.h}, tau={self.tau}, d_out={self.d_out}, "
            f"projection={self.projection_kind}, scaled={self.scaled}"
            + (f", table_dtype={self._table_dtype}" if self._table_dtype is not None else "")
        )

    def codes(self, x: Tensor) -> Tensor:
        """Soft hash codes ``z = x R``: ``(..., d_model)`` -> ``(..., h * tau)``."""
        return self.projection(x)

    def _check_input(self, x: Any) -> Tensor:
        """The same checks, with the same messages, in front of every backend."""
        check_tensor("x", x, finite=False)
        if x.ndim == 0 or x.shape[-1] != self.d_model:
            raise ValueError(
                f"x must have shape (..., d_model) with d_model={self.d_model}, got "
                f"{tuple(x.shape)}"
            )
        if self.projection_kind != "custom" and x.dtype != self.tables.dtype:
            raise TypeError(
                f"x must have the layer's dtype {self.tables.dtype}, got {x.dtype} (convert "
                "the input with .to(), or the layer with .to(dtype))"
            )
        want = (self.h, 2**self.tau, self.d_out)
        if not isinstance(self.tables, Tensor) or tuple(self.tables.shape) != want:
            raise ValueError(
                f"tables must have shape (h, 2**tau, d_out) = {want}, got "
                f"{tuple(getattr(self.tables, 'shape', ()))} (were they replaced?)"
            )
        return x

    def forward(self, x: Tensor, backend: str = "auto") -> Tensor:
        check_choice("backend", backend, LOOKUP_BACKENDS)
        self._check_input(x)
        if backend == "auto":
            fast = (
                not torch.is_grad_enabled()
                and x.device.type == "cpu"
                and x.dtype in (torch.float32, torch.float64)
            )
            backend = "torch"
            if fast:
                from kernels._ext import load_extension

                if load_extension() is not None:
                    backend = "fused"
        # inference with table_dtype: every backend computes with the rounded tables
        rounded = self._table_dtype is not None and not torch.is_grad_enabled()
        if backend in ("torch", "naive"):
            tables = self._widened_tables() if rounded else self.tables
            gather = lookup_gather if backend == "torch" else lookup_gather_naive
            return gather(self.projection(x), tables, self.scaled)
        lead = x.shape[:-1]
        tables, scales = self._rounded_tables() if rounded else (self.tables.detach(), None)
        if isinstance(self.projection, BHProjection) and self.projection.block % 16 == 0:
            flat = x.detach().reshape(-1, self.d_model).contiguous()
            y = lookup_bh_forward_fused(flat, self.projection, tables, self.scaled, scales=scales)
        else:
            with torch.no_grad():
                z = self.projection(x).reshape(-1, self.h * self.tau).contiguous()
            y = lookup_forward_fused(z, tables, self.scaled, scales=scales)
        return y.reshape(*lead, self.d_out)

    def flops(self) -> dict[str, int]:
        """Per-token FLOP of hash and gather (see :func:`lookup_ffn_flops`)."""
        kind = "dense" if self.projection_kind == "dense" else "bh4"
        return lookup_ffn_flops(
            self.d_model, self.h, self.tau, block=self.block, projection=kind, d_out=self.d_out
        )


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


def lookup_ffn_flops(
    d_model: int,
    h: int,
    tau: int,
    *,
    block: int = 64,
    projection: str = "bh4",
    d_out: Optional[int] = None,
) -> dict[str, int]:
    """FLOP per token of a LookupFFN, as the paper counts them (Tables 1-4).

    ``hash``: the projection to ``h * tau`` soft codes (:func:`kernels.hadamard.projection_flops`,
    BH4 or dense); ``gather``: :math:`2 h\\, d_{out}` (one multiply-add per gathered
    entry); codes and weights (:math:`O(h\\tau)`) are not counted. Returns
    ``{"hash", "gather", "total"}``. For ``d = 512``: ``(h, tau) = (128, 8)`` with BH4
    blocks of 64 gives 0.56 + 0.13 = 0.69 MFLOP (Tables 1 and 3).
    """
    d = check_positive_int("d_model", d_model)
    h = check_positive_int("h", h)
    tau = _check_tau(tau)
    d_out = check_positive_int("d_out", d_out if d_out is not None else d)
    kind = check_choice("projection", projection, ("bh4", "dense"))
    if kind == "bh4":
        hash_f = projection_flops("bh", d, h * tau, block=block, m=4)
    else:
        hash_f = projection_flops("dense", d, h * tau)
    gather_f = 2 * h * d_out
    return {"hash": hash_f, "gather": gather_f, "total": hash_f + gather_f}
