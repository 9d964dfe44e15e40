"""MLP fusion: compressing the feed-forward blocks of a pretrained transformer while
keeping its neural tangent kernel.

This module is the package side of chapter 6 (``chapters/06_mlp_fusion.ipynb``), after
Wei, Guo, Chen and He (2023), *NTK-approximating MLP Fusion for Efficient Language Model
Fine-tuning* ("the paper"). It holds

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

One idea, more than 1,000 lines: MLP fusion as the paper evaluates it -- the fused MLP, the
baselines it is compared against at the same budget and the NTK measures it is compared
by share the sub-MLP view, the clustering matrices and the FFN blocks of a model; split
apart, each part would import the others' private helpers.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Callable, Iterable, NamedTuple, Optional, Sequence, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from kernels._checks import (
    check_callable,
    check_choice,
    check_index_tensor,
    check_module,
    check_nonnegative_float,
    check_positive_float,
    check_positive_int,
    check_same_dtype,
    check_tensor,
    cpu_generator,
)
from kernels.linear import CompressedLinear, LowRankLinear
from kernels.surgery import bert_layers, find_ffn_sites

__all__ = [
    "METHODS",
    "CompressedLinear",
    "LowRankLinear",
    "KMeansResult",
    "FFNBlock",
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

#: Compression methods of :func:`compress_mlp`: the paper's MLP fusion, the baselines
#: of its Section 5.3, and a uniformly random subset of the sub-MLPs ("random").
METHODS = ("fusion", "clustering", "svd", "sketch", "pruning", "mmd", "random")


def _as_compressed(linear: nn.Module) -> CompressedLinear:
    if isinstance(linear, CompressedLinear):
        return linear
    return CompressedLinear(linear.weight, linear.bias)


# --------------------------------------------------------------------------------------
# The sub-MLP view and k-means
# --------------------------------------------------------------------------------------


def _check_pair(linear1: object, linear2: object) -> tuple[nn.Linear, nn.Linear]:
    for name, lin in (("linear1", linear1), ("linear2", linear2)):
        if not isinstance(lin, (nn.Linear, CompressedLinear)):
            raise TypeError(f"{name} must be a torch.nn.Linear, got {type(lin).__name__}")
        if isinstance(lin, CompressedLinear) and (
            lin.mask is not None or not torch.all(lin.scale == 1)
        ):
            raise ValueError(f"{name} is already compressed (it has a mask or a scale); pass plain linear layers")
    if linear2.in_features != linear1.out_features:
        raise ValueError(
            "mismatched linear layers: linear1 maps to "
            f"{linear1.out_features} features (p_I) but linear2 expects {linear2.in_features}"
        )
    if linear2.out_features != linear1.in_features:
        raise ValueError(
            "mismatched linear layers: an FFN maps p -> p_I -> p, but linear1 takes "
            f"{linear1.in_features} features and linear2 returns {linear2.out_features}"
        )
    return linear1, linear2


def _bias_or_zeros(linear: nn.Module) -> Tensor:
    if linear.bias is not None:
        return linear.bias.detach()
    return torch.zeros(linear.weight.shape[0], dtype=linear.weight.dtype, device=linear.weight.device)


def sub_mlp_embeddings(linear1: nn.Module, linear2: nn.Module) -> Tensor:
    """Embeddings :math:`w_i = [W_{1,\\cdot,i}^T, b_{1,i}, W_{2,i,\\cdot}]` of the
    :math:`p_I` bottleneck-1 sub-MLPs of ``linear2(act(linear1(x)))`` (Section 4.2).

    Row ``i`` determines sub-MLP ``i``, :math:`x \\mapsto \\sigma(x W_{1,\\cdot,i} +
    b_{1,i}) W_{2,i,\\cdot}`, and the MLP is their sum plus :math:`b_2`.

    Returns a detached ``(p_I, 2p + 1)`` tensor in the layers' dtype. Cost
    :math:`O(p\\,p_I)`. Chapter 6, section "An MLP is a sum of sub-MLPs".
    """
    linear1, linear2 = _check_pair(linear1, linear2)
    w1 = linear1.weight.detach()  # (p_I, p): row i is W1[:, i]
    b1 = _bias_or_zeros(linear1)[:, None]  # (p_I, 1)
    w2 = linear2.weight.detach().T  # (p_I, p): row i is W2[i, :]
    return torch.cat([w1, b1, w2], dim=1)


class KMeansResult(NamedTuple):
    """Result of :func:`kmeans`: ``labels`` ``(n,)`` int64 in ``[0, k)``, ``centroids``
    ``(k, d)``, ``inertia`` (sum of squared distances to the assigned centroid), the
    Lloyd iterations of the best restart ``n_iter``."""

    labels: Tensor
    centroids: Tensor
    inertia: float
    n_iter: int


def _sq_dists(x: Tensor, x_sq: Tensor, c: Tensor) -> Tensor:
    return (x_sq[:, None] - 2.0 * x @ c.T + (c * c).sum(1)[None, :]).clamp_min_(0.0)


#: Largest n * n for which k-means++ precomputes the Gram matrix of the points (float64:
#: 128 MiB); above it each seeding step multiplies the points by its candidates instead.
_GRAM_MAX_ENTRIES = 1 << 24


def _kmeans_pp(x: Tensor, x_sq: Tensor, k: int, gen: torch.Generator, gram: Optional[Tensor] = None) -> Tensor:
    """Greedy k-means++ (Arthur & Vassilvitskii 2007, the variant scikit-learn uses): each
    new centre is the best, by the resulting potential, of ``2 + log k`` candidates drawn
    with probability proportional to the squared distance to the nearest chosen centre.

    ``gram`` (``x @ x.T``, optional) turns each step's distances to the candidates, which
    are points, into a gather: O(n) per candidate instead of O(nd)."""
    n = x.shape[0]
    trials = 2 + int(math.log(k))

    def dists_to(rows: Tensor) -> Tensor:  # (n, len(rows)) squared distances to the points `rows`
        if gram is None:
            return _sq_dists(x, x_sq, x[rows])
        return (x_sq[:, None] - 2.0 * gram[:, rows] + x_sq[rows][None, :]).clamp_min_(0.0)

    first = int(torch.randint(n, (1,), generator=gen))
    idx = [first]
    d2 = dists_to(torch.tensor([first]))[:, 0]
    for _ in range(1, k):
        total = float(d2.sum())
        if total <= 0.0:
            # Fewer distinct points than k: take any point not chosen yet.
            free = torch.ones(n, dtype=torch.bool)
            free[idx] = False
            nxt = int(torch.nonzero(free)[0])
            d2 = torch.minimum(d2, dists_to(torch.tensor([nxt]))[:, 0])
        else:
            cand = torch.multinomial(d2 / total, trials, replacement=True, generator=gen)
            cand_d2 = torch.minimum(d2[None, :], dists_to(cand).T)  # (trials, n)
            best = int(torch.argmin(cand_d2.sum(1)))
            nxt = int(cand[best])
            d2 = cand_d2[best]
        idx.append(nxt)
    return x[idx].clone()


def _lloyd(x: Tensor, x_sq: Tensor, centroids: Tensor, max_iter: int, tol: float):
    k = centroids.shape[0]
    labels = torch.zeros(x.shape[0], dtype=torch.long)
    n_iter = 0
    for n_iter in range(1, max_iter + 1):
        d2 = _sq_dists(x, x_sq, centroids)
        min_d2, labels = d2.min(dim=1)
        counts = torch.bincount(labels, minlength=k)
        sums = torch.zeros_like(centroids).index_add_(0, labels, x)
        new = sums / counts.clamp_min(1)[:, None].to(x.dtype)
        empty = torch.nonzero(counts == 0)[:, 0]
        if len(empty):
            # An empty cluster takes the points farthest from their centroids.
            far = torch.argsort(min_d2, descending=True)[: len(empty)]
            new[empty] = x[far]
            labels[far] = empty
        shift = float(((new - centroids) ** 2).sum())
        centroids = new
        if shift <= tol:
            break
    d2 = _sq_dists(x, x_sq, centroids)
    min_d2, labels = d2.min(dim=1)
    return labels, centroids, float(min_d2.sum()), n_iter


def kmeans(
    points: Tensor,
    k: int,
    *,
    n_init: int = 3,
    max_iter: int = 100,
    tol: float = 1e-8,
    generator: Optional[torch.Generator] = None,
    init: str = "k-means++",
) -> KMeansResult:
    """k-means clustering (Lloyd's algorithm) with greedy k-means++ seeding (or ``k``
    distinct points drawn uniformly, ``init="random"``) and ``n_init`` restarts; the
    restart with the lowest inertia wins.

    Deterministic for a given ``generator`` state (all draws come from it; the arithmetic
    runs in float64 on the CPU). A cluster that empties
    during the iterations is re-seeded with the point farthest from its centroid, so
    every one of the ``k`` clusters is non-empty when the points have at least ``k``
    distinct values. With ``k = n`` distinct points every point is its own cluster.

    Args:
        points: ``(n, d)`` floating tensor.
        k: number of clusters, ``1 <= k <= n``.
        n_init: restarts; max_iter: Lloyd iterations per restart; tol: stop when the
            squared centroid shift (summed) is at most ``tol`` relative to the data's
            mean squared norm.
        generator: a CPU ``torch.Generator`` (``None``: a fresh one seeded with 0).
        init: ``"k-means++"`` (greedy k-means++) or ``"random"`` (uniform draw of points).

    Returns:
        :class:`KMeansResult` with the labels ``(n,)``, centroids ``(k, d)`` (float64),
        inertia and iterations of the best restart.

    Cost :math:`O(n_{init}\\cdot \\text{iterations}\\cdot n k d)` time, :math:`O(nk + nd)`
    memory. Chapter 6, section "Clustering the sub-MLPs".
    """
    points = check_tensor("points", points, ndim=2)
    n = points.shape[0]
    k = check_positive_int("k", k)
    if k > n:
        raise ValueError(f"k must be at most the number of points ({n}), got {k}")
    n_init = check_positive_int("n_init", n_init)
    max_iter = check_positive_int("max_iter", max_iter)
    gen = _generator(generator)
    init = check_choice("init", init, ("k-means++", "random"))
    x = points.detach().to("cpu", torch.float64)
    x_sq = (x * x).sum(1)
    scale = float(x_sq.mean()) or 1.0
    gram = x @ x.T if init == "k-means++" and n * n <= _GRAM_MAX_ENTRIES else None
    best = None
    for _ in range(n_init):
        if init == "k-means++":
            start = _kmeans_pp(x, x_sq, k, gen, gram)
        else:
            start = x[torch.randperm(n, generator=gen)[:k]].clone()
        labels, centroids, inertia, n_iter = _lloyd(x, x_sq, start, max_iter, tol * scale)
        if best is None or inertia < best.inertia:
            best = KMeansResult(labels, centroids, inertia, n_iter)
    return best


def clustering_matrix(labels: Tensor, k: int) -> Tensor:
    """One-hot clustering matrix :math:`C \\in \\{0,1\\}^{k\\times p_I}`,
    :math:`C_{ji} = 1` iff sub-MLP ``i`` is in cluster ``j`` (Section 4.2).

    ``labels``: ``(p_I,)`` integers in ``[0, k)``. Returns ``(k, p_I)`` float64.
    Chapter 6, section "Clustering the sub-MLPs".
    """
    labels = check_index_tensor("labels", labels, ndim=1)
    k = check_positive_int("k", k)
    if len(labels) and (int(labels.min()) < 0 or int(labels.max()) >= k):
        raise ValueError(f"labels must lie in [0, {k}), got values in [{int(labels.min())}, {int(labels.max())}]")
    c = torch.zeros(k, labels.shape[0], dtype=torch.float64)
    c[labels.cpu(), torch.arange(labels.shape[0])] = 1.0
    return c


def averaging_matrix(c: Tensor) -> Tensor:
    """Averaging matrix :math:`\\bar C`: the rows of ``C`` divided by their sums, so
    that :math:`\\bar C W` holds the cluster centroids. ``(k, p_I) -> (k, p_I)``; an empty
    cluster (zero row) stays zero."""
    c = check_tensor("c", c, ndim=2)
    return c / c.sum(1, keepdim=True).clamp_min(1.0)


def scaling_matrix(c: Tensor) -> Tensor:
    """The scaling matrix :math:`P = CC^T` (``(k, k)``, diagonal): :math:`P_{jj}` is
    the number of sub-MLPs in cluster ``j`` (Section 4.3)."""
    c = check_tensor("c", c, ndim=2)
    return c @ c.T


# --------------------------------------------------------------------------------------
# Compression of one MLP
# --------------------------------------------------------------------------------------


def _check_k(k: object, p_inner: int) -> int:
    if isinstance(k, bool) or not hasattr(k, "__index__"):
        raise TypeError(f"k must be an integer number of intermediate units, got {k!r}")
    k = int(k)
    if k <= 0 or k > p_inner:
        raise ValueError(f"k must satisfy 1 <= k <= p_I = {p_inner}, got {k}")
    return k


_generator = cpu_generator  # kernels._checks: explicit CPU generator, None -> seed 0


def svd_rank_for_budget(p: int, p_inner: int, k: int) -> int:
    """Rank ``r`` of the factored truncated-SVD baseline with the parameter budget of a
    width-``k`` MLP: rank-``r`` factors of both ``p x p_I`` weights plus the full ``b_1``
    cost ``2r(p + p_I) + p_I`` numbers, a width-``k`` MLP ``k(2p + 1)`` (``b_2`` is
    shared); ``r = round((k(2p+1) - p_I) / (2(p + p_I)))`` clipped to ``[1, min(p, p_I)]``."""
    p = check_positive_int("p", p)
    p_inner = check_positive_int("p_inner", p_inner)
    k = check_positive_int("k", k)
    r = round((k * (2 * p + 1) - p_inner) / (2 * (p + p_inner)))
    return max(1, min(p, p_inner, r))


def _low_rank_factors(matrix: Tensor, rank: int) -> tuple[Tensor, Tensor]:
    """Balanced factors of the best rank-``rank`` approximation (Eckart-Young):
    ``U_r S_r^{1/2}`` and ``S_r^{1/2} V_r^T``."""
    u, s, vh = torch.linalg.svd(matrix.to(torch.float64), full_matrices=False)
    root = s[:rank].sqrt()
    return u[:, :rank] * root, root[:, None] * vh[:rank]


def _sq_dist_matrix(a: Tensor, b: Tensor) -> Tensor:
    return ((a * a).sum(1)[:, None] - 2.0 * a @ b.T + (b * b).sum(1)[None, :]).clamp_min(0.0)


def mmd2(x: Tensor, y: Tensor, bandwidth: float) -> Tensor:
    """Squared maximum mean discrepancy (Appendix A.2, eq. 8) between the uniform
    empirical distributions on the rows of ``x`` ``(n, d)`` and ``y`` ``(m, d)``, Gaussian
    kernel :math:`k(a, b) = \\exp(-\\|a - b\\|^2 / (2h^2))`, ``h = bandwidth``:
    :math:`\\overline{k(x, x')} + \\overline{k(y, y')} - 2\\,\\overline{k(x, y)}` (means over
    all pairs, diagonal included: the MMD of the two discrete distributions themselves).
    Differentiable; returns a 0-d tensor in the inputs' dtype. Cost :math:`O((n+m)^2 d)`.
    Chapter 6, section "The baselines"."""
    x = check_tensor("x", x, ndim=2)
    y = check_tensor("y", y, ndim=2)
    if x.shape[1] != y.shape[1]:
        raise ValueError(f"x and y must have the same number of columns, got {x.shape[1]} and {y.shape[1]}")
    check_same_dtype(("x", x), ("y", y))
    if x.device != y.device:
        raise ValueError(f"x and y must be on one device, got {x.device} and {y.device}")
    if isinstance(bandwidth, bool) or not isinstance(bandwidth, (int, float)) or not bandwidth > 0:
        raise ValueError(f"bandwidth must be a positive number, got {bandwidth!r}")
    gamma = 1.0 / (2.0 * float(bandwidth) ** 2)
    kxx = torch.exp(-gamma * _sq_dist_matrix(x, x)).mean()
    kyy = torch.exp(-gamma * _sq_dist_matrix(y, y)).mean()
    kxy = torch.exp(-gamma * _sq_dist_matrix(x, y)).mean()
    return kxx + kyy - 2.0 * kxy


class MMDSupport(NamedTuple):
    """Result of :func:`mmd_support`: the ``points`` ``(k, d)`` (float64), the squared MMD
    after every optimisation step ``history`` (``history[0]``: the random start), the
    kernel ``bandwidth``, and ``converged`` (the stopping rule was met before the step
    limit)."""

    points: Tensor
    history: list[float]
    bandwidth: float
    converged: bool


def mmd_support(
    w: Tensor,
    k: int,
    *,
    steps: int = 500,
    lr: float = 0.05,
    tol: float = 1e-3,
    generator: Optional[torch.Generator] = None,
) -> MMDSupport:
    """``k`` support points :math:`W^{(m)}` minimising :math:`\\mathrm{MMD}^2(\\mu_w,
    \\mu_m(W^{(m)}))` (Appendix A.2, eq. 9): ``mu_w`` uniform on the rows of ``w``
    ``(n, d)``, ``mu_m`` uniform on the ``k`` points. Gaussian kernel with the
    median-heuristic bandwidth (``h^2`` = half the median squared distance between rows of
    ``w``, from at most 512 of them); the points start at ``k`` rows of ``w`` drawn without
    replacement (a random subset) and move by full-batch Adam with a step of ``lr`` times
    the rows' root-mean-square coordinate spread, halved whenever the objective rises
    (float32 arithmetic; the points come back in float64).

    Stopping rule: after at least 20 steps, stop when the squared MMD fell by less than
    ``tol`` (relative) over the last fifth of the steps taken; otherwise after ``steps``
    steps (``converged`` is then False). With ``k = n`` the rows themselves are returned
    (MMD 0, the minimum).

    Cost :math:`O(\\text{steps}\\cdot(n + k) k d)`. Chapter 6, section "The baselines".
    """
    w = check_tensor("w", w, ndim=2)
    n = w.shape[0]
    k = check_positive_int("k", k)
    if k > n:
        raise ValueError(f"k must be at most the number of rows of w ({n}), got {k}")
    steps = check_positive_int("steps", steps)
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not lr > 0:
        raise ValueError(f"lr must be a positive number, got {lr!r}")
    gen = _generator(generator)
    x = w.detach().to("cpu", torch.float64)
    y0 = x[torch.randperm(n, generator=gen)[:k]].clone()
    with torch.no_grad():
        sub = x[torch.randperm(n, generator=gen)[: min(n, 512)]]
        d2 = _sq_dist_matrix(sub, sub)
        med = float(d2[d2 > 0].median()) if bool((d2 > 0).any()) else 1.0
    bandwidth = math.sqrt(med / 2.0)
    gamma = 1.0 / med
    with torch.no_grad():
        kxx = float(torch.exp(-gamma * _sq_dist_matrix(x, x)).mean())
    if k == n:
        return MMDSupport(y0, [float(mmd2(x, y0, bandwidth))], bandwidth, True)
    # The optimisation runs in float32 (half the time of float64; the objective is smooth
    # and its value is far above float32 rounding); the points are returned in float64.
    x = x.to(torch.float32)
    y0 = y0.to(torch.float32)

    def objective(y: Tensor) -> Tensor:
        return kxx + torch.exp(-gamma * _sq_dist_matrix(y, y)).mean() - 2.0 * torch.exp(-gamma * _sq_dist_matrix(x, y)).mean()

    y = y0.clone().requires_grad_(True)
    step = lr * math.sqrt(float(x.var(0).mean()))
    opt = torch.optim.Adam([y], lr=step)
    history: list[float] = []
    best, best_y, converged = math.inf, y0, False
    for t in range(steps + 1):
        opt.zero_grad()
        loss = objective(y)
        value = float(loss.detach())
        history.append(value)
        if value < best:
            best, best_y = value, y.detach().clone()
        elif value > history[-2] if len(history) > 1 else False:
            for group in opt.param_groups:
                group["lr"] *= 0.5
        m = len(history) - 1
        if m >= 20:
            ref = history[m - max(1, m // 5)]
            if ref - value <= tol * abs(ref):
                converged = True
                break
        if t == steps:
            break
        loss.backward()
        opt.step()
    return MMDSupport(best_y.to(torch.float64), history, bandwidth, converged)


def compress_mlp(
    linear1: nn.Module,
    linear2: nn.Module,
    k: int,
    *,
    method: str = "fusion",
    generator: Optional[torch.Generator] = None,
    n_init: int = 3,
    max_iter: int = 100,
    mmd_steps: int = 500,
    mmd_lr: float = 0.05,
    clustering: Optional[KMeansResult] = None,
    support: Optional[MMDSupport] = None,
    rank: Optional[int] = None,
) -> tuple[nn.Module, nn.Module]:
    """Compress ``linear2(act(linear1(x)))`` (eq. 1, ``p -> p_I -> p``) to ``k``
    intermediate units (or the same parameter budget) with one of :data:`METHODS`.

    Returns two :class:`CompressedLinear` that replace ``linear1`` and ``linear2`` around
    the same activation. With ``W = [W_1^T, b_1, W_2]`` the sub-MLP embeddings:

    * ``"fusion"`` (eq. 5): k-means on ``W``; :math:`\\widetilde W_1 = W_1\\bar C^T`,
      :math:`\\tilde b_1 = \\bar C b_1`, :math:`\\widetilde W_2 = \\bar C W_2`, and
      :math:`P = CC^T` a fixed ``scale`` of the second layer. ``(k, p)`` and ``(p, k)``
      weights.
    * ``"clustering"`` (Section 5.3): the same centroids with :math:`P^{1/2}` folded
      into both sides, :math:`W_1\\bar C^TP^{1/2}`, :math:`P^{1/2}\\bar C b_1`,
      :math:`P^{1/2}\\bar C W_2`, no scale. Equal to fusion in the forward pass only
      for positively homogeneous activations (ReLU), different gradients always.
    * ``"sketch"``: Gaussian sketch :math:`S\\in\\mathbb R^{p_I\\times k}`, entries
      :math:`N(0, 1/k)`: :math:`\\sigma(XW_1S + 1b_1^TS)S^TW_2 + 1b_2^T`.
    * ``"mmd"`` (Appendix A.2, eqs. 9-10): ``k`` support points :math:`W^{(m)}` minimising
      the squared MMD to the empirical distribution of the rows of ``W``
      (:func:`mmd_support`: Gaussian kernel, Adam from ``k`` random rows until the
      stopping rule holds or ``mmd_steps`` steps); the second layer carries the factor
      :math:`p_I/k` of eq. 10 (expectations, not sums). ``b_2`` is not multiplied by it
      (it is one term, not a sum over sub-MLPs; eq. 10's bracket would scale it too, which
      breaks the identity at ``k = p_I`` for no reason).
    * ``"random"``: a uniformly random subset of ``k`` sub-MLPs (without replacement),
      second layer multiplied by :math:`p_I/k`: the unbiased Monte-Carlo estimate of the sum
      over sub-MLPs, and the simplest baseline.
    * ``"svd"``: truncated SVD in *compressed* form: each weight becomes a
      :class:`LowRankLinear` with balanced factors of its best rank-``r`` approximation
      (Eckart-Young), ``r =`` :func:`svd_rank_for_budget` (the parameter budget of a
      width-``k`` MLP) unless ``rank`` is given. Deterministic; exact when ``r`` reaches
      the weights' rank (``rank = min(p, p_I)``).
    * ``"pruning"``: unstructured magnitude pruning at the same budget: keeps the
      ``round(numel * k / p_I)`` largest-magnitude entries of each weight matrix
      (biases kept) through a fixed ``mask``. Deterministic.

    With ``k = p_I``, fusion, clustering, MMD, random and pruning reproduce the MLP exactly
    (up to a permutation of the intermediate units); the sketch is exact in expectation for
    a linear activation only, SVD as far as its rank allows.

    Args:
        linear1, linear2: ``nn.Linear(p, p_I)`` and ``nn.Linear(p_I, p)``.
        k: compressed intermediate width, ``1 <= k <= p_I``.
        method: one of :data:`METHODS`.
        generator: CPU ``torch.Generator`` for k-means, the sketch, the random subset and
            the MMD start (``None``: a fresh one seeded with 0).
        n_init, max_iter: k-means restarts and Lloyd iterations.
        mmd_steps, mmd_lr: MMD optimisation steps and relative step size.
        clustering: a precomputed :func:`kmeans` result on :func:`sub_mlp_embeddings`
            (shared between ``"fusion"`` and ``"clustering"`` to save time).
        support: a precomputed :func:`mmd_support` result on :func:`sub_mlp_embeddings`
            (``"mmd"``).
        rank: the rank of ``"svd"`` (``None``: the budget rank).

    Cost: k-means :math:`O(n_{init}\\,\\text{iter}\\,p_I k p)`; SVD :math:`O(p^2 p_I)`;
    MMD :math:`O(\\text{steps}\\,p_I k p)`. Chapter 6, sections "The fused MLP" and
    "The baselines".
    """
    linear1, linear2 = _check_pair(linear1, linear2)
    method = check_choice("method", method, METHODS)
    p, p_inner = linear1.in_features, linear1.out_features
    k = _check_k(k, p_inner)
    gen = _generator(generator)
    dtype, device = linear1.weight.dtype, linear1.weight.device
    # The new weights are computed on the CPU in float64 and cast back to the layers'
    # dtype and device at the end (k-means runs on the CPU, see kmeans).
    w1 = linear1.weight.detach().to("cpu", torch.float64)  # (p_I, p) = W1^T
    b1 = _bias_or_zeros(linear1).to("cpu", torch.float64)  # (p_I,)
    w2 = linear2.weight.detach().to("cpu", torch.float64)  # (p, p_I) = W2^T
    b2 = linear2.bias

    def build(n1: Tensor, nb1: Tensor, n2: Tensor, *, scale=None, mask1=None, mask2=None):
        cast = lambda t: None if t is None else t.to(dtype=dtype, device=device)
        l1 = CompressedLinear(cast(n1), cast(nb1) if linear1.bias is not None else None, mask=cast(mask1))
        l2 = CompressedLinear(cast(n2), b2, scale=cast(scale), mask=cast(mask2))
        return l1, l2

    if method in ("fusion", "clustering"):
        if clustering is None:
            clustering = kmeans(
                sub_mlp_embeddings(linear1, linear2), k, n_init=n_init, max_iter=max_iter, generator=gen
            )
        elif not isinstance(clustering, KMeansResult) or clustering.labels.shape[0] != p_inner:
            raise ValueError(f"clustering must be a KMeansResult over the p_I = {p_inner} sub-MLPs")
        elif clustering.centroids.shape[0] != k:
            raise ValueError(f"clustering has {clustering.centroids.shape[0]} clusters but k = {k}")
        c = clustering_matrix(clustering.labels, k)
        c_bar = averaging_matrix(c)
        counts = c.sum(1)  # diag(P)
        n1, nb1, n2 = c_bar @ w1, c_bar @ b1, w2 @ c_bar.T
        if method == "fusion":
            return build(n1, nb1, n2, scale=counts)
        root = counts.sqrt()
        return build(root[:, None] * n1, root * nb1, n2 * root[None, :])

    if method == "sketch":
        s = torch.randn(p_inner, k, generator=gen, dtype=torch.float64) / math.sqrt(k)
        return build(s.T @ w1, s.T @ b1, w2 @ s)
    if method == "mmd":
        if support is None:
            support = mmd_support(sub_mlp_embeddings(linear1, linear2), k, steps=mmd_steps, lr=mmd_lr, generator=gen)
        elif not isinstance(support, MMDSupport) or tuple(support.points.shape) != (k, 2 * p + 1):
            raise ValueError(f"support must be an MMDSupport with {k} points of dimension {2 * p + 1}")
        y = support.points.to(torch.float64)
        return build(y[:, :p], y[:, p], y[:, p + 1 :].T * (p_inner / k))
    if method == "random":
        keep = torch.randperm(p_inner, generator=gen)[:k]
        return build(w1[keep], b1[keep], w2[:, keep] * (p_inner / k))
    if method == "svd":
        if rank is None:
            r = svd_rank_for_budget(p, p_inner, k)
        else:
            r = check_positive_int("rank", rank)
            if r > min(p, p_inner):
                raise ValueError(f"rank must be at most min(p, p_I) = {min(p, p_inner)}, got {r}")
        cast = lambda t: t.to(dtype=dtype, device=device)
        u1, v1 = _low_rank_factors(w1, r)
        u2, v2 = _low_rank_factors(w2, r)
        nb1 = cast(b1) if linear1.bias is not None else None
        return LowRankLinear(cast(u1), cast(v1), nb1), LowRankLinear(cast(u2), cast(v2), b2)
    # pruning
    masks = []
    for w in (w1, w2):
        keep = round(w.numel() * k / p_inner)
        mask = torch.zeros(w.numel(), dtype=torch.float64)
        mask[torch.argsort(w.abs().flatten(), descending=True, stable=True)[:keep]] = 1.0
        masks.append(mask.reshape(w.shape))
    return build(w1, b1, w2, mask1=masks[0], mask2=masks[1])


def fuse_mlp(
    linear1: nn.Module,
    linear2: nn.Module,
    k: int,
    *,
    generator: Optional[torch.Generator] = None,
    n_init: int = 3,
    max_iter: int = 100,
    clustering: Optional[KMeansResult] = None,
) -> tuple[CompressedLinear, CompressedLinear]:
    """MLP fusion (eq. 5): :func:`compress_mlp` with ``method="fusion"``.

    Returns ``(fused1, fused2)``: ``fused1`` is ``nn.Linear``-like ``p -> k`` with
    :math:`\\widetilde W_1 = W_1\\bar C^T`, :math:`\\tilde b_1 = \\bar C b_1`; ``fused2``
    computes :math:`a P \\widetilde W_2 + b_2` with :math:`\\widetilde W_2 = \\bar C W_2`
    and the cluster sizes :math:`P = CC^T` as a fixed buffer ``fused2.scale``. Chapter 6,
    section "The fused MLP".
    """
    return compress_mlp(
        linear1, linear2, k, method="fusion", generator=generator, n_init=n_init, max_iter=max_iter,
        clustering=clustering,
    )


# --------------------------------------------------------------------------------------
# FFN blocks of models
# --------------------------------------------------------------------------------------


@dataclass
class FFNBlock:
    """Where one FFN sits in a model: ``linear1`` is ``getattr(owner1, name1)``,
    ``linear2`` is ``getattr(owner2, name2)``, with ``activation`` between them."""

    owner1: nn.Module
    name1: str
    owner2: nn.Module
    name2: str
    activation: Callable[[Tensor], Tensor]

    @property
    def linear1(self) -> nn.Module:
        return getattr(self.owner1, self.name1)

    @property
    def linear2(self) -> nn.Module:
        return getattr(self.owner2, self.name2)

    def forward(self, x: Tensor) -> Tensor:
        """The FFN alone: ``linear2(activation(linear1(x)))``."""
        return self.linear2(self.activation(self.linear1(x)))


def find_ffn_blocks(model: nn.Module) -> list[FFNBlock]:
    """The FFN blocks of ``model``, bottom to top (found by :func:`kernels.surgery.find_ffn_sites`).

    Supported structures: an ``nn.Sequential(Linear(p, p_I), activation, Linear(p_I, p))``
    (one block), and a BERT-style transformer (``transformers`` ``BertModel`` and
    relatives) whose ``encoder.layer[i]`` has ``intermediate.dense`` (``p -> p_I``),
    ``intermediate.intermediate_act_fn`` and ``output.dense`` (``p_I -> p``) in every
    layer; a model wrapping one under ``.bert`` or ``.model`` also works. Block ``i`` is
    layer ``i``; its linear layers may be the compressed ones of this module.

    Raises:
        TypeError: ``model`` is not an ``nn.Module``.
        ValueError: no FFN of the expected structure, naming what was looked for.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if isinstance(model, nn.Sequential) and len(model) != 3:
        raise ValueError(
            "model is an nn.Sequential but not Sequential(Linear(p, p_I), activation, "
            f"Linear(p_I, p)); got {[type(m).__name__ for m in model]}"
        )
    try:
        sites = find_ffn_sites(model)
    except ValueError as err:
        if isinstance(model, nn.Sequential):
            raise ValueError(
                "model is an nn.Sequential but not Sequential(Linear(p, p_I), activation, "
                f"Linear(p_I, p)); got {[type(m).__name__ for m in model]}"
            ) from err
        raise
    if not isinstance(model, nn.Sequential):
        layers = bert_layers(model)[1]
        if [s.index for s in sites] != list(range(len(layers))):
            raise ValueError(
                f"model ({type(model).__name__}) has no FFN of the expected structure in every layer: "
                "expected encoder.layer[i].intermediate.dense, .intermediate.intermediate_act_fn and "
                "encoder.layer[i].output.dense (an FFN replaced by kernels.ffn.replace_ffn is not a block)"
            )
    blocks = []
    for s in sites:
        (owner1, name1), (owner2, name2) = (
            _owner(model, path) for path in (s.parts[0], s.parts[2])
        )
        blocks.append(FFNBlock(owner1, name1, owner2, name2, s.ffn.activation))
    return blocks


