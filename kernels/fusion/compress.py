"""Compression of one two-layer MLP: MLP fusion (eq. 5) and the baselines it is compared with.

Part of :mod:`kernels.fusion` (chapter 6, ``chapters/06_mlp_fusion.ipynb``; Wei, Guo, Chen
and He, 2023). Here:

* the fused MLP of eq. 5, :math:`\\widetilde H_C = \\sigma(X\\widetilde W_1 + 1\\tilde
  b_1^T) P \\widetilde W_2 + 1b_2^T` with :math:`\\widetilde W_1 = W_1\\bar C^T`,
  :math:`\\tilde b_1 = \\bar C b_1`, :math:`\\widetilde W_2 = \\bar C W_2` and ``P`` a fixed,
  non-trainable scaling between the activation and :math:`\\widetilde W_2`
  (:func:`fuse_mlp`, :class:`CompressedLinear`), from the clustering of
  :mod:`kernels.fusion.clustering`;
* the baselines of Section 5.3 behind one interface (:func:`compress_mlp`, ``method=``,
  :data:`METHODS`): plain clustering (:math:`P^{1/2}` folded into both sides), truncated
  SVD in factored low-rank form (:class:`LowRankLinear`, :func:`svd_rank_for_budget`),
  Gaussian sketching, unstructured magnitude pruning at the same parameter budget, MMD
  minimisation (Appendix A.2, eqs. 8-10, :func:`mmd2`, :func:`mmd_support`) and a
  uniformly random subset of the sub-MLPs with rescaled output weights.

The layers :class:`CompressedLinear` and :class:`LowRankLinear` live in :mod:`kernels.linear`
(below the FFN surgery of :mod:`kernels.surgery`, which recognises them) and are re-exported here.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Optional

import torch
from torch import Tensor, nn

from kernels._checks import (
    check_choice,
    check_positive_int,
    check_same_dtype,
    check_tensor,
    cpu_generator,
)
from kernels.linear import CompressedLinear, LowRankLinear
from kernels.fusion.clustering import (
    KMeansResult,
    _bias_or_zeros,
    _check_pair,
    _generator,
    averaging_matrix,
    clustering_matrix,
    kmeans,
    sub_mlp_embeddings,
)

__all__ = [
    "METHODS",
    "CompressedLinear",
    "LowRankLinear",
    "fuse_mlp",
    "compress_mlp",
    "svd_rank_for_budget",
    "mmd2",
    "MMDSupport",
    "mmd_support",
]

#: of its Section 5.3, and a uniformly random subset of the sub-MLPs ("random").
METHODS = ("fusion", "clustering", "svd", "sketch", "pruning", "mmd", "random")


def _as_compressed(linear: nn.Module) -> CompressedLinear:
    if isinstance(linear, CompressedLinear):
        return linear
    return CompressedLinear(linear.weight, linear.bias)




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
