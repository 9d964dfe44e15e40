"""The empirical NTK :math:`\\hat\\Theta(x, x') = J(x) J(x')^\\top` of any torch model
(:func:`empirical_ntk`): the dispatch between its methods and the generic ``"jacobian"`` and
``"jvp"`` paths (``torch.func``), with the per-layer Jacobian blocks of ``nn.Linear`` layers.

Part of :mod:`kernels.ntk`, chapter 1 (``chapters/01_ntk.ipynb``), section "The empirical
NTK"; the ``"gram"`` method lives in :mod:`kernels.ntk.gram`.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch
from torch import Tensor, nn
from torch.func import functional_call, jacrev, jvp, vjp, vmap

from kernels._checks import call_user_code, check_choice, check_positive_int, check_same_feature_dim, check_tensor
from kernels.ntk.network import NTKLinear
from kernels.ntk.onednn import _gemm_nt
from kernels.ntk.gram import (
    _activation_and_derivative,
    _call_model,
    _gram_layers,
    _layer_scales,
    _linear_gram,
    _linear_gram_owners,
    _linear_records,
    _ntk_gram,
    _SampleAxisError,
)

__all__ = [
    "empirical_ntk",
    "EMPIRICAL_NTK_METHODS",
]


#: Methods accepted by :func:`empirical_ntk`.
EMPIRICAL_NTK_METHODS = ("auto", "jacobian", "jvp", "gram")



# --------------------------------------------------------------------------------------
# Empirical NTK
# --------------------------------------------------------------------------------------


def empirical_ntk(
    model: nn.Module,
    x1: Tensor,
    x2: Optional[Tensor] = None,
    *,
    method: str = "auto",
    trace_outputs: bool = False,
    chunk_size: Optional[int] = None,
) -> Tensor:
    """Empirical (finite-width) NTK :math:`\\hat\\Theta(x, x') = J(x)\\,J(x')^\\top`.

    :math:`J(x) = \\partial f(x;\\theta)/\\partial\\theta` is the Jacobian of the model
    output with respect to all *trainable* parameters (``requires_grad=True``) at their
    current values (Jacot et al. 2018, eq. 4; slides, "Arbitrary function f for MSE
    loss"). Derived in chapter 1 (chapters/01_ntk.ipynb), section "The empirical NTK".

    Shapes. ``x1``: ``(n1, d)``, ``x2``: ``(n2, d)`` (``None``: ``x2 = x1``, and the
    symmetry is exploited). If the model returns one scalar per sample (output ``(n,)``
    or ``(n, 1)``) the result is ``(n1, n2)``. For ``k`` outputs per sample (``(n, k)``)
    the result is ``(n1, n2, k, k)`` with entry ``[i, j, a, b] = <df_a(x_i)/dθ,
    df_b(x'_j)/dθ>`` (neural-tangents ``empirical_ntk_fn(..., trace_axes=())``), or
    ``(n1, n2)`` holding the trace :math:`\\sum_a \\hat\\Theta_{aa}` when
    ``trace_outputs=True``. neural-tangents' default ``trace_axes=(-1,)`` returns the
    *mean* :math:`\\frac1k\\sum_a \\hat\\Theta_{aa}` instead, i.e. this trace divided by
    ``k``; the mean is the per-output kernel that :func:`fc_kernel` and
    :func:`gd_mse_predictor` expect. The result is detached from the autograd graph, on
    the model's device, in the model's dtype.

    Methods (``P`` parameters, ``k`` outputs):

    * ``"jacobian"``: explicit per-sample Jacobians, contracted (Novak et al. 2022,
      "implementation 1"). For the ``weight`` and ``bias`` of every ``nn.Linear``/
      :class:`NTKLinear` layer the rows :math:`\\partial f_a(x_i)/\\partial W = s_W
      \\sum_t g_{a,i,t}\\,a_{i,t}^\\top` come from one hooked forward pass (layer inputs
      :math:`a`) and ``k`` backward passes (output gradients :math:`g`); they are
      formed a few weight rows at a time (8 MiB blocks) and each block is contracted at
      once with one GEMM, only the row blocks on and above the diagonal when ``x2`` is
      None. Every other trainable parameter -- and all of them when the hooks cannot be
      trusted (a layer's parameter also used outside its ``forward``, detected by
      comparing gradients; samples folded into a layer's first axis) -- goes through
      ``torch.func.vmap(jacrev(...))`` over :func:`torch.func.functional_call`.
      :math:`O(k)` backward passes, :math:`O((n_1 + n_2) k P)` to form and
      :math:`O(n_1 n_2 k^2 P)` to contract; memory for the per-layer parameters: the
      recorded activations, two blocks and the result. For the ``torch.func``
      parameters :math:`O((n_1 + n_2) k P)`, or :math:`O(2\\,c\\,k P)` with
      ``chunk_size=c`` (samples per block; the ``x2`` blocks are recomputed for each
      ``x1`` block); ``chunk_size`` does not change the per-layer path.
    * ``"jvp"``: NTK-vector products (the torch.func NTK tutorial; Novak et al. 2022,
      "implementation 2"): for each sample :math:`x_i` and output :math:`a` a VJP gives
      the direction :math:`J_a(x_i)^\\top` and a JVP of the model at ``x2`` along it
      gives the row block :math:`J(x_2) J_a(x_i)^\\top`, i.e. :math:`\\hat\\Theta(x_i, x_2)_{a,:}`.
      The ``c k`` directions of a block of ``c`` samples are formed at once (per layer
      from the hooked records as in ``"jacobian"``, by ``torch.func.vjp`` for other
      parameters) and pushed forward together: by a hand-written batched JVP for an
      ``nn.Sequential`` of linear layers and elementwise activations, by
      ``vmap(torch.func.jvp)`` otherwise. With ``x2=None`` each block only needs the
      columns from its own first sample on. :math:`J(x_2)` is never formed and
      :math:`J(x_1)` only ``c`` samples at a time (``c = chunk_size``, default at most
      16 for the Sequential JVP and 32 otherwise, fewer if ``c k P`` entries would
      exceed 1 GiB): memory :math:`O(c k P)`, time :math:`O(n_1 k\\,n_2 P)` (the
      forward-mode passes) with no contraction over ``P``.
    * ``"gram"``: for an ``nn.Sequential`` of ``nn.Linear``/:class:`NTKLinear` layers and
      elementwise activations. A layer :math:`z_l = s_W A_{l-1} W_l^\\top + s_b b_l`
      contributes :math:`(s_W^2\\, A_{l-1} A'^\\top_{l-1} + s_b^2) \\odot
      (\\Delta_l \\Delta'^\\top_l)`, where :math:`A` are the layer inputs and
      :math:`\\Delta_l = \\partial f/\\partial z_l` the back-propagated output gradients
      (one per output index), since :math:`\\partial f/\\partial W_l = s_W
      \\Delta_l^\\top A_{l-1}`. One batched forward and backward pass and Gram
      products: :math:`O(k\\,n\\sum_l w_l^2 + k^2 n_1 n_2 \\sum_l w_l)`, no per-parameter
      Jacobian. This is the fast path.
      Any other model whose trainable parameters all belong to ``nn.Linear`` layers
      (frozen layers of any kind around them) takes the same Gram route through forward
      hooks (:func:`linear_gram_ntk`).
    * ``"auto"``: ``"gram"`` when the model has that structure, else ``"jacobian"``.

    Args:
        model: any ``nn.Module`` mapping ``(n, d)`` to ``(n,)`` or ``(n, k)``; samples
            must not interact (no batch statistics).
        x1, x2: inputs with the model's dtype and device.
        method: one of ``"auto"``, ``"jacobian"``, ``"jvp"``, ``"gram"``.
        trace_outputs: sum the diagonal output pairs (see above).
        chunk_size: samples of ``x1`` per block for ``"jvp"``, and of ``x1`` and ``x2``
            for the ``torch.func`` part of ``"jacobian"``; ignored by ``"gram"`` and by
            the per-layer part of ``"jacobian"`` (bounded by its column blocks).

    Raises:
        TypeError: non-module model, non-tensor or integer inputs, dtype different from
            the model's.
        ValueError: wrong rank, NaN/inf, mismatched feature dimensions, device mismatch,
            no trainable parameter, unsupported output shape, ``method="gram"`` on an
            unsupported architecture.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    method = check_choice("method", method, EMPIRICAL_NTK_METHODS)
    if not isinstance(trace_outputs, bool):
        raise TypeError(f"trace_outputs must be a bool, got {trace_outputs!r}")
    if chunk_size is not None:
        chunk_size = check_positive_int("chunk_size", chunk_size)
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    if not params:
        raise ValueError("model has no trainable parameter (requires_grad=True)")
    ref = next(iter(params.values()))
    x1 = _check_model_input("x1", x1, ref)
    if x2 is not None:
        x2 = _check_model_input("x2", x2, ref)
        check_same_feature_dim("x1", x1, "x2", x2)

    out_shape = _probe_output_shape(model, x1)
    k = 1 if len(out_shape) == 0 else out_shape[0]

    if method in ("auto", "gram"):
        layers = _gram_layers(model)
        if not isinstance(layers, str):
            with torch.no_grad():
                theta = _ntk_gram(layers, x1, x2, k, trace_outputs)
            return theta
        linears = _linear_gram_owners(model)
        if not isinstance(linears, str):
            theta = _linear_gram(model, linears, _call_model, x1, x2, trace_outputs)
            return theta.to(ref.dtype)
        if method == "gram":
            raise ValueError(
                "method='gram' needs every trainable parameter in an nn.Linear/NTKLinear "
                f"layer: {linears}. Use method='jacobian' or 'jvp'."
            )
        method = "jacobian"

    if method == "jacobian":
        theta = _ntk_jacobian(model, params, x1, x2, out_shape, chunk_size)
    else:
        theta = _ntk_jvp(model, params, x1, x2, out_shape, chunk_size)
    # theta: (n1, n2, k, k)
    if k == 1:
        return theta[:, :, 0, 0]
    if trace_outputs:
        return torch.diagonal(theta, dim1=2, dim2=3).sum(-1)
    return theta



def _check_model_input(name: str, x: object, ref: Tensor) -> Tensor:
    x = check_tensor(name, x, ndim=2)
    if x.dtype != ref.dtype:
        raise TypeError(
            f"{name} has dtype {x.dtype} but the model's parameters are {ref.dtype}; "
            f"convert with {name}.to({ref.dtype})"
        )
    if x.device != ref.device:
        raise ValueError(
            f"{name} is on {x.device} but the model's parameters are on {ref.device}; "
            f"move it with {name}.to({str(ref.device)!r})"
        )
    if x.shape[0] == 0:
        raise ValueError(f"{name} must hold at least one sample, got shape {tuple(x.shape)}")
    return x



def _probe_output_shape(model: nn.Module, x1: Tensor) -> tuple[int, ...]:
    """Per-sample output shape: ``()`` for a scalar, ``(k,)`` for a vector."""
    with torch.no_grad():
        out = call_user_code(f"model(x1) with x1 of shape {tuple(x1.shape)}", model, x1[:1])
    if not isinstance(out, Tensor) or out.ndim not in (1, 2) or out.shape[0] != 1:
        shape = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
        raise ValueError(
            "model must map (n, d) inputs to (n,) or (n, k) outputs; on one sample it "
            f"returned {shape}"
        )
    if out.ndim == 1 or out.shape[1] == 1:
        return ()
    return (out.shape[1],)



# ---- "jacobian" and "jvp": generic torch.func paths -----------------------------------


def _substitution_names(model: nn.Module, names: list[str]) -> dict[str, str]:
    """Map every (module, attribute) slot holding one of the parameters ``names`` (as
    listed by ``named_parameters()``) to that canonical name.

    ``functional_call`` must swap each slot exactly once: a module registered twice
    (``Sequential(layer, act, layer)``) swapped under both names is not restored
    (torch 2.13 leaves plain tensors in it), while two modules sharing one Parameter
    (tied weights) must both be swapped. Hence ``tie_weights=False`` with one entry
    per distinct slot.
    """
    canonical = dict(model.named_parameters())
    wanted = {id(canonical[n]): n for n in names}
    out: dict[str, str] = {}
    seen: set[tuple[int, str]] = set()
    for name, param in model.named_parameters(remove_duplicate=False):
        if id(param) not in wanted:
            continue
        owner_path, _, attr = name.rpartition(".")
        slot = (id(model.get_submodule(owner_path)), attr)
        if slot in seen:
            continue
        seen.add(slot)
        out[name] = wanted[id(param)]
    return out



def _call_with(model: nn.Module, slots: dict[str, str], params: dict[str, Tensor], x: Tensor):
    """``model(x)`` with ``params`` (keyed by canonical name) swapped in."""
    swapped = {slot: params[name] for slot, name in slots.items()}
    return functional_call(model, swapped, (x,), tie_weights=False)



def _functional_model(model: nn.Module, params: dict[str, Tensor]):
    """``f(params, x) -> (n, k)`` with the frozen tensors taken from ``model``."""
    slots = _substitution_names(model, list(params))

    def f(p: dict[str, Tensor], x: Tensor) -> Tensor:
        out = _call_with(model, slots, p, x)
        return out.reshape(x.shape[0], -1)

    return f



#: Bytes of per-sample Jacobians / NTK directions that one block of the generic
#: ``torch.func`` paths may hold when ``chunk_size`` is None. 1 GiB: a 256-sample
#: Jacobian of the benchmark's 0.56 M-parameter MLP (573 MB) fits in one block; at
#: 256 MiB it was split into three and recomputed per block pair, 1.35x slower
#: (measured, one thread).
_BLOCK_BYTES = 1 << 30



#: Most samples of ``x1`` per block in the ``"jvp"`` method (``torch.func`` JVP, and
#: the hand-written JVP of :func:`_sequential_tangents`: smaller blocks skip more of the
#: symmetric half, larger ones make larger GEMMs; 16 was fastest of 8-64, one thread).
_JVP_MAX_CHUNK = 32



_SEQUENTIAL_JVP_MAX_CHUNK = 16



#: Bytes of one block of Jacobian columns in the per-layer ``"jacobian"`` path (per
#: input set): the columns of a few output rows of one ``nn.Linear`` weight. Small
#: enough to be contracted while it is still in cache, large enough for the GEMM to
#: run at full speed (see ``benchmarks/bench_ntk.py``).
_LAYER_BLOCK_BYTES = 8 << 20



#: Row blocks of the symmetric (``x2=None``) contraction: blocks on and above the
#: diagonal only, :math:`(b + 1)/(2b)` of the full product's work.
_SYM_ROW_BLOCKS = 4



def _default_chunk(n_params: int, k: int, itemsize: int, cap: int) -> int:
    """Samples per block so that ``c k P`` entries fit in :data:`_BLOCK_BYTES` (at least 1)."""
    return max(1, min(cap, _BLOCK_BYTES // max(1, n_params * k * itemsize)))



class _LinearParts(NamedTuple):
    """An ``nn.Linear``/:class:`NTKLinear` layer and the canonical names of those of its
    trainable parameters whose Jacobian is formed from the layer's inputs and output
    gradients (``None``: not trainable, or left to ``torch.func``)."""

    path: str
    module: nn.Module
    weight: Optional[str]
    bias: Optional[str]



def _split_linear_parameters(
    model: nn.Module, params: dict[str, Tensor]
) -> tuple[list[_LinearParts], dict[str, Tensor]]:
    """Split the trainable ``params`` into per-layer ones and the rest.

    A parameter takes the per-layer path when its only holder is one ``nn.Linear`` or
    :class:`NTKLinear` (exact types, so a subclass with its own ``forward`` does not)
    as its ``weight`` or ``bias``; that layer may be called several times. A parameter
    held by two modules (tied weights) or by any other module stays with ``torch.func``.
    """
    holders: dict[int, dict[tuple[int, str], tuple[str, nn.Module]]] = {}
    for full, p in model.named_parameters(remove_duplicate=False):
        path, _, attr = full.rpartition(".")
        module = model.get_submodule(path)
        holders.setdefault(id(p), {})[(id(module), attr)] = (path, module)
    layers: dict[int, _LinearParts] = {}
    rest: dict[str, Tensor] = {}
    for name, p in params.items():
        slots = holders.get(id(p), {})
        if len(slots) == 1:
            ((mod_id, attr), (path, module)) = next(iter(slots.items()))
            if type(module) in (nn.Linear, NTKLinear) and attr in ("weight", "bias"):
                entry = layers.get(mod_id, _LinearParts(path, module, None, None))
                layers[mod_id] = entry._replace(**{attr: name})
                continue
        rest[name] = p
    return list(layers.values()), rest



def _weight_rows(rec: tuple[Tensor, Tensor], s_w: float, o0: int, o1: int, i0: int, i1: int,
                 out: Optional[Tensor] = None) -> Tensor:
    """Per-sample Jacobian of outputs ``o0:o1`` of a linear layer's weight, samples
    ``i0:i1``: :math:`\\partial f_a(x_i)/\\partial W_{o,:} = s_W\\sum_t g_{a,i,t,o}\\,
    a_{i,t,:}` (chapter 1, "The empirical NTK"), as ``(c, k, o1 - o0, d_in)``.

    One token: a broadcast product written straight into ``out`` (torch.func's batched
    outer products are matmuls with an inner dimension of 1, several times slower);
    several tokens or calls: one batched matmul over the samples."""
    a, g = rec
    k, _, t, _ = g.shape
    c, r, d_in = i1 - i0, o1 - o0, a.shape[-1]
    gs = g[:, i0:i1, :, o0:o1]  # (k, c, T, r)
    if s_w != 1.0:
        gs = gs * s_w
    if out is None:
        out = torch.empty(c * k * r * d_in, dtype=a.dtype, device=a.device)
    out = out[: c * k * r * d_in].view(c, k, r, d_in)
    if t == 1:
        torch.mul(gs[:, :, 0, :].permute(1, 0, 2)[..., None], a[i0:i1, 0, None, None, :], out=out)
    else:
        lhs = gs.permute(1, 0, 3, 2).reshape(c, k * r, t)
        torch.bmm(lhs, a[i0:i1], out=out.view(c, k * r, d_in))
    return out



def _bias_rows(rec: tuple[Tensor, Tensor], s_b: float, i0: int, i1: int) -> Tensor:
    """Per-sample Jacobian of a linear layer's bias, ``(c, k, d_out)``:
    :math:`s_b\\sum_t g_{a,i,t,:}`."""
    _, g = rec
    return (g[:, i0:i1].sum(2) * s_b).permute(1, 0, 2)



def _checked_layer_records(
    model: nn.Module, parts: list[_LinearParts], params: dict[str, Tensor], x: Tensor
) -> Optional[list[Optional[tuple[Tensor, Tensor]]]]:
    """Inputs and output gradients of every per-layer linear layer on ``x`` (see
    :func:`_linear_records`), or ``None`` when they cannot be trusted: a layer saw a
    leading dimension other than the samples, or the gradient of the summed outputs
    with respect to a per-layer parameter differs from the one the records give (the
    parameter is also used outside its layer's ``forward``, e.g. ``F.linear(h,
    layer.weight)``, which hooks cannot see)."""
    names = [nm for pt in parts for nm in (pt.weight, pt.bias) if nm is not None]
    try:
        records, _, _, grads = _linear_records(
            model, [(pt.path, pt.module) for pt in parts], _call_model, x,
            tuple(params[nm] for nm in names),
        )
    except _SampleAxisError:
        return None
    by_name = dict(zip(names, grads))
    # The two sums differ only in rounding: about 5e-7 of the largest entry in float32 on
    # MLPs of width 128-1024 with 64-1024 samples (measured); 1000 eps leaves a wide
    # margin while a use outside the hooks changes the gradient by far more.
    tol = min(1000.0 * torch.finfo(x.dtype).eps, 0.05)
    with torch.no_grad():
        for pt, rec in zip(parts, records):
            s_w, s_b = _layer_scales(pt.module)
            for nm, kind in ((pt.weight, "weight"), (pt.bias, "bias")):
                if nm is None:
                    continue
                got = by_name[nm]
                if rec is None:
                    expected = torch.zeros_like(got)
                elif kind == "weight":
                    a, g = rec
                    expected = s_w * torch.einsum("knto,nti->oi", g, a)
                else:
                    expected = s_b * rec[1].sum((0, 1, 2))
                scale = max(got.abs().max().item(), expected.abs().max().item())
                if (got - expected).abs().max().item() > tol * scale:
                    return None
    return records



def _layer_jacobian_ntk(
    parts: list[_LinearParts],
    rec1: list[Optional[tuple[Tensor, Tensor]]],
    rec2: Optional[list[Optional[tuple[Tensor, Tensor]]]],
    n1: int,
    n2: int,
    k: int,
    like: Tensor,
) -> Tensor:
    """:math:`\\sum_{\\text{blocks}} J_1 J_2^\\top` over the per-layer parameters, as a
    flat ``(n1 k, n2 k)`` matrix with rows ``(i, a)`` (``rec2=None``: ``x2 = x1``).

    The explicit per-sample Jacobian (Jacot et al. 2018, eq. 4) is formed in blocks of
    columns -- a few output rows of one weight, at most :data:`_LAYER_BLOCK_BYTES` per
    input set -- and each block is contracted at once with one GEMM (``x2=None``: only
    the row blocks on and above the diagonal, 5/8 of the work with 4 blocks).
    Memory: two blocks and the result; time :math:`O((n_1 + n_2) k P)` to form and
    :math:`O(n_1 n_2 k^2 P)` to contract."""
    sym = rec2 is None
    n_rows = n1 * k
    theta = torch.zeros(n_rows, n2 * k, dtype=like.dtype, device=like.device)
    n_blocks = _SYM_ROW_BLOCKS if (sym and n_rows >= 16 * _SYM_ROW_BLOCKS) else 1
    edges = [round(i * n_rows / n_blocks) for i in range(n_blocks + 1)]
    itemsize = like.element_size()
    buf1: Optional[Tensor] = None
    buf2: Optional[Tensor] = None

    def accumulate(b1: Tensor, b2: Optional[Tensor]) -> None:
        if b2 is None:
            for r0, r1 in zip(edges[:-1], edges[1:]):
                theta[r0:r1, r0:] += _gemm_nt(b1[r0:r1], b1[r0:])
        else:
            theta.add_(_gemm_nt(b1, b2))

    for idx, pt in enumerate(parts):
        r1_ = rec1[idx]
        r2_ = None if sym else rec2[idx]
        if r1_ is None or (not sym and r2_ is None):
            continue  # the layer never ran on one input set: its Jacobian is zero there
        s_w, s_b = _layer_scales(pt.module)
        if pt.weight is not None:
            d_out, d_in = r1_[1].shape[-1], r1_[0].shape[-1]
            row_bytes = max(n1, n2) * k * d_in * itemsize
            rows = max(1, min(d_out, _LAYER_BLOCK_BYTES // max(1, row_bytes)))
            numel = max(n1, n2) * k * rows * d_in
            if buf1 is None or buf1.numel() < numel:
                buf1 = torch.empty(numel, dtype=like.dtype, device=like.device)
                buf2 = None if sym else torch.empty_like(buf1)
            for o0 in range(0, d_out, rows):
                o1 = min(o0 + rows, d_out)
                b1 = _weight_rows(r1_, s_w, o0, o1, 0, n1, buf1).reshape(n_rows, -1)
                b2 = None
                if not sym:
                    b2 = _weight_rows(r2_, s_w, o0, o1, 0, n2, buf2).reshape(n2 * k, -1)
                accumulate(b1, b2)
        if pt.bias is not None and s_b != 0.0:
            b1 = _bias_rows(r1_, s_b, 0, n1).reshape(n_rows, -1)
            b2 = None if sym else _bias_rows(r2_, s_b, 0, n2).reshape(n2 * k, -1)
            accumulate(b1, b2)
    if sym:
        for r0, r1 in zip(edges[:-1], edges[1:]):
            theta[r1:, r0:r1] = theta[r0:r1, r1:].T
    return theta



def _unflatten_ntk(theta: Tensor, n1: int, n2: int, k: int) -> Tensor:
    """``(n1 k, n2 k)`` with rows ``(i, a)`` -> ``(n1, n2, k, k)``."""
    return theta.reshape(n1, k, n2, k).permute(0, 2, 1, 3).contiguous()



def _ntk_jacobian(
    model: nn.Module,
    params: dict[str, Tensor],
    x1: Tensor,
    x2: Optional[Tensor],
    out_shape: tuple[int, ...],
    chunk_size: Optional[int],
) -> Tensor:
    """``"jacobian"``: explicit per-sample Jacobians, contracted. The weights and biases
    of ``nn.Linear``/:class:`NTKLinear` layers get their Jacobian rows from one hooked
    forward and ``k`` backward passes (:func:`_layer_jacobian_ntk`); every other
    trainable parameter (and all of them when the hooks cannot be trusted, see
    :func:`_checked_layer_records`) from ``torch.func`` (:func:`_func_jacobian_ntk`)."""
    k = 1 if not out_shape else out_shape[0]
    n1 = x1.shape[0]
    n2 = n1 if x2 is None else x2.shape[0]
    parts, rest = _split_linear_parameters(model, params)
    theta: Optional[Tensor] = None
    if parts:
        rec1 = _checked_layer_records(model, parts, params, x1)
        rec2 = None
        if rec1 is not None and x2 is not None:
            rec2 = _checked_layer_records(model, parts, params, x2)
        if rec1 is None or (x2 is not None and rec2 is None):
            rest = params
        else:
            with torch.no_grad():
                flat = _layer_jacobian_ntk(parts, rec1, rec2, n1, n2, k, x1)
            theta = _unflatten_ntk(flat, n1, n2, k)
    if rest:
        other = _func_jacobian_ntk(model, rest, x1, x2, out_shape, chunk_size)
        theta = other if theta is None else theta + other
    return theta



def _func_jacobian_ntk(
    model: nn.Module,
    params: dict[str, Tensor],
    x1: Tensor,
    x2: Optional[Tensor],
    out_shape: tuple[int, ...],
    chunk_size: Optional[int],
) -> Tensor:
    """Jacobian contraction for the parameters ``params`` by ``torch.func``:
    ``vmap(jacrev)`` per sample block, one contraction per parameter tensor."""
    detached = {n: p.detach() for n, p in params.items()}
    f = _functional_model(model, detached)
    k = 1 if not out_shape else out_shape[0]
    n_params = sum(p.numel() for p in detached.values())

    def f_single(p: dict[str, Tensor], x: Tensor) -> Tensor:
        return f(p, x.unsqueeze(0))[0]  # (k,)

    jac_fn = vmap(jacrev(f_single), in_dims=(None, 0))

    def jacobians(x: Tensor) -> list[Tensor]:
        jac = jac_fn(detached, x)  # name -> (n, k, *param.shape)
        return [j.reshape(x.shape[0], k, -1) for j in jac.values()]

    def contract(j1: list[Tensor], j2: list[Tensor]) -> Tensor:
        out = None
        for a, b in zip(j1, j2):
            term = torch.einsum("iap,jbp->ijab", a, b)
            out = term if out is None else out + term
        return out

    xb = x1 if x2 is None else x2
    n1, n2 = x1.shape[0], xb.shape[0]
    # Two blocks of Jacobians live at once; without chunk_size they are bounded by
    # _BLOCK_BYTES each (the whole batch in one block when it fits).
    chunk = chunk_size or _default_chunk(n_params, k, x1.element_size(), max(n1, n2))
    with torch.no_grad():
        if chunk >= max(n1, n2):
            j1 = jacobians(x1)
            if x2 is not None:
                return contract(j1, jacobians(x2))
            # x2 = x1: the contraction (O(n^2 k^2 P), the dominant cost) only for the
            # row blocks on or above the diagonal, mirrored: 5/8 of the work with 4 blocks.
            n_blocks = 4 if n1 >= 64 else 1
            edges = [round(i * n1 / n_blocks) for i in range(n_blocks + 1)]
            theta = torch.empty(n1, n1, k, k, dtype=x1.dtype, device=x1.device)
            for b in range(n_blocks):
                r0, r1 = edges[b], edges[b + 1]
                rows = [j[r0:r1] for j in j1]
                block = contract(rows, [j[r0:] for j in j1])  # (r1 - r0, n1 - r0, k, k)
                theta[r0:r1, r0:] = block
                theta[r1:, r0:r1] = block[:, r1 - r0 :].permute(1, 0, 3, 2)
            return theta
        theta = torch.empty(n1, n2, k, k, dtype=x1.dtype, device=x1.device)
        for i0 in range(0, n1, chunk):
            i1 = min(i0 + chunk, n1)
            j1 = jacobians(x1[i0:i1])
            # x2 = x1: the NTK is symmetric, so only blocks on or above the diagonal.
            for j0 in range(i0 if x2 is None else 0, n2, chunk):
                j1_ = min(j0 + chunk, n2)
                j2 = j1 if (x2 is None and j0 == i0) else jacobians(xb[j0:j1_])
                block = contract(j1, j2)
                theta[i0:i1, j0:j1_] = block
                if x2 is None and j0 != i0:
                    theta[j0:j1_, i0:i1] = block.permute(1, 0, 3, 2)
        return theta



def _ntk_jvp(
    model: nn.Module,
    params: dict[str, Tensor],
    x1: Tensor,
    x2: Optional[Tensor],
    out_shape: tuple[int, ...],
    chunk_size: Optional[int],
) -> Tensor:
    """``"jvp"``: NTK-vector products. For each block of ``c`` samples of ``x1`` the
    directions :math:`J(x_i)^\\top e_a` (VJPs) are formed for all ``c k`` cotangents at
    once -- from the hooked layer inputs and output gradients for ``nn.Linear``
    parameters (the rows of :func:`_weight_rows`), by ``torch.func.vjp`` for every other
    parameter -- and pushed forward through the model at ``x2`` in one batched JVP:
    :math:`J(x_2) J(x_i)^\\top e_a = \\hat\\Theta(x_i, x_2)_{a,:}`. For an
    ``nn.Sequential`` of linear layers and elementwise activations the JVP is
    hand-written (:func:`_sequential_tangents`, GEMMs through :func:`_gemm_nt`);
    otherwise ``torch.func.jvp`` under ``vmap``."""
    detached = {n: p.detach() for n, p in params.items()}
    xb = x1 if x2 is None else x2
    n1, n2 = x1.shape[0], xb.shape[0]
    k = 1 if not out_shape else out_shape[0]
    n_params = sum(p.numel() for p in detached.values())
    eye = torch.eye(k, dtype=x1.dtype, device=x1.device)

    parts, rest = _split_linear_parameters(model, params)
    records = _checked_layer_records(model, parts, params, x1) if parts else None
    if records is None:
        parts, rest = [], params
    rest_detached = {n: detached[n] for n in rest}
    f = _functional_model(model, detached)
    f_rest = _functional_model(model, rest_detached) if rest else None
    seq_layers = _gram_layers(model) if not rest else "parameters outside linear layers"
    cap = _JVP_MAX_CHUNK if isinstance(seq_layers, str) else _SEQUENTIAL_JVP_MAX_CHUNK
    chunk = chunk_size or _default_chunk(n_params, k, x1.element_size(), cap)

    def cotangent_directions(x_i: Tensor) -> dict[str, Tensor]:
        # VJPs of one sample's k outputs: J(x_i)^T e_a, parameter-shaped, (k, *shape).
        # One sample at a time, so that a one-hot cotangent does not pay for a
        # backward pass through the whole batch.
        _, vjp_fn = vjp(lambda p: f_rest(p, x_i.unsqueeze(0))[0], rest_detached)
        return vmap(vjp_fn)(eye)[0]

    # Direction buffers reused by every block: a fresh multi-MB tensor per block costs
    # more in page faults than the products written into it (measured: 19 ms vs 3 ms
    # for one 32 MiB block of the benchmark's MLP).
    buffers: dict[str, Tensor] = {}

    def layer_directions(i0: int, i1: int) -> dict[str, Tensor]:
        out: dict[str, Tensor] = {}
        d = (i1 - i0) * k
        for pt, rec in zip(parts, records):
            s_w, s_b = _layer_scales(pt.module)
            for nm, kind in ((pt.weight, "weight"), (pt.bias, "bias")):
                if nm is None:
                    continue
                shape = detached[nm].shape
                if rec is None or (kind == "bias" and s_b == 0.0):
                    out[nm] = torch.zeros((d,) + shape, dtype=x1.dtype, device=x1.device)
                elif kind == "weight":
                    if nm not in buffers:
                        buffers[nm] = torch.empty(
                            chunk * k * shape.numel(), dtype=x1.dtype, device=x1.device
                        )
                    rows = _weight_rows(rec, s_w, 0, shape[0], i0, i1, buffers[nm])
                    out[nm] = rows.view((d,) + shape)
                else:
                    out[nm] = _bias_rows(rec, s_b, i0, i1).reshape((d,) + shape)
        return out

    def ntk_rows(direction: dict[str, Tensor], x: Tensor) -> Tensor:
        # JVP of the model at x along J(x_i)^T e_a: the row block Theta(x_i, x)[a, :].
        return jvp(lambda p: f(p, x), (detached,), (direction,))[1]  # (n, k)

    theta = torch.empty(n1, n2, k, k, dtype=x1.dtype, device=x1.device)
    with torch.no_grad():
        for i0 in range(0, n1, chunk):
            i1 = min(i0 + chunk, n1)
            flat = layer_directions(i0, i1) if parts else {}
            if rest:
                directions = vmap(cotangent_directions)(x1[i0:i1])
                flat.update({n: v.reshape((-1,) + v.shape[2:]) for n, v in directions.items()})
            flat = {n: flat[n] for n in detached}  # jvp wants the primals' key order
            # x2 = x1: the NTK is symmetric, so each block of rows needs only the columns
            # from its own first sample on (about half the forward-mode work).
            j0 = i0 if x2 is None else 0
            if isinstance(seq_layers, str):
                rows = vmap(ntk_rows, in_dims=(0, None))(flat, xb[j0:])  # (c k, n2 - j0, k)
            else:
                rows = _sequential_tangents(seq_layers, params, flat, xb[j0:], k)
            block = rows.reshape(i1 - i0, k, n2 - j0, k).permute(0, 2, 1, 3)
            theta[i0:i1, j0:] = block
            if x2 is None and i1 < n2:
                theta[i1:, i0:i1] = block[:, i1 - i0 :].permute(1, 0, 3, 2)
    return theta



def _sequential_tangents(
    layers: list[nn.Module], params: dict[str, Tensor], directions: dict[str, Tensor],
    x: Tensor, k: int,
) -> Tensor:
    """Forward-mode derivative of an ``nn.Sequential`` of linear layers and elementwise
    activations (the layer list of :func:`_gram_layers`) at ``x`` ``(n, d)`` along ``D``
    parameter directions: ``(D, n, k)``, :math:`J(x)\\,v_d` for each direction.

    Per linear layer :math:`\\dot z = s_W(\\dot h W^\\top + h\\,\\dot W^\\top) + s_b\\dot b`,
    per activation :math:`\\dot h = \\sigma'(z)\\odot\\dot z` -- exactly what
    ``torch.func.jvp`` computes, with the two products as single GEMMs over all ``D``
    directions (:func:`_gemm_nt`). Cost :math:`O(D\\,n\\,P)`, memory :math:`O(D\\,n\\,w)`.
    ``directions`` is keyed by the canonical names of ``params``; a trainable
    parameter of the model has a direction, a frozen one has none."""
    name_of = {id(p): n for n, p in params.items()}
    d = next(iter(directions.values())).shape[0]
    n = x.shape[0]
    h = x
    tangent: Optional[Tensor] = None  # (D, n, width)
    for layer in layers:
        if isinstance(layer, (nn.Linear, NTKLinear)):
            s_w, s_b = _layer_scales(layer)
            w = layer.weight.detach()
            d_out, d_in = w.shape
            new: Optional[Tensor] = None
            if tangent is not None:
                new = _gemm_nt(tangent.reshape(d * n, d_in), w * s_w if s_w != 1.0 else w)
                new = new.view(d, n, d_out)
            w_dir = directions.get(name_of.get(id(layer.weight), ""))
            if w_dir is not None:
                hs = h * s_w if s_w != 1.0 else h
                term = _gemm_nt(hs, w_dir.reshape(d * d_out, d_in)).view(n, d, d_out)
                term = term.permute(1, 0, 2)
                new = term.contiguous() if new is None else new.add_(term)
            if layer.bias is not None and s_b != 0.0:
                b_dir = directions.get(name_of.get(id(layer.bias), ""))
                if b_dir is not None:
                    b_term = (b_dir * s_b)[:, None, :]
                    new = b_term.expand(d, n, d_out).clone() if new is None else new.add_(b_term)
            h = layer(h)
            tangent = new
        else:
            h, deriv = _activation_and_derivative(layer, h)
            if tangent is not None and deriv is not None:
                tangent = tangent * deriv
    if tangent is None:
        return torch.zeros(d, n, k, dtype=x.dtype, device=x.device)
    return tangent.reshape(d, n, k)