def _owner(model: nn.Module, path: str) -> tuple[nn.Module, str]:
    parent, _, name = path.rpartition(".")
    return (model.get_submodule(parent) if parent else model), name


def compress_sequential(
    mlp: nn.Sequential,
    k: int,
    *,
    method: str = "fusion",
    generator: Optional[torch.Generator] = None,
    **kwargs,
) -> nn.Sequential:
    """A new ``Sequential(linear1', activation, linear2')``: ``mlp`` (an
    ``nn.Sequential(Linear(p, p_I), activation, Linear(p_I, p))``) compressed with
    :func:`compress_mlp` (``mlp`` itself is not modified)."""
    if not isinstance(mlp, nn.Sequential):
        raise TypeError(f"mlp must be an nn.Sequential(Linear(p, p_I), activation, Linear(p_I, p)), got "
                        f"{type(mlp).__name__}")
    try:
        (block,) = find_ffn_blocks(mlp)
    except ValueError as exc:
        raise ValueError(f"mlp: {exc}") from None
    l1, l2 = compress_mlp(block.linear1, block.linear2, k, method=method, generator=generator, **kwargs)
    return nn.Sequential(l1, copy.deepcopy(mlp[1]), l2)


def compress_model(
    model: nn.Module,
    k: int,
    *,
    layers: Optional[Sequence[int]] = None,
    method: str = "fusion",
    generator: Optional[torch.Generator] = None,
    inplace: bool = False,
    clusterings: Optional[dict[int, KMeansResult]] = None,
    **kwargs,
) -> nn.Module:
    """Compress the FFN blocks ``layers`` (indices into :func:`find_ffn_blocks`, negative
    allowed; ``None``: all) of ``model`` with :func:`compress_mlp`.

    Returns a deep copy (or ``model`` itself with ``inplace=True``) whose chosen FFNs use
    :class:`CompressedLinear` (or, for ``"svd"``, :class:`LowRankLinear`) layers; the rest
    is untouched. The layers draw from ``generator`` one after the other, bottom to top
    (``None``: a fresh generator seeded with 0), and use ``clusterings[l]`` when given. The paper compresses the last 8
    of RoBERTa's 12 layers. Chapter 6, section "Compressing MiniLM".
    """
    if not isinstance(inplace, bool):
        raise TypeError(f"inplace must be a bool, got {inplace!r}")
    target = model if inplace else copy.deepcopy(model)
    blocks = find_ffn_blocks(target)
    chosen = _check_layers(layers, len(blocks))
    gen = _generator(generator)
    for layer in chosen:
        block = blocks[layer]
        pre = None if clusterings is None else clusterings.get(layer)
        extra = dict(kwargs)
        if pre is not None:
            extra["clustering"] = pre
        l1, l2 = compress_mlp(block.linear1, block.linear2, k, method=method, generator=gen, **extra)
        setattr(block.owner1, block.name1, l1)
        setattr(block.owner2, block.name2, l2)
    return target


