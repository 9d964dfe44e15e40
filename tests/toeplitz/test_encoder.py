"""Tests of :mod:`kernels.toeplitz.encoder` (GTU, GLU, the TNN block and encoder).

Independent references: explicit double loops for Toeplitz products and interpolation
weights, ``scipy.linalg.toeplitz`` / ``scipy.linalg.matmul_toeplitz``,
``scipy.signal.hilbert``, ``numpy.interp`` for the piecewise-linear RPE,
``torch.autograd.gradcheck`` (float64) for gradients, and causality checks that
perturb future tokens."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from kernels.toeplitz import FDTNO, GLU, GTU, SKITNO, TNNBlock, TNNEncoder, TNO, make_tno

from toeplitz_helpers import F64, gen, randn


SMALL = {"tno": {"rpe_width": 8, "rpe_depth": 2}, "ski": {"rank": 4, "filter_size": 3},
         "fd": {"rpe_width": 8, "rpe_depth": 2}}


@pytest.mark.parametrize(
    "kind,causal", [("tno", False), ("tno", True), ("ski", False), ("fd", False), ("fd", True)]
)
def test_tnn_encoder_shapes_causality_and_training_step(kind, causal):
    enc = TNNEncoder(
        11, 8, 2, tno=kind, causal=causal, n_out=5, tno_options=SMALL[kind], generator=gen(0)
    )
    tokens = torch.randint(0, 11, (3, 16), generator=gen(1))
    out = enc(tokens)
    assert out.shape == (3, 16, 5)
    changed = tokens.clone()
    changed[:, 9:] = (changed[:, 9:] + 1) % 11
    diff = (enc(changed) - out).abs()
    if causal:
        assert diff[:, :9].max() < 1e-5
    else:
        assert diff[:, :9].max() > 1e-4  # bidirectional: the past sees the future
    assert diff[:, 9:].max() > 1e-4
    loss = nn.functional.cross_entropy(out.reshape(-1, 5), torch.zeros(48, dtype=torch.long))
    loss.backward()
    for name, p in enc.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name


def test_tnn_block_structure_and_determinism():
    state = torch.get_rng_state()
    kwargs = dict(tno="fd", causal=True, gtu_expand=2, glu_expand=3, tno_options=SMALL["fd"])
    a = TNNBlock(6, generator=gen(4), **kwargs)
    b = TNNBlock(6, generator=gen(4), **kwargs)
    assert torch.equal(torch.get_rng_state(), state)
    assert isinstance(a.gtu, GTU) and isinstance(a.glu, GLU) and isinstance(a.gtu.mixer, FDTNO)
    assert a.gtu.mixer.channels == 12 and a.glu.gate_proj.out_features == 18
    x = randn(2, 9, 6, seed=0, dtype=torch.float32)
    torch.testing.assert_close(a(x), b(x))
    for kind, cls in (("tno", TNO), ("ski", SKITNO), ("fd", FDTNO)):
        assert isinstance(make_tno(kind, 4, **SMALL[kind]), cls)


@pytest.mark.parametrize("n", [1, 2, 3])
def test_all_mixers_work_at_tiny_lengths(n):
    x = randn(2, n, 4, seed=n)
    mixers = [
        TNO(4, dtype=F64), TNO(4, causal=True, dtype=F64), FDTNO(4, dtype=F64),
        FDTNO(4, causal=True, dtype=F64), SKITNO(4, rank=n, filter_size=n, dtype=F64),
        SKITNO(4, rank=1, filter_size=1, low_rank="dense", dtype=F64),
    ]
    for mixer in mixers:
        y = mixer(x)
        assert y.shape == x.shape and torch.isfinite(y).all()
        torch.testing.assert_close(
            y, torch.einsum("cij,bjc->bic", mixer.dense_matrix(n), x), rtol=1e-10, atol=1e-12
        )
