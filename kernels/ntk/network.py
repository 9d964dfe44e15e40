"""Fully connected networks in the NTK or the standard parametrization: the layers
(:class:`NTKLinear`, :class:`Erf`) and :func:`fc_network`.

Part of :mod:`kernels.ntk`, the package side of chapter 1 (``chapters/01_ntk.ipynb``),
section "Parametrizations" (Jacot et al. 2018; Lee et al. 2019, table 1). The other parts
of the package read these layers: the structured "gram" path of :func:`kernels.ntk.empirical_ntk`
uses their scales, :func:`kernels.ntk.fc_kernel` is the infinite-width limit of
:func:`fc_network`.
"""

from __future__ import annotations

import copy
import math
from typing import Optional, Union

import torch
from torch import Tensor, nn

from kernels._checks import (
    check_choice,
    check_float_dtype,
    check_generator,
    check_input,
    check_nonnegative_float,
    check_positive_float,
    check_positive_int,
    check_tensor,
)

__all__ = [
    "NTKLinear",
    "Erf",
    "fc_network",
    "PARAMETERIZATIONS",
    "ACTIVATIONS",
]


#: Parametrizations of an affine layer (slides, "NTK: about parametrization").
PARAMETERIZATIONS = ("ntk", "standard")



#: Activations with a closed-form infinite-width kernel in :func:`fc_kernel`.
ACTIVATIONS = ("relu", "erf")



# --------------------------------------------------------------------------------------
# Layers
# --------------------------------------------------------------------------------------


