"""Gradient-flow dynamics of MSE training in the NTK regime and the linearized network.

The closed-form mean prediction (:func:`gd_mse_predictor`), loss curve
(:func:`mse_loss_curve`) and mean and covariance over initializations
(:func:`gd_mse_ensemble`) of Lee et al. (2019), eqs. 9-11 (slides "Arbitrary function f for
MSE loss", "NTK: training time prediction"), and the linearization :math:`f^{lin}` of a
network around its initialization (:func:`linearize`), the model those formulas describe.

Part of :mod:`kernels.ntk`, chapter 1 (``chapters/01_ntk.ipynb``), section "Training
dynamics".
"""

from __future__ import annotations

import copy
import math
from typing import Callable, NamedTuple, Optional, Union

import torch
from torch import Tensor, nn
from torch.func import jvp

from kernels._checks import check_input, check_module, check_positive_float, check_tensor, check_times
from kernels.ntk.empirical import _call_with, _substitution_names

__all__ = [
    "gd_mse_predictor",
    "mse_loss_curve",
    "GaussianPrediction",
    "gd_mse_ensemble",
    "linearize",
    "LinearizedModel",
]


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



def _check_times(t: object, discrete: bool = False, name: str = "t") -> tuple[Tensor, bool]:
    """Times as a float64 1-D tensor and whether the input was a scalar
    (:func:`kernels._checks.check_times`: real, not bool or complex, in [0, inf]); with
    ``discrete`` the finite times must be whole numbers of steps."""
    times, scalar = check_times(name, t)
    finite = times[torch.isfinite(times)]
    if discrete and bool((finite != finite.round()).any()):
        raise ValueError(f"{name} must hold whole numbers of steps when discrete=True")
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
    t, scalar = _check_times(times, discrete, name="times")
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
        check_module("model", model)
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
        # The input width where the model states it (a layer with ``in_features`` first,
        # as fc_network's NTKLinear): forward checks x against it.
        first = next(iter(model.children()), None) if isinstance(model, nn.Sequential) else model
        width = getattr(first, "in_features", None)
        self.in_features: Optional[int] = width if isinstance(width, int) else None

    def theta0(self) -> dict[str, Tensor]:
        """The expansion point :math:`\\theta_0` by parameter name."""
        base_params = dict(self.base.named_parameters())
        return {n: base_params[n] for n in self.param_names}

    def forward(self, x: Tensor) -> Tensor:
        if self.in_features is not None:
            check_input("x", x, self.in_features, self.params[0])
        else:
            check_tensor("x", x, finite=False)
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

