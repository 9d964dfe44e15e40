"""The same compression applied to chosen FFN blocks of a model.

Part of :mod:`kernels.fusion` (chapter 6, section "Compressing MiniLM"). The FFN blocks of a
``Sequential(Linear, activation, Linear)`` or of a BERT-style transformer
(``encoder.layer[i].intermediate.dense`` and ``encoder.layer[i].output.dense``) are found
by the FFN surgery of :mod:`kernels.surgery` (:func:`find_ffn_blocks`), compressed one by
one with :func:`kernels.fusion.compress.compress_mlp` (:func:`compress_sequential`,
:func:`compress_model`) and counted (:func:`mlp_parameter_count`).
"""

from __future__ import annotations

import copy
from typing import Iterable, Optional, Sequence

import torch
from torch import nn

from kernels.linear import LowRankLinear
from kernels.surgery import FFN, FFNSite, bert_layers, find_ffn_sites, set_submodule
from kernels.fusion.clustering import KMeansResult, _generator
from kernels.fusion.compress import compress_mlp

__all__ = [
    "compress_sequential",
    "find_ffn_blocks",
    "compress_model",
    "mlp_parameter_count",
]


def find_ffn_blocks(model: nn.Module) -> list[FFN]:
    """The FFN blocks of ``model``, bottom to top, as :class:`kernels.surgery.FFN` (the
    model's own layers, no copies; found by :func:`kernels.surgery.find_ffn_sites`).

    Supported structures: an ``nn.Sequential(Linear(p, p_I), activation, Linear(p_I, p))``
    (one block), and a BERT-style transformer (``transformers`` ``BertModel`` and
    relatives) whose ``encoder.layer[i]`` has ``intermediate.dense`` (``p -> p_I``),
    ``intermediate.intermediate_act_fn`` and ``output.dense`` (``p_I -> p``) in every
    layer; a model wrapping one under ``.bert`` or ``.model`` also works. Block ``i`` is
    layer ``i``; its linear layers may be the compressed ones of this module.

    Raises:
        TypeError: ``model`` is not an ``nn.Module``.
        ValueError: no FFN of the expected structure, naming what was looked for.
    """
    return [s.ffn for s in _block_sites(model)]


