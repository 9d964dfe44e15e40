"""FFN surgery: finding, capturing and replacing the feed-forward blocks of a model.

The FFN of a transformer block is :math:`y = W_2\\,\\sigma(W_1 x + b_1) + b_2`
(``d -> hidden -> d``), eq. 1 of Wei et al. (2023) and eq. 3 of Zeng et al. (2023). Here
it is an :class:`FFN` (two ``nn.Linear`` and the activation module between them, an
``nn.Module``: the one FFN type, also what the dense-like replacements return), and an
:class:`FFNSite` says where one sits in a model:

* Hugging Face BERT-style encoders (``BertModel``, the all-MiniLM-L6-v2 of chapter 6, a
  model wrapping one under ``.bert`` or ``.model``): the unit is
  ``encoder.layer[i].intermediate.dense -> intermediate_act_fn -> output.dense``. The
  site's ``path`` is ``encoder.layer.<i>.intermediate``; :func:`replace_ffn` puts the
  replacement there and an ``nn.Identity`` in ``output.dense``, so the dropout, the
  residual connection and the LayerNorm of ``BertOutput`` stay where they are.
* ``nn.Sequential`` MLPs: every ``Linear(d, h), activation, Linear(h, d)`` run of three
  consecutive children (scanned left to right, runs do not overlap). The replacement
  goes where the first ``Linear`` was, the other two become ``nn.Identity``, so the
  children keep their indices.

The linear layers of a site may also be the compressed layers of :mod:`kernels.linear`
(what MLP fusion puts in). This module imports nothing of the package above
:mod:`kernels.linear`: the methods that replace FFNs (:mod:`kernels.snnk`,
:mod:`kernels.fusion`, :mod:`kernels.lookup`) and their catalogue :mod:`kernels.ffn`
all stand on it. Package side of chapter 7 (``chapters/07_ffn_replacements.ipynb``);
chapters 3, 5 and 6 use the same surgery. :mod:`kernels.ffn` re-exports the public
names (``kernels.ffn.find_ffn_sites`` etc.).
"""

from __future__ import annotations

import copy as _copy
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence, Union

import torch
from torch import Tensor, nn

from kernels._checks import check_input, check_module
from kernels.linear import CompressedLinear, LowRankLinear

__all__ = [
    "FFN",
    "FFNSite",
    "find_ffn_sites",
    "capture_ffn_io",
    "replace_ffn",
    "replace_ffns",
    "is_linear",
    "linear_multiply_adds",
    "bert_layers",
    "set_submodule",
]


# --------------------------------------------------------------------------------------
# FFN, FFNSite, finding
# --------------------------------------------------------------------------------------


def _linear_types() -> tuple[type, ...]:
    return (nn.Linear, CompressedLinear, LowRankLinear)


def is_linear(module: object) -> bool:
    """True for the layers an FFN's ``linear1``/``linear2`` may be: ``nn.Linear`` and the
    compressed layers of :mod:`kernels.linear` (used by :func:`kernels.ffn.multiply_adds`)."""
    return isinstance(module, _linear_types())


def linear_multiply_adds(layer: nn.Module) -> int:
    """Multiply-adds per token of an :func:`is_linear` layer: :math:`d_{in} d_{out}` for
    ``nn.Linear``, the layer's own ``multiply_adds()`` for the compressed layers of
    :mod:`kernels.linear`."""
    if not is_linear(layer):
        raise TypeError(f"layer must be nn.Linear, CompressedLinear or LowRankLinear, got {type(layer).__name__}")
    if isinstance(layer, (CompressedLinear, LowRankLinear)):
        return layer.multiply_adds()
    return int(layer.in_features) * int(layer.out_features)


class _FunctionModule(nn.Module):
    """An activation given as a plain function (older ``transformers``), as a module."""

    def __init__(self, fn: Callable[[Tensor], Tensor]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: Tensor) -> Tensor:
        return self.fn(x)


def _first_weight(layer: nn.Module) -> Tensor:
    """The parameter whose dtype and device an input of ``layer`` (an :func:`is_linear`
    layer) must share."""
    return layer.v if isinstance(layer, LowRankLinear) else layer.weight


