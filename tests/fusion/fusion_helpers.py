"""Shared helpers of the tests of :mod:`kernels.fusion` (imported by its test modules)."""

from __future__ import annotations

import pytest
import torch
from torch import nn



F64 = torch.float64


def make_mlp(p=6, p_inner=24, seed=0, act=None) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(p, p_inner), act or nn.GELU(), nn.Linear(p_inner, p)).to(F64)


def inputs(n=7, p=6, seed=1) -> torch.Tensor:
    return torch.randn(n, p, dtype=F64, generator=torch.Generator().manual_seed(seed))


def tiny_bert(seed=0):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(seed)
    cfg = transformers.BertConfig(
        vocab_size=40, hidden_size=8, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=16, max_position_embeddings=16, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    model = transformers.BertModel(cfg).eval()
    return model


def gen(seed):
    return torch.Generator().manual_seed(seed)
