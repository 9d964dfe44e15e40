"""kernels.hadamard: FWHT (compiled and torch) against the dense Hadamard matrix, and the
structured projections of Fig. 4 against their dense matrices (chapter 5)."""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
import scipy.fft
import scipy.linalg
import torch

from kernels import _ext
from kernels.hadamard import (
    ACDCProjection,
    BH4,
    BHProjection,
    DenseProjection,
    bh_project_fused,
    dct_matrix,
    fwht,
    fwht_backend,
    fwht_torch,
    hadamard_matrix,
    next_power_of_two,
    projection_flops,
    projection_params,
)

F64 = torch.float64


def test_extension_builds() -> None:
    # g++ and ninja are part of the platform: the compiled path must build, not skip.
    module = _ext.build()
    assert hasattr(module, "fwht") and hasattr(module, "lookup_bh_forward")
    assert fwht_backend(torch.zeros(2, 4)) == "compiled"
    assert _ext.build_directory().exists()


def test_hadamard_matrix_matches_scipy() -> None:
    for d in (1, 2, 8, 64):
        want = scipy.linalg.hadamard(d).astype(float)
        np.testing.assert_array_equal(hadamard_matrix(d, normalized=False).numpy(), want)
        h = hadamard_matrix(d)
        torch.testing.assert_close(h @ h, torch.eye(d, dtype=F64))


@pytest.mark.parametrize("backend", ["compiled", "torch"])
@pytest.mark.parametrize("normalized", [True, False])
def test_fwht_matches_dense(backend: str, normalized: bool) -> None:
    gen = torch.Generator().manual_seed(0)
    for d in (1, 2, 4, 8, 16, 32, 64, 128, 1024, 4096, 8192):
        x = torch.randn(3, 2, d, generator=gen, dtype=F64)
        want = x @ hadamard_matrix(d, normalized)
        got = fwht(x, normalized, backend=backend)
        assert got.shape == x.shape and got.dtype == F64
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-10 * math.sqrt(d))


def test_fwht_float32_and_large_lengths() -> None:
    gen = torch.Generator().manual_seed(1)
    # 2**16 float64 and 2**15 float32 exceed the 16 KiB L1 block: the streaming stages run
    for d, dtype in ((1 << 16, F64), (1 << 15, torch.float32), (4096, torch.float32)):
        x = torch.randn(5, d, generator=gen, dtype=dtype)
        got = fwht(x, backend="compiled")
        want = fwht_torch(x.double()).to(dtype)
        tol = 1e-12 if dtype == F64 else 1e-5
        torch.testing.assert_close(got, want, rtol=tol, atol=tol)