class FFN(nn.Module):
    """A feed-forward block ``linear2(activation(linear1(x)))``, ``d -> hidden -> d``
    (eq. 1 of Wei et al., 2023; eq. 3 of Zeng et al., 2023). Shapes ``(..., d) -> (..., d)``.

    The one FFN type of the package: :func:`find_ffn_sites` returns the model's FFNs as
    ``FFN`` (holding the model's own modules, no copies: changing them changes the model),
    and the dense-like replacement methods of :mod:`kernels.ffn` (original, SVD, pruning,
    random subset, fusion) return new ones. ``linear1`` maps ``d_model -> hidden`` and
    ``linear2`` ``hidden -> d_model``; both are :func:`is_linear` layers (``nn.Linear`` or
    the compressed layers of :mod:`kernels.linear`; the replacement methods need plain
    ``nn.Linear``). ``activation``: an ``nn.Module`` or a function (wrapped in a module).
    ``setting``: the replacement method's setting (e.g. ``{"k": 96}``), empty for a
    model's own FFN. Where an FFN sits in a model is a different thing, an :class:`FFNSite`.
    """

    def __init__(self, linear1: nn.Module, activation: nn.Module, linear2: nn.Module, *,
                 setting: Optional[dict[str, Any]] = None) -> None:
        super().__init__()
        for name, layer in (("linear1", linear1), ("linear2", linear2)):
            if not is_linear(layer):
                raise TypeError(f"{name} must be a torch.nn.Linear (or a CompressedLinear/LowRankLinear of "
                                f"kernels.linear), got {type(layer).__name__}")
        if linear2.in_features != linear1.out_features or linear2.out_features != linear1.in_features:
            raise ValueError(
                "an FFN maps d -> hidden -> d, but linear1 is "
                f"{linear1.in_features} -> {linear1.out_features} and linear2 "
                f"{linear2.in_features} -> {linear2.out_features}"
            )
        if not isinstance(activation, nn.Module):
            if not callable(activation):
                raise TypeError(f"activation must be an nn.Module or a function, got {type(activation).__name__}")
            activation = _FunctionModule(activation)
        if setting is not None and not isinstance(setting, dict):
            raise TypeError(f"setting must be a dict or None, got {type(setting).__name__}")
        self.linear1 = linear1
        self.activation = activation
        self.linear2 = linear2
        self.setting = dict(setting or {})

    @property
    def d_model(self) -> int:
        return int(self.linear1.in_features)

    @property
    def hidden(self) -> int:
        return int(self.linear1.out_features)

    def forward(self, x: Tensor) -> Tensor:
        """``linear2(activation(linear1(x)))``: ``(..., d) -> (..., d)``."""
        l1 = self.linear1
        check_input("x", x, l1.in_features, _first_weight(l1), what="d_model")
        return self.linear2(self.activation(l1(x)))

    def multiply_adds(self) -> int:
        """Multiply-adds per token of the two linear layers (:func:`linear_multiply_adds`;
        :math:`2dk` for dense layers of width ``k``), the activation not counted."""
        return linear_multiply_adds(self.linear1) + linear_multiply_adds(self.linear2)

    def as_module(self) -> "FFN":
        """A new :class:`FFN` sharing these layers (no copy), with the setting
        ``{"hidden": hidden}`` (the unreplaced FFN as a replacement method's result)."""
        return FFN(self.linear1, self.activation, self.linear2, setting={"hidden": self.hidden})


@dataclass
class FFNSite:
    """Where one FFN sits in a model: a place, not a block (the block itself is the
    :class:`FFN` in ``ffn``); what :func:`replace_ffn` replaces and
    :func:`kernels.fusion.compress_model` compresses.

    ``index``: the block number (the encoder layer; for an ``nn.Sequential``, the
    position of the run among the runs found). ``path``: dotted name (``named_modules``)
    of the module a replacement takes the place of. ``ffn``: the model's FFN.
    ``kind``: ``"bert"`` or ``"sequential"``. ``parts``: dotted names of ``linear1``, the
    activation and ``linear2``; the parts outside ``path`` become ``nn.Identity`` on
    replacement.
    """

    index: int
    path: str
    ffn: FFN
    kind: str = "bert"
    parts: tuple[str, str, str] = field(default=("", "", ""))


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def bert_layers(model: nn.Module) -> tuple[Optional[str], Optional[nn.Module]]:
    """``(path, layers)`` of a BERT-style encoder's ``encoder.layer`` list (also under
    ``.bert`` or ``.model``), or ``(None, None)`` when ``model`` has none. Used by
    :func:`find_ffn_sites` and :func:`kernels.fusion.find_ffn_blocks`."""
    base, prefix = model, ""
    for attr in ("bert", "model"):
        if not hasattr(base, "encoder") and isinstance(getattr(base, attr, None), nn.Module):
            base, prefix = getattr(base, attr), _join(prefix, attr)
    layers = getattr(getattr(base, "encoder", None), "layer", None)
    if isinstance(layers, (nn.ModuleList, nn.Sequential)):
        return _join(prefix, "encoder.layer"), layers
    return None, None


