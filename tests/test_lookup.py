"""kernels.lookup: the identities of eqs. 11-12, the custom backward (gradcheck), the
fused C++ kernels against the literal formula, Remark 3.1, the paper's FLOP columns and
bad input (chapter 5)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernels import _ext
from kernels.hadamard import BHProjection, DenseProjection, bh_project_fused
from kernels.lookup import (
    BlockDiagonalFFN,
    LookupFFN,
    Top1MoEFFN,
    VanillaFFN,
    block_diagonal_ffn_flops,
    gather_fused,
    hash_codes,
    lookup_bh_forward_fused,
    lookup_bh_hash_fused,
    lookup_ffn_flops,
    lookup_forward_fused,
    lookup_gather,
    lookup_gather_naive,
    lookup_softmax,
    lookup_weights,
    moe_ffn_flops,
    sign_matrix,
    table_bytes,
    vanilla_ffn_flops,
    dequantize_tables,
    quantize_tables,
    TABLE_DTYPES,
)

F64 = torch.float64
HALF = (torch.float16, torch.bfloat16)


def _draw(n: int, h: int, tau: int, d_out: int, seed: int = 0, dtype=F64, scale: float = 1.0):
    gen = torch.Generator().manual_seed(seed)
    z = scale * torch.randn(n, h * tau, generator=gen, dtype=dtype)
    tables = torch.randn(h, 2**tau, d_out, generator=gen, dtype=dtype)
    return z, tables


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


# The fused kernels' tiling (issue 15): hash tiles of 48 tokens, register blocks of 6 / 8 /
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


# Half-width tables (float16 / bfloat16, float32 accumulation). Two independent checks:
# (1) against the literal formula (lookup_gather_naive in float64) on the *rounded* tables:
#     only float32 arithmetic differs, so the float32 tolerance of the kernel tests applies;
# (2) against the float32 tables, with the closed-form bound of rounding each entry once:
#     |T - round(T)| <= u |T| + a, u = 2**-11 (float16; a = 2**-25 for entries below its
#     normal range 2**-14, where the spacing is 2**-24) or 2**-8 (bfloat16, a = 0 at these
#     magnitudes), so |y - y32| <= sum_k w_k (u |[T_k]_g| + a), plus float32 accumulation.
_UNIT = {torch.float16: (2.0**-11, 2.0**-25), torch.bfloat16: (2.0**-8, 0.0)}


def _rounding_bound(z: torch.Tensor, tables: torch.Tensor, dtype, scaled: bool) -> torch.Tensor:
    """Entrywise bound on |y(rounded tables) - y(tables)|, computed in float64 from the
    literal gather of |T| (lookup_gather_naive with |T| and unit weights' absolute values)."""
    u, a = _UNIT[dtype]
    z64, t64 = z.double(), tables.double()
    w_abs_rows = lookup_gather_naive(z64, t64.abs(), scaled).abs()  # sum_k w_k |[T_k]_g| (w_k >= 0)
    w_sum = lookup_gather_naive(z64, torch.ones_like(t64), scaled).abs()  # sum_k w_k
    return u * w_abs_rows + a * w_sum


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


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("d_model,h,tau,block", [(64, 16, 4, 16), (100, 40, 7, 32), (48, 30, 8, 16)])
def test_half_tables_layer_every_backend_agrees_and_training_stays_fp32(dtype, d_model, h, tau, block) -> None:
    layer = LookupFFN(d_model, h, tau, block=block, d_out=24, table_dtype=dtype,
                      generator=torch.Generator().manual_seed(19))
    x = torch.randn(3, 11, d_model, generator=torch.Generator().manual_seed(91))
    assert layer.inference_tables().dtype == dtype and layer.tables.dtype == torch.float32
    with torch.no_grad():
        fused, naive, torch_path = (layer(x, backend=b) for b in ("fused", "naive", "torch"))
        auto = layer(x)
        z = layer.projection(x).reshape(-1, h * tau)
        exact = lookup_gather_naive(z.double(), layer.tables.double())
        bound = _rounding_bound(z, layer.tables.detach(), dtype, True)
    for other in (naive, torch_path, auto):  # the rounded tables on every backend
        torch.testing.assert_close(fused, other, rtol=2e-4, atol=2e-4)
    err = (fused.reshape(-1, 24).double() - exact).abs()
    assert bool((err <= bound * 1.001 + 2e-4 * exact.abs().amax()).all())
    # with gradients the float32 master is used: the training forward equals the fp32 layer
    plain = LookupFFN(d_model, h, tau, block=block, d_out=24, generator=torch.Generator().manual_seed(19))
    torch.testing.assert_close(layer(x, backend="torch"), plain(x, backend="torch"), rtol=0, atol=0)
    layer(x).square().sum().backward()
    assert layer.tables.grad is not None and layer.tables.grad.dtype == torch.float32
    # the rounded copy follows the master when it changes (an optimiser step, in place)
    with torch.no_grad():
        layer.tables.add_(1.0)
        torch.testing.assert_close(layer.inference_tables(), layer.tables.detach().to(dtype), rtol=0, atol=0)
        layer.table_dtype = None
        assert layer(x).dtype == torch.float32
        torch.testing.assert_close(layer(x), layer(x, backend="naive"), rtol=2e-4, atol=2e-4)
        assert layer.inference_tables().dtype == torch.float32


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


@pytest.mark.parametrize("d_model,h,tau,block", [(64, 16, 4, 16), (100, 40, 7, 32), (48, 30, 8, 16)])
def test_int8_tables_layer_every_backend_agrees_and_cache_follows_master(d_model, h, tau, block) -> None:
    layer = LookupFFN(d_model, h, tau, block=block, d_out=24, table_dtype=torch.int8,
                      generator=torch.Generator().manual_seed(22))
    x = torch.randn(3, 11, d_model, generator=torch.Generator().manual_seed(92))
    q, s = layer.inference_tables(), layer.inference_scales()
    assert q.dtype == torch.int8 and s.shape == (h, 2**tau) and layer.tables.dtype == torch.float32
    with torch.no_grad():
        fused, naive, torch_path, auto = (layer(x, backend=b) for b in ("fused", "naive", "torch", "auto"))
    for other in (naive, torch_path, auto):
        torch.testing.assert_close(fused, other, rtol=2e-4, atol=2e-4)
    assert "table_dtype=torch.int8" in repr(layer)
    # training uses the float32 master; the int8 copy follows an in-place change of it
    plain = LookupFFN(d_model, h, tau, block=block, d_out=24, generator=torch.Generator().manual_seed(22))
    torch.testing.assert_close(layer(x, backend="torch"), plain(x, backend="torch"), rtol=0, atol=0)
    with torch.no_grad():
        layer.tables.mul_(3.0)
        q3, s3 = layer.inference_tables(), layer.inference_scales()
        assert torch.equal(q3, quantize_tables(layer.tables)[0]) and torch.equal(s3, quantize_tables(layer.tables)[1])
        layer.table_dtype = torch.float16
        assert layer.inference_scales() is None and layer.inference_tables().dtype == torch.float16


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


def test_lookup_ffn_trains_through_projection_and_tables() -> None:
    layer = LookupFFN(32, 8, 4, block=8, generator=torch.Generator().manual_seed(10), dtype=F64)
    x = torch.randn(20, 32, dtype=F64, generator=torch.Generator().manual_seed(11), requires_grad=True)
    layer(x).square().sum().backward()
    assert layer.tables.grad.abs().sum() > 0
    assert layer.projection.blocks.grad.abs().sum() > 0
    assert x.grad.abs().sum() > 0
    small = LookupFFN(8, 2, 2, projection="dense", generator=torch.Generator().manual_seed(12), dtype=F64)
    xs = torch.randn(4, 8, dtype=F64, generator=torch.Generator().manual_seed(13), requires_grad=True)
    params = (small.projection.weight, small.tables)
    assert torch.autograd.gradcheck(lambda a, *p: small(a, backend="torch"), (xs,) + params)


def test_dense_projection_layer_uses_fused_gather() -> None:
    layer = LookupFFN(20, 6, 5, projection="dense", generator=torch.Generator().manual_seed(14))
    x = torch.randn(9, 20, generator=torch.Generator().manual_seed(15))
    with torch.no_grad():
        torch.testing.assert_close(layer(x), layer(x, backend="torch"), rtol=1e-4, atol=1e-5)


def test_flops_reproduce_the_papers_tables() -> None:
    def mflop(*args, **kw) -> float:
        return round(lookup_ffn_flops(*args, **kw)["total"] / 1e6, 2)

    assert round(vanilla_ffn_flops(512, 2048) / 1e6, 2) == 4.19  # Table 1
    assert mflop(512, 256, 8) == 1.38 and mflop(512, 128, 8) == 0.69  # Table 1
    assert round(vanilla_ffn_flops(768, 3072) / 1e6, 2) == 9.44 and mflop(768, 170, 9) == 1.39  # Table 2
    assert [mflop(512, h, 8) for h in (32, 64, 128, 256)] == [0.31, 0.35, 0.69, 1.38]  # Table 3 mid
    parts = {(h, t): lookup_ffn_flops(512, h, t) for h, t in ((64, 4), (32, 8), (20, 13))}
    assert [round(p["hash"] / 1e6, 2) for p in parts.values()] == [0.28, 0.28, 0.28]  # Table 3 bottom
    assert [round(p["gather"] / 1e6, 2) for p in parts.values()] == [0.07, 0.03, 0.02]
    dense = lookup_ffn_flops(512, 128, 8, projection="dense")
    assert round(dense["hash"] / 1e6, 2) == 1.05 and round(dense["gather"] / 1e6, 2) == 0.13  # Table 3 top
    assert mflop(512, 256, 4) == 0.82  # Table 4
    assert round(block_diagonal_ffn_flops(512, 2048, 2) / 1e6, 2) == 2.10  # Table 1, channel shuffle
    assert moe_ffn_flops(512, 1024, 4) == 4 * 512 * 1024 + 2 * 512 * 4


def test_baselines_reduce_to_vanilla() -> None:
    gen = torch.Generator().manual_seed(16)
    x = torch.randn(10, 16, generator=gen, dtype=F64)
    block = BlockDiagonalFFN(16, 32, groups=1, generator=gen, dtype=F64)
    vanilla = VanillaFFN(16, 32, dtype=F64)
    with torch.no_grad():
        vanilla.w1.copy_(block.w1[0]); vanilla.w2.copy_(block.w2[0])
    torch.testing.assert_close(block(x), vanilla(x))
    moe = Top1MoEFFN(16, 32, experts=1, dtype=F64)
    with torch.no_grad():
        vanilla.w1.copy_(moe.w1[0]); vanilla.w2.copy_(moe.w2[0])
    torch.testing.assert_close(moe(x), vanilla(x))
    grouped = BlockDiagonalFFN(16, 32, groups=4, generator=gen, dtype=F64)
    assert grouped(x).shape == x.shape
    # the shuffle mixes groups: output group 0 depends on input group 1
    xp = x.clone(); xp[:, 4:8] += 1.0
    assert (grouped(xp) - grouped(x))[:, :4].abs().max() > 0


def test_bad_input() -> None:
    # tau too large for memory: the message says how much it would need
    with pytest.raises(ValueError, match=r"tau=16 is too large for memory.*8\.0 GiB"):
        LookupFFN(512, 64, 16)
    assert table_bytes(64, 16, 512) == 8 << 30
    with pytest.raises(ValueError, match="tau must be <= 40"):
        LookupFFN(8, 2, 41)
    # h * tau not matching the projection
    with pytest.raises(ValueError, match=r"h \* tau = 4 \* 8 = 32"):
        LookupFFN(16, 4, 8, projection=DenseProjection(16, 30))
    with pytest.raises(ValueError, match="projection"):
        LookupFFN(16, 4, 8, projection="fft")
    z, tables = _draw(5, 4, 3, 6, dtype=torch.float32)
    with pytest.raises(ValueError, match=r"h \* tau = 4 \* 3 = 12"):
        lookup_gather(z[:, :9], tables)
    with pytest.raises(ValueError, match=r"\(h, 2\*\*tau, d_out\)"):
        lookup_gather(z, tables[:, :6])
    with pytest.raises(TypeError, match="same dtype"):
        lookup_gather(z.double(), tables)
    # the fused kernel: non-contiguous, wrong dtype, wrong device layout
    zt = torch.randn(12, 5).T
    with pytest.raises(ValueError, match="contiguous z"):
        lookup_forward_fused(zt, tables)
    with pytest.raises(ValueError, match="contiguous tables"):
        lookup_forward_fused(z, tables.transpose(1, 2).contiguous().transpose(1, 2))
    with pytest.raises(TypeError, match="float32 or float64, got torch.float16"):
        lookup_forward_fused(z.half(), tables.half())
    with pytest.raises(TypeError, match="torch.int64"):
        lookup_forward_fused(z.long(), tables)
    with pytest.raises(ValueError, match=r"\(tokens, h \* tau\)"):
        lookup_forward_fused(z.reshape(5, 2, 6), tables)
    with pytest.raises(ValueError, match=r"codes must lie in \[0, 8\)"):
        gather_fused(torch.full((5, 4), 8), torch.ones(5, 4), tables)
    layer = LookupFFN(16, 4, 4, block=16)
    with pytest.raises(TypeError, match="share one dtype"):
        lookup_bh_forward_fused(torch.zeros(3, 16, dtype=F64), layer.projection, layer.tables.detach().double())
    with pytest.raises(ValueError, match="backend"):
        layer(torch.zeros(3, 16), backend="cuda")
    with pytest.raises(ValueError, match="out_features"):
        lookup_bh_forward_fused(torch.zeros(3, 16), BHProjection(16, 20, 16), layer.tables.detach())
    with pytest.raises(TypeError, match="scaled"):
        lookup_gather(z, tables, scaled=1)


# ------------------------------------------------------------ crashes of the compiled path
# Each case runs in a child process: before the checks in front of the C++ kernels, the
# first killed the interpreter with SIGFPE (a division by the number of tables) and the
# second read out of bounds (blocks no longer matching in_features).
def _isolated_errors(code: str) -> list[str]:
    from isolated import describe, run_isolated

    proc = run_isolated(code)
    assert proc.returncode == 0, describe(proc)
    return [line for line in proc.stdout.splitlines() if line]


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


def test_edited_projection_blocks_are_an_error_on_every_path() -> None:
    lines = _isolated_errors("""
        import torch
        from kernels.hadamard import bh_project_fused
        from kernels.lookup import LookupFFN, lookup_bh_forward_fused
        layer = LookupFFN(64, 4, 4, block=16, generator=torch.Generator().manual_seed(0))
        layer.projection.blocks = torch.nn.Parameter(layer.projection.blocks[:, :, :1].clone())
        x = torch.randn(9, 64)
        calls = [lambda: layer(x, backend="torch"), lambda: layer(x, backend="naive")]
        with torch.no_grad():
            calls += [lambda: layer(x), lambda: layer(x, backend="fused"),
                      lambda: lookup_bh_forward_fused(x, layer.projection, layer.tables.detach()),
                      lambda: bh_project_fused(x, layer.projection)]
            for call in calls:
                try:
                    call()
                    print("no error")
                except ValueError as exc:
                    print("ValueError", exc)
    """)
    assert len(lines) == 6, lines
    for line in lines:
        assert line.startswith("ValueError blocks must have shape"), line
        assert "(4, 1, 4, 16, 16)" in line and "(4, 1, 1, 16, 16)" in line


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


def test_lookup_ffn_fused_path_checks_input_like_the_torch_path() -> None:
    layer = LookupFFN(32, 4, 4, block=16, generator=torch.Generator().manual_seed(0))
    bad = [
        ([[0.0] * 32], TypeError, "x must be a torch.Tensor"),
        (torch.zeros(3, 31), ValueError, r"x must have shape \(\.\.\., d_model\) with d_model=32"),
        (torch.zeros(3, 32, dtype=torch.float16), TypeError, "x must have the layer's dtype torch.float32"),
        (torch.zeros(3, 32, dtype=F64), TypeError, "x must have the layer's dtype"),
        (torch.zeros(3, 32, dtype=torch.int64), TypeError, "x must have a floating-point dtype"),
        (torch.tensor(1.0), ValueError, "x must have shape"),
    ]
    for backend in ("torch", "naive", "fused", "auto"):
        for x, error, message in bad:
            with pytest.raises(error, match=message):
                layer(x, backend=backend)
            with torch.no_grad(), pytest.raises(error, match=message):
                layer(x, backend=backend)
    layer.tables = torch.nn.Parameter(layer.tables.detach()[:, :, :5].clone())
    with torch.no_grad(), pytest.raises(ValueError, match="tables must have shape"):
        layer(torch.zeros(3, 32))


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


# --- LSH sparse FFN (SLIDE-style baseline of Table 1) against naive loops -----------------


def _naive_simhash(u, planes):
    # one row, one table, one bit at a time
    L, d, K = planes.shape
    out = torch.zeros(u.shape[0], L, dtype=torch.long)
    for n in range(u.shape[0]):
        for l in range(L):
            code = 0
            for j in range(K):
                if sum(float(u[n, i]) * float(planes[l, i, j]) for i in range(d)) > 0:
                    code += 1 << j
            out[n, l] = code
    return out


@pytest.mark.parametrize("n, d, tables, bits", [(5, 3, 1, 1), (7, 4, 3, 2), (6, 8, 2, 5), (4, 6, 5, 3)])
def test_simhash_and_active_mask_match_loops(n, d, tables, bits) -> None:
    from kernels.lookup import lsh_active_mask, simhash_codes

    gen = torch.Generator().manual_seed(n * 100 + d)
    x = torch.randn(n, d, generator=gen, dtype=F64)
    w = torch.randn(9, d, generator=gen, dtype=F64)
    planes = torch.randn(tables, d, bits, generator=gen, dtype=F64)
    assert torch.equal(simhash_codes(x, planes), _naive_simhash(x, planes))
    qc, wc = _naive_simhash(x, planes), _naive_simhash(w, planes)
    want = torch.tensor([[any(int(qc[a, l]) == int(wc[i, l]) for l in range(tables)) for i in range(9)]
                         for a in range(n)])
    assert torch.equal(lsh_active_mask(x, w, planes), want)


@pytest.mark.parametrize("d, hidden, tables, bits", [(4, 8, 1, 2), (6, 10, 3, 3), (8, 16, 2, 4)])
def test_lsh_sparse_ffn_matches_sum_over_active_neurons(d, hidden, tables, bits) -> None:
    from kernels.lookup import LSHSparseFFN

    gen = torch.Generator().manual_seed(d + hidden)
    ffn = LSHSparseFFN(d, hidden, tables, bits, generator=gen, dtype=F64)
    with torch.no_grad():
        ffn.b1.copy_(0.1 * torch.randn(hidden, generator=gen, dtype=F64))
        ffn.b2.copy_(0.1 * torch.randn(d, generator=gen, dtype=F64))
    x = torch.randn(2, 3, d, generator=gen, dtype=F64)
    y = ffn(x)
    codes_w = _naive_simhash(ffn.w1.detach(), ffn.planes)
    flat = x.reshape(-1, d)
    codes_x = _naive_simhash(flat, ffn.planes)
    for n in range(flat.shape[0]):
        want = ffn.b2.detach().clone()
        for i in range(hidden):
            if any(int(codes_x[n, l]) == int(codes_w[i, l]) for l in range(tables)):
                want += max(float(flat[n] @ ffn.w1[i] + ffn.b1[i]), 0.0) * ffn.w2[i].detach()
        assert torch.allclose(y.reshape(-1, d)[n], want, atol=1e-12)


def test_lsh_sparse_ffn_gradients_reach_only_active_neurons_and_pass_gradcheck() -> None:
    from kernels.lookup import LSHSparseFFN

    gen = torch.Generator().manual_seed(3)
    ffn = LSHSparseFFN(5, 12, 2, 3, generator=gen, dtype=F64)
    x = torch.randn(4, 5, generator=gen, dtype=F64, requires_grad=True)
    mask = ffn.active_mask(x)
    # the mask is piecewise constant in x: gradcheck of the masked ReLU FFN in x
    assert torch.autograd.gradcheck(lambda a: ffn(a), (x,), eps=1e-7)
    ffn(x).square().sum().backward()
    never = ~mask.any(0)
    assert ffn.w2.grad[never].abs().sum() == 0 and ffn.w1.grad[never].abs().sum() == 0
    # with one bit and many tables every neuron is active: the dense ReLU FFN
    dense = LSHSparseFFN(5, 12, 64, 1, generator=gen, dtype=F64)
    xs = torch.randn(6, 5, generator=gen, dtype=F64)
    if bool(dense.active_mask(xs).all()):
        want = F.relu(xs @ dense.w1.T + dense.b1) @ dense.w2 + dense.b2
        assert torch.allclose(dense(xs), want, atol=1e-12)


def test_lsh_ffn_flops_and_bad_input() -> None:
    from kernels.lookup import LSHSparseFFN, lsh_active_mask, lsh_ffn_flops, simhash_codes

    f = lsh_ffn_flops(64, 4, 3, 10.5)
    assert f == {"hash": 2.0 * 64 * 12, "ffn": 4.0 * 64 * 10.5, "total": 2.0 * 64 * 12 + 4.0 * 64 * 10.5}
    with pytest.raises(ValueError, match="active"):
        lsh_ffn_flops(64, 4, 3, -1.0)
    with pytest.raises(ValueError, match="tables"):
        LSHSparseFFN(8, 16, 0, 3)
    with pytest.raises(TypeError, match="bits"):
        LSHSparseFFN(8, 16, 2, 2.5)
    with pytest.raises(ValueError, match="bits"):
        LSHSparseFFN(8, 16, 2, 63)
    with pytest.raises(ValueError, match=r"x must have shape \(\.\.\., 8\)"):
        LSHSparseFFN(8, 16, 2, 3)(torch.randn(3, 7))
    with pytest.raises(ValueError, match="last dimension"):
        simhash_codes(torch.randn(3, 7), torch.randn(2, 8, 3))
    with pytest.raises(ValueError, match="feature dimension"):
        lsh_active_mask(torch.randn(3, 8), torch.randn(5, 7), torch.randn(2, 8, 3))
    with pytest.raises(TypeError, match="planes"):
        simhash_codes(torch.randn(3, 8), [[1.0]])


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


def test_vectorised_path_bh_layer_with_zero_inputs() -> None:
    # a zero token: every soft code is exactly 0 (code 0, weight 2^-tau scaled by 0)
    layer = LookupFFN(64, 24, 8, block=64, d_out=17, generator=torch.Generator().manual_seed(4))
    x = torch.randn(50, 64, generator=torch.Generator().manual_seed(5))
    x[3] = 0.0
    x[7] = -0.0
    with torch.no_grad():
        want = lookup_gather_naive(layer.projection(x).double(), layer.tables.double(), True)
        got = lookup_bh_forward_fused(x, layer.projection, layer.tables.detach().contiguous(), True)
    torch.testing.assert_close(got.double(), want, rtol=2e-4, atol=2e-4)
    assert torch.count_nonzero(got[3]) == 0 and torch.count_nonzero(got[7]) == 0


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


def test_fused_bh_forward_reads_the_same_rows_as_the_torch_path() -> None:
    # The compiled projection must equal BHProjection.forward bit for bit: a float32
    # rounding difference of ~1e-6 flips the sign bit of the projections that lie within
    # rounding of zero, and such a token then reads another table row (its output moves by
    # a whole row, percent of the output's scale). Over 8192 tokens x 512 features some
    # projections are that close to zero, so the two backends must agree everywhere.
    layer = LookupFFN(512, 64, 8, block=64, generator=torch.Generator().manual_seed(3))
    x = torch.randn(8192, 512, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        z = layer.projection(x)
        z_fused = bh_project_fused(x, layer.projection)
        got, want = layer(x, backend="fused"), layer(x, backend="torch")
    assert torch.equal(z_fused, z), float((z_fused - z).abs().max())
    assert float((got - want).abs().max() / want.abs().max()) < 1e-5
