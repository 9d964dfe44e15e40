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
    (:func:`least_squares`; no backpropagation; :func:`ridge_cv` picks the ridge by
    k-fold cross-validation). ``net.parameter_count()`` and ``net.flops_per_input()``
    give the storage/FLOP figures for tables, :func:`bert_snnk_counts` the whole-model
    counts of the paper's Table 6. ``net.as_modules()`` splits a bundle into a
    :class:`FeatureTower` and an ``nn.Linear`` for model surgery, and
    :func:`with_bundled_ffn` swaps bundles into the FFN blocks of a BERT encoder (the FFN
    surgery lives in :mod:`kernels.surgery`; :mod:`kernels.ffn` re-exports :func:`bert_snnk_counts`).
    Bundling a ReLU-SNNK layer after another layer is biased (:class:`BundlingBiasWarning`).
"""

from __future__ import annotations

import copy
import math
import warnings
from typing import Iterable, Mapping, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor, nn

from kernels._checks import (
    check_float_dtype,
    check_input,
    check_nonempty,
    check_nonnegative_float,
    check_positive_float,
    check_positive_int,
    check_tensor,
)
from kernels.features import ReLUMap, Spectrum, URFMap, spectrum_from_name
from kernels.surgery import find_ffn_sites, set_submodule

__all__ = [
    "make_feature_map",
    "SNNKLinear",
    "FeedForward",
    "SNNKAdapter",
    "BottleneckAdapter",
    "BundledNetwork",
    "bundle",
    "least_squares",
    "ridge_cv",
    "count_trainable",
    "balanced_input_scale",
    "BundlingBiasWarning",
    "FeatureTower",
    "with_bundled_ffn",
    "bert_snnk_counts",
]

Activation = Union[str, Spectrum]
FeatureMap = Union[URFMap, ReLUMap]


def count_trainable(module: nn.Module) -> int:
    """Number of trainable (``requires_grad``) parameters of a module."""
    from kernels._checks import check_module

    check_module("module", module)
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

    ``input_scale`` s (URF activations only) uses :math:`f(w^\\top x + b) = f((s w)^\\top
    (x / s) + b)`: the layer computes :math:`\\Phi(x/s)^\\top\\Psi(s w, b)`, the same
    expectation with the input tower's exponent :math:`\\alpha^2\\|x\\|^2/2` divided by
    :math:`s^2`. :func:`balanced_input_scale` picks the s that minimises the estimator's
    second moment; use it when :class:`~kernels.features.FeatureOverflowWarning` fires.

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
        input_scale: float = 1.0,
        generator: Optional[torch.Generator] = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        d = check_positive_int("in_features", in_features)
        l = check_positive_int("out_features", out_features)
        self.in_features, self.out_features = d, l
        self.activation = activation
        self.input_scale = _check_input_scale(input_scale, activation)
        self.feature_map = make_feature_map(
            d, activation, num_features, A=A, orthogonal=orthogonal, bias=bias, generator=generator, dtype=dtype
        )
        w, b = _linear_init(l, d, generator, dtype)
        self.omega = nn.Parameter(self.feature_map.psi(w * self.input_scale, b if bias else None).detach())

    @classmethod
    def from_linear(
        cls,
        linear: nn.Linear,
        activation: Activation,
        num_features: int,
        *,
        A: float = 0.0,
        orthogonal: bool = False,
        input_scale: float = 1.0,
        generator: Optional[torch.Generator] = None,
    ) -> "SNNKLinear":
        """SNNK layer whose ``omega = Psi(s W, b)`` comes from a (pretrained) ``nn.Linear``.

        ``input_scale`` s: see the class docstring; ``balanced_input_scale(x_sample,
        linear.weight, activation)`` gives the variance-minimising value for typical inputs.
        """
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"linear must be an nn.Linear, got {type(linear).__name__}")
        w = linear.weight.detach()
        b = linear.bias.detach() if linear.bias is not None else None
        layer = cls(
            linear.in_features, linear.out_features, num_features, activation,
            A=A, orthogonal=orthogonal, bias=True, input_scale=input_scale, generator=generator, dtype=w.dtype,
        ).to(w.device)  # drawn on the CPU, then beside the weights before psi reads them
        layer.omega = nn.Parameter(layer.feature_map.psi(w * layer.input_scale, b).detach())
        return layer

    def extra_repr(self) -> str:
        scale = f", input_scale={self.input_scale:g}" if self.input_scale != 1.0 else ""
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"features={self.feature_map.out_features}{scale}")

    def features(self, x: Tensor) -> Tensor:
        """:math:`\\Phi(x / s)` with s = ``input_scale``: (..., d) -> (..., M)."""
        check_input("x", x, self.in_features, self.omega)
        if self.input_scale != 1.0:
            x = x / self.input_scale
        return self.feature_map.phi(x)

    def forward(self, x: Tensor) -> Tensor:
        return self.features(x) @ self.omega.T


def _check_input_scale(input_scale: float, activation: Activation) -> float:
    scale = check_positive_float("input_scale", input_scale)
    if scale != 1.0 and isinstance(activation, str) and activation == "relu":
        raise ValueError(
            "input_scale must be 1.0 for activation='relu': ReLU-SNNK features are linear in |x| and "
            "cannot overflow, and with the bias entry [x, 1] the arc-cosine kernel is not invariant "
            f"under x -> x/s, w -> s w (got input_scale={input_scale!r})"
        )
    return scale


def balanced_input_scale(x: Tensor, weight: Tensor, activation: Activation) -> float:
    """The input scale s that minimises a bound on the second moment of a URF layer's estimate.

    One complex feature product :math:`\\phi_j(x/s)\\psi_j(s w, b)` has
    :math:`E|\\phi_j\\psi_j|^2` proportional to
    :math:`\\exp(\\alpha^2\\|x\\|^2/s^2 + s^2\\|w\\|^2)`, a bound on the second moment of
    its real part, which the layer uses (A = 0; input tower
    :math:`e^{\\alpha^2\\|x\\|^2/2}`, eq. 8 with :math:`E[\\Lambda_g(w)^2] =
    e^{\\|w\\|^2}`). The exponent is smallest at :math:`s^2 = \\alpha\\|x\\|/\\|w\\|`,
    where it equals :math:`2\\alpha\\|x\\|\\|w\\|`. We take root-mean-square values: of
    :math:`\\|x\\|` over the rows of ``x``, of :math:`\\|w_j\\|` over the rows of ``weight``,
    and of :math:`\\alpha = 2\\pi\\xi` under the activation's spectrum.

    Shapes: ``x`` (..., d) (a sample of typical inputs), ``weight`` (l, d). Returns a
    float > 0. Not defined for ``"relu"`` (see :class:`SNNKLinear`). Chapter 3.
    """
    check_tensor("x", x)
    check_tensor("weight", weight, ndim=2)
    if x.shape[-1] != weight.shape[-1]:
        raise ValueError(
            f"x has {x.shape[-1]} features but weight has {weight.shape[-1]} columns"
        )
    if x.numel() == 0:
        raise ValueError(f"x must hold at least one input (a non-empty row), got shape {tuple(x.shape)}")
    check_nonempty("weight", weight, 0, "row")
    if isinstance(activation, str) and activation == "relu":
        raise ValueError("balanced_input_scale is for URF activations; 'relu' needs no input scale")
    spectrum = spectrum_from_name(activation)
    mass = spectrum.weights.real.abs() + spectrum.weights.imag.abs()
    alpha_rms = 2 * math.pi * math.sqrt(float((mass * spectrum.frequencies**2).sum() / mass.sum()))
    x_rms = math.sqrt(float((x.double() ** 2).sum(-1).mean()))
    w_rms = math.sqrt(float((weight.double() ** 2).sum(-1).mean()))
    if x_rms == 0.0 or w_rms == 0.0:
        raise ValueError("x and weight must not be all zeros (the balanced scale would be 0 or infinite)")
    return math.sqrt(alpha_rms * x_rms / w_rms)


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
        check_input("x", x, w.shape[1], w)
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
        check_float_dtype("dtype", dtype)
        check_positive_int("dim", dim)
        check_positive_int("num_features", num_features)
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
        check_float_dtype("dtype", dtype)
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
        check_input("x", x, self.down.in_features, self.down.weight, what="dim")
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
    check_nonempty("features", features, 0, "row (sample)")
    if features.dtype not in (torch.float32, torch.float64):
        raise TypeError(f"features must be float32 or float64 (LAPACK solvers), got {features.dtype}")
    if targets.ndim == 2:
        check_nonempty("targets", targets, 1, "column (output)")
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
        if x.device.type == "cpu":
            sol = torch.linalg.lstsq(x, y, driver="gelsd").solution  # (M, k), minimum norm
        else:
            # CUDA's lstsq has only 'gels', which assumes full rank (centring removes one);
            # the pseudo-inverse gives the same minimum-norm solution as gelsd.
            sol = torch.linalg.pinv(x) @ y
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


def ridge_cv(
    features: Tensor,
    targets: Tensor,
    ridges: Sequence[float],
    *,
    folds: int = 5,
    generator: Optional[torch.Generator] = None,
) -> float:
    """The ridge value with the smallest k-fold cross-validated squared error, each fold in closed form.

    The rows are shuffled once (``torch.randperm`` with ``generator``) and cut into
    ``folds`` nearly equal chunks; for every candidate :math:`\\lambda` and every chunk,
    :func:`least_squares` is fitted on the other chunks and its summed squared error on
    the held-out chunk is added up. Ties go to the first candidate in ``ridges``.

    Shapes: features (n, M), targets (n, k) or (n,); ``ridges`` a non-empty sequence of
    values >= 0; ``2 <= folds <= n``. Cost: ``len(ridges) * folds`` solves. Chapter 3.
    """
    check_tensor("features", features, ndim=2)
    check_tensor("targets", targets, ndim=(1, 2))
    n = features.shape[0]
    if targets.shape[0] != n:
        raise ValueError(f"features and targets must have the same number of rows, got {n} and {targets.shape[0]}")
    if isinstance(ridges, (str, bytes)) or not isinstance(ridges, Sequence) or len(ridges) == 0:
        raise ValueError(f"ridges must be a non-empty sequence of values >= 0, got {ridges!r}")
    candidates = [check_nonnegative_float(f"ridges[{i}]", lam) for i, lam in enumerate(ridges)]
    k = check_positive_int("folds", folds)
    if not 2 <= k <= n:
        raise ValueError(f"folds must be between 2 and the number of rows ({n}), got {k}")
    y = targets[:, None] if targets.ndim == 1 else targets
    chunks = torch.randperm(n, generator=generator).to(features.device).chunk(k)
    scores = []
    for lam in candidates:
        sse = 0.0
        for held_index, held in enumerate(chunks):
            kept = torch.cat([chunk for j, chunk in enumerate(chunks) if j != held_index])
            w, c = least_squares(features[kept], y[kept], ridge=lam)
            sse += float(((features[held] @ w.T + c) - y[held].to(features.dtype)).pow(2).sum())
        scores.append(sse)
    return float(ridges[min(range(len(scores)), key=scores.__getitem__)])


# --------------------------------------------------------------------------- bundling
class BundledNetwork(nn.Module):
    """A bundled network (eq. 14): :math:`\\hat y = W \\hat x + c`, :math:`\\hat x = \\Phi_L(\\dots\\Phi_1(x))`.

    ``feature_maps`` (an ``nn.ModuleList`` of feature maps, frozen buffers) turn the input
    into :math:`\\hat x` of length ``M_L``; ``weight`` (k, M_L) and ``bias`` (k,) are the
    only parameters. Build one with :func:`bundle` (from layers) or :meth:`untrained`
    (random features for a closed-form fit with :meth:`fit`). Chapter 3.
    """

    def __init__(
        self,
        feature_maps: Sequence[FeatureMap],
        weight: Tensor,
        bias: Optional[Tensor] = None,
        *,
        input_scale: float = 1.0,
    ) -> None:
        super().__init__()
        feature_maps = _check_feature_maps(feature_maps)
        self.feature_maps = nn.ModuleList(feature_maps)
        self.input_scale = check_positive_float("input_scale", input_scale)
        check_tensor("weight", weight, ndim=2)
        if weight.shape[1] != feature_maps[-1].out_features:
            raise ValueError(
                f"weight must have {feature_maps[-1].out_features} columns (the last feature map's "
                f"output), got shape {tuple(weight.shape)}"
            )
        self.weight = nn.Parameter(weight.detach().clone())
        if bias is None:
            bias = torch.zeros(weight.shape[0], dtype=weight.dtype, device=weight.device)
        check_tensor("bias", bias, ndim=1)
        if bias.shape[0] != weight.shape[0]:
            raise ValueError(f"bias must have {weight.shape[0]} entries (weight's rows), got shape {tuple(bias.shape)}")
        self.bias = nn.Parameter(bias.detach().clone().to(device=weight.device, dtype=weight.dtype))

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
        """:math:`\\hat x = \\Phi_L(\\dots\\Phi_1(x / s))`: (..., d_0) -> (..., M_L); s = ``input_scale``."""
        return _apply_maps(self.feature_maps, x, self.input_scale)

    def forward(self, x: Tensor) -> Tensor:
        check_input("x", x, self.feature_maps[0].in_features, self.weight)
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

    def multiply_adds(self) -> int:
        """Multiply-adds per token: :meth:`flops_per_input` (:math:`m' d + dM`)."""
        return int(self.flops_per_input())

    def as_modules(self) -> Tuple["FeatureTower", nn.Linear]:
        """The bundle as two modules, ``tower(x) = features(x)`` and ``linear(tower(x)) = self(x)``.

        The pair drops into a model where an FFN's up- and down-projections were
        (e.g. ``BertIntermediate`` and ``BertOutput.dense``, see :func:`with_bundled_ffn`).
        The ``nn.Linear`` holds a copy of ``weight`` and ``bias``; the tower shares the maps.
        """
        k, m = self.weight.shape
        linear = nn.Linear(m, k, dtype=self.weight.dtype, device=self.weight.device)
        with torch.no_grad():
            linear.weight.copy_(self.weight)
            linear.bias.copy_(self.bias)
        return FeatureTower(list(self.feature_maps), input_scale=self.input_scale), linear


class FeatureTower(nn.Module):
    """The input tower of a bundle as a module: :math:`x \\mapsto \\Phi_L(\\dots\\Phi_1(x / s))`.

    Used for model surgery (Sec. 4.4, App. J.4): it takes the place of an FFN's
    up-projection and activation, and an ``nn.Linear`` holding :math:`\\widehat W` takes
    the place of the down-projection. No trainable parameters (the maps hold buffers).
    Shapes (..., d) -> (..., M_L). Chapter 3.
    """

    def __init__(self, feature_maps: Union[FeatureMap, Sequence[FeatureMap]], *, input_scale: float = 1.0) -> None:
        super().__init__()
        maps = _check_feature_maps(feature_maps)
        self.feature_maps = nn.ModuleList(maps)
        self.input_scale = check_positive_float("input_scale", input_scale)

    def forward(self, x: Tensor) -> Tensor:
        return _apply_maps(self.feature_maps, x, self.input_scale)


def with_bundled_ffn(model: nn.Module, bundles: Mapping[int, "BundledNetwork"]) -> nn.Module:
    """A copy of a BERT-style encoder whose FFN blocks ``i in bundles`` compute ``bundles[i](x)``.

    For a Hugging Face BERT layer (``model.encoder.layer[i]`` with ``.intermediate`` =
    up-projection + activation and ``.output.dense`` = down-projection), the
    intermediate becomes the bundle's :class:`FeatureTower` and ``output.dense`` an
    ``nn.Linear`` holding :math:`\\widehat W` and the bias; dropout, residual and layer
    norm inside ``.output`` stay (Sec. 4.4, App. J.4). ``model`` is not modified; the
    copy is returned in eval mode. Each bundle must map the hidden size to itself.
    Chapter 3 and ``benchmarks/bench_bundling.py``.
    """
    layers = getattr(getattr(model, "encoder", None), "layer", None)
    if not isinstance(layers, nn.ModuleList):
        raise TypeError(f"model must be a BERT-style encoder with model.encoder.layer, got {type(model).__name__}")
    if not isinstance(bundles, Mapping):
        raise TypeError(f"bundles must be a mapping layer index -> BundledNetwork, got {type(bundles).__name__}")
    for i, net in bundles.items():
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < len(layers):
            raise ValueError(f"bundles keys must be layer indices in [0, {len(layers)}), got {i!r}")
        if not isinstance(net, BundledNetwork):
            raise TypeError(f"bundles[{i}] must be a BundledNetwork, got {type(net).__name__}")
        hidden = layers[i].output.dense.out_features
        if net.weight.shape[0] != hidden or net.feature_maps[0].in_features != hidden:
            raise ValueError(
                f"bundles[{i}] must map {hidden} inputs to {hidden} outputs, got "
                f"{net.feature_maps[0].in_features} -> {net.weight.shape[0]}"
            )
    new = copy.deepcopy(model)
    try:
        places = {s.index: (s.path, s.parts[2]) for s in find_ffn_sites(new)}
    except ValueError:  # every FFN already replaced
        places = {}
    for i, net in bundles.items():
        tower, down = net.as_modules()
        # The bundle's two halves take the places of the FFN's two halves (kernels.surgery
        # surgery, with the down-projection kept as a Linear for chapter 3's counts); a
        # layer bundled before is found by its BERT names.
        up_path, down_path = places.get(i, (f"encoder.layer.{i}.intermediate", f"encoder.layer.{i}.output.dense"))
        set_submodule(new, up_path, tower)
        set_submodule(new, down_path, down)
    return new.eval()


class BundlingBiasWarning(UserWarning):
    """A bundle that is biased however many random features it uses (see :func:`bundle`)."""


def _check_feature_maps(feature_maps: object) -> list[FeatureMap]:
    """A URFMap/ReLUMap or a non-empty sequence of them, each taking the previous one's
    output (``TypeError``/``ValueError`` naming ``feature_maps`` otherwise)."""
    if isinstance(feature_maps, (URFMap, ReLUMap)):
        return [feature_maps]
    if (isinstance(feature_maps, (str, bytes)) or not isinstance(feature_maps, Iterable)
            or isinstance(feature_maps, nn.Module) and not isinstance(feature_maps, nn.ModuleList)):
        raise TypeError(f"feature_maps must be a URFMap/ReLUMap or a non-empty sequence of them, got "
                        f"{type(feature_maps).__name__}")
    maps = list(feature_maps)
    if not maps:
        raise ValueError("feature_maps must contain at least one feature map")
    for i, fmap in enumerate(maps):
        if not isinstance(fmap, (URFMap, ReLUMap)):
            raise TypeError(f"feature_maps[{i}] must be a URFMap or ReLUMap, got {type(fmap).__name__}")
        if i and fmap.in_features != maps[i - 1].out_features:
            raise ValueError(f"feature_maps[{i}] takes {fmap.in_features} inputs but feature_maps[{i - 1}] "
                             f"gives {maps[i - 1].out_features} features")
    return maps


def _apply_maps(feature_maps: Sequence[FeatureMap], x: Tensor, input_scale: float) -> Tensor:
    """:math:`\\Phi_L(\\dots\\Phi_1(x / s))`, shared by :class:`BundledNetwork` and :class:`FeatureTower`."""
    check_input("x", x, feature_maps[0].in_features, feature_maps[0].projections, match_dtype=False)
    if input_scale != 1.0:
        x = x / input_scale
    for fmap in feature_maps:
        x = fmap.phi(x)
    return x


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

    A ``FeedForward(..., "relu")`` after the first layer triggers a
    :class:`BundlingBiasWarning`: its map acts on the previous feature vector
    :math:`\\Phi(x)` instead of the previous layer's output :math:`\\Psi\\Phi(x)`. URF
    layers depend on their input only through :math:`w^\\top x`, which the substitution
    keeps; the arc-cosine kernel also depends on :math:`\\|x\\|` and :math:`\\|w\\|`, which
    it changes, so the bundle estimates a different network and its error does not vanish
    as ``num_features`` grows (measured in chapter 3).
    """
    if isinstance(layers, nn.Module) or not isinstance(layers, (list, tuple, nn.ModuleList)):
        raise TypeError("layers must be a list of modules, e.g. [snnk_layer, nn.Linear(...)]")
    layers = list(layers)
    if not layers:
        raise ValueError("layers must not be empty")
    n_ffl = sum(isinstance(l, FeedForward) for l in layers)
    ms = _per_layer(num_features, n_ffl) if n_ffl else []
    maps: list[FeatureMap] = []
    input_scale = 1.0
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
            input_scale = layer.input_scale
        elif isinstance(layer, FeedForward):
            if i > 0 and layer.linear.in_features != _prev_out(layers[i - 1]):
                raise ValueError(
                    f"layers[{i}] expects {layer.linear.in_features} inputs but layers[{i - 1}] has "
                    f"{_prev_out(layers[i - 1])} outputs"
                )
            if weight is not None and layer.activation == "relu":
                warnings.warn(
                    f"layers[{i}] is a ReLU-SNNK layer after another layer: bundling feeds it the previous "
                    "feature vector, and the arc-cosine kernel depends on the norms of its arguments, not only "
                    "on their dot product, so the bundle is biased (its error does not shrink with "
                    "num_features). Use sin/cos/URF activations for deep bundles, or only bundle a ReLU-SNNK "
                    "layer with the linear layer after it.",
                    BundlingBiasWarning,
                    stacklevel=2,
                )
            w_i = layer.linear.weight.detach()
            b_i = layer.linear.bias.detach() if layer.linear.bias is not None else None
            eff = w_i if weight is None else w_i @ weight
            fmap = make_feature_map(
                eff.shape[1], layer.activation, ms[used_m], A=A, orthogonal=orthogonal,
                generator=generator, dtype=w_i.dtype,
            ).to(w_i.device)  # drawn on the CPU (the generator's device), used beside the weights
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
    return BundledNetwork(maps, weight, bias, input_scale=input_scale)