def _check_layers(layers: object, n: int) -> list[int]:
    """``layers``: ``None`` (all ``n`` FFN blocks) or a sequence of distinct block indices in
    ``[-n, n)``; returned as indices in ``[0, n)``."""
    if layers is None:
        return list(range(n))
    if isinstance(layers, (str, bytes)) or not isinstance(layers, Iterable):
        raise TypeError(f"layers must be a sequence of layer indices, got {layers!r}")
    chosen = []
    for layer in layers:
        if isinstance(layer, bool) or not hasattr(layer, "__index__"):
            raise TypeError(f"layers must hold integers, got {layer!r}")
        layer = int(layer)
        if not -n <= layer < n:
            raise ValueError(f"layers must lie in [{-n}, {n}) for a model with {n} FFN blocks, got {layer}")
        chosen.append(layer % n)
    if len(set(chosen)) != len(chosen):
        raise ValueError(f"layers must not repeat a layer, got {list(layers)}")
    return chosen


def mlp_parameter_count(model: nn.Module, layers: Optional[Sequence[int]] = None) -> int:
    """Parameters of the FFN blocks ``layers`` of ``model`` (``None``: all), counting only
    unmasked weight entries of pruned layers."""
    blocks = find_ffn_blocks(model)
    chosen = _check_layers(layers, len(blocks))
    total = 0
    for i in chosen:
        for lin in (blocks[i].linear1, blocks[i].linear2):
            if isinstance(lin, LowRankLinear):
                total += lin.u.numel() + lin.v.numel() + (0 if lin.bias is None else lin.bias.numel())
                continue
            mask = getattr(lin, "mask", None)
            total += int(mask.sum()) if mask is not None else lin.weight.numel()
            total += 0 if lin.bias is None else lin.bias.numel()
    return total


