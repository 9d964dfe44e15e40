"""Toeplitz neural networks: the FFT Toeplitz product, TNO, SKI-TNO and FD-TNO.

This module is the package side of chapter 4 (``chapters/04_toeplitz.ipynb``). It holds

* the Toeplitz matrix-vector product :math:`y = T x`, :math:`T_{ij} = t_{i-j}`, by
  circulant embedding and the real FFT (:func:`toeplitz_matvec`), its causal variant,
  and the dense matrix for checks and plots (:func:`toeplitz_dense`);
* the baseline Toeplitz neural operator of Qin et al. (2023): an RPE MLP over relative
  positions times an exponential decay bias, one Toeplitz matrix per channel
  (:class:`TNO`, :func:`rpe_mlp`);
* the sparse plus low-rank SKI-TNO of Algorithm 1 (:class:`SKITNO`): a depthwise
  convolution for the band near the diagonal and an asymmetric structured kernel
  interpolation :math:`W A W^\\top` for the smooth rest (:func:`ski_matvec`,
  :func:`linear_interpolation_weights`, optionally :func:`cubic_interpolation_weights`,
  :func:`inverse_time_warp`, :class:`PiecewiseLinearRPE`);
* the frequency-domain FD-TNO of Algorithm 2 (:class:`FDTNO`): the RPE gives the
  kernel's frequency response, causality through the discrete Hilbert transform
  (:func:`discrete_hilbert`, :func:`causal_kernel_from_real_response`);
* a minimal TNN: gated Toeplitz unit, GLU channel mixer, pre-norm residual block and an
  encoder whose token mixer is chosen by name (:class:`TNNBlock`, :class:`TNNEncoder`,
  :func:`make_tno`);
* the material of the decay study (Theorems 2-4): a random RPE MLP's frequency
  response and the decay of its time-domain kernel (:func:`frequency_response_decay`).

References (keys of ``book/references.bib`` where present):

* Qin et al. (2023), *Toeplitz Neural Network for Sequence Modeling* -- TNN, TNO, GTU,
  RPE and the decay bias.
* Moreno et al. (2023), *SKI to go Faster: Accelerating Toeplitz Neural Networks via
  Asymmetric Kernels* -- SKI-TNO (Algorithm 1, Section 3.2), FD-TNO (Algorithm 2,
  Section 3.3), Proposition 1 and Theorems 1-4. "The paper" below means this one.
* Wilson & Nickisch (2015), *Kernel Interpolation for Scalable Structured Gaussian
  Processes (KISS-GP)* -- structured kernel interpolation.
* Oppenheim & Schafer (2010), *Discrete-Time Signal Processing* -- the Hilbert
  transform relation of a causal sequence.

Conventions used throughout:

* sequences are ``(..., n, d)`` tensors: ``n`` tokens (the sequence dimension that a
  Toeplitz matrix mixes), ``d`` channels (each channel has its own Toeplitz matrix),
  any leading batch dimensions -- the layout of a TNN layer;
* the coefficients of an ``n x n`` Toeplitz matrix are a tensor whose last dimension
  has length ``2n - 1`` and lists the lags :math:`-(n-1), \\dots, -1, 0, 1, \\dots,
  n-1` in that order, so ``coeffs[..., n - 1 + k]`` is :math:`t_k` and
  :math:`T_{ij} = ` ``coeffs[..., n - 1 + i - j]``. A causal (lower-triangular) matrix
  has only the lags :math:`0, \\dots, n-1`: length ``n``, ``coeffs[..., k]`` is
  :math:`t_k`;
* every module draws its initial parameters from an explicit ``generator`` (``None``:
  torch's default generator) and never touches global state otherwise;
* the FFT and band products have hand-written backward passes (autograd's backward of
  ``rfft`` and of depthwise convolutions is several times slower on CPUs): gradients,
  ``torch.func.jacrev`` and ``vmap`` work, double backward raises an error;
* empty input (a batch of 0 sequences, 0 channels) gives an empty result, never an
  FFT error; a sequence needs at least one token;
* NaN and Inf: the functions (:func:`toeplitz_matvec`, :func:`ski_matvec`, ...) reject
  them with a ``ValueError`` naming the argument; the modules (:class:`TNO`,
  :class:`SKITNO`, :class:`FDTNO`) skip that extra pass over their input on the hot
  path, and a non-finite entry then spreads through the FFT to every token of its
  channel (and batch row), as it would through the dense product.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, NamedTuple, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from kernels._checks import check_choice, check_positive_int, check_tensor

__all__ = [
    "toeplitz_matvec",
    "toeplitz_dense",
    "fft_length",
    "rpe_mlp",
    "TNO",
    "inverse_time_warp",
    "inducing_points",
    "linear_interpolation_weights",
    "cubic_interpolation_weights",
    "interpolation_weights",
    "ski_matvec",
    "PiecewiseLinearRPE",
    "SKITNO",
    "discrete_hilbert",
    "causal_kernel_from_real_response",
    "FDTNO",
    "make_tno",
    "GTU",
    "GLU",
    "TNNBlock",
    "TNNEncoder",
    "DecayCurve",
    "frequency_response_decay",
    "TNO_KINDS",
    "RPE_ACTIVATIONS",
    "RPE_FEATURES",
    "SKI_METHODS",
    "SKI_INTERPOLATIONS",
]

#: Token mixers accepted by :func:`make_tno`, :class:`TNNBlock` and :class:`TNNEncoder`.
TNO_KINDS = ("tno", "ski", "fd")
#: Activations of :func:`rpe_mlp` (the three of Theorems 2-4).
RPE_ACTIVATIONS = ("relu", "gelu", "silu")
#: Inputs of a frequency-domain RPE: ``"omega"`` is :math:`\omega/\pi \in [0, 1]` (the
#: paper's :math:`\mathrm{RPE}(\omega)`), ``"cos"`` is :math:`\cos\omega` (a smooth
#: even 2pi-periodic response).
RPE_FEATURES = ("omega", "cos")
#: Ways :func:`ski_matvec` applies :math:`W A W^\top`.
SKI_METHODS = ("sparse", "dense")
#: Interpolation schemes of the SKI weights W: two-tap linear (the paper) or four-tap
#: cubic convolution (Keys, a = -1/2; the paper mentions cubic as an option).
SKI_INTERPOLATIONS = ("linear", "cubic")


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


# --------------------------------------------------------------------------------------
# Small local checks and initialisation helpers
# --------------------------------------------------------------------------------------


def _check_generator(generator: object) -> None:
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(
            f"generator must be a torch.Generator or None, got {type(generator).__name__}"
        )


def _check_float_dtype(name: str, dtype: object) -> torch.dtype:
    if dtype is None:
        return torch.get_default_dtype()
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"{name} must be a floating-point torch.dtype, got {dtype!r}")
    return dtype


def _check_bool(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {value!r}")
    return value


def _check_decay(decay: object) -> float:
    if isinstance(decay, bool) or not isinstance(decay, numbers.Real):
        raise TypeError(f"decay (lambda) must be a real number in (0, 1), got {decay!r}")
    value = float(decay)
    if not 0.0 < value < 1.0:
        raise ValueError(f"decay (lambda) must lie in the open interval (0, 1), got {decay!r}")
    return value


def _check_sequence(x: Any, channels: int, dtype: torch.dtype) -> Tensor:
    """Module-boundary check of a ``(..., n, channels)`` input (no finiteness pass)."""
    x = check_tensor("x", x, finite=False)
    if x.ndim < 2 or x.shape[-1] != channels:
        raise ValueError(
            f"x must have shape (..., n, {channels}) (channels last), got shape "
            f"{tuple(x.shape)}"
        )
    if x.shape[-2] < 1:
        raise ValueError("x must have at least one token (x.shape[-2] >= 1)")
    if x.dtype != dtype:
        raise TypeError(
            f"x has dtype {x.dtype} but the module's parameters are {dtype}; convert one "
            f"of them (e.g. module.to({x.dtype}))"
        )
    return x


def _linear(
    in_features: int,
    out_features: int,
    generator: Optional[torch.Generator],
    dtype: torch.dtype,
    bias: bool = True,
) -> nn.Linear:
    """``nn.Linear`` with torch's default init, drawn from ``generator`` only."""
    layer = torch.nn.utils.skip_init(nn.Linear, in_features, out_features, bias=bias, dtype=dtype)
    bound = 1.0 / math.sqrt(in_features)  # = kaiming_uniform_(a=sqrt(5)), nn.Linear's default
    with torch.no_grad():
        nn.init.uniform_(layer.weight, -bound, bound, generator=generator)
        if bias:
            nn.init.uniform_(layer.bias, -bound, bound, generator=generator)
    return layer


