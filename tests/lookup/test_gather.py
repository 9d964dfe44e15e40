"""Tests of :mod:`kernels.lookup.gather` (codes, weights, the gather in torch, naive and fused form, narrow tables, the compiled kernels)."""

from __future__ import annotations

import pytest
import torch

from kernels import _ext
from kernels.lookup import (
    LookupFFN,
    gather_fused,
    hash_codes,
    lookup_bh_forward_fused,
    lookup_bh_hash_fused,
    lookup_forward_fused,
    lookup_gather,
    lookup_gather_naive,
    lookup_softmax,
    lookup_weights,
    sign_matrix,
    dequantize_tables,
    quantize_tables,
)

from lookup_helpers import F64, HALF, _draw, _isolated_errors, _rounding_bound


def test_sign_matrix_rows_are_binary_representations() -> None:
    s = sign_matrix(3)
    assert s.shape == (8, 3)
    for i in range(8):
        assert [int(v > 0) for v in s[i]] == [(i >> j) & 1 for j in range(3)]


def test_argmax_is_decimal_of_sign_eq12() -> None:
    z, _ = _draw(200, 4, 5, 1, seed=1)
    s = sign_matrix(5)
    scores = z.reshape(200, 4, 5) @ s.T
    assert torch.equal(hash_codes(z, 5), scores.argmax(-1))
    assert torch.equal(hash_codes(-z, 5), scores.argmin(-1))


def test_denominator_identity_eq11_and_weights() -> None:
    z, _ = _draw(50, 3, 6, 1, seed=2)
    zk = z.reshape(50, 3, 6)
    scores = zk @ sign_matrix(6).T
    torch.testing.assert_close(torch.exp(scores).sum(-1), torch.prod(torch.exp(zk) + torch.exp(-zk), -1))
    top = scores.max(-1).values
    want = torch.exp(top) / torch.exp(scores).sum(-1)
    torch.testing.assert_close(lookup_weights(z, 6, scaled=False), want)
    torch.testing.assert_close(lookup_weights(z, 6, scaled=True), want * top)


@pytest.mark.parametrize("scaled", [True, False])
def test_lookup_gather_matches_literal_formula(scaled: bool) -> None:
    z, tables = _draw(33, 7, 4, 9, seed=3)
    torch.testing.assert_close(lookup_gather(z, tables, scaled), lookup_gather_naive(z, tables, scaled))
    # leading batch dimensions
    z3 = z.reshape(3, 11, -1)
    assert lookup_gather(z3, tables, scaled).shape == (3, 11, 9)


def test_top_numerator_approaches_full_softmax_for_confident_codes() -> None:
    # Eq. 13 keeps only the largest numerator of eq. 10: exact in the limit |z| -> inf.
    z, tables = _draw(40, 3, 4, 5, seed=4)
    z = torch.sign(z) * (6.0 + z.abs())  # every |z_kj| >= 6: sigma(12) = 1 - 6e-6
    full = lookup_softmax(z, tables)
    top = lookup_gather(z, tables, scaled=False)
    assert (full - top).abs().max() < 1e-4 * full.abs().max()


@pytest.mark.parametrize("scaled", [True, False])
def test_lookup_gather_gradcheck(scaled: bool) -> None:
    z, tables = _draw(6, 3, 3, 4, seed=5)
    z.requires_grad_(True)
    tables.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda a, b: lookup_gather(a, b, scaled), (z, tables))


@pytest.mark.parametrize("scaled", [True, False])
def test_custom_backward_matches_autograd_of_literal_formula(scaled: bool) -> None:
    z, tables = _draw(64, 5, 6, 7, seed=6)
    g = torch.randn(64, 7, dtype=F64, generator=torch.Generator().manual_seed(60))
    grads = []
    for fn in (lookup_gather, lookup_gather_naive):
        a, b = z.clone().requires_grad_(), tables.clone().requires_grad_()
        (fn(a, b, scaled) * g).sum().backward()
        grads.append((a.grad, b.grad))
    torch.testing.assert_close(grads[0][0], grads[1][0])
    torch.testing.assert_close(grads[0][1], grads[1][1])


