"""The Toeplitz matrix-vector product :math:`y = T x`, :math:`T_{ij} = t_{i-j}`, by circulant
embedding and the real FFT (:func:`toeplitz_matvec`, bidirectional and causal, with a
hand-written backward pass), and the dense matrix for checks and plots
(:func:`toeplitz_dense`).

Part of :mod:`kernels.toeplitz` (coefficient layout and conventions in its docstring),
chapter 4 (``chapters/04_toeplitz.ipynb``), section "The Toeplitz product"; every operator
of the package multiplies through it.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from kernels._checks import check_positive_int, check_tensor

__all__ = [
    "toeplitz_matvec",
    "toeplitz_dense",
    "fft_length",
]


# --------------------------------------------------------------------------------------
# The Toeplitz product
# --------------------------------------------------------------------------------------


def fft_length(n: int) -> int:
    """Length of the circulant embedding of an ``n x n`` Toeplitz matrix.

    The smallest :math:`L = 2^a 3^b 5^c \\ge 2n - 1`: a circulant of size :math:`L`
    holds all :math:`2n - 1` lags without wrap-around, and 5-smooth lengths are fast
    for every FFT library (for ``n`` a power of two, :math:`L = 2n`). Derived in
    chapter 4 (chapters/04_toeplitz.ipynb), section "Toeplitz matrices and the
    circulant embedding".
    """
    n = check_positive_int("n", n)
    target = 2 * n - 1
    best = 1 << max(target - 1, 0).bit_length()  # next power of two, always 5-smooth
    p5 = 1
    while p5 < best:
        p35 = p5
        while p35 < best:
            length = p35
            while length < target:
                length *= 2
            best = min(best, length)
            p35 *= 3
        p5 *= 5
    return best



def _circulant_column(coeffs: Tensor, n: int, length: int, causal: bool) -> Tensor:
    """First column of the ``length``-circulant that embeds the Toeplitz matrix."""
    if causal:
        return F.pad(coeffs, (0, length - n))
    # [t_0, ..., t_{n-1}, 0, ..., 0, t_{-(n-1)}, ..., t_{-1}]
    gap = coeffs.new_zeros(coeffs.shape[:-1] + (length - (2 * n - 1),))
    return torch.cat([coeffs[..., n - 1 :], gap, coeffs[..., : n - 1]], dim=-1)



def _half_spectrum_weights(length: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """How often ``irfft`` of length ``length`` counts each bin: 1 at DC and (even
    ``length``) Nyquist, 2 elsewhere."""
    weights = torch.full((length // 2 + 1,), 2.0, dtype=dtype, device=device)
    weights[0] = 1.0
    if length % 2 == 0:
        weights[-1] = 1.0
    return weights



class _RealSpectrum(torch.autograd.Function):
    """``rfft`` of real rows of length ``L`` with a half-spectrum backward.

    Autograd's backward of ``rfft`` runs a full-length complex FFT; its adjoint is
    :math:`g_t = \\sum_f \\mathrm{Re}(g_{K_f} e^{i\\omega_f t}) = \\tfrac{L}{2}\\,
    \\mathrm{irFFT}_L(g_K \\cdot \\tfrac{2}{w})`, one half-size inverse FFT
    (:math:`w` from :func:`_half_spectrum_weights`).
    """

    generate_vmap_rule = True

    @staticmethod
    def forward(rows: Tensor) -> Tensor:  # type: ignore[override]
        return torch.fft.rfft(rows)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: Tensor) -> None:
        ctx.length = inputs[0].shape[-1]
        ctx.real_dtype = inputs[0].dtype

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad_spectrum: Tensor) -> Tensor:
        length = ctx.length
        weights = _half_spectrum_weights(length, ctx.real_dtype, grad_spectrum.device)
        return torch.fft.irfft(grad_spectrum * (length / weights), n=length)



def _kernel_spectrum(coeffs: Tensor, n: int, length: int, causal: bool) -> Tensor:
    """rFFT of the circulant column: ``(..., c, length // 2 + 1)`` complex."""
    return _RealSpectrum.apply(_circulant_column(coeffs, n, length, causal))



def _padded_rows(x: Tensor, length: int) -> Tensor:
    """``(..., n, c) -> (..., c, length)``: the sequence dimension moved last and padded
    with zeros to ``length``, written in one copy.

    ``torch.fft.rfft(x.transpose(-1, -2).contiguous(), n=length)`` copies the batch
    twice (the transpose, then the padding inside ``rfft``); this buffer is filled once.
    """
    n = x.shape[-2]
    rows = x.new_empty(x.shape[:-2] + (x.shape[-1], length))
    rows[..., :n].copy_(x.transpose(-1, -2))
    rows[..., n:].zero_()
    return rows



class _SpectralProduct(torch.autograd.Function):
    """``y = irfft(spectrum * rfft(x, L), L)[:n]`` along the sequence of ``(..., n, c)``.

    A hand-written backward, because autograd's backward of ``rfft`` runs a full-length
    complex FFT: with :math:`G = \\mathrm{rFFT}_L(g_y)`, the adjoint is
    :math:`g_x = \\mathrm{irFFT}_L(\\bar K G)_{0:n}` (the transposed Toeplitz matrix) and
    the spectrum's gradient is :math:`g_K = \\frac{w}{L}\\sum_{\\text{batch}} \\bar X G`
    (:math:`w = 2`, or 1 at DC and Nyquist, which ``irfft`` counts once and whose
    imaginary part it ignores). Everything is half-spectrum FFTs. The sequence dimension
    is moved last and zero-padded to ``L`` in one copy (:func:`_padded_rows`), since the
    FFT of contiguous rows is several times faster than a strided one. Once
    differentiable (double backward raises).
    """

    generate_vmap_rule = True

    @staticmethod
    def forward(  # type: ignore[override]
        x: Tensor, spectrum: Tensor, length: int
    ) -> tuple[Tensor, Tensor]:
        n = x.shape[-2]
        x_freq = torch.fft.rfft(_padded_rows(x, length))
        y = torch.fft.irfft(x_freq * spectrum.contiguous(), n=length)
        # x_freq is returned (and dropped by the caller) so that the backward can reuse it.
        return y[..., :n].transpose(-1, -2), x_freq

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: tuple) -> None:
        x, spectrum, length = inputs
        _, x_freq = output
        ctx.mark_non_differentiable(x_freq)
        ctx.n, ctx.length, ctx.real_dtype = x.shape[-2], length, x.dtype
        ctx.save_for_backward(x_freq if ctx.needs_input_grad[1] else None, spectrum)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(
        ctx: Any, grad_y: Tensor, _: Any
    ) -> tuple[Optional[Tensor], Optional[Tensor], None]:
        x_freq, spectrum = ctx.saved_tensors
        spectrum = spectrum.contiguous()
        n, length = ctx.n, ctx.length
        grad_freq = torch.fft.rfft(_padded_rows(grad_y, length))
        grad_x = grad_spectrum = None
        if ctx.needs_input_grad[1]:
            prod = (grad_freq * x_freq.conj()).sum_to_size(spectrum.shape)
            weights = _half_spectrum_weights(length, ctx.real_dtype, prod.device)
            grad_spectrum = prod * (weights / length)
        if ctx.needs_input_grad[0]:
            # grad_freq is ours and no longer needed: multiply in place (one batch-sized
            # temporary less)
            grad_x = torch.fft.irfft(grad_freq.mul_(spectrum.conj()), n=length)
            grad_x = grad_x[..., :n].transpose(-1, -2)
        return grad_x, grad_spectrum, None