def _activation(name: str) -> nn.Module:
    return {"relu": nn.ReLU, "gelu": nn.GELU, "silu": nn.SiLU}[name]()


# --------------------------------------------------------------------------------------
# RPE MLP and the baseline TNO
# --------------------------------------------------------------------------------------


def rpe_mlp(
    activation: str = "relu",
    width: int = 32,
    depth: int = 3,
    *,
    layer_norm: bool = True,
    in_features: int = 1,
    out_features: int = 1,
    generator: Optional[torch.Generator] = None,
    dtype: Optional[torch.dtype] = None,
) -> nn.Sequential:
    """Relative positional encoder: an MLP from a scalar position to channel values.

    ``Sequential(Linear(in, w), [LayerNorm(w)], act, (Linear(w, w), [LayerNorm(w)],
    act) x (depth - 1), Linear(w, out))``: ``depth`` hidden layers of width ``w``, each
    affine map followed by an optional layer norm and the activation, and an affine
    output without activation -- the RPE of Qin et al. (2023, Section 3.4) with layer
    norm in place of their RMS norm. With ``"relu"`` it is the network of Proposition 1:
    without layer norm it is piecewise linear and continuous in its scalar input; with
    the standard layer norm after the (biased) first affine map it is only
    asymptotically so, since :math:`\\mathrm{LN}(a u + b)` divides by the square root of a
    quadratic in :math:`u` (chapter 4 checks both numerically). As a function
    of frequency it is the MLP of Theorems 2-4 (``"gelu"``: time-domain decay faster
    than any exponential, for an MLP without layer norm, the theorem's assumption; with
    layer norm the response is analytic only in a strip and the decay is exponential;
    ``"silu"``: faster than any polynomial; ``"relu"``: square summable by the theorem,
    and in fact :math:`O(t^{-2})`, absolutely summable). Derived in chapter 4
    (chapters/04_toeplitz.ipynb), sections "The Toeplitz neural operator" and
    "Smoothness in frequency, decay in time".

    Shapes: ``(N, in_features) -> (N, out_features)``; cost
    :math:`O(N\\,(\\text{depth}\\,w^2 + w\\,\\text{out}))`.

    Args:
        activation: ``"relu"``, ``"gelu"`` or ``"silu"``.
        width, depth: hidden width and number of hidden layers (positive ints).
        layer_norm: insert ``LayerNorm`` (with affine parameters) before each activation.
        in_features, out_features: input and output sizes.
        generator: randomness of the initialisation (torch's ``nn.Linear`` default
            distribution, drawn from this generator).
        dtype: parameter dtype (``None``: ``torch.get_default_dtype()``).
    """
    check_choice("activation", activation, RPE_ACTIVATIONS)
    width = check_positive_int("width", width)
    depth = check_positive_int("depth", depth)
    in_features = check_positive_int("in_features", in_features)
    out_features = check_positive_int("out_features", out_features)
    _check_bool("layer_norm", layer_norm)
    _check_generator(generator)
    dtype = _check_float_dtype("dtype", dtype)
    layers: list[nn.Module] = []
    fan_in = in_features
    for _ in range(depth):
        layers.append(_linear(fan_in, width, generator, dtype))
        if layer_norm:
            layers.append(nn.LayerNorm(width, dtype=dtype))
        layers.append(_activation(activation))
        fan_in = width
    layers.append(_linear(fan_in, out_features, generator, dtype))
    return nn.Sequential(*layers)


