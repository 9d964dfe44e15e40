"""Tests of :mod:`kernels.fusion.blocks` (compressing the FFN blocks of a model).

References are independent: a loop over sub-MLPs, scikit-learn's KMeans, numpy's SVD,
per-sample autograd loops and :func:`kernels.ntk.empirical_ntk`."""

from __future__ import annotations

import torch
from torch import nn

from kernels.fusion import CompressedLinear, compress_model, find_ffn_blocks, mlp_parameter_count

from fusion_helpers import tiny_bert


def test_compress_bert_layers():
    model = tiny_bert()
    blocks = find_ffn_blocks(model)
    assert len(blocks) == 2
    ids = torch.tensor([[2, 5, 7, 9, 3], [2, 4, 6, 0, 0]])
    mask = (ids != 0).long()
    ref = model(input_ids=ids, attention_mask=mask).last_hidden_state
    same = compress_model(model, 16, layers=[-1], method="fusion")
    torch.testing.assert_close(same(input_ids=ids, attention_mask=mask).last_hidden_state, ref, atol=1e-5, rtol=1e-5)
    comp = compress_model(model, 4, layers=[1], method="fusion")
    cb = find_ffn_blocks(comp)
    assert isinstance(cb[1].linear1, CompressedLinear) and cb[1].linear1.out_features == 4
    assert isinstance(cb[0].linear1, nn.Linear) and not isinstance(cb[0].linear1, CompressedLinear)
    assert isinstance(find_ffn_blocks(model)[1].linear1, nn.Linear)  # a copy by default
    assert mlp_parameter_count(comp, [1]) == 8 * 4 + 4 + 4 * 8 + 8
