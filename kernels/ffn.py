"""FFN replacements: every replacement method of the book behind one signature, and
the counts (parameters, multiply-adds) they are compared by.

Package side of chapter 7 (``chapters/07_ffn_replacements.ipynb``). This catalogue stands
above the methods it calls (:mod:`kernels.fusion`, :mod:`kernels.snnk`,
:mod:`kernels.lookup`); the FFN surgery they all use (:class:`FFN`, :class:`FFNSite`,
:func:`find_ffn_sites`, :func:`capture_ffn_io`, :func:`replace_ffn`,
:func:`replace_ffns`) lives in :mod:`kernels.surgery` and is re-exported here, as is
:func:`kernels.snnk.bert_snnk_counts`.

Replacement methods (:data:`REPLACEMENTS`) all have the signature
``method(ffn, budget, *, inputs=None, outputs=None, generator=None, **options)`` and return
a module ``(..., d) -> (..., d)`` with at most ``budget`` parameters
(:func:`parameter_count`) and a ``setting`` dict naming the largest setting that fits.
:func:`budget_for_hidden` turns a hidden width into a budget, so budgets can be stated as
fractions of the original width. :func:`multiply_adds` gives the multiply-adds per token
of every module they return (the formula of each method is in its docstring).

Randomness comes from an explicit ``generator`` (a CPU ``torch.Generator``; ``None``
means a fresh one seeded with 0), the package convention.
"""

from __future__ import annotations

import copy as _copy
from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from kernels._checks import (
    check_module,
    check_nonempty,
    check_nonnegative_float,
    check_positive_float,
    check_positive_int,
    check_same_dtype,
    check_tensor,
    cpu_generator,
)
from kernels.snnk import bert_snnk_counts
from kernels.surgery import (  # the surgery, re-exported: kernels.ffn.find_ffn_sites etc.
    FFN,
    FFNSite,
    capture_ffn_io,
    find_ffn_sites,
    is_linear,
    linear_multiply_adds,
    replace_ffn,
    replace_ffns,
)

__all__ = [
    "FFN",
    "FFNSite",
    "find_ffn_sites",
    "capture_ffn_io",
    "replace_ffn",
    "replace_ffns",
    "parameter_count",
    "multiply_adds",
    "budget_for_hidden",
    "REPLACEMENTS",
    "replace_original",
    "replace_svd",
    "replace_prune",
    "replace_random",
    "replace_fusion",
    "replace_fusion_tuned",
    "replace_snnk",
    "replace_bundled_snnk",
    "replace_lookup",
    "replace_block_diagonal",
    "replace_moe_top1",
    "distill",
    "bert_snnk_counts",
]


# --------------------------------------------------------------------------------------
# Counting
# --------------------------------------------------------------------------------------


def parameter_count(module: nn.Module) -> int:
    """Parameters of ``module`` (each shared tensor once; buffers such as random
    projections, fusion's scaling ``P`` and pruning masks are not parameters), counting
    only the unmasked entries of a masked :class:`kernels.fusion.CompressedLinear`."""
    if not isinstance(module, nn.Module):
        raise TypeError(f"module must be an nn.Module, got {type(module).__name__}")
    total = sum(p.numel() for p in module.parameters())
    from kernels.fusion import CompressedLinear

    for m in module.modules():
        if isinstance(m, CompressedLinear) and m.mask is not None:
            total -= m.weight.numel() - int(m.mask.sum())
    return int(total)


#: The modules :func:`multiply_adds` counts: each knows its own count (``multiply_adds()``).
_COUNTED = "FFN, a linear layer, BundledNetwork, LookupFFN, BlockDiagonalFFN, Top1MoEFFN, VanillaFFN"


def _macs_per_token(module: nn.Module) -> int:
    if is_linear(module):
        return linear_multiply_adds(module)
    count = getattr(module, "multiply_adds", None)
    if callable(count):
        return int(count())
    raise TypeError(
        f"module must be a module a replacement method returns ({_COUNTED}): multiply_adds is not "
        f"defined for a {type(module).__name__}"
    )


