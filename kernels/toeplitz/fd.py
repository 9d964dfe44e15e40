"""FD-TNO, Algorithm 2 of Moreno et al. (2023), Section 3.3 (:class:`FDTNO`): the RPE gives
the kernel's frequency response; causality through the discrete Hilbert transform
(:func:`discrete_hilbert`, :func:`causal_kernel_from_real_response`). Also the decay study
of Theorems 2-4 (:func:`frequency_response_decay`), which reads the same frequency features.

Part of :mod:`kernels.toeplitz`, chapter 4 (``chapters/04_toeplitz.ipynb``), sections
"FD-TNO" and "Decay".
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from kernels._checks import call_user_code, check_choice, check_positive_int
from kernels.toeplitz.product import (
    _apply_spectrum,
    _check_fft_input,
    _empty_like_result,
    fft_length,
    _half_spectrum_weights,
    toeplitz_dense,
)
from kernels.toeplitz.helpers import _check_bool, _check_sequence
from kernels.toeplitz.tno import rpe_mlp

__all__ = [
    "discrete_hilbert",
    "causal_kernel_from_real_response",
    "FDTNO",
    "DecayCurve",
    "frequency_response_decay",
    "RPE_FEATURES",
]


#: Inputs of a frequency-domain RPE: ``"omega"`` is :math:`\omega/\pi \in [0, 1]` (the
#: paper's :math:`\mathrm{RPE}(\omega)`), ``"cos"`` is :math:`\cos\omega` (a smooth
#: even 2pi-periodic response).
RPE_FEATURES = ("omega", "cos")



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
        response = call_user_code(f"mlp(features of shape {tuple(feats.shape)})", mlp, feats)
        if not isinstance(response, Tensor) or response.ndim not in (1, 2) or response.shape[0] != n + 1 \
                or not response.is_floating_point():
            got = f"{tuple(response.shape)} {response.dtype}" if isinstance(response, Tensor) else type(response).__name__
            raise ValueError(f"mlp must map the (n + 1, 1) = {tuple(feats.shape)} frequency features to a real "
                             f"floating (n + 1,) or (n + 1, c) response, got {got}")
        if response.ndim == 1:
            response = response[:, None]
        kernel = torch.fft.irfft(response.T, n=2 * n).T[: n + 1]
        omega = torch.arange(n + 1, dtype=dtype, device=device) * (math.pi / n)
        lags = torch.arange(n + 1, device=device)
    return DecayCurve(omega, response, lags, kernel.abs())

