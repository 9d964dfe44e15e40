"""fc_kernel against a high-precision recursion and its derivatives.

The reference is the same layer recursion (Jacot et al. 2018, Thm. 1; arc-cosine and
arcsine kernels, chapter 1) in mpmath at 50 significant digits, started from the exact
values of the float64 inputs; the stable angle of :func:`kernels.ntk._relu_step` must
agree with it to 1e-12 relative at collinear, orthogonal and nearly opposite inputs.
Gradients with respect to the inputs are checked with ``gradcheck`` (reverse and forward
mode), ``torch.func.jacfwd``/``jacrev``, a closed form on the diagonal and
neural-tangents' ``jax.grad`` of its ``kernel_fn``.
"""

from __future__ import annotations

import pytest
import torch

from kernels.ntk import fc_kernel

mpmath = pytest.importorskip("mpmath", reason="mpmath is the high-precision reference")
mp = mpmath.mp
F64 = torch.float64


def mp_fc_kernel(x1, x2, depth, activation="relu", W_std=1.0, b_std=0.0):
    """(nngp, ntk) of one pair by the layer recursion in mpmath (50 digits)."""
    with mp.workdps(50):
        x1 = [mp.mpf(float(v)) for v in x1]
        x2 = [mp.mpf(float(v)) for v in x2]
        d = len(x1)
        w, b = mp.mpf(W_std) ** 2, mp.mpf(b_std) ** 2
        dot = lambda u, v: mp.fsum(p * q for p, q in zip(u, v))
        v1, v2, c = (w * dot(u, v) / d + b for u, v in ((x1, x1), (x2, x2), (x1, x2)))
        theta = c
        for _ in range(depth):
            if activation == "relu":
                s = mp.sqrt(v1 * v2)
                cos = max(min(c / s, mp.mpf(1)), mp.mpf(-1)) if s else mp.mpf(0)
                phi = mp.acos(cos)
                new = lambda vv, cc, ph: w * mp.sqrt(vv) / (2 * mp.pi) * (mp.sin(ph) + (mp.pi - ph) * mp.cos(ph)) + b
                dot_sigma = w * (mp.pi - phi) / (2 * mp.pi)
                c_next = w * s / (2 * mp.pi) * (mp.sin(phi) + (mp.pi - phi) * cos) + b
                v1, v2 = w * v1 / 2 + b, w * v2 / 2 + b
            else:
                r = mp.sqrt((1 + 2 * v1) * (1 + 2 * v2))
                dot_sigma = w * 4 / mp.pi / mp.sqrt((1 + 2 * v1) * (1 + 2 * v2) - 4 * c * c)
                c_next = w * 2 / mp.pi * mp.asin(2 * c / r) + b
                v1 = w * 2 / mp.pi * mp.asin(2 * v1 / (1 + 2 * v1)) + b
                v2 = w * 2 / mp.pi * mp.asin(2 * v2 / (1 + 2 * v2)) + b
            theta = theta * dot_sigma + c_next
            c = c_next
        return c, theta


def rel(ours: float, ref) -> float:
    return float(abs(mp.mpf(ours) - ref) / max(abs(ref), mp.mpf(1e-30)))


def test_issue_example_is_exact():
    res = fc_kernel(torch.tensor([[1.0, 1.0]], dtype=F64), depth=5, activation="relu")
    assert res.ntk.item() == 0.1875  # 1, 1, 0.75, 0.5, 0.3125, 0.1875
    assert res.nngp.item() == 2.0 ** -5


PAIRS = {
    "identical": ([0.3, -1.7, 2.25, 0.5], [0.3, -1.7, 2.25, 0.5]),
    "collinear": ([1.0, 2.0, -3.0, 0.5], [2.0, 4.0, -6.0, 1.0]),
    "collinear_scaled": ([1.0, 2.0, -3.0, 0.5], [0.25, 0.5, -0.75, 0.125]),
    "orthogonal": ([1.0, 2.0, 0.0, -1.0], [2.0, -1.0, 3.0, 0.0]),
    "opposite": ([1.0, 2.0, -3.0, 0.5], [-1.0, -2.0, 3.0, -0.5]),
    "nearly_opposite": ([1.0, 2.0, -3.0, 0.5], [-1.0, -2.0, 3.0, -0.5 + 2.0**-10]),
    "nearly_collinear": ([1.0, 2.0, -3.0, 0.5], [1.0, 2.0, -3.0, 0.375]),
    "generic": ([0.3, -1.1, 0.7, 2.0], [-0.4, 0.9, 1.3, -0.2]),
}