def test_remark_3_1_sigmoid_and_fast_gelu_are_tau_1_cases() -> None:
    gen = torch.Generator().manual_seed(7)
    d, k = 6, 10
    x = torch.randn(25, d, generator=gen, dtype=F64)
    w = torch.randn(k, d, generator=gen, dtype=F64)
    v = torch.randn(k, 3, generator=gen, dtype=F64)
    tables = torch.zeros(k, 2, 3, dtype=F64)
    tables[:, 1] = v  # row "+1" holds V_k, row "-1" is zero
    pre = x @ w.T
    # sigmoid FFN (eq. 15): z_k = 0.5 <x, w_k>
    torch.testing.assert_close(lookup_softmax(0.5 * pre, tables), torch.sigmoid(pre) @ v,
                               rtol=1e-14, atol=1e-14)
    # fast GELU u * sigmoid(1.702 u) (eq. 16): z_k = 0.851 <x, w_k>, factor 1.175 <z, S>
    got = lookup_softmax(0.851 * pre, 1.175 * tables, scaled=True)
    want = (1.175 * 0.851 * pre * torch.sigmoid(2 * 0.851 * pre)) @ v
    torch.testing.assert_close(got, want, rtol=1e-14, atol=1e-14)


def test_extension_builds() -> None:
    module = _ext.build()  # must build on this platform (g++ is part of it)
    assert hasattr(module, "lookup_forward")


@pytest.mark.parametrize("dtype", [F64, torch.float32])
@pytest.mark.parametrize("scaled", [True, False])
@pytest.mark.parametrize("n,h,tau,d_out", [(37, 7, 3, 9), (5, 16, 8, 64), (0, 2, 2, 3), (19, 1, 13, 5)])
def test_fused_kernel_matches_reference(dtype, scaled, n, h, tau, d_out) -> None:
    z, tables = _draw(n, h, tau, d_out, seed=8, dtype=dtype)
    want = lookup_gather_naive(z.double(), tables.double(), scaled).to(dtype)
    tol = 1e-12 if dtype == F64 else 1e-4
    torch.testing.assert_close(lookup_forward_fused(z, tables, scaled), want, rtol=tol, atol=tol)
    if n:
        codes = hash_codes(z, tau).contiguous()
        weights = lookup_weights(z, tau, scaled).contiguous()
        torch.testing.assert_close(gather_fused(codes, weights, tables), want, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [F64, torch.float32])
@pytest.mark.parametrize("d_model,h,tau,block", [(64, 16, 4, 16), (100, 40, 7, 32), (48, 30, 8, 16)])
def test_fully_fused_bh_kernel_matches_torch(dtype, d_model, h, tau, block) -> None:
    layer = LookupFFN(d_model, h, tau, block=block, d_out=24,
                      generator=torch.Generator().manual_seed(9), dtype=dtype)
    x = torch.randn(2, 13, d_model, dtype=dtype, generator=torch.Generator().manual_seed(90))
    with torch.no_grad():
        want = layer(x, backend="naive")
        auto = layer(x)  # no_grad + CPU: the fused kernel
        direct = lookup_bh_forward_fused(x.reshape(-1, d_model), layer.projection, layer.tables, True)
    tol = 1e-11 if dtype == F64 else 2e-4
    torch.testing.assert_close(auto, want, rtol=tol, atol=tol)
    torch.testing.assert_close(direct.reshape(want.shape), want, rtol=tol, atol=tol)


