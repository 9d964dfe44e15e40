"""The lookup of LookupFFN: soft hash codes, their weights and the weighted gather of table rows.

Part of :mod:`kernels.lookup` (chapter 5, ``chapters/05_lookupffn.ipynb``; Zeng et al., 2023,
eqs. 7-14 and 20). Here:

* the pieces, each checkable on its own: :func:`sign_matrix`, :func:`hash_codes`,
  :func:`lookup_weights`, and the full softmax of eq. 10 (:func:`lookup_softmax`);
* :func:`lookup_gather`: the training path, a custom autograd Function
  (:class:`LookupGatherFunction`) whose forward is one ``embedding_bag`` and whose
  backward gives gradients to the gathered table rows and to ``z``;
* :func:`lookup_gather_naive`: the literal formula with every ``(tokens, h, d_out)``
  row materialised -- the reference and the "naive" timing baseline;
* the fused, multi-threaded C++ inference kernels built by :mod:`kernels._ext`
  (:func:`lookup_forward_fused`, :func:`lookup_bh_forward_fused`,
  :func:`lookup_bh_hash_fused`, :func:`gather_fused`), which also read narrow tables
  (:data:`TABLE_DTYPES`; int8 through :func:`quantize_tables`, :func:`dequantize_tables`);
* the memory of the tables (:func:`table_bytes`).

Every entry point, the fused ones included, checks its arguments and raises a
``ValueError``/``TypeError`` naming the argument before any compiled code runs (see
:mod:`kernels.lookup` for the layout and for what NaN and Inf do).
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from kernels._checks import check_float_dtype, check_positive_int, check_tensor
from kernels.hadamard import BHProjection


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
    "table_bytes",
    "TABLE_DTYPES",
    "MAX_TAU",
]

#: Narrow storage the fused kernels can read tables in (float32 inputs, float32
#: accumulation): half-width floats, or int8 with one float32 scale per row
#: (:func:`quantize_tables`); see :class:`LookupFFN`'s ``table_dtype``.
TABLE_DTYPES = (torch.float16, torch.bfloat16, torch.int8)
#: Codes are int64 and a table has ``2**tau`` rows; beyond this nothing fits anyway.
MAX_TAU = 40


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
