"""The imported ``kernels`` is this repository's, and device selection never fails."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

import pytest
import torch

import kernels
from kernels import device

ROOT = Path(__file__).resolve().parents[1]


def test_kernels_is_this_repository() -> None:
    # An unrelated PyPI distribution also installs a top-level ``kernels`` package.
    assert Path(kernels.__file__).resolve().parent == ROOT / "kernels"
    assert getattr(kernels, "IS_NN_KERNELS_BOOK", False) is True
    dist = metadata.distribution("nn-kernels-book")
    assert dist.version == kernels.__version__
    # The installed distribution is editable and points at this source tree.
    assert set(metadata.packages_distributions().get("kernels", [])) == {"nn-kernels-book"}


def test_default_device_matches_torch() -> None:
    want = "cuda" if torch.cuda.is_available() else "cpu"
    assert device.default_device().type == want
    assert device.resolve_device(None).type == want
    assert device.resolve_device("cpu") == torch.device("cpu")


def test_resolve_device_errors() -> None:
    with pytest.raises(TypeError, match="device"):
        device.resolve_device(3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="device"):
        device.resolve_device("not-a-device")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA GPU"):
            device.resolve_device("cuda")
    else:
        with pytest.raises(ValueError, match="CUDA GPU"):
            device.resolve_device(f"cuda:{torch.cuda.device_count()}")
    # Devices kernels does not compute on are refused here, not deep inside torch.
    for name in ("mps", "meta", torch.device("meta")):
        with pytest.raises(ValueError, match="not supported.*'cpu' and 'cuda'"):
            device.resolve_device(name)
    with pytest.raises(ValueError, match="single CPU device"):
        device.resolve_device("cpu:7")
    assert device.resolve_device("cpu:0") == torch.device("cpu:0")


def test_every_public_check_refuses_unsupported_devices() -> None:
    from kernels._checks import check_tensor

    with pytest.raises(ValueError, match="weight is on the 'meta' device"):
        check_tensor("weight", torch.zeros(2, device="meta"))
    device.check_tensor_device("x", torch.zeros(2))


def test_cupy_absence_is_not_an_error() -> None:
    assert isinstance(device.cupy_available(), bool)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine")
def test_cuda_is_default_when_present() -> None:
    assert device.default_device().type == "cuda"


# ---------------------------------------------------------------- the other ``kernels``
def _python(code: str, pythonpath: Path, tmp_path: Path):
    import os
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=str(pythonpath))
    return subprocess.run([sys.executable, "-W", "always", "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path, env=env)


def test_a_shadowing_kernels_package_is_a_loud_import_error(tmp_path: Path) -> None:
    """The PyPI package ``kernels`` first on the path must not hide this one silently."""
    shadow = tmp_path / "site"
    (shadow / "kernels").mkdir(parents=True)
    (shadow / "kernels" / "__init__.py").write_text("IS_OTHER = True\n")
    proc = _python("import data_scripts", shadow, tmp_path)
    assert proc.returncode != 0
    assert "ImportError" in proc.stderr and str(shadow / "kernels" / "__init__.py") in proc.stderr
    assert "pip uninstall kernels" in proc.stderr


def test_the_other_distribution_beside_this_one_warns(tmp_path: Path) -> None:
    site = tmp_path / "site"
    info = site / "kernels-0.4.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kernels\nVersion: 0.4.0\n")
    proc = _python("import kernels, data_scripts; print(kernels.PACKAGE_DIR)", site, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(ROOT / "kernels")
    assert "PackageCollisionWarning" in proc.stderr and "'kernels' 0.4.0 is installed too" in proc.stderr
    assert "pip uninstall kernels" in proc.stderr


def test_no_collision_warning_in_this_environment() -> None:
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-W", "error::RuntimeWarning", "-c", "import kernels, data_scripts"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_docstrings_hold_no_control_characters() -> None:
    # A LaTeX command in a docstring that is not raw and not escaped turns into a control
    # character: ":math:`a^\top`" holds a TAB, "``\r\n``" a carriage return.
    import ast
    import re

    root = Path(__file__).resolve().parents[1]
    bad = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
    found = []
    import warnings

    for folder in ("kernels", "data_scripts", "book/nnk_book", "book/tools", "benchmarks"):
        # (kernels has subpackages: kernels/ntk/, kernels/toeplitz/)
        for path in sorted((root / folder).glob("**/*.py" if folder == "kernels" else "*.py")):
            # an unknown escape (":math:`\sum`") survives as a backslash but warns on import
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                tree = ast.parse(path.read_text(), filename=str(path))
            found += [f"{path.relative_to(root)}: {w.message}" for w in caught
                      if "invalid escape sequence" in str(w.message)]
            for node in ast.walk(tree):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Module)):
                    doc = ast.get_docstring(node, clean=False)
                    if doc and bad.search(doc):
                        found.append(f"{path.relative_to(root)}: {getattr(node, 'name', '<module>')}")
    assert not found, f"docstrings with control characters (escape the backslash or use r\"\"\"): {found}"


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64, torch.complex64])
def test_all_finite_matches_the_entrywise_test(dtype):
    """kernels._checks.all_finite (a sum first, the entry-wise test only when the sum is
    not finite) against torch.isfinite(...).all(): NaN and +-inf anywhere, both signs of
    inf together (their sum is NaN), finite entries whose sum overflows, and empty tensors."""
    from kernels._checks import all_finite, check_tensor

    big = torch.finfo(torch.float16 if dtype == torch.float16 else
                      torch.float32 if dtype in (torch.float32, torch.complex64) else torch.float64).max
    cases = [torch.zeros(0, dtype=dtype), torch.randn(5, 7).to(dtype), torch.full((4, 3), big, dtype=dtype)]
    for bad in (float("nan"), float("inf"), -float("inf")):
        for at in (0, 17, 34):
            x = torch.randn(5, 7).to(dtype)
            x.view(-1)[at] = bad
            cases.append(x)
    both = torch.randn(3, 3).to(dtype)
    both[0, 0], both[2, 2] = float("inf"), -float("inf")
    cases.append(both)
    if dtype.is_complex:
        x = torch.randn(4, 4, dtype=dtype)
        x[1, 1] = complex(0.0, float("nan"))
        cases.append(x)
    for x in cases:
        want = bool(torch.isfinite(x).all())
        assert all_finite(x) == want, x
        if not want:
            with pytest.raises(ValueError, match="x contains NaN or infinite values"):
                check_tensor("x", x, complex_ok=True)
