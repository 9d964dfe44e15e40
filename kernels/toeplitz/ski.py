"""SKI-TNO, Algorithm 1 of Moreno et al. (2023), Section 3.2 (:class:`SKITNO`): a depthwise
convolution for the band near the diagonal plus an asymmetric structured kernel
interpolation :math:`W A W^\\top` for the smooth rest (:func:`ski_matvec`), with linear or
cubic interpolation weights (:func:`linear_interpolation_weights`,
:func:`cubic_interpolation_weights`, :func:`interpolation_weights`), inducing points
(:func:`inducing_points`, :func:`inverse_time_warp`) and a piecewise linear RPE
(:class:`PiecewiseLinearRPE`).

Part of :mod:`kernels.toeplitz`, chapter 4 (``chapters/04_toeplitz.ipynb``), section "SKI-TNO".
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from kernels._checks import check_choice, check_float_dtype, check_generator, check_positive_int, check_tensor
from kernels.toeplitz.product import (
    _apply_spectrum,
    _check_fft_input,
    _empty_like_result,
    fft_length,
    _kernel_spectrum,
    toeplitz_dense,
)
from kernels.toeplitz.helpers import (
    _check_decay,
    _check_sequence,
)

__all__ = [
    "inverse_time_warp",
    "inducing_points",
    "linear_interpolation_weights",
    "cubic_interpolation_weights",
    "interpolation_weights",
    "ski_matvec",
    "PiecewiseLinearRPE",
    "SKITNO",
    "SKI_METHODS",
    "SKI_INTERPOLATIONS",
]


#: Ways :func:`ski_matvec` applies :math:`W A W^\top`.
SKI_METHODS = ("sparse", "dense")



#: Interpolation schemes of the SKI weights W: two-tap linear (the paper) or four-tap
#: cubic convolution (Keys, a = -1/2; the paper mentions cubic as an option).
SKI_INTERPOLATIONS = ("linear", "cubic")



# --------------------------------------------------------------------------------------
# SKI-TNO (Algorithm 1)
# --------------------------------------------------------------------------------------


def inverse_time_warp(t: Tensor, decay: float) -> Tensor:
    """The inverse time warp :math:`x(t) = \\mathrm{sign}(t)\\,\\lambda^{|t|}`.

    Maps lags :math:`t \\in \\mathbb R` into :math:`[-1, 1]`: :math:`x(0) = 0`, small
    non-zero lags near :math:`\\pm 1`, large lags towards 0 (the paper, Section 3.2.2).
    With an RPE on :math:`[-1, 1]` that vanishes at 0, :math:`k(t) =
    \\mathrm{RPE}(x(t))` decays for large :math:`|t|` and any lag, however long the
    sequence, is an interpolation. Elementwise, :math:`O(\\text{numel})`. Derived in
    chapter 4 (chapters/04_toeplitz.ipynb), section "Inverse time warp".
    """
    t = check_tensor("t", t)
    lam = _check_decay(decay)
    return torch.sign(t) * torch.exp(t.abs() * math.log(lam))



def inducing_points(n: int, r: int, *, dtype: Optional[torch.dtype] = None) -> Tensor:
    """``r`` inducing points evenly spaced on the token positions :math:`[0, n-1]`.

    :math:`p_k = k\\,h`, :math:`h = (n-1)/(r-1)`, :math:`k = 0..r-1` (Algorithm 1 spaces
    them on :math:`[0, n]`; keeping both ends on observed positions makes every token an
    interpolation). ``r = 1`` gives the single point 0. Requires :math:`r \\le n`.
    Returns ``(r,)``. Derived in chapter 4 (chapters/04_toeplitz.ipynb), section
    "Sparse plus low rank: SKI-TNO".
    """
    n, r = _check_n_r(n, r)
    dtype = check_float_dtype("dtype", dtype, none_is_default=True)
    if r == 1:
        return torch.zeros(1, dtype=dtype)
    return torch.arange(r, dtype=torch.float64).mul((n - 1) / (r - 1)).to(dtype)



def _check_n_r(n: Any, r: Any) -> tuple[int, int]:
    n = check_positive_int("n", n)
    r = check_positive_int("r", r)
    if r > n:
        raise ValueError(
            f"rank r = {r} inducing points exceeds the sequence length n = {n}; use r <= n"
        )
    return n, r



class _InterpolationGrid(NamedTuple):
    """Linear interpolation from ``r`` inducing points to ``n`` tokens (2 taps per row)."""

    left: Tensor  # (n,) long: index of the inducing point at or left of token i
    right: Tensor  # (n,) long: left + 1 (or left when r == 1)
    w_left: Tensor  # (n,) weight of ``left``
    w_right: Tensor  # (n,) weight of ``right``; w_left + w_right = 1



def _interpolation_grid(
    n: int, r: int, dtype: torch.dtype, device: torch.device
) -> _InterpolationGrid:
    if r == 1:
        zeros = torch.zeros(n, dtype=torch.long, device=device)
        ones = torch.ones(n, dtype=dtype, device=device)
        return _InterpolationGrid(zeros, zeros, ones, torch.zeros_like(ones))
    # Token i sits at i / h = i (r - 1) / (n - 1) in inducing-point units; integer
    # arithmetic keeps the floor and the fraction exact.
    num = torch.arange(n, dtype=torch.long, device=device) * (r - 1)
    left = torch.div(num, n - 1, rounding_mode="floor").clamp(max=r - 2)
    frac = (num - left * (n - 1)).to(torch.float64) / (n - 1)
    w_right = frac.to(dtype)
    return _InterpolationGrid(left, left + 1, 1.0 - w_right, w_right)



def linear_interpolation_weights(
    n: int, r: int, *, dtype: Optional[torch.dtype] = None
) -> Tensor:
    """Dense SKI interpolation matrix :math:`W \\in \\mathbb R^{n \\times r}`.

    Row :math:`i` linearly interpolates token position :math:`i` from its two
    neighbouring inducing points :math:`p_k \\le i \\le p_{k+1}` (:func:`inducing_points`):
    :math:`W_{ik} = 1 - s`, :math:`W_{i,k+1} = s`, :math:`s = (i - p_k)/h`; every row
    sums to 1 and has at most two non-zeros (the paper, Section 3.2.1, "linear
    interpolation"). :math:`O(nr)` memory -- :func:`ski_matvec` with
    ``method="sparse"`` never forms it. Derived in chapter 4
    (chapters/04_toeplitz.ipynb), section "Sparse plus low rank: SKI-TNO".
    """
    n, r = _check_n_r(n, r)
    dtype = check_float_dtype("dtype", dtype, none_is_default=True)
    grid = _interpolation_grid(n, r, dtype, torch.device("cpu"))
    return _dense_weights(grid, n, r)



def _dense_weights(grid: _InterpolationGrid, n: int, r: int) -> Tensor:
    rows = torch.arange(n, device=grid.left.device)
    weights = grid.w_left.new_zeros(n, r)
    weights.index_put_((rows, grid.left), grid.w_left, accumulate=True)
    weights.index_put_((rows, grid.right), grid.w_right, accumulate=True)
    return weights



class _CubicTaps(NamedTuple):
    """Four-tap cubic convolution from ``r`` inducing points to ``n`` tokens."""

    index: Tensor  # (n, 4) long: taps k-1..k+2 as indices into the extended points -1..r (+1)
    weight: Tensor  # (n, 4): Keys weights of those taps; every row sums to 1



def _check_cubic_r(r: int) -> None:
    if r < 3:
        raise ValueError(
            f"cubic interpolation needs rank r >= 3 inducing points (its boundary rule "
            f"extrapolates from three), got r = {r}; use interpolation='linear'"
        )



def _cubic_taps(n: int, r: int, dtype: torch.dtype, device: torch.device) -> _CubicTaps:
    # Token i sits at s = i (r - 1)/(n - 1) in inducing-point units, k = floor(s),
    # f = s - k in [0, 1); the taps are the points k-1, k, k+1, k+2.
    num = torch.arange(n, dtype=torch.long, device=device) * (r - 1)
    k = torch.div(num, n - 1, rounding_mode="floor").clamp(max=r - 2)
    f = ((num - k * (n - 1)).to(torch.float64) / (n - 1)).unsqueeze(1)
    f2, f3 = f * f, f * f * f
    # Keys' cubic convolution kernel with a = -1/2, evaluated at distances 1+f, f,
    # 1-f and 2-f: third-order accurate, and it reproduces quadratics exactly.
    weight = torch.cat(
        [(-f3 + 2 * f2 - f) / 2, (3 * f3 - 5 * f2 + 2) / 2, (-3 * f3 + 4 * f2 + f) / 2, (f3 - f2) / 2],
        dim=1,
    )
    # +1: extended index, position -1 is stored at 0.
    index = k.unsqueeze(1) + torch.arange(4, device=device)
    return _CubicTaps(index, weight.to(dtype))



def _extend(z: Tensor) -> Tensor:
    """``(B, r, c) -> (B, r + 2, c)``: Keys' boundary points :math:`z_{-1}, z_r`.

    :math:`z_{-1} = 3z_0 - 3z_1 + z_2` and :math:`z_r = 3z_{r-1} - 3z_{r-2} + z_{r-3}`
    extrapolate a quadratic through the three end points, which keeps the boundary
    rows third-order accurate.
    """
    first = 3 * z[:, 0] - 3 * z[:, 1] + z[:, 2]
    last = 3 * z[:, -1] - 3 * z[:, -2] + z[:, -3]
    return torch.cat([first.unsqueeze(1), z, last.unsqueeze(1)], dim=1)



def _extend_adjoint(z_ext: Tensor) -> Tensor:
    """``(B, r + 2, c) -> (B, r, c)``: the transpose of :func:`_extend`."""
    first, inner, last = z_ext[:, :1], z_ext[:, 1:-1], z_ext[:, -1:]
    r = inner.shape[1]
    fold = torch.zeros_like(inner)
    fold = fold.index_add(1, torch.tensor([0, 1, 2], device=z_ext.device),
                          torch.cat([3 * first, -3 * first, first], dim=1))
    fold = fold.index_add(1, torch.tensor([r - 1, r - 2, r - 3], device=z_ext.device),
                          torch.cat([3 * last, -3 * last, last], dim=1))
    return inner + fold



def _cubic_interpolate(z: Tensor, taps: _CubicTaps) -> Tensor:
    """:math:`W z` for cubic :math:`W`: ``(B, r, c) -> (B, n, c)``, four gathers."""
    z_ext = _extend(z)
    out = taps.weight[:, 0, None] * z_ext[:, taps.index[:, 0]]
    for j in range(1, 4):
        out = out + taps.weight[:, j, None] * z_ext[:, taps.index[:, j]]
    return out



def _cubic_interpolate_adjoint(x3: Tensor, taps: _CubicTaps, r: int) -> Tensor:
    """:math:`W^\\top x` for cubic :math:`W`: ``(B, n, c) -> (B, r, c)``, four scatter-adds."""
    batch, _, c = x3.shape
    z_ext = x3.new_zeros(batch, r + 2, c)
    for j in range(4):
        z_ext = z_ext.index_add(1, taps.index[:, j], taps.weight[:, j, None] * x3)
    return _extend_adjoint(z_ext)



def cubic_interpolation_weights(
    n: int, r: int, *, dtype: Optional[torch.dtype] = None
) -> Tensor:
    """Dense cubic SKI interpolation matrix :math:`W \\in \\mathbb R^{n \\times r}`.

    Row :math:`i` interpolates token position :math:`i` from the four inducing points
    around it with Keys' cubic convolution kernel (:math:`a = -1/2`); at the two ends
    the missing outer point is extrapolated, :math:`z_{-1} = 3z_0 - 3z_1 + z_2`. The
    result reproduces every quadratic exactly, is third-order accurate (error
    :math:`O(h^3)` in the spacing :math:`h`, against :math:`O(h^2)` for
    :func:`linear_interpolation_weights`), and every row sums to 1. The paper
    (Section 3.2.1) uses linear interpolation and names cubic as the alternative.
    Needs :math:`3 \\le r \\le n`. :math:`O(nr)` memory; :func:`ski_matvec` with
    ``method="sparse"`` applies it with four gathers instead. Derived in chapter 4
    (chapters/04_toeplitz.ipynb), section "Sparse plus low rank: SKI-TNO".
    """
    n, r = _check_n_r(n, r)
    _check_cubic_r(r)
    dtype = check_float_dtype("dtype", dtype, none_is_default=True)
    return _cubic_dense(_cubic_taps(n, r, dtype, torch.device("cpu")), n, r)



def _cubic_dense(taps: _CubicTaps, n: int, r: int) -> Tensor:
    rows = torch.arange(n, device=taps.index.device).unsqueeze(1).expand(n, 4)
    w_ext = taps.weight.new_zeros(n, r + 2)
    w_ext.index_put_((rows.reshape(-1), taps.index.reshape(-1)), taps.weight.reshape(-1), accumulate=True)
    # W = W_ext E with E the (r + 2, r) extension; W_ext E = (E^T W_ext^T)^T.
    return _extend_adjoint(w_ext.T.unsqueeze(0)).squeeze(0).T.contiguous()



def interpolation_weights(
    n: int, r: int, *, interpolation: str = "linear", dtype: Optional[torch.dtype] = None
) -> Tensor:
    """Dense SKI weights :math:`W` (``(n, r)``) for ``interpolation`` in
    :data:`SKI_INTERPOLATIONS`: :func:`linear_interpolation_weights` or
    :func:`cubic_interpolation_weights`."""
    interpolation = check_choice("interpolation", interpolation, SKI_INTERPOLATIONS)
    if interpolation == "cubic":
        return cubic_interpolation_weights(n, r, dtype=dtype)
    return linear_interpolation_weights(n, r, dtype=dtype)



def _interpolate(z: Tensor, n: int) -> Tensor:
    """:math:`W z`: ``(B, r, c)`` -> ``(B, n, c)``, linear interpolation, aligned ends.

    Interpolating from :math:`r` points evenly spaced on :math:`[0, n-1]` is exactly
    torch's linear upsampling with ``align_corners=True``; bilinear on the channels-last
    view ``(B, c, 1, r)`` (one row) reads and writes the ``(B, ., c)`` layout directly.
    """
    z4 = z.contiguous().permute(0, 2, 1).unsqueeze(2)
    y = F.interpolate(z4, size=(1, n), mode="bilinear", align_corners=True)
    return y.squeeze(2).permute(0, 2, 1)



def _interpolate_adjoint(x3: Tensor, r: int) -> Tensor:
    """:math:`W^\\top x`: ``(B, n, c)`` -> ``(B, r, c)``, the adjoint of :func:`_interpolate`.

    The adjoint of upsampling is its backward kernel (every token adds its two weighted
    values to its two inducing points); autograd differentiates it by upsampling.
    """
    batch, n, c = x3.shape
    z = torch.ops.aten.upsample_bilinear2d_backward(
        x3.contiguous().permute(0, 2, 1).unsqueeze(2), [1, n], [batch, c, 1, r], True
    )
    return z.squeeze(2).permute(0, 2, 1)



def _ski_sparse(a_coeffs: Tensor, x: Tensor, r: int, interpolation: str = "linear") -> Tensor:
    """:math:`W (A (W^\\top x))` with sparse interpolation taps and an FFT for ``A``."""
    lead = x.shape[:-2]
    n, c = x.shape[-2:]
    x3 = x.reshape((-1, n, c))
    if interpolation == "cubic":
        taps = _cubic_taps(n, r, x.dtype, x.device)
        z = _cubic_interpolate_adjoint(x3, taps, r)
    else:
        z = _interpolate_adjoint(x3, r)
    length = fft_length(r)
    z = _apply_spectrum(_kernel_spectrum(a_coeffs, r, length, False), z, length)
    y = _cubic_interpolate(z, taps) if interpolation == "cubic" else _interpolate(z, n)
    return y.reshape(lead + (n, c))



def _ski_dense(a_coeffs: Tensor, x: Tensor, weights: Tensor) -> Tensor:
    """:math:`W (A (W^\\top x))` with dense matmuls (the paper's batched-dense code path)."""
    a = toeplitz_dense(a_coeffs)  # (c, r, r)
    z = torch.matmul(weights.T, x)  # (..., r, c)
    z = torch.einsum("crs,...sc->...rc", a, z)
    return torch.matmul(weights, z)



def ski_matvec(
    a_coeffs: Tensor, x: Tensor, *, method: str = "sparse", interpolation: str = "linear"
) -> Tensor:
    """Asymmetric SKI product :math:`\\tilde T x = W A W^\\top x` per channel.

    :math:`A^l \\in \\mathbb R^{r \\times r}` is the Toeplitz matrix of the kernel on the
    inducing points, :math:`A^l_{ij} = k_l(p_i - p_j)`, and :math:`W` the linear
    interpolation weights of :func:`linear_interpolation_weights`; :math:`\\tilde T =
    W A W^\\top \\approx F A^\\dagger B \\approx T` (the paper, Section 3.2.1 and
    Algorithm 1; error bound in Theorem 1). Derived in chapter 4
    (chapters/04_toeplitz.ipynb), section "Sparse plus low rank: SKI-TNO".

    Methods:

    * ``"sparse"``: :math:`W^\\top x` as a scatter-add of the two weighted taps of every
      token, :math:`A` by :func:`toeplitz_matvec`'s FFT, :math:`W(\\cdot)` as a two-tap
      gather: :math:`O(B\\,c\\,(n + r\\log r))`. Since :math:`W` is exactly linear
      upsampling from :math:`r` to :math:`n` points with aligned ends, the gather is
      ``torch.nn.functional.interpolate(..., align_corners=True)`` and the scatter its
      backward kernel, run on the channels-last view (no transposes).
    * ``"dense"``: dense :math:`W` matmuls and a dense :math:`A`, the batched-dense code
      the paper actually runs on GPUs: :math:`O(B\\,c\\,(n r + r^2))`.

    ``interpolation="cubic"`` uses the four-tap weights of
    :func:`cubic_interpolation_weights` (error :math:`O(h^3)` instead of :math:`O(h^2)`;
    needs :math:`r \\ge 3`); the sparse method then gathers and scatters four taps.

    Shapes: ``a_coeffs`` ``(c, 2r - 1)`` (lags :math:`-(r-1)..r-1` in units of the
    inducing-point spacing, the layout of :func:`toeplitz_matvec`), ``x``
    ``(..., n, c)`` with :math:`r \\le n`; returns ``(..., n, c)``.
    """
    method = check_choice("method", method, SKI_METHODS)
    interpolation = check_choice("interpolation", interpolation, SKI_INTERPOLATIONS)
    a_coeffs = _check_fft_input("a_coeffs", a_coeffs, ndim=2)
    x = _check_fft_input("x", x)
    if x.ndim < 2:
        raise ValueError(f"x must have shape (..., n, channels), got shape {tuple(x.shape)}")
    if a_coeffs.dtype != x.dtype:
        raise TypeError(
            f"a_coeffs and x must have the same dtype, got {a_coeffs.dtype} and {x.dtype}"
        )
    if a_coeffs.shape[-1] % 2 == 0:
        raise ValueError(
            f"a_coeffs must have odd length 2r - 1 in its last dimension, got shape "
            f"{tuple(a_coeffs.shape)}"
        )
    if a_coeffs.shape[0] != x.shape[-1]:
        raise ValueError(
            f"a_coeffs has {a_coeffs.shape[0]} channels but x has {x.shape[-1]}"
        )
    r = (a_coeffs.shape[-1] + 1) // 2
    n, r = _check_n_r(x.shape[-2], r)
    if interpolation == "cubic":
        _check_cubic_r(r)
    if x.numel() == 0:
        return _empty_like_result(tuple(x.shape), x, a_coeffs)
    if method == "sparse":
        return _ski_sparse(a_coeffs, x, r, interpolation)
    return _ski_dense(a_coeffs, x, _weights_on(n, r, interpolation, x.dtype, x.device))



def _weights_on(
    n: int, r: int, interpolation: str, dtype: torch.dtype, device: torch.device
) -> Tensor:
    if interpolation == "cubic":
        return _cubic_dense(_cubic_taps(n, r, dtype, device), n, r)
    return _dense_weights(_interpolation_grid(n, r, dtype, device), n, r)



class PiecewiseLinearRPE(nn.Module):
    """Learned piecewise-linear RPE on :math:`[-1, 1]` with :math:`\\mathrm{RPE}(0) = 0`.

    ``channels`` functions, each linear between the :math:`2K + 1` knots
    :math:`u_j = j/K`, :math:`j = -K..K`, with learned values at the knots except
    :math:`u = 0`, where the value is fixed to 0 (the paper, Section 3.2.2: the MLP RPE
    replaced by linear interpolation; by Proposition 1 a ReLU MLP of a scalar is of
    this form anyway). Composed with :func:`inverse_time_warp` it is the smooth part of
    the SKI-TNO kernel. Inputs outside :math:`[-1, 1]` are clamped. Derived in chapter 4
    (chapters/04_toeplitz.ipynb), section "Inverse time warp".

    Shapes: ``u`` ``(N,)`` -> ``(channels, N)``; cost :math:`O(\\text{channels}\\,N)`.

    Args:
        channels: number of output functions.
        knots: :math:`K`, knots per side of 0 (positive int).
        init_std: standard deviation of the initial knot values (normal, from
            ``generator``).
    """

    def __init__(
        self,
        channels: int,
        knots: int,
        *,
        init_std: float = 0.1,
        generator: Optional[torch.Generator] = None,
        dtype: Optional[torch.dtype] = None,
    ) -> None:
        super().__init__()
        self.channels = check_positive_int("channels", channels)
        self.knots = check_positive_int("knots", knots)
        check_generator("generator", generator)
        dtype = check_float_dtype("dtype", dtype, none_is_default=True)
        values = torch.randn(self.channels, 2 * self.knots, generator=generator, dtype=dtype)
        self.values = nn.Parameter(values * float(init_std))

    def knot_values(self) -> Tensor:
        """``(channels, 2K + 1)``: the values at :math:`u = -1, \\dots, 0, \\dots, 1`."""
        zero = self.values.new_zeros(self.channels, 1)
        k = self.knots
        return torch.cat([self.values[:, :k], zero, self.values[:, k:]], dim=1)

    def forward(self, u: Tensor) -> Tensor:
        u = check_tensor("u", u, ndim=1)
        pos = (u.clamp(-1.0, 1.0) + 1.0) * self.knots  # in [0, 2K]
        left = pos.floor().long().clamp(0, 2 * self.knots - 1)
        frac = pos - left.to(pos.dtype)
        table = self.knot_values()
        return table[:, left] * (1.0 - frac) + table[:, left + 1] * frac

    def extra_repr(self) -> str:
        return f"channels={self.channels}, knots={self.knots}"



def _depthwise_conv(x3: Tensor, weight: Tensor, left: int) -> Tensor:
    """:math:`y_i = \\sum_k w_k x_{i + k - \\text{left}}` per channel (zero outside),
    ``x3`` ``(B, n, c)``, ``weight`` ``(c, m)``.

    A grouped ``conv2d`` on the channels-last view ``(B, c, 1, n)`` of ``x3``: no
    transpose, the padding stays inside oneDNN, and the output is ``(B, n, c)``.
    """
    m = weight.shape[-1]
    pad = max(left, m - 1 - left)
    y = F.conv2d(
        x3.permute(0, 2, 1).unsqueeze(2), weight[:, None, None, :], padding=(0, pad),
        groups=weight.shape[0],
    )
    start = pad - left
    return y.squeeze(2).permute(0, 2, 1)[:, start : start + x3.shape[1]]



def _blocked_channels_first(t: Tensor, block: int, n_blocks: int, left: int) -> Tensor:
    """``(B, n, c)`` -> ``(c, B (n_blocks + 2), block)``: each batch row is ``left`` zeros,
    the sequence, then zeros up to ``(n_blocks + 2) block`` entries."""
    batch, n, c = t.shape
    width = (n_blocks + 2) * block
    out = t.new_empty(c, batch, width)
    out[:, :, :left].zero_()
    out[:, :, left + n :].zero_()
    if batch <= 16:  # a few 2-D transposes take torch's blocked fast path
        for b in range(batch):
            out[:, b, left : left + n].copy_(t[b].t())
    else:
        out[:, :, left : left + n] = t.permute(2, 0, 1)
    return out.view(c, batch * (n_blocks + 2), block)



class _BandProduct(torch.autograd.Function):
    """Banded Toeplitz product of ``(B, n, c)`` sequences with ``(c, m)`` coefficients.

    Forward and input gradient are depthwise convolutions (:func:`_depthwise_conv`). The
    coefficient gradient :math:`g_{t_\\ell} = \\sum_{b,i} g_{b,i}\\,x_{b,i-\\ell}` is a
    blocked contraction: with blocks of :math:`s \\ge m/2` outputs, the products of
    output block :math:`j` with input blocks :math:`j, j+1, j+2` (of the input shifted
    by the largest lag) are three batched matmuls over shifted views, after which each
    lag is a diagonal sum. torch's own convolution weight gradient is several times
    slower on CPUs.
    """

    generate_vmap_rule = True

    @staticmethod
    def forward(x3: Tensor, coeffs: Tensor) -> Tensor:  # type: ignore[override]
        m = coeffs.shape[-1]
        # x_{i-l} for the lags l = -lo..hi in coeffs' order is x_{i + k - hi} with the
        # reversed coefficients.
        return _depthwise_conv(x3, coeffs.flip(-1), m // 2)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: Tensor) -> None:
        ctx.save_for_backward(*inputs)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad_y: Tensor) -> tuple[Optional[Tensor], Optional[Tensor]]:
        x3, coeffs = ctx.saved_tensors
        m = coeffs.shape[-1]
        hi, lo = m // 2, (m - 1) // 2
        grad_x = grad_coeffs = None
        if ctx.needs_input_grad[0]:
            # the transpose: sum_l t_l g_{j+l} = sum_k t_k g_{j + k - lo}
            grad_x = _depthwise_conv(grad_y, coeffs, lo)
        if ctx.needs_input_grad[1]:
            n = x3.shape[1]
            block = max(hi, 8)
            n_blocks = -(-n // block)
            g_blocks = _blocked_channels_first(grad_y, block, n_blocks, 0)
            x_blocks = _blocked_channels_first(x3, block, n_blocks, hi)
            rows = g_blocks.shape[1]
            # prod[c, t, d s + u] = sum_{b,j} g[b, j s + t] x[b, (j + d) s + u - hi]; the
            # two zero blocks closing every batch row keep rows of different batch
            # entries apart.
            prod = torch.cat(
                [
                    torch.bmm(g_blocks[:, : rows - d].transpose(1, 2), x_blocks[:, d:])
                    for d in range(3)
                ],
                dim=2,
            )
            t = torch.arange(block, device=x3.device)[:, None]
            k = torch.arange(m, device=x3.device)[None, :]
            # lag l = k - lo pairs output t with window entry t + hi - l = t + m - 1 - k
            grad_coeffs = prod[:, t, t + m - 1 - k].sum(1)
        return grad_x, grad_coeffs



def _band_matvec(coeffs: Tensor, x: Tensor) -> Tensor:
    """Banded Toeplitz product :math:`y_i = \\sum_\\ell t_\\ell x_{i-\\ell}` per channel.

    ``coeffs`` ``(c, m)`` holds the lags :math:`-\\lfloor (m-1)/2 \\rfloor ..
    \\lfloor m/2 \\rfloor` in increasing order; ``x`` is ``(..., n, c)``. A depthwise 1D
    convolution of filter size :math:`m`, :math:`O(B\\,c\\,n\\,m)`, with a faster
    backward than ``torch.nn.functional.conv1d`` (see :class:`_BandProduct`).
    """
    lead, (n, c) = x.shape[:-2], x.shape[-2:]
    y = _BandProduct.apply(x.reshape((-1, n, c)).contiguous(), coeffs)
    return y.reshape(lead + (n, c))



class SKITNO(nn.Module):
    """Sparse plus low-rank bidirectional TNO with asymmetric SKI (Algorithm 1).

    For each channel :math:`l`,

    .. math::
        \\mathrm{TNO}(X)^l = T^l_{\\text{sparse}} x^l + W A^l W^\\top x^l,\\qquad
        A^l_{ij} = \\mathrm{RPE}_l\\big(x(p_i - p_j)\\big),

    * :math:`T_{\\text{sparse}}`: a learned band of ``filter_size`` :math:`m` lags
      :math:`-\\lfloor (m-1)/2 \\rfloor .. \\lfloor m/2 \\rfloor`, a depthwise 1D
      convolution of filter size :math:`m` (the spiky part of learned TNN kernels);
    * :math:`W A W^\\top`: ``rank`` :math:`r` inducing points :math:`p_k` evenly spaced
      on :math:`[0, n-1]` (:func:`inducing_points`), linear interpolation weights
      :math:`W` (:func:`linear_interpolation_weights`), and the small Toeplitz
      :math:`A` whose :math:`2r-1` coefficients are the piecewise-linear
      :class:`PiecewiseLinearRPE` composed with the inverse time warp
      :math:`x(t) = \\mathrm{sign}(t)\\lambda^{|t|}` (:func:`inverse_time_warp`), so no
      MLP and no explicit decay bias are evaluated. See :func:`ski_matvec`.

    Bidirectional only: causal masking negates SKI's benefits (the paper, Appendix B),
    use :class:`FDTNO` for causal models. Derived in chapter 4
    (chapters/04_toeplitz.ipynb), section "Sparse plus low rank: SKI-TNO".

    Shapes: ``(..., n, channels) -> (..., n, channels)`` with ``rank <= n`` and
    ``filter_size <= n`` (else ``ValueError``). Cost per call :math:`O(B\\,d\\,(n m +
    n + r\\log r))` (``low_rank="sparse"``) or :math:`O(B\\,d\\,(n m + n r + r^2))`
    (``"dense"``).

    Args:
        channels: ``d``.
        rank: :math:`r`, number of inducing points (the paper: 64 on 1D LRA tasks).
        filter_size: :math:`m`, width of the sparse band (the paper: 32).
        decay: :math:`\\lambda \\in (0, 1)` of the inverse time warp (the paper: 0.99).
        knots: knots per side of the piecewise-linear RPE (``None``: ``rank``).
        low_rank: ``"sparse"`` or ``"dense"`` application of :math:`W A W^\\top`.
        interpolation: ``"linear"`` (the paper) or ``"cubic"`` weights :math:`W`
            (:data:`SKI_INTERPOLATIONS`; cubic needs ``rank >= 3``).
        generator, dtype: initialisation randomness and parameter dtype.
    """

    def __init__(
        self,
        channels: int,
        *,
        rank: int = 64,
        filter_size: int = 32,
        decay: float = 0.99,
        knots: Optional[int] = None,
        low_rank: str = "sparse",
        interpolation: str = "linear",
        generator: Optional[torch.Generator] = None,
        dtype: Optional[torch.dtype] = None,
    ) -> None:
        super().__init__()
        self.channels = check_positive_int("channels", channels)
        self.rank = check_positive_int("rank", rank)
        self.filter_size = check_positive_int("filter_size", filter_size)
        self.decay = _check_decay(decay)
        self.low_rank = check_choice("low_rank", low_rank, SKI_METHODS)
        self.interpolation = check_choice("interpolation", interpolation, SKI_INTERPOLATIONS)
        if self.interpolation == "cubic":
            _check_cubic_r(self.rank)
        knots = self.rank if knots is None else check_positive_int("knots", knots)
        check_generator("generator", generator)
        dtype = check_float_dtype("dtype", dtype, none_is_default=True)
        # nn.Conv1d's default initialisation, U(-1/sqrt(m), 1/sqrt(m)).
        bound = 1.0 / math.sqrt(self.filter_size)
        band = torch.empty(self.channels, self.filter_size, dtype=dtype)
        nn.init.uniform_(band, -bound, bound, generator=generator)
        #: ``(channels, m)``: the band's coefficients in increasing lag order.
        self.sparse_coeffs = nn.Parameter(band)
        self.rpe = PiecewiseLinearRPE(self.channels, knots, generator=generator, dtype=dtype)
        # Dense W per (n, dtype, device) for low_rank="dense": a constant of the layer,
        # rebuilt only for a new length; not state (never saved).
        self._weights_cache: dict[tuple[int, torch.dtype, torch.device], Tensor] = {}

    def _dense_interpolation(self, n: int, dtype: torch.dtype, device: torch.device) -> Tensor:
        key = (n, dtype, device)
        if key not in self._weights_cache:
            if len(self._weights_cache) >= 8:
                self._weights_cache.clear()
            self._weights_cache[key] = _weights_on(n, self.rank, self.interpolation, dtype, device)
        return self._weights_cache[key]

    @property
    def dtype(self) -> torch.dtype:
        return self.sparse_coeffs.dtype

    @property
    def sparse_lags(self) -> range:
        """The lags of the band, matching the columns of ``sparse_coeffs``."""
        low = -((self.filter_size - 1) // 2)
        return range(low, low + self.filter_size)

    def _check_n(self, n: int) -> int:
        n = check_positive_int("n", n)
        if self.rank > n:
            raise ValueError(
                f"rank r = {self.rank} exceeds the sequence length n = {n}; build the "
                f"SKITNO with rank <= n"
            )
        if self.filter_size > n:
            raise ValueError(
                f"filter_size m = {self.filter_size} exceeds the sequence length n = {n}; "
                f"build the SKITNO with filter_size <= n"
            )
        return n

    def low_rank_coeffs(self, n: int) -> Tensor:
        """``(channels, 2r - 1)``: :math:`A`'s coefficients :math:`\\mathrm{RPE}(x(k h))`.

        :math:`k = -(r-1)..r-1`, :math:`h = (n-1)/(r-1)` the inducing-point spacing.
        """
        n = self._check_n(n)
        r = self.rank
        spacing = 0.0 if r == 1 else (n - 1) / (r - 1)
        dtype, device = self.dtype, self.sparse_coeffs.device
        lags = torch.arange(-(r - 1), r, dtype=dtype, device=device) * spacing
        warped = torch.sign(lags) * torch.exp(lags.abs() * math.log(self.decay))
        return self.rpe(warped)

    def _band(self, x: Tensor) -> Tensor:
        return _band_matvec(self.sparse_coeffs, x)

    def sparse_matrix(self, n: int) -> Tensor:
        """``(channels, n, n)``: the banded :math:`T_{\\text{sparse}}` (dense, for checks)."""
        n = self._check_n(n)
        coeffs = self.sparse_coeffs.new_zeros(self.channels, 2 * n - 1)
        lags = torch.tensor(list(self.sparse_lags), device=coeffs.device) + n - 1
        coeffs = coeffs.index_copy(1, lags, self.sparse_coeffs)
        return toeplitz_dense(coeffs)

    def low_rank_matrix(self, n: int) -> Tensor:
        """``(channels, n, n)``: :math:`W A W^\\top` (dense, for checks and plots)."""
        a = toeplitz_dense(self.low_rank_coeffs(n))
        w = interpolation_weights(
            n, self.rank, interpolation=self.interpolation, dtype=self.dtype
        ).to(a.device)
        return w @ a @ w.T

    def dense_matrix(self, n: int) -> Tensor:
        """``(channels, n, n)``: :math:`T_{\\text{sparse}} + W A W^\\top`."""
        return self.sparse_matrix(n) + self.low_rank_matrix(n)

    def forward(self, x: Tensor) -> Tensor:
        x = _check_sequence(x, self.channels, self.dtype)
        if x.numel() == 0:  # an empty batch
            return _empty_like_result(tuple(x.shape), x, *self.parameters())
        n = self._check_n(x.shape[-2])
        a_coeffs = self.low_rank_coeffs(n)
        if self.low_rank == "sparse":
            low = _ski_sparse(a_coeffs, x, self.rank, self.interpolation)
        else:
            low = _ski_dense(a_coeffs, x, self._dense_interpolation(n, x.dtype, x.device))
        return self._band(x) + low

    def extra_repr(self) -> str:
        return (
            f"channels={self.channels}, rank={self.rank}, filter_size={self.filter_size}, "
            f"decay={self.decay}, low_rank={self.low_rank!r}, "
            f"interpolation={self.interpolation!r}"
        )