# --------------------------------------------------------------------------------------
# NTK measures
# --------------------------------------------------------------------------------------


def _linear_parts(lin: nn.Module) -> tuple[Optional[Tensor], Optional[Tensor]]:
    scale = getattr(lin, "scale", None)
    mask = getattr(lin, "mask", None)
    return scale, mask


def mlp_gradients(
    model: nn.Module,
    output_fn: Callable[[nn.Module], Tensor],
    *,
    layers: Optional[Sequence[int]] = None,
) -> Tensor:
    """Per-sample gradients :math:`\\nabla_\\theta f(x_s)` of a scalar-per-sample output
    with respect to the parameters of the FFN blocks ``layers`` (``None``: all):
    ``[W_1, b_1, W_2, b_2]`` of each block, flattened and concatenated (eq. 4).

    ``output_fn(model)`` runs the model on a batch of ``n`` samples and returns ``(n,)``;
    samples must not interact (padding masked). One forward and one backward pass: hooks
    record each FFN linear layer's input :math:`a` and output gradient :math:`g`, and
    since :math:`\\partial f(x_s)/\\partial W = \\sum_t g_{s,t}^T (a_{s,t}\\odot
    \\text{scale})` (times the mask of a pruned layer), every sample's gradient is one
    ``einsum``. Inputs may be ``(n, p)`` or ``(n, T, p)`` (tokens ``t``).

    Returns ``(n, P)`` in the model's dtype (zeros for masked weight entries). Cost one
    forward/backward pass plus :math:`O(nTP)`; memory :math:`O(nP)`. Chapter 6, section
    "Measuring the NTK".
    """
    if not callable(output_fn):
        raise TypeError("output_fn must be a callable taking the model and returning (n,) outputs")
    blocks = find_ffn_blocks(model)
    chosen = list(range(len(blocks))) if layers is None else [int(l) % len(blocks) for l in layers]
    linears = []
    for i in chosen:
        linears += [blocks[i].linear1, blocks[i].linear2]
    records: dict[int, dict[str, Tensor]] = {}
    handles = []

    def hook(idx):
        def fn(mod, inputs, output):
            records[idx] = {"a": inputs[0].detach(), "y": output}

        return fn

    for idx, lin in enumerate(linears):
        handles.append(lin.register_forward_hook(hook(idx)))
    try:
        with torch.enable_grad():
            out = output_fn(model)
            if not isinstance(out, Tensor) or out.ndim != 1:
                raise ValueError(
                    f"output_fn must return a 1-D tensor (one scalar per sample), got "
                    f"{getattr(out, 'shape', type(out).__name__)}"
                )
            ys = [records[i]["y"] for i in range(len(linears))]
            grads = torch.autograd.grad(out.sum(), ys, allow_unused=True)
    finally:
        for h in handles:
            h.remove()
    n = out.shape[0]
    parts = []
    for idx, lin in enumerate(linears):
        a = records[idx]["a"]
        g = grads[idx]
        if g is None:
            g = torch.zeros_like(records[idx]["y"])
        if a.ndim == 2:
            a, g = a[:, None, :], g[:, None, :]
        if isinstance(lin, LowRankLinear):
            # y = (a v^T) u^T + b: dy/du = g^T (a v^T), dy/dv = (g u)^T a
            if lin.u.requires_grad:
                parts.append(torch.einsum("nto,ntr->nor", g, a @ lin.v.detach().T).reshape(n, -1))
            if lin.v.requires_grad:
                parts.append(torch.einsum("ntr,nti->nri", g @ lin.u.detach(), a).reshape(n, -1))
            if lin.bias is not None and lin.bias.requires_grad:
                parts.append(g.sum(1))
            continue
        scale, mask = _linear_parts(lin)
        if scale is not None:
            a = a * scale
        if lin.weight.requires_grad:
            gw = torch.einsum("nto,nti->noi", g, a)
            if mask is not None:
                gw = gw * mask
            parts.append(gw.reshape(n, -1))
        if lin.bias is not None and lin.bias.requires_grad:
            parts.append(g.sum(1))
    if not parts:
        raise ValueError("the chosen FFN blocks have no trainable parameter")
    return torch.cat(parts, dim=1).detach()