def _check_fft_input(name: str, value: Any, **kwargs: Any) -> Tensor:
    """:func:`check_tensor`, and float32/float64 only: the FFTs have no float16 kernels.

    The finiteness test is one ``aminmax`` pass (NaN and infinities propagate to the
    minimum or maximum) instead of ``isfinite(value).all()``, which builds three
    temporaries of the input's size and cost more than the FFT product itself at
    ``n = 512`` (measured by ``benchmarks/bench_toeplitz.py``).
    """
    value = check_tensor(name, value, finite=False, **kwargs)
    if value.dtype not in (torch.float32, torch.float64):
        raise TypeError(f"{name} must be float32 or float64 (FFT), got {value.dtype}")
    if value.numel():
        low, high = torch.aminmax(value.detach())
        if not (math.isfinite(float(low)) and math.isfinite(float(high))):
            raise ValueError(f"{name} contains NaN or infinite values")
    return value



def _empty_like_result(shape: tuple[int, ...], x: Tensor, *params: Tensor) -> Tensor:
    """The result of a Toeplitz product with no elements (an empty batch, 0 channels).

    FFTs of empty tensors fail inside MKL, so this is the shortcut; the zero-size result
    stays connected to ``x`` and ``params`` in autograd (their gradients are zeros), as
    the dense product's would be.
    """
    out = x.new_zeros(shape)
    link = x.sum() * 0
    for p in params:
        link = link + p.sum().real * 0
    return out + link.to(out.dtype) if link.requires_grad else out



