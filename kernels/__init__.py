"""Neural Network Kernels: the package behind the executable book.

Each module implements the methods one chapter derives (see ``chapters/``):

* :mod:`kernels.ntk` (a package) -- empirical and infinite-width neural tangent kernels (chapter 1).
* :mod:`kernels.features`, :mod:`kernels.snnk` -- universal random features, SNNK layers, bundling (chapters 2, 3).
* :mod:`kernels.toeplitz` (a package) -- Toeplitz neural operators: TNO, SKI-TNO, FD-TNO (chapter 4).
* :mod:`kernels.hadamard`, :mod:`kernels.lookup` -- fast Walsh-Hadamard transform, BH4 projections, LookupFFN with a compiled CPU kernel (chapter 5).
* :mod:`kernels.linear`, :mod:`kernels.fusion` -- compressed linear layers; MLP fusion: clustering sub-MLPs, compressed FFNs, NTK errors (chapter 6).
* :mod:`kernels.surgery` -- FFN surgery: find, capture and replace a model's FFN blocks (chapter 7; used by chapters 3, 6).
* :mod:`kernels.ffn` -- every FFN replacement behind one signature, and their counts (chapter 7).

The book's guide page (book/guide.md, "The package, bottom to top") maps every module in import order; no module
imports one that imports it back (``tests/test_layout.py``).

Shared plumbing lives in :mod:`kernels.device` (device selection and device checks) and
:mod:`kernels._checks` (argument validation).
"""

from __future__ import annotations

import warnings
from importlib import metadata
from pathlib import Path

__version__ = "0.1.0"

#: Root of the source tree this package was imported from. A test uses it to make
#: sure ``import kernels`` resolves to this repository and not to the unrelated
#: PyPI distribution that also installs a top-level ``kernels`` package.
PACKAGE_DIR = Path(__file__).resolve().parent
IS_NN_KERNELS_BOOK = True
#: Name of the unrelated PyPI distribution whose import name is also ``kernels``.
OTHER_DISTRIBUTION = "kernels"

__all__ = [
    "PACKAGE_DIR",
    "IS_NN_KERNELS_BOOK",
    "OTHER_DISTRIBUTION",
    "PackageCollisionWarning",
    "collision_advice",
    "__version__",
]


class PackageCollisionWarning(RuntimeWarning):
    """The unrelated PyPI distribution ``kernels`` is installed beside this book's package."""


def collision_advice() -> str:
    """What to do when the PyPI package ``kernels`` shares the environment (book/guide.md, Troubleshooting)."""
    return (
        "The unrelated PyPI package 'kernels' also installs a top-level package named "
        "'kernels'; with both in one environment one hides the other, and uninstalling "
        "either can delete the other's files. Use a separate environment for this book "
        "(make book / book/tools/setup_env.sh create .venv), or remove the other package and "
        "reinstall this one: pip uninstall kernels && pip install -e . (in the book's "
        "repository)."
    )


def _warn_if_the_other_kernels_is_installed() -> None:
    # One metadata lookup (a directory listing per sys.path entry), not a scan of every
    # distribution's file list: cheap enough for every import.
    try:
        other = metadata.distribution(OTHER_DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return
    warnings.warn(
        f"kernels (the nn-kernels-book package, {PACKAGE_DIR}) was imported, but the PyPI "
        f"distribution '{OTHER_DISTRIBUTION}' {other.version} is installed too. "
        + collision_advice(),
        PackageCollisionWarning,
        stacklevel=3,
    )


_warn_if_the_other_kernels_is_installed()
