"""The Gram trick for the empirical NTK: per-layer Gram matrices of activations and
back-propagated output gradients, never a Jacobian (Arora et al. 2019, the NTK as a sum
over layers of :math:`\\langle a_i, a_j\\rangle \\langle g_i, g_j\\rangle`).

Part of :mod:`kernels.ntk`, chapter 1 (``chapters/01_ntk.ipynb``): the ``"gram"`` method of
:func:`kernels.ntk.empirical_ntk` for MLPs built from :mod:`kernels.ntk.network`, and
:func:`linear_gram_ntk` for any module whose trainable layers are ``nn.Linear`` (forward and
backward hooks record each layer's inputs and output gradients).
"""

from __future__ import annotations

import math
from typing import Callable, Optional, Union

import torch
from torch import Tensor, nn

from kernels._checks import call_user_code
from kernels.ntk.network import Erf, NTKLinear
from kernels.ntk.onednn import _fast_linear_mode, _gemm_nt

__all__ = [
    "linear_gram_ntk",
]


# ---- "gram": structured MLP path -----------------------------------------------------

_ELEMENTWISE = (
    nn.ReLU,
    nn.Tanh,
    nn.GELU,
    nn.Sigmoid,
    nn.Identity,
    nn.LeakyReLU,
    nn.ELU,
    nn.SELU,
    nn.CELU,
    nn.SiLU,
    nn.Mish,
    nn.Softplus,
    nn.Hardtanh,
    nn.ReLU6,
    nn.Tanhshrink,
    nn.Softsign,
    Erf,
)



def _flatten_sequential(module: nn.Module) -> list[nn.Module]:
    if isinstance(module, nn.Sequential):
        out: list[nn.Module] = []
        for child in module:
            out += _flatten_sequential(child)
        return out
    return [module]



def _gram_layers(model: nn.Module) -> Union[list[nn.Module], str]:
    """The flat layer list if ``model`` fits the gram path, else the reason it does not."""
    if not isinstance(model, nn.Sequential):
        return f"got {type(model).__name__}"
    layers = _flatten_sequential(model)
    for layer in layers:
        if type(layer) is nn.Linear or isinstance(layer, NTKLinear):
            continue
        if type(layer) in _ELEMENTWISE:
            continue
        return f"layer {layer!r} is not supported"
    # Only the parameters the gram path knows may be trainable, and each one may be used
    # by a single layer: a shared (tied) parameter would need cross-layer terms.
    known: set[int] = set()
    for layer in layers:
        if isinstance(layer, (nn.Linear, NTKLinear)):
            for p in (layer.weight, layer.bias):
                if p is None:
                    continue
                if id(p) in known:
                    return f"layer {layer!r} shares a parameter with another layer"
                known.add(id(p))
    for name, p in model.named_parameters():
        if p.requires_grad and id(p) not in known:
            return f"parameter {name!r} does not belong to an affine layer"
    return layers



def _layer_scales(layer: nn.Module) -> tuple[float, float]:
    if isinstance(layer, NTKLinear):
        return layer.weight_scale, layer.bias_scale
    return 1.0, 1.0



def _activation_and_derivative(layer: nn.Module, z: Tensor) -> tuple[Tensor, Optional[Tensor]]:
    """``(sigma(z), sigma'(z))`` for an elementwise activation; ``None`` means identity."""
    if isinstance(layer, nn.Identity):
        return z, None
    if isinstance(layer, nn.ReLU):
        mask = z > 0
        return torch.where(mask, z, torch.zeros((), dtype=z.dtype, device=z.device)), mask.to(
            z.dtype
        )
    if isinstance(layer, Erf):
        return torch.special.erf(z), (2.0 / math.sqrt(math.pi)) * torch.exp(-z * z)
    if isinstance(layer, nn.Tanh):
        y = torch.tanh(z)
        return y, 1.0 - y * y
    # Any other elementwise module: the gradient of sum(sigma(z)) is sigma'(z).
    with torch.enable_grad():
        leaf = z.detach().requires_grad_(True)
        y = layer(leaf.clone())  # the clone keeps in-place activations off the leaf
        (deriv,) = torch.autograd.grad(y.sum(), leaf)
    return y.detach(), deriv



