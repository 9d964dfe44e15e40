"""The NTK measures of MLP fusion (Section 4.3, Table 1 of Wei et al., 2023).

Part of :mod:`kernels.fusion` (chapter 6). Here: per-sample gradients with respect to the
MLP parameters (:func:`mlp_gradients`), the SGD NTK :math:`\\langle\\nabla f(x),\\nabla
f(z)\\rangle` (eq. 2, :func:`sgd_kernel`) and the asymmetric sign-GD ("Adam") kernel
:math:`\\langle\\nabla f(x),\\operatorname{sign}\\nabla f(z)\\rangle` (eq. 3,
:func:`sign_kernel`), the kernel error and the FFN output error (:func:`kernel_error`,
:func:`ffn_output_error`) and two scale-invariant measures, the cosine similarity of two
kernel matrices and the error after the best scalar rescale (:func:`kernel_cosine`,
:func:`scaled_kernel_error`).

The SGD kernel restricted to the MLP parameters agrees with :func:`kernels.ntk.empirical_ntk`
of a model whose only trainable parameters are those (tested); :func:`mlp_gradients`
exists because the sign kernel needs the gradients themselves, not only their inner
products, and because it gets all per-sample gradients of a transformer's FFN from one
batched backward pass.
"""

from __future__ import annotations

import math
from typing import Callable, Optional, Sequence

import torch
from torch import Tensor, nn

from kernels._checks import check_callable, check_tensor
from kernels.linear import LowRankLinear
from kernels.fusion.blocks import find_ffn_blocks

__all__ = [
    "mlp_gradients",
    "sgd_kernel",
    "sign_kernel",
    "kernel_error",
    "kernel_cosine",
    "scaled_kernel_error",
    "ffn_output_error",
]

# NTK measures
# --------------------------------------------------------------------------------------


def _linear_parts(lin: nn.Module) -> tuple[Optional[Tensor], Optional[Tensor]]:
    scale = getattr(lin, "scale", None)
    mask = getattr(lin, "mask", None)
    return scale, mask


def mlp_gradients(
    model: nn.Module,
    output_fn: Callable[[nn.Module], Tensor],
    *,
    layers: Optional[Sequence[int]] = None,
) -> Tensor:
    """Per-sample gradients :math:`\\nabla_\\theta f(x_s)` of a scalar-per-sample output
    with respect to the parameters of the FFN blocks ``layers`` (``None``: all):
    ``[W_1, b_1, W_2, b_2]`` of each block, flattened and concatenated (eq. 4).

    ``output_fn(model)`` runs the model on a batch of ``n`` samples and returns ``(n,)``;
    samples must not interact (padding masked). One forward and one backward pass: hooks
    record each FFN linear layer's input :math:`a` and output gradient :math:`g`, and
    since :math:`\\partial f(x_s)/\\partial W = \\sum_t g_{s,t}^T (a_{s,t}\\odot
    \\text{scale})` (times the mask of a pruned layer), every sample's gradient is one
    ``einsum``. Inputs may be ``(n, p)`` or ``(n, T, p)`` (tokens ``t``).

    Returns ``(n, P)`` in the model's dtype (zeros for masked weight entries). Cost one
    forward/backward pass plus :math:`O(nTP)`; memory :math:`O(nP)`. Chapter 6, section
    "Measuring the NTK".
    """
    if not callable(output_fn):
        raise TypeError("output_fn must be a callable taking the model and returning (n,) outputs")
    blocks = find_ffn_blocks(model)
    chosen = list(range(len(blocks))) if layers is None else [int(l) % len(blocks) for l in layers]
    linears = []
    for i in chosen:
        linears += [blocks[i].linear1, blocks[i].linear2]
    records: dict[int, dict[str, Tensor]] = {}
    handles = []

    def hook(idx):
        def fn(mod, inputs, output):
            records[idx] = {"a": inputs[0].detach(), "y": output}

        return fn

    for idx, lin in enumerate(linears):
        handles.append(lin.register_forward_hook(hook(idx)))
    try:
        with torch.enable_grad():
            out = output_fn(model)
            if not isinstance(out, Tensor) or out.ndim != 1:
                raise ValueError(
                    f"output_fn must return a 1-D tensor (one scalar per sample), got "
                    f"{getattr(out, 'shape', type(out).__name__)}"
                )
            ys = [records[i]["y"] for i in range(len(linears))]
            grads = torch.autograd.grad(out.sum(), ys, allow_unused=True)
    finally:
        for h in handles:
            h.remove()
    n = out.shape[0]
    parts = []
    for idx, lin in enumerate(linears):
        a = records[idx]["a"]
        g = grads[idx]
        if g is None:
            g = torch.zeros_like(records[idx]["y"])
        if a.ndim == 2:
            a, g = a[:, None, :], g[:, None, :]
        if isinstance(lin, LowRankLinear):
            # y = (a v^T) u^T + b: dy/du = g^T (a v^T), dy/dv = (g u)^T a
            if lin.u.requires_grad:
                parts.append(torch.einsum("nto,ntr->nor", g, a @ lin.v.detach().T).reshape(n, -1))
            if lin.v.requires_grad:
                parts.append(torch.einsum("ntr,nti->nri", g @ lin.u.detach(), a).reshape(n, -1))
            if lin.bias is not None and lin.bias.requires_grad:
                parts.append(g.sum(1))
            continue
        scale, mask = _linear_parts(lin)
        if scale is not None:
            a = a * scale
        if lin.weight.requires_grad:
            gw = torch.einsum("nto,nti->noi", g, a)
            if mask is not None:
                gw = gw * mask
            parts.append(gw.reshape(n, -1))
        if lin.bias is not None and lin.bias.requires_grad:
            parts.append(g.sum(1))
    if not parts:
        raise ValueError("the chosen FFN blocks have no trainable parameter")
    return torch.cat(parts, dim=1).detach()