def sgd_kernel(g1: Tensor, g2: Optional[Tensor] = None) -> Tensor:
    """SGD NTK (eq. 2) from per-sample gradients: :math:`K_{ij} = \\langle g_1[i],
    g_2[j]\\rangle`. ``g1``: ``(n1, P)``, ``g2``: ``(n2, P)`` (``None``: ``g1``). Returns
    ``(n1, n2)`` in float64. Cost :math:`O(n_1 n_2 P)`."""
    g1 = check_tensor("g1", g1, ndim=2).to(torch.float64)
    g2 = g1 if g2 is None else _check_grads_like(g1, g2).to(torch.float64)
    return g1 @ g2.T


def sign_kernel(g1: Tensor, g2: Optional[Tensor] = None) -> Tensor:
    """Asymmetric sign-GD ("Adam") kernel (eq. 3; Malladi et al. 2022):
    :math:`K_{ij} = \\langle g_1[i], \\operatorname{sign} g_2[j]\\rangle`. Shapes as
    :func:`sgd_kernel`; not symmetric in general."""
    g1 = check_tensor("g1", g1, ndim=2).to(torch.float64)
    g2 = g1 if g2 is None else _check_grads_like(g1, g2).to(torch.float64)
    return g1 @ torch.sign(g2).T


def _check_grads_like(g1: Tensor, g2: object) -> Tensor:
    g2 = check_tensor("g2", g2, ndim=2)
    if g2.shape[1] != g1.shape[1]:
        raise ValueError(f"g1 and g2 must have the same number of parameters, got {g1.shape[1]} and {g2.shape[1]}")
    return g2