def _gram_pass(layers: list[nn.Module], x: Tensor, k: int):
    """Forward then backward pass collecting, per affine layer, its input ``A`` and the
    output gradients ``Delta`` of shape ``(k, n, d_out)``."""
    inputs: list[Tensor] = []
    derivs: list[Optional[Tensor]] = []
    h = x
    for layer in layers:
        if isinstance(layer, (nn.Linear, NTKLinear)):
            inputs.append(h)
            h = layer(h)
            derivs.append(None)
        else:
            h, d = _activation_and_derivative(layer, h)
            derivs.append(d)
    n = x.shape[0]
    # Cotangent of the output f_a(x_i): one-hot along the output index a.
    eye = torch.eye(k, dtype=x.dtype, device=x.device)
    grad = eye[:, None, :].expand(k, n, k)
    deltas: list[Tensor] = []
    affine_seen = 0
    n_affine = len(inputs)
    for layer, d in zip(reversed(layers), reversed(derivs)):
        if isinstance(layer, (nn.Linear, NTKLinear)):
            deltas.append(grad)
            affine_seen += 1
            if affine_seen < n_affine:  # the input layer's gradient is never used
                s_w, _ = _layer_scales(layer)
                grad = torch.matmul(grad, layer.weight)
                if s_w != 1.0:
                    grad = grad * s_w
        elif d is not None:
            grad = grad * d
    deltas.reverse()
    return inputs, deltas



def _delta_gram(d1: Tensor, d2: Tensor, k: int, trace: bool) -> Tensor:
    """``(n1, n2)`` (k == 1 or trace) or ``(n1, n2, k, k)`` Gram of output gradients."""
    _, n1, m = d1.shape
    n2 = d2.shape[1]
    if k == 1:
        return d1[0] @ d2[0].T
    if trace:
        return d1.transpose(0, 1).reshape(n1, k * m) @ d2.transpose(0, 1).reshape(n2, k * m).T
    g = d1.reshape(k * n1, m) @ d2.reshape(k * n2, m).T  # (k n1, k n2)
    return g.reshape(k, n1, k, n2).permute(1, 3, 0, 2)



def _ntk_gram(
    layers: list[nn.Module], x1: Tensor, x2: Optional[Tensor], k: int, trace: bool
) -> Tensor:
    inputs1, deltas1 = _gram_pass(layers, x1, k)
    if x2 is None:
        inputs2, deltas2 = inputs1, deltas1
    else:
        inputs2, deltas2 = _gram_pass(layers, x2, k)
    affine = [m for m in layers if isinstance(m, (nn.Linear, NTKLinear))]
    theta: Optional[Tensor] = None
    for layer, a1, a2, d1, d2 in zip(affine, inputs1, inputs2, deltas1, deltas2):
        s_w, s_b = _layer_scales(layer)
        w_trainable = layer.weight.requires_grad
        b_trainable = layer.bias is not None and layer.bias.requires_grad and s_b != 0.0
        if not (w_trainable or b_trainable):
            continue
        if w_trainable:
            factor = a1 @ a2.T
            if s_w != 1.0:
                factor = factor * (s_w * s_w)
            if b_trainable:
                factor = factor + s_b * s_b
        else:
            factor = None
        dg = _delta_gram(d1, d2, k, trace)
        if factor is None:
            term = dg * (s_b * s_b)
        elif dg.ndim == 4:
            term = dg * factor[:, :, None, None]
        else:
            term = dg * factor
        theta = term if theta is None else theta + term
    if theta is None:  # every trainable tensor is a bias with zero scale
        n2 = x1.shape[0] if x2 is None else x2.shape[0]
        shape = (x1.shape[0], n2) if (k == 1 or trace) else (x1.shape[0], n2, k, k)
        theta = torch.zeros(shape, dtype=x1.dtype, device=x1.device)
    return theta



# ---- "gram" for any module whose trainable layers are nn.Linear: hooks ----------------