def sgd_kernel(g1: Tensor, g2: Optional[Tensor] = None) -> Tensor:
    """SGD NTK (eq. 2) from per-sample gradients: :math:`K_{ij} = \\langle g_1[i],
    g_2[j]\\rangle`. ``g1``: ``(n1, P)``, ``g2``: ``(n2, P)`` (``None``: ``g1``). Returns
    ``(n1, n2)`` in float64. Cost :math:`O(n_1 n_2 P)`."""
    g1 = check_tensor("g1", g1, ndim=2).to(torch.float64)
    g2 = g1 if g2 is None else _check_grads_like(g1, g2).to(torch.float64)
    return g1 @ g2.T


def sign_kernel(g1: Tensor, g2: Optional[Tensor] = None) -> Tensor:
    """Asymmetric sign-GD ("Adam") kernel (eq. 3; Malladi et al. 2022):
    :math:`K_{ij} = \\langle g_1[i], \\operatorname{sign} g_2[j]\\rangle`. Shapes as
    :func:`sgd_kernel`; not symmetric in general."""
    g1 = check_tensor("g1", g1, ndim=2).to(torch.float64)
    g2 = g1 if g2 is None else _check_grads_like(g1, g2).to(torch.float64)
    return g1 @ torch.sign(g2).T


def _check_grads_like(g1: Tensor, g2: object) -> Tensor:
    g2 = check_tensor("g2", g2, ndim=2)
    if g2.shape[1] != g1.shape[1]:
        raise ValueError(f"g1 and g2 must have the same number of parameters, got {g1.shape[1]} and {g2.shape[1]}")
    return g2


def kernel_error(k_ref: Tensor, k_new: Tensor) -> float:
    """NTK approximation error :math:`\\|\\widetilde K - K\\|_F` (the paper's
    ":math:`l_2` difference of the NTK kernel", Table 1)."""
    k_ref = check_tensor("k_ref", k_ref, ndim=2)
    k_new = check_tensor("k_new", k_new, ndim=2)
    if k_ref.shape != k_new.shape:
        raise ValueError(f"k_ref and k_new must have the same shape, got {tuple(k_ref.shape)} and {tuple(k_new.shape)}")
    return float(torch.linalg.norm((k_new.to(torch.float64) - k_ref.to(torch.float64))))


