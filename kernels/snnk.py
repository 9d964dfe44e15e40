"""Scalable neural network kernel (SNNK) layers, the SNNK adapter, and bundling.

Package side of chapters 2 and 3 (``chapters/02_random_features.ipynb``,
``chapters/03_bundling.ipynb``); the feature maps live in :mod:`kernels.features`.
"The paper" is Sehanobish et al. (2024), *Scalable Neural Network Kernels*, ICLR.

Layers
    :class:`SNNKLinear` replaces ``Linear + activation``: ``y = Phi(x) @ omega.T`` with
    trainable ``omega`` of shape ``(l, M)`` (rows :math:`\\omega_j = \\Psi(w_j, b_j)`, eq. 4),
    ``O(M l)`` parameters instead of ``O(d l)``. Activations: ``"sin"``, ``"cos"`` (exact
    URF atoms), ``"relu"`` (ReLU-SNNK, Sec. 3.2, the arc-cosine layer), ``"gelu"``,
    ``"tanh"``, ... or any :class:`~kernels.features.Spectrum` (sampled URFs).
    ``SNNKLinear.from_linear(linear, activation, num_features)`` sends pretrained
    weights through :math:`\\Psi`. :class:`SNNKAdapter` is Appendix D's
    ``Y = v * SNNK(X) + X`` with the gate ``v`` initialised at zero;
    :class:`BottleneckAdapter` is the Houlsby baseline. :class:`FeedForward` is the exact
    ``f(W x + b)`` layer that an SNNK layer estimates (the reference in tests/plots).

Bundling API (Sec. 3.3, eq. 14) -- what chapter 3 uses
    ``net = bundle(layers, num_features=m, generator=g)`` collapses a chain of layers
    into a :class:`BundledNetwork`: ``net(x) = features(x) @ net.weight.T + net.bias``
    with ``features(x) = Phi_L(...Phi_1(x))`` (``net.feature_maps``). ``layers`` is a
    list of: optionally one :class:`SNNKLinear` first (its trained ``omega`` is used as
    it is), then any number of :class:`FeedForward` layers (original weights; each one
    gets a new feature map on the current feature dimension and
    :math:`W \\leftarrow \\Psi_i(W_i W, b_i)`), then optionally one plain ``nn.Linear``
    last (merged exactly: ``W <- W_out W``, ``bias = b_out``). Examples:
    ``bundle([snnk, classifier])`` (pooler + classifier, App. E; FFN top half + down
    projection, J.4) is exact: it equals ``classifier(snnk(x))`` to rounding.
    ``bundle([FeedForward(l1, "sin"), FeedForward(l2, "sin"), head], num_features=m)``
    is the deep bundling of eq. 14 (an estimate whose error grows with depth, App. B).
    ``BundledNetwork.untrained(d_in, d_out, ["relu", "relu"], m)`` builds the feature
    pipeline of a fully bundled network with random weights, and
    ``net.fit(x, y, ridge=lam)`` sets ``weight``/``bias`` by closed-form least squares
    (:func:`least_squares`; no backpropagation). ``net.parameter_count()`` and
    ``net.flops_per_input()`` give the storage/FLOP figures for tables.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence, Tuple, Union

import torch
from torch import Tensor, nn

from kernels._checks import check_nonnegative_float, check_positive_int, check_tensor
from kernels.features import ReLUMap, Spectrum, URFMap

__all__ = [
    "make_feature_map",
    "SNNKLinear",
    "FeedForward",
    "SNNKAdapter",
    "BottleneckAdapter",
    "BundledNetwork",
    "bundle",
    "least_squares",
    "count_trainable",
]

Activation = Union[str, Spectrum]
FeatureMap = Union[URFMap, ReLUMap]


def count_trainable(module: nn.Module) -> int:
    """Number of trainable (``requires_grad``) parameters of a module."""
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


def make_feature_map(
    in_features: int,
    activation: Activation,
    num_features: int,
    *,
    A: float = 0.0,
    orthogonal: bool = False,
    bias: bool = True,
    generator: Optional[torch.Generator] = None,
    dtype: torch.dtype = torch.float32,
) -> FeatureMap:
    """The feature map pair for an activation: :class:`ReLUMap` for ``"relu"``, else :class:`URFMap`.

    ``bias`` only matters for ``"relu"`` (input augmentation ``[x, 1]``); URFs put the bias
    in the phase :math:`e^{i\\alpha b}` of :math:`\\Psi`.
    """
    if isinstance(activation, str) and activation == "relu":
        return ReLUMap(in_features, num_features, bias=bias, orthogonal=orthogonal, generator=generator, dtype=dtype)
    if not isinstance(activation, (str, Spectrum)):
        raise TypeError(f"activation must be a name or a Spectrum, got {type(activation).__name__}")
    return URFMap(in_features, activation, num_features, A=A, orthogonal=orthogonal, generator=generator, dtype=dtype)


def _linear_init(out_features: int, in_features: int, generator, dtype) -> Tuple[Tensor, Tensor]:
    # nn.Linear's default: U(-1/sqrt(d), 1/sqrt(d)) for weight and bias, drawn from `generator`
    bound = 1.0 / math.sqrt(in_features)
    w = (torch.rand(out_features, in_features, generator=generator, dtype=dtype) * 2 - 1) * bound
    b = (torch.rand(out_features, generator=generator, dtype=dtype) * 2 - 1) * bound
    return w, b


class SNNKLinear(nn.Module):
    """SNNK layer (eq. 4): a drop-in for ``nn.Linear(d, l)`` followed by an activation.

    ``forward(x) = feature_map.phi(x) @ omega.T``; ``omega`` (l, M) is the only trainable
    tensor (the Gaussian projections are buffers). At construction ``omega = Psi(W, b)``
    for weights drawn like ``nn.Linear``'s default initialisation (Appendix C: random
    weights for untrained networks), so at initialisation the layer estimates
    ``f(W x + b)`` for an ordinary random layer; :meth:`from_linear` does the same with
    pretrained weights. With ``activation="relu"`` it is the ReLU-SNNK layer of Sec. 3.2,
    which estimates :math:`\\tfrac12 K_1([w,b],[x,1])`, not ``relu(W x + b)``.

    Shapes: (..., in_features) -> (..., out_features). Parameters: ``M * l`` where ``M =
    feature_map.out_features``. Cost per input: O(M d + M l) (vs O(d l)).
    Chapter 2, section "SNNK layers".
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        num_features: int,
        activation: Activation = "relu",
        *,
        A: float = 0.0,
        orthogonal: bool = False,
        bias: bool = True,
        generator: Optional[torch.Generator] = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        d = check_positive_int("in_features", in_features)
        l = check_positive_int("out_features", out_features)
        self.in_features, self.out_features = d, l
        self.activation = activation
        self.feature_map = make_feature_map(
            d, activation, num_features, A=A, orthogonal=orthogonal, bias=bias, generator=generator, dtype=dtype
        )
        w, b = _linear_init(l, d, generator, dtype)
        self.omega = nn.Parameter(self.feature_map.psi(w, b if bias else None).detach())

    @classmethod
    def from_linear(
        cls,
        linear: nn.Linear,
        activation: Activation,
        num_features: int,
        *,
        A: float = 0.0,
        orthogonal: bool = False,
        generator: Optional[torch.Generator] = None,
    ) -> "SNNKLinear":
        """SNNK layer whose ``omega = Psi(W, b)`` comes from a (pretrained) ``nn.Linear``."""
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"linear must be an nn.Linear, got {type(linear).__name__}")
        w = linear.weight.detach()
        b = linear.bias.detach() if linear.bias is not None else None
        layer = cls(
            linear.in_features, linear.out_features, num_features, activation,
            A=A, orthogonal=orthogonal, bias=True, generator=generator, dtype=w.dtype,
        )
        layer.omega = nn.Parameter(layer.feature_map.psi(w, b).detach().to(w.device))
        return layer.to(w.device)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, features={self.feature_map.out_features}"

    def features(self, x: Tensor) -> Tensor:
        """:math:`\\Phi(x)`: (..., d) -> (..., M)."""
        return self.feature_map.phi(x)

    def forward(self, x: Tensor) -> Tensor:
        return self.feature_map.phi(x) @ self.omega.T


