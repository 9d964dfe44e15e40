"""The real book: built warning-free from the executed chapters, widgets render offline.

The HTML is built from the notebooks that the regression run already executed (no
second execution); ``make book`` builds the same pages with Jupyter Book executing.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import nbformat
import pytest

import build_book
import run_chapters
from browser import chromium, render, serve

HTML_OUT = run_chapters.ROOT / "_build" / "test-html"
VIEW = "application/vnd.jupyter.widget-view+json"
RENDERED_WIDGET = re.compile(r'class="[^"]*\bwidget-(slider|dropdown|toggle-buttons|radio)\b')

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def book_html(executed_chapters, executed_dir) -> Path:
    if set(executed_chapters) != set(run_chapters.chapter_names()):
        pytest.skip("the book is built only when every chapter was executed")
    failed = [c for c, r in executed_chapters.items() if r.status != "ok"]
    if failed:
        pytest.fail(f"chapters failed to execute: {failed}")
    rc = build_book.build("ci", executed=executed_dir, out=HTML_OUT)
    assert rc == 0, "jupyter-book build -W -n reported warnings or errors (see output above)"
    return HTML_OUT


def test_every_page_is_built(book_html: Path) -> None:
    for page in ("book/intro.html", "book/bibliography.html", "book/execution_status.html",
                 *(f"chapters/{c}.html" for c in run_chapters.chapter_names())):
        assert (book_html / page).exists(), f"{page} was not built"
    status = (book_html / "book" / "execution_status.html").read_text()
    for chapter in run_chapters.chapter_names():
        assert chapter in status, f"{chapter} missing from the execution status page"


def test_glued_numbers_are_in_the_prose(book_html: Path, executed_dir: Path) -> None:
    for chapter in run_chapters.chapter_names():
        source = nbformat.read(str(run_chapters.CHAPTERS / f"{chapter}.ipynb"), as_version=4)
        uses = sum(c.source.count("{glue:") for c in source.cells if c.cell_type == "markdown")
        assert uses >= 5, f"{chapter}: numbers in the prose should be glued from the run"


@pytest.mark.parametrize("chapter", run_chapters.chapter_names())
def test_widgets_embedded_with_static_figure(book_html: Path, chapter: str) -> None:
    html = (book_html / "chapters" / f"{chapter}.html").read_text()
    if VIEW not in html:
        pytest.skip(f"{chapter} has no widget")
    assert "application/vnd.jupyter.widget-state+json" in html
    srcs = re.findall(r'<script[^>]*\bsrc="([^"]+)"', html)
    assert not [s for s in srcs if s.startswith("http")], "scripts must be served with the book"
    assert re.search(r'<img[^>]+src="[^"]*_images/[^"]+\.png"', html), "no static figure"


@pytest.mark.skipif(chromium() is None, reason="Chromium is not installed (Debian: apt-get install chromium)")
@pytest.mark.parametrize("chapter", run_chapters.chapter_names())
def test_widgets_render_in_chromium(book_html: Path, chapter: str) -> None:
    html = (book_html / "chapters" / f"{chapter}.html").read_text()
    views = html.count(VIEW)
    if not views:
        pytest.skip(f"{chapter} has no widget")
    assert not RENDERED_WIDGET.search(html)
    shots = run_chapters.ROOT / "_build" / "screenshots"
    shots.mkdir(parents=True, exist_ok=True)
    with serve(book_html) as url:
        dom = render(f"{url}/chapters/{chapter}.html", screenshot=shots / f"{chapter}.png",
                     budget_ms=30000)
    assert RENDERED_WIDGET.search(dom), f"{chapter}: no widget control rendered"
    # The embed manager inserts one rendered "widget-subarea" next to each view script.
    assert dom.count('class="widget-subarea"') >= views, f"{chapter}: unrendered widget views"
    assert len(re.findall(r'<img[^>]+src="[^"]*_images/', dom)) >= 1, "static figures missing"