class TNO(nn.Module):
    """Toeplitz neural operator of Qin et al. (2023): RPE MLP times decay bias.

    Channel :math:`l` of the input is mixed over tokens by the Toeplitz matrix

    .. math::
        T^l_{ij} = \\lambda^{|i-j|}\\,\\mathrm{RPE}_l(i - j),

    the paper's Section 3.1 equation, i.e. the pseudo-Gram matrix of the non-SPD
    stationary kernel :math:`k_l(t) = \\lambda^{|t|}\\mathrm{RPE}_l(t)`, and
    :math:`\\mathrm{TNO}(X) = (T^1 x^1, \\dots, T^d x^d)`. The RPE (:func:`rpe_mlp`,
    ReLU and layer norm by default) receives the integer lag :math:`t` as a float, as
    in Qin et al.; it is evaluated at the :math:`2n-1` lags :math:`-(n-1)..n-1`
    (bidirectional) or the :math:`n` lags :math:`0..n-1` (``causal=True``: the negative
    lags are zero, so token :math:`i` sees tokens :math:`\\le i` only). The product is
    :func:`toeplitz_matvec`. Derived in chapter 4 (chapters/04_toeplitz.ipynb), section
    "The Toeplitz neural operator".

    Shapes: ``(..., n, channels) -> (..., n, channels)``. Cost per call: the RPE on
    :math:`O(n)` lags, :math:`O(n\\,(\\text{depth}\\,w^2 + w\\,d))`, one FFT of the
    ``d`` kernels and :math:`O(B\\,d\\,n\\log n)` for the ``B`` batch rows.

    Args:
        channels: ``d``, the number of channels (one Toeplitz matrix each).
        causal: lower-triangular (autoregressive) mixing.
        decay: :math:`\\lambda \\in (0, 1)`, the exponential decay bias.
        rpe_width, rpe_depth, activation: the RPE MLP (see :func:`rpe_mlp`).
        generator, dtype: initialisation randomness and parameter dtype.
    """

    def __init__(
        self,
        channels: int,
        *,
        causal: bool = False,
        decay: float = 0.99,
        rpe_width: int = 32,
        rpe_depth: int = 3,
        activation: str = "relu",
        generator: Optional[torch.Generator] = None,
        dtype: Optional[torch.dtype] = None,
    ) -> None:
        super().__init__()
        self.channels = check_positive_int("channels", channels)
        self.causal = _check_bool("causal", causal)
        self.decay = _check_decay(decay)
        self.rpe = rpe_mlp(
            activation,
            rpe_width,
            rpe_depth,
            layer_norm=True,
            out_features=self.channels,
            generator=generator,
            dtype=dtype,
        )

    @property
    def dtype(self) -> torch.dtype:
        return self.rpe[0].weight.dtype

    def _coeffs(self, n: int) -> Tensor:
        weight = self.rpe[0].weight
        start = 0 if self.causal else -(n - 1)
        lags = torch.arange(start, n, dtype=weight.dtype, device=weight.device)
        bias = torch.exp(lags.abs() * math.log(self.decay))  # lambda^|t|
        return (self.rpe(lags[:, None]) * bias[:, None]).T

    def toeplitz_coeffs(self, n: int) -> Tensor:
        """The coefficients :math:`\\lambda^{|t|}\\mathrm{RPE}(t)` for sequence length ``n``.

        ``(channels, 2n - 1)`` for the lags :math:`-(n-1)..n-1`, or ``(channels, n)``
        for the lags :math:`0..n-1` when causal -- the layout of
        :func:`toeplitz_matvec` with ``causal=self.causal``.
        """
        return self._coeffs(check_positive_int("n", n))

    def dense_matrix(self, n: int) -> Tensor:
        """The ``(channels, n, n)`` Toeplitz matrices :math:`T^l` (for plots and checks)."""
        return toeplitz_dense(self.toeplitz_coeffs(n), causal=self.causal)

    def forward(self, x: Tensor) -> Tensor:
        x = _check_sequence(x, self.channels, self.dtype)
        if x.numel() == 0:  # an empty batch
            return _empty_like_result(tuple(x.shape), x, *self.parameters())
        n = x.shape[-2]
        length = fft_length(n)
        spectrum = _kernel_spectrum(self._coeffs(n), n, length, self.causal)
        return _apply_spectrum(spectrum, x, length)

    def extra_repr(self) -> str:
        return f"channels={self.channels}, causal={self.causal}, decay={self.decay}"


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
    dtype = _check_float_dtype("dtype", dtype)
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
    dtype = _check_float_dtype("dtype", dtype)
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
    dtype = _check_float_dtype("dtype", dtype)
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
        _check_generator(generator)
        dtype = _check_float_dtype("dtype", dtype)
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
        _check_generator(generator)
        dtype = _check_float_dtype("dtype", dtype)
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


# --------------------------------------------------------------------------------------
# FD-TNO (Algorithm 2)
# --------------------------------------------------------------------------------------