def _block_sites(model: nn.Module) -> list[FFNSite]:
    """The sites of :func:`find_ffn_blocks`'s blocks (checked as it documents)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if isinstance(model, nn.Sequential) and len(model) != 3:
        raise ValueError(
            "model is an nn.Sequential but not Sequential(Linear(p, p_I), activation, "
            f"Linear(p_I, p)); got {[type(m).__name__ for m in model]}"
        )
    try:
        sites = find_ffn_sites(model)
    except ValueError as err:
        if isinstance(model, nn.Sequential):
            raise ValueError(
                "model is an nn.Sequential but not Sequential(Linear(p, p_I), activation, "
                f"Linear(p_I, p)); got {[type(m).__name__ for m in model]}"
            ) from err
        raise
    if not isinstance(model, nn.Sequential):
        layers = bert_layers(model)[1]
        if [s.index for s in sites] != list(range(len(layers))):
            raise ValueError(
                f"model ({type(model).__name__}) has no FFN of the expected structure in every layer: "
                "expected encoder.layer[i].intermediate.dense, .intermediate.intermediate_act_fn and "
                "encoder.layer[i].output.dense (an FFN replaced by kernels.ffn.replace_ffn is not a block)"
            )
    return sites


def compress_sequential(
    mlp: nn.Sequential,
    k: int,
    *,
    method: str = "fusion",
    generator: Optional[torch.Generator] = None,
    **kwargs,
) -> nn.Sequential:
    """A new ``Sequential(linear1', activation, linear2')``: ``mlp`` (an
    ``nn.Sequential(Linear(p, p_I), activation, Linear(p_I, p))``) compressed with
    :func:`compress_mlp` (``mlp`` itself is not modified)."""
    if not isinstance(mlp, nn.Sequential):
        raise TypeError(f"mlp must be an nn.Sequential(Linear(p, p_I), activation, Linear(p_I, p)), got "
                        f"{type(mlp).__name__}")
    try:
        (block,) = find_ffn_blocks(mlp)
    except ValueError as exc:
        raise ValueError(f"mlp: {exc}") from None
    l1, l2 = compress_mlp(block.linear1, block.linear2, k, method=method, generator=generator, **kwargs)
    return nn.Sequential(l1, copy.deepcopy(mlp[1]), l2)


def compress_model(
    model: nn.Module,
    k: int,
    *,
    layers: Optional[Sequence[int]] = None,
    method: str = "fusion",
    generator: Optional[torch.Generator] = None,
    inplace: bool = False,
    clusterings: Optional[dict[int, KMeansResult]] = None,
    **kwargs,
) -> nn.Module:
    """Compress the FFN blocks ``layers`` (indices into :func:`find_ffn_blocks`, negative
    allowed; ``None``: all) of ``model`` with :func:`compress_mlp`.

    Returns a deep copy (or ``model`` itself with ``inplace=True``) whose chosen FFNs use
    :class:`CompressedLinear` (or, for ``"svd"``, :class:`LowRankLinear`) layers; the rest
    is untouched. The layers draw from ``generator`` one after the other, bottom to top
    (``None``: a fresh generator seeded with 0), and use ``clusterings[l]`` when given. The paper compresses the last 8
    of RoBERTa's 12 layers. Chapter 6, section "Compressing MiniLM".
    """
    if not isinstance(inplace, bool):
        raise TypeError(f"inplace must be a bool, got {inplace!r}")
    target = model if inplace else copy.deepcopy(model)
    sites = _block_sites(target)
    chosen = _check_layers(layers, len(sites))
    gen = _generator(generator)
    for layer in chosen:
        site = sites[layer]
        block = site.ffn
        pre = None if clusterings is None else clusterings.get(layer)
        extra = dict(kwargs)
        if pre is not None:
            extra["clustering"] = pre
        l1, l2 = compress_mlp(block.linear1, block.linear2, k, method=method, generator=gen, **extra)
        set_submodule(target, site.parts[0], l1)
        set_submodule(target, site.parts[2], l2)
    return target


def _check_layers(layers: object, n: int) -> list[int]:
    """``layers``: ``None`` (all ``n`` FFN blocks) or a sequence of distinct block indices in
    ``[-n, n)``; returned as indices in ``[0, n)``."""
    if layers is None:
        return list(range(n))
    if isinstance(layers, (str, bytes)) or not isinstance(layers, Iterable):
        raise TypeError(f"layers must be a sequence of layer indices, got {layers!r}")
    chosen = []
    for layer in layers:
        if isinstance(layer, bool) or not hasattr(layer, "__index__"):
            raise TypeError(f"layers must hold integers, got {layer!r}")
        layer = int(layer)
        if not -n <= layer < n:
            raise ValueError(f"layers must lie in [{-n}, {n}) for a model with {n} FFN blocks, got {layer}")
        chosen.append(layer % n)
    if len(set(chosen)) != len(chosen):
        raise ValueError(f"layers must not repeat a layer, got {list(layers)}")
    return chosen


def mlp_parameter_count(model: nn.Module, layers: Optional[Sequence[int]] = None) -> int:
    """Parameters of the FFN blocks ``layers`` of ``model`` (``None``: all), counting only
    unmasked weight entries of pruned layers."""
    blocks = find_ffn_blocks(model)
    chosen = _check_layers(layers, len(blocks))
    total = 0
    for i in chosen:
        for lin in (blocks[i].linear1, blocks[i].linear2):
            if isinstance(lin, LowRankLinear):
                total += lin.u.numel() + lin.v.numel() + (0 if lin.bias is None else lin.bias.numel())
                continue
            mask = getattr(lin, "mask", None)
            total += int(mask.sum()) if mask is not None else lin.weight.numel()
            total += 0 if lin.bias is None else lin.bias.numel()
    return total