# The fused kernels' tiling: hash tiles of 48 tokens, register blocks of 6 / 8 /
# 12 tokens (blocks of 64 / 32 / 16 with AVX-512), super-tiles of 480 tokens for the
# gather, output columns in passes of 128 and 16 plus a scalar tail. The token counts and
# d_out below straddle every one of those boundaries (1, 47, 49, 481 tokens; d_out = 5 is
# the scalar tail alone, 17 one 16-column pass + 1, 130 one 128-column pass + 2); every
# table storage; reference: the literal formula (lookup_gather_naive) in float64 on the
# same (rounded) tables, through the layer's pure-torch projection.
@pytest.mark.parametrize("table_dtype", [None, torch.float16, torch.bfloat16, torch.int8, F64])
@pytest.mark.parametrize(
    "n,d_model,h,tau,block,d_out",
    [(1, 64, 8, 8, 64, 17), (47, 64, 8, 8, 64, 130), (49, 32, 5, 3, 16, 5), (481, 64, 24, 4, 32, 17),
     (50, 128, 64, 8, 64, 33), (13, 40, 20, 9, 16, 130), (29, 64, 16, 8, 64, 401)],
)
def test_fused_tiling_sweep_matches_literal_formula(table_dtype, n, d_model, h, tau, block, d_out) -> None:
    dtype = F64 if table_dtype is F64 else torch.float32
    layer = LookupFFN(d_model, h, tau, block=block, d_out=d_out, dtype=dtype,
                      table_dtype=None if table_dtype is F64 else table_dtype,
                      generator=torch.Generator().manual_seed(n + h))
    x = torch.randn(n, d_model, dtype=dtype, generator=torch.Generator().manual_seed(7 + n))
    with torch.no_grad():
        tables, scales = layer.inference_tables(), layer.inference_scales()
        # the function the stored tables stand for, in float64 (int8: q times its row's scale)
        wide = tables.double() if scales is None else tables.double() * scales.double()[..., None]
        z = layer.projection(x).double()  # the pure-torch BH4 projection
        want = lookup_gather_naive(z, wide, True)
        got = lookup_bh_forward_fused(x, layer.projection, tables, True, scales=scales)
        got_z = lookup_forward_fused(layer.projection(x).contiguous(), tables, True, scales=scales)
    assert got.dtype == dtype and got.shape == (n, d_out)
    tol = 1e-10 if dtype == F64 else 2e-4
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol)
    torch.testing.assert_close(got_z.double(), want, rtol=tol, atol=tol)
    # the hash-only timing entry runs the same hash: its first entry per super-tile is the
    # sum of the weights plus the number of odd row offsets, nothing else is promised
    marker = lookup_bh_hash_fused(x, layer.projection, tables, True, scales=scales)
    assert marker.shape == (n, d_out)
    # non-contiguous input through the layer (which makes it contiguous for the kernel)
    xt = torch.randn(n, 2 * d_model, dtype=dtype, generator=torch.Generator().manual_seed(3))[:, ::2]
    assert not xt.is_contiguous()
    with torch.no_grad():
        torch.testing.assert_close(layer(xt, backend="fused").double(),
                                   lookup_gather_naive(layer.projection(xt).double(), wide, True),
                                   rtol=tol, atol=tol)
    with pytest.raises(ValueError, match="contiguous"):
        lookup_bh_hash_fused(xt, layer.projection, tables, True, scales=scales)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("scaled", [True, False])
@pytest.mark.parametrize("n,h,tau,d_out", [(37, 7, 3, 9), (5, 16, 8, 64), (0, 2, 2, 3), (19, 1, 13, 5), (23, 12, 6, 130)])
def test_half_tables_fused_kernel_matches_formula_and_rounding_bound(dtype, scaled, n, h, tau, d_out) -> None:
    z, tables = _draw(n, h, tau, d_out, seed=18, dtype=torch.float32)
    tables = tables / (h * tau) ** 0.5  # LookupFFN's initial scale: many entries below 2**-14
    low = tables.to(dtype)
    got = lookup_forward_fused(z, low, scaled)
    assert got.dtype == torch.float32
    # (1) the literal formula on the rounded tables
    want = lookup_gather_naive(z.double(), low.double(), scaled)
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-5)
    if n:
        codes = hash_codes(z, tau).contiguous()
        weights = lookup_weights(z, tau, scaled).contiguous()
        torch.testing.assert_close(gather_fused(codes, weights, low).double(), want, rtol=1e-4, atol=1e-5)
    # (2) against float32 tables: within the rounding bound (plus float32 accumulation)
    exact = lookup_gather_naive(z.double(), tables.double(), scaled)
    bound = _rounding_bound(z, tables, dtype, scaled)
    slack = 1e-5 * exact.abs().amax() if n else 0.0
    assert bool(((got.double() - exact).abs() <= bound * 1.001 + slack).all())
    if n:  # and the bound is not vacuous: the error is a sizeable part of it
        assert float((got.double() - exact).abs().max()) > 0.05 * float(bound.max())


