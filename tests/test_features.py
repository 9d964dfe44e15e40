"""Tests for kernels.features (chapter 2).

Unbiasedness is tested with a fixed seed against a tolerance derived from the estimator's
own spread: the estimate is a mean of ``m`` independent per-draw estimates, so we compute
their sample standard deviation ``s`` and require ``|mean - exact| <= 5 s / sqrt(m)``
(a 5-sigma band: a correct estimator fails with probability < 1e-6 per check, a biased
one fails as soon as the bias exceeds a few standard errors). With orthogonal blocks the
draws inside a block are dependent, so the per-block means are the independent samples.

Independent references: the closed form exp(x^T y); the arc-cosine integral evaluated by
scipy quadrature in two dimensions; a Gaussian whose windowed, smoothed version has a
closed form (for the numerical Fourier transform); scipy's scalar minimiser for the
variance-optimal A.
"""

from __future__ import annotations

import functools
import math
import warnings

import numpy as np
import pytest
import scipy.integrate
import scipy.optimize
import torch

from kernels.features import (
    FeatureOverflowWarning,
    ReLUMap,
    URFMap,
    activation_spectrum,
    arccos_features,
    arccos_kernel,
    cos_spectrum,
    gaussian_projections,
    optimal_a,
    sin_spectrum,
    softmax_features,
    spectrum_from_fourier,
    softmax_kernel,
    spectrum_from_name,
)

F64 = torch.float64
SIGMAS = 5.0


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def points(n: int, d: int, seed: int, scale: float = 1.0) -> torch.Tensor:
    return scale * torch.rand(n, d, generator=gen(seed), dtype=F64) / math.sqrt(d)


def assert_unbiased(samples: torch.Tensor, exact: torch.Tensor) -> None:
    """samples: (draws, ...) independent per-draw estimates; exact: (...)."""
    n = samples.shape[0]
    mean = samples.mean(0)
    se = samples.std(0) / math.sqrt(n)
    err = (mean - exact).abs()
    assert bool((se > 0).all()), "degenerate estimator: zero spread"
    worst = float((err / se).max())
    assert worst <= SIGMAS, f"estimate off by {worst:.2f} standard errors (allowed {SIGMAS})"


