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

A failed chapter does not sink the book: every chapter is built, the failed one from
its partial executed notebook (or, when none was written, its unexecuted source) with a
note at the top of its page naming the cell it stopped in and its log; glued values it
never computed read "(not computed)", and warnings on that page only (references to
figures it never drew) are not counted (``failed_pages_ext.py``). The command then exits
with status 3 and names the failed chapters; a warning anywhere else still fails it (1).

A subset build (``--chapters 01_ntk``) builds only those pages. Links and references to
the other chapters point at their pages from the last build in ``--out`` when those
exist (a subset build adds its pages to that HTML instead of replacing it), and
otherwise become plain text with "(not in this build)".
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

import run_chapters  # noqa: E402
import scorecard_page  # noqa: E402
import vendor_assets  # noqa: E402

ROOT = run_chapters.ROOT
STAGE_ROOT = ROOT / "_build" / "stage"
TOOLS = Path(__file__).resolve().parent
CHAPTER_FAILED = 3  # exit status: the book was built, but a chapter did not run
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


def failures_from_summary(executed: Path, chapters: list[str]) -> dict[str, dict]:
    """``{chapter: summary row}`` for the chapters that the run in ``executed`` did not finish."""
    summary = executed / "summary.json"
    if not summary.exists():
        return {}
    rows = {r["chapter"]: r for r in json.loads(summary.read_text())}
    return {c: rows[c] for c in chapters if c in rows and rows[c]["status"] not in ("ok", "cached")}


def _plain(text: str) -> str:
    """Text safe inside MyST prose: no role, literal or substitution syntax."""
    return re.sub(r"[`{}|*_<>\\\[\]$]", "'", text)


# --- a failed chapter's page ----------------------------------------------------------

_GLUE_ROLE = re.compile(r"\{glue(?::[a-z]*)?\}`([^`]+)`")


def mark_failed(nb: dict, chapter: str, row: dict, log: Path, executed_partial: bool) -> dict:
    """Put a note at the top of a failed chapter's notebook; glued values it never
    computed read "(not computed)"."""
    glued = {out["metadata"]["scrapbook"]["name"] for cell in nb["cells"]
             for out in cell.get("outputs", []) if out.get("metadata", {}).get("scrapbook")}
    where = f"in {_plain(row['cell'])}" if row.get("cell") else "before its first cell"
    why = _plain(row.get("message") or row["status"])[:300]
    shown = ("the cells up to there, with their outputs" if executed_partial
             else "its cells without outputs (no partial run was saved)")
    note = (f"\n\n:::{{admonition}} This chapter did not run to the end\n:class: error\n"
            f"The `{row['profile']}` run of `{chapter}` stopped ({row['status']}) {where}: {why}\n\n"
            f"This page shows {shown}; values the chapter did not compute read *(not computed)*. "
            f"Its log is `{log}`.\n:::\n\n")

    def unglue(m: re.Match) -> str:
        return m.group(0) if m.group(1).split(":")[0].strip() in glued else "*(not computed)*"

    first = True
    for cell in nb["cells"]:
        if cell["cell_type"] != "markdown":
            continue
        source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        source = _GLUE_ROLE.sub(unglue, source)
        if first:
            head, nl, rest = source.partition("\n")
            source = head + note + rest if head.startswith("# ") else note + source
            first = False
        cell["source"] = source
    return nb


# --- links to chapters outside a subset build ----------------------------------------

_LABEL_DEF = re.compile(r"^\(([\w.:-]+)\)=\s*$|^:name:\s*([\w.:-]+)\s*$", re.M)


