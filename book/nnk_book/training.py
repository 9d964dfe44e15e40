"""Training vocabulary of the chapters, and the fine-tuning plumbing of chapters 6 and 7.

Both chapters fine-tune a classifier on top of a frozen MiniLM (a ``transformers``
``BertModel``) whose upper FFNs were compressed or replaced. Everything below the first
changed block is the same for every method, so the chapters cache the self-attention
output of that block once and run only the *tail* of the encoder from there:

* :func:`hidden_states`: every layer's input of the frozen model, ``(L + 1, n, T, p)``;
* :func:`attention_output`: one block's self-attention output on given hidden states;
* :func:`encoder_tail`: the blocks ``start..`` from a block's input or from its
  self-attention output, and :func:`mean_pool`, the sentence embedding;
* :func:`pooled_tail`: the two above in one, packed on the real tokens when only the
  last block's FFN is left;
* :func:`train_loop` with :func:`warmup_linear_decay` and :func:`random_batches`: the
  AdamW loop with a linear warm-up and linear decay of the learning rate, losses per step
  and an evaluation at checkpoints;
* :func:`frozen_copy`: a copy of the model to compress or train that shares the frozen
  weights with the original;
* :func:`converged`: the chapters' convergence criterion (the loss changed by at most
  ``max(0.03 nats, 10 %)`` between the last two checkpoints or windows);
* :func:`last_fifth_change`: the relative change of a loss curve over the last fifth of
  training (chapters 1 and 5), and :func:`train_to_criterion`: a run repeated with twice
  the steps until it meets a criterion (chapters 3 and 4);
* :func:`smooth` and :func:`plot_smoothed`: moving averages of loss curves.

The methods themselves (the compressions, eq. 6 of chapter 6, the replacements of
chapter 7) stay in the chapters and in ``kernels``; this module only moves tensors.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator, Optional, Sequence

import numpy as np
import torch
from torch import Tensor, nn

__all__ = [
    "attention_output",
    "converged",
    "encoder_tail",
    "frozen_copy",
    "hidden_states",
    "last_fifth_change",
    "mean_pool",
    "plot_seed_losses",
    "pooled_tail",
    "plot_smoothed",
    "random_batches",
    "smooth",
    "train_loop",
    "train_to_criterion",
    "warmup_linear_decay",
]


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value}")
    return int(value)


def _check_mask(hidden: Tensor, mask: Tensor) -> None:
    if not isinstance(hidden, Tensor) or hidden.dim() != 3:
        raise ValueError(f"hidden must be a (n, T, p) tensor, got {getattr(hidden, 'shape', type(hidden).__name__)}")
    if not isinstance(mask, Tensor) or tuple(mask.shape) != tuple(hidden.shape[:2]):
        raise ValueError(f"mask must be a (n, T) = {tuple(hidden.shape[:2])} tensor, "
                         f"got {getattr(mask, 'shape', type(mask).__name__)}")


def mean_pool(hidden: Tensor, mask: Tensor) -> Tensor:
    """Masked mean over tokens, the sentence embedding of sentence-transformers' MiniLM:
    :math:`\\sum_t m_t h_t / \\sum_t m_t`. ``hidden`` ``(n, T, p)``, ``mask`` ``(n, T)``
    (1 for tokens, 0 for padding) -> ``(n, p)``; :math:`O(nTp)`. Chapters 6 and 7."""
    _check_mask(hidden, mask)
    w = mask[..., None].to(hidden.dtype)
    return (hidden * w).sum(1) / w.sum(1)


def _layers(model: nn.Module) -> nn.ModuleList:
    encoder = getattr(model, "encoder", None)
    layers = getattr(encoder, "layer", None)
    if not isinstance(layers, nn.ModuleList):
        raise TypeError(f"model must be a transformers BertModel (model.encoder.layer), got {type(model).__name__}")
    return layers


def _check_start(model: nn.Module, start: object) -> int:
    n = len(_layers(model))
    if isinstance(start, bool) or not isinstance(start, (int, np.integer)):
        raise TypeError(f"start must be an int, got {type(start).__name__}")
    if not 0 <= start < n:
        raise ValueError(f"start must be a block index in [0, {n}), got {start}")
    return int(start)


def _attention_mask(model: nn.Module, hidden: Tensor, mask: Tensor) -> Any:
    from transformers.masking_utils import create_bidirectional_mask

    return create_bidirectional_mask(config=model.config, inputs_embeds=hidden, attention_mask=mask)


@torch.no_grad()
def hidden_states(model: nn.Module, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Optional[Tensor] = None,
                  chunk: int = 256) -> Tensor:
    """Every block's input of ``model`` (and the last block's output), without gradients:
    ``(L + 1, n, T, p)``, entry ``l`` the input of block ``l``, run ``chunk`` sentences at a
    time. :math:`O(n)` forwards of the model; memory :math:`(L + 1) n T p` floats."""
    _layers(model)
    chunk = _positive_int("chunk", chunk)
    if not isinstance(input_ids, Tensor) or input_ids.dim() != 2:
        raise ValueError(f"input_ids must be a (n, T) tensor, got {getattr(input_ids, 'shape', type(input_ids).__name__)}")
    parts = []
    for i in range(0, len(input_ids), chunk):
        sl = slice(i, i + chunk)
        extra = {} if token_type_ids is None else {"token_type_ids": token_type_ids[sl]}
        out = model(input_ids=input_ids[sl], attention_mask=attention_mask[sl], output_hidden_states=True, **extra)
        parts.append(torch.stack(out.hidden_states))
    return torch.cat(parts, dim=1)


@torch.no_grad()
def attention_output(model: nn.Module, start: int, hidden: Tensor, mask: Tensor) -> Tensor:
    """Output of block ``start``'s self-attention sub-layer (with its residual and
    LayerNorm) on the block's input ``hidden`` ``(n, T, p)`` -> ``(n, T, p)``. Below a
    replaced FFN everything is frozen, so chapters 6 and 7 compute it once per split and
    start :func:`encoder_tail` from it."""
    start = _check_start(model, start)
    _check_mask(hidden, mask)
    return _layers(model)[start].attention(hidden, _attention_mask(model, hidden, mask))[0]


def encoder_tail(model: nn.Module, start: int, mask: Tensor, *, hidden: Optional[Tensor] = None,
                 attention: Optional[Tensor] = None) -> Tensor:
    """The encoder blocks ``start..`` of ``model`` (a ``BertModel``): from the input of block
    ``start`` (``hidden``) or from the output of its self-attention (``attention``, as
    :func:`attention_output` gives it; the block then runs only its FFN sub-layer). Exactly
    one of the two is given, ``(n, T, p)``; returns the last hidden state ``(n, T, p)``,
    with gradients for the trainable parameters of those blocks. Cost: ``L - start``
    blocks. Chapter 6 (fine-tuning, eq. 6) and chapter 7 (fine-tuning, NTK)."""
    start = _check_start(model, start)
    if (hidden is None) == (attention is None):
        raise ValueError("give exactly one of hidden (the block's input) and attention (its self-attention output)")
    x = hidden if attention is None else attention
    _check_mask(x, mask)
    layers = list(_layers(model)[start:])
    if attention is not None:
        x, layers = layers[0].feed_forward_chunk(attention), layers[1:]
    if layers:
        mask4 = _attention_mask(model, x, mask)
        for layer in layers:
            x = layer(x, mask4)
            x = x[0] if isinstance(x, tuple) else x
    return x


def pooled_tail(model: nn.Module, start: int, mask: Tensor, attention: Tensor) -> Tensor:
    """``mean_pool(encoder_tail(model, start, mask, attention=attention), mask)``, the
    sentence embeddings ``(n, p)`` of the blocks ``start..`` from block ``start``'s
    self-attention output ``(n, T, p)``. When ``start`` is the last block only its FFN
    sub-layer is left, which acts token by token; it then runs on the real tokens alone
    (``mask`` 1), packed into one row, and each sentence's tokens are averaged with
    ``index_add_``: the same values as the padded route up to rounding, without the padding's
    work (a third of the tokens in chapter 7's teaching run). Otherwise the padded route.
    Chapter 7 (fine-tuning and NTK of a replaced last block)."""
    start = _check_start(model, start)
    _check_mask(attention, mask)
    if start < len(_layers(model)) - 1:
        return mean_pool(encoder_tail(model, start, mask, attention=attention), mask)
    keep = mask.bool()
    rows = keep.nonzero()[:, 0]
    out = _layers(model)[start].feed_forward_chunk(attention[keep][None])[0]
    total = torch.zeros(mask.shape[0], out.shape[-1], dtype=out.dtype, device=out.device).index_add(0, rows, out)
    return total / keep.sum(1, keepdim=True).to(out.dtype)


def frozen_copy(model: nn.Module, layers: Sequence[int], train_all_layers: bool = False) -> nn.Module:
    """A copy of ``model`` with modules of its own and its own FFN weights in ``layers``
    (:func:`kernels.fusion.find_ffn_blocks`), every other parameter and buffer *shared*
    with ``model``: what chapter 6 compresses or fine-tunes when only the compressed FFNs
    train, without copying MiniLM's 22M frozen weights for each of its ~90 models. The
    caller must not write the shared tensors. With ``train_all_layers`` every parameter
    trains, and the copy is a full ``copy.deepcopy``.
    """
    import copy

    from kernels.fusion import find_ffn_blocks

    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(train_all_layers, bool):
        raise TypeError(f"train_all_layers must be a bool, got {type(train_all_layers).__name__}")
    blocks = find_ffn_blocks(model)
    if isinstance(layers, (str, bytes)) or not isinstance(layers, Sequence):
        raise TypeError(f"layers must be a sequence of FFN indices, got {type(layers).__name__}")
    for layer in layers:
        if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < len(blocks):
            raise ValueError(f"layers must hold FFN indices in [0, {len(blocks)}), got {list(layers)!r}")
    if train_all_layers:
        return copy.deepcopy(model)
    own = {id(t) for layer in layers for block in [blocks[layer]]
           for t in (*block.linear1.parameters(), *block.linear2.parameters(), *block.linear1.buffers(),
                     *block.linear2.buffers())}
    shared = {id(t): t for t in (*model.parameters(), *model.buffers()) if id(t) not in own}
    return copy.deepcopy(model, memo=shared)


def converged(values: Sequence[float], window: int = 1, nats: float = 0.03, relative: float = 0.10) -> tuple[bool, float]:
    """The book's convergence criterion for a loss curve: the mean of the last ``window``
    values differs from the mean of the ``window`` before by at most
    ``max(nats, relative * before)``. With ``window = 1`` on losses measured at checkpoints
    (chapter 7) it compares the last two checkpoints; chapter 6 applies it to the minibatch
    losses with ``window`` a fifth of the steps. Returns ``(met, |last - before|)``; a
    ``nan`` loss never meets it."""
    window = _positive_int("window", window)
    v = np.asarray(values, dtype=np.float64).ravel()
    if v.size < 2 * window:
        raise ValueError(f"values must hold at least 2 * window = {2 * window} losses, got {v.size}")
    if not (nats >= 0 and relative >= 0):
        raise ValueError(f"nats and relative must be non-negative, got nats={nats!r}, relative={relative!r}")
    last, before = float(np.mean(v[-window:])), float(np.mean(v[-2 * window:-window]))
    change = abs(last - before)
    return bool(change <= max(nats, relative * before)), change


def last_fifth_change(values: Sequence[float], steps: Optional[Sequence[int]] = None) -> float:
    """The relative change of a loss curve over the last fifth of training,
    :math:`|v(T) - v(0.8 T)| / |v(T)|`: chapter 1's convergence measure (gradient-descent
    losses logged at ``steps``, among which ``round(0.8 T)`` must be) and chapter 5's
    (evenly spaced points, ``steps=None``: :math:`v(0.8 T)` is the point
    ``round(0.8 (n - 1))``). Each chapter compares it with its own tolerance."""
    v = np.asarray(values, dtype=np.float64).ravel()
    if v.size < 2:
        raise ValueError(f"values must hold at least two losses, got {v.size}")
    if steps is None:
        i = int(round(0.8 * (v.size - 1)))
    else:
        steps = list(steps)
        if len(steps) != v.size:
            raise ValueError(f"steps must hold one step per value ({v.size}), got {len(steps)}")
        try:
            i = steps.index(round(0.8 * steps[-1]))
        except ValueError:
            raise ValueError(f"steps must include round(0.8 * {steps[-1]}) = {round(0.8 * steps[-1])}") from None
    return float(abs(v[i] - v[-1]) / abs(v[-1]))


def smooth(values: Sequence[float], width: int) -> np.ndarray:
    """Moving average of ``width`` consecutive values (``'valid'`` part: ``n - width + 1``
    values; ``width`` is clipped to ``[1, n]``). Entry ``i`` averages values ``i..i+width-1``."""
    v = np.asarray(values, dtype=np.float64).ravel()
    if v.size == 0:
        raise ValueError("values must hold at least one number")
    width = max(1, min(_positive_int("width", width), v.size))
    return np.convolve(v, np.ones(width) / width, mode="valid")


def plot_smoothed(ax: Any, values: Sequence[float], width: int, *args: Any, **kwargs: Any) -> list:
    """Plot :func:`smooth` of a per-step loss curve on ``ax``, each average at the (1-based)
    step that ends its window; ``args`` and ``kwargs`` go to ``ax.plot``."""
    curve = smooth(values, width)
    return ax.plot(np.arange(len(curve)) + (len(values) - len(curve) + 1), curve, *args, **kwargs)


def plot_seed_losses(ax: Any, series: Iterable[tuple[str, Any, Sequence[dict]]], epochs: int, title: str) -> None:
    """Per-epoch training (solid) and test (dashed) losses of every seed's run on ``ax``.

    ``series``: ``(label, color, runs)`` per model, each run a dict with ``"train"`` and
    ``"test"`` lists of ``epochs`` losses; only a model's first run is labelled. The last
    fifth of training, where the convergence criterion looks, is shaded grey; the loss axis
    is logarithmic (cross-entropy in nats)."""
    epochs = _positive_int("epochs", epochs)
    x = np.arange(1, epochs + 1)
    for label, color, runs in series:
        for r, run in enumerate(runs):
            ax.plot(x, run["train"], color=color, lw=1, alpha=0.7, label=f"{label}: training" if r == 0 else None)
            ax.plot(x, run["test"], color=color, lw=1, ls="--", alpha=0.7, label=f"{label}: test" if r == 0 else None)
    ax.axvspan(0.8 * epochs, epochs, color="0.9", zorder=0)
    ax.set(yscale="log", title=title, xlabel="epoch", ylabel="cross-entropy (nats)")
    ax.legend(ncol=2, fontsize=8)


def warmup_linear_decay(steps: int, warmup_fraction: float = 0.06) -> Callable[[int], float]:
    """The fine-tuning schedule of BERT-style training (chapters 6 and 7): the learning-rate
    factor rises linearly over ``w = max(1, round(warmup_fraction * steps))`` steps and then
    falls linearly to 0 at ``steps``: ``min((t + 1) / w, max(0, (steps - t) / (steps - w + 1)))``
    for the ``LambdaLR`` step ``t``. ``warmup_fraction = 0`` gives the plain linear decay
    ``(steps - t) / steps`` of chapter 6's layer-wise tuning."""
    steps = _positive_int("steps", steps)
    if not 0 <= warmup_fraction < 1:
        raise ValueError(f"warmup_fraction must be in [0, 1), got {warmup_fraction!r}")
    warm = max(1, round(warmup_fraction * steps))
    return lambda t: min((t + 1) / warm, max(0.0, (steps - t) / (steps - warm + 1)))