def _apply_spectrum(spectrum: Tensor, x: Tensor, length: int) -> Tensor:
    """``irfft(spectrum * rfft(x, L), L)`` along the sequence dimension of ``(..., n, c)``."""
    return _SpectralProduct.apply(x, spectrum, length)[0]



def _check_coeffs_and_x(coeffs: Any, x: Any, causal: bool) -> tuple[Tensor, Tensor, int]:
    x = _check_fft_input("x", x)
    coeffs = _check_fft_input("coeffs", coeffs)
    if x.ndim < 2:
        raise ValueError(
            f"x must have shape (..., n, channels) with at least 2 dimensions, got shape "
            f"{tuple(x.shape)}"
        )
    if coeffs.ndim < 2:
        raise ValueError(
            f"coeffs must have shape (..., channels, {'n' if causal else '2n - 1'}) with at "
            f"least 2 dimensions, got shape {tuple(coeffs.shape)}"
        )
    if coeffs.dtype != x.dtype:
        raise TypeError(
            f"coeffs and x must have the same dtype, got {coeffs.dtype} (coeffs) and "
            f"{x.dtype} (x)"
        )
    n = x.shape[-2]
    if n < 1:
        raise ValueError(f"x must have at least one token (x.shape[-2] >= 1), got shape {tuple(x.shape)}")
    want = n if causal else 2 * n - 1
    if coeffs.shape[-1] != want:
        kind = "causal coefficients (lags 0..n-1)" if causal else "lags -(n-1)..(n-1)"
        raise ValueError(
            f"coeffs must have length {want} in its last dimension ({kind}) for x with "
            f"n = {n} tokens (x.shape[-2]), got coeffs of shape {tuple(coeffs.shape)}"
        )
    if coeffs.shape[-2] not in (1, x.shape[-1]):
        raise ValueError(
            f"coeffs has {coeffs.shape[-2]} channels (coeffs.shape[-2]) but x has "
            f"{x.shape[-1]} (x.shape[-1]); they must match (or coeffs has 1 channel)"
        )
    try:
        torch.broadcast_shapes(coeffs.shape[:-2], x.shape[:-2])
    except RuntimeError:
        raise ValueError(
            f"the batch dimensions of coeffs {tuple(coeffs.shape[:-2])} and x "
            f"{tuple(x.shape[:-2])} do not broadcast"
        ) from None
    return coeffs, x, n