class FeedForward(nn.Module):
    """The exact layer an SNNK layer estimates: ``f(x W^T + b)`` for sin/cos/spectra,
    :math:`\\tfrac12 K_1([w,b],[x,1])` for ``"relu"`` (the arc-cosine layer of Sec. 3.2).

    For a :class:`~kernels.features.Spectrum` ``f`` is ``spectrum.evaluate`` (the windowed,
    smoothed activation the URFs estimate without bias). Used as the reference network in
    tests and figures, and as the input of :func:`bundle`. Shapes (..., d) -> (..., l).
    """

    def __init__(self, linear: nn.Linear, activation: Activation) -> None:
        super().__init__()
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"linear must be an nn.Linear, got {type(linear).__name__}")
        if isinstance(activation, str) and activation not in ("relu", "sin", "cos"):
            from kernels.features import spectrum_from_name

            activation = spectrum_from_name(activation)
        elif not isinstance(activation, (str, Spectrum)):
            raise TypeError(f"activation must be a name or a Spectrum, got {type(activation).__name__}")
        self.linear = linear
        self.activation = activation

    def forward(self, x: Tensor) -> Tensor:
        w, b = self.linear.weight, self.linear.bias
        if self.activation == "relu":
            from kernels.features import arccos_kernel

            if b is None:
                b = torch.zeros(w.shape[0], dtype=w.dtype, device=w.device)
            xa = torch.cat([x, torch.ones(*x.shape[:-1], 1, dtype=x.dtype, device=x.device)], -1)
            wa = torch.cat([w, b[:, None]], -1)
            flat = xa.reshape(-1, xa.shape[-1])
            return 0.5 * arccos_kernel(flat, wa, 1).reshape(*x.shape[:-1], w.shape[0])
        u = self.linear(x)
        if self.activation == "sin":
            return torch.sin(u)
        if self.activation == "cos":
            return torch.cos(u)
        return self.activation.evaluate(u)