def _linear_gram_owners(model: nn.Module) -> Union[list[tuple[str, nn.Module]], str]:
    """The ``(name, layer)`` of every ``nn.Linear``/:class:`NTKLinear` holding a trainable
    parameter, or the reason the Gram factorisation does not apply: a trainable
    parameter outside such a layer (named, with its module's type), a layer subclassing
    ``nn.Linear`` with its own ``forward``, or a parameter shared by two layers."""
    owner_of: dict[int, tuple[str, nn.Module]] = {}
    layers: list[tuple[str, nn.Module]] = []
    for mod_name, module in model.named_modules():
        linear = type(module) is nn.Linear or isinstance(module, NTKLinear)
        for p_name, p in module.named_parameters(recurse=False):
            if not p.requires_grad:
                continue
            full = f"{mod_name}.{p_name}" if mod_name else p_name
            if not linear or p_name not in ("weight", "bias"):
                kind = type(module).__name__
                extra = " (a subclass of nn.Linear with its own forward)" if isinstance(module, nn.Linear) else ""
                return (
                    f"trainable parameter {full!r} belongs to {kind}{extra}, not to an nn.Linear/NTKLinear layer"
                )
            if id(p) in owner_of and owner_of[id(p)][1] is not module:
                return f"trainable parameter {full!r} is shared with layer {owner_of[id(p)][0]!r}"
            owner_of[id(p)] = (mod_name, module)
        if linear and any(p.requires_grad for p in module.parameters(recurse=False)):
            if all(m is not module for _, m in layers):
                layers.append((mod_name, module))
    if not layers:
        return "the model has no trainable nn.Linear/NTKLinear layer"
    return layers



class _SampleAxisError(ValueError):
    """A hooked layer saw a leading dimension other than the number of samples."""



def _linear_records(
    model: nn.Module,
    layers: list[tuple[str, nn.Module]],
    output_fn: Callable[[nn.Module, object], Tensor],
    inputs: object,
    check_params: tuple[Tensor, ...] = (),
    name: str = "x",
) -> tuple[list[Optional[tuple[Tensor, Tensor]]], int, int, list[Tensor]]:
    """One forward pass and ``k`` backward passes. For every layer: its inputs ``a``
    ``(n, T, in)`` and the output gradients ``g`` ``(k, n, T, out)`` of
    :math:`\\sum_i f_a(x_i)` (one slice per output index ``a``), the calls of a layer
    used several times concatenated along ``T``; ``None`` for a layer that never ran.
    Also the gradients of :math:`\\sum_{i,a} f_a(x_i)` with respect to
    ``check_params`` (same backward passes; zeros where unused), with which a caller
    can verify that the hooks saw every use of those parameters."""
    calls: dict[int, list[tuple[Tensor, Tensor]]] = {i: [] for i in range(len(layers))}

    def hook(idx: int):
        def keep(module, args, output):  # returns None: the output stays as it is
            calls[idx].append((args[0].detach(), output))

        return keep

    handles = [layer.register_forward_hook(hook(i)) for i, (_, layer) in enumerate(layers)]
    try:
        with torch.enable_grad(), _fast_linear_mode():
            out = call_user_code(f"output_fn(model, {name})", output_fn, model, inputs)
    finally:
        for h in handles:
            h.remove()
    if not isinstance(out, Tensor) or out.ndim not in (1, 2):
        shape = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
        raise ValueError(f"output_fn must return (n,) or (n, k) outputs, got {shape}")
    n = out.shape[0]
    k = 1 if out.ndim == 1 else out.shape[1]
    out = out.reshape(n, k)
    ys = [y for i in range(len(layers)) for _, y in calls[i]]
    grads_per_output = []
    param_grads = [torch.zeros_like(p) for p in check_params]
    for a in range(k):
        if not out.requires_grad or not (ys or check_params):
            grads = [None] * (len(ys) + len(check_params))
        else:
            grads = torch.autograd.grad(
                out[:, a].sum(), ys + list(check_params), retain_graph=a + 1 < k,
                allow_unused=True,
            )
        for pg, g in zip(param_grads, grads[len(ys):]):
            if g is not None:
                pg += g.detach()
        grads_per_output.append(grads[: len(ys)])
    records: list[Optional[tuple[Tensor, Tensor]]] = []
    pos = 0
    for i in range(len(layers)):
        if not calls[i]:
            records.append(None)
            continue
        a_parts, g_parts = [], []
        for j, (x_in, y) in enumerate(calls[i]):
            if x_in.shape[0] != n:
                raise _SampleAxisError(
                    f"layer {layers[i][0]!r} saw a leading dimension of {x_in.shape[0]} "
                    f"for {n} samples; samples must stay on the first axis"
                )
            per_out = [
                (torch.zeros_like(y) if grads[pos + j] is None else grads[pos + j].detach())
                .reshape(1, n, -1, y.shape[-1])
                for grads in grads_per_output
            ]
            a_parts.append(x_in.reshape(n, -1, x_in.shape[-1]))
            g_parts.append(per_out[0] if k == 1 else torch.cat(per_out, 0))
        pos += len(calls[i])
        if len(a_parts) == 1:  # one call: no copies
            records.append((a_parts[0], g_parts[0]))
        else:
            records.append((torch.cat(a_parts, 1), torch.cat(g_parts, 2)))
    return records, n, k, param_grads