def kernel_cosine(k_ref: Tensor, k_new: Tensor) -> float:
    """Cosine similarity of two kernel matrices, :math:`\\langle K, \\widetilde K\\rangle_F /
    (\\|K\\|_F\\|\\widetilde K\\|_F)` (kernel alignment, Cristianini et al. 2002): 1 when
    :math:`\\widetilde K` is a positive multiple of ``K``, blind to the kernel's overall scale,
    which :func:`kernel_error` is not. Chapter 6, section "Table 1 at our scale"."""
    k_ref = check_tensor("k_ref", k_ref, ndim=2).to(torch.float64)
    k_new = check_tensor("k_new", k_new, ndim=2).to(torch.float64)
    if k_ref.shape != k_new.shape:
        raise ValueError(f"k_ref and k_new must have the same shape, got {tuple(k_ref.shape)} and {tuple(k_new.shape)}")
    denom = float(torch.linalg.norm(k_ref) * torch.linalg.norm(k_new))
    if denom == 0.0:
        raise ValueError("k_ref and k_new must be nonzero")
    return float((k_ref * k_new).sum()) / denom


def scaled_kernel_error(k_ref: Tensor, k_new: Tensor) -> float:
    """Relative error after the best scalar rescale, :math:`\\min_c \\|c\\widetilde K -
    K\\|_F / \\|K\\|_F = \\sqrt{1 - \\cos^2}` with :math:`\\cos` = :func:`kernel_cosine`
    (the optimal :math:`c = \\langle K, \\widetilde K\\rangle_F / \\|\\widetilde K\\|_F^2`):
    the part of the kernel error that a change of learning rate cannot undo."""
    cos = kernel_cosine(k_ref, k_new)
    return math.sqrt(max(0.0, 1.0 - cos * cos))


def ffn_output_error(
    ffn_ref: Callable[[Tensor], Tensor],
    ffn_new: Callable[[Tensor], Tensor],
    x: Tensor,
    mask: Optional[Tensor] = None,
) -> float:
    """Output error of a compressed FFN on the same inputs: the mean over samples of
    :math:`\\|\\widetilde H - H\\|_F` over the sample's real tokens (Table 1, "Output").

    ``x``: ``(n, T, p)`` FFN inputs (or ``(n, p)``); ``mask``: ``(n, T)`` 1 for real
    tokens (``None``: all). Returns a float.
    """
    check_callable("ffn_ref", ffn_ref)
    check_callable("ffn_new", ffn_new)
    x = check_tensor("x", x, ndim=(2, 3))
    if x.ndim == 2:
        x = x[:, None, :]
    if mask is None:
        mask = torch.ones(x.shape[:2], dtype=x.dtype, device=x.device)
    else:
        check_tensor("mask", mask, floating=False)
        if tuple(mask.shape) != tuple(x.shape[:2]):
            raise ValueError(f"mask must have shape {tuple(x.shape[:2])}, got {tuple(mask.shape)}")
        if mask.device != x.device:
            raise ValueError(f"mask must be on x's device {x.device}, got {mask.device}")
    outs = []
    with torch.no_grad():
        for name, ffn in (("ffn_new", ffn_new), ("ffn_ref", ffn_ref)):
            try:
                out = ffn(x)
            except torch.OutOfMemoryError:
                raise
            except (TypeError, ValueError, RuntimeError, IndexError) as exc:
                raise ValueError(f"{name} cannot take x of shape {tuple(x.shape)} and dtype {x.dtype} "
                                 f"({type(exc).__name__}: {exc})") from exc
            if not isinstance(out, Tensor) or out.ndim != 3 or tuple(out.shape[:2]) != tuple(x.shape[:2]):
                raise ValueError(f"{name} must map x (n, T, p) to (n, T, p'), got "
                                 f"{tuple(getattr(out, 'shape', ())) or type(out).__name__}")
            outs.append(out)
        new, ref = outs
        if new.shape != ref.shape:
            raise ValueError(f"ffn_new and ffn_ref must give outputs of one shape, got {tuple(new.shape)} "
                             f"and {tuple(ref.shape)}")
        diff = (new - ref).to(torch.float64) * mask[..., None].to(torch.float64)
        return float(diff.pow(2).sum(dim=(1, 2)).sqrt().mean())
