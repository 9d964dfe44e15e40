"""MLP fusion: compressing the feed-forward blocks of a pretrained transformer while
keeping its neural tangent kernel.

This package is the package side of chapter 6 (``chapters/06_mlp_fusion.ipynb``), after
Wei, Guo, Chen and He (2023), *NTK-approximating MLP Fusion for Efficient Language Model
Fine-tuning* ("the paper"). Its modules, one idea each (this ``__init__`` re-exports their public names):

* the sub-MLP view of a two-layer MLP :math:`H = \\sigma(XW_1 + 1b_1^T)W_2 + 1b_2^T`
  (eq. 1) as :math:`p_I` bottleneck-1 MLPs, each described by the embedding
  :math:`w_i = [W_{1,\\cdot,i}; b_{1,i}; W_{2,i,\\cdot}]` (:func:`sub_mlp_embeddings`);
* deterministic k-means (k-means++ seeding, several restarts, Lloyd iterations) on those
  embeddings (:func:`kmeans`) and the matrices built from its labels: the one-hot
  clustering matrix :math:`C`, the averaging matrix :math:`\\bar C` and the diagonal
  scaling :math:`P = CC^T` (:func:`clustering_matrix`, :func:`averaging_matrix`,
  :func:`scaling_matrix`);
* the fused MLP of eq. 5, :math:`\\widetilde H_C = \\sigma(X\\widetilde W_1 + 1\\tilde
  b_1^T) P \\widetilde W_2 + 1b_2^T` with :math:`\\widetilde W_1 = W_1\\bar C^T`,
  :math:`\\tilde b_1 = \\bar C b_1`, :math:`\\widetilde W_2 = \\bar C W_2` and ``P`` a fixed,
  non-trainable scaling between the activation and :math:`\\widetilde W_2`
  (:func:`fuse_mlp`, :class:`CompressedLinear`);
* the baselines of Section 5.3 behind one interface (:func:`compress_mlp`, ``method=``):
  plain clustering (:math:`P^{1/2}` folded into both sides), truncated SVD in factored
  low-rank form (:class:`LowRankLinear`), Gaussian sketching, unstructured magnitude pruning
  at the same parameter budget, MMD minimisation (Appendix A.2, eqs. 8-10, :func:`mmd2`) and
  a uniformly random subset of the sub-MLPs with rescaled output weights;
* the same compression applied to chosen FFN blocks of a model: a ``Sequential(Linear,
  activation, Linear)`` or a BERT-style transformer (``encoder.layer[i].intermediate.dense``
  and ``encoder.layer[i].output.dense``) (:func:`find_ffn_blocks`,
  :func:`compress_sequential`, :func:`compress_model`);
* the NTK measures of Section 4.3 / Table 1: per-sample gradients with respect to the MLP
  parameters (:func:`mlp_gradients`), the SGD NTK :math:`\\langle\\nabla f(x),\\nabla
  f(z)\\rangle` (eq. 2, :func:`sgd_kernel`) and the asymmetric sign-GD ("Adam") kernel
  :math:`\\langle\\nabla f(x),\\operatorname{sign}\\nabla f(z)\\rangle` (eq. 3,
  :func:`sign_kernel`), the kernel error and the FFN output error
  (:func:`kernel_error`, :func:`ffn_output_error`) and two scale-invariant measures, the
  cosine similarity of two kernel matrices and the error after the best scalar rescale
  (:func:`kernel_cosine`, :func:`scaled_kernel_error`);
* the layer-wise task-specific tuning of eq. 6 (:func:`layerwise_tuning`).

The SGD kernel restricted to the MLP parameters agrees with :func:`kernels.ntk.empirical_ntk`
of a model whose only trainable parameters are those (tested); :func:`mlp_gradients`
exists because the sign kernel needs the gradients themselves, not only their inner
products, and because it gets all per-sample gradients of a transformer's FFN from one
batched backward pass.

Conventions: weights follow ``torch.nn.Linear`` (``weight`` is ``(out, in)``), so the
paper's :math:`W_1 \\in \\mathbb R^{p\\times p_I}` is ``linear1.weight.T`` and
:math:`W_2 \\in \\mathbb R^{p_I\\times p}` is ``linear2.weight.T``. Randomness comes from an
explicit ``generator`` (a ``torch.Generator`` on the CPU; ``None`` means a fresh one seeded
with 0), the package's convention; nothing touches torch's global generator.

The layers :class:`CompressedLinear` and :class:`LowRankLinear` live in :mod:`kernels.linear`
(below the FFN surgery of :mod:`kernels.surgery`, which recognises them) and are re-exported here.

Modules: :mod:`kernels.fusion.clustering` (the sub-MLP view and k-means),
:mod:`kernels.fusion.compress` (fusion and the baselines for one MLP),
:mod:`kernels.fusion.blocks` (the FFN blocks of a model), :mod:`kernels.fusion.measures`
(the NTK measures) and :mod:`kernels.fusion.tuning` (layer-wise tuning).
"""

from __future__ import annotations

from kernels.fusion.clustering import (
    KMeansResult,
    sub_mlp_embeddings,
    kmeans,
    clustering_matrix,
    averaging_matrix,
    scaling_matrix,
)
from kernels.fusion.compress import (
    METHODS,
    CompressedLinear,
    LowRankLinear,
    fuse_mlp,
    compress_mlp,
    svd_rank_for_budget,
    mmd2,
    MMDSupport,
    mmd_support,
)
from kernels.fusion.blocks import (
    compress_sequential,
    find_ffn_blocks,
    compress_model,
    mlp_parameter_count,
)
from kernels.fusion.measures import (
    mlp_gradients,
    sgd_kernel,
    sign_kernel,
    kernel_error,
    kernel_cosine,
    scaled_kernel_error,
    ffn_output_error,
)
from kernels.fusion.tuning import (
    layerwise_tuning,
)

__all__ = [
    "METHODS",
    "CompressedLinear",
    "LowRankLinear",
    "KMeansResult",
    "sub_mlp_embeddings",
    "kmeans",
    "clustering_matrix",
    "averaging_matrix",
    "scaling_matrix",
    "fuse_mlp",
    "compress_mlp",
    "svd_rank_for_budget",
    "compress_sequential",
    "find_ffn_blocks",
    "compress_model",
    "mlp_parameter_count",
    "mlp_gradients",
    "sgd_kernel",
    "sign_kernel",
    "kernel_error",
    "kernel_cosine",
    "scaled_kernel_error",
    "mmd2",
    "MMDSupport",
    "mmd_support",
    "ffn_output_error",
    "layerwise_tuning",
]