class NTKLinear(nn.Module):
    """Affine layer in the NTK or the standard parametrization.

    With input :math:`x \\in \\mathbb{R}^{n \\times d_{in}}` and parameters
    ``weight`` :math:`W \\in \\mathbb{R}^{d_{out} \\times d_{in}}` (the ``nn.Linear``
    layout), ``bias`` :math:`b \\in \\mathbb{R}^{d_{out}}`:

    * ``parameterization="ntk"`` (Jacot et al. 2018; Lee et al. 2019, table 1):
      :math:`W_{ij}, b_i \\sim \\mathcal N(0, 1)` and
      :math:`y = \\frac{\\sigma_W}{\\sqrt{d_{in}}} x W^\\top + \\sigma_b b`;
    * ``parameterization="standard"``: :math:`W_{ij} \\sim \\mathcal N(0,
      \\sigma_W^2/d_{in})`, :math:`b_i \\sim \\mathcal N(0, \\sigma_b^2)` and
      :math:`y = x W^\\top + b`.

    Given the same standard-normal noise both parametrizations compute the same
    function at initialization, but the gradients differ: in the NTK parametrization
    :math:`\\partial y/\\partial W` carries the factor :math:`\\sigma_W/\\sqrt{d_{in}}`,
    which keeps the NTK finite as the width grows (slides, "NTK: about
    parametrization"). Derived in chapter 1 (chapters/01_ntk.ipynb), section
    "Parametrizations".

    Shapes: ``(n, in_features) -> (n, out_features)``; cost :math:`O(n\\,d_{in} d_{out})`.

    Args:
        in_features: fan-in :math:`d_{in}` (positive int).
        out_features: fan-out :math:`d_{out}` (positive int).
        W_std: weight scale :math:`\\sigma_W > 0`.
        b_std: bias scale :math:`\\sigma_b \\ge 0`.
        parameterization: ``"ntk"`` or ``"standard"``.
        bias: whether the layer has a bias parameter.
        generator: source of randomness for the initialization (``None``: torch's
            default generator).
        dtype: parameter dtype (``None``: ``torch.get_default_dtype()``).
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        W_std: float = 1.0,
        b_std: float = 0.0,
        parameterization: str = "ntk",
        bias: bool = True,
        generator: Optional[torch.Generator] = None,
        dtype: Optional[torch.dtype] = None,
    ) -> None:
        super().__init__()
        self.in_features = check_positive_int("in_features", in_features)
        self.out_features = check_positive_int("out_features", out_features)
        self.W_std = check_positive_float("W_std", W_std)
        self.b_std = check_nonnegative_float("b_std", b_std)
        self.parameterization = check_choice(
            "parameterization", parameterization, PARAMETERIZATIONS
        )
        if not isinstance(bias, bool):
            raise TypeError(f"bias must be a bool, got {bias!r}")
        check_generator("generator", generator)
        dtype = check_float_dtype("dtype", dtype, none_is_default=True)
        device = generator.device if generator is not None else None
        noise_w = torch.randn(
            out_features, in_features, generator=generator, dtype=dtype, device=device
        )
        # The weight noise is drawn first so that a layer with and without bias gets
        # the same weights from the same generator state.
        noise_b = (
            torch.randn(out_features, generator=generator, dtype=dtype, device=device)
            if bias
            else None
        )
        if self.parameterization == "standard":
            noise_w = noise_w * (self.W_std / math.sqrt(in_features))
            noise_b = None if noise_b is None else noise_b * self.b_std
        self.weight = nn.Parameter(noise_w)
        self.bias = None if noise_b is None else nn.Parameter(noise_b)

    @property
    def weight_scale(self) -> float:
        """Forward-pass factor multiplying ``x @ W.T`` (``W_std/sqrt(d_in)`` or 1)."""
        if self.parameterization == "ntk":
            return self.W_std / math.sqrt(self.in_features)
        return 1.0

    @property
    def bias_scale(self) -> float:
        """Forward-pass factor multiplying ``b`` (``b_std`` or 1)."""
        return self.b_std if self.parameterization == "ntk" else 1.0

    def forward(self, x: Tensor) -> Tensor:
        check_input("x", x, self.in_features, self.weight)
        y = torch.nn.functional.linear(x, self.weight)
        if self.weight_scale != 1.0:
            y = y * self.weight_scale
        if self.bias is not None:
            y = y + self.bias_scale * self.bias
        return y

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"W_std={self.W_std}, b_std={self.b_std}, "
            f"parameterization={self.parameterization!r}, bias={self.bias is not None}"
        )



class Erf(nn.Module):
    """Elementwise error function :math:`\\sigma(u) = \\mathrm{erf}(u)`.

    The activation whose infinite-width kernel Williams (1997) computed in closed form
    (see :func:`fc_kernel`); neural-tangents calls it ``stax.Erf()``. Shape preserving,
    :math:`O(\\text{numel})`.
    """

    def forward(self, x: Tensor) -> Tensor:
        check_tensor("x", x, finite=False)  # O(1): NaN and Inf propagate
        return torch.special.erf(x)



def _make_activation(activation: Union[str, nn.Module]) -> nn.Module:
    if isinstance(activation, nn.Module):
        return copy.deepcopy(activation)
    check_choice("activation", activation, ACTIVATIONS)
    return nn.ReLU() if activation == "relu" else Erf()



def fc_network(
    in_dim: int,
    width: int,
    depth: int,
    out_dim: int = 1,
    *,
    activation: Union[str, nn.Module] = "relu",
    W_std: float = 1.0,
    b_std: float = 0.0,
    parameterization: str = "ntk",
    generator: Optional[torch.Generator] = None,
    dtype: torch.dtype = torch.float64,
) -> nn.Sequential:
    """Fully connected network with ``depth`` hidden layers of size ``width``.

    ``Sequential(NTKLinear(in_dim, width), act, ..., NTKLinear(width, width), act,
    NTKLinear(width, out_dim))``: ``depth`` blocks (affine layer, activation) followed by
    an affine readout, every affine layer with the same ``W_std``, ``b_std`` and
    ``parameterization``. In the NTK parametrization, as ``width -> inf`` its NNGP and
    NTK are exactly :func:`fc_kernel` ``(..., depth=depth, activation=activation)``, and
    the architecture is neural-tangents'
    ``stax.serial(*[Dense(width, W_std, b_std), Relu()] * depth, Dense(out_dim, W_std,
    b_std))``. Derived in chapter 1 (chapters/01_ntk.ipynb), section "A finite network
    and its kernel".

    Shapes: ``(n, in_dim) -> (n, out_dim)``; forward cost
    :math:`O(n\\,(d\\,w + (\\text{depth}-1) w^2 + w\\,k))`.

    Args:
        activation: ``"relu"``, ``"erf"``, or any ``nn.Module`` (deep-copied into each
            hidden block; :func:`fc_kernel` only knows the two named ones).
        generator: randomness for every layer's initialization, consumed layer by layer.
        dtype: parameter dtype (float64 by default, as the book compares kernels to
            1e-5 relative precision).
    """
    in_dim = check_positive_int("in_dim", in_dim)
    width = check_positive_int("width", width)
    depth = check_positive_int("depth", depth)
    out_dim = check_positive_int("out_dim", out_dim)
    if not isinstance(activation, (str, nn.Module)):
        raise TypeError(
            f"activation must be one of {list(ACTIVATIONS)} or an nn.Module, got {activation!r}"
        )
    if isinstance(activation, str):
        check_choice("activation", activation, ACTIVATIONS)
    layer_kw = dict(
        W_std=W_std,
        b_std=b_std,
        parameterization=parameterization,
        generator=generator,
        dtype=dtype,
    )
    layers: list[nn.Module] = []
    fan_in = in_dim
    for _ in range(depth):
        layers += [NTKLinear(fan_in, width, **layer_kw), _make_activation(activation)]
        fan_in = width
    layers.append(NTKLinear(fan_in, out_dim, **layer_kw))
    return nn.Sequential(*layers)