@pytest.mark.parametrize("name", sorted(PAIRS))
@pytest.mark.parametrize("W_std, b_std", [(1.0, 0.0), (1.3, 0.2)])
def test_relu_matches_high_precision_recursion(name, W_std, b_std):
    u, v = PAIRS[name]
    x1, x2 = torch.tensor([u], dtype=F64), torch.tensor([v], dtype=F64)
    for depth in range(1, 11):
        res = fc_kernel(x1, x2, depth=depth, W_std=W_std, b_std=b_std)
        nngp, ntk = mp_fc_kernel(u, v, depth, "relu", W_std, b_std)
        assert rel(res.nngp.item(), nngp) <= 1e-12, (name, depth, "nngp")
        assert rel(res.ntk.item(), ntk) <= 1e-12, (name, depth, "ntk")
        # the symmetric path (x2 = None) on the pair stacked, diagonal included
        both = torch.cat([x1, x2])
        sym = fc_kernel(both, depth=depth, W_std=W_std, b_std=b_std)
        for i, (p, q) in enumerate(((u, u), (v, v), (u, v))):
            n_ref, t_ref = mp_fc_kernel(p, q, depth, "relu", W_std, b_std)
            r, c = (i, i) if i < 2 else (0, 1)
            assert rel(sym.ntk[r, c].item(), t_ref) <= 1e-12, (name, depth, i)
            assert rel(sym.nngp[r, c].item(), n_ref) <= 1e-12, (name, depth, i)


def test_nearly_opposite_inputs_with_rounded_dot_products():
    # 0.5 * 0.499 and the sums round, so Sigma^(1) carries relative errors of ~1e-16;
    # at 1 - |cos| ~ 1e-7 the angle then moves by ~1e-16 / 1e-7 relative, and with
    # b = 0 the depth-1 NNGP (~ psi^3) by about 3e-9: a property of the float64 inputs
    # to the recursion, not of the recursion. Deeper layers and b > 0 are well conditioned.
    u, v = [1.0, 2.0, -3.0, 0.5], [-1.0, -2.0, 3.0, -0.499]
    x1, x2 = torch.tensor([u], dtype=F64), torch.tensor([v], dtype=F64)
    for depth in range(1, 11):
        res = fc_kernel(x1, x2, depth=depth)
        nngp, ntk = mp_fc_kernel(u, v, depth)
        assert rel(res.nngp.item(), nngp) <= (1e-8 if depth == 1 else 1e-12)
        assert rel(res.ntk.item(), ntk) <= 1e-8
        res = fc_kernel(x1, x2, depth=depth, W_std=1.3, b_std=0.2)
        nngp, ntk = mp_fc_kernel(u, v, depth, "relu", 1.3, 0.2)
        assert rel(res.nngp.item(), nngp) <= 1e-12 and rel(res.ntk.item(), ntk) <= 1e-12


@pytest.mark.parametrize("name", ["identical", "orthogonal", "generic", "nearly_opposite"])
def test_erf_matches_high_precision_recursion(name):
    u, v = PAIRS[name]
    x1, x2 = torch.tensor([u], dtype=F64), torch.tensor([v], dtype=F64)
    for depth in (1, 3, 6, 10):
        res = fc_kernel(x1, x2, depth=depth, activation="erf", W_std=1.2, b_std=0.1)
        nngp, ntk = mp_fc_kernel(u, v, depth, "erf", 1.2, 0.1)
        assert rel(res.nngp.item(), nngp) <= 1e-12 and rel(res.ntk.item(), ntk) <= 1e-12


def ntk_of(activation, depth, x2=False, **kw):
    def f(x):
        return fc_kernel(x, x.flip(0) if x2 else None, depth=depth, activation=activation, **kw).ntk
    return f


@pytest.mark.parametrize("activation", ["relu", "erf"])
@pytest.mark.parametrize("x2", [False, True])
def test_gradcheck_with_respect_to_inputs(activation, x2):
    x = torch.randn(4, 3, dtype=F64, generator=torch.Generator().manual_seed(3)).requires_grad_()
    for depth in (1, 3):
        f = ntk_of(activation, depth, x2, W_std=1.2, b_std=0.1)
        assert torch.autograd.gradcheck(f, (x,), check_forward_ad=True)
        g = lambda x: fc_kernel(x, x.flip(0) if x2 else None, depth=depth, activation=activation,
                                W_std=1.2, b_std=0.1).nngp
        assert torch.autograd.gradcheck(g, (x,), check_forward_ad=True)


