"""Layer-wise task-specific tuning of a compressed model (eq. 6 of Wei et al., 2023).

Part of :mod:`kernels.fusion` (chapter 6): after compression, each compressed FFN block is
tuned so that its layer's output matches the uncompressed teacher's (:func:`layerwise_tuning`).
"""

from __future__ import annotations

from typing import Iterable, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from kernels._checks import check_module, check_nonnegative_float
from kernels.linear import CompressedLinear, LowRankLinear
from kernels.fusion.blocks import _check_layers, find_ffn_blocks

__all__ = [
    "layerwise_tuning",
]

def _hidden_states(name: str, model: nn.Module, batch: dict) -> tuple:
    """The layer outputs ``model(**batch, output_hidden_states=True).hidden_states[1:]``,
    or a ``ValueError`` naming ``name`` when the model cannot give them."""
    try:
        out = model(**batch, output_hidden_states=True)
    except torch.OutOfMemoryError:
        raise
    except (TypeError, ValueError, RuntimeError, IndexError) as exc:
        raise ValueError(f"{name}(**batch, output_hidden_states=True) failed ({type(exc).__name__}: {exc}); "
                         f"{name} must be a transformers-style model taking the batches' keys") from exc
    states = getattr(out, "hidden_states", None)
    if not isinstance(states, (tuple, list)) or not all(isinstance(h, Tensor) for h in states):
        raise ValueError(f"{name} must return an output with .hidden_states (a tuple of tensors) when called "
                         f"with output_hidden_states=True, got {type(out).__name__}")
    return tuple(states[1:])


def layerwise_tuning(
    student: nn.Module,
    teacher: nn.Module,
    batches: Iterable[dict[str, Tensor]],
    *,
    lr: float = 1e-4,
    layers: Optional[Sequence[int]] = None,
) -> list[float]:
    """Layer-wise task-specific tuning (Section 4.4, eq. 6): minimise
    :math:`\\sum_l \\mathrm{MSE}(H_t^l, H^l)` between the teacher's and the student's
    layer outputs on unlabelled task inputs, updating only the student's FFN blocks
    ``layers`` (``None``: all blocks that hold a :class:`CompressedLinear`).

    ``batches`` yields keyword arguments of a ``transformers`` model (``input_ids``,
    ``attention_mask``...); both models are called with ``output_hidden_states=True``.
    One AdamW step per batch (the paper: one epoch). Returns the loss of every step.
    ``lr = 0`` measures the losses without moving any weight (chapter 6 checks its cached
    eq. 6 loss against this function that way). Padding tokens are excluded from the MSE when ``attention_mask`` is given.
    """
    check_module("student", student)
    check_module("teacher", teacher)
    lr = check_nonnegative_float("lr", lr)
    if isinstance(batches, (str, bytes, Tensor, dict)) or not isinstance(batches, Iterable):
        raise TypeError(f"batches must be an iterable of dicts of model inputs, got {type(batches).__name__}")
    try:
        blocks = find_ffn_blocks(student)
    except ValueError as exc:
        raise ValueError(f"student: {exc}") from None
    if layers is None:
        chosen = [i for i, b in enumerate(blocks) if isinstance(b.linear1, (CompressedLinear, LowRankLinear))]
    else:
        chosen = _check_layers(layers, len(blocks))
    if not chosen:
        raise ValueError("student has no compressed FFN block to tune")
    params = []
    for i in chosen:
        params += [p for p in (*blocks[i].linear1.parameters(), *blocks[i].linear2.parameters())]
    frozen = {id(p) for p in params}
    saved = {n: p.requires_grad for n, p in student.named_parameters()}
    for p in student.parameters():
        p.requires_grad_(id(p) in frozen)
    opt = torch.optim.AdamW(params, lr=lr)
    losses = []
    try:
        for batch in batches:
            if not isinstance(batch, dict) or not all(isinstance(k, str) for k in batch):
                raise TypeError(f"batches must yield dicts of keyword arguments, got {type(batch).__name__}")
            with torch.no_grad():
                target = _hidden_states("teacher", teacher, batch)
            got = _hidden_states("student", student, batch)
            if [tuple(h.shape) for h in got] != [tuple(h.shape) for h in target]:
                raise ValueError("student and teacher must give hidden states of the same shapes, got "
                                 f"{[tuple(h.shape) for h in got]} and {[tuple(h.shape) for h in target]}")
            m = batch.get("attention_mask")
            w = None if m is None else m[..., None].to(got[0].dtype)
            loss = 0.0
            for h_t, h_s in zip(target, got):
                if w is None:
                    loss = loss + F.mse_loss(h_s, h_t)
                else:
                    loss = loss + ((h_s - h_t) ** 2 * w).sum() / (w.sum() * h_s.shape[-1])
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    finally:
        for n, p in student.named_parameters():
            p.requires_grad_(saved[n])
    return losses
