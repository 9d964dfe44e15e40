"""The sub-MLP view of a two-layer MLP and the k-means clustering of its sub-MLPs.

Part of :mod:`kernels.fusion` (chapter 6, ``chapters/06_mlp_fusion.ipynb``; Wei, Guo, Chen
and He, 2023). A two-layer MLP :math:`H = \\sigma(XW_1 + 1b_1^T)W_2 + 1b_2^T` (eq. 1) is a sum
of :math:`p_I` bottleneck-1 MLPs, each described by the embedding
:math:`w_i = [W_{1,\\cdot,i}; b_{1,i}; W_{2,i,\\cdot}]` (:func:`sub_mlp_embeddings`). Here:

* deterministic k-means (k-means++ seeding, several restarts, Lloyd iterations) on those
  embeddings (:func:`kmeans`, :class:`KMeansResult`);
* the matrices built from its labels: the one-hot clustering matrix :math:`C`, the
  averaging matrix :math:`\\bar C` and the diagonal scaling :math:`P = CC^T`
  (:func:`clustering_matrix`, :func:`averaging_matrix`, :func:`scaling_matrix`).

Conventions: weights follow ``torch.nn.Linear`` (``weight`` is ``(out, in)``), so the
paper's :math:`W_1 \\in \\mathbb R^{p\\times p_I}` is ``linear1.weight.T``. Randomness comes
from an explicit ``generator`` (``None``: a fresh CPU generator seeded with 0).
"""

from __future__ import annotations

import math
from typing import NamedTuple, Optional

import torch
from torch import Tensor, nn

from kernels._checks import (
    check_choice,
    check_index_tensor,
    check_positive_int,
    check_tensor,
    cpu_generator,
)
from kernels.linear import CompressedLinear


__all__ = [
    "KMeansResult",
    "sub_mlp_embeddings",
    "kmeans",
    "clustering_matrix",
    "averaging_matrix",
    "scaling_matrix",
]

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



_generator = cpu_generator  # kernels._checks: explicit CPU generator, None -> seed 0