def kernel_error(k_ref: Tensor, k_new: Tensor) -> float:
    """NTK approximation error :math:`\\|\\widetilde K - K\\|_F` (the paper's
    ":math:`l_2` difference of the NTK kernel", Table 1)."""
    k_ref = check_tensor("k_ref", k_ref, ndim=2)
    k_new = check_tensor("k_new", k_new, ndim=2)
    if k_ref.shape != k_new.shape:
        raise ValueError(f"k_ref and k_new must have the same shape, got {tuple(k_ref.shape)} and {tuple(k_new.shape)}")
    return float(torch.linalg.norm((k_new.to(torch.float64) - k_ref.to(torch.float64))))


def kernel_cosine(k_ref: Tensor, k_new: Tensor) -> float:
    """Cosine similarity of two kernel matrices, :math:`\\langle K, \\widetilde K\\rangle_F /
    (\\|K\\|_F\\|\\widetilde K\\|_F)` (kernel alignment, Cristianini et al. 2002): 1 when
    :math:`\\widetilde K` is a positive multiple of ``K``, blind to the kernel's overall scale,
    which :func:`kernel_error` is not. Chapter 6, section "Table 1 at our scale"."""
    k_ref = check_tensor("k_ref", k_ref, ndim=2).to(torch.float64)
    k_new = check_tensor("k_new", k_new, ndim=2).to(torch.float64)
    if k_ref.shape != k_new.shape:
        raise ValueError(f"k_ref and k_new must have the same shape, got {tuple(k_ref.shape)} and {tuple(k_new.shape)}")
    denom = float(torch.linalg.norm(k_ref) * torch.linalg.norm(k_new))
    if denom == 0.0:
        raise ValueError("k_ref and k_new must be nonzero")
    return float((k_ref * k_new).sum()) / denom


