"""Dataset generators and fetchers used by the chapters.

Default runs use only data that ships with a package (scikit-learn's digits, for
example) or that a generator here makes. Fetchers for full-size datasets are real code,
tested on small local fixtures, and fail with a clear message when offline.
Data flows one way: ``data_scripts`` -> chapter -> ``kernels``; the ``kernels`` package
never imports this one.
"""


import importlib.util as _util
from pathlib import Path as _Path


def _check_kernels_is_ours() -> None:
    """Fail loudly when ``import kernels`` would load another package than this book's.

    ``data_scripts`` and ``kernels`` ship in one distribution (nn-kernels-book), side by
    side. The unrelated PyPI package ``kernels`` installs a top-level ``kernels`` too;
    when it comes first on the path, ``from kernels.lookup import ...`` would fail later
    with a puzzling ``ModuleNotFoundError``. Nothing is imported here, only located.
    """
    ours = _Path(__file__).resolve().parent.parent / "kernels" / "__init__.py"
    if not ours.is_file():  # data_scripts copied somewhere on its own: nothing to compare
        return
    spec = _util.find_spec("kernels")
    found = _Path(spec.origin).resolve() if spec is not None and spec.origin else None
    if found != ours:
        raise ImportError(
            f"'import kernels' resolves to {found or 'nothing'}, not to this book's package "
            f"{ours}. The unrelated PyPI package 'kernels' also installs a top-level package "
            "named 'kernels', and it hides this one. Use a separate environment for this "
            "book (make book / book/tools/setup_env.sh create .venv), or remove the other "
            "package and reinstall this one: pip uninstall kernels && pip install -e . (in the "
            "book's repository)."
        )


_check_kernels_is_ours()