def _prev_out(layer: nn.Module) -> int:
    if isinstance(layer, SNNKLinear):
        return layer.out_features
    if isinstance(layer, FeedForward):
        return layer.linear.out_features
    return layer.out_features  # type: ignore[return-value]


# --------------------------------------------------------------------------------------
# Whole-model counts (chapter 3, Table 6 of the SNNK paper)
# --------------------------------------------------------------------------------------


def bert_snnk_counts(
    hidden: int,
    layers: int,
    inner: int,
    vocab: int,
    positions: int,
    *,
    replaced: int,
    num_features: int,
    batch: int = 64,
    tokens: int = 128,
) -> dict[str, int]:
    """Parameters and multiply-adds of a BERT encoder + pooler with SNNK FFN blocks (Table 6 conventions).

    The FFNs of the top ``replaced`` layers become an SNNK layer (``"train"``: trainable
    :math:`\\omega \\in \\mathbb R^{inner\\times M}` replaces :math:`W_1, b_1`; :math:`W_2, b_2`
    stay) or a bundled block (``"infer"``: :math:`\\widehat W \\in \\mathbb R^{d\\times M}`
    and :math:`b_2` replace the block). Multiply-adds are for ``batch`` sequences of
    ``tokens`` tokens: per token and layer :math:`4d^2` (attention projections),
    :math:`2\\,tokens\\,d` (scores and weighted sum), :math:`2\\,d\\,inner` (FFN), which
    becomes :math:`M(d+1) + inner\\,M + inner\\,d` (train) or :math:`M(d+1) + dM`
    (bundled); the pooler adds :math:`d^2` per sequence. The random projections are not
    counted as parameters (they are regenerated from a seed). Keys: ``params_full``,
    ``params_train``, ``params_infer``, ``macs_full``, ``macs_train``, ``macs_infer``.
    Chapter 3 (beside the paper's Table 6); also :func:`kernels.ffn.bert_snnk_counts`.
    """
    d = check_positive_int("hidden", hidden)
    n_layers = check_positive_int("layers", layers)
    h = check_positive_int("inner", inner)
    v = check_positive_int("vocab", vocab)
    p = check_positive_int("positions", positions)
    if isinstance(replaced, bool) or not isinstance(replaced, int) or not 0 <= replaced <= n_layers:
        raise ValueError(f"replaced must be an integer in [0, layers={n_layers}], got {replaced!r}")
    m = check_positive_int("num_features", num_features)
    b = check_positive_int("batch", batch)
    t = check_positive_int("tokens", tokens)
    k = replaced
    embeddings = (v + p + 2) * d + 2 * d  # word, position, 2 token types; layer norm
    attention = 4 * (d * d + d) + 2 * d  # q, k, v, output projection; layer norm
    ffn = d * h + h + h * d + d
    per_layer_other = attention + 2 * d  # the FFN's layer norm
    pooler = d * d + d
    full = embeddings + n_layers * (per_layer_other + ffn) + pooler
    snnk_train = h * m + h * d + d  # omega, W2, b2
    snnk_infer = d * m + d  # W_hat, b2
    macs_attn = 4 * d * d + 2 * t * d
    macs_ffn = 2 * d * h
    macs_train = m * (d + 1) + h * m + h * d
    macs_infer = m * (d + 1) + d * m
    n_tok = b * t
    return {
        "params_full": full,
        "params_train": full - k * ffn + k * snnk_train,
        "params_infer": full - k * ffn + k * snnk_infer,
        "macs_full": n_tok * n_layers * (macs_attn + macs_ffn) + b * d * d,
        "macs_train": n_tok * (n_layers * macs_attn + (n_layers - k) * macs_ffn + k * macs_train) + b * d * d,
        "macs_infer": n_tok * (n_layers * macs_attn + (n_layers - k) * macs_ffn + k * macs_infer) + b * d * d,
    }
