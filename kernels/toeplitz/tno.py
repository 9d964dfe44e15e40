"""The baseline Toeplitz neural operator of Qin et al. (2023): an RPE MLP over relative
positions (:func:`rpe_mlp`) times an exponential decay bias, one Toeplitz matrix per channel
(:class:`TNO`).

Part of :mod:`kernels.toeplitz`, chapter 4 (``chapters/04_toeplitz.ipynb``), section "TNO".
"""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor, nn

from kernels._checks import check_choice, check_float_dtype, check_generator, check_positive_int
from kernels.toeplitz.product import (
    _apply_spectrum,
    _empty_like_result,
    fft_length,
    _kernel_spectrum,
    toeplitz_dense,
)
from kernels.toeplitz.helpers import (
    _activation,
    _check_bool,
    _check_decay,
    _check_sequence,
    _linear,
)

__all__ = [
    "rpe_mlp",
    "TNO",
    "RPE_ACTIVATIONS",
]


#: Activations of :func:`rpe_mlp` (the three of Theorems 2-4).
RPE_ACTIVATIONS = ("relu", "gelu", "silu")



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
    check_generator("generator", generator)
    dtype = check_float_dtype("dtype", dtype, none_is_default=True)
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