def toeplitz_matvec(coeffs: Tensor, x: Tensor, *, causal: bool = False) -> Tensor:
    """Toeplitz product :math:`y_i = \\sum_j t_{i-j}\\,x_j` per channel, by FFT.

    With :math:`L` = :func:`fft_length` ``(n)`` :math:`\\ge 2n-1`, the Toeplitz matrix
    :math:`T_{ij} = t_{i-j}` is the top-left ``n x n`` block of the :math:`L \\times L`
    circulant with first column :math:`c = (t_0, \\dots, t_{n-1}, 0, \\dots, 0,
    t_{-(n-1)}, \\dots, t_{-1})`, and a circulant is diagonalised by the DFT:

    .. math::
        y = \\big[\\mathcal F^{-1}\\{\\mathcal F\\{c\\} \\odot \\mathcal F\\{x \\text{
        zero-padded to } L\\}\\}\\big]_{0:n}

    (the paper, Section 3.1; Qin et al. 2023, Section 3.3). Each channel :math:`l` of
    ``x`` is multiplied by its own :math:`T^l`, as in the TNO output
    :math:`(T^1 x^1, \\dots, T^d x^d)`. Differentiable with respect to both arguments
    (the backward is the adjoint product, again by half-spectrum FFTs; first derivatives
    only). Derived in chapter 4 (chapters/04_toeplitz.ipynb), section "Toeplitz matrices
    and the circulant embedding".

    Shapes. ``x``: ``(..., n, c)`` (``n`` tokens, ``c`` channels). ``coeffs``:
    ``(..., c, 2n - 1)`` with the lags :math:`-(n-1), \\dots, n-1` in that order
    (``coeffs[..., n - 1 + k]`` is :math:`t_k`), or ``(..., c, n)`` with the lags
    :math:`0, \\dots, n-1` when ``causal=True`` (negative lags are zero: :math:`T` is
    lower triangular and :math:`y_i` depends on :math:`x_{0..i}` only). The leading
    dimensions broadcast (typically ``coeffs`` is ``(c, 2n - 1)``, shared by a batch
    ``x`` of ``(batch, n, c)``: its FFT is computed once); ``c`` may be 1 in ``coeffs``.
    Returns ``(..., n, c)`` in the dtype of ``x``.

    Cost: :math:`O(B\\,c\\,n \\log n)` for :math:`B` batch rows, against
    :math:`O(B\\,c\\,n^2)` for the dense product; memory :math:`O(B\\,c\\,n)`.

    Args:
        coeffs: Toeplitz coefficients (floating point, same dtype as ``x``).
        x: the sequences to mix (floating point).
        causal: whether ``coeffs`` holds only the lags :math:`0..n-1`.
    """
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {causal!r}")
    coeffs, x, n = _check_coeffs_and_x(coeffs, x, causal)
    shape = torch.broadcast_shapes(coeffs.shape[:-2], x.shape[:-2]) + x.shape[-2:]
    if math.prod(shape) == 0 or coeffs.numel() == 0:
        return _empty_like_result(shape, x, coeffs)
    length = fft_length(n)
    return _apply_spectrum(_kernel_spectrum(coeffs, n, length, causal), x, length)



def toeplitz_dense(coeffs: Tensor, n: Optional[int] = None, *, causal: bool = False) -> Tensor:
    """The dense Toeplitz matrix :math:`T_{ij} = t_{i-j}` from its coefficients.

    ``coeffs``: ``(..., 2n - 1)`` with the lags :math:`-(n-1), \\dots, n-1` (the layout
    of :func:`toeplitz_matvec`), or ``(..., n)`` with the lags :math:`0, \\dots, n-1`
    when ``causal=True`` (the strictly upper triangle is then zero). Returns
    ``(..., n, n)``; :math:`O(n^2)` memory per matrix. ``n``, when given, must agree
    with the length of ``coeffs``. Used by the tests and by chapter 4
    (chapters/04_toeplitz.ipynb), section "Toeplitz matrices and the circulant
    embedding".
    """
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {causal!r}")
    coeffs = check_tensor("coeffs", coeffs)
    if coeffs.ndim < 1:
        raise ValueError("coeffs must have at least 1 dimension (the lags)")
    length = coeffs.shape[-1]
    if causal:
        size = length
    else:
        if length % 2 == 0:
            raise ValueError(
                f"coeffs must have odd length 2n - 1 (lags -(n-1)..(n-1)), got {length}"
            )
        size = (length + 1) // 2
    if size < 1:
        raise ValueError("coeffs must not be empty")
    if n is not None:
        n = check_positive_int("n", n)
        if n != size:
            want = n if causal else 2 * n - 1
            raise ValueError(
                f"coeffs must have length {want} for n = {n}, got length {length}"
            )
    idx = torch.arange(size, device=coeffs.device)
    lag = idx[:, None] - idx[None, :]  # i - j
    if causal:
        dense = coeffs[..., lag.clamp(min=0)]
        return dense * (lag >= 0).to(coeffs.dtype)
    return coeffs[..., lag + size - 1]

