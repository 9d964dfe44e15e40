"""Build the HTML book from the chapters as the runner executed them.

    python book/tools/build_book.py                    # ci profile -> _build/html
    python book/tools/build_book.py --profile record   # the record scale (~90 min per chapter)
    python book/tools/build_book.py --chapters 01_ntk  # a subset
    python book/tools/build_book.py --executed DIR     # notebooks executed elsewhere

The book has one execution path: ``run_chapters.py`` executes each chapter once with
papermill (profile parameters, time budget, network blocked in ci, thread count, and its
cache of unchanged chapters), and this script stages those executed notebooks in
``_build/stage/<profile>/`` with Jupyter Book's execution switched off, then builds.
What a reader sees is exactly what the tests checked. (``jupyter-book build .`` on the
repository still works and executes the notebooks itself, with their own parameters.)
The build runs with ``-W -n --keep-going``: any warning fails it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run_chapters  # noqa: E402
import scorecard_page  # noqa: E402
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


def stage(profile: str, chapters: list[str], executed: Path, cdn: bool) -> Path:
    """Write the staged book and return its folder."""
    dest = STAGE_ROOT / profile
    if dest.exists():
        shutil.rmtree(dest)
    (dest / "chapters").mkdir(parents=True)
    shutil.copytree(ROOT / "book", dest / "book", ignore=shutil.ignore_patterns("tools", "nnk_book", "__pycache__"))
    if (ROOT / "benchmarks" / "results").exists():
        shutil.copytree(ROOT / "benchmarks" / "results", dest / "benchmarks" / "results")

    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    config["execute"]["execute_notebooks"] = "off"
    for name in chapters:
        src = executed / f"{name}.ipynb"
        if not src.exists():
            raise SystemExit(f"--executed {executed}: {src.name} is missing")
        shutil.copy2(src, dest / "chapters" / src.name)
    # The Reference pages that come from the runs: "Reproduction scorecard" and "Execution status".
    scorecard_page.write_pages(dest / "book", executed, chapters)
    if cdn:
        config["sphinx"]["config"]["nb_ipywidgets_js"] = CDN_WIDGETS
        config["sphinx"]["config"]["mathjax_path"] = CDN_MATHJAX
    (dest / "_config.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    (dest / "_toc.yml").write_text(yaml.safe_dump(_filter_toc(toc, set(chapters)), sort_keys=False))
    return dest


def build(profile: str = "ci", chapters: list[str] | None = None, executed: Path | None = None,
          out: Path = ROOT / "_build" / "html", cdn: bool = False, use_cache: bool | None = None,
          overrides: dict | None = None, scheduler: str | None = None) -> int:
    """Execute (unless ``executed`` is given), stage and build; return the exit status
    (0 = every chapter ran and the book built without warnings)."""
    profile = run_chapters.PROFILE_ALIASES.get(profile, profile)
    chapters = chapters or run_chapters.chapter_names()
    if executed is None:
        results = run_chapters.run(chapters, profile, block_network=profile == "ci",
                                   use_cache=use_cache, overrides=overrides, scheduler=scheduler)
        print(run_chapters.format_table(results), flush=True)
        if not all(r.ok for r in results):
            print("build_book: a chapter failed; the book is not built", file=sys.stderr)
            return 1
        executed = run_chapters.DEFAULT_OUT / profile
    if not cdn:
        try:
            vendor_assets.vendor()
        except vendor_assets.VendorError as exc:
            print(f"build_book: {exc}", file=sys.stderr)
            return 2
    dest = stage(profile, chapters, executed, cdn)
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
    ap.add_argument("--no-cache", dest="cache", action="store_false", default=None,
                    help="execute every chapter even when nothing it depends on changed")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="NAME=VALUE",
                    help="inject a parameter on top of the profile's (see run_chapters.py)")
    ap.add_argument("--out", type=Path, default=ROOT / "_build" / "html")
    ap.add_argument("--cdn", action="store_true",
                    help="load the widget and MathJax scripts from public CDNs instead of "
                         "serving them with the book")
    ap.add_argument("--scheduler", default=None, metavar="ADDRESS",
                    help="run the chapters on a Dask cluster (see run_chapters.py --scheduler)")
    args = ap.parse_args(argv)
    try:
        return build(args.profile, args.chapters, args.executed, args.out, args.cdn,
                     use_cache=args.cache, overrides=run_chapters.parse_overrides(args.overrides),
                     scheduler=args.scheduler)
    except run_chapters.Interrupted as stop:
        print(run_chapters.format_table(stop.results), flush=True)
        return 130


if __name__ == "__main__":
    sys.exit(main())
