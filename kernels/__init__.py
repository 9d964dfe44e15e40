"""Neural Network Kernels: the package behind the executable book.

Each module implements the methods one chapter derives (see ``chapters/``):

* :mod:`kernels.ntk` -- empirical and infinite-width neural tangent kernels (chapter 1).
* :mod:`kernels.features`, :mod:`kernels.snnk` -- universal random features, SNNK layers, bundling (chapters 2, 3).
* :mod:`kernels.toeplitz` -- Toeplitz neural operators: TNO, SKI-TNO, FD-TNO (chapter 4).
* :mod:`kernels.hadamard`, :mod:`kernels.lookup` -- fast Walsh-Hadamard transform, BH4 projections, LookupFFN with a compiled CPU kernel (chapter 5).
* :mod:`kernels.fusion` -- MLP fusion: clustering sub-MLPs, compressed FFNs, NTK errors (chapter 6).

Shared plumbing lives in :mod:`kernels.device` (device selection and device checks) and
:mod:`kernels._checks` (argument validation).
"""

from __future__ import annotations

from pathlib import Path

__version__ = "0.1.0"

#: Root of the source tree this package was imported from. A test uses it to make
#: sure ``import kernels`` resolves to this repository and not to the unrelated
#: PyPI distribution that also installs a top-level ``kernels`` package.
PACKAGE_DIR = Path(__file__).resolve().parent
IS_NN_KERNELS_BOOK = True

__all__ = ["PACKAGE_DIR", "IS_NN_KERNELS_BOOK", "__version__"]