def test_half_tables_bad_arguments() -> None:
    gen = torch.Generator().manual_seed(20)
    with pytest.raises(ValueError, match="table_dtype must be None, torch.float16, torch.bfloat16 or torch.int8"):
        LookupFFN(32, 4, 4, block=16, table_dtype=torch.int16, generator=gen)
    with pytest.raises(TypeError, match="table_dtype must be None or a torch.dtype"):
        LookupFFN(32, 4, 4, block=16, table_dtype="float16", generator=gen)
    with pytest.raises(ValueError, match="table_dtype needs a float32 layer"):
        LookupFFN(32, 4, 4, block=16, table_dtype=torch.float16, generator=gen, dtype=F64)
    layer = LookupFFN(32, 4, 4, block=16, generator=gen)
    with pytest.raises(ValueError, match="table_dtype must be None"):
        layer.table_dtype = torch.float64
    z, tables = _draw(6, 4, 4, 8, dtype=F64)
    with pytest.raises(TypeError, match="tables need z as float32"):
        lookup_forward_fused(z, tables.half())
    with pytest.raises(TypeError, match="z and tables must have the same dtype"):
        lookup_forward_fused(z.float(), tables)
    with pytest.raises(TypeError, match="the fused kernel needs tables as float32, float64, float16, bfloat16 or int8"):
        lookup_forward_fused(z.float(), tables.to(torch.int32))
    with pytest.raises(TypeError, match="tables need x as float32"):
        lookup_bh_forward_fused(torch.zeros(3, 32, dtype=F64), LookupFFN(32, 4, 4, block=16, dtype=F64).projection,
                                tables.half())
    with pytest.raises(TypeError, match="tables need weights as float32"):
        gather_fused(torch.zeros(6, 4, dtype=torch.int64), torch.zeros(6, 4, dtype=F64), tables.half())
    with pytest.raises(TypeError, match="must be a torch.Tensor"):
        lookup_forward_fused(z.float(), None)


# Int8 tables with one float32 scale per row (quantize_tables). Independent references: the
# quantizer against a loop over rows written from its definition (round half to even, as
# torch.round and Python's round do); the kernels against the literal formula in float64 on
# q * scale; the error against float32 tables within the closed-form bound sum_k w_k s_k / 2.
def _quantize_loop(tables: torch.Tensor):
    h, rows, d = tables.shape
    q = torch.zeros(h, rows, d, dtype=torch.int8)
    s = torch.zeros(h, rows, dtype=torch.float32)
    for k in range(h):
        for r in range(rows):
            row = [float(v) for v in tables[k, r].double()]
            amax = max(abs(v) for v in row)
            s[k, r] = amax / 127.0  # stored as float32; q is rounded against the stored value
            if amax > 0:
                step = float(s[k, r])
                q[k, r] = torch.tensor([max(-127, min(127, round(v / step))) for v in row], dtype=torch.int8)
    return q, s


@pytest.mark.parametrize("h,tau,d_out,seed", [(3, 2, 5, 0), (2, 4, 33, 1), (1, 3, 130, 2)])
def test_quantize_tables_matches_a_loop_and_its_bound(h, tau, d_out, seed) -> None:
    gen = torch.Generator().manual_seed(seed)
    tables = torch.randn(h, 2**tau, d_out, generator=gen) * torch.logspace(-6, 2, 2**tau)[None, :, None]
    tables[0, 1] = 0.0  # a row of zeros: scale 0, q 0
    q, s = quantize_tables(tables)
    q_loop, s_loop = _quantize_loop(tables)
    assert q.dtype == torch.int8 and s.dtype == torch.float32 and q.is_contiguous() and s.is_contiguous()
    assert torch.equal(q, q_loop) and torch.equal(s, s_loop)
    assert int(q.abs().max()) == 127 and int(q.min()) >= -127
    assert float(s[0, 1]) == 0.0 and int(q[0, 1].abs().max()) == 0
    back = dequantize_tables(q, s)
    assert back.dtype == torch.float32
    err = (back.double() - tables.double()).abs()
    assert bool((err <= s.double()[..., None] * 0.5 + 1.2e-7 * tables.double().abs()).all())  # + float32 product
    assert float((err / s.double().clamp_min(1e-30)[..., None]).max()) > 0.4  # the bound is attained


@pytest.mark.parametrize("scaled", [True, False])
@pytest.mark.parametrize("n,h,tau,d_out", [(37, 7, 3, 9), (5, 16, 8, 64), (0, 2, 2, 3), (19, 1, 13, 5),
                                           (23, 12, 6, 130), (9, 20, 8, 300), (481, 17, 8, 512)])
