"""Tests of :mod:`kernels.lookup.baselines` (the FFNs LookupFFN is compared with)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernels.lookup import BlockDiagonalFFN, Top1MoEFFN, VanillaFFN

from lookup_helpers import F64


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
