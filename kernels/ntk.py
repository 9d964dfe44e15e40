"""Neural tangent kernels: finite-width (empirical) and infinite-width (analytic).

This module is the package side of chapter 1 (``chapters/01_ntk.ipynb``). It holds

* the layers of a fully connected network in either parametrization
  (:class:`NTKLinear`, :class:`Erf`, :func:`fc_network`);
* the empirical NTK :math:`\\hat\\Theta(x, x') = J(x) J(x')^\\top` of any torch model
  (:func:`empirical_ntk`), with a fast structured path for MLPs that never forms a
  Jacobian;
* the infinite-width NNGP and NTK of :func:`fc_network` (:func:`fc_kernel`);
* the closed-form gradient-flow dynamics of MSE training in the NTK regime
  (:func:`gd_mse_predictor`, :func:`mse_loss_curve`);
* the linearization :math:`f^{lin}` of a network around its initialization
  (:func:`linearize`).

References (keys of ``book/references.bib`` where present):

* Jacot, Gabriel, Hongler (2018), *Neural Tangent Kernel: Convergence and
  Generalization in Neural Networks* -- the NTK and its layer recursion.
* Lee et al. (2019), *Wide Neural Networks of Any Depth Evolve as Linear Models Under
  Gradient Descent* -- the NTK parametrization table, linearized networks and the
  closed-form MSE dynamics (their eqs. 9-11).
* Arora et al. (2019), *On Exact Computation with an Infinitely Wide Neural Net* --
  the same recursion written as :math:`\\Theta^{(l+1)} = \\Theta^{(l)}\\dot\\Sigma^{(l+1)}
  + \\Sigma^{(l+1)}`.
* Novak et al. (2020), *Neural Tangents: Fast and Easy Infinite Neural Networks in
  Python* -- the reference implementation the tests compare against.
* Cho & Saul (2009) (arc-cosine kernel, ReLU) and Williams (1997) (erf).

The NTK slides (``ntk-intro-slides``) state the recursions ("NTK: formulas"), the
parametrization table ("NTK: about parametrization"), the MSE gradient-flow solution
("Arbitrary function f for MSE loss") and the loss-curve formula ("NTK: training time
prediction"). Each docstring below names the chapter section that derives it.

Conventions used throughout:

* inputs are ``(n, d)`` tensors: one row per sample;
* a network with ``depth`` hidden layers has ``depth + 1`` affine layers;
* the NTK parametrization scales each affine layer by ``W_std / sqrt(fan_in)`` in the
  forward pass and draws every parameter from ``N(0, 1)``.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import math
import numbers
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, NamedTuple, Optional, Union

import torch
from torch import Tensor, nn
from torch.func import functional_call, jacrev, jvp, vjp, vmap

from kernels._checks import (
    check_choice,
    check_nonnegative_float,
    check_positive_float,
    check_positive_int,
    check_same_feature_dim,
    check_tensor,
)

__all__ = [
    "NTKLinear",
    "Erf",
    "fc_network",
    "empirical_ntk",
    "linear_gram_ntk",
    "NTKResult",
    "fc_kernel",
    "gd_mse_predictor",
    "mse_loss_curve",
    "GaussianPrediction",
    "gd_mse_ensemble",
    "linearize",
    "LinearizedModel",
    "PARAMETERIZATIONS",
    "ACTIVATIONS",
    "EMPIRICAL_NTK_METHODS",
]

#: Parametrizations of an affine layer (slides, "NTK: about parametrization").
PARAMETERIZATIONS = ("ntk", "standard")
#: Activations with a closed-form infinite-width kernel in :func:`fc_kernel`.
ACTIVATIONS = ("relu", "erf")
#: Methods accepted by :func:`empirical_ntk`.
EMPIRICAL_NTK_METHODS = ("auto", "jacobian", "jvp", "gram")


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
        _check_generator(generator)
        dtype = _check_float_dtype("dtype", dtype)
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


# --------------------------------------------------------------------------------------
# Empirical NTK
# --------------------------------------------------------------------------------------


def empirical_ntk(
    model: nn.Module,
    x1: Tensor,
    x2: Optional[Tensor] = None,
    *,
    method: str = "auto",
    trace_outputs: bool = False,
    chunk_size: Optional[int] = None,
) -> Tensor:
    """Empirical (finite-width) NTK :math:`\\hat\\Theta(x, x') = J(x)\\,J(x')^\\top`.

    :math:`J(x) = \\partial f(x;\\theta)/\\partial\\theta` is the Jacobian of the model
    output with respect to all *trainable* parameters (``requires_grad=True``) at their
    current values (Jacot et al. 2018, eq. 4; slides, "Arbitrary function f for MSE
    loss"). Derived in chapter 1 (chapters/01_ntk.ipynb), section "The empirical NTK".

    Shapes. ``x1``: ``(n1, d)``, ``x2``: ``(n2, d)`` (``None``: ``x2 = x1``, and the
    symmetry is exploited). If the model returns one scalar per sample (output ``(n,)``
    or ``(n, 1)``) the result is ``(n1, n2)``. For ``k`` outputs per sample (``(n, k)``)
    the result is ``(n1, n2, k, k)`` with entry ``[i, j, a, b] = <df_a(x_i)/dθ,
    df_b(x'_j)/dθ>`` (neural-tangents ``empirical_ntk_fn(..., trace_axes=())``), or
    ``(n1, n2)`` holding the trace :math:`\\sum_a \\hat\\Theta_{aa}` when
    ``trace_outputs=True``. neural-tangents' default ``trace_axes=(-1,)`` returns the
    *mean* :math:`\\frac1k\\sum_a \\hat\\Theta_{aa}` instead, i.e. this trace divided by
    ``k``; the mean is the per-output kernel that :func:`fc_kernel` and
    :func:`gd_mse_predictor` expect. The result is detached from the autograd graph, on
    the model's device, in the model's dtype.

    Methods (``P`` parameters, ``k`` outputs):

    * ``"jacobian"``: explicit per-sample Jacobians, contracted (Novak et al. 2022,
      "implementation 1"). For the ``weight`` and ``bias`` of every ``nn.Linear``/
      :class:`NTKLinear` layer the rows :math:`\\partial f_a(x_i)/\\partial W = s_W
      \\sum_t g_{a,i,t}\\,a_{i,t}^\\top` come from one hooked forward pass (layer inputs
      :math:`a`) and ``k`` backward passes (output gradients :math:`g`); they are
      formed a few weight rows at a time (8 MiB blocks) and each block is contracted at
      once with one GEMM, only the row blocks on and above the diagonal when ``x2`` is
      None. Every other trainable parameter -- and all of them when the hooks cannot be
      trusted (a layer's parameter also used outside its ``forward``, detected by
      comparing gradients; samples folded into a layer's first axis) -- goes through
      ``torch.func.vmap(jacrev(...))`` over :func:`torch.func.functional_call`.
      :math:`O(k)` backward passes, :math:`O((n_1 + n_2) k P)` to form and
      :math:`O(n_1 n_2 k^2 P)` to contract; memory for the per-layer parameters: the
      recorded activations, two blocks and the result. For the ``torch.func``
      parameters :math:`O((n_1 + n_2) k P)`, or :math:`O(2\\,c\\,k P)` with
      ``chunk_size=c`` (samples per block; the ``x2`` blocks are recomputed for each
      ``x1`` block); ``chunk_size`` does not change the per-layer path.
    * ``"jvp"``: NTK-vector products (the torch.func NTK tutorial; Novak et al. 2022,
      "implementation 2"): for each sample :math:`x_i` and output :math:`a` a VJP gives
      the direction :math:`J_a(x_i)^\\top` and a JVP of the model at ``x2`` along it
      gives the row block :math:`J(x_2) J_a(x_i)^\\top`, i.e. :math:`\\hat\\Theta(x_i, x_2)_{a,:}`.
      The ``c k`` directions of a block of ``c`` samples are formed at once (per layer
      from the hooked records as in ``"jacobian"``, by ``torch.func.vjp`` for other
      parameters) and pushed forward together: by a hand-written batched JVP for an
      ``nn.Sequential`` of linear layers and elementwise activations, by
      ``vmap(torch.func.jvp)`` otherwise. With ``x2=None`` each block only needs the
      columns from its own first sample on. :math:`J(x_2)` is never formed and
      :math:`J(x_1)` only ``c`` samples at a time (``c = chunk_size``, default at most
      16 for the Sequential JVP and 32 otherwise, fewer if ``c k P`` entries would
      exceed 1 GiB): memory :math:`O(c k P)`, time :math:`O(n_1 k\\,n_2 P)` (the
      forward-mode passes) with no contraction over ``P``.
    * ``"gram"``: for an ``nn.Sequential`` of ``nn.Linear``/:class:`NTKLinear` layers and
      elementwise activations. A layer :math:`z_l = s_W A_{l-1} W_l^\\top + s_b b_l`
      contributes :math:`(s_W^2\\, A_{l-1} A'^\\top_{l-1} + s_b^2) \\odot
      (\\Delta_l \\Delta'^\\top_l)`, where :math:`A` are the layer inputs and
      :math:`\\Delta_l = \\partial f/\\partial z_l` the back-propagated output gradients
      (one per output index), since :math:`\\partial f/\\partial W_l = s_W
      \\Delta_l^\\top A_{l-1}`. One batched forward and backward pass and Gram
      products: :math:`O(k\\,n\\sum_l w_l^2 + k^2 n_1 n_2 \\sum_l w_l)`, no per-parameter
      Jacobian. This is the fast path.
      Any other model whose trainable parameters all belong to ``nn.Linear`` layers
      (frozen layers of any kind around them) takes the same Gram route through forward
      hooks (:func:`linear_gram_ntk`).
    * ``"auto"``: ``"gram"`` when the model has that structure, else ``"jacobian"``.

    Args:
        model: any ``nn.Module`` mapping ``(n, d)`` to ``(n,)`` or ``(n, k)``; samples
            must not interact (no batch statistics).
        x1, x2: inputs with the model's dtype and device.
        method: one of ``"auto"``, ``"jacobian"``, ``"jvp"``, ``"gram"``.
        trace_outputs: sum the diagonal output pairs (see above).
        chunk_size: samples of ``x1`` per block for ``"jvp"``, and of ``x1`` and ``x2``
            for the ``torch.func`` part of ``"jacobian"``; ignored by ``"gram"`` and by
            the per-layer part of ``"jacobian"`` (bounded by its column blocks).

    Raises:
        TypeError: non-module model, non-tensor or integer inputs, dtype different from
            the model's.
        ValueError: wrong rank, NaN/inf, mismatched feature dimensions, device mismatch,
            no trainable parameter, unsupported output shape, ``method="gram"`` on an
            unsupported architecture.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    method = check_choice("method", method, EMPIRICAL_NTK_METHODS)
    if not isinstance(trace_outputs, bool):
        raise TypeError(f"trace_outputs must be a bool, got {trace_outputs!r}")
    if chunk_size is not None:
        chunk_size = check_positive_int("chunk_size", chunk_size)
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    if not params:
        raise ValueError("model has no trainable parameter (requires_grad=True)")
    ref = next(iter(params.values()))
    x1 = _check_model_input("x1", x1, ref)
    if x2 is not None:
        x2 = _check_model_input("x2", x2, ref)
        check_same_feature_dim("x1", x1, "x2", x2)

    out_shape = _probe_output_shape(model, x1)
    k = 1 if len(out_shape) == 0 else out_shape[0]

    if method in ("auto", "gram"):
        layers = _gram_layers(model)
        if not isinstance(layers, str):
            with torch.no_grad():
                theta = _ntk_gram(layers, x1, x2, k, trace_outputs)
            return theta
        linears = _linear_gram_owners(model)
        if not isinstance(linears, str):
            theta = _linear_gram(model, linears, _call_model, x1, x2, trace_outputs)
            return theta.to(ref.dtype)
        if method == "gram":
            raise ValueError(
                "method='gram' needs every trainable parameter in an nn.Linear/NTKLinear "
                f"layer: {linears}. Use method='jacobian' or 'jvp'."
            )
        method = "jacobian"

    if method == "jacobian":
        theta = _ntk_jacobian(model, params, x1, x2, out_shape, chunk_size)
    else:
        theta = _ntk_jvp(model, params, x1, x2, out_shape, chunk_size)
    # theta: (n1, n2, k, k)
    if k == 1:
        return theta[:, :, 0, 0]
    if trace_outputs:
        return torch.diagonal(theta, dim1=2, dim2=3).sum(-1)
    return theta


def _check_model_input(name: str, x: object, ref: Tensor) -> Tensor:
    x = check_tensor(name, x, ndim=2)
    if x.dtype != ref.dtype:
        raise TypeError(
            f"{name} has dtype {x.dtype} but the model's parameters are {ref.dtype}; "
            f"convert with {name}.to({ref.dtype})"
        )
    if x.device != ref.device:
        raise ValueError(
            f"{name} is on {x.device} but the model's parameters are on {ref.device}; "
            f"move it with {name}.to({str(ref.device)!r})"
        )
    if x.shape[0] == 0:
        raise ValueError(f"{name} must hold at least one sample, got shape {tuple(x.shape)}")
    return x


def _probe_output_shape(model: nn.Module, x1: Tensor) -> tuple[int, ...]:
    """Per-sample output shape: ``()`` for a scalar, ``(k,)`` for a vector."""
    try:
        with torch.no_grad():
            out = model(x1[:1])
    except RuntimeError as exc:
        raise ValueError(
            f"model cannot be applied to x1 of shape {tuple(x1.shape)} ({exc})"
        ) from None
    if not isinstance(out, Tensor) or out.ndim not in (1, 2) or out.shape[0] != 1:
        shape = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
        raise ValueError(
            "model must map (n, d) inputs to (n,) or (n, k) outputs; on one sample it "
            f"returned {shape}"
        )
    if out.ndim == 1 or out.shape[1] == 1:
        return ()
    return (out.shape[1],)


# ---- "gram": structured MLP path -----------------------------------------------------

_ELEMENTWISE = (
    nn.ReLU,
    nn.Tanh,
    nn.GELU,
    nn.Sigmoid,
    nn.Identity,
    nn.LeakyReLU,
    nn.ELU,
    nn.SELU,
    nn.CELU,
    nn.SiLU,
    nn.Mish,
    nn.Softplus,
    nn.Hardtanh,
    nn.ReLU6,
    nn.Tanhshrink,
    nn.Softsign,
    Erf,
)


def _flatten_sequential(module: nn.Module) -> list[nn.Module]:
    if isinstance(module, nn.Sequential):
        out: list[nn.Module] = []
        for child in module:
            out += _flatten_sequential(child)
        return out
    return [module]


def _gram_layers(model: nn.Module) -> Union[list[nn.Module], str]:
    """The flat layer list if ``model`` fits the gram path, else the reason it does not."""
    if not isinstance(model, nn.Sequential):
        return f"got {type(model).__name__}"
    layers = _flatten_sequential(model)
    for layer in layers:
        if type(layer) is nn.Linear or isinstance(layer, NTKLinear):
            continue
        if type(layer) in _ELEMENTWISE:
            continue
        return f"layer {layer!r} is not supported"
    # Only the parameters the gram path knows may be trainable, and each one may be used
    # by a single layer: a shared (tied) parameter would need cross-layer terms.
    known: set[int] = set()
    for layer in layers:
        if isinstance(layer, (nn.Linear, NTKLinear)):
            for p in (layer.weight, layer.bias):
                if p is None:
                    continue
                if id(p) in known:
                    return f"layer {layer!r} shares a parameter with another layer"
                known.add(id(p))
    for name, p in model.named_parameters():
        if p.requires_grad and id(p) not in known:
            return f"parameter {name!r} does not belong to an affine layer"
    return layers


def _layer_scales(layer: nn.Module) -> tuple[float, float]:
    if isinstance(layer, NTKLinear):
        return layer.weight_scale, layer.bias_scale
    return 1.0, 1.0


def _activation_and_derivative(layer: nn.Module, z: Tensor) -> tuple[Tensor, Optional[Tensor]]:
    """``(sigma(z), sigma'(z))`` for an elementwise activation; ``None`` means identity."""
    if isinstance(layer, nn.Identity):
        return z, None
    if isinstance(layer, nn.ReLU):
        mask = z > 0
        return torch.where(mask, z, torch.zeros((), dtype=z.dtype, device=z.device)), mask.to(
            z.dtype
        )
    if isinstance(layer, Erf):
        return torch.special.erf(z), (2.0 / math.sqrt(math.pi)) * torch.exp(-z * z)
    if isinstance(layer, nn.Tanh):
        y = torch.tanh(z)
        return y, 1.0 - y * y
    # Any other elementwise module: the gradient of sum(sigma(z)) is sigma'(z).
    with torch.enable_grad():
        leaf = z.detach().requires_grad_(True)
        y = layer(leaf.clone())  # the clone keeps in-place activations off the leaf
        (deriv,) = torch.autograd.grad(y.sum(), leaf)
    return y.detach(), deriv


def _gram_pass(layers: list[nn.Module], x: Tensor, k: int):
    """Forward then backward pass collecting, per affine layer, its input ``A`` and the
    output gradients ``Delta`` of shape ``(k, n, d_out)``."""
    inputs: list[Tensor] = []
    derivs: list[Optional[Tensor]] = []
    h = x
    for layer in layers:
        if isinstance(layer, (nn.Linear, NTKLinear)):
            inputs.append(h)
            h = layer(h)
            derivs.append(None)
        else:
            h, d = _activation_and_derivative(layer, h)
            derivs.append(d)
    n = x.shape[0]
    # Cotangent of the output f_a(x_i): one-hot along the output index a.
    eye = torch.eye(k, dtype=x.dtype, device=x.device)
    grad = eye[:, None, :].expand(k, n, k)
    deltas: list[Tensor] = []
    affine_seen = 0
    n_affine = len(inputs)
    for layer, d in zip(reversed(layers), reversed(derivs)):
        if isinstance(layer, (nn.Linear, NTKLinear)):
            deltas.append(grad)
            affine_seen += 1
            if affine_seen < n_affine:  # the input layer's gradient is never used
                s_w, _ = _layer_scales(layer)
                grad = torch.matmul(grad, layer.weight)
                if s_w != 1.0:
                    grad = grad * s_w
        elif d is not None:
            grad = grad * d
    deltas.reverse()
    return inputs, deltas


def _delta_gram(d1: Tensor, d2: Tensor, k: int, trace: bool) -> Tensor:
    """``(n1, n2)`` (k == 1 or trace) or ``(n1, n2, k, k)`` Gram of output gradients."""
    _, n1, m = d1.shape
    n2 = d2.shape[1]
    if k == 1:
        return d1[0] @ d2[0].T
    if trace:
        return d1.transpose(0, 1).reshape(n1, k * m) @ d2.transpose(0, 1).reshape(n2, k * m).T
    g = d1.reshape(k * n1, m) @ d2.reshape(k * n2, m).T  # (k n1, k n2)
    return g.reshape(k, n1, k, n2).permute(1, 3, 0, 2)


def _ntk_gram(
    layers: list[nn.Module], x1: Tensor, x2: Optional[Tensor], k: int, trace: bool
) -> Tensor:
    inputs1, deltas1 = _gram_pass(layers, x1, k)
    if x2 is None:
        inputs2, deltas2 = inputs1, deltas1
    else:
        inputs2, deltas2 = _gram_pass(layers, x2, k)
    affine = [m for m in layers if isinstance(m, (nn.Linear, NTKLinear))]
    theta: Optional[Tensor] = None
    for layer, a1, a2, d1, d2 in zip(affine, inputs1, inputs2, deltas1, deltas2):
        s_w, s_b = _layer_scales(layer)
        w_trainable = layer.weight.requires_grad
        b_trainable = layer.bias is not None and layer.bias.requires_grad and s_b != 0.0
        if not (w_trainable or b_trainable):
            continue
        if w_trainable:
            factor = a1 @ a2.T
            if s_w != 1.0:
                factor = factor * (s_w * s_w)
            if b_trainable:
                factor = factor + s_b * s_b
        else:
            factor = None
        dg = _delta_gram(d1, d2, k, trace)
        if factor is None:
            term = dg * (s_b * s_b)
        elif dg.ndim == 4:
            term = dg * factor[:, :, None, None]
        else:
            term = dg * factor
        theta = term if theta is None else theta + term
    if theta is None:  # every trainable tensor is a bias with zero scale
        n2 = x1.shape[0] if x2 is None else x2.shape[0]
        shape = (x1.shape[0], n2) if (k == 1 or trace) else (x1.shape[0], n2, k, k)
        theta = torch.zeros(shape, dtype=x1.dtype, device=x1.device)
    return theta


# ---- "gram" for any module whose trainable layers are nn.Linear: hooks ----------------


def _linear_gram_owners(model: nn.Module) -> Union[list[tuple[str, nn.Module]], str]:
    """The ``(name, layer)`` of every ``nn.Linear``/:class:`NTKLinear` holding a trainable
    parameter, or the reason the Gram factorisation does not apply: a trainable
    parameter outside such a layer (named, with its module's type), a layer subclassing
    ``nn.Linear`` with its own ``forward``, or a parameter shared by two layers."""
    owner_of: dict[int, tuple[str, nn.Module]] = {}
    layers: list[tuple[str, nn.Module]] = []
    for mod_name, module in model.named_modules():
        linear = type(module) is nn.Linear or isinstance(module, NTKLinear)
        for p_name, p in module.named_parameters(recurse=False):
            if not p.requires_grad:
                continue
            full = f"{mod_name}.{p_name}" if mod_name else p_name
            if not linear or p_name not in ("weight", "bias"):
                kind = type(module).__name__
                extra = " (a subclass of nn.Linear with its own forward)" if isinstance(module, nn.Linear) else ""
                return (
                    f"trainable parameter {full!r} belongs to {kind}{extra}, not to an nn.Linear/NTKLinear layer"
                )
            if id(p) in owner_of and owner_of[id(p)][1] is not module:
                return f"trainable parameter {full!r} is shared with layer {owner_of[id(p)][0]!r}"
            owner_of[id(p)] = (mod_name, module)
        if linear and any(p.requires_grad for p in module.parameters(recurse=False)):
            if all(m is not module for _, m in layers):
                layers.append((mod_name, module))
    if not layers:
        return "the model has no trainable nn.Linear/NTKLinear layer"
    return layers


class _SampleAxisError(ValueError):
    """A hooked layer saw a leading dimension other than the number of samples."""


def _linear_records(
    model: nn.Module,
    layers: list[tuple[str, nn.Module]],
    output_fn: Callable[[nn.Module, object], Tensor],
    inputs: object,
    check_params: tuple[Tensor, ...] = (),
) -> tuple[list[Optional[tuple[Tensor, Tensor]]], int, int, list[Tensor]]:
    """One forward pass and ``k`` backward passes. For every layer: its inputs ``a``
    ``(n, T, in)`` and the output gradients ``g`` ``(k, n, T, out)`` of
    :math:`\\sum_i f_a(x_i)` (one slice per output index ``a``), the calls of a layer
    used several times concatenated along ``T``; ``None`` for a layer that never ran.
    Also the gradients of :math:`\\sum_{i,a} f_a(x_i)` with respect to
    ``check_params`` (same backward passes; zeros where unused), with which a caller
    can verify that the hooks saw every use of those parameters."""
    calls: dict[int, list[tuple[Tensor, Tensor]]] = {i: [] for i in range(len(layers))}

    def hook(idx: int):
        def keep(module, args, output):  # returns None: the output stays as it is
            calls[idx].append((args[0].detach(), output))

        return keep

    handles = [layer.register_forward_hook(hook(i)) for i, (_, layer) in enumerate(layers)]
    try:
        with torch.enable_grad(), _fast_linear_mode():
            out = output_fn(model, inputs)
    finally:
        for h in handles:
            h.remove()
    if not isinstance(out, Tensor) or out.ndim not in (1, 2):
        shape = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
        raise ValueError(f"output_fn must return (n,) or (n, k) outputs, got {shape}")
    n = out.shape[0]
    k = 1 if out.ndim == 1 else out.shape[1]
    out = out.reshape(n, k)
    ys = [y for i in range(len(layers)) for _, y in calls[i]]
    grads_per_output = []
    param_grads = [torch.zeros_like(p) for p in check_params]
    for a in range(k):
        if not out.requires_grad or not (ys or check_params):
            grads = [None] * (len(ys) + len(check_params))
        else:
            grads = torch.autograd.grad(
                out[:, a].sum(), ys + list(check_params), retain_graph=a + 1 < k,
                allow_unused=True,
            )
        for pg, g in zip(param_grads, grads[len(ys):]):
            if g is not None:
                pg += g.detach()
        grads_per_output.append(grads[: len(ys)])
    records: list[Optional[tuple[Tensor, Tensor]]] = []
    pos = 0
    for i in range(len(layers)):
        if not calls[i]:
            records.append(None)
            continue
        a_parts, g_parts = [], []
        for j, (x_in, y) in enumerate(calls[i]):
            if x_in.shape[0] != n:
                raise _SampleAxisError(
                    f"layer {layers[i][0]!r} saw a leading dimension of {x_in.shape[0]} "
                    f"for {n} samples; samples must stay on the first axis"
                )
            per_out = [
                (torch.zeros_like(y) if grads[pos + j] is None else grads[pos + j].detach())
                .reshape(1, n, -1, y.shape[-1])
                for grads in grads_per_output
            ]
            a_parts.append(x_in.reshape(n, -1, x_in.shape[-1]))
            g_parts.append(per_out[0] if k == 1 else torch.cat(per_out, 0))
        pos += len(calls[i])
        if len(a_parts) == 1:  # one call: no copies
            records.append((a_parts[0], g_parts[0]))
        else:
            records.append((torch.cat(a_parts, 1), torch.cat(g_parts, 2)))
    return records, n, k, param_grads


def _pair_gram(u1: Tensor, u2: Tensor) -> Tensor:
    """``(n1, T1, n2, T2)`` Gram of token vectors ``(n, T, m)``."""
    n1, t1, m = u1.shape
    n2, t2, _ = u2.shape
    return _gemm_nt(u1.reshape(n1 * t1, m), u2.reshape(n2 * t2, m)).reshape(n1, t1, n2, t2)


#: Token rows per block of the symmetric token-pair sum (:func:`_pair_product_sum`):
#: blocks of about this many rows keep each GEMM efficient while the blocks below the
#: diagonal, which are skipped, approach half of the work.
_SYM_BLOCK_ROWS = 128


def _pair_product_sum(a1: Tensor, g1: Tensor, a2: Tensor, g2: Tensor, same: bool) -> Tensor:
    """``(n1, n2)`` sums :math:`\\sum_{t,s}(a_{it}\\cdot a'_{js})(g_{it}\\cdot g'_{js})` of
    token vectors ``a`` ``(n, T, p)`` and ``g`` ``(n, T, q)``.

    ``same`` (``a2 is a1``, ``g2 is g1``): the result is symmetric, so only sample
    blocks on and above the diagonal are formed (row blocks of about
    :data:`_SYM_BLOCK_ROWS` tokens against themselves and every later sample) and
    mirrored: with ``B`` blocks, ``(B + 1) / 2B`` of the two GEMMs' work."""
    n1, t1 = a1.shape[:2]
    n2, t2 = a2.shape[:2]
    a1f, g1f = a1.reshape(n1 * t1, -1), g1.reshape(n1 * t1, -1)
    if not same:
        ga = _gemm_nt(a1f, a2.reshape(n2 * t2, -1))
        gg = _gemm_nt(g1f, g2.reshape(n2 * t2, -1))
        return (ga * gg).reshape(n1, t1, n2, t2).sum((1, 3))
    out = torch.empty((n1, n1), dtype=a1.dtype, device=a1.device)
    step = max(1, -(-_SYM_BLOCK_ROWS // t1))  # samples per row block
    for i0 in range(0, n1, step):
        i1 = min(n1, i0 + step)
        rows, cols = slice(i0 * t1, i1 * t1), slice(i0 * t1, None)
        prod = _gemm_nt(a1f[rows], a1f[cols]).mul_(_gemm_nt(g1f[rows], g1f[cols]))
        block = prod.reshape(i1 - i0, t1, n1 - i0, t1).sum((1, 3))
        diag = block[:, : i1 - i0]
        diag.copy_(0.5 * (diag + diag.T))  # exactly symmetric (the two sums round differently)
        out[i0:i1, i0:] = block
        out[i0:, i0:i1] = block.T
    return out


def _linear_layer_ntk(
    layer: nn.Module,
    rec1: tuple[Tensor, Tensor],
    rec2: tuple[Tensor, Tensor],
    trace: bool,
    same: bool = False,
) -> Tensor:
    """One layer's NTK term ``(n1, n2, k, k)`` (``(n1, n2)`` when ``k == 1`` or ``trace``).

    The per-sample weight gradient is :math:`s_W\\sum_t g_t a_t^\\top`, so
    :math:`\\langle\\partial_W f_a(x), \\partial_W f_b(x')\\rangle = s_W^2\\sum_{t,s}
    (a_t\\cdot a'_s)(g_{a,t}\\cdot g'_{b,s})`, and the bias term is :math:`s_b^2
    (\\sum_t g_{a,t})\\cdot(\\sum_s g'_{b,s})`. The token-pair form costs
    :math:`O(n_1 n_2 T_1 T_2 (d_{in} + k^2 d_{out}))`; forming the per-sample gradients
    costs :math:`O((n_1 T_1 + n_2 T_2) k\\,d_{in} d_{out} + n_1 n_2 k^2 d_{in} d_{out})`:
    the cheaper one is used (the token-pair form always when there is one token)."""
    a1, g1 = rec1
    a2, g2 = rec2
    k, n1, t1, d_out = g1.shape
    n2, t2, d_in = a2.shape[0], a2.shape[1], a2.shape[2]
    s_w, s_b = _layer_scales(layer)
    w_on = layer.weight.requires_grad
    b_on = layer.bias is not None and layer.bias.requires_grad and s_b != 0.0
    kk = 1 if (k == 1 or trace) else k * k
    theta = torch.zeros((n1, n2) if kk == 1 else (n1, n2, k, k), dtype=a1.dtype, device=a1.device)
    if b_on:
        s1, s2 = g1.sum(2), g2.sum(2)  # (k, n, out)
        theta = theta + (s_b * s_b) * _delta_gram(s1, s2, k, trace)
    if not w_on:
        return theta
    pair_cost = n1 * n2 * t1 * t2 * (d_in + kk * d_out)
    if same and (kk == 1 or trace):  # the symmetric blocks of _pair_product_sum
        pair_cost //= 2
    formed = n1 * t1 if same else n1 * t1 + n2 * t2  # tokens whose gradients are formed
    grad_cost = formed * k * d_in * d_out + n1 * n2 * kk * d_in * d_out
    if t1 * t2 == 1 or pair_cost <= grad_cost:
        if kk == 1 and not trace:
            w_term = _pair_product_sum(a1, g1[0], a2, g2[0], same)
        elif trace:
            u1 = g1.permute(1, 2, 0, 3).reshape(n1, t1, k * d_out)
            u2 = u1 if same else g2.permute(1, 2, 0, 3).reshape(n2, t2, k * d_out)
            w_term = _pair_product_sum(a1, u1, a2, u2, same)
        else:
            ga = _pair_gram(a1, a2)  # (n1, T1, n2, T2)
            gg = _gemm_nt(g1.reshape(k * n1 * t1, d_out), g2.reshape(k * n2 * t2, d_out)).reshape(
                k, n1, t1, k, n2, t2
            )
            w_term = torch.einsum("itjs,aitbjs->ijab", ga, gg)
    else:
        e1 = torch.einsum("knto,nti->knoi", g1, a1).reshape(k, n1, -1)
        e2 = e1 if same else torch.einsum("knto,nti->knoi", g2, a2).reshape(k, n2, -1)
        w_term = _delta_gram(e1, e2, k, trace)
    return theta + (s_w * s_w) * w_term


def linear_gram_ntk(
    model: nn.Module,
    x1: object,
    x2: object = None,
    *,
    output_fn: Optional[Callable[[nn.Module, object], Tensor]] = None,
    trace_outputs: bool = False,
) -> Tensor:
    """Empirical NTK :math:`J(x)J(x')^\\top` of any module whose *trainable* parameters
    all belong to ``nn.Linear`` (or :class:`NTKLinear`) layers, without a Jacobian.

    Forward hooks record each such layer's inputs :math:`a_t` and one backward pass per
    output index its output gradients :math:`g_t`, over every leading axis after the
    sample axis (tokens :math:`t` of a transformer). A linear layer applied over tokens
    has the per-sample weight gradient :math:`\\sum_t g_t a_t^\\top`, so its NTK term is
    :math:`\\sum_{t,s}(a_t\\cdot a'_s)(g_t\\cdot g'_s)` plus :math:`(\\sum_t g_t)\\cdot
    (\\sum_s g'_s)` for the bias: the per-layer Gram trick of :func:`empirical_ntk`'s
    ``"gram"`` method (Jacot et al. 2018, eq. 4), generalised from an MLP to e.g. the FFN
    blocks of a transformer whose other weights are frozen (chapter 6, "Measuring the
    NTK"; the one-token form is derived in chapter 1, "The empirical NTK"). A layer
    called several times counts each call's tokens. Frozen layers, attention, norms
    and any other computation may sit anywhere around the trainable layers.

    Args:
        model: the module; samples must not interact (padding masked, no batch norm).
        x1, x2: whatever ``output_fn`` takes for ``n1`` and ``n2`` samples (``x2=None``:
            ``x1``, computed once).
        output_fn: ``output_fn(model, x) -> (n,)`` or ``(n, k)``; default ``model(x)``.
        trace_outputs: as in :func:`empirical_ntk`.

    Returns:
        ``(n1, n2)`` for one output per sample (or ``trace_outputs``), else
        ``(n1, n2, k, k)``, detached, in the dtype of the recorded activations. Cost one
        forward and ``k`` backward passes per input set (to the layers' outputs only: no
        weight gradient is formed; float32 ``nn.Linear`` calls on the CPU run on
        oneDNN's GEMM, see :class:`_OneDNNLinearMode`) plus, per layer, the cheaper of
        the token-pair and the per-sample-gradient contractions (see
        :func:`_linear_layer_ntk`; for ``x2=None`` only the blocks on and above the
        diagonal, and the result is exactly symmetric); memory: the recorded
        activations and gradients.

    Raises:
        TypeError: ``model`` not a module, ``output_fn`` not callable, ``trace_outputs``
            not a bool.
        ValueError: a trainable parameter outside an ``nn.Linear`` (the message names the
            first one and its module), a parameter shared between layers, no trainable
            layer, outputs not ``(n,)``/``(n, k)``, different output counts for ``x1``
            and ``x2``.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if output_fn is None:
        output_fn = _call_model
    elif not callable(output_fn):
        raise TypeError("output_fn must be a callable output_fn(model, x) -> (n,) or (n, k)")
    if not isinstance(trace_outputs, bool):
        raise TypeError(f"trace_outputs must be a bool, got {trace_outputs!r}")
    layers = _linear_gram_owners(model)
    if isinstance(layers, str):
        raise ValueError(
            f"linear_gram_ntk needs every trainable parameter in an nn.Linear layer: {layers}. "
            "Freeze it (requires_grad_(False)) or use empirical_ntk(method='jacobian')."
        )
    return _linear_gram(model, layers, output_fn, x1, x2, trace_outputs)


def _call_model(model: nn.Module, x: object) -> Tensor:
    return model(x)


def _linear_gram(model, layers, output_fn, x1, x2, trace) -> Tensor:
    rec1, n1, k, _ = _linear_records(model, layers, output_fn, x1)
    if x2 is None:
        rec2, n2 = rec1, n1
    else:
        rec2, n2, k2, _ = _linear_records(model, layers, output_fn, x2)
        if k2 != k:
            raise ValueError(f"the model returns {k} outputs per sample on x1 but {k2} on x2")
    theta: Optional[Tensor] = None
    with torch.no_grad():
        for (_, layer), r1, r2 in zip(layers, rec1, rec2):
            if r1 is None or r2 is None:  # the layer never ran: its gradient is zero
                continue
            term = _linear_layer_ntk(layer, r1, r2, trace, same=x2 is None)
            theta = term if theta is None else theta + term
    if theta is None:
        ref = next(p for _, m in layers for p in m.parameters())
        shape = (n1, n2) if (k == 1 or trace) else (n1, n2, k, k)
        theta = torch.zeros(shape, dtype=ref.dtype, device=ref.device)
    elif x2 is None:  # exactly symmetric: the terms' two halves may round differently
        theta = 0.5 * (theta + (theta.T if theta.ndim == 2 else theta.permute(1, 0, 3, 2)))
    return theta


# ---- "jacobian" and "jvp": generic torch.func paths -----------------------------------


def _substitution_names(model: nn.Module, names: list[str]) -> dict[str, str]:
    """Map every (module, attribute) slot holding one of the parameters ``names`` (as
    listed by ``named_parameters()``) to that canonical name.

    ``functional_call`` must swap each slot exactly once: a module registered twice
    (``Sequential(layer, act, layer)``) swapped under both names is not restored
    (torch 2.13 leaves plain tensors in it), while two modules sharing one Parameter
    (tied weights) must both be swapped. Hence ``tie_weights=False`` with one entry
    per distinct slot.
    """
    canonical = dict(model.named_parameters())
    wanted = {id(canonical[n]): n for n in names}
    out: dict[str, str] = {}
    seen: set[tuple[int, str]] = set()
    for name, param in model.named_parameters(remove_duplicate=False):
        if id(param) not in wanted:
            continue
        owner_path, _, attr = name.rpartition(".")
        slot = (id(model.get_submodule(owner_path)), attr)
        if slot in seen:
            continue
        seen.add(slot)
        out[name] = wanted[id(param)]
    return out


def _call_with(model: nn.Module, slots: dict[str, str], params: dict[str, Tensor], x: Tensor):
    """``model(x)`` with ``params`` (keyed by canonical name) swapped in."""
    swapped = {slot: params[name] for slot, name in slots.items()}
    return functional_call(model, swapped, (x,), tie_weights=False)


def _functional_model(model: nn.Module, params: dict[str, Tensor]):
    """``f(params, x) -> (n, k)`` with the frozen tensors taken from ``model``."""
    slots = _substitution_names(model, list(params))

    def f(p: dict[str, Tensor], x: Tensor) -> Tensor:
        out = _call_with(model, slots, p, x)
        return out.reshape(x.shape[0], -1)

    return f


#: Bytes of per-sample Jacobians / NTK directions that one block of the generic
#: ``torch.func`` paths may hold when ``chunk_size`` is None. 1 GiB: a 256-sample
#: Jacobian of the benchmark's 0.56 M-parameter MLP (573 MB) fits in one block; at
#: 256 MiB it was split into three and recomputed per block pair, 1.35x slower
#: (measured, one thread).
_BLOCK_BYTES = 1 << 30
#: Most samples of ``x1`` per block in the ``"jvp"`` method (``torch.func`` JVP, and
#: the hand-written JVP of :func:`_sequential_tangents`: smaller blocks skip more of the
#: symmetric half, larger ones make larger GEMMs; 16 was fastest of 8-64, one thread).
_JVP_MAX_CHUNK = 32
_SEQUENTIAL_JVP_MAX_CHUNK = 16
#: Bytes of one block of Jacobian columns in the per-layer ``"jacobian"`` path (per
#: input set): the columns of a few output rows of one ``nn.Linear`` weight. Small
#: enough to be contracted while it is still in cache, large enough for the GEMM to
#: run at full speed (see ``benchmarks/bench_ntk.py``).
_LAYER_BLOCK_BYTES = 8 << 20
#: Row blocks of the symmetric (``x2=None``) contraction: blocks on and above the
#: diagonal only, :math:`(b + 1)/(2b)` of the full product's work.
_SYM_ROW_BLOCKS = 4


def _default_chunk(n_params: int, k: int, itemsize: int, cap: int) -> int:
    """Samples per block so that ``c k P`` entries fit in :data:`_BLOCK_BYTES` (at least 1)."""
    return max(1, min(cap, _BLOCK_BYTES // max(1, n_params * k * itemsize)))


@functools.lru_cache(maxsize=None)
def _onednn_linear_available() -> bool:
    """Whether torch's oneDNN inner product (``torch.ops.mkldnn._linear_pointwise``)
    runs here and agrees with ``torch.mm`` on a small float32 product."""
    try:
        if not torch.backends.mkldnn.is_available():
            return False
        gen = torch.Generator().manual_seed(0)
        a = torch.randn(5, 7, generator=gen)
        b = torch.randn(3, 7, generator=gen)
        bt = torch.randn(7, 3, generator=gen)
        checks = (
            (torch.ops.mkldnn._linear_pointwise(a, b, None, "none", [], ""), a @ b.T),
            # a transposed (column-major) weight, as the backward pass of _OneDNNLinear passes
            (torch.ops.mkldnn._linear_pointwise(a, bt.t(), None, "none", [], ""), a @ bt),
        )
        return all(
            isinstance(got, Tensor) and not got.is_mkldnn and got.shape == (5, 3)
            and torch.allclose(got, ref, rtol=1e-5, atol=1e-6)
            for got, ref in checks
        )
    except (RuntimeError, AttributeError, TypeError):
        return False


def _linear_onednn(x: Tensor, w: Tensor, b: Optional[Tensor]) -> Tensor:
    """``x @ w.T + b`` for float32 CPU ``x`` ``(..., in)``, ``w`` ``(out, in)`` through
    oneDNN's inner product (the GEMM of :func:`_gemm_nt`)."""
    x2 = x.reshape(-1, x.shape[-1]).contiguous()
    if not (w.is_contiguous() or w.t().is_contiguous()):  # a transposed weight needs no copy
        w = w.contiguous()
    y = torch.ops.mkldnn._linear_pointwise(
        x2, w, None if b is None else b.contiguous(), "none", [], ""
    )
    return y.reshape(*x.shape[:-1], w.shape[0])


def _engine_will_run(ctx, index: int) -> bool:
    """Whether the running backward pass needs the gradient of input ``index`` of the
    custom-function node ``ctx``: ``ctx.needs_input_grad`` says only whether it
    *requires* grad (fixed at forward time), not whether this ``autograd.grad`` call
    asked for it. Uses the engine's own query (``torch._C._will_engine_execute_node``,
    private); when that is unavailable or cannot answer, the gradient is computed."""
    if not ctx.needs_input_grad[index]:
        return False
    try:
        node = ctx.next_functions[index][0]
        return node is None or bool(torch._C._will_engine_execute_node(node))
    except (AttributeError, RuntimeError, IndexError):
        return True


class _OneDNNLinear(torch.autograd.Function):
    """``F.linear`` with oneDNN GEMMs forward and backward (float32, CPU). Its backward
    is written with differentiable operations, so higher derivatives work; a
    parameter's gradient is formed only when the backward pass will use it."""

    @staticmethod
    def forward(ctx, x: Tensor, w: Tensor, b: Optional[Tensor]) -> Tensor:
        ctx.save_for_backward(x, w)
        ctx.has_bias = b is not None
        return _linear_onednn(x, w, b)

    @staticmethod
    def backward(ctx, grad: Tensor):
        x, w = ctx.saved_tensors
        g2 = grad.reshape(-1, grad.shape[-1])
        grad_x = grad_w = grad_b = None
        if _engine_will_run(ctx, 0):
            grad_x = _OneDNNLinear.apply(grad, w.t(), None)
        if _engine_will_run(ctx, 1):
            grad_w = g2.t() @ x.reshape(-1, x.shape[-1])
        if ctx.has_bias and _engine_will_run(ctx, 2):
            grad_b = g2.sum(0)
        return grad_x, grad_w, grad_b


class _OneDNNLinearMode(torch.overrides.TorchFunctionMode):
    """Within this mode every ``F.linear`` (so every ``nn.Linear``) on float32 CPU
    tensors runs through :class:`_OneDNNLinear`; every other call, and any linear it
    cannot take (other dtypes or devices, tensor subclasses, functorch transforms,
    shapes ``F.linear`` itself rejects), runs unchanged. Used by
    :func:`_linear_records`, where the forward and backward passes of the model are
    most of the Gram trick's time: torch's own float32 GEMM here is OpenBLAS (AVX2)
    at about 100 GFLOP/s on one core, oneDNN about 210 (``bench_ntk.py``)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.nn.functional.linear:
            routed = self._route(*args, **kwargs)
            if routed is not None:
                return _OneDNNLinear.apply(*routed)
        return func(*args, **kwargs)

    @staticmethod
    def _route(input=None, weight=None, bias=None):
        def plain(t):
            return type(t) in (Tensor, nn.Parameter) and t.dtype == torch.float32 \
                and t.device.type == "cpu" and t.layout == torch.strided
        if not (plain(input) and plain(weight) and (bias is None or plain(bias))):
            return None
        if torch._C._are_functorch_transforms_active():
            return None
        if weight.ndim != 2 or input.ndim < 2 or input.shape[-1] != weight.shape[1] \
                or input.numel() == 0 or weight.numel() == 0:
            return None
        if bias is not None and tuple(bias.shape) != (weight.shape[0],):
            return None
        return input, weight, bias


def _fast_linear_mode():
    """:class:`_OneDNNLinearMode` when oneDNN's inner product works here, else a no-op."""
    if _onednn_linear_available():
        return _OneDNNLinearMode()
    return contextlib.nullcontext()


def _gemm_nt(a: Tensor, b: Tensor) -> Tensor:
    """``a @ b.T`` for ``(m, K)`` and ``(p, K)`` row-major blocks.

    float32 on the CPU goes through oneDNN's inner product when torch has it: on the
    AMD Zen 5 benchmark machine ATen's float32 ``mm`` (MKL) ran these shapes at about
    110 GFLOP/s on one thread and oneDNN at about 250 (``benchmarks/bench_ntk.py``,
    "GEMM floor"). Same product, different summation order (float32 rounding)."""
    if a.dtype == torch.float32 and a.device.type == "cpu" and _onednn_linear_available():
        return torch.ops.mkldnn._linear_pointwise(
            a.contiguous(), b.contiguous(), None, "none", [], ""
        )
    return a @ b.T


class _LinearParts(NamedTuple):
    """An ``nn.Linear``/:class:`NTKLinear` layer and the canonical names of those of its
    trainable parameters whose Jacobian is formed from the layer's inputs and output
    gradients (``None``: not trainable, or left to ``torch.func``)."""

    path: str
    module: nn.Module
    weight: Optional[str]
    bias: Optional[str]


def _split_linear_parameters(
    model: nn.Module, params: dict[str, Tensor]
) -> tuple[list[_LinearParts], dict[str, Tensor]]:
    """Split the trainable ``params`` into per-layer ones and the rest.

    A parameter takes the per-layer path when its only holder is one ``nn.Linear`` or
    :class:`NTKLinear` (exact types, so a subclass with its own ``forward`` does not)
    as its ``weight`` or ``bias``; that layer may be called several times. A parameter
    held by two modules (tied weights) or by any other module stays with ``torch.func``.
    """
    holders: dict[int, dict[tuple[int, str], tuple[str, nn.Module]]] = {}
    for full, p in model.named_parameters(remove_duplicate=False):
        path, _, attr = full.rpartition(".")
        module = model.get_submodule(path)
        holders.setdefault(id(p), {})[(id(module), attr)] = (path, module)
    layers: dict[int, _LinearParts] = {}
    rest: dict[str, Tensor] = {}
    for name, p in params.items():
        slots = holders.get(id(p), {})
        if len(slots) == 1:
            ((mod_id, attr), (path, module)) = next(iter(slots.items()))
            if type(module) in (nn.Linear, NTKLinear) and attr in ("weight", "bias"):
                entry = layers.get(mod_id, _LinearParts(path, module, None, None))
                layers[mod_id] = entry._replace(**{attr: name})
                continue
        rest[name] = p
    return list(layers.values()), rest


def _weight_rows(rec: tuple[Tensor, Tensor], s_w: float, o0: int, o1: int, i0: int, i1: int,
                 out: Optional[Tensor] = None) -> Tensor:
    """Per-sample Jacobian of outputs ``o0:o1`` of a linear layer's weight, samples
    ``i0:i1``: :math:`\\partial f_a(x_i)/\\partial W_{o,:} = s_W\\sum_t g_{a,i,t,o}\\,
    a_{i,t,:}` (chapter 1, "The empirical NTK"), as ``(c, k, o1 - o0, d_in)``.

    One token: a broadcast product written straight into ``out`` (torch.func's batched
    outer products are matmuls with an inner dimension of 1, several times slower);
    several tokens or calls: one batched matmul over the samples."""
    a, g = rec
    k, _, t, _ = g.shape
    c, r, d_in = i1 - i0, o1 - o0, a.shape[-1]
    gs = g[:, i0:i1, :, o0:o1]  # (k, c, T, r)
    if s_w != 1.0:
        gs = gs * s_w
    if out is None:
        out = torch.empty(c * k * r * d_in, dtype=a.dtype, device=a.device)
    out = out[: c * k * r * d_in].view(c, k, r, d_in)
    if t == 1:
        torch.mul(gs[:, :, 0, :].permute(1, 0, 2)[..., None], a[i0:i1, 0, None, None, :], out=out)
    else:
        lhs = gs.permute(1, 0, 3, 2).reshape(c, k * r, t)
        torch.bmm(lhs, a[i0:i1], out=out.view(c, k * r, d_in))
    return out


def _bias_rows(rec: tuple[Tensor, Tensor], s_b: float, i0: int, i1: int) -> Tensor:
    """Per-sample Jacobian of a linear layer's bias, ``(c, k, d_out)``:
    :math:`s_b\\sum_t g_{a,i,t,:}`."""
    _, g = rec
    return (g[:, i0:i1].sum(2) * s_b).permute(1, 0, 2)


def _checked_layer_records(
    model: nn.Module, parts: list[_LinearParts], params: dict[str, Tensor], x: Tensor
) -> Optional[list[Optional[tuple[Tensor, Tensor]]]]:
    """Inputs and output gradients of every per-layer linear layer on ``x`` (see
    :func:`_linear_records`), or ``None`` when they cannot be trusted: a layer saw a
    leading dimension other than the samples, or the gradient of the summed outputs
    with respect to a per-layer parameter differs from the one the records give (the
    parameter is also used outside its layer's ``forward``, e.g. ``F.linear(h,
    layer.weight)``, which hooks cannot see)."""
    names = [nm for pt in parts for nm in (pt.weight, pt.bias) if nm is not None]
    try:
        records, _, _, grads = _linear_records(
            model, [(pt.path, pt.module) for pt in parts], _call_model, x,
            tuple(params[nm] for nm in names),
        )
    except _SampleAxisError:
        return None
    by_name = dict(zip(names, grads))
    # The two sums differ only in rounding: about 5e-7 of the largest entry in float32 on
    # MLPs of width 128-1024 with 64-1024 samples (measured); 1000 eps leaves a wide
    # margin while a use outside the hooks changes the gradient by far more.
    tol = min(1000.0 * torch.finfo(x.dtype).eps, 0.05)
    with torch.no_grad():
        for pt, rec in zip(parts, records):
            s_w, s_b = _layer_scales(pt.module)
            for nm, kind in ((pt.weight, "weight"), (pt.bias, "bias")):
                if nm is None:
                    continue
                got = by_name[nm]
                if rec is None:
                    expected = torch.zeros_like(got)
                elif kind == "weight":
                    a, g = rec
                    expected = s_w * torch.einsum("knto,nti->oi", g, a)
                else:
                    expected = s_b * rec[1].sum((0, 1, 2))
                scale = max(got.abs().max().item(), expected.abs().max().item())
                if (got - expected).abs().max().item() > tol * scale:
                    return None
    return records


def _layer_jacobian_ntk(
    parts: list[_LinearParts],
    rec1: list[Optional[tuple[Tensor, Tensor]]],
    rec2: Optional[list[Optional[tuple[Tensor, Tensor]]]],
    n1: int,
    n2: int,
    k: int,
    like: Tensor,
) -> Tensor:
    """:math:`\\sum_{\\text{blocks}} J_1 J_2^\\top` over the per-layer parameters, as a
    flat ``(n1 k, n2 k)`` matrix with rows ``(i, a)`` (``rec2=None``: ``x2 = x1``).

    The explicit per-sample Jacobian (Jacot et al. 2018, eq. 4) is formed in blocks of
    columns -- a few output rows of one weight, at most :data:`_LAYER_BLOCK_BYTES` per
    input set -- and each block is contracted at once with one GEMM (``x2=None``: only
    the row blocks on and above the diagonal, 5/8 of the work with 4 blocks).
    Memory: two blocks and the result; time :math:`O((n_1 + n_2) k P)` to form and
    :math:`O(n_1 n_2 k^2 P)` to contract."""
    sym = rec2 is None
    n_rows = n1 * k
    theta = torch.zeros(n_rows, n2 * k, dtype=like.dtype, device=like.device)
    n_blocks = _SYM_ROW_BLOCKS if (sym and n_rows >= 16 * _SYM_ROW_BLOCKS) else 1
    edges = [round(i * n_rows / n_blocks) for i in range(n_blocks + 1)]
    itemsize = like.element_size()
    buf1: Optional[Tensor] = None
    buf2: Optional[Tensor] = None

    def accumulate(b1: Tensor, b2: Optional[Tensor]) -> None:
        if b2 is None:
            for r0, r1 in zip(edges[:-1], edges[1:]):
                theta[r0:r1, r0:] += _gemm_nt(b1[r0:r1], b1[r0:])
        else:
            theta.add_(_gemm_nt(b1, b2))

    for idx, pt in enumerate(parts):
        r1_ = rec1[idx]
        r2_ = None if sym else rec2[idx]
        if r1_ is None or (not sym and r2_ is None):
            continue  # the layer never ran on one input set: its Jacobian is zero there
        s_w, s_b = _layer_scales(pt.module)
        if pt.weight is not None:
            d_out, d_in = r1_[1].shape[-1], r1_[0].shape[-1]
            row_bytes = max(n1, n2) * k * d_in * itemsize
            rows = max(1, min(d_out, _LAYER_BLOCK_BYTES // max(1, row_bytes)))
            numel = max(n1, n2) * k * rows * d_in
            if buf1 is None or buf1.numel() < numel:
                buf1 = torch.empty(numel, dtype=like.dtype, device=like.device)
                buf2 = None if sym else torch.empty_like(buf1)
            for o0 in range(0, d_out, rows):
                o1 = min(o0 + rows, d_out)
                b1 = _weight_rows(r1_, s_w, o0, o1, 0, n1, buf1).reshape(n_rows, -1)
                b2 = None
                if not sym:
                    b2 = _weight_rows(r2_, s_w, o0, o1, 0, n2, buf2).reshape(n2 * k, -1)
                accumulate(b1, b2)
        if pt.bias is not None and s_b != 0.0:
            b1 = _bias_rows(r1_, s_b, 0, n1).reshape(n_rows, -1)
            b2 = None if sym else _bias_rows(r2_, s_b, 0, n2).reshape(n2 * k, -1)
            accumulate(b1, b2)
    if sym:
        for r0, r1 in zip(edges[:-1], edges[1:]):
            theta[r1:, r0:r1] = theta[r0:r1, r1:].T
    return theta


def _unflatten_ntk(theta: Tensor, n1: int, n2: int, k: int) -> Tensor:
    """``(n1 k, n2 k)`` with rows ``(i, a)`` -> ``(n1, n2, k, k)``."""
    return theta.reshape(n1, k, n2, k).permute(0, 2, 1, 3).contiguous()


def _ntk_jacobian(
    model: nn.Module,
    params: dict[str, Tensor],
    x1: Tensor,
    x2: Optional[Tensor],
    out_shape: tuple[int, ...],
    chunk_size: Optional[int],
) -> Tensor:
    """``"jacobian"``: explicit per-sample Jacobians, contracted. The weights and biases
    of ``nn.Linear``/:class:`NTKLinear` layers get their Jacobian rows from one hooked
    forward and ``k`` backward passes (:func:`_layer_jacobian_ntk`); every other
    trainable parameter (and all of them when the hooks cannot be trusted, see
    :func:`_checked_layer_records`) from ``torch.func`` (:func:`_func_jacobian_ntk`)."""
    k = 1 if not out_shape else out_shape[0]
    n1 = x1.shape[0]
    n2 = n1 if x2 is None else x2.shape[0]
    parts, rest = _split_linear_parameters(model, params)
    theta: Optional[Tensor] = None
    if parts:
        rec1 = _checked_layer_records(model, parts, params, x1)
        rec2 = None
        if rec1 is not None and x2 is not None:
            rec2 = _checked_layer_records(model, parts, params, x2)
        if rec1 is None or (x2 is not None and rec2 is None):
            rest = params
        else:
            with torch.no_grad():
                flat = _layer_jacobian_ntk(parts, rec1, rec2, n1, n2, k, x1)
            theta = _unflatten_ntk(flat, n1, n2, k)
    if rest:
        other = _func_jacobian_ntk(model, rest, x1, x2, out_shape, chunk_size)
        theta = other if theta is None else theta + other
    return theta


def _func_jacobian_ntk(
    model: nn.Module,
    params: dict[str, Tensor],
    x1: Tensor,
    x2: Optional[Tensor],
    out_shape: tuple[int, ...],
    chunk_size: Optional[int],
) -> Tensor:
    """Jacobian contraction for the parameters ``params`` by ``torch.func``:
    ``vmap(jacrev)`` per sample block, one contraction per parameter tensor."""
    detached = {n: p.detach() for n, p in params.items()}
    f = _functional_model(model, detached)
    k = 1 if not out_shape else out_shape[0]
    n_params = sum(p.numel() for p in detached.values())

    def f_single(p: dict[str, Tensor], x: Tensor) -> Tensor:
        return f(p, x.unsqueeze(0))[0]  # (k,)

    jac_fn = vmap(jacrev(f_single), in_dims=(None, 0))

    def jacobians(x: Tensor) -> list[Tensor]:
        jac = jac_fn(detached, x)  # name -> (n, k, *param.shape)
        return [j.reshape(x.shape[0], k, -1) for j in jac.values()]

    def contract(j1: list[Tensor], j2: list[Tensor]) -> Tensor:
        out = None
        for a, b in zip(j1, j2):
            term = torch.einsum("iap,jbp->ijab", a, b)
            out = term if out is None else out + term
        return out

    xb = x1 if x2 is None else x2
    n1, n2 = x1.shape[0], xb.shape[0]
    # Two blocks of Jacobians live at once; without chunk_size they are bounded by
    # _BLOCK_BYTES each (the whole batch in one block when it fits).
    chunk = chunk_size or _default_chunk(n_params, k, x1.element_size(), max(n1, n2))
    with torch.no_grad():
        if chunk >= max(n1, n2):
            j1 = jacobians(x1)
            if x2 is not None:
                return contract(j1, jacobians(x2))
            # x2 = x1: the contraction (O(n^2 k^2 P), the dominant cost) only for the
            # row blocks on or above the diagonal, mirrored: 5/8 of the work with 4 blocks.
            n_blocks = 4 if n1 >= 64 else 1
            edges = [round(i * n1 / n_blocks) for i in range(n_blocks + 1)]
            theta = torch.empty(n1, n1, k, k, dtype=x1.dtype, device=x1.device)
            for b in range(n_blocks):
                r0, r1 = edges[b], edges[b + 1]
                rows = [j[r0:r1] for j in j1]
                block = contract(rows, [j[r0:] for j in j1])  # (r1 - r0, n1 - r0, k, k)
                theta[r0:r1, r0:] = block
                theta[r1:, r0:r1] = block[:, r1 - r0 :].permute(1, 0, 3, 2)
            return theta
        theta = torch.empty(n1, n2, k, k, dtype=x1.dtype, device=x1.device)
        for i0 in range(0, n1, chunk):
            i1 = min(i0 + chunk, n1)
            j1 = jacobians(x1[i0:i1])
            # x2 = x1: the NTK is symmetric, so only blocks on or above the diagonal.
            for j0 in range(i0 if x2 is None else 0, n2, chunk):
                j1_ = min(j0 + chunk, n2)
                j2 = j1 if (x2 is None and j0 == i0) else jacobians(xb[j0:j1_])
                block = contract(j1, j2)
                theta[i0:i1, j0:j1_] = block
                if x2 is None and j0 != i0:
                    theta[j0:j1_, i0:i1] = block.permute(1, 0, 3, 2)
        return theta


def _ntk_jvp(
    model: nn.Module,
    params: dict[str, Tensor],
    x1: Tensor,
    x2: Optional[Tensor],
    out_shape: tuple[int, ...],
    chunk_size: Optional[int],
) -> Tensor:
    """``"jvp"``: NTK-vector products. For each block of ``c`` samples of ``x1`` the
    directions :math:`J(x_i)^\\top e_a` (VJPs) are formed for all ``c k`` cotangents at
    once -- from the hooked layer inputs and output gradients for ``nn.Linear``
    parameters (the rows of :func:`_weight_rows`), by ``torch.func.vjp`` for every other
    parameter -- and pushed forward through the model at ``x2`` in one batched JVP:
    :math:`J(x_2) J(x_i)^\\top e_a = \\hat\\Theta(x_i, x_2)_{a,:}`. For an
    ``nn.Sequential`` of linear layers and elementwise activations the JVP is
    hand-written (:func:`_sequential_tangents`, GEMMs through :func:`_gemm_nt`);
    otherwise ``torch.func.jvp`` under ``vmap``."""
    detached = {n: p.detach() for n, p in params.items()}
    xb = x1 if x2 is None else x2
    n1, n2 = x1.shape[0], xb.shape[0]
    k = 1 if not out_shape else out_shape[0]
    n_params = sum(p.numel() for p in detached.values())
    eye = torch.eye(k, dtype=x1.dtype, device=x1.device)

    parts, rest = _split_linear_parameters(model, params)
    records = _checked_layer_records(model, parts, params, x1) if parts else None
    if records is None:
        parts, rest = [], params
    rest_detached = {n: detached[n] for n in rest}
    f = _functional_model(model, detached)
    f_rest = _functional_model(model, rest_detached) if rest else None
    seq_layers = _gram_layers(model) if not rest else "parameters outside linear layers"
    cap = _JVP_MAX_CHUNK if isinstance(seq_layers, str) else _SEQUENTIAL_JVP_MAX_CHUNK
    chunk = chunk_size or _default_chunk(n_params, k, x1.element_size(), cap)

    def cotangent_directions(x_i: Tensor) -> dict[str, Tensor]:
        # VJPs of one sample's k outputs: J(x_i)^T e_a, parameter-shaped, (k, *shape).
        # One sample at a time, so that a one-hot cotangent does not pay for a
        # backward pass through the whole batch.
        _, vjp_fn = vjp(lambda p: f_rest(p, x_i.unsqueeze(0))[0], rest_detached)
        return vmap(vjp_fn)(eye)[0]

    # Direction buffers reused by every block: a fresh multi-MB tensor per block costs
    # more in page faults than the products written into it (measured: 19 ms vs 3 ms
    # for one 32 MiB block of the benchmark's MLP).
    buffers: dict[str, Tensor] = {}

    def layer_directions(i0: int, i1: int) -> dict[str, Tensor]:
        out: dict[str, Tensor] = {}
        d = (i1 - i0) * k
        for pt, rec in zip(parts, records):
            s_w, s_b = _layer_scales(pt.module)
            for nm, kind in ((pt.weight, "weight"), (pt.bias, "bias")):
                if nm is None:
                    continue
                shape = detached[nm].shape
                if rec is None or (kind == "bias" and s_b == 0.0):
                    out[nm] = torch.zeros((d,) + shape, dtype=x1.dtype, device=x1.device)
                elif kind == "weight":
                    if nm not in buffers:
                        buffers[nm] = torch.empty(
                            chunk * k * shape.numel(), dtype=x1.dtype, device=x1.device
                        )
                    rows = _weight_rows(rec, s_w, 0, shape[0], i0, i1, buffers[nm])
                    out[nm] = rows.view((d,) + shape)
                else:
                    out[nm] = _bias_rows(rec, s_b, i0, i1).reshape((d,) + shape)
        return out

    def ntk_rows(direction: dict[str, Tensor], x: Tensor) -> Tensor:
        # JVP of the model at x along J(x_i)^T e_a: the row block Theta(x_i, x)[a, :].
        return jvp(lambda p: f(p, x), (detached,), (direction,))[1]  # (n, k)

    theta = torch.empty(n1, n2, k, k, dtype=x1.dtype, device=x1.device)
    with torch.no_grad():
        for i0 in range(0, n1, chunk):
            i1 = min(i0 + chunk, n1)
            flat = layer_directions(i0, i1) if parts else {}
            if rest:
                directions = vmap(cotangent_directions)(x1[i0:i1])
                flat.update({n: v.reshape((-1,) + v.shape[2:]) for n, v in directions.items()})
            flat = {n: flat[n] for n in detached}  # jvp wants the primals' key order
            # x2 = x1: the NTK is symmetric, so each block of rows needs only the columns
            # from its own first sample on (about half the forward-mode work).
            j0 = i0 if x2 is None else 0
            if isinstance(seq_layers, str):
                rows = vmap(ntk_rows, in_dims=(0, None))(flat, xb[j0:])  # (c k, n2 - j0, k)
            else:
                rows = _sequential_tangents(seq_layers, params, flat, xb[j0:], k)
            block = rows.reshape(i1 - i0, k, n2 - j0, k).permute(0, 2, 1, 3)
            theta[i0:i1, j0:] = block
            if x2 is None and i1 < n2:
                theta[i1:, i0:i1] = block[:, i1 - i0 :].permute(1, 0, 3, 2)
    return theta


def _sequential_tangents(
    layers: list[nn.Module], params: dict[str, Tensor], directions: dict[str, Tensor],
    x: Tensor, k: int,
) -> Tensor:
    """Forward-mode derivative of an ``nn.Sequential`` of linear layers and elementwise
    activations (the layer list of :func:`_gram_layers`) at ``x`` ``(n, d)`` along ``D``
    parameter directions: ``(D, n, k)``, :math:`J(x)\\,v_d` for each direction.

    Per linear layer :math:`\\dot z = s_W(\\dot h W^\\top + h\\,\\dot W^\\top) + s_b\\dot b`,
    per activation :math:`\\dot h = \\sigma'(z)\\odot\\dot z` -- exactly what
    ``torch.func.jvp`` computes, with the two products as single GEMMs over all ``D``
    directions (:func:`_gemm_nt`). Cost :math:`O(D\\,n\\,P)`, memory :math:`O(D\\,n\\,w)`.
    ``directions`` is keyed by the canonical names of ``params``; a trainable
    parameter of the model has a direction, a frozen one has none."""
    name_of = {id(p): n for n, p in params.items()}
    d = next(iter(directions.values())).shape[0]
    n = x.shape[0]
    h = x
    tangent: Optional[Tensor] = None  # (D, n, width)
    for layer in layers:
        if isinstance(layer, (nn.Linear, NTKLinear)):
            s_w, s_b = _layer_scales(layer)
            w = layer.weight.detach()
            d_out, d_in = w.shape
            new: Optional[Tensor] = None
            if tangent is not None:
                new = _gemm_nt(tangent.reshape(d * n, d_in), w * s_w if s_w != 1.0 else w)
                new = new.view(d, n, d_out)
            w_dir = directions.get(name_of.get(id(layer.weight), ""))
            if w_dir is not None:
                hs = h * s_w if s_w != 1.0 else h
                term = _gemm_nt(hs, w_dir.reshape(d * d_out, d_in)).view(n, d, d_out)
                term = term.permute(1, 0, 2)
                new = term.contiguous() if new is None else new.add_(term)
            if layer.bias is not None and s_b != 0.0:
                b_dir = directions.get(name_of.get(id(layer.bias), ""))
                if b_dir is not None:
                    b_term = (b_dir * s_b)[:, None, :]
                    new = b_term.expand(d, n, d_out).clone() if new is None else new.add_(b_term)
            h = layer(h)
            tangent = new
        else:
            h, deriv = _activation_and_derivative(layer, h)
            if tangent is not None and deriv is not None:
                tangent = tangent * deriv
    if tangent is None:
        return torch.zeros(d, n, k, dtype=x.dtype, device=x.device)
    return tangent.reshape(d, n, k)


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


# --------------------------------------------------------------------------------------
# Gradient-flow dynamics of MSE training
# --------------------------------------------------------------------------------------


def _check_mse_arguments(
    ntk_train_train: Tensor,
    y_train: Tensor,
    f0_train: Optional[Tensor],
    learning_rate: float,
) -> tuple[Tensor, Tensor, Optional[Tensor], float]:
    """The arguments shared by :func:`gd_mse_predictor` and :func:`mse_loss_curve`,
    checked in that order: kernel ``(N, N)``, targets ``(N,)`` or ``(N, k)`` on the
    kernel's device, ``learning_rate > 0``, ``f0_train`` shaped like the targets (or
    ``None``). Returns ``(ntk_train_train, y_train, f0_train, eta)``."""
    ntk_train_train = check_tensor("ntk_train_train", ntk_train_train, ndim=2)
    n = ntk_train_train.shape[0]
    if ntk_train_train.shape[1] != n:
        raise ValueError(
            "ntk_train_train must be a square (N, N) matrix, got shape "
            f"{tuple(ntk_train_train.shape)}"
        )
    y_train = check_tensor("y_train", y_train, ndim=(1, 2))
    if y_train.shape[0] != n:
        raise ValueError(
            f"y_train has {y_train.shape[0]} rows but ntk_train_train is {n} x {n}"
        )
    if y_train.device != ntk_train_train.device:
        raise ValueError(
            f"y_train is on {y_train.device} but ntk_train_train is on "
            f"{ntk_train_train.device}"
        )
    eta = check_positive_float("learning_rate", learning_rate)
    f0_train = _check_like(
        "f0_train", f0_train, tuple(y_train.shape), ntk_train_train.device
    )
    return ntk_train_train, y_train, f0_train, eta


def _check_like(
    name: str, value: Optional[Tensor], shape: tuple[int, ...], device: torch.device
) -> Optional[Tensor]:
    if value is None:
        return None
    value = check_tensor(name, value)
    if tuple(value.shape) != shape:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(value.shape)}")
    if value.device != device:
        raise ValueError(f"{name} is on {value.device}, expected {device}")
    return value


def _eigh_psd(theta: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Eigenpairs of a symmetric PSD matrix in float64, negative rounding noise set to
    0, plus the mask of numerically positive eigenvalues."""
    sym = 0.5 * (theta + theta.T)
    evals, evecs = torch.linalg.eigh(sym)
    evals = evals.clamp_min(0.0)
    tol = evals.max().clamp_min(0.0) * theta.shape[0] * torch.finfo(evals.dtype).eps
    positive = evals > tol
    return evals, evecs, positive


class _TrainSpectrum(NamedTuple):
    """Float64 eigenbasis of the training kernel and the training problem in it."""

    evals: Tensor  #: (N,) eigenvalues, clamped at 0
    evecs: Tensor  #: (N, N) eigenvectors, one per column
    positive: Tensor  #: (N,) bool, numerically positive eigenvalues
    targets: Tensor  #: (N, k) Y in float64
    residual: Tensor  #: (N, k) V^T (f0(X) - Y), the initial residual per eigenvector


def _train_spectrum(
    ntk_train_train: Tensor, y_train: Tensor, f0_train: Optional[Tensor]
) -> _TrainSpectrum:
    """Eigendecomposition :math:`\\Theta = V\\Lambda V^\\top` of checked arguments (see
    :func:`_check_mse_arguments`) and the initial residual :math:`V^\\top(f_0(X) - Y)`
    (:math:`f_0 = 0` when ``f0_train`` is ``None``), all in float64.
    Cost :math:`O(N^3 + N^2 k)`."""
    n = ntk_train_train.shape[0]
    f64 = torch.float64
    evals, evecs, positive = _eigh_psd(ntk_train_train.to(f64))
    y = y_train.to(f64).reshape(n, -1)
    f0 = torch.zeros_like(y) if f0_train is None else f0_train.to(f64).reshape(n, -1)
    residual = evecs.T @ (f0 - y)
    return _TrainSpectrum(evals, evecs, positive, y, residual)


def _check_test_train(ntk_test_train: torch.Tensor, n: int) -> torch.Tensor:
    """Check a test-by-train kernel block: 2-D, one column per training point."""
    ntk_test_train = check_tensor("ntk_test_train", ntk_test_train, ndim=2)
    if ntk_test_train.shape[1] != n:
        raise ValueError(
            f"ntk_test_train must have N = {n} columns (one per training point), got "
            f"shape {tuple(ntk_test_train.shape)}"
        )
    return ntk_test_train


def _check_discrete(discrete: object) -> bool:
    if not isinstance(discrete, bool):
        raise TypeError(f"discrete must be True or False, got {type(discrete).__name__}")
    return discrete


def _decay_and_gain(
    evals: Tensor, positive: Tensor, rate: float, times: Tensor, discrete: bool
) -> tuple[Tensor, Tensor]:
    """Per eigenvalue and time, ``(T, N)``: the residual's decay factor, :math:`e^{-r
    \\lambda t}` (flow) or :math:`(1 - r\\lambda)^t` (``discrete``), with ``r =
    eta / N``, and the gain :math:`(1 - \\text{decay})/\\lambda` of the test prediction,
    whose limit is :math:`r t` for :math:`\\lambda \\to 0`. At ``t = inf`` the decay is 0
    on the range of :math:`\\Theta` (NaN where discrete steps diverge) and 1 on its null
    space (no gradient there), and the gain is the pseudo-inverse."""
    f64 = torch.float64
    finite = torch.isfinite(times)[:, None]
    tt = torch.where(finite, times[:, None], torch.zeros_like(times[:, None]))
    safe_evals = torch.where(positive, evals, torch.ones_like(evals))
    if discrete:
        base = (1.0 - rate * evals)[None, :]
        decay_finite = torch.pow(base, tt)
        # |1 - r lambda| < 1: the steps converge; otherwise the outputs blow up.
        stable = base.abs() < 1.0
        nan = torch.full_like(base, math.nan)
        decay_inf = torch.where(stable, torch.zeros_like(base), nan)
        gain_finite = (1.0 - decay_finite) / safe_evals
    else:
        decay_finite = torch.exp(-rate * evals * tt)
        decay_inf = torch.zeros_like(evals)[None, :]
        gain_finite = -torch.expm1(-rate * evals * tt) / safe_evals
    decay_inf = torch.where(positive[None, :], decay_inf, torch.ones_like(decay_inf))
    gain_inf = torch.where(
        torch.isnan(decay_inf), decay_inf, (1.0 / safe_evals)[None, :].to(f64)
    )
    decay = torch.where(finite, decay_finite, decay_inf)
    gain_pos = torch.where(finite, gain_finite, gain_inf)
    gain_null = torch.where(finite, rate * tt, torch.zeros_like(tt))
    gain = torch.where(positive[None, :], gain_pos, gain_null)
    decay = torch.where(positive[None, :], decay, torch.ones_like(decay))
    return decay, gain


def _check_times(t: object, discrete: bool = False) -> tuple[Tensor, bool]:
    """Times as a float64 1-D tensor and whether the input was a scalar; with
    ``discrete`` the finite times must be whole numbers of steps."""
    if isinstance(t, Tensor):
        if t.ndim > 1:
            raise ValueError(
                f"t must be a scalar or a 1-D tensor of times, got shape {tuple(t.shape)}"
            )
        if t.is_complex():
            raise TypeError(f"t must be real, got dtype {t.dtype}")
        scalar = t.ndim == 0
        times = t.detach().to("cpu", torch.float64).reshape(-1)
    elif isinstance(t, numbers.Real) and not isinstance(t, bool):
        scalar = True
        times = torch.tensor([float(t)], dtype=torch.float64)
    else:
        raise TypeError(f"t must be a float or a tensor of times, got {type(t).__name__}")
    if bool(torch.isnan(times).any()) or bool((times < 0).any()):
        raise ValueError(
            "t must hold non-negative times (inf allowed), got NaN or a negative value"
        )
    finite = times[torch.isfinite(times)]
    if discrete and bool((finite != finite.round()).any()):
        raise ValueError("t must hold whole numbers of steps when discrete=True")
    return times, scalar


def gd_mse_predictor(
    ntk_train_train: Tensor,
    y_train: Tensor,
    *,
    learning_rate: float = 1.0,
    ntk_test_train: Optional[Tensor] = None,
    f0_train: Optional[Tensor] = None,
    f0_test: Optional[Tensor] = None,
    discrete: bool = False,
) -> Callable[[Union[float, Tensor]], tuple[Tensor, Optional[Tensor]]]:
    """Closed-form gradient-flow training of a linearized model on the MSE loss.

    Convention: the loss is :math:`L(\\theta) = \\frac{1}{2N}\\lVert f(X;\\theta) -
    Y\\rVert_F^2` (``N`` training points, summed over output columns) and the flow is
    :math:`\\dot\\theta = -\\eta\\nabla_\\theta L`, so with a constant kernel
    :math:`\\Theta = \\Theta(X, X)` (Lee et al. 2019, eqs. 10-11; slides, "Arbitrary
    function f for MSE loss"):

    .. math::
        f_t(X) &= Y + e^{-\\eta\\Theta t/N}\\,(f_0(X) - Y),\\\\
        f_t(x^*) &= f_0(x^*) + \\Theta(x^*, X)\\,\\Theta^{-1}
        \\big(I - e^{-\\eta\\Theta t/N}\\big)\\,(Y - f_0(X)).

    ``t`` counts time in the units of the flow: ``t`` steps of gradient descent with
    step ``learning_rate`` approximate time ``t`` when the step is small.
    ``t = inf`` gives kernel regression :math:`f_\\infty(x^*) = f_0(x^*) +
    \\Theta(x^*,X)\\Theta^{-1}(Y - f_0(X))` (a pseudo-inverse on the null space of
    :math:`\\Theta`, along which training does not move the outputs). neural-tangents'
    ``predict.gradient_descent_mse`` divides by ``y_train.size = N k`` instead of ``N``:
    its ``learning_rate`` equals ours times ``k``. For ``k`` outputs the same ``(N, N)``
    kernel acts on every output column (the infinite-width :math:`\\Theta \\otimes I_k`).
    Derived in chapter 1 (chapters/01_ntk.ipynb), section "Training dynamics in closed
    form".

    ``discrete=True`` gives gradient descent itself instead of its flow: ``t`` integer
    steps multiply the training residual by :math:`(I - \\eta\\Theta/N)^t` instead of
    :math:`e^{-\\eta\\Theta t/N}` (Lee et al. 2019, the discrete-time form below their
    eq. 10), and the test prediction uses
    :math:`\\Theta^{-1}(I - (I - \\eta\\Theta/N)^t)`. It diverges when
    :math:`\\eta\\lambda_{\\max}/N > 2`; ``t = inf`` then gives NaN.

    One eigendecomposition :math:`\\Theta = V\\Lambda V^\\top` (:math:`O(N^3)`) is done
    here; each call of the returned function then costs :math:`O(T N (N + M) k)` for
    ``T`` times and ``M`` test points. Computed in float64, returned in
    ``ntk_train_train``'s dtype.

    Args:
        ntk_train_train: :math:`\\Theta(X, X)`, ``(N, N)`` symmetric PSD.
        y_train: ``(N,)`` or ``(N, k)`` targets.
        learning_rate: :math:`\\eta > 0`.
        ntk_test_train: :math:`\\Theta(X^*, X)`, ``(M, N)``; needed for test predictions.
        f0_train: initial outputs on the training set, shaped like ``y_train`` (zero if
            ``None``).
        f0_test: initial outputs on the test set, ``(M,)`` or ``(M, k)`` (zero if
            ``None``).
        discrete: ``True`` for ``t`` steps of gradient descent (``t`` must then hold
            whole numbers or ``inf``), ``False`` for the gradient flow.

    Returns:
        ``predict(t) -> (f_train_t, f_test_t)``: ``t`` a non-negative float (``inf``
        allowed) or a 1-D tensor of ``T`` times, in which case both outputs gain a
        leading time axis of length ``T``; ``f_test_t`` is ``None`` without
        ``ntk_test_train``.
    """
    ntk_train_train, y_train, f0_train, eta = _check_mse_arguments(
        ntk_train_train, y_train, f0_train, learning_rate
    )
    discrete = _check_discrete(discrete)
    n = ntk_train_train.shape[0]
    device = ntk_train_train.device
    out_dtype = ntk_train_train.dtype
    tail = tuple(y_train.shape[1:])
    if ntk_test_train is not None:
        ntk_test_train = _check_test_train(ntk_test_train, n)
        m = ntk_test_train.shape[0]
        f0_test = _check_like("f0_test", f0_test, (m,) + tail, device)
    elif f0_test is not None:
        raise ValueError("f0_test was given without ntk_test_train")

    f64 = torch.float64
    # Residual at initialization in the eigenbasis: r_k = v_k . (f0 - Y), (N, k).
    evals, evecs, positive, y, residual = _train_spectrum(
        ntk_train_train, y_train, f0_train
    )
    test_basis = None
    f0_star = None
    if ntk_test_train is not None:
        test_basis = ntk_test_train.to(f64) @ evecs  # Theta(X*, X) V, (M, N)
        m = ntk_test_train.shape[0]
        f0_star = (
            torch.zeros(m, y.shape[1], dtype=f64, device=device)
            if f0_test is None
            else f0_test.to(f64).reshape(m, -1)
        )

    def predict(t: Union[float, Tensor]) -> tuple[Tensor, Optional[Tensor]]:
        times, scalar = _check_times(t, discrete)
        decay, gain = _decay_and_gain(evals, positive, eta / n, times.to(device), discrete)
        f_train = y + torch.einsum("nk,tk,kc->tnc", evecs, decay, residual)
        f_train = f_train.reshape((len(times), n) + tail).to(out_dtype)
        f_test = None
        if test_basis is not None:
            f_test = f0_star - torch.einsum("mk,tk,kc->tmc", test_basis, gain, residual)
            f_test = f_test.reshape((len(times), test_basis.shape[0]) + tail).to(out_dtype)
        if scalar:
            f_train = f_train[0]
            f_test = None if f_test is None else f_test[0]
        return f_train, f_test

    return predict


def mse_loss_curve(
    ntk_train_train: Tensor,
    y_train: Tensor,
    f0_train: Optional[Tensor],
    times: Union[float, Tensor],
    *,
    learning_rate: float = 1.0,
    discrete: bool = False,
) -> Tensor:
    """Training loss along the gradient flow, from the spectrum of the NTK.

    With :math:`\\Theta = \\sum_k \\lambda_k v_k v_k^\\top` and the initial residual
    :math:`\\delta y = Y - f_0(X)`,

    .. math::
        L_t = \\frac{1}{2N}\\sum_k e^{-2\\eta\\lambda_k t/N}\\,
        \\lVert v_k^\\top \\delta y\\rVert^2,

    the slides' "training time prediction" formula (their eq. 5) written for the loss
    :math:`L = \\frac{1}{2N}\\lVert f(X) - Y\\rVert_F^2` of :func:`gd_mse_predictor`
    (same normalisation and time units, so ``L_t`` equals the loss of that predictor's
    ``f_train_t``). For ``(N, k)`` targets the norm sums over the ``k`` columns.
    Derived in chapter 1 (chapters/01_ntk.ipynb), section "Training dynamics in closed
    form".

    Shapes: ``times`` a float (returns a 0-d tensor) or ``(T,)`` (returns ``(T,)``).
    Cost :math:`O(N^3 + T N)`. Float64 inside, returned in ``ntk_train_train``'s dtype.

    Args:
        ntk_train_train: ``(N, N)`` symmetric PSD kernel.
        y_train: ``(N,)`` or ``(N, k)`` targets.
        f0_train: initial outputs shaped like ``y_train`` (``None``: zero).
        times: non-negative time(s); ``inf`` allowed.
        learning_rate: :math:`\\eta > 0`.
        discrete: ``True`` for whole steps of gradient descent, whose modes decay as
            :math:`(1 - \\eta\\lambda_k/N)^{2t}` (see :func:`gd_mse_predictor`).
    """
    ntk_train_train, y_train, f0_train, eta = _check_mse_arguments(
        ntk_train_train, y_train, f0_train, learning_rate
    )
    discrete = _check_discrete(discrete)
    t, scalar = _check_times(times, discrete)
    n = ntk_train_train.shape[0]
    evals, _, positive, _, residual = _train_spectrum(ntk_train_train, y_train, f0_train)
    # ||v_k^T dy||^2 with dy = Y - f0 = -residual_k.
    weights = (residual**2).sum(1)  # (N,)
    decay, _ = _decay_and_gain(evals, positive, eta / n, t.to(ntk_train_train.device), discrete)
    loss = (decay**2 * weights).sum(1) / (2.0 * n)
    loss = loss.to(ntk_train_train.dtype)
    return loss[0] if scalar else loss


class GaussianPrediction(NamedTuple):
    """Mean and covariance of the test outputs of an ensemble of infinitely wide
    networks (:func:`gd_mse_ensemble`)."""

    mean: Tensor  #: ``(M,)`` / ``(M, k)``, or with a leading time axis ``(T, ...)``
    covariance: Tensor  #: ``(M, M)`` (shared by the k outputs), or ``(T, M, M)``


def gd_mse_ensemble(
    nngp_train_train: Tensor,
    ntk_train_train: Tensor,
    y_train: Tensor,
    *,
    nngp_test_train: Tensor,
    ntk_test_train: Tensor,
    nngp_test_test: Tensor,
    learning_rate: float = 1.0,
    discrete: bool = False,
) -> Callable[[Union[float, Tensor]], GaussianPrediction]:
    """Output distribution of infinitely wide networks trained by gradient descent on MSE.

    At initialisation the outputs of a wide network are a Gaussian process with the
    NNGP kernel :math:`K`; with a constant NTK :math:`\\Theta` training is linear in
    them, so the outputs at time ``t`` stay Gaussian over random initialisations (Lee et
    al. 2019, eqs. 14-16). With :math:`A_t = \\Theta(X^*, X)\\,\\Theta^{-1}(I -
    D_t)`, where :math:`D_t = e^{-\\eta\\Theta t/N}` (flow) or :math:`(I -
    \\eta\\Theta/N)^t` (``discrete``, ``t`` whole steps):

    .. math::
        \\mu_t(X^*) &= A_t Y,\\\\
        \\Sigma_t(X^*, X^*) &= K(X^*, X^*) + A_t K(X, X) A_t^\\top
        - A_t K(X, X^*) - K(X^*, X) A_t^\\top .

    The loss and time conventions are those of :func:`gd_mse_predictor` (loss
    :math:`\\frac{1}{2N}\\lVert f(X) - Y\\rVert_F^2`); neural-tangents'
    ``predict.gradient_descent_mse_ensemble`` divides by :math:`Nk` instead, so its
    ``learning_rate`` is ours times ``k``. Each of the ``k`` output columns is an
    independent draw with the same covariance. Derived in chapter 1
    (chapters/01_ntk.ipynb), section "The output distribution of an infinitely wide
    ensemble".

    Cost: one eigendecomposition :math:`O(N^3)`, then :math:`O(T (M N^2 + M^2 N))` per
    call for ``T`` times and ``M`` test points. Float64 inside, returned in
    ``ntk_train_train``'s dtype.

    Args:
        nngp_train_train: :math:`K(X, X)`, ``(N, N)``.
        ntk_train_train: :math:`\\Theta(X, X)`, ``(N, N)`` symmetric PSD.
        y_train: ``(N,)`` or ``(N, k)`` targets.
        nngp_test_train: :math:`K(X^*, X)`, ``(M, N)``.
        ntk_test_train: :math:`\\Theta(X^*, X)`, ``(M, N)``.
        nngp_test_test: :math:`K(X^*, X^*)`, ``(M, M)``.
        learning_rate: :math:`\\eta > 0`.
        discrete: ``True`` for whole steps of gradient descent, ``False`` for the flow.

    Returns:
        ``predict(t) -> GaussianPrediction(mean, covariance)``; ``t`` a float (``inf``
        allowed) or a 1-D tensor of ``T`` times (a leading time axis on both fields).
    """
    ntk_train_train, y_train, _, eta = _check_mse_arguments(
        ntk_train_train, y_train, None, learning_rate
    )
    discrete = _check_discrete(discrete)
    n = ntk_train_train.shape[0]
    device = ntk_train_train.device
    nngp_train_train = _check_like(
        "nngp_train_train", nngp_train_train, (n, n), device
    )
    ntk_test_train = _check_test_train(ntk_test_train, n)
    m = ntk_test_train.shape[0]
    nngp_test_train = _check_like("nngp_test_train", nngp_test_train, (m, n), device)
    nngp_test_test = _check_like("nngp_test_test", nngp_test_test, (m, m), device)
    out_dtype = ntk_train_train.dtype
    tail = tuple(y_train.shape[1:])
    f64 = torch.float64
    evals, evecs, positive, y, _ = _train_spectrum(ntk_train_train, y_train, None)
    test_basis = ntk_test_train.to(f64) @ evecs  # Theta(X*, X) V, (M, N)
    k_train = evecs.T @ nngp_train_train.to(f64) @ evecs  # V^T K V, (N, N)
    k_cross = nngp_test_train.to(f64) @ evecs  # K(X*, X) V, (M, N)
    k_test = nngp_test_test.to(f64)
    y_basis = evecs.T @ y  # (N, k)

    def predict(t: Union[float, Tensor]) -> GaussianPrediction:
        times, scalar = _check_times(t, discrete)
        _, gain = _decay_and_gain(evals, positive, eta / n, times.to(device), discrete)
        a_basis = test_basis[None] * gain[:, None, :]  # A_t V = Theta* V diag(gain), (T, M, N)
        mean = a_basis @ y_basis  # (T, M, k)
        cross = a_basis @ k_cross.T  # A_t K(X, X*), (T, M, M)
        cov = k_test + a_basis @ k_train @ a_basis.transpose(1, 2) - cross - cross.transpose(1, 2)
        mean = mean.reshape((len(times), m) + tail).to(out_dtype)
        cov = cov.to(out_dtype)
        if scalar:
            return GaussianPrediction(mean[0], cov[0])
        return GaussianPrediction(mean, cov)

    return predict


# --------------------------------------------------------------------------------------
# Linearized network
# --------------------------------------------------------------------------------------


class LinearizedModel(nn.Module):
    """First-order Taylor expansion of a model around its parameters at creation.

    :math:`f^{lin}(x;\\theta) = f(x;\\theta_0) + \\langle\\nabla_\\theta f(x;\\theta_0),
    \\theta - \\theta_0\\rangle` (Lee et al. 2019, eq. 6; slides, "Lazy regime"). The
    trainable parameters of this module are :math:`\\theta` (initialised at
    :math:`\\theta_0`, one per trainable parameter of the original, in the same order);
    :math:`\\theta_0` lives in a frozen copy of the original model, ``self.base``. The
    forward pass is one ``torch.func.jvp`` of the base model in the direction
    :math:`\\theta - \\theta_0`: cost about three forward passes, no Jacobian. Build it
    with :func:`linearize`.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        names = [n for n, p in model.named_parameters() if p.requires_grad]
        if not names:
            raise ValueError("model has no trainable parameter (requires_grad=True)")
        base = copy.deepcopy(model)
        for p in base.parameters():
            p.requires_grad_(False)
        self.base = base
        self.param_names = names
        base_params = dict(base.named_parameters())
        self.params = nn.ParameterList(
            [nn.Parameter(base_params[n].detach().clone()) for n in names]
        )

    def theta0(self) -> dict[str, Tensor]:
        """The expansion point :math:`\\theta_0` by parameter name."""
        base_params = dict(self.base.named_parameters())
        return {n: base_params[n] for n in self.param_names}

    def forward(self, x: Tensor) -> Tensor:
        primals = self.theta0()
        tangents = {
            n: p - primals[n] for n, p in zip(self.param_names, self.params)
        }
        slots = _substitution_names(self.base, self.param_names)
        out, dout = jvp(
            lambda p: _call_with(self.base, slots, p, x), (primals,), (tangents,)
        )
        return out + dout


def linearize(model: nn.Module) -> LinearizedModel:
    """Linearize ``model`` around its current parameters :math:`\\theta_0`.

    Returns a :class:`LinearizedModel` computing :math:`f^{lin}(x;\\theta) =
    f(x;\\theta_0) + \\langle\\nabla_\\theta f(x;\\theta_0), \\theta - \\theta_0\\rangle`
    whose trainable parameters :math:`\\theta` start at :math:`\\theta_0`, so it trains
    with any torch optimizer exactly like the original (same loss code). Its
    empirical NTK is that of ``model`` at :math:`\\theta_0`, for every :math:`\\theta`.
    The original model is deep-copied and left untouched. Derived in chapter 1
    (chapters/01_ntk.ipynb), section "Wide networks train like linear models".
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    return LinearizedModel(model)


# --------------------------------------------------------------------------------------
# small local checks
# --------------------------------------------------------------------------------------


def _check_generator(generator: object) -> None:
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(
            f"generator must be a torch.Generator or None, got {type(generator).__name__}"
        )


def _check_float32_or_64(name: str, x: Tensor) -> Tensor:
    if x.dtype not in (torch.float32, torch.float64):
        raise TypeError(f"{name} must be float32 or float64, got {x.dtype}")
    return x


def _check_float_dtype(name: str, dtype: object) -> torch.dtype:
    if dtype is None:
        return torch.get_default_dtype()
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"{name} must be a floating-point torch.dtype, got {dtype!r}")
    return dtype