def discrete_hilbert(x: Tensor) -> Tensor:
    """Discrete Hilbert transform of periodic sequences along the last dimension.

    :math:`\\mathcal H\\{x\\} = \\mathcal F^{-1}\\{-i\\,\\mathrm{sign}(k)\\,\\mathcal
    F\\{x\\}[k]\\}` with the DC and (even length) Nyquist bins set to zero, computed
    with one rFFT and one irFFT: the imaginary part of the analytic signal
    ``scipy.signal.hilbert(x)``, and the circular form of the paper's Definition 1
    (convolution with :math:`h[l] = 2/(\\pi l)`, :math:`l` odd). Real input of shape
    ``(..., N)``, :math:`N \\ge 1`; returns ``(..., N)``; :math:`O(N \\log N)`. Derived
    in chapter 4 (chapters/04_toeplitz.ipynb), section "Hilbert transform and
    causality".
    """
    x = _check_fft_input("x", x)
    if x.ndim < 1 or x.shape[-1] < 1:
        raise ValueError(f"x must have a non-empty last dimension, got shape {tuple(x.shape)}")
    size = x.shape[-1]
    if x.numel() == 0:
        return _empty_like_result(tuple(x.shape), x)
    spectrum = torch.fft.rfft(x)
    mask = torch.zeros(spectrum.shape[-1], dtype=x.dtype, device=x.device)
    mask[1 : (size + 1) // 2] = 1.0  # positive frequencies, without DC and Nyquist
    # -i * X  ==  (imag(X), -real(X))
    rotated = torch.complex(spectrum.imag * mask, -spectrum.real * mask)
    return torch.fft.irfft(rotated, n=size)


def _causal_window(n: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """``[1, 2, ..., 2, 1, 0, ..., 0]`` of length ``2n``: the causal half of an even kernel."""
    window = torch.zeros(2 * n, dtype=dtype, device=device)
    window[0] = 1.0
    window[1:n] = 2.0
    window[n] = 1.0
    return window


class _CausalResponse(torch.autograd.Function):
    """``rfft(window * irfft(real, 2n))`` with a half-spectrum backward.

    The map is real-linear; with :math:`c` = :func:`_half_spectrum_weights` ``(2n)`` and
    :math:`u` the causal window, its adjoint is :math:`g_{\\text{real}} = \\mathrm{Re}\\,
    \\mathrm{rFFT}(u \\cdot \\mathrm{irFFT}(g_K / c)) \\cdot c`: one inverse and one forward
    half-size FFT, where autograd would run a full-length complex FFT.
    """

    generate_vmap_rule = True

    @staticmethod
    def forward(real: Tensor) -> Tensor:  # type: ignore[override]
        n = real.shape[-1] - 1
        even_kernel = torch.fft.irfft(real, n=2 * n)
        return torch.fft.rfft(even_kernel * _causal_window(n, real.dtype, real.device))

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: Tensor) -> None:
        ctx.n = inputs[0].shape[-1] - 1
        ctx.real_dtype = inputs[0].dtype

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad_response: Tensor) -> Tensor:
        n = ctx.n
        counts = _half_spectrum_weights(2 * n, ctx.real_dtype, grad_response.device)
        grad_kernel = torch.fft.irfft(grad_response / counts, n=2 * n)
        grad_kernel = grad_kernel * _causal_window(n, ctx.real_dtype, grad_response.device)
        return torch.fft.rfft(grad_kernel).real * counts


def _causal_response(real: Tensor) -> Tensor:
    return _CausalResponse.apply(real)


class _CausalSpectrum(torch.autograd.Function):
    r"""Spectrum, at FFT length ``L``, of the causal kernel whose response has real part ``real``.

    The forward pass of a causal :class:`FDTNO` in one step: ``real`` is ``(..., n + 1)``
    on the grid :math:`\omega_m = m\pi/n`; :math:`k_e = \mathrm{irFFT}_{2n}(\text{real})`
    is the even kernel, the causal kernel is :math:`k_e\,(1 + \mathrm{sign}\,t)`, and the
    result is :math:`\mathrm{rFFT}_L` of its lags :math:`0..n-1` zero-padded to ``L``
    (``(..., L // 2 + 1)`` complex). Lag :math:`n` is left out: it reaches no output
    :math:`y_i`, :math:`i < n`. Compared with :func:`causal_kernel_from_real_response`
    followed by the product at length :math:`2n`, this is the same Hilbert projection,
    folded into the kernel's spectrum once per forward (it depends on the parameters
    only), at the product's own length :math:`L` = :func:`fft_length` ``(n)`` (5-smooth,
    where :math:`2n` need not be), without the complex response on the :math:`2n` grid.
    Two FFTs of the ``d`` kernel rows each way: :math:`O(d\,n\log n)`.

    Backward (real-linear map): with :math:`w_L` = :func:`_half_spectrum_weights` ``(L)``
    and :math:`c` = :func:`_half_spectrum_weights` ``(2n)``, the adjoint of the padded
    rFFT is :math:`\tfrac{L}{w_L}`-weighted irFFT (as in :class:`_RealSpectrum`), of the
    window a product, and of :math:`\mathrm{irFFT}_{2n}` restricted to a real response
    :math:`g_m = \tfrac{c_m}{2n}\,\mathrm{Re}\,\mathrm{rFFT}_{2n}(g_{k_e})_m`.
    """

    generate_vmap_rule = True

    @staticmethod
    def forward(real: Tensor, length: int) -> Tensor:  # type: ignore[override]
        n = real.shape[-1] - 1
        even_kernel = torch.fft.irfft(real, n=2 * n)
        taps = even_kernel[..., :n] * _causal_window(n, real.dtype, real.device)[:n]
        # out-of-place (no out= buffer): the generated vmap rule, e.g. over stacked
        # parameters of several layers, has no batching rule for out= variants
        return torch.fft.rfft(F.pad(taps, (0, length - n)))

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: Tensor) -> None:
        real, length = inputs
        ctx.n, ctx.length, ctx.real_dtype = real.shape[-1] - 1, length, real.dtype

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad_spectrum: Tensor) -> tuple[Tensor, None]:
        n, length, dtype = ctx.n, ctx.length, ctx.real_dtype
        device = grad_spectrum.device
        weights = _half_spectrum_weights(length, dtype, device)
        grad_rows = torch.fft.irfft(grad_spectrum * (length / weights), n=length)
        grad_even = grad_rows[..., :n] * _causal_window(n, dtype, device)[:n]
        counts = _half_spectrum_weights(2 * n, dtype, device)
        grad_real = torch.fft.rfft(grad_even, n=2 * n).real * (counts / (2 * n))
        return grad_real, None


