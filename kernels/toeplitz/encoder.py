"""A minimal TNN: gated Toeplitz unit (:class:`GTU`), GLU channel mixer (:class:`GLU`),
pre-norm residual block (:class:`TNNBlock`) and an encoder (:class:`TNNEncoder`) whose token
mixer is chosen by name (:func:`make_tno`, :data:`TNO_KINDS`), after Qin et al. (2023).

Part of :mod:`kernels.toeplitz`, chapter 4 (``chapters/04_toeplitz.ipynb``), section "A
TNN encoder".
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from kernels._checks import check_choice, check_float_dtype, check_generator, check_input, check_positive_int
from kernels.device import check_tensor_device
from kernels.toeplitz.helpers import _check_bool, _linear
from kernels.toeplitz.tno import TNO
from kernels.toeplitz.ski import SKITNO
from kernels.toeplitz.fd import FDTNO

__all__ = [
    "make_tno",
    "GTU",
    "GLU",
    "TNNBlock",
    "TNNEncoder",
    "TNO_KINDS",
]


#: Token mixers accepted by :func:`make_tno`, :class:`TNNBlock` and :class:`TNNEncoder`.
TNO_KINDS = ("tno", "ski", "fd")



# --------------------------------------------------------------------------------------
# TNN blocks
# --------------------------------------------------------------------------------------


def make_tno(
    kind: str,
    channels: int,
    *,
    causal: bool = False,
    generator: Optional[torch.Generator] = None,
    dtype: Optional[torch.dtype] = None,
    **options: Any,
) -> nn.Module:
    """Token mixer by name: ``"tno"`` (:class:`TNO`), ``"ski"`` (:class:`SKITNO`) or
    ``"fd"`` (:class:`FDTNO`).

    ``options`` go to the constructor (e.g. ``decay``, ``rpe_width``, ``rank``,
    ``filter_size``). ``"ski"`` with ``causal=True`` is a ``ValueError``: SKI-TNO is
    bidirectional only. Used by chapter 4 (chapters/04_toeplitz.ipynb), section
    "Accuracy", to train the three variants on the same tasks.
    """
    kind = check_choice("kind", kind, TNO_KINDS)
    _check_bool("causal", causal)
    if kind == "tno":
        return TNO(channels, causal=causal, generator=generator, dtype=dtype, **options)
    if kind == "fd":
        return FDTNO(channels, causal=causal, generator=generator, dtype=dtype, **options)
    if causal:
        raise ValueError(
            "tno='ski' is bidirectional only (causal masking negates SKI's benefits, the "
            "paper's Appendix B); use tno='fd' or 'tno' for causal models"
        )
    return SKITNO(channels, generator=generator, dtype=dtype, **options)



class GTU(nn.Module):
    """Gated Toeplitz unit (Qin et al. 2023, Section 3.2): token and channel mixing.

    :math:`\\mathrm{GTU}(X) = \\big(\\phi(X W_u) \\odot \\mathrm{TNO}(\\phi(X W_v))\\big)
    W_o` with :math:`\\phi` = SiLU, :math:`W_u, W_v \\in \\mathbb R^{d \\times e}`,
    :math:`W_o \\in \\mathbb R^{e \\times d}` (biases included) and the token mixer
    acting on :math:`e` channels. Shapes ``(..., n, d) -> (..., n, d)``. Derived in
    chapter 4 (chapters/04_toeplitz.ipynb), section "A TNN block".
    """

    def __init__(
        self,
        channels: int,
        hidden: int,
        mixer: nn.Module,
        *,
        generator: Optional[torch.Generator] = None,
        dtype: Optional[torch.dtype] = None,
    ) -> None:
        super().__init__()
        channels = check_positive_int("channels", channels)
        hidden = check_positive_int("hidden", hidden)
        if not isinstance(mixer, nn.Module):
            raise TypeError(f"mixer must be an nn.Module, got {type(mixer).__name__}")
        check_generator("generator", generator)
        dtype = check_float_dtype("dtype", dtype, none_is_default=True)
        self.u_proj = _linear(channels, hidden, generator, dtype)
        self.v_proj = _linear(channels, hidden, generator, dtype)
        self.mixer = mixer
        self.out_proj = _linear(hidden, channels, generator, dtype)

    def forward(self, x: Tensor) -> Tensor:
        check_input("x", x, self.u_proj.in_features, self.u_proj.weight, what="channels", min_ndim=2)
        u = F.silu(self.u_proj(x))
        v = self.mixer(F.silu(self.v_proj(x)))
        return self.out_proj(u * v)



class GLU(nn.Module):
    """Gated linear unit channel mixer (Shazeer 2020): :math:`(\\phi(X W_1) \\odot X W_2) W_3`.

    :math:`\\phi` = SiLU; shapes ``(..., n, d) -> (..., n, d)``, cost
    :math:`O(n\\,d\\,h)`. Derived in chapter 4 (chapters/04_toeplitz.ipynb), section "A
    TNN block".
    """

    def __init__(
        self,
        channels: int,
        hidden: int,
        *,
        generator: Optional[torch.Generator] = None,
        dtype: Optional[torch.dtype] = None,
    ) -> None:
        super().__init__()
        channels = check_positive_int("channels", channels)
        hidden = check_positive_int("hidden", hidden)
        check_generator("generator", generator)
        dtype = check_float_dtype("dtype", dtype, none_is_default=True)
        self.gate_proj = _linear(channels, hidden, generator, dtype)
        self.value_proj = _linear(channels, hidden, generator, dtype)
        self.out_proj = _linear(hidden, channels, generator, dtype)

    def forward(self, x: Tensor) -> Tensor:
        check_input("x", x, self.gate_proj.in_features, self.gate_proj.weight, what="channels")
        return self.out_proj(F.silu(self.gate_proj(x)) * self.value_proj(x))



class TNNBlock(nn.Module):
    """One TNN layer: pre-norm residual GTU (token mixing) then GLU (channel mixing).

    :math:`X \\leftarrow X + \\mathrm{GTU}(\\mathrm{LN}(X))`,
    :math:`X \\leftarrow X + \\mathrm{GLU}(\\mathrm{LN}(X))` (Qin et al. 2023, Figure 2;
    the paper's Figure 3), with the GTU's token mixer chosen by ``tno`` (see
    :func:`make_tno`). Shapes ``(..., n, d) -> (..., n, d)``. Derived in chapter 4
    (chapters/04_toeplitz.ipynb), section "A TNN block".

    Args:
        channels: model width ``d``.
        tno: ``"tno"``, ``"ski"`` or ``"fd"``.
        causal: autoregressive token mixing (not with ``"ski"``).
        gtu_expand, glu_expand: hidden widths of the GTU and the GLU as multiples of
            ``d`` (positive ints).
        tno_options: keyword arguments of the token mixer (e.g. ``{"rank": 32}``).
        generator, dtype: initialisation randomness and parameter dtype.
    """

    def __init__(
        self,
        channels: int,
        *,
        tno: str = "tno",
        causal: bool = False,
        gtu_expand: int = 1,
        glu_expand: int = 1,
        tno_options: Optional[dict[str, Any]] = None,
        generator: Optional[torch.Generator] = None,
        dtype: Optional[torch.dtype] = None,
    ) -> None:
        super().__init__()
        self.channels = check_positive_int("channels", channels)
        gtu_hidden = self.channels * check_positive_int("gtu_expand", gtu_expand)
        glu_hidden = self.channels * check_positive_int("glu_expand", glu_expand)
        if tno_options is not None and not isinstance(tno_options, dict):
            raise TypeError(f"tno_options must be a dict or None, got {tno_options!r}")
        check_generator("generator", generator)
        dtype = check_float_dtype("dtype", dtype, none_is_default=True)
        mixer = make_tno(
            tno, gtu_hidden, causal=causal, generator=generator, dtype=dtype,
            **(tno_options or {}),
        )
        self.norm1 = nn.LayerNorm(self.channels, dtype=dtype)
        self.gtu = GTU(self.channels, gtu_hidden, mixer, generator=generator, dtype=dtype)
        self.norm2 = nn.LayerNorm(self.channels, dtype=dtype)
        self.glu = GLU(self.channels, glu_hidden, generator=generator, dtype=dtype)

    def forward(self, x: Tensor) -> Tensor:
        check_input("x", x, self.channels, self.gtu.u_proj.weight, what="channels", min_ndim=2)
        x = x + self.gtu(self.norm1(x))
        return x + self.glu(self.norm2(x))



class TNNEncoder(nn.Module):
    """Token embedding, ``n_layers`` :class:`TNNBlock` s and a final layer norm.

    ``forward(tokens)``: integer ``(..., n)`` token ids in ``[0, vocab_size)`` ->
    ``(..., n, channels)`` hidden states, or ``(..., n, n_out)`` per-token outputs of a
    linear head when ``n_out`` is given (logits of a language model, or pool them for
    a classifier). No positional embedding: the Toeplitz mixers are the relative
    position encoding. Derived in chapter 4 (chapters/04_toeplitz.ipynb), section
    "Accuracy", which trains it with ``tno`` in ``"tno"``, ``"ski"``, ``"fd"``.

    Args:
        vocab_size: number of token ids.
        channels: model width ``d``.
        n_layers: number of blocks.
        tno, causal, gtu_expand, glu_expand, tno_options: see :class:`TNNBlock`.
        n_out: size of the optional per-token linear head.
        generator, dtype: initialisation randomness and parameter dtype.
    """

    def __init__(
        self,
        vocab_size: int,
        channels: int,
        n_layers: int,
        *,
        tno: str = "tno",
        causal: bool = False,
        gtu_expand: int = 1,
        glu_expand: int = 1,
        tno_options: Optional[dict[str, Any]] = None,
        n_out: Optional[int] = None,
        generator: Optional[torch.Generator] = None,
        dtype: Optional[torch.dtype] = None,
    ) -> None:
        super().__init__()
        self.vocab_size = check_positive_int("vocab_size", vocab_size)
        self.channels = check_positive_int("channels", channels)
        n_layers = check_positive_int("n_layers", n_layers)
        check_generator("generator", generator)
        dtype = check_float_dtype("dtype", dtype, none_is_default=True)
        emb = torch.nn.utils.skip_init(nn.Embedding, self.vocab_size, self.channels, dtype=dtype)
        with torch.no_grad():
            nn.init.normal_(emb.weight, generator=generator)
        self.embedding = emb
        self.blocks = nn.ModuleList(
            TNNBlock(
                self.channels, tno=tno, causal=causal, gtu_expand=gtu_expand,
                glu_expand=glu_expand, tno_options=tno_options, generator=generator,
                dtype=dtype,
            )
            for _ in range(n_layers)
        )
        self.norm = nn.LayerNorm(self.channels, dtype=dtype)
        self.head = (
            None
            if n_out is None
            else _linear(self.channels, check_positive_int("n_out", n_out), generator, dtype)
        )

    def forward(self, tokens: Tensor) -> Tensor:
        if not isinstance(tokens, Tensor):
            raise TypeError(f"tokens must be a torch.Tensor, got {type(tokens).__name__}")
        check_tensor_device("tokens", tokens)
        if tokens.dtype not in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
            raise TypeError(f"tokens must be an integer tensor of token ids, got {tokens.dtype}")
        if tokens.ndim < 1 or tokens.shape[-1] < 1:
            raise ValueError(
                f"tokens must have shape (..., n) with n >= 1, got {tuple(tokens.shape)}"
            )
        if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= self.vocab_size):
            raise ValueError(
                f"tokens must lie in [0, vocab_size = {self.vocab_size}), got values in "
                f"[{int(tokens.min())}, {int(tokens.max())}]"
            )
        h = self.embedding(tokens.long())
        for block in self.blocks:
            h = block(h)
        h = self.norm(h)
        return h if self.head is None else self.head(h)