def scaled_kernel_error(k_ref: Tensor, k_new: Tensor) -> float:
    """Relative error after the best scalar rescale, :math:`\\min_c \\|c\\widetilde K -
    K\\|_F / \\|K\\|_F = \\sqrt{1 - \\cos^2}` with :math:`\\cos` = :func:`kernel_cosine`
    (the optimal :math:`c = \\langle K, \\widetilde K\\rangle_F / \\|\\widetilde K\\|_F^2`):
    the part of the kernel error that a change of learning rate cannot undo."""
    cos = kernel_cosine(k_ref, k_new)
    return math.sqrt(max(0.0, 1.0 - cos * cos))


def ffn_output_error(
    ffn_ref: Callable[[Tensor], Tensor],
    ffn_new: Callable[[Tensor], Tensor],
    x: Tensor,
    mask: Optional[Tensor] = None,
) -> float:
    """Output error of a compressed FFN on the same inputs: the mean over samples of
    :math:`\\|\\widetilde H - H\\|_F` over the sample's real tokens (Table 1, "Output").

    ``x``: ``(n, T, p)`` FFN inputs (or ``(n, p)``); ``mask``: ``(n, T)`` 1 for real
    tokens (``None``: all). Returns a float.
    """
    check_callable("ffn_ref", ffn_ref)
    check_callable("ffn_new", ffn_new)
    x = check_tensor("x", x, ndim=(2, 3))
    if x.ndim == 2:
        x = x[:, None, :]
    if mask is None:
        mask = torch.ones(x.shape[:2], dtype=x.dtype, device=x.device)
    else:
        check_tensor("mask", mask, floating=False)
        if tuple(mask.shape) != tuple(x.shape[:2]):
            raise ValueError(f"mask must have shape {tuple(x.shape[:2])}, got {tuple(mask.shape)}")
        if mask.device != x.device:
            raise ValueError(f"mask must be on x's device {x.device}, got {mask.device}")
    outs = []
    with torch.no_grad():
        for name, ffn in (("ffn_new", ffn_new), ("ffn_ref", ffn_ref)):
            try:
                out = ffn(x)
            except torch.OutOfMemoryError:
                raise
            except (TypeError, ValueError, RuntimeError, IndexError) as exc:
                raise ValueError(f"{name} cannot take x of shape {tuple(x.shape)} and dtype {x.dtype} "
                                 f"({type(exc).__name__}: {exc})") from exc
            if not isinstance(out, Tensor) or out.ndim != 3 or tuple(out.shape[:2]) != tuple(x.shape[:2]):
                raise ValueError(f"{name} must map x (n, T, p) to (n, T, p'), got "
                                 f"{tuple(getattr(out, 'shape', ())) or type(out).__name__}")
            outs.append(out)
        new, ref = outs
        if new.shape != ref.shape:
            raise ValueError(f"ffn_new and ffn_ref must give outputs of one shape, got {tuple(new.shape)} "
                             f"and {tuple(ref.shape)}")
        diff = (new - ref).to(torch.float64) * mask[..., None].to(torch.float64)
        return float(diff.pow(2).sum(dim=(1, 2)).sqrt().mean())


