"""Toeplitz neural networks: the FFT Toeplitz product, TNO, SKI-TNO and FD-TNO.

The package side of chapter 4 (``chapters/04_toeplitz.ipynb``). It holds

* the Toeplitz matrix-vector product :math:`y = T x`, :math:`T_{ij} = t_{i-j}`, by
  circulant embedding and the real FFT (:func:`toeplitz_matvec`), its causal variant,
  and the dense matrix for checks and plots (:func:`toeplitz_dense`);
* the baseline Toeplitz neural operator of Qin et al. (2023): an RPE MLP over relative
  positions times an exponential decay bias, one Toeplitz matrix per channel
  (:class:`TNO`, :func:`rpe_mlp`);
* the sparse plus low-rank SKI-TNO of Algorithm 1 (:class:`SKITNO`): a depthwise
  convolution for the band near the diagonal and an asymmetric structured kernel
  interpolation :math:`W A W^\\top` for the smooth rest (:func:`ski_matvec`,
  :func:`linear_interpolation_weights`, optionally :func:`cubic_interpolation_weights`,
  :func:`inverse_time_warp`, :class:`PiecewiseLinearRPE`);
* the frequency-domain FD-TNO of Algorithm 2 (:class:`FDTNO`): the RPE gives the
  kernel's frequency response, causality through the discrete Hilbert transform
  (:func:`discrete_hilbert`, :func:`causal_kernel_from_real_response`);
* a minimal TNN: gated Toeplitz unit, GLU channel mixer, pre-norm residual block and an
  encoder whose token mixer is chosen by name (:class:`TNNBlock`, :class:`TNNEncoder`,
  :func:`make_tno`);
* the material of the decay study (Theorems 2-4): a random RPE MLP's frequency
  response and the decay of its time-domain kernel (:func:`frequency_response_decay`).

References (keys of ``book/references.bib`` where present):

* Qin et al. (2023), *Toeplitz Neural Network for Sequence Modeling* -- TNN, TNO, GTU,
  RPE and the decay bias.
* Moreno et al. (2023), *SKI to go Faster: Accelerating Toeplitz Neural Networks via
  Asymmetric Kernels* -- SKI-TNO (Algorithm 1, Section 3.2), FD-TNO (Algorithm 2,
  Section 3.3), Proposition 1 and Theorems 1-4. "The paper" below means this one.
* Wilson & Nickisch (2015), *Kernel Interpolation for Scalable Structured Gaussian
  Processes (KISS-GP)* -- structured kernel interpolation.
* Oppenheim & Schafer (2010), *Discrete-Time Signal Processing* -- the Hilbert
  transform relation of a causal sequence.

Conventions used throughout:

* sequences are ``(..., n, d)`` tensors: ``n`` tokens (the sequence dimension that a
  Toeplitz matrix mixes), ``d`` channels (each channel has its own Toeplitz matrix),
  any leading batch dimensions -- the layout of a TNN layer;
* the coefficients of an ``n x n`` Toeplitz matrix are a tensor whose last dimension
  has length ``2n - 1`` and lists the lags :math:`-(n-1), \\dots, -1, 0, 1, \\dots,
  n-1` in that order, so ``coeffs[..., n - 1 + k]`` is :math:`t_k` and
  :math:`T_{ij} = ` ``coeffs[..., n - 1 + i - j]``. A causal (lower-triangular) matrix
  has only the lags :math:`0, \\dots, n-1`: length ``n``, ``coeffs[..., k]`` is
  :math:`t_k`;
* every module draws its initial parameters from an explicit ``generator`` (``None``:
  torch's default generator) and never touches global state otherwise;
* the FFT and band products have hand-written backward passes (autograd's backward of
  ``rfft`` and of depthwise convolutions is several times slower on CPUs): gradients,
  ``torch.func.jacrev`` and ``vmap`` work, double backward raises an error;
* empty input (a batch of 0 sequences, 0 channels) gives an empty result, never an
  FFT error; a sequence needs at least one token;
* NaN and Inf: the functions (:func:`toeplitz_matvec`, :func:`ski_matvec`, ...) reject
  them with a ``ValueError`` naming the argument; the modules (:class:`TNO`,
  :class:`SKITNO`, :class:`FDTNO`) skip that extra pass over their input on the hot
  path, and a non-finite entry then spreads through the FFT to every token of its
  channel (and batch row), as it would through the dense product.

The package's modules, bottom to top (each imports only the ones listed before it):

* :mod:`kernels.toeplitz.product` -- the FFT Toeplitz product, :func:`toeplitz_matvec`, :func:`toeplitz_dense`;
* :mod:`kernels.toeplitz.helpers` -- small local checks and initialisation helpers (private);
* :mod:`kernels.toeplitz.tno` -- :func:`rpe_mlp` and the baseline :class:`TNO`;
* :mod:`kernels.toeplitz.ski` -- SKI-TNO (Algorithm 1): :class:`SKITNO`, :func:`ski_matvec`, interpolation;
* :mod:`kernels.toeplitz.fd` -- FD-TNO (Algorithm 2): :class:`FDTNO`, the Hilbert transform, the decay study;
* :mod:`kernels.toeplitz.encoder` -- :class:`GTU`, :class:`GLU`, :class:`TNNBlock`, :class:`TNNEncoder`, :func:`make_tno`.

Every public name is importable from ``kernels.toeplitz`` as before the split. The modules
share private helpers among themselves (one package, one chapter); no module outside
``kernels.toeplitz`` imports them.
"""

from __future__ import annotations

from kernels.toeplitz.product import toeplitz_matvec, toeplitz_dense, fft_length
from kernels.toeplitz.tno import rpe_mlp, TNO, RPE_ACTIVATIONS
from kernels.toeplitz.ski import (
    inverse_time_warp,
    inducing_points,
    linear_interpolation_weights,
    cubic_interpolation_weights,
    interpolation_weights,
    ski_matvec,
    PiecewiseLinearRPE,
    SKITNO,
    SKI_METHODS,
    SKI_INTERPOLATIONS,
)
from kernels.toeplitz.fd import (
    discrete_hilbert,
    causal_kernel_from_real_response,
    FDTNO,
    DecayCurve,
    frequency_response_decay,
    RPE_FEATURES,
)
from kernels.toeplitz.encoder import make_tno, GTU, GLU, TNNBlock, TNNEncoder, TNO_KINDS

# Private helpers that tests and benchmarks/bench_*.py import from this path (patch them
# in the module that defines them, named here).
from kernels.toeplitz.product import _apply_spectrum  # noqa: F401
from kernels.toeplitz.fd import _frequency_features  # noqa: F401

__all__ = [
    "toeplitz_matvec",
    "toeplitz_dense",
    "fft_length",
    "rpe_mlp",
    "TNO",
    "inverse_time_warp",
    "inducing_points",
    "linear_interpolation_weights",
    "cubic_interpolation_weights",
    "interpolation_weights",
    "ski_matvec",
    "PiecewiseLinearRPE",
    "SKITNO",
    "discrete_hilbert",
    "causal_kernel_from_real_response",
    "FDTNO",
    "make_tno",
    "GTU",
    "GLU",
    "TNNBlock",
    "TNNEncoder",
    "DecayCurve",
    "frequency_response_decay",
    "TNO_KINDS",
    "RPE_ACTIVATIONS",
    "RPE_FEATURES",
    "SKI_METHODS",
    "SKI_INTERPOLATIONS",
]