def test_diagonal_gradient_is_finite_and_analytic():
    # depth 1, ReLU, W = 1, b = 0: Theta(x, x) = |x|^2 / d * (1/2 + 1/2), gradient 2x/d.
    x = torch.tensor([[1.0, 2.0]], dtype=F64)
    f = lambda x: fc_kernel(x, depth=1, activation="relu").ntk.sum()
    fwd = torch.func.jacfwd(f)(x)
    rev = torch.func.jacrev(f)(x)
    torch.testing.assert_close(fwd, torch.tensor([[1.0, 2.0]], dtype=F64), rtol=0, atol=1e-15)
    torch.testing.assert_close(rev, fwd, rtol=0, atol=1e-15)
    xr = x.clone().requires_grad_()
    f(xr).backward()
    torch.testing.assert_close(xr.grad, fwd, rtol=0, atol=1e-15)
    # deeper: Theta(x, x) = c_L |x|^2 / d with c_L the diagonal's closed form
    for depth in (2, 5):
        g = lambda x: fc_kernel(x, depth=depth).ntk.sum()
        scale = fc_kernel(torch.tensor([[1.0, 1.0]], dtype=F64), depth=depth).ntk.item()
        torch.testing.assert_close(torch.func.jacfwd(g)(x), scale * x, rtol=1e-14, atol=0)
        torch.testing.assert_close(torch.func.jacrev(g)(x), scale * x, rtol=1e-14, atol=0)


@pytest.mark.parametrize("activation", ["relu", "erf"])
def test_gradients_match_neural_tangents(activation):
    nt = pytest.importorskip("neural_tangents", reason="neural-tangents is the reference")
    import jax
    import jax.numpy as jnp
    from neural_tangents import stax

    previous = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    try:
        act = {"relu": stax.Relu, "erf": stax.Erf}[activation]
        depth, W_std, b_std = 3, 1.3, 0.2
        layers = []
        for _ in range(depth):
            layers += [stax.Dense(64, W_std, b_std), act()]
        _, _, kernel_fn = stax.serial(*layers, stax.Dense(1, W_std, b_std))
        gen = torch.Generator().manual_seed(5)
        x1 = torch.randn(3, 4, dtype=F64, generator=gen)
        x2 = torch.randn(2, 4, dtype=F64, generator=gen)
        w = torch.randn(3, 2, dtype=F64, generator=gen)
        for kind in ("ntk", "nngp"):
            def ref(a, b):
                return jnp.sum(kernel_fn(a, b, kind) * jnp.asarray(w.numpy()))
            ga, gb = jax.grad(ref, argnums=(0, 1))(jnp.asarray(x1.numpy()), jnp.asarray(x2.numpy()))
            a, b = x1.clone().requires_grad_(), x2.clone().requires_grad_()
            (getattr(fc_kernel(a, b, depth=depth, activation=activation, W_std=W_std, b_std=b_std), kind) * w).sum().backward()
            torch.testing.assert_close(a.grad, torch.from_numpy(ga.__array__()), rtol=1e-10, atol=1e-12)
            torch.testing.assert_close(b.grad, torch.from_numpy(gb.__array__()), rtol=1e-10, atol=1e-12)
            # the symmetric case, with the diagonal
            sym = lambda a: jnp.sum(kernel_fn(a, None, kind))
            gs = jax.grad(sym)(jnp.asarray(x1.numpy()))
            a = x1.clone().requires_grad_()
            getattr(fc_kernel(a, depth=depth, activation=activation, W_std=W_std, b_std=b_std), kind).sum().backward()
            torch.testing.assert_close(a.grad, torch.from_numpy(gs.__array__()), rtol=1e-10, atol=1e-12)
    finally:
        jax.config.update("jax_enable_x64", previous)


def test_no_grad_and_grad_paths_agree():
    x = torch.randn(300, 5, dtype=F64, generator=torch.Generator().manual_seed(1))
    y = torch.randn(120, 5, dtype=F64, generator=torch.Generator().manual_seed(2))
    for b in (None, y):
        plain = fc_kernel(x, b, depth=4, W_std=1.1, b_std=0.3)
        graph = fc_kernel(x.clone().requires_grad_(), b, depth=4, W_std=1.1, b_std=0.3)
        torch.testing.assert_close(graph.ntk.detach(), plain.ntk, rtol=1e-13, atol=0)
        torch.testing.assert_close(graph.nngp.detach(), plain.nngp, rtol=1e-13, atol=0)