def multiply_adds(module: nn.Module, tokens: int = 1) -> int:
    """Multiply-adds of ``module`` on ``tokens`` tokens (activations, biases, the codes
    and weights of LookupFFN and the routing softmax of the MoE not counted):

    * dense FFN (original, pruning, random subset, fusion): :math:`2dk` for width ``k``;
    * factored SVD: :math:`2r(d + h)` for rank ``r``;
    * SNNK / bundled SNNK (:class:`kernels.snnk.BundledNetwork`): :math:`m' d + dM`
      (``m'`` random projections, ``M`` features), ``flops_per_input``;
    * LookupFFN: half the FLOP of :func:`kernels.lookup.lookup_ffn_flops` (hash
      projection plus :math:`h\\,d` for the weighted gather);
    * block-diagonal FFN: :math:`2dH/g`; top-1 MoE: :math:`de + 2dH_e` (router and one
      expert).

    Equal to half the FLOP that ``torch.utils.flop_counter.FlopCounterMode`` counts in a
    forward of the dense-like modules (tested). Each module owns its count, a
    ``multiply_adds()`` method beside its forward (plain ``nn.Linear``:
    :func:`kernels.surgery.linear_multiply_adds`); this function asks it.
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"module must be an nn.Module, got {type(module).__name__}")
    return _macs_per_token(module) * check_positive_int("tokens", tokens)


def _check_ffn(ffn: object) -> FFN:
    if isinstance(ffn, FFNSite):
        ffn = ffn.ffn
    if not isinstance(ffn, FFN):
        raise TypeError(f"ffn must be an FFN (or FFNSite), got {type(ffn).__name__}")
    for name in ("linear1", "linear2"):
        if type(getattr(ffn, name)) is not nn.Linear:
            raise TypeError(f"ffn.{name} must be a plain torch.nn.Linear for a replacement, got "
                            f"{type(getattr(ffn, name)).__name__}")
    return ffn


def _full_count(ffn: FFN) -> int:
    return parameter_count(ffn.linear1) + parameter_count(ffn.linear2)


def budget_for_hidden(ffn: FFN, k: int) -> int:
    """Parameters of a dense FFN like ``ffn`` with ``k`` hidden units:
    :math:`k(2d + 1) + d` (both weights, both biases). ``k = ffn.hidden`` gives the
    original count."""
    ffn = _check_ffn(ffn)
    k = check_positive_int("k", k)
    return k * (2 * ffn.d_model + (1 if ffn.linear1.bias is not None else 0)) + (
        ffn.d_model if ffn.linear2.bias is not None else 0)


def _check_budget(ffn: FFN, budget: object) -> int:
    if isinstance(budget, bool) or not hasattr(budget, "__index__"):
        raise TypeError(f"budget must be an integer number of parameters, got {budget!r}")
    budget = int(budget)
    full = _full_count(ffn)
    if not 0 < budget <= full:
        raise ValueError(f"budget must satisfy 0 < budget <= {full} (the FFN's parameter count), got {budget}")
    return budget


def _too_small(method: str, budget: int, need: int) -> ValueError:
    return ValueError(f"budget {budget} is too small for {method!r}: its smallest setting needs {need} parameters")


_generator = cpu_generator  # kernels._checks: explicit CPU generator, None -> seed 0


def _data(ffn: FFN, inputs: object, outputs: object, method: str, *, required: bool) -> tuple[Optional[Tensor], Optional[Tensor]]:
    if inputs is None:
        if required:
            raise ValueError(f"inputs must be given for {method!r}: it fits the FFN's outputs on them")
        if outputs is not None:
            raise ValueError("outputs were given without inputs")
        return None, None
    x = check_tensor("inputs", inputs)
    if x.ndim == 0 or x.shape[-1] != ffn.d_model:
        raise ValueError(f"inputs must have shape (..., {ffn.d_model}), got {tuple(x.shape)}")
    x = x.detach().reshape(-1, ffn.d_model).to(ffn.linear1.weight.dtype)
    if outputs is None:
        with torch.no_grad():
            y = ffn.forward(x)
    else:
        y = check_tensor("outputs", outputs)
        if y.shape[-1] != ffn.d_model or y.numel() != x.numel():
            raise ValueError(f"outputs must have the shape of inputs, got {tuple(y.shape)}")
        y = y.detach().reshape(-1, ffn.d_model).to(x.dtype)
    return x, y.detach()


def _finish(module: nn.Module, ffn: FFN, setting: dict[str, Any], budget: int) -> nn.Module:
    w = ffn.linear1.weight
    module = module.to(device=w.device, dtype=w.dtype)
    module.setting = setting
    count = parameter_count(module)
    if count > budget:  # a bug, never a user error
        raise AssertionError(f"{setting} has {count} parameters, more than the budget {budget}")
    return module


def _copy_linear(weight: Tensor, bias: Optional[Tensor]) -> nn.Linear:
    lin = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, dtype=weight.dtype, device=weight.device)
    with torch.no_grad():
        lin.weight.copy_(weight)
        if bias is not None:
            lin.bias.copy_(bias)
    return lin


def _dense_width(ffn: FFN, budget: int, method: str) -> int:
    per_unit = budget_for_hidden(ffn, 1) - (ffn.d_model if ffn.linear2.bias is not None else 0)
    k = min(ffn.hidden, (budget - (budget_for_hidden(ffn, 1) - per_unit)) // per_unit)
    if k < 1:
        raise _too_small(method, budget, budget_for_hidden(ffn, 1))
    return int(k)


def _sub_ffn(ffn: FFN, keep: Tensor, scale: float, setting: dict[str, Any]) -> FFN:
    l1, l2 = ffn.linear1, ffn.linear2
    with torch.no_grad():
        new1 = _copy_linear(l1.weight[keep], None if l1.bias is None else l1.bias[keep])
        new2 = _copy_linear(l2.weight[:, keep] * scale, l2.bias)
    return FFN(new1, _copy.deepcopy(ffn.activation), new2, setting=setting)


# --------------------------------------------------------------------------------------
# Replacement methods
# --------------------------------------------------------------------------------------


def replace_original(ffn: FFN, budget: int, *, inputs: Optional[Tensor] = None, outputs: Optional[Tensor] = None,
                     generator: Optional[torch.Generator] = None) -> nn.Module:
    """A copy of the FFN itself (the reference row); ``budget`` must be its full
    parameter count :math:`h(2d+1)+d`. Setting ``{"hidden": h}``."""
    ffn = _check_ffn(ffn)
    budget = _check_budget(ffn, budget)
    if budget != _full_count(ffn):
        raise ValueError(f"budget must be the FFN's full parameter count {_full_count(ffn)} for 'original', got {budget}")
    module = FFN(_copy.deepcopy(ffn.linear1), _copy.deepcopy(ffn.activation), _copy.deepcopy(ffn.linear2))
    return _finish(module, ffn, {"hidden": ffn.hidden}, budget)


def replace_svd(ffn: FFN, budget: int, *, inputs: Optional[Tensor] = None, outputs: Optional[Tensor] = None,
                generator: Optional[torch.Generator] = None) -> nn.Module:
    """Truncated SVD of both weights in factored form (:class:`kernels.fusion.LowRankLinear`,
    Eckart-Young; chapter 6's baseline): rank ``r`` factors cost :math:`2r(d + h)` plus the
    biases :math:`h + d`; the largest ``r <= min(d, h)`` that fits. Exact when ``r`` reaches
    the rank of both weights. Setting ``{"rank": r}``. Data-free, deterministic."""
    ffn = _check_ffn(ffn)
    budget = _check_budget(ffn, budget)
    from kernels.fusion import compress_mlp

    d, h = ffn.d_model, ffn.hidden
    biases = (h if ffn.linear1.bias is not None else 0) + (d if ffn.linear2.bias is not None else 0)
    r = min(d, h, (budget - biases) // (2 * (d + h)))
    if r < 1:
        raise _too_small("svd", budget, 2 * (d + h) + biases)
    l1, l2 = compress_mlp(ffn.linear1, ffn.linear2, h, method="svd", rank=int(r))
    return _finish(FFN(l1, _copy.deepcopy(ffn.activation), l2), ffn, {"rank": int(r)}, budget)


def replace_prune(ffn: FFN, budget: int, *, inputs: Optional[Tensor] = None, outputs: Optional[Tensor] = None,
                  generator: Optional[torch.Generator] = None) -> nn.Module:
    """Structured magnitude pruning of hidden units: keep the ``k`` units with the
    largest :math:`\\|W_{1,i}\\|\\,\\|W_{2,\\cdot i}\\|` (row ``i`` of ``linear1.weight``
    times column ``i`` of ``linear2.weight``; ties to the lower index), ``k`` the largest
    width with :math:`k(2d+1)+d` within the budget. A smaller dense FFN. Setting
    ``{"k": k}``. Data-free, deterministic."""
    ffn = _check_ffn(ffn)
    budget = _check_budget(ffn, budget)
    k = _dense_width(ffn, budget, "prune")
    with torch.no_grad():
        score = ffn.linear1.weight.norm(dim=1) * ffn.linear2.weight.norm(dim=0)
    keep = torch.sort(torch.argsort(score.cpu(), descending=True, stable=True)[:k]).values
    return _finish(_sub_ffn(ffn, keep.to(score.device), 1.0, {"k": k}), ffn, {"k": k}, budget)


def replace_random(ffn: FFN, budget: int, *, inputs: Optional[Tensor] = None, outputs: Optional[Tensor] = None,
                   generator: Optional[torch.Generator] = None) -> nn.Module:
    """A uniformly random subset of ``k`` hidden units (without replacement, from
    ``generator``), the second weight multiplied by ``h/k``: the unbiased Monte-Carlo
    estimate of the sum over units (chapter 6's "random"). ``k`` as :func:`replace_prune`.
    Setting ``{"k": k}``."""
    ffn = _check_ffn(ffn)
    budget = _check_budget(ffn, budget)
    k = _dense_width(ffn, budget, "random")
    gen = _generator(generator)
    keep = torch.sort(torch.randperm(ffn.hidden, generator=gen)[:k]).values.to(ffn.linear1.weight.device)
    return _finish(_sub_ffn(ffn, keep, ffn.hidden / k, {"k": k}), ffn, {"k": k}, budget)


def replace_fusion(ffn: FFN, budget: int, *, inputs: Optional[Tensor] = None, outputs: Optional[Tensor] = None,
                   generator: Optional[torch.Generator] = None, n_init: int = 1, max_iter: int = 30) -> nn.Module:
    """MLP fusion (Wei et al. 2023, eq. 5; chapter 6): k-means of the sub-MLPs into ``k``
    clusters (:func:`kernels.fusion.compress_mlp`, ``n_init`` restarts, ``max_iter``
    Lloyd iterations), ``k`` as :func:`replace_prune` (the scaling ``P`` is a buffer).
    With ``k = h`` it reproduces the FFN. Setting ``{"k": k}``."""
    ffn = _check_ffn(ffn)
    budget = _check_budget(ffn, budget)
    from kernels.fusion import compress_mlp

    k = _dense_width(ffn, budget, "fusion")
    l1, l2 = compress_mlp(ffn.linear1, ffn.linear2, k, method="fusion", generator=_generator(generator),
                          n_init=n_init, max_iter=max_iter)
    return _finish(FFN(l1, _copy.deepcopy(ffn.activation), l2), ffn, {"k": k}, budget)


def distill(module: nn.Module, inputs: Tensor, outputs: Tensor, *, steps: int = 200, lr: float = 1e-3,
            batch_size: int = 256, weight_decay: float = 0.0,
            generator: Optional[torch.Generator] = None) -> list[float]:
    """Fit ``module`` to ``outputs`` on ``inputs`` (``(n, d)`` each): ``steps`` AdamW
    steps on the mean squared error over minibatches of ``batch_size`` rows drawn
    without replacement (from ``generator``; a new permutation each pass). Trains all
    parameters of ``module`` in place; returns the loss of every step (the curve the
    chapter plots). Cost ``steps`` forward/backward passes of ``batch_size`` rows."""
    check_module("module", module)
    check_tensor("inputs", inputs, ndim=2)
    check_tensor("outputs", outputs, ndim=2)
    check_nonempty("inputs", inputs, 0, "row")
    if outputs.shape[0] != inputs.shape[0]:
        raise ValueError(f"inputs and outputs must have the same number of rows, got shapes "
                         f"{tuple(inputs.shape)} and {tuple(outputs.shape)}")
    check_same_dtype(("inputs", inputs), ("outputs", outputs))
    if outputs.device != inputs.device:
        raise ValueError(f"inputs and outputs must be on one device, got {inputs.device} and {outputs.device}")
    steps = check_positive_int("steps", steps)
    batch_size = check_positive_int("batch_size", batch_size)
    lr = check_positive_float("lr", lr)
    weight_decay = check_nonnegative_float("weight_decay", weight_decay)
    gen = _generator(generator)
    params = [p for p in module.parameters() if p.requires_grad]
    if not params:
        raise ValueError("module has no trainable parameter to distill")
    was_training = module.training
    try:  # one row first (eval mode: no dropout draw), so a module that cannot take inputs says so
        module.eval()
        with torch.no_grad():
            probe = module(inputs[:1])
    except torch.OutOfMemoryError:
        raise
    except (TypeError, ValueError, RuntimeError, IndexError) as exc:
        raise ValueError(f"module cannot take inputs of shape {tuple(inputs.shape)} and dtype "
                         f"{inputs.dtype} ({type(exc).__name__}: {exc})") from exc
    finally:
        module.train(was_training)
    if not isinstance(probe, Tensor) or tuple(probe.shape) != (1, outputs.shape[1]) or probe.dtype != outputs.dtype:
        raise ValueError(f"module maps inputs to {type(probe).__name__} {tuple(getattr(probe, 'shape', ()))} "
                         f"{getattr(probe, 'dtype', '')} per row, but outputs has rows of shape "
                         f"({outputs.shape[1]},) and dtype {outputs.dtype}")
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    n = inputs.shape[0]
    losses: list[float] = []
    order, pos = torch.randperm(n, generator=gen), 0
    module.train()
    try:
        with torch.enable_grad():
            for _ in range(steps):
                if pos >= n:
                    order, pos = torch.randperm(n, generator=gen), 0
                idx = order[pos:pos + batch_size].to(inputs.device)
                pos += batch_size
                loss = F.mse_loss(module(inputs[idx]), outputs[idx])
                opt.zero_grad()
                loss.backward()
                opt.step()
                losses.append(float(loss.detach()))
    finally:
        module.train(was_training)
    return losses


def replace_fusion_tuned(ffn: FFN, budget: int, *, inputs: Optional[Tensor] = None,
                         outputs: Optional[Tensor] = None, generator: Optional[torch.Generator] = None,
                         steps: int = 100, lr: float = 1e-4, n_init: int = 1, max_iter: int = 30,
                         fused: Optional[nn.Module] = None) -> nn.Module:
    """MLP fusion followed by layer-wise task-specific tuning (Wei et al. 2023, Section 4.4,
    eq. 6) at the level of this block: AdamW (the paper's optimiser, default ``lr`` its
    ``1e-4``) on the MSE between the fused block's and the original block's outputs on
    ``inputs`` (:func:`distill`), ``steps`` steps. The fixed scaling ``P`` stays a buffer,
    so the second layer's gradient is multiplied by it, as in the paper. Needs
    ``inputs``. ``fused``: a module :func:`replace_fusion` returned for this ``ffn`` and
    ``budget``, whose copy is tuned instead of running the k-means again (chapter 7 tunes
    the fusion it also measures untuned); ``generator`` then only orders the minibatches.
    Setting ``{"k": k, "steps": steps}``; the loss curve is ``.losses``."""
    ffn = _check_ffn(ffn)
    budget = _check_budget(ffn, budget)
    x, y = _data(ffn, inputs, outputs, "fusion_tuned", required=True)
    gen = _generator(generator)
    if fused is None:
        module = replace_fusion(ffn, budget, generator=gen, n_init=n_init, max_iter=max_iter)
    elif (not isinstance(fused, nn.Module) or not isinstance(getattr(fused, "setting", None), dict)
          or "k" not in fused.setting or fused.setting["k"] != _dense_width(ffn, budget, "fusion_tuned")):
        raise ValueError("fused must be the module replace_fusion returned for this ffn and budget "
                         f"(setting k = {_dense_width(ffn, budget, 'fusion_tuned')}), got "
                         f"{getattr(fused, 'setting', type(fused).__name__)!r}")
    else:
        module = _copy.deepcopy(fused)
    losses = distill(module, x, y, steps=steps, lr=lr, generator=gen)
    module = _finish(module, ffn, {"k": module.setting["k"], "steps": int(steps)}, budget)
    module.losses = losses
    return module


def _snnk_layer(ffn: FFN, budget: int, gen: torch.Generator, method: str):
    """The ReLU-SNNK layer of ``linear1`` with the most features ``M`` whose bundle
    (``d x M`` weight + ``d`` bias) fits the budget."""
    from kernels.snnk import SNNKLinear

    d = ffn.d_model
    m = (budget - d) // d
    if m < 1:
        raise _too_small(method, budget, 2 * d)
    return SNNKLinear.from_linear(ffn.linear1, "relu", int(m), generator=gen), int(m)


def replace_bundled_snnk(ffn: FFN, budget: int, *, inputs: Optional[Tensor] = None,
                         outputs: Optional[Tensor] = None, generator: Optional[torch.Generator] = None) -> nn.Module:
    """Bundled SNNK (Sehanobish et al. 2024, Sec. 3.3 and App. J.4; chapter 3), data-free:
    the ReLU-SNNK layer of ``linear1`` (:math:`\\omega = \\Psi(W_1, b_1)`, ``M`` arc-cosine
    random features, Sec. 3.2) bundled with ``linear2`` (:func:`kernels.snnk.bundle`):
    :math:`y = \\widehat W\\,\\Phi(x) + b_2` with :math:`\\widehat W = W_2\\,\\Psi(W_1, b_1)`.
    The ReLU-SNNK layer is the paper's replacement of ``Linear + activation``; it estimates
    :math:`\\tfrac12 K_1`, not the FFN's own activation, which is why the paper uptrains
    (chapter 3 measures how far the data-free block is). The URF estimate of GELU is not
    used: its input tower :math:`e^{\\alpha^2\\|x\\|^2/2}` overflows on transformer hidden
    states. ``inputs`` are not used. Parameters :math:`dM + d` (the projections are
    regenerated from a seed), ``M`` the largest that fits; multiply-adds
    :math:`M(d+1) + dM`. Setting ``{"features": M}``."""
    ffn = _check_ffn(ffn)
    budget = _check_budget(ffn, budget)
    from kernels.snnk import bundle

    _data(ffn, inputs, outputs, "bundled_snnk", required=False)
    layer, m = _snnk_layer(ffn, budget, _generator(generator), "bundled_snnk")
    return _finish(bundle([layer, ffn.linear2]), ffn, {"features": m}, budget)


def replace_snnk(ffn: FFN, budget: int, *, inputs: Optional[Tensor] = None, outputs: Optional[Tensor] = None,
                 generator: Optional[torch.Generator] = None, ridge: float = 1e-3) -> nn.Module:
    """SNNK block fitted in closed form (Sehanobish et al. 2024, Sec. 3.3, App. J.3; the
    chapter-3 distillation): the ReLU-SNNK features :math:`\\Phi(x)` of
    :func:`replace_bundled_snnk` and :math:`\\widehat W` (``d x M``) and the bias fitted
    by ridge least squares (:func:`kernels.snnk.least_squares`, float64) of the FFN's
    outputs on the features of its inputs, with :math:`\\lambda` = ``ridge`` times the
    mean feature energy :math:`\\|\\Phi\\|_F^2 / M`, as in chapter 3. Needs ``inputs``;
    no backpropagation. Same parameters and multiply-adds as the bundle. Setting
    ``{"features": M}``."""
    ffn = _check_ffn(ffn)
    budget = _check_budget(ffn, budget)
    from kernels.snnk import bundle, least_squares

    x, y = _data(ffn, inputs, outputs, "snnk", required=True)
    layer, m = _snnk_layer(ffn, budget, _generator(generator), "snnk")
    net = bundle([layer, ffn.linear2])
    with torch.no_grad():
        feats = net.features(x).double()
        lam = float(ridge) * float(feats.pow(2).sum()) / feats.shape[1]
        w, c = least_squares(feats, y.double(), ridge=lam)
        net.weight.copy_(w.to(net.weight.dtype))
        net.bias.copy_(c.to(net.bias.dtype))
    return _finish(net, ffn, {"features": m}, budget)


def _lookup_params(d: int, h: int, tau: int) -> int:
    return d * h * tau + h * (2 ** tau) * d


def replace_lookup(ffn: FFN, budget: int, *, inputs: Optional[Tensor] = None, outputs: Optional[Tensor] = None,
                   generator: Optional[torch.Generator] = None, tau: int = 4, steps: int = 300,
                   lr: float = 3e-3) -> nn.Module:
    """LookupFFN (Zeng et al. 2023; chapter 5) distilled from the FFN: ``h`` tables of
    :math:`2^\\tau` rows (``tau`` bits each) read through a dense projection to ``h tau``
    soft codes (:class:`kernels.lookup.LookupFFN`, scaled weights of eq. 20), trained by
    :func:`distill` (``steps`` AdamW steps, ``lr``) on ``(inputs, outputs)``. Parameters
    :math:`d h \\tau + h 2^\\tau d`; ``h`` the largest that fits. The paper's BH4
    projection holds :math:`4 d_p \\cdot 64` parameters per copy, more than the smaller
    budgets, hence the dense one. Needs ``inputs``. Setting ``{"h": h, "tau": tau}``; the
    loss curve is ``.losses``."""
    ffn = _check_ffn(ffn)
    budget = _check_budget(ffn, budget)
    from kernels.lookup import LookupFFN

    tau = check_positive_int("tau", tau)
    x, y = _data(ffn, inputs, outputs, "lookup", required=True)
    d = ffn.d_model
    h = budget // _lookup_params(d, 1, tau)
    if h < 1:
        raise _too_small("lookup", budget, _lookup_params(d, 1, tau))
    gen = _generator(generator)
    module = LookupFFN(d, int(h), tau, projection="dense", generator=gen, dtype=x.dtype)
    module.losses = distill(module, x, y, steps=steps, lr=lr, generator=gen)
    return _finish(module, ffn, {"h": int(h), "tau": tau, "steps": int(steps)}, budget)


def replace_block_diagonal(ffn: FFN, budget: int, *, inputs: Optional[Tensor] = None,
                           outputs: Optional[Tensor] = None, generator: Optional[torch.Generator] = None,
                           groups: int = 4, steps: int = 300, lr: float = 3e-3) -> nn.Module:
    """Block-diagonal FFN with a channel shuffle (chapter 5's baseline,
    :class:`kernels.lookup.BlockDiagonalFFN`) distilled from the FFN (:func:`distill`).
    Parameters :math:`2dH/g + H + d`; hidden width ``H`` the largest multiple of
    :math:`g^2` (the shuffle needs ``g | H/g``) that fits; ``groups`` must divide ``d``.
    Needs ``inputs``. Setting ``{"hidden": H, "groups": g}``; ``.losses``."""
    ffn = _check_ffn(ffn)
    budget = _check_budget(ffn, budget)
    from kernels.lookup import BlockDiagonalFFN

    g = check_positive_int("groups", groups)
    d = ffn.d_model
    if d % g:
        raise ValueError(f"groups must divide d_model = {d}, got {g}")
    x, y = _data(ffn, inputs, outputs, "block_diagonal", required=True)
    per_unit = 2 * d // g + 1
    hidden = ((budget - d) // per_unit) // (g * g) * (g * g)
    if hidden < g * g:
        raise _too_small("block_diagonal", budget, per_unit * g * g + d)
    gen = _generator(generator)
    module = BlockDiagonalFFN(d, int(hidden), g, generator=gen, dtype=x.dtype)
    module.losses = distill(module, x, y, steps=steps, lr=lr, generator=gen)
    return _finish(module, ffn, {"hidden": int(hidden), "groups": g, "steps": int(steps)}, budget)


def replace_moe_top1(ffn: FFN, budget: int, *, inputs: Optional[Tensor] = None, outputs: Optional[Tensor] = None,
                     generator: Optional[torch.Generator] = None, experts: int = 4, steps: int = 300,
                     lr: float = 3e-3) -> nn.Module:
    """Top-1 mixture of experts (switch-style, chapter 5's baseline,
    :class:`kernels.lookup.Top1MoEFFN`) distilled from the FFN (:func:`distill`).
    Parameters :math:`de + e(2dH_e + H_e + d)`; width per expert ``H_e`` the largest that
    fits. Needs ``inputs``. Setting ``{"experts": e, "hidden_per_expert": H_e}``; ``.losses``."""
    ffn = _check_ffn(ffn)
    budget = _check_budget(ffn, budget)
    from kernels.lookup import Top1MoEFFN

    e = check_positive_int("experts", experts)
    x, y = _data(ffn, inputs, outputs, "moe_top1", required=True)
    d = ffn.d_model
    hd = (budget - 2 * d * e) // (e * (2 * d + 1))
    if hd < 1:
        raise _too_small("moe_top1", budget, 2 * d * e + e * (2 * d + 1))
    gen = _generator(generator)
    module = Top1MoEFFN(d, int(hd), e, generator=gen, dtype=x.dtype)
    module.losses = distill(module, x, y, steps=steps, lr=lr, generator=gen)
    return _finish(module, ffn, {"experts": e, "hidden_per_expert": int(hd), "steps": int(steps)}, budget)


#: The replacement methods of chapter 7, one signature:
#: ``method(ffn, budget, *, inputs=None, outputs=None, generator=None, **options) -> nn.Module``.
REPLACEMENTS: dict[str, Callable[..., nn.Module]] = {
    "original": replace_original,
    "svd": replace_svd,
    "prune": replace_prune,
    "random": replace_random,
    "fusion": replace_fusion,
    "fusion_tuned": replace_fusion_tuned,
    "snnk": replace_snnk,
    "bundled_snnk": replace_bundled_snnk,
    "lookup": replace_lookup,
    "block_diagonal": replace_block_diagonal,
    "moe_top1": replace_moe_top1,
}

#: Methods that need ``inputs`` (they fit or distil on the FFN's outputs).
NEEDS_DATA = ("fusion_tuned", "snnk", "lookup", "block_diagonal", "moe_top1")
