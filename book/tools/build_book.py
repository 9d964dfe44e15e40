"""Build the HTML book with the chapters executed under a profile.

    python book/tools/build_book.py                    # ci profile -> _build/html
    python book/tools/build_book.py --profile full     # paper-scale settings
    python book/tools/build_book.py --executed _build/executed/ci   # reuse executed copies

Jupyter Book executes a notebook with the values in its ``parameters`` cell, which are
the full, paper-scale settings. To build with another profile, this script stages the
book in ``_build/stage/<profile>/``: sources and ``_config.yml`` as they are, and each
chapter with the profile's parameters injected by papermill (``prepare_only``, so
Jupyter Book still does the execution, re-executes on every build and fails on the
first cell that raises). With ``--executed`` the already executed notebooks of
``run_chapters.py`` are staged instead and execution is switched off; the test suite
uses this to check the rendered pages without running every chapter twice.
The build runs with ``-W -n --keep-going``: any warning fails it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run_chapters  # noqa: E402
import vendor_assets  # noqa: E402

ROOT = run_chapters.ROOT
STAGE_ROOT = ROOT / "_build" / "stage"
# With --cdn: the scripts myst-nb and Sphinx load by default, from public CDNs.
CDN_MATHJAX = "https://cdn.jsdelivr.net/npm/mathjax@3/es5/tex-mml-chtml.js"
CDN_WIDGETS = {
    "https://cdnjs.cloudflare.com/ajax/libs/require.js/2.3.4/require.min.js": {},
    "https://cdn.jsdelivr.net/npm/@jupyter-widgets/html-manager@1.0.15/dist/embed-amd.js": {
        "data-jupyter-widgets-cdn": "https://cdn.jsdelivr.net/npm/"},
}


def _filter_toc(toc: dict, keep: set[str]) -> dict:
    for part in toc.get("parts", []):
        part["chapters"] = [c for c in part["chapters"]
                            if not c["file"].startswith("chapters/")
                            or Path(c["file"]).name in keep]
    toc["parts"] = [p for p in toc.get("parts", []) if p["chapters"]]
    return toc


def _summary_table(executed: Path) -> str:
    summary = executed / "summary.json"
    if not summary.exists():
        return ""
    rows = json.loads(summary.read_text())
    lines = ["", "## Headless run used for this build", "",
             "These pages were rendered from notebooks executed by "
             "`book/tools/run_chapters.py`:", "",
             "| chapter | profile | seconds | threads | status |", "|---|---|---|---|---|"]
    lines += [f"| {r['chapter']} | {r['profile']} | {r['seconds']:.1f} | {r['threads']} "
              f"| {r['status']} |" for r in rows]
    return "\n".join(lines) + "\n"


def stage(profile: str, chapters: list[str], executed: Path | None, cdn: bool) -> Path:
    """Write the staged book and return its folder."""
    dest = STAGE_ROOT / profile
    if dest.exists():
        shutil.rmtree(dest)
    (dest / "chapters").mkdir(parents=True)
    shutil.copytree(ROOT / "book", dest / "book", ignore=shutil.ignore_patterns("tools", "nnk_book", "__pycache__"))
    if (ROOT / "benchmarks" / "results").exists():
        shutil.copytree(ROOT / "benchmarks" / "results", dest / "benchmarks" / "results")

    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    specs = run_chapters.load_profile(profile)
    if executed is not None:
        config["execute"]["execute_notebooks"] = "off"
        for name in chapters:
            src = executed / f"{name}.ipynb"
            if not src.exists():
                raise SystemExit(f"--executed {executed}: {src.name} is missing")
            shutil.copy2(src, dest / "chapters" / src.name)
        extra = _summary_table(executed)
        if extra:
            status = dest / "book" / "execution_status.md"
            status.write_text(status.read_text() + extra)
    else:
        import papermill as pm  # imported late: slow, and unused with --executed

        config["execute"]["timeout"] = max(specs[c]["budget_s"] for c in chapters)
        for name in chapters:
            pm.execute_notebook(str(ROOT / "chapters" / f"{name}.ipynb"),
                                str(dest / "chapters" / f"{name}.ipynb"),
                                parameters=specs[name]["parameters"], prepare_only=True,
                                kernel_name="python3", progress_bar=False)
    if cdn:
        config["sphinx"]["config"]["nb_ipywidgets_js"] = CDN_WIDGETS
        config["sphinx"]["config"]["mathjax_path"] = CDN_MATHJAX
    (dest / "_config.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    (dest / "_toc.yml").write_text(yaml.safe_dump(_filter_toc(toc, set(chapters)), sort_keys=False))
    return dest


def build(profile: str = "ci", chapters: list[str] | None = None, executed: Path | None = None,
          out: Path = ROOT / "_build" / "html", cdn: bool = False) -> int:
    """Stage and build; return jupyter-book's exit status (0 = built without warnings)."""
    chapters = chapters or run_chapters.chapter_names()
    if not cdn:
        try:
            vendor_assets.vendor()
        except vendor_assets.VendorError as exc:
            print(f"build_book: {exc}", file=sys.stderr)
            return 2
    dest = stage(profile, chapters, executed, cdn)
    # Execution inherits the runner's environment: offline guard for ci, thread counts.
    env = run_chapters.runner_env(threads=os.cpu_count() or 1, block_network=profile == "ci")
    cmd = [str(Path(sys.executable).with_name("jupyter-book")), "build", str(dest),
           "-W", "-n", "--keep-going"]
    print("build_book:", " ".join(cmd), flush=True)
    rc = subprocess.run(cmd, env=env).returncode
    html = dest / "_build" / "html"
    if rc == 0 and html.exists():
        if out.exists():
            shutil.rmtree(out)
        shutil.copytree(html, out)
        print(f"build_book: HTML in {out}")
    return rc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="ci")
    ap.add_argument("--chapters", nargs="*", default=None, help="subset of chapter stems")
    ap.add_argument("--executed", type=Path, default=None,
                    help="folder of executed notebooks (run_chapters.py output); no execution")
    ap.add_argument("--out", type=Path, default=ROOT / "_build" / "html")
    ap.add_argument("--cdn", action="store_true",
                    help="load the widget and MathJax scripts from public CDNs instead of "
                         "serving them with the book")
    args = ap.parse_args(argv)
    return build(args.profile, args.chapters, args.executed, args.out, args.cdn)


if __name__ == "__main__":
    sys.exit(main())