class SNNKAdapter(nn.Module):
    """SNNK adapter of Appendix D (eq. 22): :math:`Y = v \\odot \\mathrm{SNNK}(X) + X`.

    ``SNNK`` is an :class:`SNNKLinear` ``dim -> dim`` (no bias, as in eq. 21) and the gate
    ``v`` starts at zero, so the block is the identity at initialisation. Trainable
    parameters: ``M * dim + dim``. Shapes (..., dim) -> (..., dim). Chapter 2.
    """

    def __init__(
        self,
        dim: int,
        num_features: int,
        activation: Activation = "relu",
        *,
        generator: Optional[torch.Generator] = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        self.snnk = SNNKLinear(dim, dim, num_features, activation, bias=False, generator=generator, dtype=dtype)
        self.gate = nn.Parameter(torch.zeros(dim, dtype=dtype))

    def forward(self, x: Tensor) -> Tensor:
        return x + self.gate * self.snnk(x)


class BottleneckAdapter(nn.Module):
    """Houlsby bottleneck adapter: :math:`Y = X + W_{up}\\,\\mathrm{GELU}(W_{down} X)`, up-projection at zero.

    Trainable parameters: ``2 * dim * bottleneck + dim + bottleneck``.
    """

    def __init__(self, dim: int, bottleneck: int, *, generator: Optional[torch.Generator] = None,
                 dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        d = check_positive_int("dim", dim)
        k = check_positive_int("bottleneck", bottleneck)
        w, b = _linear_init(k, d, generator, dtype)
        self.down = nn.Linear(d, k, dtype=dtype)
        self.up = nn.Linear(k, d, dtype=dtype)
        with torch.no_grad():
            self.down.weight.copy_(w)
            self.down.bias.copy_(b)
            self.up.weight.zero_()
            self.up.bias.zero_()

    def forward(self, x: Tensor) -> Tensor:
        return x + self.up(torch.nn.functional.gelu(self.down(x)))


# --------------------------------------------------------------------------- least squares
def least_squares(
    features: Tensor, targets: Tensor, *, ridge: float = 0.0, fit_bias: bool = True
) -> Tuple[Tensor, Tensor]:
    """Closed-form MSE fit of a fully bundled network: :math:`\\min_{W,c} \\|\\hat X W^\\top + c - Y\\|^2
    + \\lambda\\|W\\|^2` (Sec. 3.3, App. J.3).

    With ``fit_bias`` the columns are centred first (the intercept is not penalised).
    ``ridge == 0``: minimum-norm least squares (``torch.linalg.lstsq``, driver ``gelsd``,
    like ``numpy.linalg.lstsq``). ``ridge > 0``: the normal equations
    :math:`(\\hat X^\\top\\hat X + \\lambda I) W^\\top = \\hat X^\\top Y`, or the dual
    :math:`W^\\top = \\hat X^\\top(\\hat X\\hat X^\\top + \\lambda I)^{-1} Y` when ``M > n``.

    Shapes: features (n, M), targets (n, k) or (n,) -> weight (k, M), bias (k,) (zeros
    when not fitted); a 1-D target gives weight (1, M). Cost O(n M min(n, M)).
    """
    check_tensor("features", features, ndim=2)
    check_tensor("targets", targets, ndim=(1, 2))
    lam = check_nonnegative_float("ridge", ridge)
    if targets.shape[0] != features.shape[0]:
        raise ValueError(
            f"features and targets must have the same number of rows, got {features.shape[0]} and {targets.shape[0]}"
        )
    y = targets[:, None] if targets.ndim == 1 else targets
    y = y.to(features.dtype)
    x = features
    if fit_bias:
        x_mean, y_mean = x.mean(0, keepdim=True), y.mean(0, keepdim=True)
        x, y = x - x_mean, y - y_mean
    n, m = x.shape
    if lam == 0.0:
        driver = "gelsd" if x.device.type == "cpu" else None
        sol = torch.linalg.lstsq(x, y, driver=driver).solution  # (M, k)
    elif m <= n:
        gram = x.T @ x + lam * torch.eye(m, dtype=x.dtype, device=x.device)
        sol = torch.linalg.solve(gram, x.T @ y)
    else:
        gram = x @ x.T + lam * torch.eye(n, dtype=x.dtype, device=x.device)
        sol = x.T @ torch.linalg.solve(gram, y)
    weight = sol.T.contiguous()
    if fit_bias:
        bias = (y_mean - x_mean @ sol).reshape(-1)
    else:
        bias = torch.zeros(weight.shape[0], dtype=x.dtype, device=x.device)
    return weight, bias


# --------------------------------------------------------------------------- bundling
class BundledNetwork(nn.Module):
    """A bundled network (eq. 14): :math:`\\hat y = W \\hat x + c`, :math:`\\hat x = \\Phi_L(\\dots\\Phi_1(x))`.

    ``feature_maps`` (an ``nn.ModuleList`` of feature maps, frozen buffers) turn the input
    into :math:`\\hat x` of length ``M_L``; ``weight`` (k, M_L) and ``bias`` (k,) are the
    only parameters. Build one with :func:`bundle` (from layers) or :meth:`untrained`
    (random features for a closed-form fit with :meth:`fit`). Chapter 3.
    """

    def __init__(self, feature_maps: Sequence[FeatureMap], weight: Tensor, bias: Optional[Tensor] = None) -> None:
        super().__init__()
        if len(feature_maps) == 0:
            raise ValueError("feature_maps must contain at least one feature map")
        self.feature_maps = nn.ModuleList(feature_maps)
        check_tensor("weight", weight, ndim=2)
        if weight.shape[1] != feature_maps[-1].out_features:
            raise ValueError(
                f"weight must have {feature_maps[-1].out_features} columns (the last feature map's "
                f"output), got shape {tuple(weight.shape)}"
            )
        self.weight = nn.Parameter(weight.detach().clone())
        if bias is None:
            bias = torch.zeros(weight.shape[0], dtype=weight.dtype, device=weight.device)
        self.bias = nn.Parameter(bias.detach().clone())

    @classmethod
    def untrained(
        cls,
        in_features: int,
        out_features: int,
        activations: Sequence[Activation],
        num_features: Union[int, Sequence[int]],
        *,
        A: float = 0.0,
        generator: Optional[torch.Generator] = None,
        dtype: torch.dtype = torch.float32,
    ) -> "BundledNetwork":
        """Feature pipeline of a fully bundled network with ``len(activations)`` layers; W = 0.

        Only :math:`\\hat x` matters for a closed-form fit, so the hidden weights never need
        to exist: layer i's map acts on the previous feature vector (eq. 14).
        """
        maps = []
        dim = check_positive_int("in_features", in_features)
        ms = _per_layer(num_features, len(activations))
        for act, m in zip(activations, ms):
            fmap = make_feature_map(dim, act, m, A=A, generator=generator, dtype=dtype)
            maps.append(fmap)
            dim = fmap.out_features
        k = check_positive_int("out_features", out_features)
        return cls(maps, torch.zeros(k, dim, dtype=dtype))

    def features(self, x: Tensor) -> Tensor:
        """:math:`\\hat x = \\Phi_L(\\dots\\Phi_1(x))`: (..., d_0) -> (..., M_L)."""
        for fmap in self.feature_maps:
            x = fmap.phi(x)
        return x

    def forward(self, x: Tensor) -> Tensor:
        return self.features(x) @ self.weight.T + self.bias

    @torch.no_grad()
    def fit(self, x: Tensor, y: Tensor, *, ridge: float = 0.0) -> "BundledNetwork":
        """Set ``weight`` and ``bias`` by closed-form least squares on :math:`\\hat x` (no backprop)."""
        feats = self.features(x)
        if y.ndim == 1:
            y = y[:, None]
        if y.shape[-1] != self.weight.shape[0]:
            raise ValueError(f"y must have {self.weight.shape[0]} columns, got shape {tuple(y.shape)}")
        w, b = least_squares(feats, y, ridge=ridge)
        self.weight.copy_(w)
        self.bias.copy_(b)
        return self

    def parameter_count(self) -> int:
        """Stored parameters: ``weight`` and ``bias`` (the projections are regenerated from a seed)."""
        return self.weight.numel() + self.bias.numel()

    def flops_per_input(self) -> int:
        """Multiply-adds per input vector: each map's projection plus the final ``W x̂``."""
        total = 0
        for fmap in self.feature_maps:
            total += fmap.projections.numel()
        return total + self.weight.numel()


def _per_layer(num_features, n: int) -> list[int]:
    if isinstance(num_features, (list, tuple)):
        if len(num_features) != n:
            raise ValueError(f"num_features must have one entry per layer ({n}), got {len(num_features)}")
        return [check_positive_int("num_features", m) for m in num_features]
    return [check_positive_int("num_features", num_features)] * n


def bundle(
    layers: Sequence[nn.Module],
    *,
    num_features: Union[int, Sequence[int], None] = None,
    A: float = 0.0,
    orthogonal: bool = False,
    generator: Optional[torch.Generator] = None,
) -> BundledNetwork:
    """Bundle consecutive layers into one :class:`BundledNetwork` (Sec. 3.3, eq. 14).

    ``layers``: ``[SNNKLinear?] + [FeedForward]* + [nn.Linear?]`` (at least one layer with
    an activation). Walking the chain with :math:`W` the current bundled matrix:

    * a first :class:`SNNKLinear`: its feature map becomes :math:`\\Phi_1`, ``W = omega``;
    * a :class:`FeedForward` with weights :math:`(W_i, b_i)`: a new feature map
      :math:`\\Phi_i` on the current feature dimension (``num_features`` draws; one int or
      one per FeedForward) and :math:`W \\leftarrow \\Psi_i(W_i W, b_i)` (:math:`W_i` alone
      for the first layer);
    * a last ``nn.Linear``: :math:`W \\leftarrow W_{out} W`, bias :math:`b_{out}` -- exact.

    ``bundle([snnk, linear])(x) == linear(snnk(x))`` up to rounding. Cost: one
    :math:`\\Psi` per layer, O(d_{i+1} M_i d_i).
    """
    if isinstance(layers, nn.Module) or not isinstance(layers, (list, tuple, nn.ModuleList)):
        raise TypeError("layers must be a list of modules, e.g. [snnk_layer, nn.Linear(...)]")
    layers = list(layers)
    if not layers:
        raise ValueError("layers must not be empty")
    n_ffl = sum(isinstance(l, FeedForward) for l in layers)
    ms = _per_layer(num_features, n_ffl) if n_ffl else []
    maps: list[FeatureMap] = []
    weight: Optional[Tensor] = None
    bias: Optional[Tensor] = None
    used_m = 0
    for i, layer in enumerate(layers):
        last = i == len(layers) - 1
        if isinstance(layer, SNNKLinear):
            if i != 0:
                raise ValueError(
                    f"layers[{i}] is an SNNKLinear: only the first layer may be one (its omega is "
                    "tied to its own input); give later layers as FeedForward with their weights"
                )
            maps.append(layer.feature_map)
            weight = layer.omega.detach()
        elif isinstance(layer, FeedForward):
            if i > 0 and layer.linear.in_features != _prev_out(layers[i - 1]):
                raise ValueError(
                    f"layers[{i}] expects {layer.linear.in_features} inputs but layers[{i - 1}] has "
                    f"{_prev_out(layers[i - 1])} outputs"
                )
            w_i = layer.linear.weight.detach()
            b_i = layer.linear.bias.detach() if layer.linear.bias is not None else None
            eff = w_i if weight is None else w_i @ weight
            fmap = make_feature_map(
                eff.shape[1], layer.activation, ms[used_m], A=A, orthogonal=orthogonal,
                generator=generator, dtype=w_i.dtype,
            )
            used_m += 1
            maps.append(fmap)
            weight = fmap.psi(eff, b_i).detach()
        elif isinstance(layer, nn.Linear):
            if not last:
                raise ValueError(f"layers[{i}] is a plain nn.Linear: only the last layer may be one")
            if weight is None:
                raise ValueError("a plain nn.Linear needs a preceding SNNKLinear or FeedForward layer")
            if layer.in_features != weight.shape[0]:
                raise ValueError(
                    f"layers[{i}] expects {layer.in_features} inputs but the previous layer has "
                    f"{weight.shape[0]} outputs"
                )
            weight = layer.weight.detach() @ weight
            bias = layer.bias.detach() if layer.bias is not None else None
        else:
            raise TypeError(
                f"layers[{i}] must be SNNKLinear, FeedForward or nn.Linear, got {type(layer).__name__}"
            )
    if not maps:
        raise ValueError("layers must contain at least one SNNKLinear or FeedForward layer")
    return BundledNetwork(maps, weight, bias)


def _prev_out(layer: nn.Module) -> int:
    if isinstance(layer, SNNKLinear):
        return layer.out_features
    if isinstance(layer, FeedForward):
        return layer.linear.out_features
    return layer.out_features  # type: ignore[return-value]