def causal_kernel_from_real_response(real: Tensor) -> Tensor:
    """Frequency response of the causal kernel whose real part is ``real``.

    ``real`` holds an even real response :math:`\\hat k(\\omega_m)` at
    :math:`\\omega_m = m\\pi/n`, :math:`m = 0..n` (the rFFT grid of length :math:`2n`).
    Returns the complex :math:`\\hat k_{\\text{causal}} = \\hat k - i\\,\\mathcal H\\{\\hat
    k\\}` on the same grid (Algorithm 2), where :math:`\\mathcal H` acts on the even
    :math:`2n`-periodic extension of :math:`\\hat k`. Its inverse rFFT of length
    :math:`2n` is zero at the negative lags :math:`n+1..2n-1`: the kernel is causal,
    with taps at lags :math:`0..n`.

    Computed with one irFFT and one rFFT: :math:`k_e = \\mathcal F^{-1}\\{\\hat k\\}` is
    even, and :math:`k_{\\text{causal}} = k_e\\,(1 + \\mathrm{sign}(t))` (weights
    :math:`1, 2, \\dots, 2, 1, 0, \\dots, 0`) has DFT :math:`\\hat k - i\\mathcal
    H\\{\\hat k\\}` (Oppenheim & Schafer 2010, Section 12.1). Shapes ``(..., n + 1) ->
    (..., n + 1)`` complex, :math:`n \\ge 1`; :math:`O(n \\log n)`. Derived in chapter 4
    (chapters/04_toeplitz.ipynb), section "Hilbert transform and causality".
    """
    real = _check_fft_input("real", real)
    if real.ndim < 1 or real.shape[-1] < 2:
        raise ValueError(
            f"real must have length n + 1 >= 2 in its last dimension (omega = m pi / n, "
            f"m = 0..n), got shape {tuple(real.shape)}"
        )
    if real.numel() == 0:
        return _empty_like_result(tuple(real.shape), real).to(torch.promote_types(real.dtype, torch.complex64))
    return _causal_response(real)


def _frequency_features(n: int, feature: str, dtype: torch.dtype, device: torch.device) -> Tensor:
    omega = torch.arange(n + 1, dtype=torch.float64, device=device) * (math.pi / n)
    feat = omega / math.pi if feature == "omega" else torch.cos(omega)
    return feat.to(dtype)[:, None]


