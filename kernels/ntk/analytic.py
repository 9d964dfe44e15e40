"""The infinite-width NNGP and NTK of :func:`kernels.ntk.fc_network` (:func:`fc_kernel`):
the layer recursion :math:`\\Theta^{(l+1)} = \\Theta^{(l)}\\dot\\Sigma^{(l+1)} + \\Sigma^{(l+1)}`
(Jacot et al. 2018; Arora et al. 2019) with the closed-form ReLU (arc-cosine, Cho & Saul
2009) and erf (Williams 1997) expectations.

Part of :mod:`kernels.ntk`, chapter 1 (``chapters/01_ntk.ipynb``), section "The
infinite-width kernel"; slides "NTK: formulas".
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, NamedTuple, Optional

import torch
from torch import Tensor

from kernels._checks import (
    check_choice,
    check_nonnegative_float,
    check_positive_float,
    check_positive_int,
    check_same_feature_dim,
    check_tensor,
)
from kernels.ntk.network import ACTIVATIONS

__all__ = [
    "NTKResult",
    "fc_kernel",
]


# --------------------------------------------------------------------------------------
# Infinite-width kernels
# --------------------------------------------------------------------------------------


class NTKResult(NamedTuple):
    """Infinite-width kernels of a network: NNGP :math:`\\Sigma` and NTK :math:`\\Theta`,
    each ``(n1, n2)``."""

    nngp: Tensor
    ntk: Tensor



_TINY = torch.finfo(torch.float64).tiny



#: Entries per row block in :func:`fc_kernel` on the CPU: just below ATen's intra-op
#: grain size (32768), so that every op on a block runs inline on its calling thread.
_BLOCK_ELEMENTS = 32_000



def _safe_sqrt(x: Tensor) -> Tensor:
    """``sqrt(max(x, 0))`` whose derivative is 0 (not infinite) where ``x <= 0``."""
    positive = x > 0
    return torch.where(positive, torch.sqrt(torch.where(positive, x, torch.ones_like(x))), torch.zeros_like(x))


def _two_product(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """``(p, e)`` with ``p = fl(a * b)`` and ``p + e = a * b`` exactly (Dekker's product
    with Veltkamp's splitting; torch has no fused multiply-add). ``e`` carries no
    gradient (its derivative is 0 up to rounding)."""
    a, b = a.detach(), b.detach()
    p = a * b
    ta, tb = a * 134217729.0, b * 134217729.0  # 2^27 + 1
    ah, bh = ta - (ta - a), tb - (tb - b)
    al, bl = a - ah, b - bh
    e = ((ah * bh - p) + ah * bl + al * bh) + al * bl
    return p, torch.where(torch.isfinite(e), e, torch.zeros_like(e))


def _sin_minus_x_cos(psi: Tensor) -> Tensor:
    """:math:`\\sin\\psi - \\psi\\cos\\psi` without cancellation for small
    :math:`\\psi` (its series :math:`\\sum_{k\\ge1} (-1)^{k+1} 2k\\,\\psi^{2k+1}/(2k+1)!`
    below 0.5, eight terms, error below 1e-18 relative)."""
    small = psi < 0.5
    ps = torch.where(small, psi, torch.zeros_like(psi))
    sq = ps * ps
    series = torch.zeros_like(ps)
    for k in range(8, 0, -1):  # Horner in psi^2
        series = series * sq + ((-1) ** (k + 1)) * 2 * k / math.factorial(2 * k + 1)
    series = series * sq * ps
    return torch.where(small, series, torch.sin(psi) - psi * torch.cos(psi))


def _relu_step(cov: Tensor, ntk: Tensor, v1: Tensor, v2: Tensor, w_var: float, b_var: float,
               careful: bool = False):
    """One ReLU + Dense step: ``(Sigma, Theta)`` of the next layer from those of this one,
    with ``v1``, ``v2`` the variances Sigma(x, x), Sigma(x', x') broadcast against ``cov``.

    Arc-cosine kernels (Cho & Saul 2009) for :math:`(u, u') \\sim \\mathcal N(0,
    [[v_1, c], [c, v_2]])`: :math:`E[\\sigma(u)\\sigma(u')] = \\frac{1}{2\\pi}
    (\\sqrt{v_1 v_2 - c^2} + (\\pi - \\varphi) c)` and :math:`E[\\sigma'(u)\\sigma'(u')]
    = \\frac{\\pi - \\varphi}{2\\pi}`. The angle is computed stably as
    :math:`\\varphi = \\mathrm{atan2}(\\sqrt{\\max(v_1 v_2 - c^2, 0)}, c)` (not
    :math:`\\arccos(c/\\sqrt{v_1 v_2})`, which is about 1.5e-8 instead of 0 at
    collinear inputs), with :math:`v_1 v_2 - c^2` from exact products
    (:func:`_two_product`), so that it is exactly 0 where ``c == v1 == v2`` (the
    diagonal) and exactly pi at opposite inputs. For an obtuse angle the expectation is
    :math:`\\frac{\\sqrt{v_1 v_2}}{2\\pi}(\\sin\\psi - \\psi\\cos\\psi)` with
    :math:`\\psi = \\pi - \\varphi` (:func:`_sin_minus_x_cos`, no cancellation near
    opposite inputs). The square roots have derivative 0 where their argument is 0
    (:func:`_safe_sqrt`), so the kernel is differentiable, with the right gradient, on
    the diagonal. Out of place, so autograd and ``torch.func`` can differentiate it
    (``careful=True``: the exact products and the series everywhere, no data-dependent
    branch; otherwise only for blocks that need them). A zero-variance input (x = 0, b_std = 0) has c = 0, so Sigma = Theta = 0 whatever the
    angle.
    """
    prod = v1 * v2
    det = prod - cov * cov
    if not careful:
        # The plain formula, right to a few ulps unless the angle is near pi (psi < 0.5,
        # where sin(psi) - psi cos(psi) cancels) and v1 v2 - c^2 cancels too: only
        # blocks holding such an entry take the careful path below.
        careful = bool(((det < 0.25 * prod) & (cov < 0)).any())
        if not careful:  # in place where possible: nothing is differentiated here
            root = det.clamp_min_(0.0).sqrt_()
            frac = torch.atan2(root, cov).mul_(-1.0 / math.pi).add_(1.0)
            new_cov = (frac * cov).add_(root, alpha=1.0 / math.pi).mul_(w_var / 2.0).add_(b_var)
            return new_cov, ntk.mul_(frac).mul_(w_var / 2.0).add_(new_cov)
    if careful:
        p1, e1 = _two_product(v1, v2)
        p2, e2 = _two_product(cov, cov)
        exact = (p1 - p2) + (e1 - e2)  # v1 v2 - c^2 to a few ulps of itself
        det = det + (exact - det).detach()
    root = _safe_sqrt(det)
    phi = torch.atan2(root, cov)
    frac = 1.0 - phi / math.pi  # (pi - phi) / pi: exactly 1 at phi = 0
    plain = frac * cov + root / math.pi
    half_w = w_var / 2.0
    if careful:
        # psi = pi - phi computed directly: exact near opposite inputs.
        psi = torch.atan2(root, -cov)
        obtuse = cov < 0
        frac = torch.where(obtuse, psi / math.pi, frac)
        near = _safe_sqrt(prod) * _sin_minus_x_cos(psi) / math.pi
        plain = torch.where(obtuse & (psi < 0.5), near, plain)
    new_cov = plain * half_w + b_var
    new_ntk = ntk * (frac * half_w) + new_cov
    return new_cov, new_ntk


def _erf_step(cov: Tensor, ntk: Tensor, v1: Tensor, v2: Tensor, w_var: float, b_var: float,
              careful: bool = False):
    """One Erf + Dense step, arguments as in :func:`_relu_step` (in place on ``ntk``
    unless ``careful``, which the differentiable path sets).

    Williams (1997): with :math:`\\rho = 2c/\\sqrt{(1+2v_1)(1+2v_2)}`,
    :math:`E[\\mathrm{erf}(u)\\mathrm{erf}(u')] = \\frac{2}{\\pi}\\arcsin\\rho` and
    :math:`E[\\mathrm{erf}'(u)\\mathrm{erf}'(u')] = \\frac{4}{\\pi}\\big((1+2v_1)(1+2v_2)
    - 4c^2\\big)^{-1/2} = \\frac{4}{\\pi}\\frac{1}{\\sqrt{(1+2v_1)(1+2v_2)}
    \\sqrt{1-\\rho^2}}`.
    """
    r1 = torch.rsqrt(1.0 + 2.0 * v1)
    r2 = torch.rsqrt(1.0 + 2.0 * v2)
    if not careful:  # in place: nothing is differentiated here (cov is not modified)
        rho = (cov * 2.0).mul_(r1).mul_(r2).clamp_(-1.0, 1.0)
        one = torch.ones((), dtype=rho.dtype, device=rho.device)
        inv_root = torch.addcmul(one, rho, rho, value=-1.0).clamp_min_(_TINY).rsqrt_()
        ntk = ntk.mul_(inv_root).mul_(r1 * (w_var * 4.0 / math.pi)).mul_(r2)
        new_cov = rho.arcsin_().mul_(w_var * 2.0 / math.pi).add_(b_var)
        return new_cov, ntk.add_(new_cov)
    rho = (2.0 * cov * r1 * r2).clamp(-1.0, 1.0)
    inv_root = (1.0 - rho * rho).clamp_min(_TINY).rsqrt()
    new_cov = torch.arcsin(rho) * (w_var * 2.0 / math.pi) + b_var
    new_ntk = ntk * inv_root * (w_var * 4.0 / math.pi) * r1 * r2 + new_cov
    return new_cov, new_ntk


def _needs_graph(*xs: Optional[Tensor]) -> bool:
    """Whether an input is being differentiated (autograd, forward AD or torch.func), so
    that :func:`fc_kernel` must build its result out of place in one piece."""
    from torch.autograd import forward_ad
    from torch._C._functorch import is_functorch_wrapped_tensor

    for x in xs:
        if x is None:
            continue
        if (torch.is_grad_enabled() and x.requires_grad) or is_functorch_wrapped_tensor(x):
            return True
        if forward_ad.unpack_dual(x).tangent is not None:
            return True
    return False


def _map_row_blocks(fn: Callable[[int, int], None], n_rows: int, n_cols: int, device) -> None:
    """Call ``fn(r0, r1)`` on row blocks covering ``range(n_rows)``.

    On the CPU the blocks are small enough to stay in cache through every layer of the
    recursion (about 15 elementwise ops each) and are shared among
    ``torch.get_num_threads()`` Python threads (torch releases the GIL inside ops).
    Why: one full-matrix pass per op is memory bound, and OpenMP's barrier after each
    op degrades badly when other processes compete for the cores. On a GPU the whole
    matrix is one block.
    """
    if device.type != "cpu":
        fn(0, n_rows)
        return
    rows = max(1, _BLOCK_ELEMENTS // max(n_cols, 1))
    starts = list(range(0, n_rows, rows))
    threads = min(torch.get_num_threads(), len(starts))
    if threads <= 1:
        for r0 in starts:
            fn(r0, min(r0 + rows, n_rows))
        return
    with ThreadPoolExecutor(max_workers=threads) as pool:
        list(pool.map(lambda r0: fn(r0, min(r0 + rows, n_rows)), starts))



def fc_kernel(
    x1: Tensor,
    x2: Optional[Tensor] = None,
    *,
    depth: int,
    activation: str = "relu",
    W_std: float = 1.0,
    b_std: float = 0.0,
) -> NTKResult:
    """Infinite-width NNGP and NTK of :func:`fc_network` in the NTK parametrization.

    The layer recursion (Jacot et al. 2018, Thm. 1; Arora et al. 2019, eqs. 7-9;
    slides, "NTK: formulas"), with :math:`\\sigma_W` = ``W_std``, :math:`\\sigma_b` =
    ``b_std`` and :math:`d` the input dimension:

    .. math::
        \\Sigma^{(1)}(x,x') &= \\sigma_W^2\\, x^\\top x'/d + \\sigma_b^2,
        \\qquad \\Theta^{(1)} = \\Sigma^{(1)},\\\\
        \\Sigma^{(l+1)} &= \\sigma_W^2\\, E_{u\\sim\\mathcal N(0,\\Sigma^{(l)})}
        [\\sigma(u(x))\\sigma(u(x'))] + \\sigma_b^2,\\\\
        \\dot\\Sigma^{(l+1)} &= \\sigma_W^2\\, E[\\sigma'(u(x))\\sigma'(u(x'))],\\\\
        \\Theta^{(l+1)} &= \\Theta^{(l)}\\,\\dot\\Sigma^{(l+1)} + \\Sigma^{(l+1)},

    applied ``depth`` times; the result is :math:`(\\Sigma^{(depth+1)},
    \\Theta^{(depth+1)})`, the kernels of the scalar output. The Gaussian expectations
    are closed forms: the arc-cosine kernel for ReLU (Cho & Saul 2009) and Williams'
    (1997) arcsine kernel for erf. Equal to neural-tangents' ``stax`` ``kernel_fn`` of
    ``serial(*[Dense(w, W_std, b_std), Relu()] * depth, Dense(1, W_std, b_std))``.
    Derived in chapter 1 (chapters/01_ntk.ipynb), section "The infinite-width limit".

    Shapes: ``x1`` ``(n1, d)``, ``x2`` ``(n2, d)`` (``None``: ``x2 = x1``), each output
    ``(n1, n2)``. Computed in float64 and returned in ``x1``'s dtype; cost
    :math:`O(n_1 n_2 (d + \\text{depth}))` time, :math:`O(n_1 n_2)` memory.

    Exact and differentiable: the ReLU angle is
    :math:`\\mathrm{atan2}(\\sqrt{\\max(v_1 v_2 - c^2, 0)}, c)` (see :func:`_relu_step`), 0
    exactly on the diagonal and at identical or collinear rows (within the rounding
    noise of the first layer's dot products), so that e.g. depth 5 at ``[[1., 1.]]``
    gives 0.1875 exactly; it agrees with a 50-digit recursion to 1e-12 relative
    (tests/ntk/test_analytic_exact.py). ``x1`` and ``x2`` may require grad, or be traced by
    ``torch.func`` (``jacfwd``, ``jacrev``, ``vmap``) or forward AD: the result is then
    built in one block without in-place writes and is differentiable with respect to
    the inputs, with finite derivatives on the diagonal (those of :math:`k(x, x)`).

    Implementation: the entry :math:`(x, x')` of every layer needs only its own
    previous value and the diagonal variances :math:`\\Sigma^{(l)}(x, x)`,
    :math:`\\Sigma^{(l)}(x', x')`, which are computed first. The matrices are then
    built in row blocks that stay in cache through all layers, shared among torch's
    threads (for ``x2=None`` only the blocks on and above the diagonal, mirrored
    afterwards); on a GPU as one block.

    Args:
        x1, x2: float32 or float64 tensors (the dtype of the result is ``x1``'s).
        depth: number of hidden layers (positive int).
        activation: ``"relu"`` or ``"erf"``.
        W_std: weight scale :math:`\\sigma_W > 0`.
        b_std: bias scale :math:`\\sigma_b \\ge 0`.
    """
    x1 = _check_float32_or_64("x1", check_tensor("x1", x1, ndim=2))
    if x1.shape[1] == 0:
        raise ValueError(f"x1 must have at least one feature (column), got shape {tuple(x1.shape)}")
    if x2 is not None:
        x2 = _check_float32_or_64("x2", check_tensor("x2", x2, ndim=2))
        check_same_feature_dim("x1", x1, "x2", x2)
        if x2.device != x1.device:
            raise ValueError(f"x2 is on {x2.device} but x1 is on {x1.device}")
    depth = check_positive_int("depth", depth)
    activation = check_choice("activation", activation, ACTIVATIONS)
    w_var = check_positive_float("W_std", W_std) ** 2
    b_var = check_nonnegative_float("b_std", b_std) ** 2

    a = x1.to(torch.float64)
    b = a if x2 is None else x2.to(torch.float64)
    d = a.shape[1]
    step = _relu_step if activation == "relu" else _erf_step
    # The diagonal variances Sigma^(l)(x, x) of every layer first (vectors, cheap), so
    # that each block of the matrices can then run through all layers on its own. They
    # go through the same elementwise step as the blocks, so that the diagonal of a
    # block (x2 = None) equals them bit for bit and its angle is exactly 0.
    var1 = (a * a).sum(1) * (w_var / d) + b_var
    var2 = var1 if x2 is None else (b * b).sum(1) * (w_var / d) + b_var
    vars1, vars2 = [], []
    for _ in range(depth):
        vars1.append(var1)
        vars2.append(var2)
        graph = _needs_graph(x1, x2)
        var1 = step(var1, torch.zeros_like(var1), var1, var1, w_var, b_var, graph)[0]
        var2 = var1 if x2 is None else step(var2, torch.zeros_like(var2), var2, var2, w_var,
                                           b_var, graph)[0]

    def layer_one(r0: int, r1: int, c0: int, graph: bool) -> Tensor:
        cov = (a[r0:r1] @ b[c0:].T) * (w_var / d) + b_var  # Sigma^(1)
        # A dot product of d terms is known only to about d ulps, so v1 v2 - c^2 of
        # (nearly) collinear inputs is rounding noise, whose square root would be an
        # angle of ~1e-8 instead of 0: within that noise, c is set to +-sqrt(v1 v2)
        # (exactly v at identical inputs, so that every later layer keeps phi = 0).
        prod = vars1[0][r0:r1, None] * vars2[0][None, c0:]
        collinear = (prod - cov * cov) <= (2.0 * (d + 2) * torch.finfo(torch.float64).eps) * prod
        if graph or bool(collinear.any()):
            cov = torch.where(collinear, torch.sign(cov) * _safe_sqrt(prod), cov)
        if x2 is None:  # the diagonal exactly Sigma^(1)(x, x), as in vars1[0]
            if not graph:  # the block starts on the diagonal (c0 = r0)
                cov.diagonal().copy_(vars1[0][r0:r1])
                return cov
            rows = torch.arange(r0, r1, device=a.device)[:, None]
            cols = torch.arange(c0, b.shape[0], device=a.device)[None, :]
            cov = torch.where(rows == cols, vars1[0][r0:r1, None], cov)
        return cov

    def recursion(r0: int, r1: int, c0: int, careful: bool = False) -> tuple[Tensor, Tensor]:
        cov = layer_one(r0, r1, c0, careful)
        ntk_block = cov  # Theta^(1)
        for v1, v2 in zip(vars1, vars2):
            cov, ntk_block = step(cov, ntk_block, v1[r0:r1, None], v2[None, c0:], w_var, b_var,
                                  careful)
        return cov, ntk_block

    n1, n2 = a.shape[0], b.shape[0]
    if _needs_graph(x1, x2):  # differentiable: one block, no in-place writes
        cov, ntk_full = recursion(0, n1, 0, careful=True)
        return NTKResult(nngp=cov.to(x1.dtype), ntk=ntk_full.to(x1.dtype))
    nngp = torch.empty(n1, n2, dtype=x1.dtype, device=x1.device)
    ntk = torch.empty(n1, n2, dtype=x1.dtype, device=x1.device)
    # x2 = None on the CPU: only the blocks on and above the diagonal run through the
    # recursion (half the work); the rest is mirrored afterwards.
    symmetric = x2 is None and x1.device.type == "cpu"

    def run_block(r0: int, r1: int) -> None:
        c0 = r0 if symmetric else 0
        cov_block, ntk_block = recursion(r0, r1, c0)
        nngp[r0:r1, c0:].copy_(cov_block)  # casts to x1's dtype while in cache
        ntk[r0:r1, c0:].copy_(ntk_block)

    def mirror_block(r0: int, r1: int) -> None:
        nngp[r0:r1, :r0].copy_(nngp[:r0, r0:r1].T)
        ntk[r0:r1, :r0].copy_(ntk[:r0, r0:r1].T)

    _map_row_blocks(run_block, n1, n2, x1.device)
    if symmetric:
        _map_row_blocks(mirror_block, n1, n2, x1.device)
    return NTKResult(nngp=nngp, ntk=ntk)



def _check_float32_or_64(name: str, x: Tensor) -> Tensor:
    if x.dtype not in (torch.float32, torch.float64):
        raise TypeError(f"{name} must be float32 or float64, got {x.dtype}")
    return x