def test_int8_tables_fused_kernels_match_formula_and_quantization_bound(scaled, n, h, tau, d_out) -> None:
    z, tables = _draw(n, h, tau, d_out, seed=21, dtype=torch.float32)
    tables = tables / (h * tau) ** 0.5
    q, s = quantize_tables(tables)
    got = lookup_forward_fused(z, q, scaled, scales=s)
    assert got.dtype == torch.float32 and got.shape == (n, d_out)
    wide = q.double() * s.double()[..., None]
    want = lookup_gather_naive(z.double(), wide, scaled)
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-5)
    if n:
        codes = hash_codes(z, tau).contiguous()
        weights = lookup_weights(z, tau, scaled).contiguous()
        torch.testing.assert_close(gather_fused(codes, weights, q, scales=s).double(), want, rtol=1e-4, atol=1e-5)
    # against the float32 tables: |y - y32| <= sum_k w_k s_{k g_k} / 2 (plus float32 sums)
    exact = lookup_gather_naive(z.double(), tables.double(), scaled)
    half_scale_rows = (s.double() / 2)[..., None].expand(h, 2**tau, 1).contiguous()
    bound = lookup_gather_naive(z.double(), half_scale_rows, scaled).abs()
    slack = 1e-5 * exact.abs().amax() if n else 0.0
    assert bool(((got.double() - exact).abs() <= bound * 1.001 + slack).all())
    if n:
        assert float((got.double() - exact).abs().max()) > 0.05 * float(bound.max())


def test_int8_tables_bad_arguments() -> None:
    z, tables = _draw(6, 4, 4, 8, dtype=torch.float32)
    q, s = quantize_tables(tables)
    codes, weights = hash_codes(z, 4).contiguous(), lookup_weights(z, 4).contiguous()
    proj = LookupFFN(32, 4, 4, block=16).projection
    x = torch.randn(6, 32)
    for call in (lambda **kw: lookup_forward_fused(z, q, **kw),
                 lambda **kw: gather_fused(codes, weights, q, **kw),
                 lambda **kw: lookup_bh_forward_fused(x, proj, q, **kw),
                 lambda **kw: lookup_bh_hash_fused(x, proj, q, **kw)):
        with pytest.raises(ValueError, match="int8 tables need their scales"):
            call()
        with pytest.raises(ValueError, match=r"scales must have shape \(h, 2\*\*tau\) = \(4, 16\)"):
            call(scales=s[:, :8])
        with pytest.raises(TypeError, match="scales must be float32"):
            call(scales=s.double())
        with pytest.raises(TypeError, match="scales must be a torch.Tensor"):
            call(scales=s.tolist())
        with pytest.raises(ValueError, match="contiguous scales"):
            call(scales=s.t().contiguous().t())
    with pytest.raises(ValueError, match="scales are only for int8 tables"):
        lookup_forward_fused(z, tables, scales=s)
    with pytest.raises(TypeError, match="tables need z as float32"):
        lookup_forward_fused(z.double(), q, scales=s)
    with pytest.raises(TypeError, match="tables must have a floating-point dtype"):
        lookup_gather(z, q)  # the training path has no int8 tables
    with pytest.raises(ValueError, match="NaN or infinite"):
        quantize_tables(torch.full((2, 4, 3), float("nan")))
    with pytest.raises(TypeError, match="q must be an int8"):
        dequantize_tables(tables, s)
    with pytest.raises(ValueError, match="int8 tables need their scales"):
        dequantize_tables(q, None)
    # the compiled entry points check the scales too (a direct call: RuntimeError)
    m = _ext.build()
    with pytest.raises(RuntimeError, match="int8 tables need their scales"):
        m.lookup_forward(z, q, True)
    with pytest.raises(RuntimeError, match="scales must be a contiguous CPU float32 tensor"):
        m.lookup_forward(z, q, True, s[:, :8].contiguous())
    with pytest.raises(RuntimeError, match="scales are only for int8 tables"):
        m.lookup_forward(z, tables, True, s)


def test_zero_tables_is_an_error_not_a_crash() -> None:
    lines = _isolated_errors("""
        import torch
        from kernels.lookup import gather_fused, lookup_forward_fused
        for z, t in [(torch.zeros(3, 0), torch.zeros(0, 2, 4)), (torch.zeros(0, 0), torch.zeros(0, 2, 4)),
                     (torch.zeros(3, 2), torch.zeros(2, 2, 0))]:
            try:
                lookup_forward_fused(z, t)
                print("no error")
            except ValueError as exc:
                print("ValueError", exc)
        try:
            gather_fused(torch.zeros(3, 0, dtype=torch.int64), torch.zeros(3, 0), torch.zeros(0, 2, 4))
        except ValueError as exc:
            print("ValueError", exc)
    """)
    assert len(lines) == 4 and all(line.startswith("ValueError tables must") for line in lines), lines
    assert "h >= 1" in lines[0]