def _bert_site(prefix: str, i: int, layer: nn.Module) -> Optional[FFNSite]:
    inter, out = getattr(layer, "intermediate", None), getattr(layer, "output", None)
    if inter is None or out is None:
        return None
    l1, l2 = getattr(inter, "dense", None), getattr(out, "dense", None)
    act = getattr(inter, "intermediate_act_fn", None)
    if act is None or not is_linear(l1) or not is_linear(l2):
        return None
    base = f"{prefix}.{i}"
    try:
        ffn = FFN(l1, act, l2)
    except (TypeError, ValueError):
        return None
    return FFNSite(i, f"{base}.intermediate", ffn, "bert",
                   (f"{base}.intermediate.dense", f"{base}.intermediate.intermediate_act_fn", f"{base}.output.dense"))


def _sequential_sites(model: nn.Sequential) -> list[FFNSite]:
    mods = list(model.named_children())
    sites, i = [], 0
    while i + 2 < len(mods):
        (n1, m1), (na, ma), (n2, m2) = mods[i], mods[i + 1], mods[i + 2]
        if (is_linear(m1) and is_linear(m2) and not is_linear(ma)
                and m2.in_features == m1.out_features and m2.out_features == m1.in_features):
            sites.append(FFNSite(len(sites), n1, FFN(m1, ma, m2), "sequential", (n1, na, n2)))
            i += 3
        else:
            i += 1
    return sites