# --------------------------------------------------------------------------- softmax
@pytest.mark.parametrize("a", [0.0, -0.1, -0.5])
@pytest.mark.parametrize("orthogonal", [False, True])
def test_softmax_features_unbiased(a: float, orthogonal: bool) -> None:
    d, m = 8, 4096
    x, y = points(3, d, 0, 2.0), points(2, d, 1, 2.0)
    g = gaussian_projections(m, d, orthogonal=orthogonal, generator=gen(2))
    px = softmax_features(x, g, A=a, normalize=False)  # (3, m)
    py = softmax_features(y, g, A=a, normalize=False)
    per_draw = px.T[:, :, None] * py.T[:, None, :]  # (m, 3, 2)
    if orthogonal:
        per_draw = per_draw.reshape(m // d, d, 3, 2).mean(1)
    assert_unbiased(per_draw, softmax_kernel(x, y))
    # the normalised features give the same mean as a plain dot product
    est = softmax_features(x, g, A=a) @ softmax_features(y, g, A=a).T
    torch.testing.assert_close(est, per_draw.mean(0), rtol=1e-10, atol=0)


def test_softmax_features_positive_and_bounded_for_negative_a() -> None:
    g = gaussian_projections(256, 5, generator=gen(0))
    x = points(10, 5, 1, 3.0)
    f = softmax_features(x, g, A=-0.5, normalize=False)
    assert bool((f > 0).all())
    # Remark 3.1: for A < 0 the entries are bounded by (1-4A)^{d/4} exp(s^2 |z|^2/(-4A) - |z|^2/2)
    s2 = 1 - 4 * (-0.5)
    bound = s2 ** (5 / 4) * torch.exp(x.norm(dim=1) ** 2 * (s2 / 2.0 - 0.5))
    assert bool((f <= bound[:, None] + 1e-12).all())


def test_optimal_a_minimises_second_moment() -> None:
    d = 16
    for rho in (0.01, 0.5, 2.0):
        s2 = rho * d  # |x + y|^2 with x = y and |x|^2 = |y|^2 = s2 / 4

        def log_second_moment(a: float) -> float:
            return (
                d * math.log(1 - 4 * a)
                - d / 2 * math.log(1 - 8 * a)
                + 2 * (1 - 4 * a) / (1 - 8 * a) * s2
                - s2 / 2
            )

        res = scipy.optimize.minimize_scalar(log_second_moment, bounds=(-20.0, 0.12), method="bounded",
                                             options={"xatol": 1e-10})
        assert optimal_a(rho) == pytest.approx(res.x, abs=1e-6)
        assert optimal_a(rho) <= 0


def test_softmax_complex_input_unbiased() -> None:
    """exp(i a x^T w) = E[Lambda(i a x) Lambda(w)]: the identity holds for complex input."""
    d, m = 6, 8192
    x, w = points(2, d, 3), points(3, d, 4)
    g = gaussian_projections(m, d, generator=gen(5))
    z = 1j * 1.7 * x.to(torch.complex128)
    pz = softmax_features(z, g, normalize=False)
    pw = softmax_features(w, g, normalize=False).to(torch.complex128)
    per_draw = pz.T[:, :, None] * pw.T[:, None, :]
    exact = torch.exp(1j * 1.7 * (x @ w.T).to(torch.complex128))
    assert_unbiased(per_draw.real, exact.real)
    assert_unbiased(per_draw.imag, exact.imag)


def test_orthogonal_projections() -> None:
    g = gaussian_projections(20, 8, orthogonal=True, generator=gen(0))
    assert g.shape == (20, 8)
    for start in (0, 8):
        block = g[start : start + 8]
        gram = block @ block.T
        off = gram - torch.diag(torch.diagonal(gram))
        assert float(off.abs().max()) < 1e-10
    # rows are rescaled by chi_d norms, not unit vectors
    assert float((g.norm(dim=1) - 1).abs().max()) > 0.05


# --------------------------------------------------------------------------- URFs
def urf_per_draw(fmap: URFMap, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per-draw estimates: the features come in groups of m draws (one group per atom/part);
    the r-th draws of all groups together form one independent estimate (times m)."""
    phi, psi = fmap.phi(x), fmap.psi(w, b)
    half = phi.shape[-1] // 2
    contrib = phi[:, None, :half] * psi[None, :, :half] + phi[:, None, half:] * psi[None, :, half:]
    m = fmap.num_features
    groups = half // m
    per = contrib.reshape(x.shape[0], w.shape[0], groups, m).sum(2) * m  # (n, l, m)
    return per.permute(2, 0, 1)


@pytest.mark.parametrize("name", ["sin", "cos"])
@pytest.mark.parametrize("fold", [True, False])
def test_urf_trig_unbiased_exact_atoms(name: str, fold: bool) -> None:
    d, m = 10, 4000
    x, w = points(4, d, 0), points(3, d, 1)
    b = torch.tensor([0.5, -1.0, 2.0], dtype=F64)
    spec = (sin_spectrum if name == "sin" else cos_spectrum)(fold=fold)
    fmap = URFMap(d, spec, m, generator=gen(2), dtype=F64)
    assert fmap.out_features == (2 * m if fold else 2 * 2 * m)  # [Re, Im] per atom
    per = urf_per_draw(fmap, x, w, b)
    fn = torch.sin if name == "sin" else torch.cos
    exact = fn(x @ w.T + b)
    assert_unbiased(per, exact)
    torch.testing.assert_close(fmap.phi(x) @ fmap.psi(w, b).T, per.mean(0), rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(fmap.expected(x, w, b), exact)


def test_trig_spectra_are_exact() -> None:
    u = torch.linspace(-7, 7, 101, dtype=F64)
    for fold in (True, False):
        torch.testing.assert_close(sin_spectrum(fold).evaluate(u), torch.sin(u))
        torch.testing.assert_close(cos_spectrum(fold).evaluate(u), torch.cos(u))
    assert sin_spectrum(fold=False).frequencies.tolist() == [1 / (2 * math.pi), -1 / (2 * math.pi)]


def test_urf_orthogonal_and_negative_a_unbiased() -> None:
    d, m = 5, 2000  # m is a multiple of d: blocks do not straddle atoms
    x, w = points(3, d, 7), points(2, d, 8)
    b = torch.tensor([0.5, 0.1], dtype=F64)
    fmap = URFMap(d, "sin", m, A=-0.2, orthogonal=True, generator=gen(9), dtype=F64)
    per = urf_per_draw(fmap, x, w, b)  # (m, 3, 2)
    per = per.reshape(m // d, d, 3, 2).mean(1)
    assert_unbiased(per, torch.sin(x @ w.T + b))


def test_sampled_spectrum_unbiased() -> None:
    spec = activation_spectrum("gelu", window=4.0, smoothing=0.3)
    d, m = 6, 6000
    x, w = points(3, d, 10), points(2, d, 11)
    b = torch.tensor([0.3, -0.4], dtype=F64)
    fmap = URFMap(d, spec, m, generator=gen(12), dtype=F64)
    per = urf_per_draw(fmap, x, w, b)
    assert_unbiased(per, spec.evaluate(x @ w.T + b))


def test_numerical_fourier_transform_against_closed_form() -> None:
    """Gaussian activation: (exp(-u^2/2) exp(-u^2/2R^2)) * N(0, s^2) is a Gaussian in closed form."""
    r, s = 3.0, 0.4
    spec = activation_spectrum("gaussian", window=r, smoothing=s, num_atoms=1201)
    u = torch.linspace(-4, 4, 81, dtype=F64)
    var = 1.0 / (1.0 + 1.0 / r**2)
    exact = math.sqrt(var / (var + s**2)) * torch.exp(-(u**2) / (2 * (var + s**2)))
    torch.testing.assert_close(spec.evaluate(u), exact, atol=1e-6, rtol=0)


def test_spectrum_from_closed_form_fourier_transform() -> None:
    """exp(-u^2/2) has FT sqrt(2 pi) exp(-2 pi^2 xi^2); the URF layer built from it is unbiased."""
    spec = spectrum_from_fourier(lambda xi: math.sqrt(2 * math.pi) * np.exp(-2 * (math.pi * xi) ** 2),
                                 xi_max=1.5, num_atoms=601, name="gaussian")
    u = torch.linspace(-3, 3, 61, dtype=F64)
    torch.testing.assert_close(spec.evaluate(u), torch.exp(-0.5 * u**2), atol=1e-8, rtol=0)
    d, m = 5, 4000
    x, w = points(3, d, 40), points(2, d, 41)
    b = torch.tensor([0.2, -0.7], dtype=F64)
    fmap = URFMap(d, spec, m, generator=gen(42), dtype=F64)
    assert_unbiased(urf_per_draw(fmap, x, w, b), torch.exp(-0.5 * (x @ w.T + b) ** 2))
    with pytest.raises(ValueError, match="finite values"):
        spectrum_from_fourier(lambda xi: xi[:3], xi_max=1.0, num_atoms=11)
    with pytest.raises(TypeError, match="callable"):
        spectrum_from_fourier(3.0, xi_max=1.0)


def test_gelu_spectrum_close_to_gelu_near_zero() -> None:
    spec = activation_spectrum("gelu", window=6.0, smoothing=0.1, num_atoms=1601)
    u = torch.linspace(-1.5, 1.5, 31, dtype=F64)
    err = (spec.evaluate(u) - torch.nn.functional.gelu(u)).abs().max()
    assert float(err) < 0.05


# ----------------------------------------------------------------------------------- the DC term
# np.linspace(-top, top, k) gives about +-1e-16 instead of 0 at its middle for some top; the
# fold onto xi >= 0 then dropped the zero frequency (a constant offset of the estimate) or
# counted it twice. The grid is now symmetric by construction and the fold snaps near-zero
# frequencies to 0. The sweeps below include settings where linspace misses 0.
DC_SMOOTHINGS = [round(float(v), 3) for v in np.linspace(0.1, 1.0, 19)] + [0.15, 0.3, 0.51, 0.59, 0.6, 0.97, 0.99]
DC_ATOMS = [401, 801]


@functools.lru_cache(maxsize=None)
def const_plus_sine_spectrum(smoothing: float, num_atoms: int):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # coarse grids at small s: periodicity warning
        return activation_spectrum(const_plus_sine, window=4.0, smoothing=smoothing, num_atoms=num_atoms)


def const_plus_sine(u: np.ndarray) -> np.ndarray:
    return 0.7 + np.sin(u)


def const_plus_sine_smoothed(u: torch.Tensor, r: float, s: float) -> torch.Tensor:
    """Closed form of ((0.7 + sin v) e^{-v^2/2R^2}) * N(0, s^2) at u, a Gaussian integral: e^{iv - v^2/2R^2} = e^{-R^2/2} e^{-(v - iR^2)^2/2R^2}, so the sine part is the
    imaginary part of a Gaussian centred at iR^2."""
    var = r**2 + s**2
    amp = r / math.sqrt(var)
    uc = u.to(torch.complex128)
    sine = (amp * math.exp(-(r**2) / 2) * torch.exp(-((uc - 1j * r**2) ** 2) / (2 * var))).imag
    return 0.7 * amp * torch.exp(-(u**2) / (2 * var)) + sine


def linspace_misses_zero(top: float, k: int) -> bool:
    mid = np.linspace(-top, top, k)[k // 2]
    return mid != 0.0


def test_dc_sweep_includes_settings_linspace_gets_wrong() -> None:
    """The sweep is meaningful: for several of its settings linspace's middle value is not 0."""
    bad = [(s, k) for s in DC_SMOOTHINGS for k in DC_ATOMS if linspace_misses_zero(3.0 / (2 * math.pi * s), k)]
    assert len(bad) >= 5, bad


@pytest.mark.parametrize("num_atoms", DC_ATOMS)
def test_dc_term_represented_once_for_every_grid(num_atoms: int) -> None:
    """Exactly one atom at xi = 0, and its density a_0 / dxi = FT(0) = int f(u) e^{-u^2/2R^2} du is
    the same for every smoothing and grid (the smoothing factor is 1 at xi = 0); the reference
    value is the integral by scipy quadrature (0.7 R sqrt(2 pi) for 0.7 + sin u)."""
    r = 4.0
    ft0 = scipy.integrate.quad(lambda v: (0.7 + math.sin(v)) * math.exp(-v * v / (2 * r * r)), -60, 60,
                               epsabs=1e-13, limit=400)[0]
    assert ft0 == pytest.approx(0.7 * r * math.sqrt(2 * math.pi), rel=1e-10)
    for s in DC_SMOOTHINGS:
        spec = const_plus_sine_spectrum(s, num_atoms)
        xi = spec.frequencies
        assert int((xi == 0).sum()) == 1, (s, num_atoms)
        assert bool((xi >= 0).all())
        assert len(xi) == (num_atoms + 1) // 2
        dxi = 3.0 / (2 * math.pi * s) / ((num_atoms - 1) // 2)
        a0 = complex(spec.weights[xi == 0][0])
        assert a0.real / dxi == pytest.approx(ft0, rel=1e-6), (s, num_atoms)
        assert abs(a0.imag) / dxi < 1e-9 * ft0


def test_constant_plus_sine_has_no_constant_offset() -> None:
    """The folded grid spectrum of 0.7 + sin u reproduces its windowed, smoothed version (closed
    form) with no constant offset, for every smoothing of the sweep (the lost DC term was an
    offset of about 0.7 R sqrt(2 pi) dxi)."""
    r = 4.0
    u = torch.linspace(-3, 3, 61, dtype=F64)
    for s in DC_SMOOTHINGS:
        spec = const_plus_sine_spectrum(s, 801)
        diff = spec.evaluate(u) - const_plus_sine_smoothed(u, r, s)
        assert abs(float(diff.mean())) < 1e-7, (s, float(diff.mean()))
        assert float(diff.abs().max()) < 1e-6, (s, float(diff.abs().max()))


@pytest.mark.parametrize("smoothing", [0.15, 0.3, 0.51, 0.6, 0.97])
def test_gelu_estimate_has_no_constant_offset(smoothing: float) -> None:
    """GELU, the chapter's activation, at the settings the review found broken (0.15, 0.3, 0.51,
    0.6 dropped the DC term, 0.97 doubled it): the grid spectrum equals the windowed, smoothed
    GELU computed by scipy quadrature of the convolution integral."""
    from scipy.special import erf

    r = 4.0
    spec = activation_spectrum("gelu", window=r, smoothing=smoothing)
    us = [-2.0, -1.0, 0.0, 0.5, 1.5]

    def smoothed_gelu(uu: float) -> float:
        def integrand(v: float) -> float:
            gelu = 0.5 * v * (1 + erf(v / math.sqrt(2)))
            return gelu * math.exp(-v * v / (2 * r * r)) * math.exp(-((uu - v) ** 2) / (2 * smoothing**2))
        lo, hi = uu - 12 * smoothing, uu + 12 * smoothing
        return scipy.integrate.quad(integrand, lo, hi, epsabs=1e-13, limit=200)[0] / (
            math.sqrt(2 * math.pi) * smoothing)

    ref = torch.tensor([smoothed_gelu(v) for v in us], dtype=F64)
    diff = spec.evaluate(torch.tensor(us, dtype=F64)) - ref
    assert abs(float(diff.mean())) < 1e-4, float(diff.mean())
    assert float(diff.abs().max()) < 1e-4, float(diff.abs().max())


def test_closed_form_spectrum_keeps_dc_term() -> None:
    """spectrum_from_fourier uses the same symmetric grid: a Gaussian's closed-form transform has
    one atom at 0 and the estimate has no offset, for xi_max values where linspace misses 0."""
    ft = lambda xi: math.sqrt(2 * math.pi) * np.exp(-2 * (math.pi * xi) ** 2)
    u = torch.linspace(-3, 3, 61, dtype=F64)
    for top in np.linspace(1.2, 2.5, 27):
        spec = spectrum_from_fourier(ft, xi_max=float(top), num_atoms=601)
        assert int((spec.frequencies == 0).sum()) == 1
        torch.testing.assert_close(spec.evaluate(u), torch.exp(-0.5 * u**2), atol=1e-8, rtol=0)


# --------------------------------------------------------------------------- arc-cosine
def arccos_quadrature(x: np.ndarray, y: np.ndarray, order: int) -> float:
    """2 E[Theta(w.x) Theta(w.y) (w.x)^n (w.y)^n] in 2-D by quadrature over the angle."""
    radial = 2**order * math.factorial(order) / (2 * math.pi)  # int r^{2n+1} e^{-r^2/2} dr / 2pi
    def integrand(phi: float) -> float:
        e = np.array([math.cos(phi), math.sin(phi)])
        a, b = e @ x, e @ y
        return (a > 0) * (b > 0) * (a**order) * (b**order) if order else float((a > 0) and (b > 0))
    # integrate piecewise between the angles where w.x or w.y changes sign (the kinks)
    kinks = sorted(
        (math.atan2(v[1], v[0]) + sgn * math.pi / 2) % (2 * math.pi) for v in (x, y) for sgn in (-1, 1)
    )
    edges = [0.0, *kinks, 2 * math.pi]
    val = sum(scipy.integrate.quad(integrand, lo, hi, epsabs=1e-13)[0] for lo, hi in zip(edges, edges[1:]))
    return 2 * radial * val


@pytest.mark.parametrize("order", [0, 1, 2])
def test_arccos_kernel_matches_quadrature(order: int) -> None:
    rng = np.random.default_rng(order)
    xs, ys = rng.normal(size=(4, 2)), rng.normal(size=(3, 2))
    ref = np.array([[arccos_quadrature(a, b, order) for b in ys] for a in xs])
    got = arccos_kernel(torch.as_tensor(xs), torch.as_tensor(ys), order).numpy()
    np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("order", [0, 1, 2])
def test_arccos_features_monte_carlo(order: int) -> None:
    d, m = 7, 20000
    x = torch.randn(3, d, generator=gen(20), dtype=F64)
    y = torch.randn(2, d, generator=gen(21), dtype=F64)
    g = gaussian_projections(m, d, generator=gen(22))
    fx, fy = arccos_features(x, g, order), arccos_features(y, g, order)
    per = fx.T[:, :, None] * fy.T[:, None, :] * m
    assert_unbiased(per, arccos_kernel(x, y, order))


def test_arccos_kernel_special_values() -> None:
    x = torch.tensor([[1.0, 0.0]], dtype=F64)
    y = torch.tensor([[0.0, 2.0], [3.0, 0.0], [-1.0, 0.0]], dtype=F64)
    k1 = arccos_kernel(x, y, 1)
    # orthogonal: |x||y| J_1(pi/2)/pi = 2/pi; parallel: |x||y| = 3; opposite: 0
    torch.testing.assert_close(k1, torch.tensor([[2 / math.pi, 3.0, 0.0]], dtype=F64))


def test_relu_map_estimates_half_arccos_and_remark_3_3() -> None:
    d, m = 5, 30000
    fmap = ReLUMap(d, m, bias=True, generator=gen(30), dtype=F64)
    x = torch.randn(3, d, generator=gen(31), dtype=F64)
    w = torch.randn(2, d, generator=gen(32), dtype=F64)
    b = torch.tensor([0.3, -0.2], dtype=F64)
    phi, psi = fmap.phi(x), fmap.psi(w, b)
    per = (phi.T[:, :, None] * psi.T[:, None, :]) * m
    assert_unbiased(per, fmap.expected(x, w, b))
    # Remark 3.3: same pre-activation w^T x = 0 (no bias), different outputs -> not f(w^T x)
    nob = ReLUMap(2, 8, bias=False, generator=gen(0), dtype=F64)
    xs = torch.tensor([[1.0, 0.0], [2.0, 0.0]], dtype=F64)
    ws = torch.tensor([[0.0, 1.0]], dtype=F64)
    out = nob.expected(xs, ws)
    assert float(out[1, 0]) == pytest.approx(2 * float(out[0, 0]))
    assert float(out[0, 0]) > 0


# --------------------------------------------------------------------------- bad input
def test_bad_num_features() -> None:
    for bad in (0, -3):
        with pytest.raises(ValueError, match="num_features"):
            URFMap(4, "sin", bad)
        with pytest.raises(ValueError, match="num_features"):
            gaussian_projections(bad, 4)
        with pytest.raises(ValueError, match="num_features"):
            ReLUMap(4, bad)
    with pytest.raises(TypeError, match="num_features"):
        URFMap(4, "sin", 2.5)


def test_bad_a() -> None:
    g = gaussian_projections(4, 3, generator=gen(0))
    x = points(2, 3, 0)
    for bad in (0.25, 0.3, 1.0):
        with pytest.raises(ValueError, match="A must be < 1/4"):
            softmax_features(x, g, A=bad)
        with pytest.raises(ValueError, match="A must be < 1/4"):
            URFMap(3, "cos", 4, A=bad)
    with pytest.warns(RuntimeWarning, match="unbounded"):
        softmax_features(x, g, A=0.1)
    with pytest.warns(RuntimeWarning, match="variance is infinite"):
        softmax_features(x, g, A=0.2)
    with pytest.raises(TypeError, match="A must be"):
        softmax_features(x, g, A="0")


def test_unsupported_activation() -> None:
    with pytest.raises(ValueError, match="activation"):
        URFMap(3, "swish", 4)
    with pytest.raises(ValueError, match="activation"):
        spectrum_from_name("softsign")
    with pytest.raises(ValueError, match="activation"):
        activation_spectrum("elu")
    with pytest.raises(ValueError, match="num_atoms"):
        activation_spectrum("relu", num_atoms=100)


def test_mismatched_dimensions() -> None:
    g = gaussian_projections(4, 3, generator=gen(0))
    with pytest.raises(ValueError, match="feature dimension"):
        softmax_features(points(2, 5, 0), g)
    fmap = URFMap(3, "sin", 4)
    with pytest.raises(ValueError, match=r"x must have shape \(\.\.\., 3\)"):
        fmap.phi(torch.zeros(2, 4))
    with pytest.raises(ValueError, match="weight must have 3 columns"):
        fmap.psi(torch.zeros(2, 4))
    with pytest.raises(ValueError, match="bias must have 2 entries"):
        fmap.psi(torch.zeros(2, 3), torch.zeros(3))
    with pytest.raises(ValueError, match="same feature dimension"):
        arccos_kernel(torch.zeros(2, 3), torch.zeros(2, 4))
    with pytest.raises(ValueError, match="order"):
        arccos_kernel(torch.zeros(2, 3), torch.zeros(2, 3), 3)
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        fmap.phi(np.zeros((2, 3)))


def test_overflow_warning_suggests_fix() -> None:
    fmap = URFMap(16, "sin", 8, generator=gen(0))
    x = 30.0 * torch.ones(2, 16)  # alpha^2 |x|^2 / 2 = 7200 >> 88.7 = log(float32 max)
    with pytest.warns(FeatureOverflowWarning, match="scale the inputs down"):
        fmap.phi(x)
    g = gaussian_projections(8, 16, generator=gen(1), dtype=torch.float32)
    with pytest.warns(FeatureOverflowWarning, match="underflow"):
        softmax_features(20.0 * torch.ones(2, 16), g)  # |x|^2/2 = 3200: every feature is 0
    with pytest.warns(RuntimeWarning, match="period"):
        activation_spectrum("relu", window=50.0, smoothing=0.05, num_atoms=11)


def test_mixed_dtypes_and_zero_features_are_named() -> None:
    """Mixed dtypes and zero features get errors that name them, not a raw matmul error or a
    ZeroDivisionError."""
    from kernels.features import arccos_features, arccos_kernel, softmax_features, softmax_kernel

    x32, x64 = torch.randn(3, 4), torch.randn(2, 4, dtype=torch.float64)
    for kernel in (softmax_kernel, arccos_kernel):
        with pytest.raises(TypeError, match=r"x and y must have the same dtype.*float32.*float64"):
            kernel(x32, x64)
        with pytest.raises(TypeError, match="float16"):
            kernel(x32.half(), x32)
        with pytest.raises(ValueError, match="x is on the 'meta' device"):
            kernel(torch.randn(3, 4, device="meta"), x32)
    for features in (arccos_features, softmax_features):
        with pytest.raises(ValueError, match="projections must have at least one row"):
            features(x32, torch.randn(0, 4))
