"""The LookupFFN layer (Zeng et al., 2023) and its FLOP count.

Part of :mod:`kernels.lookup` (chapter 5, ``chapters/05_lookupffn.ipynb``):
:class:`LookupFFN` projects its input to ``h`` soft codes of ``tau`` bits (BH4 or dense,
:mod:`kernels.hadamard`) and sums the weighted table rows they select
(:mod:`kernels.lookup.gather`), through the autograd path, the naive path or the fused
C++ kernel (:data:`LOOKUP_BACKENDS`). :func:`lookup_ffn_flops` counts its FLOP per token
as the paper does (Tables 1-4).
"""

from __future__ import annotations

import math
from typing import Any, Optional, Union

import torch
from torch import Tensor, nn

from kernels._checks import check_float_dtype, check_choice, check_positive_int, check_tensor
from kernels.hadamard import BHProjection, DenseProjection, projection_flops
from kernels.lookup.gather import (
    TABLE_DTYPES,
    _check_tau,
    dequantize_tables,
    lookup_bh_forward_fused,
    lookup_forward_fused,
    lookup_gather,
    lookup_gather_naive,
    quantize_tables,
    table_bytes,
)

__all__ = [
    "LookupFFN",
    "lookup_ffn_flops",
    "LOOKUP_BACKENDS",
    "DEFAULT_MAX_TABLE_BYTES",
]

#: Implementations of :meth:`LookupFFN.forward`.
LOOKUP_BACKENDS = ("auto", "torch", "naive", "fused")
#: Default cap on the memory of a LookupFFN's tables (4 GiB).
DEFAULT_MAX_TABLE_BYTES = 4 << 30



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

    def multiply_adds(self) -> int:
        """Multiply-adds per token: half the FLOP of :meth:`flops` (hash projection plus
        :math:`h\\,d` for the weighted gather)."""
        return int(self.flops()["total"]) // 2



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
