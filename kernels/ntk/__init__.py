"""Neural tangent kernels: finite-width (empirical) and infinite-width (analytic).

The package side of chapter 1 (``chapters/01_ntk.ipynb``). It holds

* the layers of a fully connected network in either parametrization
  (:class:`NTKLinear`, :class:`Erf`, :func:`fc_network`);
* the empirical NTK :math:`\\hat\\Theta(x, x') = J(x) J(x')^\\top` of any torch model
  (:func:`empirical_ntk`), with a fast structured path for MLPs that never forms a
  Jacobian;
* the infinite-width NNGP and NTK of :func:`fc_network` (:func:`fc_kernel`);
* the closed-form gradient-flow dynamics of MSE training in the NTK regime
  (:func:`gd_mse_predictor`, :func:`mse_loss_curve`);
* the linearization :math:`f^{lin}` of a network around its initialization
  (:func:`linearize`).

References (keys of ``book/references.bib`` where present):

* Jacot, Gabriel, Hongler (2018), *Neural Tangent Kernel: Convergence and
  Generalization in Neural Networks* -- the NTK and its layer recursion.
* Lee et al. (2019), *Wide Neural Networks of Any Depth Evolve as Linear Models Under
  Gradient Descent* -- the NTK parametrization table, linearized networks and the
  closed-form MSE dynamics (their eqs. 9-11).
* Arora et al. (2019), *On Exact Computation with an Infinitely Wide Neural Net* --
  the same recursion written as :math:`\\Theta^{(l+1)} = \\Theta^{(l)}\\dot\\Sigma^{(l+1)}
  + \\Sigma^{(l+1)}`.
* Novak et al. (2020), *Neural Tangents: Fast and Easy Infinite Neural Networks in
  Python* -- the reference implementation the tests compare against.
* Cho & Saul (2009) (arc-cosine kernel, ReLU) and Williams (1997) (erf).

The NTK slides (``ntk-intro-slides``) state the recursions ("NTK: formulas"), the
parametrization table ("NTK: about parametrization"), the MSE gradient-flow solution
("Arbitrary function f for MSE loss") and the loss-curve formula ("NTK: training time
prediction"). Each docstring below names the chapter section that derives it.

Conventions used throughout:

* inputs are ``(n, d)`` tensors: one row per sample;
* a network with ``depth`` hidden layers has ``depth + 1`` affine layers;
* the NTK parametrization scales each affine layer by ``W_std / sqrt(fan_in)`` in the
  forward pass and draws every parameter from ``N(0, 1)``.

The package's modules, bottom to top (each imports only the ones listed before it):

* :mod:`kernels.ntk.network` -- :class:`NTKLinear`, :class:`Erf`, :func:`fc_network`;
* :mod:`kernels.ntk.onednn` -- the oneDNN plumbing of the CPU products (private helpers);
* :mod:`kernels.ntk.gram` -- the Gram trick: the ``"gram"`` method and :func:`linear_gram_ntk`;
* :mod:`kernels.ntk.empirical` -- :func:`empirical_ntk` and its ``"jacobian"``/``"jvp"`` paths;
* :mod:`kernels.ntk.analytic` -- :func:`fc_kernel`, :class:`NTKResult`;
* :mod:`kernels.ntk.dynamics` -- :func:`gd_mse_predictor`, :func:`mse_loss_curve`,
  :func:`gd_mse_ensemble`, :func:`linearize`.

Every public name is importable from ``kernels.ntk`` as before the split. The modules share
private helpers among themselves (one package, one chapter); no module outside
``kernels.ntk`` imports them.
"""

from __future__ import annotations

from kernels.ntk.network import NTKLinear, Erf, fc_network, PARAMETERIZATIONS, ACTIVATIONS
from kernels.ntk.gram import linear_gram_ntk
from kernels.ntk.empirical import empirical_ntk, EMPIRICAL_NTK_METHODS
from kernels.ntk.analytic import NTKResult, fc_kernel
from kernels.ntk.dynamics import (
    gd_mse_predictor,
    mse_loss_curve,
    GaussianPrediction,
    gd_mse_ensemble,
    linearize,
    LinearizedModel,
)

# Private helpers that tests and benchmarks/bench_*.py import from this path (patch them
# in the module that defines them, named here).
from kernels.ntk.onednn import _OneDNNLinearMode, _gemm_nt, _onednn_linear_available  # noqa: F401
from kernels.ntk.gram import _call_model, _linear_gram_owners, _linear_records  # noqa: F401
from kernels.ntk.empirical import _func_jacobian_ntk  # noqa: F401

__all__ = [
    "NTKLinear",
    "Erf",
    "fc_network",
    "empirical_ntk",
    "linear_gram_ntk",
    "NTKResult",
    "fc_kernel",
    "gd_mse_predictor",
    "mse_loss_curve",
    "GaussianPrediction",
    "gd_mse_ensemble",
    "linearize",
    "LinearizedModel",
    "PARAMETERIZATIONS",
    "ACTIVATIONS",
    "EMPIRICAL_NTK_METHODS",
]