class FDTNO(nn.Module):
    """Frequency-domain TNO (Algorithm 2 and Section 3.3.2).

    The RPE MLP models the kernel's frequency response on the rFFT grid
    :math:`\\omega_m = m\\pi/n`, :math:`m = 0..n` (input feature ``"omega"``:
    :math:`\\omega/\\pi`, or ``"cos"``: :math:`\\cos\\omega`), and

    .. math::
        y^l = \\mathcal F^{-1}\\{\\hat k^l \\odot \\mathcal F\\{x^l\\}\\}_{0:n}

    with rFFTs of length :math:`2n`:

    * ``causal=True``: the RPE gives the real part :math:`\\hat k^l`, the response is
      :math:`\\hat k^l - i\\mathcal H\\{\\hat k^l\\}`
      (:func:`causal_kernel_from_real_response`), so :math:`y_i` depends on
      :math:`x_{0..i}` only. The forward pass folds this projection into the kernel's
      spectrum once per call (:class:`_CausalSpectrum`: the causal taps
      :math:`0..n-1`, transformed at the product's 5-smooth length :func:`fft_length`
      ``(n)``); the result equals the product with the response above;
    * ``causal=False``: the RPE has :math:`2d` outputs, the real and imaginary parts of
      :math:`\\hat k^l`; the imaginary part is forced to 0 at :math:`\\omega = 0` and
      :math:`\\pi` (the response of a real kernel). No FFT of the kernel is needed --
      one fewer than :class:`TNO`.

    No decay bias: the smoothness of the response sets the decay of the kernel
    (Theorems 2-4). The equivalent Toeplitz coefficients are
    :meth:`toeplitz_coeffs`. Derived in chapter 4 (chapters/04_toeplitz.ipynb),
    section "Frequency domain: FD-TNO".

    Shapes: ``(..., n, channels) -> (..., n, channels)``. Cost per call: the RPE on
    :math:`n + 1` frequencies, :math:`O(d\\,n\\log n)` for the Hilbert transform
    (causal) and :math:`O(B\\,d\\,n\\log n)` for the batch.
    On a CPU the causal FD-TNO costs about as much as the causal :class:`TNO`: both
    evaluate the RPE at about :math:`n` points and share the product with the batch,
    and the Hilbert projection takes two FFTs of the ``d`` kernels each way where the
    TNO takes one (``benchmarks/bench_toeplitz.py``, table "limits").

    Args:
        channels: ``d``.
        causal: autoregressive (Hilbert) or bidirectional.
        rpe_width, rpe_depth, activation: the RPE MLP (see :func:`rpe_mlp`).
        feature: ``"omega"`` or ``"cos"`` (see :data:`RPE_FEATURES`).
        generator, dtype: initialisation randomness and parameter dtype.
    """

    def __init__(
        self,
        channels: int,
        *,
        causal: bool = False,
        rpe_width: int = 32,
        rpe_depth: int = 3,
        activation: str = "relu",
        feature: str = "omega",
        generator: Optional[torch.Generator] = None,
        dtype: Optional[torch.dtype] = None,
    ) -> None:
        super().__init__()
        self.channels = check_positive_int("channels", channels)
        self.causal = _check_bool("causal", causal)
        self.feature = check_choice("feature", feature, RPE_FEATURES)
        out = self.channels if self.causal else 2 * self.channels
        self.rpe = rpe_mlp(
            activation,
            rpe_width,
            rpe_depth,
            layer_norm=True,
            out_features=out,
            generator=generator,
            dtype=dtype,
        )

    @property
    def dtype(self) -> torch.dtype:
        return self.rpe[0].weight.dtype

    def _response(self, n: int) -> Tensor:
        weight = self.rpe[0].weight
        out = self.rpe(_frequency_features(n, self.feature, weight.dtype, weight.device)).T
        if self.causal:
            return _causal_response(out.contiguous())
        d = self.channels
        imag = out[d:]
        # A real kernel has a real response at omega = 0 and omega = pi.
        imag = torch.cat([imag.new_zeros(d, 1), imag[:, 1:n], imag.new_zeros(d, 1)], dim=1)
        # contiguous: the batch-sized products with this spectrum are ~2x slower strided
        return torch.complex(out[:d].contiguous(), imag)

    def frequency_response(self, n: int) -> Tensor:
        """``(channels, n + 1)`` complex: :math:`\\hat k^l(\\omega_m)`, :math:`\\omega_m =
        m\\pi/n`."""
        return self._response(check_positive_int("n", n))

    def toeplitz_coeffs(self, n: int) -> Tensor:
        """Equivalent Toeplitz coefficients for length ``n``, layout of :func:`toeplitz_matvec`.

        The kernel is :math:`k = \\mathrm{irFFT}_{2n}(\\hat k)`; lag :math:`t \\ge 0` is
        ``k[t]`` and lag :math:`-t` is ``k[2n - t]``. ``(channels, 2n - 1)``, or
        ``(channels, n)`` (lags :math:`0..n-1`) when causal.
        """
        n = check_positive_int("n", n)
        kernel = torch.fft.irfft(self._response(n), n=2 * n)
        if self.causal:
            return kernel[:, :n]
        return torch.cat([kernel[:, n + 1 :], kernel[:, :n]], dim=1)

    def dense_matrix(self, n: int) -> Tensor:
        """``(channels, n, n)``: the Toeplitz matrices the layer applies."""
        return toeplitz_dense(self.toeplitz_coeffs(n), causal=self.causal)

    def forward(self, x: Tensor) -> Tensor:
        x = _check_sequence(x, self.channels, self.dtype)
        if x.numel() == 0:  # an empty batch
            return _empty_like_result(tuple(x.shape), x, *self.parameters())
        n = x.shape[-2]
        if self.causal:
            # The causal kernel goes through the time domain anyway: its spectrum is
            # taken at the 5-smooth length of the product (2n need not be 5-smooth).
            length = fft_length(n)
            weight = self.rpe[0].weight
            real = self.rpe(_frequency_features(n, self.feature, weight.dtype, weight.device))
            spectrum = _CausalSpectrum.apply(real.T.contiguous(), length)
            return _apply_spectrum(spectrum, x, length)
        return _apply_spectrum(self._response(n), x, 2 * n)

    def extra_repr(self) -> str:
        return f"channels={self.channels}, causal={self.causal}, feature={self.feature!r}"


# --------------------------------------------------------------------------------------
# TNN blocks
# --------------------------------------------------------------------------------------


def make_tno(
    kind: str,
    channels: int,
    *,
    causal: bool = False,
    generator: Optional[torch.Generator] = None,
    dtype: Optional[torch.dtype] = None,
    **options: Any,
) -> nn.Module:
    """Token mixer by name: ``"tno"`` (:class:`TNO`), ``"ski"`` (:class:`SKITNO`) or
    ``"fd"`` (:class:`FDTNO`).

    ``options`` go to the constructor (e.g. ``decay``, ``rpe_width``, ``rank``,
    ``filter_size``). ``"ski"`` with ``causal=True`` is a ``ValueError``: SKI-TNO is
    bidirectional only. Used by chapter 4 (chapters/04_toeplitz.ipynb), section
    "Accuracy", to train the three variants on the same tasks.
    """
    kind = check_choice("kind", kind, TNO_KINDS)
    _check_bool("causal", causal)
    if kind == "tno":
        return TNO(channels, causal=causal, generator=generator, dtype=dtype, **options)
    if kind == "fd":
        return FDTNO(channels, causal=causal, generator=generator, dtype=dtype, **options)
    if causal:
        raise ValueError(
            "tno='ski' is bidirectional only (causal masking negates SKI's benefits, the "
            "paper's Appendix B); use tno='fd' or 'tno' for causal models"
        )
    return SKITNO(channels, generator=generator, dtype=dtype, **options)


