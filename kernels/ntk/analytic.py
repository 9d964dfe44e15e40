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



def _relu_factors(var: Tensor, w_var: float) -> dict[str, Tensor]:
    """Per-input factors of a ReLU step, from the input variances ``var`` (n,)."""
    std = var.sqrt()
    # A zero-variance input (x = 0, b_std = 0) gets cos = 0 instead of 0/0.
    inv = torch.where(std > 0, 1.0 / std.clamp_min(_TINY), torch.zeros_like(std))
    return {"inv": inv, "std": std, "scaled_std": std * (w_var / (2.0 * math.pi))}



def _relu_step(
    cov: Tensor, ntk: Tensor, row: dict[str, Tensor], col: dict[str, Tensor], w_var: float,
    b_var: float,
) -> None:
    """One ReLU + Dense step on a block, in place: ``cov`` <- Sigma, ``ntk`` <- Theta.

    Arc-cosine kernels (Cho & Saul 2009) for :math:`(u, u') \\sim \\mathcal N(0,
    [[v_1, c], [c, v_2]])` with :math:`\\cos\\varphi = c/\\sqrt{v_1 v_2}`:
    :math:`E[\\sigma(u)\\sigma(u')] = \\frac{\\sqrt{v_1 v_2}}{2\\pi}(\\sin\\varphi +
    (\\pi - \\varphi)\\cos\\varphi)` and :math:`E[\\sigma'(u)\\sigma'(u')] =
    \\frac{\\pi - \\varphi}{2\\pi}`.
    """
    cos = cov.mul_(row["inv"][:, None]).mul_(col["inv"][None, :])
    # The clamp keeps the diagonal (cos = 1 up to rounding) inside arccos' domain; it
    # also makes 1 - cos^2 >= 0 exactly.
    cos.clamp_(-1.0, 1.0)
    pi_minus_phi = torch.arccos(cos).neg_().add_(math.pi)
    sin = torch.addcmul(torch.ones((), dtype=cos.dtype, device=cos.device), cos, cos, value=-1.0)
    sin.sqrt_()
    ntk.mul_(pi_minus_phi).mul_(w_var / (2.0 * math.pi))  # Theta * Sigma-dot
    cov.mul_(pi_minus_phi).add_(sin)
    cov.mul_(row["scaled_std"][:, None]).mul_(col["std"][None, :]).add_(b_var)
    ntk.add_(cov)



def _erf_factors(var: Tensor, w_var: float) -> dict[str, Tensor]:
    """Per-input factors of an erf step: :math:`r = (1 + 2v)^{-1/2}` and scaled copies."""
    r = torch.rsqrt(1.0 + 2.0 * var)
    return {"r": r, "2r": 2.0 * r, "ntk_r": (w_var * 4.0 / math.pi) * r}



def _erf_step(
    cov: Tensor, ntk: Tensor, row: dict[str, Tensor], col: dict[str, Tensor], w_var: float,
    b_var: float,
) -> None:
    """One Erf + Dense step on a block, in place: ``cov`` <- Sigma, ``ntk`` <- Theta.

    Williams (1997): with :math:`\\rho = 2c/\\sqrt{(1+2v_1)(1+2v_2)}`,
    :math:`E[\\mathrm{erf}(u)\\mathrm{erf}(u')] = \\frac{2}{\\pi}\\arcsin\\rho` and
    :math:`E[\\mathrm{erf}'(u)\\mathrm{erf}'(u')] = \\frac{4}{\\pi}\\big((1+2v_1)(1+2v_2)
    - 4c^2\\big)^{-1/2} = \\frac{4}{\\pi}\\frac{1}{\\sqrt{(1+2v_1)(1+2v_2)}
    \\sqrt{1-\\rho^2}}`.
    """
    rho = cov.mul_(row["2r"][:, None]).mul_(col["r"][None, :]).clamp_(-1.0, 1.0)
    one = torch.ones((), dtype=rho.dtype, device=rho.device)
    inv_root = torch.addcmul(one, rho, rho, value=-1.0).clamp_min_(_TINY).rsqrt_()
    ntk.mul_(inv_root).mul_(row["ntk_r"][:, None]).mul_(col["r"][None, :])
    rho.arcsin_().mul_(w_var * 2.0 / math.pi).add_(b_var)
    ntk.add_(rho)



def _relu_diag(var: Tensor) -> Tensor:
    return var / 2.0



def _erf_diag(var: Tensor) -> Tensor:
    return (2.0 / math.pi) * torch.arcsin(2.0 * var / (1.0 + 2.0 * var))



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
    factors, step, diag = (
        (_relu_factors, _relu_step, _relu_diag)
        if activation == "relu"
        else (_erf_factors, _erf_step, _erf_diag)
    )
    # The diagonal variances Sigma^(l)(x, x) of every layer first (vectors, cheap), so
    # that each block of the matrices can then run through all layers on its own.
    var1 = (a * a).sum(1).mul_(w_var / d).add_(b_var)
    var2 = var1 if x2 is None else (b * b).sum(1).mul_(w_var / d).add_(b_var)
    row_factors, col_factors = [], []
    for _ in range(depth):
        row_factors.append(factors(var1, w_var))
        col_factors.append(row_factors[-1] if x2 is None else factors(var2, w_var))
        var1 = w_var * diag(var1) + b_var
        var2 = var1 if x2 is None else w_var * diag(var2) + b_var

    n1, n2 = a.shape[0], b.shape[0]
    nngp = torch.empty(n1, n2, dtype=x1.dtype, device=x1.device)
    ntk = torch.empty(n1, n2, dtype=x1.dtype, device=x1.device)
    # x2 = None on the CPU: only the blocks on and above the diagonal run through the
    # recursion (half the work); the rest is mirrored afterwards.
    symmetric = x2 is None and x1.device.type == "cpu"

    def run_block(r0: int, r1: int) -> None:
        c0 = r0 if symmetric else 0
        cov_block = (a[r0:r1] @ b[c0:].T).mul_(w_var / d).add_(b_var)  # Sigma^(1)
        ntk_block = cov_block.clone()  # Theta^(1)
        for rows, cols in zip(row_factors, col_factors):
            row_block = {k: v[r0:r1] for k, v in rows.items()}
            col_block = {k: v[c0:] for k, v in cols.items()}
            step(cov_block, ntk_block, row_block, col_block, w_var, b_var)
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