def _needs_cpp_errors() -> None:
    """Skip where a C++ error cannot reach Python at all (a torch built by another C++
    toolchain; see kernels._ext.cpp_errors_propagate): there every failing TORCH_CHECK
    crashes, so the C++-side checks cannot be tested, only the Python-side ones."""
    if not _ext.cpp_errors_propagate():
        pytest.skip("C++ errors crash this interpreter (torch and g++ do not share a C++ runtime)")


def test_compiled_entry_points_check_their_arguments() -> None:
    """A direct call of the compiled module with bad arguments raises, it does not crash."""
    _needs_cpp_errors()
    lines = _isolated_errors("""
        import torch
        from kernels._ext import build
        m = build()
        f32 = torch.float32
        cases = [
            lambda: m.lookup_forward(torch.zeros(3, 0), torch.zeros(0, 2, 4), True),
            lambda: m.lookup_forward(torch.zeros(3, 4), torch.zeros(2, 3, 4), True),
            lambda: m.lookup_forward(torch.zeros(3, 5), torch.zeros(2, 4, 4), True),
            lambda: m.lookup_forward(torch.zeros(3, 4, dtype=torch.float64), torch.zeros(2, 4, 4), True),
            lambda: m.lookup_forward(torch.zeros(4, 3).T, torch.zeros(2, 4, 4), True),
            lambda: m.lookup_bh_forward(torch.randn(5, 32), torch.randn(4, 1, 1, 16, 16), torch.randn(4, 16, 8), 4, True),
            lambda: m.lookup_bh_forward(torch.randn(5, 16), torch.randn(4, 1, 1, 16, 16), torch.randn(8, 16, 8), 4, True),
            lambda: m.lookup_bh_forward(torch.randn(5, 8), torch.randn(4, 1, 1, 8, 8), torch.randn(2, 16, 8), 4, True),
            lambda: m.bh_project(torch.randn(5, 32), torch.randn(4, 1, 1, 16, 16), 16),
            lambda: m.bh_project(torch.randn(5, 16), torch.randn(4, 1, 1, 16, 16), 40),
            lambda: m.fwht(torch.randn(3, 6), True),
            lambda: m.fwht(torch.randn(3, 4, 4), True),
            lambda: m.gather(torch.zeros(3, 2, dtype=torch.int64), torch.zeros(3, 3), torch.zeros(2, 4, 4), torch.zeros(3, 4)),
            lambda: m.gather(torch.zeros(3, 2, dtype=torch.int64), torch.zeros(3, 2), torch.zeros(2, 4, 4), torch.zeros(2, 4)),
            lambda: m.lookup_forward(torch.zeros(3, 4, dtype=torch.float64), torch.zeros(2, 4, 4, dtype=torch.float16), True),
            lambda: m.lookup_forward(torch.zeros(3, 4), torch.zeros(2, 4, 4, dtype=torch.int32), True),
            lambda: m.lookup_forward(torch.zeros(3, 4), torch.zeros(2, 3, 4, dtype=torch.bfloat16), True),
            lambda: m.lookup_forward(torch.zeros(3, 4), torch.zeros(2, 8, 4, dtype=torch.float16)[:, ::2], True),
            lambda: m.lookup_bh_forward(torch.randn(5, 16, dtype=torch.float64), torch.randn(4, 1, 1, 16, 16, dtype=torch.float64), torch.randn(4, 16, 8).half(), 4, True),
            lambda: m.gather(torch.zeros(3, 2, dtype=torch.int64), torch.zeros(3, 2), torch.zeros(2, 4, 4).half(), torch.zeros(3, 4, dtype=torch.float64)),
        ]
        for call in cases:
            try:
                call()
                print("no error")
            except RuntimeError as exc:
                print("RuntimeError", str(exc).splitlines()[0])
    """)
    assert len(lines) == 20, lines
    assert all(line.startswith("RuntimeError nnk_lookup_cpu: ") for line in lines), lines