class GTU(nn.Module):
    """Gated Toeplitz unit (Qin et al. 2023, Section 3.2): token and channel mixing.

    :math:`\\mathrm{GTU}(X) = \\big(\\phi(X W_u) \\odot \\mathrm{TNO}(\\phi(X W_v))\\big)
    W_o` with :math:`\\phi` = SiLU, :math:`W_u, W_v \\in \\mathbb R^{d \\times e}`,
    :math:`W_o \\in \\mathbb R^{e \\times d}` (biases included) and the token mixer
    acting on :math:`e` channels. Shapes ``(..., n, d) -> (..., n, d)``. Derived in
    chapter 4 (chapters/04_toeplitz.ipynb), section "A TNN block".
    """

    def __init__(
        self,
        channels: int,
        hidden: int,
        mixer: nn.Module,
        *,
        generator: Optional[torch.Generator] = None,
        dtype: Optional[torch.dtype] = None,
    ) -> None:
        super().__init__()
        channels = check_positive_int("channels", channels)
        hidden = check_positive_int("hidden", hidden)
        if not isinstance(mixer, nn.Module):
            raise TypeError(f"mixer must be an nn.Module, got {type(mixer).__name__}")
        _check_generator(generator)
        dtype = _check_float_dtype("dtype", dtype)
        self.u_proj = _linear(channels, hidden, generator, dtype)
        self.v_proj = _linear(channels, hidden, generator, dtype)
        self.mixer = mixer
        self.out_proj = _linear(hidden, channels, generator, dtype)

    def forward(self, x: Tensor) -> Tensor:
        u = F.silu(self.u_proj(x))
        v = self.mixer(F.silu(self.v_proj(x)))
        return self.out_proj(u * v)


class GLU(nn.Module):
    """Gated linear unit channel mixer (Shazeer 2020): :math:`(\\phi(X W_1) \\odot X W_2) W_3`.

    :math:`\\phi` = SiLU; shapes ``(..., n, d) -> (..., n, d)``, cost
    :math:`O(n\\,d\\,h)`. Derived in chapter 4 (chapters/04_toeplitz.ipynb), section "A
    TNN block".
    """

    def __init__(
        self,
        channels: int,
        hidden: int,
        *,
        generator: Optional[torch.Generator] = None,
        dtype: Optional[torch.dtype] = None,
    ) -> None:
        super().__init__()
        channels = check_positive_int("channels", channels)
        hidden = check_positive_int("hidden", hidden)
        _check_generator(generator)
        dtype = _check_float_dtype("dtype", dtype)
        self.gate_proj = _linear(channels, hidden, generator, dtype)
        self.value_proj = _linear(channels, hidden, generator, dtype)
        self.out_proj = _linear(hidden, channels, generator, dtype)

    def forward(self, x: Tensor) -> Tensor:
        return self.out_proj(F.silu(self.gate_proj(x)) * self.value_proj(x))


class TNNBlock(nn.Module):
    """One TNN layer: pre-norm residual GTU (token mixing) then GLU (channel mixing).

    :math:`X \\leftarrow X + \\mathrm{GTU}(\\mathrm{LN}(X))`,
    :math:`X \\leftarrow X + \\mathrm{GLU}(\\mathrm{LN}(X))` (Qin et al. 2023, Figure 2;
    the paper's Figure 3), with the GTU's token mixer chosen by ``tno`` (see
    :func:`make_tno`). Shapes ``(..., n, d) -> (..., n, d)``. Derived in chapter 4
    (chapters/04_toeplitz.ipynb), section "A TNN block".

    Args:
        channels: model width ``d``.
        tno: ``"tno"``, ``"ski"`` or ``"fd"``.
        causal: autoregressive token mixing (not with ``"ski"``).
        gtu_expand, glu_expand: hidden widths of the GTU and the GLU as multiples of
            ``d`` (positive ints).
        tno_options: keyword arguments of the token mixer (e.g. ``{"rank": 32}``).
        generator, dtype: initialisation randomness and parameter dtype.
    """

    def __init__(
        self,
        channels: int,
        *,
        tno: str = "tno",
        causal: bool = False,
        gtu_expand: int = 1,
        glu_expand: int = 1,
        tno_options: Optional[dict[str, Any]] = None,
        generator: Optional[torch.Generator] = None,
        dtype: Optional[torch.dtype] = None,
    ) -> None:
        super().__init__()
        self.channels = check_positive_int("channels", channels)
        gtu_hidden = self.channels * check_positive_int("gtu_expand", gtu_expand)
        glu_hidden = self.channels * check_positive_int("glu_expand", glu_expand)
        if tno_options is not None and not isinstance(tno_options, dict):
            raise TypeError(f"tno_options must be a dict or None, got {tno_options!r}")
        _check_generator(generator)
        dtype = _check_float_dtype("dtype", dtype)
        mixer = make_tno(
            tno, gtu_hidden, causal=causal, generator=generator, dtype=dtype,
            **(tno_options or {}),
        )
        self.norm1 = nn.LayerNorm(self.channels, dtype=dtype)
        self.gtu = GTU(self.channels, gtu_hidden, mixer, generator=generator, dtype=dtype)
        self.norm2 = nn.LayerNorm(self.channels, dtype=dtype)
        self.glu = GLU(self.channels, glu_hidden, generator=generator, dtype=dtype)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.gtu(self.norm1(x))
        return x + self.glu(self.norm2(x))


