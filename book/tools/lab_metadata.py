"""Make the chapters read in JupyterLab as they do in the book.

The book folds and hides cells by their tags (``hide-input``, ``remove-cell``, ...),
which JupyterLab ignores; JupyterLab collapses a cell by ``metadata.jupyter``
(``source_hidden``, ``outputs_hidden``), which the book ignores. This tool derives the
second from the first, so that a learner who opens a chapter with ``make lab`` sees the
same lesson as a reader of the page.

It also writes the reference index that the JupyterLab extension ``book/lab/nnk-lab``
uses to render the chapters' MyST roles: the title of every ``(label)=`` target, the
number of every named figure ("Figure 1.3", as the book numbers them), the title of every
page, and a short author-year form of every bibliography entry. Beside it, ``recorded.json``
holds what the role ``{recorded}`` shows (``book/_ext/recorded.py``): each chapter's largest
record in ``book/runs/``, its values as Python reprs (as glued values are), its facts
(``@recorded``, ``@minutes``, ...) and one line of provenance.

    python book/tools/lab_metadata.py           # rewrite what is out of date
    python book/tools/lab_metadata.py --check   # list what is out of date, exit 1 if any

The outputs are a pure function of the chapters, the book's pages, ``book/references.bib``
and the records: rerun the tool after changing any of them (``tests/test_lab.py``
fails until then).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

import nbformat

ROOT = Path(__file__).resolve().parents[2]
CHAPTERS = ROOT / "chapters"
PAGES = ROOT / "book"
BIBLIOGRAPHY = ROOT / "book" / "references.bib"
INDEX = ROOT / "book" / "lab" / "nnk-lab" / "static" / "references.json"
RECORDED = INDEX.with_name("recorded.json")
RUNS = ROOT / "book" / "runs"

# Which part of a cell each book tag hides (myst-nb's and jupyter-book's tags).
SOURCE_TAGS = {"hide-input", "remove-input", "hide-cell", "remove-cell"}
OUTPUT_TAGS = {"hide-output", "remove-output", "hide-cell", "remove-cell"}

_LABEL = re.compile(r"^\(([^()\s]+)\)=\s*$")
_HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")


def folding(tags: list[str]) -> dict[str, bool]:
    """The ``metadata.jupyter`` entries that collapse in JupyterLab what ``tags`` hide in the book."""
    shown: dict[str, bool] = {}
    if SOURCE_TAGS & set(tags):
        shown["source_hidden"] = True
    if OUTPUT_TAGS & set(tags):
        shown["outputs_hidden"] = True
    return shown


def fold(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """``nb`` with every cell's ``source_hidden``/``outputs_hidden`` set from its tags (in place).

    The tool owns these two keys: a cell without a folding tag loses them, and an empty
    ``jupyter`` entry is removed.
    """
    for cell in nb.cells:
        jupyter = dict(cell.metadata.get("jupyter", {}))
        jupyter.pop("source_hidden", None)
        jupyter.pop("outputs_hidden", None)
        jupyter.update(folding(list(cell.metadata.get("tags", []))))
        if jupyter:
            cell.metadata["jupyter"] = jupyter
        else:
            cell.metadata.pop("jupyter", None)
    return nb


def _plain(text: str) -> str:
    """A heading or bib field without MyST/LaTeX markup, for display as text."""
    text = re.sub(r"\{\\[a-zA-Z]+\s*\{?([^{}]*)\}?\}", r"\1", text)  # {\'e} -> e, {\"o} -> o
    text = re.sub(r"\\[`'\"^~=.]\{?([a-zA-Z])\}?", r"\1", text)
    text = text.replace("{", "").replace("}", "")
    return text.replace("`", "").strip()


def section_titles(markdown: str) -> dict[str, str]:
    """``{label: title}`` for each ``(label)=`` line of ``markdown`` that precedes a heading."""
    titles: dict[str, str] = {}
    pending: list[str] = []
    for line in markdown.splitlines():
        label = _LABEL.match(line)
        if label:
            pending.append(label.group(1))
            continue
        heading = _HEADING.match(line)
        if heading:
            titles.update({name: _plain(heading.group(1)) for name in pending})
        if line.strip():
            pending = []
    return titles


def _first_title(markdown: str) -> str | None:
    for line in markdown.splitlines():
        heading = _HEADING.match(line)
        if heading and line.startswith("# "):
            return _plain(heading.group(1))
    return None


def _chapter_number(path: Path) -> int:
    return int(path.stem.split("_", 1)[0])


def citation(entry: Any) -> str:
    """``"Jacot et al. 2018"``: the author-year form of a pybtex entry."""
    people = entry.persons.get("author") or entry.persons.get("editor") or []
    names = [_plain(" ".join(p.last_names)) for p in people]
    if not names:
        who = _plain(entry.fields.get("title", "?"))
    elif len(names) == 1:
        who = names[0]
    elif len(names) == 2:
        who = f"{names[0]} and {names[1]}"
    else:
        who = f"{names[0]} et al."
    year = entry.fields.get("year", "")
    return f"{who} {year}".strip()


def reference_index(chapters: list[Path], pages: list[Path], bibliography: Path) -> dict[str, dict[str, str]]:
    """The text that stands for each ``{ref}``, ``{numref}``, ``{doc}`` and ``{cite}`` target."""
    from pybtex.database import parse_file

    ref: dict[str, str] = {}
    numref: dict[str, str] = {}
    doc: dict[str, str] = {}
    for path in chapters:
        nb = nbformat.read(str(path), as_version=4)
        figures = 0
        for cell in nb.cells:
            if cell.cell_type == "markdown":
                ref.update(section_titles(cell.source))
                title = _first_title(cell.source)
                if title and path.stem not in doc:
                    doc[path.stem] = title
            name = cell.metadata.get("mystnb", {}).get("figure", {}).get("name")
            if cell.cell_type == "code" and name:
                figures += 1
                numref[name] = f"Figure {_chapter_number(path)}.{figures}"
                ref[name] = numref[name]
    for path in pages:
        text = path.read_text(encoding="utf-8")
        ref.update(section_titles(text))
        title = _first_title(text)
        if title:
            doc[path.stem] = title
        first = next((line for line in text.splitlines() if line.strip()), "")
        label = _LABEL.match(first)
        if label and title:
            ref.setdefault(label.group(1), title)
    cite = {key: citation(entry) for key, entry in parse_file(str(bibliography)).entries.items()}
    return {key: dict(sorted(table.items()))
            for key, table in (("cite", cite), ("doc", doc), ("numref", numref), ("ref", ref))}


def record_facts(data: dict[str, Any]) -> dict[str, Any]:
    """The facts ``@name`` of a record that the ``{recorded}`` role knows (``book/_ext/recorded.py``)."""
    from nnk_book.records import run_seconds, run_starts

    seconds = run_seconds(data)
    return {"recorded": data.get("recorded"), "minutes": None if seconds is None else seconds / 60,
            "starts": run_starts(data), "threads": data.get("machine", {}).get("threads"),
            "profile": data.get("profile"), "commit": data.get("commit")}


def recorded_index(chapters: list[Path], runs: Path = RUNS) -> dict[str, dict[str, Any]]:
    """``{chapter: {"title", "values", "facts"}}`` of each chapter's largest record (``paper``
    before ``record``): values and facts as Python reprs, which the extension formats as it
    formats glued values; ``title``: where the record comes from. Whether the record is current
    needs the chapter's teaching run, which only the book's build has: the title does not say."""
    from nnk_book.records import RECORD_PROFILES

    index: dict[str, dict[str, Any]] = {}
    for path in chapters:
        found = [runs / f"{path.stem}.{profile}.json" for profile in RECORD_PROFILES]
        file = next((f for f in found if f.exists()), None)
        if file is None:
            continue
        data = json.loads(file.read_text(encoding="utf-8"))
        machine = data.get("machine", {})
        title = (f"{data.get('profile', '?')} run of {data.get('recorded', '?')}, commit {data.get('commit', '?')}, "
                 f"{machine.get('cpu', '?')}, {machine.get('threads', '?')} thread(s) "
                 f"(book/runs/{file.name})")
        index[path.stem] = {
            "title": title,
            "values": {name: repr(v) for name, v in sorted(data.get("values", {}).items()) if v is not None},
            "facts": {name: repr(v) for name, v in record_facts(data).items() if v is not None},
        }
    return index


def _notebook_text(nb: nbformat.NotebookNode) -> str:
    return nbformat.writes(nb) + "\n"


def out_of_date(write: bool) -> list[Path]:
    """The files (chapters, reference index, recorded values) that differ from what the tool makes; rewrite them if ``write``."""
    stale: list[Path] = []
    chapters = sorted(CHAPTERS.glob("*.ipynb"))
    for path in chapters:
        text = path.read_text(encoding="utf-8")
        folded = _notebook_text(fold(nbformat.reads(text, as_version=4)))
        if folded != text:
            stale.append(path)
            if write:
                path.write_text(folded, encoding="utf-8")
    made = {INDEX: reference_index(chapters, sorted(PAGES.glob("*.md")), BIBLIOGRAPHY),
            RECORDED: recorded_index(chapters)}
    for file, content in made.items():
        text = json.dumps(content, indent=1, ensure_ascii=False) + "\n"
        if not file.exists() or file.read_text(encoding="utf-8") != text:
            stale.append(file)
            if write:
                file.parent.mkdir(parents=True, exist_ok=True)
                file.write_text(text, encoding="utf-8")
    return stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only list what is out of date; exit 1 if any")
    args = parser.parse_args(argv)
    stale = out_of_date(write=not args.check)
    for path in stale:
        print(f"{'out of date' if args.check else 'rewrote'}: {path.relative_to(ROOT)}")
    return 1 if (args.check and stale) else 0


if __name__ == "__main__":
    sys.exit(main())