@pytest.mark.slow
def test_debug_build_compiles_and_checks_indices(tmp_path) -> None:
    """NN_KERNELS_EXT_DEBUG=1 builds a separate module with the NNK_ASSERT index checks on."""
    _needs_cpp_errors()
    from isolated import describe, run_isolated

    proc = run_isolated("""
        import torch
        from kernels import _ext
        from kernels.hadamard import bh_project_fused
        from kernels.lookup import LookupFFN, lookup_forward_fused, lookup_gather
        m = _ext.build()
        assert m.__name__.endswith("_debug") and m.debug_checks(), m.__name__
        z, t = torch.randn(50, 12, dtype=torch.float64), torch.randn(3, 16, 5, dtype=torch.float64)
        torch.testing.assert_close(lookup_forward_fused(z, t), lookup_gather(z, t))
        layer = LookupFFN(40, 3, 4, block=16, dtype=torch.float64)
        x = torch.randn(19, 40, dtype=torch.float64)
        with torch.no_grad():
            torch.testing.assert_close(layer(x, backend="fused"), layer(x, backend="torch"))
            torch.testing.assert_close(bh_project_fused(x, layer.projection), layer.projection(x))
        # int8 tables: every row index recovered from an offset is checked against the scales
        layer8 = LookupFFN(40, 5, 4, block=16, d_out=300, table_dtype=torch.int8)
        x8 = torch.randn(530, 40)
        with torch.no_grad():
            torch.testing.assert_close(layer8(x8, backend="fused"), layer8(x8, backend="torch"), rtol=2e-4, atol=2e-4)
        try:
            m.gather(torch.full((2, 3), 16), torch.ones(2, 3, dtype=torch.float64), t, torch.empty(2, 5, dtype=torch.float64))
            print("no error")
        except RuntimeError as exc:
            print("RuntimeError", str(exc).splitlines()[0])
    """, timeout=900, env={"NN_KERNELS_EXT_DIR": str(tmp_path), "NN_KERNELS_EXT_DEBUG": "1"})
    assert proc.returncode == 0, describe(proc)
    assert "codes must lie in [0, 16)" in proc.stdout, proc.stdout
    assert not _ext.build().debug_checks()  # the everyday build runs without them


