"""LookupFFN: a feed-forward layer as differentiable table lookups (Zeng et al., 2023).

This package is the second half of the package side of chapter 5
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

What is here (this ``__init__`` re-exports the public names of its modules):

* the pieces, each checkable on its own: :func:`sign_matrix`, :func:`hash_codes`,
  :func:`lookup_weights`, and the full softmax of eq. 10 (:func:`lookup_softmax`);
* :func:`lookup_gather`: the training path, a custom autograd Function
  (:class:`LookupGatherFunction`) whose forward is one ``embedding_bag`` and whose
  backward gives gradients to the gathered table rows and to ``z`` (hence to the
  projection), checked by ``torch.autograd.gradcheck`` in ``tests/lookup/test_gather.py``;
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

Modules: :mod:`kernels.lookup.gather` (codes, weights, the gather in its torch, naive and
fused forms, table quantisation), :mod:`kernels.lookup.layer` (:class:`LookupFFN` and its
FLOP) and :mod:`kernels.lookup.baselines` (the FFNs it is compared with and their FLOP);
:func:`kernels.ffn.multiply_adds` counts all of them.
"""

from __future__ import annotations

from kernels.lookup.gather import (
    sign_matrix,
    hash_codes,
    lookup_weights,
    lookup_softmax,
    lookup_gather,
    lookup_gather_naive,
    lookup_forward_fused,
    quantize_tables,
    dequantize_tables,
    lookup_bh_forward_fused,
    lookup_bh_hash_fused,
    gather_fused,
    LookupGatherFunction,
    table_bytes,
    TABLE_DTYPES,
    MAX_TAU,
)
from kernels.lookup.layer import (
    LookupFFN,
    lookup_ffn_flops,
    LOOKUP_BACKENDS,
    DEFAULT_MAX_TABLE_BYTES,
)
from kernels.lookup.baselines import (
    VanillaFFN,
    BlockDiagonalFFN,
    Top1MoEFFN,
    LSHSparseFFN,
    simhash_codes,
    lsh_active_mask,
    lsh_ffn_flops,
    vanilla_ffn_flops,
    block_diagonal_ffn_flops,
    moe_ffn_flops,
)

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
