"""Random feature maps: positive softmax features, universal random features, arc-cosine.

This module is the package side of chapter 2 (``chapters/02_random_features.ipynb``).
"The paper" is Sehanobish, Choromanski, Zhao, Dubey & Likhosherstov (2024), *Scalable
Neural Network Kernels* (ICLR 2024). It holds

* Gaussian projections, i.i.d. or in orthogonal blocks (:func:`gaussian_projections`);
* the positive random features of the softmax kernel :math:`\\exp(x^\\top y)`, eq. 8
  (Likhosherstov et al., 2022): :math:`\\Lambda_g(z) = (1-4A)^{d/4}
  \\exp(A\\|g\\|^2 + \\sqrt{1-4A}\\, g^\\top z - z^\\top z / 2)` with
  :math:`E_g[\\Lambda_g(x)\\Lambda_g(y)] = \\exp(x^\\top y)` for every :math:`A < 1/4`
  (:func:`softmax_features`, :func:`softmax_kernel`, :func:`optimal_a`). Complex ``z``
  is allowed: the identity is analytic in ``z``, which the URFs need;
* universal random features, eqs. 5-11 (:class:`Spectrum`, :class:`URFMap`): an
  activation ``f`` is written as the inverse Fourier transform of its spectrum,
  :math:`f(u) = \\mathrm{Re} \\sum_k a_k e^{2\\pi i \\xi_k u}` (exact atoms for sin and cos,
  a fine grid of a windowed and optionally Gaussian-smoothed activation otherwise,
  Appendix M, or of a transform given in closed form, :func:`spectrum_from_fourier`), and :math:`e^{2\\pi i \\xi (w^\\top x + b)}` is linearised by the softmax
  features applied to :math:`2\\pi i \\xi x` and :math:`w`. The complex features are
  returned as real vectors, so :math:`\\Phi_f(x)^\\top \\Psi_f(w, b)` is a real unbiased
  estimate of :math:`f(w^\\top x + b)`;
* ReLU-SNNK features and the arc-cosine kernel of Theorem 3.2 (Cho & Saul), orders
  0, 1, 2 (:func:`arccos_kernel`, :func:`arccos_features`, :class:`ReLUMap`).

Conventions: inputs are ``(..., d)`` tensors, weights are ``(l, d)`` like
``nn.Linear.weight``; a feature map turns ``(..., d)`` into ``(..., M)``; ``m`` (the
paper's number of random features) counts Gaussian draws per atom or spectral part, and
``M`` is the length of the real feature vector (``2 m`` per atom or part for URFs).
Randomness comes only from an explicit ``generator``.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Callable, Optional, Union

import numpy as np
import torch
from torch import Tensor, nn

from kernels._checks import (
    check_choice,
    check_input,
    check_nonempty,
    check_positive_float,
    check_positive_int,
    check_same_dtype,
    check_tensor,
)

__all__ = [
    "gaussian_projections",
    "optimal_a",
    "softmax_kernel",
    "softmax_features",
    "Spectrum",
    "sin_spectrum",
    "cos_spectrum",
    "activation_spectrum",
    "spectrum_from_fourier",
    "spectrum_from_name",
    "URFMap",
    "arccos_kernel",
    "arccos_features",
    "ReLUMap",
    "FeatureOverflowWarning",
]


class FeatureOverflowWarning(RuntimeWarning):
    """Random features whose exponent exceeds the range of the dtype (inf/0 entries)."""


def _check_a(a: object) -> float:
    if isinstance(a, bool) or not isinstance(a, (int, float)):
        raise TypeError(f"A must be a real number <= 0, got {a!r}")
    a = float(a)
    if not math.isfinite(a):
        raise ValueError(f"A must be finite, got {a!r}")
    if a >= 0.25:
        raise ValueError(
            f"A must be < 1/4 (the factor (1 - 4A)^(d/4) of eq. 8 is undefined for A >= 1/4), "
            f"got A={a}; use A <= 0 (A=0 gives the classic positive features)"
        )
    if a > 0:
        warnings.warn(
            f"A={a} > 0: the features stay unbiased but are unbounded (Remark 3.1 needs A < 0)"
            + (" and their variance is infinite for A >= 1/8" if a >= 0.125 else "")
            + "; use A <= 0, e.g. optimal_a(rho)",
            RuntimeWarning,
            stacklevel=3,
        )
    return a


def _generator(generator: Optional[torch.Generator]) -> Optional[torch.Generator]:
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
    return generator


def gaussian_projections(
    num_features: int,
    dim: int,
    *,
    orthogonal: bool = False,
    generator: Optional[torch.Generator] = None,
    dtype: torch.dtype = torch.float64,
) -> Tensor:
    """Draw ``num_features`` Gaussian vectors :math:`g_j \\sim N(0, I_d)` as rows of a matrix.

    With ``orthogonal=True`` the rows come in blocks of ``dim`` exactly orthogonal
    directions (QR of a Gaussian matrix), each row rescaled by the norm of an independent
    Gaussian vector, so every row is still marginally :math:`N(0, I_d)` (the estimators
    stay unbiased) while rows within a block are coupled (orthogonal random features,
    Yu et al. 2016; lower variance).

    Shapes: returns ``(num_features, dim)``. Cost: O(m d) i.i.d., O(m d^2) orthogonal.
    Chapter 2, section "Positive random features".
    """
    m = check_positive_int("num_features", num_features)
    d = check_positive_int("dim", dim)
    generator = _generator(generator)
    if not orthogonal:
        return torch.randn(m, d, generator=generator, dtype=dtype)
    blocks = []
    for start in range(0, m, d):
        rows = min(d, m - start)
        q, r = torch.linalg.qr(torch.randn(d, d, generator=generator, dtype=torch.float64))
        q = q * torch.sign(torch.diagonal(r))  # Haar-distributed orthogonal matrix
        norms = torch.randn(rows, d, generator=generator, dtype=torch.float64).norm(dim=1)
        blocks.append(q[:rows] * norms[:, None])
    return torch.cat(blocks).to(dtype)


def optimal_a(rho: float) -> float:
    """Variance-minimising ``A`` of eq. 8 for inputs with :math:`\\|x + y\\|^2 = \\rho d`.

    Minimising :math:`\\log E[(\\Lambda_g(x)\\Lambda_g(y))^2] = d\\log(1-4A)
    - \\tfrac d2 \\log(1-8A) + \\tfrac{2(1-4A)}{1-8A}\\|x+y\\|^2 - \\|x\\|^2 - \\|y\\|^2` over
    A gives :math:`A^* = (1 - 2\\rho - \\sqrt{(2\\rho+1)^2 + 8\\rho}) / 16 \\le 0`
    (Likhosherstov et al., 2022). For URFs the input tower carries no Gaussian weight in
    its modulus and ``rho`` is :math:`\\|w\\|^2/d`. Chapter 2.
    """
    if isinstance(rho, bool) or not isinstance(rho, (int, float)):
        raise TypeError(f"rho must be a real number >= 0, got {rho!r}")
    if not math.isfinite(rho) or rho < 0:
        raise ValueError(f"rho must be a finite number >= 0, got {rho!r}")
    return (1.0 - 2.0 * rho - math.sqrt((2.0 * rho + 1.0) ** 2 + 8.0 * rho)) / 16.0


def softmax_kernel(x: Tensor, y: Tensor) -> Tensor:
    """Exact softmax kernel :math:`K(x, y) = \\exp(x^\\top y)`: ``(n, d), (p, d) -> (n, p)``."""
    check_tensor("x", x, ndim=2)
    check_tensor("y", y, ndim=2)
    if x.shape[-1] != y.shape[-1]:
        raise ValueError(f"x and y must have the same feature dimension, got {x.shape[-1]} and {y.shape[-1]}")
    check_same_dtype(("x", x), ("y", y))
    return torch.exp(x @ y.T)


def _max_log(dtype: torch.dtype) -> float:
    real = torch.empty(0, dtype=dtype).real.dtype if dtype.is_complex else dtype
    return math.log(torch.finfo(real).max)


def _warn_overflow(log_modulus: Tensor, dtype: torch.dtype, what: str) -> None:
    if log_modulus.numel() == 0:
        return
    top = float(log_modulus.detach().max())
    limit = _max_log(dtype)
    if top > limit:
        real = torch.empty(0, dtype=dtype).real.dtype if dtype.is_complex else dtype
        warnings.warn(
            f"{what}: exponent up to {top:.1f} exceeds log(max {real}) = {limit:.1f}, so some "
            "features are inf. Fix: scale the inputs down (e.g. by 1/sqrt(d); in an SNNK layer, "
            "SNNKLinear(..., input_scale=kernels.snnk.balanced_input_scale(x, weight, activation)) "
            "scales x down and the weights up, which keeps the estimate unbiased), use float64, "
            "or pick A < 0 (optimal_a) / fewer high frequencies (wider smoothing).",
            FeatureOverflowWarning,
            stacklevel=3,
        )


def _warn_underflow(log_modulus: Tensor, dtype: torch.dtype, what: str) -> None:
    if log_modulus.numel() == 0:
        return
    real = torch.empty(0, dtype=dtype).real.dtype if dtype.is_complex else dtype
    floor = math.log(torch.finfo(real).tiny)
    if bool((log_modulus.detach().max(dim=-1).values < floor).any()):
        warnings.warn(
            f"{what}: every feature of some inputs is below the smallest normal {real} "
            f"(exponent < {floor:.1f}), so they underflow to 0 and the kernel estimate is lost. "
            "Fix: scale the inputs down (e.g. by 1/sqrt(d)) or use float64.",
            FeatureOverflowWarning,
            stacklevel=3,
        )


def _log_lambda(z: Tensor, projections: Tensor, a: float) -> Tensor:
    """log Lambda_g(z) of eq. 8 for every row g of ``projections``: (..., d) -> (..., m)."""
    d = z.shape[-1]
    s = math.sqrt(1.0 - 4.0 * a)
    g = projections.to(z.dtype)
    const = 0.25 * d * math.log(1.0 - 4.0 * a) + a * (projections * projections).sum(-1)
    zz = (z * z).sum(-1, keepdim=True)  # z^T z (not |z|^2): the identity is analytic in z
    return const.to(z.dtype) + s * (z @ g.T) - 0.5 * zz


def softmax_features(
    x: Tensor, projections: Tensor, *, A: float = 0.0, normalize: bool = True
) -> Tensor:
    """Positive random features of eq. 8: :math:`\\Lambda_{g_j}(x) / \\sqrt{m}` for each row ``g_j``.

    :math:`\\phi(x)^\\top \\phi(y)` is an unbiased estimate of :math:`\\exp(x^\\top y)` for
    Gaussian ``projections`` and every ``A < 1/4``; the entries are positive for real
    ``x`` and bounded when ``A < 0`` (Remark 3.1).

    Complex ``x`` is accepted -- the one exception to the package's rule that data
    tensors are real floating (:mod:`kernels._checks`, the book's "Input rules" page):
    eq. 8 is analytic in ``x``, and the universal random features of chapter 2
    evaluate it at imaginary arguments :math:`i\\alpha x`. The result is then complex
    (complex64 or complex128, as ``x``). ``projections`` must be real floating.

    Shapes: ``x`` (..., d), ``projections`` (m, d) -> (..., m). Cost O(m d) per input.
    Computed in log space; a :class:`FeatureOverflowWarning` says when the dtype's range is
    exceeded and how to fix it. Chapter 2, section "Positive random features".
    """
    # complex x is meaningful here (eq. 8 is analytic in x; chapter 2's URF section
    # uses it, and the result is then complex), so it is the one documented exception
    # to the "real floating" rule of kernels._checks.
    check_tensor("x", x, complex_ok=True)
    if x.ndim == 0:
        raise ValueError("x must have shape (..., d), got a 0-d tensor")
    check_tensor("projections", projections, ndim=2)
    check_nonempty("projections", projections, 0, "row (random feature)")
    if x.shape[-1] != projections.shape[-1]:
        raise ValueError(
            f"x has feature dimension {x.shape[-1]} but projections have {projections.shape[-1]} columns"
        )
    a = _check_a(A)
    log_lam = _log_lambda(x, projections, a)
    log_mod = log_lam.real if log_lam.is_complex() else log_lam
    _warn_overflow(log_mod, x.dtype, "softmax_features")
    _warn_underflow(log_mod, x.dtype, "softmax_features")
    out = torch.exp(log_lam)
    if normalize:
        out = out / math.sqrt(projections.shape[0])
    return out


# --------------------------------------------------------------------------- spectra
@dataclass(frozen=True)
class Spectrum:
    """An activation written as a sum of complex exponentials (its Fourier transform, eq. 5).

    :math:`f(u) \\approx \\mathrm{Re} \\sum_k a_k \\exp(2\\pi i \\xi_k u)` with atoms
    ``frequencies`` :math:`\\xi_k` and complex ``weights`` :math:`a_k`. For sin and cos the
    sum is exact with two atoms at :math:`\\pm 1/2\\pi` (``exact_atoms=True``: every atom
    gets its own ``m`` Gaussian draws, the "finite number of atoms" construction of
    Sec. 3.1). Otherwise the atoms are a fine grid, :math:`a_k = \\mathrm{FT}_f(\\xi_k)
    \\Delta\\xi`, and the URF map *samples* atoms from the four non-negative parts
    :math:`\\mathrm{FT}^{re,\\pm}, \\mathrm{FT}^{im,\\pm}` (eq. 6).

    :meth:`evaluate` gives the function the random features estimate without bias.
    """

    name: str
    frequencies: Tensor  # (K,) float64
    weights: Tensor  # (K,) complex128
    exact_atoms: bool

    def evaluate(self, u: Tensor) -> Tensor:
        """:math:`\\mathrm{Re}\\sum_k a_k e^{2\\pi i \\xi_k u}` elementwise, same shape as ``u``."""
        check_tensor("u", u)
        flat = u.reshape(-1, 1).to(torch.float64)
        # The atoms are kept on the CPU; they follow u to its device here.
        frequencies = self.frequencies.to(flat.device)
        phase = torch.exp(2j * math.pi * flat * frequencies[None, :])
        return (phase @ self.weights.to(flat.device)).real.reshape(u.shape).to(u.dtype)

    def part_masses(self) -> Tensor:
        """Total masses of the four parts (re+, re-, im+, im-) of the spectrum, shape (4,)."""
        return torch.stack([p.sum() for p in _four_parts(self.weights)])


def _four_parts(weights: Tensor) -> list[Tensor]:
    re, im = weights.real, weights.imag
    return [re.clamp(min=0), (-re).clamp(min=0), im.clamp(min=0), (-im).clamp(min=0)]


_PART_PHASES = (1.0 + 0j, -1.0 + 0j, 1j, -1j)


def _symmetric_grid(top: float, num_atoms: int) -> np.ndarray:
    """``num_atoms`` (odd) equally spaced frequencies on [-top, top], symmetric by construction:
    the middle one is exactly 0 and ``grid[::-1] == -grid`` bit for bit (``np.linspace`` gives
    about 1e-16 instead of 0 for some ``top``, which lost or doubled the DC term)."""
    half = (num_atoms - 1) // 2
    return top * (np.arange(-half, half + 1, dtype=np.float64) / half)


def _fold(spectrum: Spectrum) -> Spectrum:
    """Use conjugate symmetry: for a real f, the atoms at -xi are the conjugates of those at
    +xi, so Re sum_k a_k e^{2 pi i xi_k u} keeps its value when the negative atoms are
    dropped and the positive ones doubled. Halves the number of random features."""
    xi, a = spectrum.frequencies, spectrum.weights
    # A frequency within a rounding error of 0 is the zero frequency (the DC term): snap it
    # to exactly 0 so that it is kept once and not doubled (a grid value of -2e-16 would be
    # dropped by ``xi >= 0``, one of +2e-16 doubled).
    tiny = 1e-9 * float(xi.abs().max()) if xi.numel() else 0.0
    xi = torch.where(xi.abs() <= tiny, torch.zeros_like(xi), xi)
    keep = xi >= 0
    weights = torch.where(xi[keep] > 0, 2 * a[keep], a[keep])
    return Spectrum(spectrum.name, xi[keep], weights, spectrum.exact_atoms)


def sin_spectrum(fold: bool = True) -> Spectrum:
    """sin u = (e^{iu} - e^{-iu}) / 2i: atoms at :math:`\\xi = \\pm 1/2\\pi` (Sec. 3.1, App. M).

    ``fold=False`` keeps the paper's binary distribution over :math:`\\pm 1/2\\pi`; the
    default folds the pair into one atom at :math:`1/2\\pi` with weight :math:`-i`
    (:math:`\\sin u = \\mathrm{Re}(-i e^{iu})`), which halves the features.
    """
    xi = torch.tensor([1.0, -1.0], dtype=torch.float64) / (2 * math.pi)
    spec = Spectrum("sin", xi, torch.tensor([-0.5j, 0.5j], dtype=torch.complex128), True)
    return _fold(spec) if fold else spec


def cos_spectrum(fold: bool = True) -> Spectrum:
    """cos u = (e^{iu} + e^{-iu}) / 2: atoms at :math:`\\xi = \\pm 1/2\\pi`, weights 1/2
    (folded by default into one atom of weight 1, see :func:`sin_spectrum`)."""
    xi = torch.tensor([1.0, -1.0], dtype=torch.float64) / (2 * math.pi)
    spec = Spectrum("cos", xi, torch.tensor([0.5 + 0j, 0.5 + 0j], dtype=torch.complex128), True)
    return _fold(spec) if fold else spec


def _gelu_np(u: np.ndarray) -> np.ndarray:
    from scipy.special import erf

    return 0.5 * u * (1.0 + erf(u / math.sqrt(2.0)))


_NAMED_ACTIVATIONS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "relu": lambda u: np.maximum(u, 0.0),
    "gelu": _gelu_np,
    "tanh": np.tanh,
    "gaussian": lambda u: np.exp(-0.5 * u * u),
}


def activation_spectrum(
    activation: Union[str, Callable[[np.ndarray], np.ndarray]],
    *,
    window: float = 4.0,
    smoothing: float = 0.25,
    xi_max: Optional[float] = None,
    num_atoms: int = 801,
) -> Spectrum:
    """Grid spectrum of a windowed, Gaussian-smoothed activation (Appendix M, sampled URFs).

    ReLU and GELU grow linearly, so their Fourier transforms exist only as distributions
    with a :math:`1/\\xi^2` singularity. As the paper suggests (App. M, N; Bresler &
    Nagaraj 2020) we estimate a nearby well-behaved function instead:
    :math:`f_{R,s} = (f \\cdot e^{-u^2/2R^2}) * N(0, s^2)`, whose transform
    :math:`\\mathrm{FT}[f e^{-u^2/2R^2}](\\xi)\\, e^{-2\\pi^2 s^2 \\xi^2}` is smooth and decays
    fast. The transform is computed by the trapezoid rule on a fine ``u`` grid and
    sampled at ``num_atoms`` frequencies in :math:`[-\\xi_{max}, \\xi_{max}]` (default
    :math:`\\xi_{max} = 3/(2\\pi s)`, where the smoothing factor is :math:`e^{-4.5}`); the
    grid spacing keeps the period :math:`1/\\Delta\\xi` far beyond the window. The
    negative frequencies are folded onto the positive ones (conjugate symmetry of a real
    function's transform), which halves the features without changing the estimate's mean.
    :meth:`Spectrum.evaluate` of the result is :math:`\\approx f_{R,s}`, close to ``f``
    for :math:`|u| \\ll R`; the chapter shows how close.

    Args:
        activation: ``"relu"``, ``"gelu"``, ``"tanh"``, ``"gaussian"`` or a NumPy callable.
        window: R > 0. smoothing: s > 0. xi_max: > 0 or None. num_atoms: odd number >= 3.
    Cost: O(num_atoms * grid) once.
    """
    if isinstance(activation, str):
        check_choice("activation", activation, _NAMED_ACTIVATIONS)
        name, fn = activation, _NAMED_ACTIVATIONS[activation]
    elif callable(activation):
        name, fn = getattr(activation, "__name__", "custom"), activation
    else:
        raise TypeError(f"activation must be a name or a callable, got {activation!r}")
    r = check_positive_float("window", window)
    s = check_positive_float("smoothing", smoothing)
    k = check_positive_int("num_atoms", num_atoms)
    if k < 3 or k % 2 == 0:
        raise ValueError(f"num_atoms must be an odd integer >= 3, got {k}")
    top = 3.0 / (2 * math.pi * s) if xi_max is None else check_positive_float("xi_max", xi_max)
    xi = _symmetric_grid(top, k)
    dxi = xi[1] - xi[0]
    if 1.0 / dxi < 8 * r:
        warnings.warn(
            f"the frequency grid spacing {dxi:.3g} makes the estimate periodic with period "
            f"{1 / dxi:.3g} < 8 * window; increase num_atoms",
            RuntimeWarning,
            stacklevel=2,
        )
    u = np.linspace(-8 * r, 8 * r, 8001)
    fu = np.asarray(fn(u), dtype=np.float64) * np.exp(-0.5 * (u / r) ** 2)
    ft = np.empty(k, dtype=np.complex128)
    for start in range(0, k, 64):  # chunks keep the (atoms x grid) phase matrix small
        phase = np.exp(-2j * np.pi * np.outer(xi[start : start + 64], u))
        ft[start : start + 64] = np.trapezoid(phase * fu[None, :], u, axis=1)
    ft *= np.exp(-2 * (np.pi * s * xi) ** 2)
    weights = torch.as_tensor(ft * dxi, dtype=torch.complex128)
    return _fold(Spectrum(f"{name}(R={r:g}, s={s:g})", torch.as_tensor(xi), weights, False))


def spectrum_from_fourier(
    fourier_transform: Callable[[np.ndarray], np.ndarray],
    *,
    xi_max: float,
    num_atoms: int = 801,
    name: str = "custom",
) -> Spectrum:
    """Grid spectrum from an activation's Fourier transform given in closed form (eq. 5).

    ``fourier_transform(xi)`` returns :math:`\\mathrm{FT}_f(\\xi) = \\int f(z) e^{-2\\pi i\\xi z}dz`
    (complex NumPy array) on an array of frequencies; it is sampled at ``num_atoms`` points
    of :math:`[-\\xi_{max}, \\xi_{max}]` (weights :math:`\\mathrm{FT}_f(\\xi_k)\\Delta\\xi`) and
    folded. Use it for a smoothed activation whose transform is known (Appendix M).
    """
    if not callable(fourier_transform):
        raise TypeError(f"fourier_transform must be callable, got {fourier_transform!r}")
    top = check_positive_float("xi_max", xi_max)
    k = check_positive_int("num_atoms", num_atoms)
    if k < 3 or k % 2 == 0:
        raise ValueError(f"num_atoms must be an odd integer >= 3, got {k}")
    xi = _symmetric_grid(top, k)
    ft = np.asarray(fourier_transform(xi), dtype=np.complex128)
    if ft.shape != xi.shape or not np.all(np.isfinite(ft)):
        raise ValueError(
            f"fourier_transform must return {k} finite values for {k} frequencies, got shape {ft.shape}"
        )
    weights = torch.as_tensor(ft * (xi[1] - xi[0]), dtype=torch.complex128)
    return _fold(Spectrum(name, torch.as_tensor(xi), weights, False))


def spectrum_from_name(activation: Union[str, Spectrum]) -> Spectrum:
    """``"sin"``/``"cos"`` -> exact atoms; ``"gelu"``/``"tanh"``/... -> default grid spectrum."""
    if isinstance(activation, Spectrum):
        return activation
    if activation == "sin":
        return sin_spectrum()
    if activation == "cos":
        return cos_spectrum()
    if isinstance(activation, str) and activation in _NAMED_ACTIVATIONS:
        return activation_spectrum(activation)
    raise ValueError(
        "activation must be 'sin', 'cos', one of "
        f"{sorted(_NAMED_ACTIVATIONS)} (sampled URFs) or a Spectrum, got {activation!r}"
    )


class URFMap(nn.Module):
    """Universal random features :math:`\\Phi_f, \\Psi_f` of eqs. 7-11 for one activation.

    For each random feature ``j`` there is a frequency :math:`\\xi_j`, a Gaussian vector
    :math:`g_j` and a complex coefficient :math:`c_j`; with :math:`\\alpha_j = 2\\pi\\xi_j`
    (the paper's choice :math:`\\rho(\\xi) = 2\\pi i\\xi`, :math:`\\eta = 1`)

    .. math:: \\phi_j(x) = \\Lambda_{g_j}(i\\alpha_j x)/\\sqrt{m}, \\qquad
              \\psi_j(w, b) = c_j\\, e^{i\\alpha_j b}\\, \\Lambda_{g_j}(w)/\\sqrt{m},

    so :math:`E[\\sum_j \\phi_j\\psi_j] = \\sum_k a_k e^{2\\pi i\\xi_k(w^\\top x+b)}`. Exact
    atoms (sin, cos) get ``num_features`` draws each with :math:`c = a_k`; a grid spectrum
    gets ``num_features`` atoms sampled from each non-empty part (re+, re-, im+, im-) with
    probability proportional to the part, :math:`c = \\pm` or :math:`\\pm i` times the
    part's mass (eq. 6 with :math:`P_j` the normalised part). The real vectors
    :math:`\\Phi = [\\mathrm{Re}\\,\\phi, \\mathrm{Im}\\,\\phi]`,
    :math:`\\Psi = [\\mathrm{Re}\\,\\psi, -\\mathrm{Im}\\,\\psi]` give
    :math:`\\Phi^\\top\\Psi = \\mathrm{Re}\\sum_j \\phi_j\\psi_j`, an unbiased real estimate
    of :meth:`Spectrum.evaluate` at :math:`w^\\top x + b` (``f`` itself for sin and cos).

    Shapes: :meth:`phi` (..., d) -> (..., M); :meth:`psi` (l, d), (l,) -> (l, M), with
    ``M = out_features = 2 m * (atoms or non-empty parts)``. Cost O(M d) per input row.
    Chapter 2, section "Universal random features".
    """

    def __init__(
        self,
        in_features: int,
        activation: Union[str, Spectrum],
        num_features: int,
        *,
        A: float = 0.0,
        orthogonal: bool = False,
        generator: Optional[torch.Generator] = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        d = check_positive_int("in_features", in_features)
        m = check_positive_int("num_features", num_features)
        spectrum = spectrum_from_name(activation)
        self.A = _check_a(A)
        self.spectrum = spectrum
        generator = _generator(generator)
        xis, coefs = [], []
        if spectrum.exact_atoms:
            for xi, a in zip(spectrum.frequencies.tolist(), spectrum.weights.tolist()):
                xis.append(torch.full((m,), xi, dtype=torch.float64))
                coefs.append(torch.full((m,), a, dtype=torch.complex128))
        else:
            for part, phase in zip(_four_parts(spectrum.weights), _PART_PHASES):
                mass = float(part.sum())
                if mass <= 1e-14 * float(spectrum.weights.abs().sum()):
                    continue
                idx = torch.multinomial(part / mass, m, replacement=True, generator=generator)
                xis.append(spectrum.frequencies[idx])
                coefs.append(torch.full((m,), phase * mass, dtype=torch.complex128))
        xi_all = torch.cat(xis)
        self.in_features = d
        self.num_features = m
        self.out_features = 2 * xi_all.numel()
        g = gaussian_projections(xi_all.numel(), d, orthogonal=orthogonal, generator=generator)
        self.register_buffer("projections", g.to(dtype))
        self.register_buffer("alphas", (2 * math.pi * xi_all).to(dtype))
        cdtype = torch.complex64 if dtype == torch.float32 else torch.complex128
        self.register_buffer("coefficients", torch.cat(coefs).to(cdtype))

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, spectrum={self.spectrum.name}, "
            f"num_features={self.num_features}, out_features={self.out_features}, A={self.A}"
        )

    def forward(self, x: Tensor) -> Tensor:
        """Not defined: a feature map has two towers. Call :meth:`phi` for the features
        of inputs ``x`` and :meth:`psi` for those of a layer's weights."""
        raise TypeError(
            f"{type(self).__name__} has no forward: call .phi(x) for the features of inputs x, "
            "or .psi(weight, bias) for the features of a layer's weights"
        )

    def phi(self, x: Tensor) -> Tensor:
        """Input tower :math:`\\Phi_f(x)`: (..., d) -> (..., M), in ``x``'s dtype.

        The forward of every SNNK layer runs through it, so ``x`` is checked in O(1)
        (type, dtype, device, shape): NaN and Inf are not scanned for and propagate to
        the features."""
        check_input("x", x, self.in_features, self.projections, match_dtype=False)
        a, g = self.A, self.projections.to(x.dtype)
        d, m = self.in_features, self.num_features
        alpha = self.alphas.to(x.dtype)
        s = math.sqrt(1.0 - 4.0 * a)
        # log Lambda_g(i alpha x) = c(g) + i alpha s g^T x + alpha^2 |x|^2 / 2
        log_mod = (
            0.25 * d * math.log(1.0 - 4.0 * a)
            + a * (g * g).sum(-1)
            + 0.5 * alpha**2 * (x * x).sum(-1, keepdim=True)
            - 0.5 * math.log(m)
        )
        _warn_overflow(log_mod, x.dtype, "URFMap.phi")
        angle = s * alpha * (x @ g.T)
        mod = torch.exp(log_mod)
        return torch.cat([mod * torch.cos(angle), mod * torch.sin(angle)], dim=-1)

    def psi(self, weight: Tensor, bias: Optional[Tensor] = None) -> Tensor:
        """Parameter tower :math:`\\Psi_f(w, b)`: weight (l, d), bias (l,) or None -> (l, M)."""
        check_tensor("weight", weight, ndim=2)
        if weight.shape[-1] != self.in_features:
            raise ValueError(
                f"weight must have {self.in_features} columns, got shape {tuple(weight.shape)}"
            )
        if bias is None:
            bias = torch.zeros(weight.shape[0], dtype=weight.dtype, device=weight.device)
        check_tensor("bias", bias, ndim=1)
        if bias.shape[0] != weight.shape[0]:
            raise ValueError(f"bias must have {weight.shape[0]} entries, got {bias.shape[0]}")
        lam = softmax_features(weight, self.projections.to(weight.dtype), A=self.A, normalize=False)
        lam = lam / math.sqrt(self.num_features)
        cdtype = torch.complex64 if weight.dtype == torch.float32 else torch.complex128
        phase = torch.exp(1j * bias.to(cdtype)[:, None] * self.alphas.to(cdtype)[None, :])
        psi = self.coefficients.to(cdtype)[None, :] * phase * lam.to(cdtype)
        return torch.cat([psi.real, -psi.imag], dim=-1).to(weight.dtype)

    def expected(self, x: Tensor, weight: Tensor, bias: Optional[Tensor] = None) -> Tensor:
        """What :math:`\\Phi^\\top\\Psi` estimates: ``spectrum.evaluate(x W^T + b)``, (..., l)."""
        u = x @ weight.T
        if bias is not None:
            u = u + bias
        return self.spectrum.evaluate(u)


# --------------------------------------------------------------------------- arc-cosine
def _arccos_j(theta: Tensor, order: int) -> Tensor:
    s, c = torch.sin(theta), torch.cos(theta)
    if order == 0:
        return math.pi - theta
    if order == 1:
        return s + (math.pi - theta) * c
    return 3 * s * c + (math.pi - theta) * (1 + 2 * c * c)


def arccos_kernel(x: Tensor, y: Tensor, order: int = 1) -> Tensor:
    """Arc-cosine kernel of Theorem 3.2 (Cho & Saul): :math:`K_n(x,y) = \\tfrac1\\pi
    \\|x\\|^n\\|y\\|^n J_n(\\theta)`, orders 0, 1, 2, with
    :math:`J_0 = \\pi-\\theta`, :math:`J_1 = \\sin\\theta + (\\pi-\\theta)\\cos\\theta`,
    :math:`J_2 = 3\\sin\\theta\\cos\\theta + (\\pi-\\theta)(1 + 2\\cos^2\\theta)`.

    :math:`K_n(x, y) = 2 E_\\omega[\\Theta(\\omega^\\top x)\\Theta(\\omega^\\top y)
    (\\omega^\\top x)^n(\\omega^\\top y)^n]`, :math:`\\omega \\sim N(0, I)`.
    Shapes: (n, d), (p, d) -> (n, p). Cost O(n p d). Chapter 2, section "ReLU-SNNK".
    """
    check_tensor("x", x, ndim=2)
    check_tensor("y", y, ndim=2)
    if x.shape[-1] != y.shape[-1]:
        raise ValueError(f"x and y must have the same feature dimension, got {x.shape[-1]} and {y.shape[-1]}")
    if isinstance(order, bool) or order not in (0, 1, 2):
        raise ValueError(f"order must be 0, 1 or 2, got {order!r}")
    check_same_dtype(("x", x), ("y", y))
    nx, ny = x.norm(dim=-1), y.norm(dim=-1)
    denom = (nx[:, None] * ny[None, :]).clamp_min(torch.finfo(x.dtype).tiny)
    cos = ((x @ y.T) / denom).clamp(-1.0, 1.0)
    theta = torch.arccos(cos)
    return (nx[:, None] * ny[None, :]) ** order * _arccos_j(theta, order) / math.pi


def arccos_features(x: Tensor, projections: Tensor, order: int = 1) -> Tensor:
    """Random features of the arc-cosine kernel: :math:`\\sqrt{2/m}\\,\\Theta(Gx)(Gx)^n`.

    :math:`\\phi(x)^\\top\\phi(y)` is an unbiased estimate of :math:`K_n(x, y)`.
    Shapes: (..., d), (m, d) -> (..., m). Cost O(m d). Chapter 2.
    """
    check_tensor("x", x)
    if x.ndim == 0:
        raise ValueError("x must have shape (..., d), got a 0-d tensor")
    check_tensor("projections", projections, ndim=2)
    check_nonempty("projections", projections, 0, "row (random feature)")
    if isinstance(order, bool) or order not in (0, 1, 2):
        raise ValueError(f"order must be 0, 1 or 2, got {order!r}")
    if x.shape[-1] != projections.shape[-1]:
        raise ValueError(
            f"x has feature dimension {x.shape[-1]} but projections have {projections.shape[-1]} columns"
        )
    proj = x @ projections.to(x.dtype).T
    step = (proj > 0).to(x.dtype)
    out = step if order == 0 else step * proj**order
    return out * math.sqrt(2.0 / projections.shape[0])


class ReLUMap(nn.Module):
    """ReLU-SNNK feature maps of Sec. 3.2: :math:`\\Phi(x) = \\mathrm{ReLU}(Gx)/\\sqrt m`,
    :math:`\\Psi(w, b) = \\mathrm{ReLU}(Gw)/\\sqrt m` (:math:`G` Gaussian, m x d).

    :math:`\\Phi(x)^\\top\\Psi(w)` estimates :math:`\\tfrac12 K_1(w, x)` (Theorem 3.2), which
    is *not* a function of :math:`w^\\top x` alone (Remark 3.3). With ``bias=True`` the
    vectors are augmented, :math:`x \\to [x, 1]`, :math:`w \\to [w, b]`, so the layer
    estimates :math:`\\tfrac12 K_1([w, b], [x, 1])`.

    Shapes: :meth:`phi` (..., d) -> (..., m); :meth:`psi` (l, d), (l,) -> (l, m).
    Cost O(m d). Chapter 2, section "ReLU-SNNK".
    """

    def __init__(
        self,
        in_features: int,
        num_features: int,
        *,
        bias: bool = True,
        orthogonal: bool = False,
        generator: Optional[torch.Generator] = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        self.in_features = check_positive_int("in_features", in_features)
        self.num_features = check_positive_int("num_features", num_features)
        self.out_features = self.num_features
        self.bias = bool(bias)
        width = self.in_features + (1 if self.bias else 0)
        g = gaussian_projections(self.num_features, width, orthogonal=orthogonal, generator=_generator(generator))
        self.register_buffer("projections", g.to(dtype))

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, num_features={self.num_features}, bias={self.bias}"

    def forward(self, x: Tensor) -> Tensor:
        """Not defined: a feature map has two towers. Call :meth:`phi` for the features
        of inputs ``x`` and :meth:`psi` for those of a layer's weights."""
        raise TypeError(
            f"{type(self).__name__} has no forward: call .phi(x) for the features of inputs x, "
            "or .psi(weight, bias) for the features of a layer's weights"
        )

    def _augment(self, v: Tensor, extra: Optional[Tensor]) -> Tensor:
        if not self.bias:
            return v
        if extra is None:
            extra = torch.ones(v.shape[:-1], dtype=v.dtype, device=v.device)
        return torch.cat([v, extra[..., None].to(v.dtype)], dim=-1)

    def phi(self, x: Tensor) -> Tensor:
        """Input tower: (..., d) -> (..., m), in ``x``'s dtype. Checked in O(1) as
        :meth:`URFMap.phi`: NaN and Inf propagate."""
        check_input("x", x, self.in_features, self.projections, match_dtype=False)
        z = self._augment(x, None) @ self.projections.to(x.dtype).T
        return torch.relu(z) / math.sqrt(self.num_features)

    def psi(self, weight: Tensor, bias: Optional[Tensor] = None) -> Tensor:
        """Parameter tower: weight (l, d), bias (l,) or None (zeros) -> (l, m)."""
        check_tensor("weight", weight, ndim=2)
        if weight.shape[-1] != self.in_features:
            raise ValueError(
                f"weight must have {self.in_features} columns, got shape {tuple(weight.shape)}"
            )
        if self.bias and bias is None:
            bias = torch.zeros(weight.shape[0], dtype=weight.dtype, device=weight.device)
        if bias is not None:
            check_tensor("bias", bias, ndim=1)
            if bias.shape[0] != weight.shape[0]:
                raise ValueError(f"bias must have {weight.shape[0]} entries, got {bias.shape[0]}")
        return self.phi_raw(self._augment(weight, bias if self.bias else None))

    def phi_raw(self, v: Tensor) -> Tensor:
        return torch.relu(v @ self.projections.to(v.dtype).T) / math.sqrt(self.num_features)

    def expected(self, x: Tensor, weight: Tensor, bias: Optional[Tensor] = None) -> Tensor:
        """What :math:`\\Phi^\\top\\Psi` estimates: :math:`\\tfrac12 K_1([w,b],[x,1])`, (n, l)."""
        xa = self._augment(x, None)
        wa = self._augment(weight, bias if bias is not None else torch.zeros(weight.shape[0], dtype=weight.dtype, device=weight.device)) if self.bias else weight
        return 0.5 * arccos_kernel(xa.reshape(-1, xa.shape[-1]), wa, 1).reshape(*x.shape[:-1], weight.shape[0])