# The compiled codes and weights (token_codes_weights): the soft codes transposed to run over
# tables in vector lanes -- with AVX-512 and tau = 8 by register permutes, 16 tables at a
# time, the rest one by one -- and 1 + exp(-2|z|) by an inline AVX-512 exponential. Against
# the literal formula in float64 for every tau from 1 to 13, table counts around the vector
# width (1, 15, 16, 17, 37), token counts off the tiles (1, 47, 49, 481), d_out not a multiple
# of 16, and features that are exactly zero or negative zero (sign bit 0, weight factor 1/2).
@pytest.mark.parametrize("scaled", [True, False])
@pytest.mark.parametrize(
    "n,h,tau,d_out",
    [(1, 16, 8, 5), (47, 37, 8, 17), (49, 17, 8, 33), (481, 15, 8, 3), (5, 1, 8, 16)]
    + [(13, h, tau, 7) for tau in range(1, 14) for h in (1, 16, 17)],
)
def test_vectorised_codes_and_weights_match_literal_formula(scaled, n, h, tau, d_out) -> None:
    gen = torch.Generator().manual_seed(1000 * tau + h + n)
    z = 1.5 * torch.randn(n, h * tau, generator=gen)
    flat = z.view(-1)
    pick = torch.randperm(flat.numel(), generator=gen)
    flat[pick[: flat.numel() // 10]] = 0.0
    flat[pick[flat.numel() // 10 : flat.numel() // 5]] = -0.0
    z[0, :tau] = -0.0  # one table whose features are all negative zero: code 0
    tables = torch.randn(h, 2**tau, d_out, generator=gen) / (h * tau) ** 0.5
    want = lookup_gather_naive(z.double(), tables.double(), scaled)
    for low in (None, torch.float16):
        t = tables if low is None else tables.to(low)
        ref = want if low is None else lookup_gather_naive(z.double(), t.double(), scaled)
        torch.testing.assert_close(lookup_forward_fused(z, t, scaled).double(), ref, rtol=1e-4, atol=1e-5)
    # the same codes and weights through the gather of given codes (tables one-hot per row:
    # each output column picks one table's weight at one code)
    codes = hash_codes(z, tau)
    weights = lookup_weights(z.double(), tau, scaled)
    assert torch.equal(codes, hash_codes(z.double(), tau))
    if h * 2**tau <= 4096:
        eye = torch.eye(h * 2**tau).reshape(h, 2**tau, h * 2**tau)
        got = lookup_forward_fused(z, eye, scaled).double().reshape(n, h, 2**tau)
        picked = got.gather(-1, codes.unsqueeze(-1)).squeeze(-1)
        torch.testing.assert_close(picked, weights, rtol=2e-6, atol=1e-7)
        # and nothing anywhere else: the code is exactly the literal sign pattern
        assert torch.count_nonzero(got).item() == torch.count_nonzero(picked).item()


_FALLBACK_CHECK = """
    import torch
    from kernels import _ext
    from kernels.hadamard import fwht, fwht_torch
    from kernels.lookup import (LookupFFN, gather_fused, hash_codes, lookup_bh_forward_fused,
                                lookup_forward_fused, lookup_gather_naive, lookup_weights,
                                quantize_tables)
    m = _ext.build()
    print("isa", m.isa(), m.__name__)
    gen = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.float64):
        for rows, d in [(3, 1), (5, 8), (7, 64), (2, 512), (3, 8192), (1, 1 << 15)]:
            x = torch.randn(rows, d, generator=gen, dtype=dtype)
            tol = 1e-5 * d**0.5 if dtype == torch.float32 else 1e-12 * d**0.5
            torch.testing.assert_close(fwht(x), fwht_torch(x), rtol=tol, atol=tol)
    for n, h, tau, d_out in [(47, 37, 8, 17), (49, 17, 3, 130), (1, 16, 8, 16), (13, 5, 13, 5)]:
        z = torch.randn(n, h * tau, generator=gen)
        z.view(-1)[::7] = 0.0
        tables = torch.randn(h, 2**tau, d_out, generator=gen) / (h * tau) ** 0.5
        for low in (None, torch.float16, torch.bfloat16, torch.int8, torch.float64):
            s = None
            if low is torch.int8:
                t, s = quantize_tables(tables)
                wide = t.double() * s.double()[..., None]
            else:
                t = tables if low is None else tables.to(low)
                wide = t.double()
            zz = z.double() if low is torch.float64 else z
            want = lookup_gather_naive(z.double(), wide, True)
            tol = 1e-10 if low is torch.float64 else 1e-4
            torch.testing.assert_close(lookup_forward_fused(zz, t, True, scales=s).double(), want, rtol=tol, atol=tol)
            codes = hash_codes(zz, tau).contiguous()
            weights = lookup_weights(zz, tau, True).contiguous()
            torch.testing.assert_close(gather_fused(codes, weights, t, scales=s).double(), want, rtol=tol, atol=tol)
    for d_model, h, tau, block, d_out, n in [(64, 24, 8, 64, 17, 50), (128, 40, 8, 32, 130, 97),
                                              (40, 20, 9, 16, 33, 13), (100, 30, 7, 32, 5, 49)]:
        for dtype in (torch.float32, torch.float64):
            layer = LookupFFN(d_model, h, tau, block=block, d_out=d_out, dtype=dtype,
                              generator=torch.Generator().manual_seed(n))
            x = torch.randn(n, d_model, dtype=dtype, generator=gen)
            with torch.no_grad():
                want = lookup_gather_naive(layer.projection(x).double(), layer.tables.double(), True)
                got = lookup_bh_forward_fused(x, layer.projection, layer.tables.detach().contiguous(), True)
            tol = 1e-10 if dtype == torch.float64 else 2e-4
            torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol)
    print("ok")
"""


# The fused kernels' AVX2 (+F16C, FMA) and portable paths are chosen at build time (#if on the
# target flags), so on an AVX-512 machine the normal build never compiles them. Each is built
# here a second time in its own folder (-mno-avx512f: the AVX2 path; -mno-avx: no AVX at all,
# 16-byte vectors for the FWHT, the portable loops elsewhere) and checked against the torch
# paths. A build takes 20-25 s on the reference machine (the pair ~50 s, so not marked slow).
@pytest.mark.parametrize("flags,isa", [("-mno-avx512f", "avx2"), ("-mno-avx", "portable")])
def test_fallback_paths_build_and_match_torch(tmp_path, flags, isa) -> None:
    from isolated import describe, run_isolated

    with open("/proc/cpuinfo") as f:
        cpu_flags = f.read()
    if isa == "avx2" and not all(f in cpu_flags for f in (" avx2", " f16c", " fma")):
        pytest.skip("the AVX2 path needs a CPU with AVX2, F16C and FMA")
    proc = run_isolated(_FALLBACK_CHECK, timeout=900,
                        env={"NN_KERNELS_EXT_DIR": str(tmp_path), _ext.EXTRA_CFLAGS_ENV_VAR: flags})
    assert proc.returncode == 0, describe(proc)
    assert f"isa {isa} " in proc.stdout and proc.stdout.strip().endswith("ok"), proc.stdout