def random_batches(n: int, batch_size: int, steps: int, generator: torch.Generator) -> Iterator[Tensor]:
    """``steps`` minibatches of ``batch_size`` indices drawn uniformly with replacement from
    ``range(n)``, each drawn from ``generator`` only when the loop asks for it (so draws for
    other purposes from the same generator keep their order)."""
    n, batch_size, steps = (_positive_int(k, v) for k, v in (("n", n), ("batch_size", batch_size), ("steps", steps)))
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
    for _ in range(steps):
        yield torch.randint(n, (batch_size,), generator=generator)


def train_to_criterion(attempt: Callable[[int], Any], steps: int, met: Callable[[Any], bool],
                       max_doublings: int = 2) -> tuple[Any, int, list]:
    """Train to a stated convergence criterion whatever the seed: ``run = attempt(steps)``;
    while ``met(run)`` is false, ``attempt`` again with twice the steps, at most
    ``max_doublings`` times (the last run is kept whether it meets the criterion or not).
    ``attempt`` makes each run from the same initialisation (a fresh model, the same seeds),
    so a longer run repeats the shorter one's start. Returns ``(last run, its steps, every
    run)``. Chapters 3 (the bundled network's SGD and its MLP baseline) and 4 (Toeplitz
    networks and language models), each with its own criterion in ``met``."""
    steps = _positive_int("steps", steps)
    if isinstance(max_doublings, bool) or not isinstance(max_doublings, int) or max_doublings < 0:
        raise ValueError(f"max_doublings must be a non-negative int, got {max_doublings!r}")
    runs = []
    for doubling in range(max_doublings + 1):
        runs.append(attempt(steps))
        if doubling == max_doublings or met(runs[-1]):
            break
        steps *= 2
    return runs[-1], steps, runs


