"""The fast Walsh-Hadamard transform and the structured projections built on it.

This module is the first half of the package side of chapter 5
(``chapters/05_lookupffn.ipynb``, sections "The fast Walsh-Hadamard transform" and
"BH4: cheap learnable projections"). It holds

* :func:`fwht`: the Walsh-Hadamard transform :math:`x \\mapsto x H_d` of the last
  dimension (Sylvester ordering, :math:`H_1 = [1]`, :math:`H_{2n} = [[H_n, H_n], [H_n,
  -H_n]]`), normalised (:math:`H_d/\\sqrt d`, orthogonal) or not, in
  :math:`O(d \\log d)` per row. A compiled, cache-blocked and vectorised C++ kernel
  (``kernels/csrc/hadamard_cpu.cpp`` with the row kernels of ``fwht.h``, built by :mod:`kernels._ext`) runs CPU tensors;
  :func:`fwht_torch` -- ``log2 d`` butterfly stages of torch operations -- is the
  reference, the fallback when the extension cannot be built, and the path of CUDA
  tensors. :math:`H_d` is symmetric, so the backward pass is the same transform;
* :func:`hadamard_matrix` (dense, for checks) and :func:`dct_matrix` (orthonormal DCT-II);
* the projections :math:`\\mathbb R^{d_{in}} \\to \\mathbb R^{d_{out}}` compared in Fig. 4
  of Zeng et al. (2023): :class:`DenseProjection`, :class:`ACDCProjection` (eq. 18,
  :math:`\\prod_i A_i C D_i C^{-1}` with :math:`C` the DCT or, as in eq. 17, the
  Hadamard transform) and :class:`BHProjection` (eq. 19, :math:`\\prod_{i=1}^m B_i H`
  with block-diagonal :math:`B_i`; ``m = 4`` is the paper's BH4, :func:`BH4`);
* :func:`projection_flops` / :func:`projection_params`: the cost model behind the
  paper's MFLOP columns (Tables 1-4).

NaN and Inf are not scanned for (one more pass over a memory-bound transform): they
propagate through :func:`fwht` and the projections as through the dense products
(:func:`fwht_torch`); for such input the compiled kernel's values are unspecified (see
:mod:`kernels._ext`), never out-of-bounds reads. Every other bad argument -- a wrong
width, dtype, device, layout, or ``blocks`` edited out of shape -- is a ``ValueError`` or
``TypeError`` naming the argument, before any compiled code runs.

Shapes: inputs are ``(..., d_in)``; a structured projection pads ``d_in`` to the next
power of two :math:`d_p` and, when ``d_out`` exceeds :math:`d_p`, runs
:math:`c = \\lceil d_{out}/d_p \\rceil` independent copies on the same input and
concatenates them (the construction that reproduces the paper's FLOP counts), keeping
the first ``d_out`` outputs.

Reference: Zeng, Davies, Pulijala, Sankaralingam and Singh (2023), *LookupFFN: Making
Transformers Compute-lite for CPU Inference*, ICML (``zeng2023lookupffn`` in
``book/references.bib``); Moczulski et al. (2016), *ACDC: a structured efficient linear
layer*.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import torch
from torch import Tensor, nn

from kernels import _ext
from kernels._checks import (
    check_choice,
    check_dtype_kind,
    check_float_dtype,
    check_input,
    check_positive_int,
    check_tensor,
)
from kernels.device import check_tensor_device

__all__ = [
    "is_power_of_two",
    "next_power_of_two",
    "hadamard_matrix",
    "dct_matrix",
    "fwht",
    "fwht_torch",
    "fwht_backend",
    "DenseProjection",
    "ACDCProjection",
    "BHProjection",
    "BH4",
    "bh_project_fused",
    "check_fused_array",
    "check_fused_projection",
    "projection_flops",
    "projection_params",
    "FWHT_BACKENDS",
    "PROJECTION_KINDS",
]

#: Implementations :func:`fwht` can be asked for.
FWHT_BACKENDS = ("auto", "compiled", "torch")
#: Projection kinds of :func:`projection_flops` and :func:`projection_params`.
PROJECTION_KINDS = ("dense", "bh", "acdc")


def is_power_of_two(n: int) -> bool:
    """True for 1, 2, 4, 8, ... (``n`` a Python/NumPy integer; ``TypeError`` otherwise)."""
    if isinstance(n, bool) or not hasattr(n, "__index__"):
        raise TypeError(f"n must be an integer, got {n!r}")
    n = int(n)
    return n > 0 and n & (n - 1) == 0


def next_power_of_two(n: int) -> int:
    """Smallest power of two >= ``n`` (``n`` >= 1)."""
    n = check_positive_int("n", n)
    return 1 << (n - 1).bit_length()


def _check_length(name: str, d: int) -> None:
    if not is_power_of_two(d):
        raise ValueError(
            f"{name} must have a power-of-two length in its last dimension for the "
            f"Walsh-Hadamard transform, got {d} (pad it to {next_power_of_two(max(d, 1))})"
        )


def hadamard_matrix(
    d: int, normalized: bool = True, dtype: torch.dtype = torch.float64
) -> Tensor:
    """Dense Sylvester Hadamard matrix :math:`H_d` (``(d, d)``), divided by :math:`\\sqrt d`
    when ``normalized``. :math:`O(d^2)` memory: for checks and the dense baseline."""
    d = check_positive_int("d", d)
    if not is_power_of_two(d):
        raise ValueError(f"d must be a power of two, got {d}")
    h = torch.ones(1, 1, dtype=dtype)
    while h.shape[0] < d:  # Sylvester doubling
        h = torch.cat((torch.cat((h, h), dim=1), torch.cat((h, -h), dim=1)), dim=0)
    return h / math.sqrt(d) if normalized else h


def dct_matrix(d: int, dtype: torch.dtype = torch.float64) -> Tensor:
    """Orthonormal DCT-II matrix ``C`` (``(d, d)``) acting on row vectors: ``x @ C`` is
    the DCT of ``x`` and ``C.T`` its inverse (scipy's ``dct(x, norm='ortho')``)."""
    check_float_dtype("dtype", dtype)
    d = check_positive_int("d", d)
    n = torch.arange(d, dtype=torch.float64)
    c = torch.cos(math.pi * (n[:, None] + 0.5) * n[None, :] / d) * math.sqrt(2.0 / d)
    c[:, 0] /= math.sqrt(2.0)
    return c.to(dtype)


def fwht_torch(x: Tensor, normalized: bool = True) -> Tensor:
    """Reference FWHT of the last dimension in ``log2 d`` torch butterfly stages.

    Stage with span ``h`` views the rows as ``(..., d/(2h), 2, h)`` and replaces the
    pair ``(a, b)`` by ``(a + b, a - b)``. Each stage reads and writes the whole tensor,
    so it is memory-bound: :math:`O(d \\log d)` work but ``log2 d`` passes over memory.
    Works on any supported device and real dtype, differentiable by autograd. Only the
    cheap checks that need no device sync (type, device, dtype kind, rank, a power-of-two
    length): a bool, complex or meta ``x`` is refused by name.
    """
    if not isinstance(x, Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    check_tensor_device("x", x)
    check_dtype_kind("x", x, floating=False)
    if x.ndim == 0 or not is_power_of_two(x.shape[-1]):
        raise ValueError(f"x's last dimension must be a power of two, got shape {tuple(x.shape)}")
    d = x.shape[-1]
    lead = x.shape[:-1]
    out = x.reshape(-1, d)
    h = 1
    while h < d:
        pairs = out.reshape(-1, d // (2 * h), 2, h)
        a, b = pairs[:, :, 0, :], pairs[:, :, 1, :]
        out = torch.stack((a + b, a - b), dim=2).reshape(-1, d)
        h *= 2
    if normalized:
        out = out / math.sqrt(d)
    return out.reshape(*lead, d)


def _compiled_fwht(x: Tensor, normalized: bool) -> Tensor:
    from kernels._ext import build

    module = build()
    if x.requires_grad:
        x = x.detach()
    if x.ndim == 2 and x.is_contiguous():  # no reshape: they cost microseconds each
        return module.fwht(x, normalized)
    return module.fwht(x.reshape(-1, x.shape[-1]).contiguous(), normalized).view(x.shape)


_forward_ad = torch.autograd.forward_ad
_functorch_level = torch._C._functorch.maybe_current_level


def _plain_tensor(x: Tensor) -> bool:
    """True when no autograd or ``torch.func`` machinery can see ``x``: then the compiled
    kernel is called directly, without ``torch.autograd.Function`` (whose ``apply`` costs
    tens of microseconds, more than the whole transform of a few short rows)."""
    return (
        not x.requires_grad
        and _forward_ad._current_level < 0  # no dual (forward-mode) tensors
        and _functorch_level() is None  # no torch.func transform
    )


class _FWHT(torch.autograd.Function):
    """:math:`y = x H` with :math:`H` symmetric: the backward pass is :math:`g H`, and the
    forward-mode derivative of a tangent :math:`t` is :math:`t H`; under ``torch.vmap``
    the batch dimension becomes more rows."""

    @staticmethod
    def forward(x: Tensor, normalized: bool) -> Tensor:  # type: ignore[override]
        return _compiled_fwht(x, normalized)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: Tensor) -> None:
        ctx.normalized = inputs[1]

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return _FWHT.apply(grad, ctx.normalized), None

    @staticmethod
    def jvp(ctx: Any, tangent: Tensor, _normalized: Any) -> Tensor:
        return _FWHT.apply(tangent, ctx.normalized)

    @staticmethod
    def vmap(info: Any, in_dims: tuple, x: Tensor, normalized: bool) -> tuple[Tensor, Any]:
        # The transform acts on the last dimension: any other batch dimension is a row index.
        if in_dims[0] is None:
            return _FWHT.apply(x, normalized), None
        return _FWHT.apply(x.movedim(in_dims[0], 0), normalized), 0


def fwht_backend(x: Tensor, backend: str = "auto") -> str:
    """The implementation :func:`fwht` uses for ``x``: ``"compiled"`` or ``"torch"``.

    ``"auto"`` picks the compiled kernel for float32/float64 CPU tensors when the
    extension builds (one warning otherwise) and torch for everything else (CUDA
    tensors, other dtypes).
    """
    check_choice("backend", backend, FWHT_BACKENDS)
    if not isinstance(x, Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    check_tensor_device("x", x)
    check_dtype_kind("x", x, floating=False)
    eligible = x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64)
    if backend == "torch":
        return "torch"
    if backend == "compiled":
        if not eligible:
            raise ValueError(
                "backend='compiled' needs x to be a float32 or float64 CPU tensor, got "
                f"{x.dtype} on {x.device}"
            )
        from kernels._ext import build

        build()  # raises with the compiler's message when it cannot be built
        return "compiled"
    if eligible:
        from kernels._ext import load_extension

        if load_extension() is not None:
            return "compiled"
    return "torch"


def fwht(x: Tensor, normalized: bool = True, backend: str = "auto") -> Tensor:
    """Walsh-Hadamard transform of the last dimension: ``x @ H_d`` (``/ sqrt(d)`` if
    ``normalized``).

    ``x``: ``(..., d)`` with ``d`` a power of two; returns the same shape and dtype.
    Cost :math:`O(d \\log d)` per row instead of the dense product's :math:`O(d^2)`.
    The normalised transform is orthogonal and its own inverse; the unnormalised one
    satisfies :math:`H_d H_d = d I`. Differentiable in reverse and forward mode (the
    derivative is the same transform). ``backend``: see :func:`fwht_backend`. Derived in
    chapter 5, section "The fast Walsh-Hadamard transform"; the compiled kernel's design
    and its speed against FFHT: ``kernels/csrc/fwht.h`` and
    ``benchmarks/bench_fwht.py``.
    """
    module = _ext._module  # the compiled kernels once a first call has loaded them
    if (
        module is not None
        and backend == "auto"
        and (normalized is True or normalized is False)
        and _forward_ad._current_level < 0
        and _functorch_level() is None
    ):
        # The common call (a plain contiguous 2-D float CPU tensor, checked in C++; None
        # for anything else): FFHT's Python binding costs about a microsecond, and so
        # does this path (benchmarks/bench_fwht.py, batch 1).
        y = module.fwht_plain(x, normalized)
        if y is not None:
            return y
    check_tensor("x", x, finite=False)
    if x.ndim == 0:
        raise ValueError("x must have at least one dimension, got a scalar")
    if not isinstance(normalized, bool):
        raise TypeError(f"normalized must be a bool, got {normalized!r}")
    _check_length("x", x.shape[-1])
    if fwht_backend(x, backend) == "torch":
        return fwht_torch(x, normalized)
    if _plain_tensor(x):
        return _compiled_fwht(x, normalized)
    return _FWHT.apply(x, normalized)


# --------------------------------------------------------------------------------------
# Structured projections (Fig. 4, eqs. 17-19)
# --------------------------------------------------------------------------------------


def _layout(d_in: int, d_out: int) -> tuple[int, int]:
    """(padded width d_p, number of copies c) of a structured projection."""
    d_pad = next_power_of_two(d_in)
    return d_pad, -(-d_out // d_pad)


def _check_projection_input(x: Tensor, in_features: int) -> Tensor:
    """A tensor whose last dimension is ``in_features`` (the projections' input check)."""
    check_tensor("x", x, finite=False)
    if x.ndim == 0 or x.shape[-1] != in_features:
        raise ValueError(
            f"x must have last dimension in_features={in_features}, got shape {tuple(x.shape)}"
        )
    return x


class _Structured(nn.Module):
    """Shared plumbing: pad the input to ``d_pad``, run ``copies`` copies, crop."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.in_features = check_positive_int("in_features", in_features)
        self.out_features = check_positive_int("out_features", out_features)
        self.d_pad, self.copies = _layout(self.in_features, self.out_features)

    def _expand(self, x: Tensor) -> Tensor:
        x = _check_projection_input(x, self.in_features)
        if self.d_pad != self.in_features:
            x = nn.functional.pad(x, (0, self.d_pad - self.in_features))
        return x.unsqueeze(-2).expand(*x.shape[:-1], self.copies, self.d_pad)

    def _crop(self, y: Tensor) -> Tensor:
        y = y.reshape(*y.shape[:-2], self.copies * self.d_pad)
        return y[..., : self.out_features]


class DenseProjection(nn.Module):
    """``z = x R`` with a dense ``R`` (``(d_in, d_out)``): :math:`2 d_{in} d_{out}` FLOP."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        generator: Optional[torch.Generator] = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        check_float_dtype("dtype", dtype)
        self.in_features = check_positive_int("in_features", in_features)
        self.out_features = check_positive_int("out_features", out_features)
        weight = torch.randn(in_features, out_features, generator=generator, dtype=dtype)
        self.weight = nn.Parameter(weight / math.sqrt(in_features))

    def forward(self, x: Tensor) -> Tensor:
        check_input("x", x, self.in_features, self.weight)
        return x @ self.weight

    def dense_matrix(self) -> Tensor:
        return self.weight.detach().clone()


class ACDCProjection(_Structured):
    """Eq. 18: :math:`R = \\prod_{i=1}^{k} A_i C D_i C^{-1}`, diagonal ``A_i``, ``D_i``.

    ``transform="dct"`` is Moczulski et al.'s ACDC (``C`` the orthonormal DCT-II,
    applied here as a dense matrix -- the FLOP count assumes a fast DCT);
    ``transform="hadamard"`` replaces ``C`` by the normalised Hadamard transform
    (``C^{-1} = C``), the learnable form of eq. 17. ``layers`` is ``k``. Diagonals start
    at 1 plus ``init_noise`` times Gaussian noise. Cost per copy
    :math:`k (2 d_p \\log_2 d_p + 2 d_p)`.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        layers: int = 1,
        transform: str = "hadamard",
        *,
        init_noise: float = 0.1,
        generator: Optional[torch.Generator] = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__(in_features, out_features)
        self.layers = check_positive_int("layers", layers)
        self.transform = check_choice("transform", transform, ("dct", "hadamard"))
        shape = (self.layers, self.copies, self.d_pad)
        noise = torch.randn((2,) + shape, generator=generator, dtype=dtype) * init_noise
        self.a = nn.Parameter(1.0 + noise[0])
        self.d = nn.Parameter(1.0 + noise[1])
        if self.transform == "dct":
            self.register_buffer("dct", dct_matrix(self.d_pad, dtype=dtype), persistent=False)

    def _forward_transform(self, x: Tensor) -> Tensor:
        return x @ self.dct if self.transform == "dct" else fwht(x)

    def _inverse_transform(self, x: Tensor) -> Tensor:
        return x @ self.dct.T if self.transform == "dct" else fwht(x)

    def forward(self, x: Tensor) -> Tensor:
        y = self._expand(x)
        for i in range(self.layers):
            y = self._inverse_transform(self._forward_transform(y * self.a[i]) * self.d[i])
        return self._crop(y)


class BHProjection(_Structured):
    """Eq. 19, BH\\ *m*: :math:`z = x B_1 H B_2 H \\cdots B_m H` with block-diagonal
    :math:`B_i` (blocks of ``block x block``) and the normalised Hadamard transform.

    ``block`` must divide the padded width :math:`d_p`; ``block = 1`` makes every
    :math:`B_i` diagonal. Blocks start as random Gaussian matrices scaled by
    :math:`1/\\sqrt{block}`, so the projection roughly preserves norms. Cost per copy
    :math:`m (2 d_p\\, block + d_p \\log_2 d_p)` FLOP (:func:`projection_flops`), parameters
    :math:`m\\, d_p\\, block`. ``m = 4`` is the paper's BH4 (:func:`BH4`).
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        block: int = 64,
        m: int = 4,
        *,
        generator: Optional[torch.Generator] = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__(in_features, out_features)
        self.block = check_positive_int("block", block)
        self.m = check_positive_int("m", m)
        if self.d_pad % self.block:
            raise ValueError(
                f"block must divide the padded input width {self.d_pad} (a power of two), "
                f"got {self.block}"
            )
        nb = self.d_pad // self.block
        blocks = torch.randn(
            self.m, self.copies, nb, self.block, self.block, generator=generator, dtype=dtype
        )
        self.blocks = nn.Parameter(blocks / math.sqrt(self.block))

    def check_blocks(self) -> Tensor:
        """The ``blocks`` parameter, checked against the layout this projection was built
        with: ``(m, copies, d_pad / block, block, block)``, floating point.

        Raises ``ValueError`` (``TypeError`` for a non-float tensor) naming ``blocks``
        when a user edited ``blocks`` (or ``in_features``, ``block``, ...) so that they
        no longer agree -- before the compiled kernel would read out of bounds.
        """
        blocks = self.blocks
        if not isinstance(blocks, Tensor):
            raise TypeError(f"blocks must be a torch.Tensor, got {type(blocks).__name__}")
        if not blocks.is_floating_point():
            raise TypeError(f"blocks must have a floating-point dtype, got {blocks.dtype}")
        d_pad, copies = _layout(self.in_features, self.out_features)
        block = self.block
        if not isinstance(block, int) or block < 1 or d_pad % block:
            raise ValueError(
                f"block must be a positive divisor of the padded width {d_pad}, got {block!r}"
            )
        want = (self.m, copies, d_pad // block, block, block)
        if tuple(blocks.shape) != want or (self.d_pad, self.copies) != (d_pad, copies):
            raise ValueError(
                f"blocks must have shape (m, copies, d_pad / block, block, block) = {want} for "
                f"in_features={self.in_features}, out_features={self.out_features}, "
                f"block={block}, m={self.m}; got {tuple(blocks.shape)} (were blocks or the "
                "sizes edited after construction?)"
            )
        return blocks

    def forward(self, x: Tensor) -> Tensor:
        self.check_blocks()
        y = self._expand(x)
        lead = y.shape[:-2]
        nb = self.d_pad // self.block
        for i in range(self.m):
            y = y.reshape(*lead, self.copies, nb, self.block)
            y = torch.einsum("...cqi,cqij->...cqj", y, self.blocks[i])
            y = fwht(y.reshape(*lead, self.copies, self.d_pad))
        return self._crop(y)


def check_fused_array(name: str, value: Any) -> None:
    """Raise unless ``value`` is what the compiled kernels read: a contiguous float32 or
    float64 CPU tensor (``TypeError``/``ValueError`` naming ``name``). Also used by
    :mod:`kernels.lookup`'s fused entry points."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if value.dtype not in (torch.float32, torch.float64):
        raise TypeError(f"the fused kernel needs {name} as float32 or float64, got {value.dtype}")
    if value.device.type != "cpu":
        raise ValueError(f"the fused kernel runs on the CPU; {name} is on {value.device}")
    if not value.is_contiguous():
        raise ValueError(
            f"the fused kernel needs a contiguous {name} (call .contiguous()); got strides "
            f"{value.stride()} for shape {tuple(value.shape)}"
        )


def check_fused_projection(x: Any, projection: Any, x_name: str = "x") -> Tensor:
    """Everything the compiled BH kernels assume; returns the projection's blocks. Used by
    :func:`bh_project_fused` and :mod:`kernels.lookup`'s fused BH entry points."""
    if not isinstance(projection, BHProjection):
        raise TypeError(f"projection must be a BHProjection, got {type(projection).__name__}")
    check_fused_array(x_name, x)
    if x.ndim != 2 or x.shape[1] != projection.in_features:
        raise ValueError(
            f"{x_name} must have shape (tokens, {projection.in_features}), got {tuple(x.shape)}"
        )
    blocks = projection.check_blocks().detach()
    if projection.block % 16:
        raise ValueError(f"the fused kernel needs block to be a multiple of 16, got {projection.block}")
    check_fused_array("blocks", blocks.contiguous())
    if blocks.dtype != x.dtype:
        raise TypeError(f"{x_name} must have the projection's dtype {blocks.dtype}, got {x.dtype}")
    return blocks.contiguous()


def bh_project_fused(x: Tensor, projection: "BHProjection") -> Tensor:
    """:class:`BHProjection` forward by the compiled kernel (inference only, no gradient).

    ``x``: contiguous ``(tokens, in_features)`` CPU float32/float64 of the projection's
    dtype; the projection's ``block`` must be a multiple of 16 (the kernel's register
    block). Tiles of 48 tokens go through all ``m`` rounds of block products and FWHTs in
    per-thread buffers. Raises ``RuntimeError`` when the extension cannot be built.
    """
    blocks = check_fused_projection(x, projection)
    from kernels._ext import build

    with torch.no_grad():
        return build().bh_project(x, blocks, projection.out_features)


def BH4(
    in_features: int,
    out_features: int,
    block: int = 64,
    *,
    generator: Optional[torch.Generator] = None,
    dtype: torch.dtype = torch.float32,
) -> BHProjection:
    """The paper's BH4 projection: :class:`BHProjection` with ``m = 4``."""
    return BHProjection(in_features, out_features, block, 4, generator=generator, dtype=dtype)


def projection_flops(
    kind: str, in_features: int, out_features: int, *, block: int = 64, m: int = 4
) -> int:
    """FLOP of one projection of one token (one multiply-add = 2 FLOP).

    * ``"dense"``: :math:`2 d_{in} d_{out}`;
    * ``"bh"`` (BH\\ *m*, eq. 19): :math:`c\\, m\\, (2 d_p\\, block + d_p \\log_2 d_p)`;
    * ``"acdc"`` (eq. 18 with ``m`` layers): :math:`c\\, m\\, (2 d_p \\log_2 d_p + 2 d_p)`;

    with :math:`d_p` the next power of two of :math:`d_{in}` and
    :math:`c = \\lceil d_{out}/d_p \\rceil`. With ``block = 64`` BH4 gives the paper's
    0.56 MFLOP hash for ``d = 512``, ``h tau = 1024`` (Table 3).
    """
    check_choice("kind", kind, PROJECTION_KINDS)
    d_in = check_positive_int("in_features", in_features)
    d_out = check_positive_int("out_features", out_features)
    block = check_positive_int("block", block)
    m = check_positive_int("m", m)
    if kind == "dense":
        return 2 * d_in * d_out
    d_pad, copies = _layout(d_in, d_out)
    log_d = int(math.log2(d_pad))
    if kind == "bh":
        return copies * m * (2 * d_pad * block + d_pad * log_d)
    return copies * m * (2 * d_pad * log_d + 2 * d_pad)


def projection_params(
    kind: str, in_features: int, out_features: int, *, block: int = 64, m: int = 4
) -> int:
    """Parameter count of a projection (same conventions as :func:`projection_flops`)."""
    check_choice("kind", kind, PROJECTION_KINDS)
    d_in = check_positive_int("in_features", in_features)
    d_out = check_positive_int("out_features", out_features)
    block = check_positive_int("block", block)
    m = check_positive_int("m", m)
    if kind == "dense":
        return d_in * d_out
    d_pad, copies = _layout(d_in, d_out)
    if kind == "bh":
        return copies * m * d_pad * block
    return copies * m * 2 * d_pad