def chapter_index(chapters_dir: Path) -> tuple[dict[str, str], dict[str, str]]:
    """``({label: chapter}, {chapter: title})`` from the chapters' sources."""
    labels, titles = {}, {}
    for path in sorted(chapters_dir.glob("*.ipynb")):
        nb = json.loads(path.read_text())
        for cell in nb["cells"]:
            source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
            if cell["cell_type"] == "markdown":
                for m in _LABEL_DEF.finditer(source):
                    labels[m.group(1) or m.group(2)] = path.stem
                if path.stem not in titles:
                    head = re.search(r"^# (.+)$", source, re.M)
                    if head:
                        titles[path.stem] = head.group(1).strip()
            name = cell.get("metadata", {}).get("mystnb", {}).get("figure", {}).get("name")
            if name:
                labels[name] = path.stem
    return labels, titles


_LINK = re.compile(r"\[([^\]]+)\]\((?:\.\./chapters/|\./)?(\d\d_\w+)\.(?:ipynb|md)(#[\w-]+)?\)")
_REF = re.compile(r"\{(ref|numref|doc)\}`([^`]+)`")


def unlink_missing(text: str, missing: set[str], labels: dict[str, str], titles: dict[str, str],
                   pages: dict[str, str], from_dir: str) -> str:
    """Rewrite links and references to chapters in ``missing`` (not in this build).

    A chapter with a page from an earlier build (``pages``: chapter -> path of its HTML
    relative to the book root) gets a plain HTML link to it; one without becomes its
    text with "(not in this build)".
    """
    def target(chapter: str, anchor: str, shown: str) -> str:
        if chapter in pages:
            href = os.path.relpath(pages[chapter], from_dir) + anchor
            return f'<a href="{href}">{shown}</a>'
        return f"{shown} (not in this build)"

    def link(m: re.Match) -> str:
        chapter = m.group(2)
        if chapter not in missing:
            return m.group(0)
        return target(chapter, m.group(3) or "", m.group(1))

    def ref(m: re.Match) -> str:
        kind, body = m.groups()
        explicit = re.fullmatch(r"(.*?)\s*<([^>]+)>", body, re.S)
        shown, name = (explicit.group(1), explicit.group(2)) if explicit else (None, body)
        name = name.strip()
        if kind == "doc":
            chapter = Path(name).name
            if chapter not in missing:
                return m.group(0)
            return target(chapter, "", shown or titles.get(chapter, chapter))
        chapter = labels.get(name)
        if chapter not in missing:
            return m.group(0)
        default = titles.get(chapter, chapter)
        if kind == "numref" and shown and "%s" in shown:
            shown = shown.replace("%s", "").strip()
        return target(chapter, f"#{name}", shown or default)

    return _REF.sub(ref, _LINK.sub(link, text))