# --------------------------------------------------------------------------------------
# Layer-wise task-specific tuning (eq. 6)
# --------------------------------------------------------------------------------------


def _hidden_states(name: str, model: nn.Module, batch: dict) -> tuple:
    """The layer outputs ``model(**batch, output_hidden_states=True).hidden_states[1:]``,
    or a ``ValueError`` naming ``name`` when the model cannot give them."""
    try:
        out = model(**batch, output_hidden_states=True)
    except torch.OutOfMemoryError:
        raise
    except (TypeError, ValueError, RuntimeError, IndexError) as exc:
        raise ValueError(f"{name}(**batch, output_hidden_states=True) failed ({type(exc).__name__}: {exc}); "
                         f"{name} must be a transformers-style model taking the batches' keys") from exc
    states = getattr(out, "hidden_states", None)
    if not isinstance(states, (tuple, list)) or not all(isinstance(h, Tensor) for h in states):
        raise ValueError(f"{name} must return an output with .hidden_states (a tuple of tensors) when called "
                         f"with output_hidden_states=True, got {type(out).__name__}")
    return tuple(states[1:])


def layerwise_tuning(
    student: nn.Module,
    teacher: nn.Module,
    batches: Iterable[dict[str, Tensor]],
    *,
    lr: float = 1e-4,
    layers: Optional[Sequence[int]] = None,
) -> list[float]:
    """Layer-wise task-specific tuning (Section 4.4, eq. 6): minimise
    :math:`\\sum_l \\mathrm{MSE}(H_t^l, H^l)` between the teacher's and the student's
    layer outputs on unlabelled task inputs, updating only the student's FFN blocks
    ``layers`` (``None``: all blocks that hold a :class:`CompressedLinear`).

    ``batches`` yields keyword arguments of a ``transformers`` model (``input_ids``,
    ``attention_mask``...); both models are called with ``output_hidden_states=True``.
    One AdamW step per batch (the paper: one epoch). Returns the loss of every step.
    ``lr = 0`` measures the losses without moving any weight (chapter 6 checks its cached
    eq. 6 loss against this function that way). Padding tokens are excluded from the MSE when ``attention_mask`` is given.
    """
    check_module("student", student)
    check_module("teacher", teacher)
    lr = check_nonnegative_float("lr", lr)
    if isinstance(batches, (str, bytes, Tensor, dict)) or not isinstance(batches, Iterable):
        raise TypeError(f"batches must be an iterable of dicts of model inputs, got {type(batches).__name__}")
    try:
        blocks = find_ffn_blocks(student)
    except ValueError as exc:
        raise ValueError(f"student: {exc}") from None
    if layers is None:
        chosen = [i for i, b in enumerate(blocks) if isinstance(b.linear1, (CompressedLinear, LowRankLinear))]
    else:
        chosen = _check_layers(layers, len(blocks))
    if not chosen:
        raise ValueError("student has no compressed FFN block to tune")
    params = []
    for i in chosen:
        params += [p for p in (*blocks[i].linear1.parameters(), *blocks[i].linear2.parameters())]
    frozen = {id(p) for p in params}
    saved = {n: p.requires_grad for n, p in student.named_parameters()}
    for p in student.parameters():
        p.requires_grad_(id(p) in frozen)
    opt = torch.optim.AdamW(params, lr=lr)
    losses = []
    try:
        for batch in batches:
            if not isinstance(batch, dict) or not all(isinstance(k, str) for k in batch):
                raise TypeError(f"batches must yield dicts of keyword arguments, got {type(batch).__name__}")
            with torch.no_grad():
                target = _hidden_states("teacher", teacher, batch)
            got = _hidden_states("student", student, batch)
            if [tuple(h.shape) for h in got] != [tuple(h.shape) for h in target]:
                raise ValueError("student and teacher must give hidden states of the same shapes, got "
                                 f"{[tuple(h.shape) for h in got]} and {[tuple(h.shape) for h in target]}")
            m = batch.get("attention_mask")
            w = None if m is None else m[..., None].to(got[0].dtype)
            loss = 0.0
            for h_t, h_s in zip(target, got):
                if w is None:
                    loss = loss + F.mse_loss(h_s, h_t)
                else:
                    loss = loss + ((h_s - h_t) ** 2 * w).sum() / (w.sum() * h_s.shape[-1])
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    finally:
        for n, p in student.named_parameters():
            p.requires_grad_(saved[n])
    return losses