def find_ffn_sites(model: nn.Module) -> list[FFNSite]:
    """The FFNs of ``model``, bottom to top, as :class:`FFNSite` (see the module doc for
    the structures recognised). A BERT layer whose FFN was already replaced is skipped
    (the other sites keep their layer numbers as ``index``).

    Raises:
        TypeError: ``model`` is not an ``nn.Module``.
        ValueError: no FFN found, naming the structures looked for.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    sites: list[FFNSite] = []
    if isinstance(model, nn.Sequential):
        sites = _sequential_sites(model)
    else:
        prefix, layers = bert_layers(model)
        if layers is not None:
            for i, layer in enumerate(layers):
                site = _bert_site(prefix, i, layer)
                if site is not None:
                    sites.append(site)
    if not sites:
        raise ValueError(
            f"model ({type(model).__name__}) has no FFN of the expected structure: expected "
            "an nn.Sequential with a (Linear(d, h), activation, Linear(h, d)) run of children, "
            "or a BERT-style transformer with encoder.layer[i].intermediate.dense, "
            ".intermediate.intermediate_act_fn and encoder.layer[i].output.dense"
        )
    return sites


def _resolve_site(model: nn.Module, site: Union[FFNSite, int], name: str = "site") -> FFNSite:
    """The site of ``model`` meant by ``site``: an :class:`FFNSite` (found again in
    ``model`` by its path, so a site of the original works on a copy) or a block number.
    ``name`` names the argument in errors."""
    if not isinstance(site, FFNSite) and (isinstance(site, bool) or not hasattr(site, "__index__")):
        raise TypeError(f"{name} must be an FFNSite or a block number, got {type(site).__name__}")
    sites = find_ffn_sites(model)
    if isinstance(site, FFNSite):
        for s in sites:
            if s.path == site.path:
                return s
        raise ValueError(f"{name} {site.path!r} is not an FFN of this model (already replaced?)")
    idx = int(site)
    indices = [s.index for s in sites]
    if idx < 0:
        top = max(indices) + 1
        idx += top
    for s in sites:
        if s.index == idx:
            return s
    raise ValueError(f"{name} must be one of the block numbers {indices} (negative counts from the top), got {site}")


def capture_ffn_io(
    model: nn.Module, sites: Sequence[Union[FFNSite, int]], *model_args: Any, **model_kwargs: Any
) -> dict[int, tuple[Tensor, Tensor]]:
    """Inputs and outputs of each site's FFN on one forward ``model(*model_args,
    **model_kwargs)`` (run under ``torch.no_grad``): ``{site.index: (x, y)}`` with ``x``
    the input of ``linear1`` and ``y`` the output of ``linear2``, both ``(..., d)``
    (detached; for a BERT encoder ``(batch, tokens, d)``, padding included). The hooks are
    removed afterwards, also when the forward raises. Chapter 7.
    """
    check_module("model", model)
    if isinstance(sites, (FFNSite, int, str, bytes)) or not isinstance(sites, Iterable):
        raise TypeError(f"sites must be a sequence of FFNSite or block numbers, got {type(sites).__name__}")
    resolved = [_resolve_site(model, s, f"sites[{i}]") for i, s in enumerate(sites)]
    if not resolved:
        raise ValueError("sites must name at least one FFN")
    store: dict[int, dict[str, Tensor]] = {s.index: {} for s in resolved}
    handles = []

    def keep_input(idx: int):
        def hook(module, inputs, output):
            store[idx]["x"] = inputs[0].detach()
        return hook

    def keep_output(idx: int):
        def hook(module, inputs, output):
            store[idx]["y"] = output.detach()
        return hook

    try:
        for s in resolved:
            handles.append(s.ffn.linear1.register_forward_hook(keep_input(s.index)))
            handles.append(s.ffn.linear2.register_forward_hook(keep_output(s.index)))
        with torch.no_grad():
            try:
                model(*model_args, **model_kwargs)
            except torch.OutOfMemoryError:
                raise
            except (TypeError, ValueError, RuntimeError, IndexError) as exc:
                raise ValueError(
                    f"model(*model_args, **model_kwargs) failed ({type(exc).__name__}: {exc}); "
                    "model_args and model_kwargs are passed to the model's forward as they are"
                ) from exc
    finally:
        for h in handles:
            h.remove()
    missing = [i for i, d in store.items() if "x" not in d or "y" not in d]
    if missing:
        raise ValueError(f"the forward pass did not run the FFN of blocks {missing}")
    return {i: (d["x"], d["y"]) for i, d in store.items()}


def set_submodule(model: nn.Module, path: str, module: nn.Module) -> None:
    """Put ``module`` at the dotted ``path`` of ``model`` (in place; the parent must exist).
    Used by :func:`replace_ffns` and :func:`kernels.snnk.with_bundled_ffn`."""
    check_module("model", model)
    check_module("module", module)
    if not isinstance(path, str):
        raise TypeError(f"path must be a dotted str such as 'encoder.layer.0.intermediate', got {type(path).__name__}")
    parent, _, name = path.rpartition(".")
    if not name or not all(parent.split(".")) and parent:
        raise ValueError(f"path must be a dotted module name such as 'encoder.layer.0.intermediate', got {path!r}")
    try:
        owner = model.get_submodule(parent) if parent else model
    except AttributeError as exc:
        raise ValueError(f"path {path!r}: model has no submodule {parent!r} ({exc})") from None
    setattr(owner, name, module)


def replace_ffn(model: nn.Module, site: Union[FFNSite, int], module: nn.Module, *, copy: bool = True) -> nn.Module:
    """``model`` with the FFN at ``site`` (an :class:`FFNSite` or a block number,
    negative from the top) replaced by ``module`` (interface ``(..., d) -> (..., d)``).

    With ``copy=True`` (default) a deep copy is changed and returned and ``model`` is
    untouched; ``module`` itself is put in (not copied). Only that site changes: every
    other parameter and buffer stays as it was. Chapter 7.
    """
    check_module("model", model)
    check_module("module", module)
    if not isinstance(site, FFNSite) and (isinstance(site, bool) or not hasattr(site, "__index__")):
        raise TypeError(f"site must be an FFNSite or a block number, got {type(site).__name__}")
    return replace_ffns(model, [(site, module)], copy=copy)


def replace_ffns(
    model: nn.Module,
    replacements: Union[Mapping[Union[FFNSite, int], nn.Module], Sequence[tuple[Union[FFNSite, int], nn.Module]]],
    *,
    copy: bool = True,
) -> nn.Module:
    """Several :func:`replace_ffn` at once (one copy): ``replacements`` maps sites (or
    block numbers) to modules, or is a sequence of ``(site, module)`` pairs."""
    check_module("model", model)
    if not isinstance(copy, bool):
        raise TypeError(f"copy must be a bool, got {copy!r}")
    if isinstance(replacements, Mapping):
        pairs = list(replacements.items())
    elif isinstance(replacements, (str, bytes, nn.Module)) or not isinstance(replacements, Iterable):
        raise TypeError("replacements must map sites (or block numbers) to modules, or be a sequence of "
                        f"(site, module) pairs, got {type(replacements).__name__}")
    else:
        pairs = list(replacements)
        for pair in pairs:
            if not isinstance(pair, tuple) or len(pair) != 2:
                raise TypeError(f"replacements must hold (site, module) pairs, got an item {type(pair).__name__}")
    for site, module in pairs:
        if not isinstance(module, nn.Module):
            raise TypeError(f"replacements[{site!r}] must be an nn.Module mapping (..., d) -> (..., d), got "
                            f"{type(module).__name__}")
    if copy:
        # Copy the model without the new modules (they are put in as they are).
        target = _copy.deepcopy(model)
    else:
        target = model
    resolved = [(_resolve_site(target, s, "a site of replacements"), m) for s, m in pairs]
    paths = [s.path for s, _ in resolved]
    if len(set(paths)) != len(paths):
        raise ValueError(f"replacements name a site twice: {paths}")
    for s, module in resolved:
        set_submodule(target, s.path, module)
        for part in s.parts:
            if part != s.path and not part.startswith(s.path + "."):
                set_submodule(target, part, nn.Identity())
    return target
