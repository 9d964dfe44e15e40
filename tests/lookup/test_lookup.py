"""Tests of :mod:`kernels.lookup.lookup` (the package's public face: bad input across its modules)."""

from __future__ import annotations

import pytest
import torch

from kernels.hadamard import BHProjection, DenseProjection
from kernels.lookup import (
    LookupFFN,
    gather_fused,
    lookup_bh_forward_fused,
    lookup_forward_fused,
    lookup_gather,
    table_bytes,
)

from lookup_helpers import F64, _draw


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