def train_loop(loss_fn: Callable[[Any], Tensor], optimizer: torch.optim.Optimizer, batches: Iterable[Any], *,
               lr_lambda: Optional[Callable[[int], float]] = None, checkpoints: Iterable[int] = (),
               on_checkpoint: Optional[Callable[[int], Any]] = None) -> tuple[np.ndarray, list]:
    """One optimiser step per batch: ``loss_fn(batch)``, backward, ``optimizer.step()`` and,
    with ``lr_lambda``, a ``LambdaLR`` step. After step ``t`` (1-based) in ``checkpoints``,
    ``on_checkpoint(t)`` runs (an evaluation) and its result is kept. Returns
    ``(losses per step, [on_checkpoint results])``. The training loops of chapters 6 and 7."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    if not callable(loss_fn):
        raise TypeError(f"loss_fn must be callable, got {type(loss_fn).__name__}")
    checkpoints = set(checkpoints)
    sched = None if lr_lambda is None else torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda)
    losses, evaluations = [], []
    for t, batch in enumerate(batches):
        loss = loss_fn(batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if sched is not None:
            sched.step()
        losses.append(loss.item())
        if on_checkpoint is not None and t + 1 in checkpoints:
            evaluations.append(on_checkpoint(t + 1))
    return np.array(losses), evaluations
