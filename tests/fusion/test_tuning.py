"""Tests of :mod:`kernels.fusion.tuning` (layer-wise task-specific tuning, eq. 6).

References are independent: a loop over sub-MLPs, scikit-learn's KMeans, numpy's SVD,
per-sample autograd loops and :func:`kernels.ntk.empirical_ntk`."""

from __future__ import annotations

import pytest
import torch

from kernels.fusion import compress_model, layerwise_tuning

from fusion_helpers import tiny_bert


def test_layerwise_tuning_reduces_the_loss():
    teacher = tiny_bert()
    student = compress_model(teacher, 3, layers=[0, 1], method="sketch", generator=torch.Generator().manual_seed(0))
    ids = torch.randint(1, 40, (8, 6), generator=torch.Generator().manual_seed(0))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    before = {n: p.detach().clone() for n, p in student.named_parameters()}
    losses = layerwise_tuning(student, teacher, [batch] * 30, lr=1e-2)
    assert losses[-1] < 0.7 * losses[0]
    for n, p in student.named_parameters():
        changed = not torch.equal(before[n], p.detach())
        assert changed == (".intermediate.dense." in n or ".output.dense." in n and "attention" not in n), n
        assert p.requires_grad


def test_layerwise_tuning_at_lr_zero_measures_without_moving():
    """lr = 0 gives the eq. 6 losses of the untouched student (chapter 6 relies on it); lr < 0 is refused."""
    teacher = tiny_bert()
    student = compress_model(teacher, 3, layers=[0, 1], method="sketch", generator=torch.Generator().manual_seed(0))
    ids = torch.randint(1, 40, (8, 6), generator=torch.Generator().manual_seed(1))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    before = {n: p.detach().clone() for n, p in student.named_parameters()}
    losses = layerwise_tuning(student, teacher, [batch] * 3, lr=0.0)
    assert all(torch.equal(before[n], p.detach()) for n, p in student.named_parameters())
    assert len(losses) == 3 and losses[0] > 0
    torch.testing.assert_close(torch.tensor(losses), torch.full((3,), losses[0]), rtol=1e-12, atol=0)
    with pytest.raises(ValueError, match="lr"):
        layerwise_tuning(student, teacher, [batch], lr=-1e-3)