def stage(profile: str, chapters: list[str], executed: Path, cdn: bool,
          failures: dict[str, dict] | None = None, out: Path | None = None) -> Path:
    """Write the staged book and return its folder.

    ``failures`` (chapter -> summary row) marks failed chapters' pages; ``out`` is where
    an earlier build's pages of the chapters outside ``chapters`` may be linked to.
    """
    failures = failures or {}
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
        if name in failures:
            partial = src.exists() and _readable(src)
            nb = json.loads((src if partial else run_chapters.CHAPTERS / src.name).read_text())
            nb = mark_failed(nb, name, failures[name], executed / f"{name}.log", partial)
            (dest / "chapters" / src.name).write_text(json.dumps(nb, indent=1))
            continue
        if not src.exists():
            raise SystemExit(f"--executed {executed}: {src.name} is missing")
        shutil.copy2(src, dest / "chapters" / src.name)
    # The Reference pages that come from the runs: "Reproduction scorecard" and "Execution status".
    scorecard_page.write_pages(dest / "book", executed, chapters)
    if failures:
        shutil.copy2(TOOLS / "failed_pages_ext.py", dest / "book" / "_ext" / "failed_pages_ext.py")
        config["sphinx"]["local_extensions"]["failed_pages_ext"] = "book/_ext"
        config["sphinx"]["config"]["nnk_failed_pages"] = [f"chapters/{c}" for c in sorted(failures)]
    missing = set(run_chapters.chapter_names()) - set(chapters)
    if missing:
        labels, titles = chapter_index(run_chapters.CHAPTERS)
        pages = {c: f"chapters/{c}.html" for c in missing
                 if out is not None and (out / "chapters" / f"{c}.html").exists()}
        for md in (dest / "book").rglob("*.md"):
            rel_dir = str(md.parent.relative_to(dest))
            md.write_text(unlink_missing(md.read_text(), missing, labels, titles, pages, rel_dir))
        for path in (dest / "chapters").glob("*.ipynb"):
            nb = json.loads(path.read_text())
            for cell in nb["cells"]:
                if cell["cell_type"] == "markdown":
                    source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
                    cell["source"] = unlink_missing(source, missing, labels, titles, pages, "chapters")
            path.write_text(json.dumps(nb, indent=1))
    if cdn:
        config["sphinx"]["config"]["nb_ipywidgets_js"] = CDN_WIDGETS
        config["sphinx"]["config"]["mathjax_path"] = CDN_MATHJAX
    (dest / "_config.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    (dest / "_toc.yml").write_text(yaml.safe_dump(_filter_toc(toc, set(chapters)), sort_keys=False))
    return dest


def _readable(path: Path) -> bool:
    try:
        json.loads(path.read_text())
        return True
    except (OSError, ValueError):
        return False


def build(profile: str = "ci", chapters: list[str] | None = None, executed: Path | None = None,
          out: Path = ROOT / "_build" / "html", cdn: bool = False, use_cache: bool | None = None,
          overrides: dict | None = None, scheduler: str | None = None) -> int:
    """Execute (unless ``executed`` is given), stage and build; return the exit status:
    0 = every chapter ran and the book built without warnings; :data:`CHAPTER_FAILED`
    = the book was built but a chapter did not run (its page says so); other = the
    Sphinx build failed. With ``executed``, failures are read from its ``summary.json``."""
    profile = run_chapters.PROFILE_ALIASES.get(profile, profile)
    chapters = chapters or run_chapters.chapter_names()
    if executed is None:
        results = run_chapters.run(chapters, profile, block_network=profile == "ci",
                                   use_cache=use_cache, overrides=overrides, scheduler=scheduler)
        print(run_chapters.format_table(results), flush=True)
        executed = run_chapters.DEFAULT_OUT / profile
        failures = {r.chapter: dict(vars(r)) for r in results if not r.ok}
    else:
        failures = failures_from_summary(executed, chapters)
    if not cdn:
        try:
            vendor_assets.vendor()
        except vendor_assets.VendorError as exc:
            print(f"build_book: {exc}", file=sys.stderr)
            return 2
    dest = stage(profile, chapters, executed, cdn, failures, out)
    env = run_chapters.runner_env(threads=os.cpu_count() or 1, block_network=profile == "ci")
    cmd = [str(Path(sys.executable).with_name("jupyter-book")), "build", str(dest),
           "-W", "-n", "--keep-going"]
    print("build_book:", " ".join(cmd), flush=True)
    rc = subprocess.run(cmd, env=env).returncode
    html = dest / "_build" / "html"
    if rc == 0 and html.exists():
        subset = set(chapters) != set(run_chapters.chapter_names())
        if out.exists() and not subset:
            shutil.rmtree(out)
        # A subset build adds its pages to the last build's, whose other chapters it links to.
        shutil.copytree(html, out, dirs_exist_ok=True)
        print(f"build_book: HTML in {out}")
    for name, row in failures.items():
        print(f"build_book: chapter {name} did not run ({row['status']}"
              + (f" in {row['cell']}" if row.get("cell") else "") + f"); log: "
              f"{executed / (name + '.log')}; its page says so", file=sys.stderr)
    if rc != 0:
        return rc
    if failures:
        print(f"build_book: the book was built, but {len(failures)} chapter(s) failed: "
              + ", ".join(sorted(failures)), file=sys.stderr)
        return CHAPTER_FAILED
    return 0


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
