"""Fetch the book's front-end scripts from the npm registry, to serve with the book.

By default the pages load RequireJS and ``@jupyter-widgets/html-manager`` (myst-nb, for
widgets) and MathJax (Sphinx, for equations) from public CDNs, which offline readers
(and this project's build machines) cannot reach: widgets would never render and
equations would show as raw TeX. This script downloads pinned versions with
``npm pack``, checks them against the registry's published sha512 integrity, and copies
the files the pages need into ``book/_static/vendor/`` (git-ignored); ``_config.yml``
points ``nb_ipywidgets_js`` and ``mathjax_path`` there.

    python book/tools/vendor_assets.py          # no-op when already present
    python book/tools/vendor_assets.py --force
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VENDOR = ROOT / "book" / "_static" / "vendor"

# html-manager 1.0.x is the embed manager of ipywidgets 8 (the pinned ipywidgets is 8.1).
PACKAGES = {
    "@jupyter-widgets/html-manager": (
        "1.0.15",
        "sha512-5thBIV6ymNgmPVOHvzx+gGy8ZSKmSazhtGw4/c4xJDVzRhG9PTeQsRjF3FUTopvFi//SABeNz1yp47bCrJ3CQA==",
    ),
    "requirejs": (
        "2.3.8",
        "sha512-7/cTSLOdYkNBNJcDMWf+luFvMriVm7eYxp4BcFCsAX0wF421Vyce5SXP17c+Jd5otXKGNehIonFlyQXSowL6Mw==",
    ),
    # MathJax 3, the major version Sphinx 7 loads by default.
    "mathjax": (
        "3.2.2",
        "sha512-Bt+SSVU8eBG27zChVewOicYs7Xsdt40qm4+UpHyX7k0/O9NliPc+x77k1/FEsPsjKPZGJvtRZM1vO+geW0OhGw==",
    ),
}
FONT_SUFFIXES = (".woff", ".woff2", ".ttf", ".eot", ".svg")
STAMP = VENDOR / "versions.json"


class VendorError(RuntimeError):
    """The scripts could not be fetched (no npm, offline, bad checksum)."""


def _wanted() -> dict[str, str]:
    return {name: version for name, (version, _) in PACKAGES.items()}


def is_vendored() -> bool:
    """True when the pinned files are already in place."""
    try:
        return json.loads(STAMP.read_text()) == _wanted() and all(
            (VENDOR / f).exists() for f in ("require.js", "html-manager/embed-amd.js",
                                            "mathjax/tex-mml-chtml.js"))
    except (OSError, ValueError):
        return False


def _npm_pack(name: str, version: str, integrity: str, dest: Path) -> Path:
    npm = shutil.which("npm")
    if npm is None:
        raise VendorError(
            "npm was not found: it is needed once to fetch the widget and math scripts "
            f"({name}@{version}) from the npm registry. Install Node.js/npm, or build with "
            "--cdn (make book ASSETS=cdn) to load them from public CDNs instead.")
    proc = subprocess.run([npm, "pack", f"{name}@{version}", "--json", "--pack-destination",
                           str(dest)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise VendorError(f"npm pack {name}@{version} failed (offline?):\n{proc.stderr[-2000:]}")
    filename = json.loads(proc.stdout)[0]["filename"]
    tgz = dest / Path(filename).name
    digest = "sha512-" + base64.b64encode(hashlib.sha512(tgz.read_bytes()).digest()).decode()
    if digest != integrity:
        raise VendorError(f"{name}@{version}: checksum {digest} does not match the pinned {integrity}")
    return tgz


def vendor(force: bool = False) -> None:
    """Fetch and install the pinned scripts unless they are already present."""
    if is_vendored() and not force:
        return
    with tempfile.TemporaryDirectory() as tmp:
        tmpdir = Path(tmp)
        staging = tmpdir / "vendor"
        (staging / "html-manager").mkdir(parents=True)
        for name, (version, integrity) in PACKAGES.items():
            tgz = _npm_pack(name, version, integrity, tmpdir)
            with tarfile.open(tgz) as tar:
                tar.extractall(tmpdir / name.replace("/", "_"), filter="data")
            pkg = tmpdir / name.replace("/", "_") / "package"
            if name == "requirejs":
                shutil.copy2(pkg / "require.js", staging / "require.js")
            elif name == "mathjax":
                # MathJax finds its fonts relative to the script: keep the es5/ layout.
                fonts = "output/chtml/fonts/woff-v2"
                shutil.copytree(pkg / "es5" / fonts, staging / "mathjax" / fonts)
                shutil.copy2(pkg / "es5" / "tex-mml-chtml.js", staging / "mathjax")
                shutil.copy2(pkg / "LICENSE", staging / "mathjax" / "LICENSE")
            else:
                dist = pkg / "dist"
                shutil.copy2(dist / "embed-amd.js", staging / "html-manager" / "embed-amd.js")
                for f in dist.iterdir():
                    if f.suffix in FONT_SUFFIXES:
                        shutil.copy2(f, staging / "html-manager" / f.name)
                for lic in ("LICENSE", "LICENSE.txt", "LICENSE.md"):
                    if (pkg / lic).exists():
                        shutil.copy2(pkg / lic, staging / "html-manager" / "LICENSE")
        (staging / "versions.json").write_text(json.dumps(_wanted(), indent=2))
        if VENDOR.exists():
            shutil.rmtree(VENDOR)
        VENDOR.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(staging, VENDOR)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--force", action="store_true", help="fetch again even if present")
    args = ap.parse_args(argv)
    try:
        vendor(force=args.force)
    except VendorError as exc:
        print(f"vendor_assets: {exc}", file=sys.stderr)
        return 1
    print(f"vendor_assets: {', '.join(f'{k}@{v}' for k, v in _wanted().items())} in {VENDOR}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