def _pair_gram(u1: Tensor, u2: Tensor) -> Tensor:
    """``(n1, T1, n2, T2)`` Gram of token vectors ``(n, T, m)``."""
    n1, t1, m = u1.shape
    n2, t2, _ = u2.shape
    return _gemm_nt(u1.reshape(n1 * t1, m), u2.reshape(n2 * t2, m)).reshape(n1, t1, n2, t2)



#: Token rows per block of the symmetric token-pair sum (:func:`_pair_product_sum`):
#: blocks of about this many rows keep each GEMM efficient while the blocks below the
#: diagonal, which are skipped, approach half of the work.
_SYM_BLOCK_ROWS = 128



def _pair_product_sum(a1: Tensor, g1: Tensor, a2: Tensor, g2: Tensor, same: bool) -> Tensor:
    """``(n1, n2)`` sums :math:`\\sum_{t,s}(a_{it}\\cdot a'_{js})(g_{it}\\cdot g'_{js})` of
    token vectors ``a`` ``(n, T, p)`` and ``g`` ``(n, T, q)``.

    ``same`` (``a2 is a1``, ``g2 is g1``): the result is symmetric, so only sample
    blocks on and above the diagonal are formed (row blocks of about
    :data:`_SYM_BLOCK_ROWS` tokens against themselves and every later sample) and
    mirrored: with ``B`` blocks, ``(B + 1) / 2B`` of the two GEMMs' work."""
    n1, t1 = a1.shape[:2]
    n2, t2 = a2.shape[:2]
    a1f, g1f = a1.reshape(n1 * t1, -1), g1.reshape(n1 * t1, -1)
    if not same:
        ga = _gemm_nt(a1f, a2.reshape(n2 * t2, -1))
        gg = _gemm_nt(g1f, g2.reshape(n2 * t2, -1))
        return (ga * gg).reshape(n1, t1, n2, t2).sum((1, 3))
    out = torch.empty((n1, n1), dtype=a1.dtype, device=a1.device)
    step = max(1, -(-_SYM_BLOCK_ROWS // t1))  # samples per row block
    for i0 in range(0, n1, step):
        i1 = min(n1, i0 + step)
        rows, cols = slice(i0 * t1, i1 * t1), slice(i0 * t1, None)
        prod = _gemm_nt(a1f[rows], a1f[cols]).mul_(_gemm_nt(g1f[rows], g1f[cols]))
        block = prod.reshape(i1 - i0, t1, n1 - i0, t1).sum((1, 3))
        diag = block[:, : i1 - i0]
        diag.copy_(0.5 * (diag + diag.T))  # exactly symmetric (the two sums round differently)
        out[i0:i1, i0:] = block
        out[i0:, i0:i1] = block.T
    return out



def _linear_layer_ntk(
    layer: nn.Module,
    rec1: tuple[Tensor, Tensor],
    rec2: tuple[Tensor, Tensor],
    trace: bool,
    same: bool = False,
) -> Tensor:
    """One layer's NTK term ``(n1, n2, k, k)`` (``(n1, n2)`` when ``k == 1`` or ``trace``).

    The per-sample weight gradient is :math:`s_W\\sum_t g_t a_t^\\top`, so
    :math:`\\langle\\partial_W f_a(x), \\partial_W f_b(x')\\rangle = s_W^2\\sum_{t,s}
    (a_t\\cdot a'_s)(g_{a,t}\\cdot g'_{b,s})`, and the bias term is :math:`s_b^2
    (\\sum_t g_{a,t})\\cdot(\\sum_s g'_{b,s})`. The token-pair form costs
    :math:`O(n_1 n_2 T_1 T_2 (d_{in} + k^2 d_{out}))`; forming the per-sample gradients
    costs :math:`O((n_1 T_1 + n_2 T_2) k\\,d_{in} d_{out} + n_1 n_2 k^2 d_{in} d_{out})`:
    the cheaper one is used (the token-pair form always when there is one token)."""
    a1, g1 = rec1
    a2, g2 = rec2
    k, n1, t1, d_out = g1.shape
    n2, t2, d_in = a2.shape[0], a2.shape[1], a2.shape[2]
    s_w, s_b = _layer_scales(layer)
    w_on = layer.weight.requires_grad
    b_on = layer.bias is not None and layer.bias.requires_grad and s_b != 0.0
    kk = 1 if (k == 1 or trace) else k * k
    theta = torch.zeros((n1, n2) if kk == 1 else (n1, n2, k, k), dtype=a1.dtype, device=a1.device)
    if b_on:
        s1, s2 = g1.sum(2), g2.sum(2)  # (k, n, out)
        theta = theta + (s_b * s_b) * _delta_gram(s1, s2, k, trace)
    if not w_on:
        return theta
    pair_cost = n1 * n2 * t1 * t2 * (d_in + kk * d_out)
    if same and (kk == 1 or trace):  # the symmetric blocks of _pair_product_sum
        pair_cost //= 2
    formed = n1 * t1 if same else n1 * t1 + n2 * t2  # tokens whose gradients are formed
    grad_cost = formed * k * d_in * d_out + n1 * n2 * kk * d_in * d_out
    if t1 * t2 == 1 or pair_cost <= grad_cost:
        if kk == 1 and not trace:
            w_term = _pair_product_sum(a1, g1[0], a2, g2[0], same)
        elif trace:
            u1 = g1.permute(1, 2, 0, 3).reshape(n1, t1, k * d_out)
            u2 = u1 if same else g2.permute(1, 2, 0, 3).reshape(n2, t2, k * d_out)
            w_term = _pair_product_sum(a1, u1, a2, u2, same)
        else:
            ga = _pair_gram(a1, a2)  # (n1, T1, n2, T2)
            gg = _gemm_nt(g1.reshape(k * n1 * t1, d_out), g2.reshape(k * n2 * t2, d_out)).reshape(
                k, n1, t1, k, n2, t2
            )
            w_term = torch.einsum("itjs,aitbjs->ijab", ga, gg)
    else:
        e1 = torch.einsum("knto,nti->knoi", g1, a1).reshape(k, n1, -1)
        e2 = e1 if same else torch.einsum("knto,nti->knoi", g2, a2).reshape(k, n2, -1)
        w_term = _delta_gram(e1, e2, k, trace)
    return theta + (s_w * s_w) * w_term



def linear_gram_ntk(
    model: nn.Module,
    x1: object,
    x2: object = None,
    *,
    output_fn: Optional[Callable[[nn.Module, object], Tensor]] = None,
    trace_outputs: bool = False,
) -> Tensor:
    """Empirical NTK :math:`J(x)J(x')^\\top` of any module whose *trainable* parameters
    all belong to ``nn.Linear`` (or :class:`NTKLinear`) layers, without a Jacobian.

    Forward hooks record each such layer's inputs :math:`a_t` and one backward pass per
    output index its output gradients :math:`g_t`, over every leading axis after the
    sample axis (tokens :math:`t` of a transformer). A linear layer applied over tokens
    has the per-sample weight gradient :math:`\\sum_t g_t a_t^\\top`, so its NTK term is
    :math:`\\sum_{t,s}(a_t\\cdot a'_s)(g_t\\cdot g'_s)` plus :math:`(\\sum_t g_t)\\cdot
    (\\sum_s g'_s)` for the bias: the per-layer Gram trick of :func:`empirical_ntk`'s
    ``"gram"`` method (Jacot et al. 2018, eq. 4), generalised from an MLP to e.g. the FFN
    blocks of a transformer whose other weights are frozen (chapter 6, "Measuring the
    NTK"; the one-token form is derived in chapter 1, "The empirical NTK"). A layer
    called several times counts each call's tokens. Frozen layers, attention, norms
    and any other computation may sit anywhere around the trainable layers.

    Args:
        model: the module; samples must not interact (padding masked, no batch norm).
        x1, x2: whatever ``output_fn`` takes for ``n1`` and ``n2`` samples (``x2=None``:
            ``x1``, computed once).
        output_fn: ``output_fn(model, x) -> (n,)`` or ``(n, k)``; default ``model(x)``.
        trace_outputs: as in :func:`empirical_ntk`.

    Returns:
        ``(n1, n2)`` for one output per sample (or ``trace_outputs``), else
        ``(n1, n2, k, k)``, detached, in the dtype of the recorded activations. Cost one
        forward and ``k`` backward passes per input set (to the layers' outputs only: no
        weight gradient is formed; float32 ``nn.Linear`` calls on the CPU run on
        oneDNN's GEMM, see :class:`_OneDNNLinearMode`) plus, per layer, the cheaper of
        the token-pair and the per-sample-gradient contractions (see
        :func:`_linear_layer_ntk`; for ``x2=None`` only the blocks on and above the
        diagonal, and the result is exactly symmetric); memory: the recorded
        activations and gradients.

    Raises:
        TypeError: ``model`` not a module, ``output_fn`` not callable, ``trace_outputs``
            not a bool.
        ValueError: a trainable parameter outside an ``nn.Linear`` (the message names the
            first one and its module), a parameter shared between layers, no trainable
            layer, outputs not ``(n,)``/``(n, k)``, different output counts for ``x1``
            and ``x2``.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if output_fn is None:
        output_fn = _call_model
    elif not callable(output_fn):
        raise TypeError("output_fn must be a callable output_fn(model, x) -> (n,) or (n, k)")
    if not isinstance(trace_outputs, bool):
        raise TypeError(f"trace_outputs must be a bool, got {trace_outputs!r}")
    layers = _linear_gram_owners(model)
    if isinstance(layers, str):
        raise ValueError(
            f"linear_gram_ntk needs every trainable parameter in an nn.Linear layer: {layers}. "
            "Freeze it (requires_grad_(False)) or use empirical_ntk(method='jacobian')."
        )
    return _linear_gram(model, layers, output_fn, x1, x2, trace_outputs)



def _call_model(model: nn.Module, x: object) -> Tensor:
    return model(x)



def _linear_gram(model, layers, output_fn, x1, x2, trace) -> Tensor:
    rec1, n1, k, _ = _linear_records(model, layers, output_fn, x1, name="x1")
    if x2 is None:
        rec2, n2 = rec1, n1
    else:
        rec2, n2, k2, _ = _linear_records(model, layers, output_fn, x2, name="x2")
        if k2 != k:
            raise ValueError(f"the model returns {k} outputs per sample on x1 but {k2} on x2")
    theta: Optional[Tensor] = None
    with torch.no_grad():
        for (_, layer), r1, r2 in zip(layers, rec1, rec2):
            if r1 is None or r2 is None:  # the layer never ran: its gradient is zero
                continue
            term = _linear_layer_ntk(layer, r1, r2, trace, same=x2 is None)
            theta = term if theta is None else theta + term
    if theta is None:
        ref = next(p for _, m in layers for p in m.parameters())
        shape = (n1, n2) if (k == 1 or trace) else (n1, n2, k, k)
        theta = torch.zeros(shape, dtype=ref.dtype, device=ref.device)
    elif x2 is None:  # exactly symmetric: the terms' two halves may round differently
        theta = 0.5 * (theta + (theta.T if theta.ndim == 2 else theta.permute(1, 0, 3, 2)))
    return theta