def test_fwht_is_involution_and_orthogonal() -> None:
    x = torch.randn(7, 256, dtype=F64, generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(fwht(fwht(x)), x)
    torch.testing.assert_close(fwht(fwht(x, False), False), 256 * x)
    torch.testing.assert_close(fwht(x).norm(dim=-1), x.norm(dim=-1))


def test_fwht_non_contiguous_and_empty() -> None:
    x = torch.randn(16, 6, dtype=F64, generator=torch.Generator().manual_seed(3)).T  # (6, 16)
    assert not x.is_contiguous()
    torch.testing.assert_close(fwht(x), x @ hadamard_matrix(16))
    empty = torch.zeros(0, 8)
    assert fwht(empty).shape == (0, 8)


@pytest.mark.parametrize("normalized", [True, False])
def test_fwht_gradcheck(normalized: bool) -> None:
    x = torch.randn(3, 16, dtype=F64, generator=torch.Generator().manual_seed(4), requires_grad=True)
    assert torch.autograd.gradcheck(lambda v: fwht(v, normalized, backend="compiled"), (x,))
    assert torch.autograd.gradgradcheck(lambda v: fwht(v, normalized, backend="compiled"), (x,))


# ---------------------------------------------------------------- the compiled kernel
# Reference: scipy.linalg.hadamard, dense up to 2048; beyond, through the Sylvester
# (Kronecker) structure H_{a n} = H_a (x) H_n, so that row x reshaped to (a, n) maps to
# H_a X H_n -- both factors from scipy, never from kernels.hadamard.
SCIPY_DENSE_MAX = 2048


def _reference_fwht(x: np.ndarray) -> np.ndarray:
    """x @ H_d in float64 for x of shape (rows, d), from scipy's dense Hadamard matrices."""
    rows, d = x.shape
    n = min(d, SCIPY_DENSE_MAX)
    blocks = x.astype(np.float64).reshape(rows, d // n, n)
    return (_scipy_hadamard(d // n) @ blocks @ _scipy_hadamard(n)).reshape(rows, d)


@functools.lru_cache(maxsize=None)
def _scipy_hadamard(n: int) -> np.ndarray:
    return scipy.linalg.hadamard(n).astype(np.float64)


@pytest.fixture(params=[1, 2], ids=["1thread", "2threads"])
def threads(request):
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


@pytest.mark.parametrize("dtype", [torch.float32, F64], ids=["f32", "f64"])
def test_fwht_compiled_exact_against_scipy(dtype, threads) -> None:
    # Small integers: every partial sum is an exact float (|y| <= 4 d <= 2^16 < 2^24), so
    # the unnormalised transform must equal scipy's bit for bit, whatever the stage order.
    gen = torch.Generator().manual_seed(20)
    for log_d in range(15):
        d = 1 << log_d
        for batch in (1, 3, 37) if d <= 4096 else (1, 3):
            x = torch.randint(-4, 5, (batch, d), generator=gen).to(dtype)
            want = torch.from_numpy(_reference_fwht(x.numpy())).to(dtype)
            got = fwht(x, normalized=False, backend="compiled")
            assert got.dtype == dtype and got.shape == x.shape
            assert torch.equal(got, want), (d, batch, float((got - want).abs().max()))
            # normalised: the same up to the one rounding of the scale
            got_n = fwht(x, normalized=True, backend="compiled")
            tol = 1e-6 if dtype == torch.float32 else 1e-14
            torch.testing.assert_close(got_n, want / math.sqrt(d), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, F64], ids=["f32", "f64"])
@pytest.mark.parametrize("normalized", [True, False])
def test_fwht_compiled_random_rows_many_threads(dtype, normalized, threads) -> None:
    # Enough rows (> 2^17 elements) that two threads split them; an odd row count.
    gen = torch.Generator().manual_seed(21)
    for d, batch in ((16, 9001), (1024, 301), (8192, 19), (16384, 9)):
        x = torch.randn(batch, d, generator=gen, dtype=dtype)
        want = _reference_fwht(x.numpy()) / (math.sqrt(d) if normalized else 1.0)
        got = fwht(x, normalized, backend="compiled").double().numpy()
        scale = math.sqrt(d) if not normalized else 1.0
        tol = 2e-6 * scale * math.log2(d) if dtype == torch.float32 else 1e-13 * scale * math.log2(d)
        np.testing.assert_allclose(got, want, rtol=0, atol=max(tol, 1e-13))


def test_fwht_compiled_layouts_and_misaligned_rows() -> None:
    gen = torch.Generator().manual_seed(22)
    base = torch.randn(4 * 1024 + 3, generator=gen)
    cases = {
        "offset by one element (unaligned rows)": base[1 : 1 + 4 * 1024].view(4, 1024),
        "transposed": torch.randn(64, 6, generator=gen).T,
        "strided rows": torch.randn(10, 256, generator=gen)[::3],
        "strided columns": torch.randn(5, 512, generator=gen)[:, ::2],
        "3-D with a batch stride": torch.randn(3, 4, 32, generator=gen).transpose(0, 1),
        "expanded": torch.randn(1, 128, generator=gen).expand(7, 128),
        "nn.Parameter": torch.nn.Parameter(torch.randn(3, 64, generator=gen), requires_grad=False),
    }
    for name, x in cases.items():
        want = _reference_fwht(x.detach().reshape(-1, x.shape[-1]).numpy()).reshape(x.shape)
        got = fwht(x, normalized=False, backend="compiled")
        np.testing.assert_allclose(got.detach().numpy(), want, rtol=1e-5, atol=1e-4, err_msg=name)
        auto = fwht(x, normalized=False)  # the fast entry and the general path agree
        torch.testing.assert_close(auto, got, rtol=0, atol=0, msg=name)


def test_fwht_large_output_is_an_ordinary_tensor() -> None:
    # Outputs from 32 MiB come from the huge-page allocator: resizable and freed like any.
    x = torch.randint(-2, 3, (4096, 2048)).float()  # 32 MiB
    y = fwht(x, normalized=False)
    assert torch.equal(y[-2:], torch.from_numpy(_reference_fwht(x[-2:].numpy())).float())
    y.add_(1.0)
    y.resize_(6144, 2048)  # grows through the same allocator
    y[4096:] = 0.0
    assert y.shape == (6144, 2048) and y.is_contiguous() and float(y[5000].abs().sum()) == 0.0
    del y


@pytest.mark.parametrize("normalized", [True, False])
def test_fwht_gradcheck_sizes_and_forward_mode(normalized: bool) -> None:
    gen = torch.Generator().manual_seed(23)
    for d in (1, 2, 16, 128):
        x = torch.randn(3, d, dtype=F64, generator=gen, requires_grad=True)
        fn = lambda v: fwht(v, normalized, backend="compiled")  # noqa: E731
        assert torch.autograd.gradcheck(fn, (x,), check_forward_ad=True)
    with torch.autograd.forward_ad.dual_level():
        x = torch.randn(2, 32, dtype=F64, generator=gen)
        t = torch.randn(2, 32, dtype=F64, generator=gen)
        y = fwht(torch.autograd.forward_ad.make_dual(x, t), normalized)
        tangent = torch.autograd.forward_ad.unpack_dual(y).tangent
    scale = math.sqrt(32) if normalized else 1.0
    np.testing.assert_allclose(tangent.numpy(), _reference_fwht(t.numpy()) / scale, atol=1e-12)


def test_fwht_under_torch_func() -> None:
    # torch.func transforms see the autograd.Function, not the direct kernel entry.
    x = torch.randn(2, 16, dtype=F64, generator=torch.Generator().manual_seed(24))
    jac = torch.func.jacrev(lambda v: fwht(v, False, backend="compiled"))(x[0])
    np.testing.assert_array_equal(jac.numpy(), scipy.linalg.hadamard(16).astype(float))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine")
def test_fwht_cuda_matches_cpu() -> None:
    x = torch.randn(4, 1024, dtype=F64)
    torch.testing.assert_close(fwht(x.cuda()).cpu(), fwht(x))


def test_fwht_bad_input() -> None:
    with pytest.raises(ValueError, match="power-of-two"):
        fwht(torch.zeros(2, 12))
    with pytest.raises(TypeError, match="floating-point"):
        fwht(torch.zeros(2, 8, dtype=torch.int64))
    with pytest.raises(TypeError, match="torch.Tensor"):
        fwht([1.0, 2.0])
    with pytest.raises(ValueError, match="scalar"):
        fwht(torch.tensor(1.0))
    with pytest.raises(ValueError, match="backend"):
        fwht(torch.zeros(2, 8), backend="gpu")
    with pytest.raises(TypeError, match="normalized"):
        fwht(torch.zeros(2, 8), normalized=1)
    with pytest.raises(ValueError, match="float32 or float64 CPU"):
        fwht(torch.zeros(2, 8, dtype=torch.float16), backend="compiled")


def test_dct_matrix_matches_scipy() -> None:
    x = np.random.default_rng(0).standard_normal((3, 32))
    got = (torch.from_numpy(x) @ dct_matrix(32)).numpy()
    np.testing.assert_allclose(got, scipy.fft.dct(x, norm="ortho", axis=-1), atol=1e-12)


def _dense_of(module: torch.nn.Module, d_in: int) -> torch.Tensor:
    with torch.no_grad():
        return module(torch.eye(d_in, dtype=F64))


def _block_diag(blocks: torch.Tensor) -> torch.Tensor:
    return torch.block_diag(*blocks)


@pytest.mark.parametrize("d_in,d_out,block,m", [(16, 16, 4, 4), (12, 40, 8, 2), (32, 8, 1, 1)])
def test_bh_projection_is_product_of_block_diagonals_and_hadamards(d_in, d_out, block, m) -> None:
    proj = BHProjection(d_in, d_out, block, m, generator=torch.Generator().manual_seed(5), dtype=F64)
    d_pad = next_power_of_two(d_in)
    h = hadamard_matrix(d_pad)
    columns = []
    for c in range(proj.copies):
        r = torch.eye(d_pad, dtype=F64)
        for i in range(m):
            r = r @ _block_diag(proj.blocks[i, c].detach()) @ h  # eq. 19: B_1 H B_2 H ...
        columns.append(r[:d_in])
    want = torch.cat(columns, dim=1)[:, :d_out]
    torch.testing.assert_close(_dense_of(proj, d_in), want)


@pytest.mark.parametrize("transform", ["hadamard", "dct"])
def test_acdc_projection_matches_eq18(transform: str) -> None:
    proj = ACDCProjection(16, 16, layers=3, transform=transform, init_noise=0.5,
                          generator=torch.Generator().manual_seed(6), dtype=F64)
    c = hadamard_matrix(16) if transform == "hadamard" else dct_matrix(16)
    r = torch.eye(16, dtype=F64)
    for i in range(3):
        a, d = torch.diag(proj.a[i, 0].detach()), torch.diag(proj.d[i, 0].detach())
        r = r @ a @ c @ d @ torch.linalg.inv(c)
    torch.testing.assert_close(_dense_of(proj, 16), r)


def test_projections_are_differentiable() -> None:
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(3, 16, dtype=F64, generator=gen, requires_grad=True)
    for proj in (BH4(16, 32, 4, generator=gen, dtype=F64), ACDCProjection(16, 16, 2, dtype=F64),
                 DenseProjection(16, 8, dtype=F64)):
        params = tuple(proj.parameters())
        assert torch.autograd.gradcheck(lambda v, *p: proj(v), (x,) + params)


@pytest.mark.parametrize("dtype", [F64, torch.float32])
@pytest.mark.parametrize("d_in,d_out,block", [(512, 256, 64), (100, 300, 32), (64, 64, 16), (48, 64, 16)])
def test_bh_project_fused_matches_torch(dtype, d_in, d_out, block) -> None:
    gen = torch.Generator().manual_seed(8)
    proj = BHProjection(d_in, d_out, block, 4, generator=gen, dtype=dtype)
    x = torch.randn(21, d_in, generator=gen, dtype=dtype)  # 21: not a multiple of the tile
    with torch.no_grad():
        want = proj(x)
    tol = 1e-12 if dtype == F64 else 1e-4
    torch.testing.assert_close(bh_project_fused(x, proj), want, rtol=tol, atol=tol)


def test_bh_project_fused_bad_input() -> None:
    proj = BHProjection(64, 64, 16, 4)
    with pytest.raises(ValueError, match="contiguous"):
        bh_project_fused(torch.zeros(64, 8).T, proj)
    with pytest.raises(TypeError, match="float32 or float64"):
        bh_project_fused(torch.zeros(8, 64, dtype=torch.float16), proj)
    with pytest.raises(TypeError, match="dtype"):
        bh_project_fused(torch.zeros(8, 64, dtype=F64), proj)
    with pytest.raises(ValueError, match=r"\(tokens, 64\)"):
        bh_project_fused(torch.zeros(8, 32), proj)
    with pytest.raises(ValueError, match="multiple of 16"):
        bh_project_fused(torch.zeros(8, 64), BHProjection(64, 64, 8, 4))


def test_projection_bad_input() -> None:
    with pytest.raises(ValueError, match="block must divide"):
        BHProjection(64, 64, 48)
    with pytest.raises(ValueError, match="in_features=16"):
        BH4(16, 16, 4)(torch.zeros(3, 8))
    with pytest.raises(ValueError, match="transform"):
        ACDCProjection(8, 8, transform="fft")
    with pytest.raises(ValueError, match="kind"):
        projection_flops("sparse", 8, 8)
    with pytest.raises(ValueError, match="positive"):
        BHProjection(0, 8)


def test_projection_flops_reproduce_table3() -> None:
    # Table 3 (top) of the paper: d = 512, h tau = 1024 (h = 128, tau = 8), hash MFLOP.
    mflop = {b: round(projection_flops("bh", 512, 1024, block=b) / 1e6, 2) for b in (64, 32, 16)}
    assert mflop == {64: 0.56, 32: 0.30, 16: 0.17}
    assert round(projection_flops("dense", 512, 1024) / 1e6, 2) == 1.05
    assert projection_params("bh", 512, 1024, block=64) == 2 * 4 * 512 * 64
    assert projection_params("dense", 512, 1024) == 512 * 1024
    assert projection_params("acdc", 512, 512, m=3) == 3 * 2 * 512
