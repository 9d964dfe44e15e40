"""Tests of :mod:`kernels.lookup.layer` (the LookupFFN layer on every backend, and its FLOP)."""

from __future__ import annotations

import pytest
import torch

from kernels.hadamard import bh_project_fused
from kernels.lookup import (
    LookupFFN,
    block_diagonal_ffn_flops,
    lookup_bh_forward_fused,
    lookup_ffn_flops,
    lookup_gather_naive,
    moe_ffn_flops,
    vanilla_ffn_flops,
    quantize_tables,
)

from lookup_helpers import F64, HALF, _isolated_errors, _rounding_bound


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