class TNNEncoder(nn.Module):
    """Token embedding, ``n_layers`` :class:`TNNBlock` s and a final layer norm.

    ``forward(tokens)``: integer ``(..., n)`` token ids in ``[0, vocab_size)`` ->
    ``(..., n, channels)`` hidden states, or ``(..., n, n_out)`` per-token outputs of a
    linear head when ``n_out`` is given (logits of a language model, or pool them for
    a classifier). No positional embedding: the Toeplitz mixers are the relative
    position encoding. Derived in chapter 4 (chapters/04_toeplitz.ipynb), section
    "Accuracy", which trains it with ``tno`` in ``"tno"``, ``"ski"``, ``"fd"``.

    Args:
        vocab_size: number of token ids.
        channels: model width ``d``.
        n_layers: number of blocks.
        tno, causal, gtu_expand, glu_expand, tno_options: see :class:`TNNBlock`.
        n_out: size of the optional per-token linear head.
        generator, dtype: initialisation randomness and parameter dtype.
    """

    def __init__(
        self,
        vocab_size: int,
        channels: int,
        n_layers: int,
        *,
        tno: str = "tno",
        causal: bool = False,
        gtu_expand: int = 1,
        glu_expand: int = 1,
        tno_options: Optional[dict[str, Any]] = None,
        n_out: Optional[int] = None,
        generator: Optional[torch.Generator] = None,
        dtype: Optional[torch.dtype] = None,
    ) -> None:
        super().__init__()
        self.vocab_size = check_positive_int("vocab_size", vocab_size)
        self.channels = check_positive_int("channels", channels)
        n_layers = check_positive_int("n_layers", n_layers)
        _check_generator(generator)
        dtype = _check_float_dtype("dtype", dtype)
        emb = torch.nn.utils.skip_init(nn.Embedding, self.vocab_size, self.channels, dtype=dtype)
        with torch.no_grad():
            nn.init.normal_(emb.weight, generator=generator)
        self.embedding = emb
        self.blocks = nn.ModuleList(
            TNNBlock(
                self.channels, tno=tno, causal=causal, gtu_expand=gtu_expand,
                glu_expand=glu_expand, tno_options=tno_options, generator=generator,
                dtype=dtype,
            )
            for _ in range(n_layers)
        )
        self.norm = nn.LayerNorm(self.channels, dtype=dtype)
        self.head = (
            None
            if n_out is None
            else _linear(self.channels, check_positive_int("n_out", n_out), generator, dtype)
        )

    def forward(self, tokens: Tensor) -> Tensor:
        if not isinstance(tokens, Tensor):
            raise TypeError(f"tokens must be a torch.Tensor, got {type(tokens).__name__}")
        if tokens.dtype not in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
            raise TypeError(f"tokens must be an integer tensor of token ids, got {tokens.dtype}")
        if tokens.ndim < 1 or tokens.shape[-1] < 1:
            raise ValueError(
                f"tokens must have shape (..., n) with n >= 1, got {tuple(tokens.shape)}"
            )
        if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= self.vocab_size):
            raise ValueError(
                f"tokens must lie in [0, vocab_size = {self.vocab_size}), got values in "
                f"[{int(tokens.min())}, {int(tokens.max())}]"
            )
        h = self.embedding(tokens.long())
        for block in self.blocks:
            h = block(h)
        h = self.norm(h)
        return h if self.head is None else self.head(h)


# --------------------------------------------------------------------------------------
# Decay study (Theorems 2-4)
# --------------------------------------------------------------------------------------


class DecayCurve(NamedTuple):
    """A frequency response and the magnitude of its time-domain kernel."""

    omega: Tensor  #: ``(n + 1,)``, :math:`\omega_m = m\pi/n`
    response: Tensor  #: ``(n + 1, c)``, the MLP's output at :math:`\omega_m`
    lags: Tensor  #: ``(n + 1,)``, the lags :math:`0..n`
    kernel_abs: Tensor  #: ``(n + 1, c)``, :math:`|k[t]|` at those lags


def frequency_response_decay(mlp: nn.Module, n: int, *, feature: str = "cos") -> DecayCurve:
    """A (random) MLP read as a frequency response, and the decay of its kernel.

    Evaluates ``mlp`` at the feature of :math:`\\omega_m = m\\pi/n`, :math:`m = 0..n`,
    takes the result as the real, even response :math:`\\hat k(\\omega_m)` and returns
    the time-domain kernel :math:`k = \\mathrm{irFFT}_{2n}(\\hat k)` (the sampled inverse
    DTFT, Definition 3) at the lags :math:`0..n`, in absolute value. Theorems 2-4:
    GeLU -> :math:`|k[t]|` decays faster than any exponential (for an MLP without layer
    norm, Theorem 2's assumption; with layer norm, exponentially), SiLU -> faster than any
    polynomial, ReLU -> square summable (in fact :math:`O(t^{-2})`, absolutely summable).
    The theorems need a response that is smooth
    as a :math:`2\\pi`-periodic function: ``feature="cos"`` feeds :math:`\\cos\\omega`
    and gives exactly that; ``feature="omega"`` feeds :math:`\\omega/\\pi` (the paper's
    FD-TNO input), whose even periodic extension has kinks at :math:`\\omega = 0, \\pi`
    that cap the decay at :math:`O(t^{-2})` for every activation. Computed without
    gradients, in the MLP's dtype (use float64 to see decay below 1e-7). Derived in
    chapter 4 (chapters/04_toeplitz.ipynb), section "Smoothness in frequency, decay in
    time".

    Args:
        mlp: a module mapping ``(N, 1)`` to ``(N, c)`` (e.g. :func:`rpe_mlp`).
        n: the grid has :math:`n + 1` frequencies and the kernel :math:`2n` taps.
        feature: ``"cos"`` or ``"omega"``.
    """
    if not isinstance(mlp, nn.Module):
        raise TypeError(f"mlp must be an nn.Module, got {type(mlp).__name__}")
    n = check_positive_int("n", n)
    feature = check_choice("feature", feature, RPE_FEATURES)
    param = next(mlp.parameters(), None)
    dtype = param.dtype if param is not None else torch.get_default_dtype()
    device = param.device if param is not None else torch.device("cpu")
    with torch.no_grad():
        feats = _frequency_features(n, feature, dtype, device)
        response = mlp(feats)
        if response.ndim == 1:
            response = response[:, None]
        kernel = torch.fft.irfft(response.T, n=2 * n).T[: n + 1]
        omega = torch.arange(n + 1, dtype=dtype, device=device) * (math.pi / n)
        lags = torch.arange(n + 1, device=device)
    return DecayCurve(omega, response, lags, kernel.abs())
