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
from browser import (browser_page, chromium, control_positions, current_position, explorer_controls,
                     load, serve, set_position, shown_figure)
from nnk_book import figures

HTML_OUT = run_chapters.ROOT / "_build" / "test-html"
VIEW = "application/vnd.jupyter.widget-view+json"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def book_html(executed_chapters, executed_dir) -> Path:
    """The book built from the executed chapters; a failed chapter's page is built too,
    marked (test_chapter_executes is the one failure that names it)."""
    if set(executed_chapters) != set(run_chapters.chapter_names()):
        pytest.skip("the book is built only when every chapter was executed")
    failed = sorted(c for c, r in executed_chapters.items() if not r.ok)
    rc = build_book.build("ci", executed=executed_dir, out=HTML_OUT)
    expected = build_book.CHAPTER_FAILED if failed else 0
    assert rc == expected, "jupyter-book build -W -n reported warnings or errors (see output above)"
    return HTML_OUT


def test_subset_build_succeeds(executed_chapters, executed_dir, tmp_path) -> None:
    """The README's `make book CHAPTERS=01_ntk`, from the executed notebook (no re-run)."""
    ran(executed_chapters, "01_ntk")
    out = tmp_path / "html"
    assert build_book.build("ci", chapters=["01_ntk"], executed=executed_dir, out=out) == 0
    assert (out / "chapters" / "01_ntk.html").exists()
    assert "(not in this build)" in (out / "chapters" / "01_ntk.html").read_text()


def ran(executed_chapters, chapter: str) -> None:
    result = executed_chapters.get(chapter)
    if result is not None and not result.ok:
        pytest.skip(f"chapter {chapter} did not run: see test_chapter_executes[{chapter}]")


def test_every_page_is_built(book_html: Path, executed_dir: Path) -> None:
    for page in ("book/intro.html", "book/bibliography.html", "book/execution_status.html", "book/scorecard.html",
                 *(f"chapters/{c}.html" for c in run_chapters.chapter_names())):
        assert (book_html / page).exists(), f"{page} was not built"
    for chapter in build_book.failures_from_summary(executed_dir, run_chapters.chapter_names()):
        page = (book_html / "chapters" / f"{chapter}.html").read_text()
        assert "did not run to the end" in page, f"{chapter} failed but its page does not say so"
    status = (book_html / "book" / "execution_status.html").read_text()
    for chapter in run_chapters.chapter_names():
        assert chapter in status, f"{chapter} missing from the execution status page"


def test_glued_numbers_are_in_the_prose(book_html: Path, executed_dir: Path) -> None:
    for chapter in run_chapters.chapter_names():
        source = nbformat.read(str(run_chapters.CHAPTERS / f"{chapter}.ipynb"), as_version=4)
        uses = sum(c.source.count("{glue:") for c in source.cells if c.cell_type == "markdown")
        assert uses >= 5, f"{chapter}: numbers in the prose should be glued from the run"


@pytest.mark.parametrize("chapter", run_chapters.chapter_names())
def test_widgets_are_embedded_and_served_with_the_book(book_html: Path, executed_chapters,
                                                      chapter: str) -> None:
    ran(executed_chapters, chapter)
    html = (book_html / "chapters" / f"{chapter}.html").read_text()
    assert VIEW in html, f"{chapter} has no widget (every chapter teaches its trade-off with one)"
    assert "application/vnd.jupyter.widget-state+json" in html
    srcs = re.findall(r'<script[^>]*\bsrc="([^"]+)"', html)
    assert not [s for s in srcs if s.startswith("http")], "scripts must be served with the book"
    state = re.search(r'<script type="application/vnd.jupyter.widget-state\+json">(.*?)</script>',
                      html, re.S)
    assert state and len(state.group(1)) < 2_500_000, f"{chapter}: widget state over 2.5 MB"


def test_no_link_leads_nowhere(book_html: Path) -> None:
    """No launch, repository or issue button while the repository has no public address."""
    for page in book_html.rglob("*.html"):
        html = page.read_text()
        for bad in ("mybinder.org", "colab.research.google.com", "github.com/nn-kernels",
                    "github.com/executablebooks/jupyter-book", "binder-examples", "example.com"):
            assert bad not in html, f"{page.relative_to(book_html)} links to {bad}"


# --- In a real browser: every page clean, every widget responding, figures legible ----

needs_chromium = pytest.mark.skipif(
    chromium() is None, reason="Chromium is not installed (Debian: apt-get install chromium)")
PAGES = ["book/intro.html", "book/bibliography.html", "book/execution_status.html", "book/scorecard.html",
         *(f"chapters/{c}.html" for c in run_chapters.chapter_names())]
# A figure's smallest text is MIN_FONT_PT at DPI (nnk_book.figures); shown at `scale` times
# its natural size it must stay at least 9 CSS px high.
MIN_TEXT_PX = 9.0
MIN_SCALE = MIN_TEXT_PX / (figures.MIN_FONT_PT * figures.DPI / 72)

MEASURE = r"""() => {
  const article = document.querySelector('article') || document.body;
  const imgs = [...article.querySelectorAll('img')].filter(i => i.offsetParent !== null);
  const figures = imgs.map(i => ({
    src: (i.getAttribute('src') || '').slice(0, 60), alt: i.getAttribute('alt') || '',
    natural: i.naturalWidth, shown: i.getBoundingClientRect().width,
    explorer: !!i.closest('.nnk-explorer'),
    caption: !!(i.closest('figure') && i.closest('figure').querySelector('figcaption'))}));
  const wide = [...article.querySelectorAll('pre, table, .cell_output > div, div.math')]
    .filter(e => e.scrollWidth > e.clientWidth + 1)
    .map(e => e.tagName + '.' + e.className + ': ' + e.scrollWidth + ' > ' + e.clientWidth);
  return {figures, wide, pageWide: document.documentElement.scrollWidth > window.innerWidth,
          math: document.querySelectorAll('mjx-container').length,
          rawMath: (article.innerText.match(/\\\(|\$\$/g) || []).length};
}"""


@needs_chromium
@pytest.mark.parametrize("page", PAGES)
def test_page_is_clean_and_readable(book_html: Path, executed_chapters, page: str) -> None:
    ran(executed_chapters, Path(page).stem)
    with serve(book_html) as url, browser_page() as (tab, log):
        load(tab, f"{url}/{page}")
        found = tab.evaluate(MEASURE)
    assert not log.problems(), f"{page}: " + "; ".join(log.problems()[:8])
    assert not found["pageWide"], f"{page} scrolls sideways at 1280 px"
    assert not found["wide"], f"{page}: elements scroll sideways: {found['wide'][:5]}"
    assert found["rawMath"] == 0, f"{page}: untypeset TeX left on the page"
    if page.startswith("chapters/"):
        assert found["math"] > 0, f"{page}: MathJax typeset nothing"
    for fig in found["figures"]:
        where = f"{page}: image {fig['src']}"
        assert fig["natural"] > 0, f"{where} did not load"
        assert fig["alt"].strip(), f"{where} has no alt text"
        assert fig["explorer"] or fig["caption"], f"{where} has no caption"
        scale = fig["shown"] / fig["natural"]
        assert scale >= MIN_SCALE, (
            f"{where} is {fig['natural']} px wide, shown at {fig['shown']:.0f} px: its "
            f"{figures.MIN_FONT_PT}-pt text would be {scale * figures.MIN_FONT_PT * figures.DPI / 72:.1f} px")


def _positions_to_try(count: int, start: int) -> list[int]:
    others = [p for p in range(count) if p != start]
    if len(others) <= 3:
        return others
    return [others[0], others[len(others) // 2], others[-1]]


@needs_chromium
@pytest.mark.parametrize("chapter", run_chapters.chapter_names())
def test_every_widget_responds_without_a_kernel(book_html: Path, executed_chapters,
                                                chapter: str) -> None:
    ran(executed_chapters, chapter)
    html = (book_html / "chapters" / f"{chapter}.html").read_text()
    views = html.count(VIEW)
    moved = 0
    with serve(book_html) as url, browser_page() as (tab, log):
        load(tab, f"{url}/chapters/{chapter}.html", settle_ms=3000)
        explorers = tab.locator(".nnk-explorer")
        assert explorers.count() >= 1, f"{chapter}: no widget rendered"
        # Every widget on the page is a precomputed-figure explorer (a Python callback
        # would be dead here): the rendered views are exactly the explorers.
        assert tab.locator(".widget-subarea").count() == views, f"{chapter}: unrendered widget views"
        assert explorers.count() == views, f"{chapter}: a widget that is not a figure explorer"
        for e in range(explorers.count()):
            explorer = explorers.nth(e)
            explorer.scroll_into_view_if_needed()
            controls = explorer_controls(explorer)
            assert controls, f"{chapter}: explorer {e} has no control"
            for kind, control in controls:
                start = current_position(kind, control)
                shown = shown_figure(explorer)
                for position in _positions_to_try(control_positions(kind, control), start):
                    set_position(tab, kind, control, position)
                    assert current_position(kind, control) == position
                    now = shown_figure(explorer)
                    assert now[0] != shown[0], (
                        f"{chapter}: explorer {e}, {kind} at position {position}: the figure did not change")
                    assert now[1] != shown[1], f"{chapter}: explorer {e}: alt text did not change"
                    moved += 1
                set_position(tab, kind, control, start)
                assert shown_figure(explorer) == shown, (
                    f"{chapter}: explorer {e}: the figure did not come back with the {kind}")
    assert moved >= 2
    assert not log.problems(), f"{chapter}: " + "; ".join(log.problems()[:8])


SCORECARD_STATE = r"""() => {
  const rows = [...document.querySelectorAll('tbody.nnk-claim')];
  return {
    visible: rows.filter(r => !r.hidden).map(r => [r.id, r.dataset.status, r.dataset.disagree === '1']),
    total: rows.length,
    wide: [...document.querySelectorAll('table.nnk-scorecard, .nnk-scorecard-wrap')]
      .filter(e => e.offsetParent !== null && e.scrollWidth > e.clientWidth + 1).length,
    buttons: [...document.querySelectorAll('button.nnk-filter')].map(b => [b.dataset.filter, b.textContent]),
  };
}"""


def test_scorecard_links_lead_to_their_sections(book_html: Path) -> None:
    """Every link of the scorecard's claims table leads to a page of the book and an id on it."""
    import html as html_lib
    from urllib.parse import urldefrag

    page = book_html / "book" / "scorecard.html"
    text = page.read_text()
    links = set(re.findall(r'<a class="reference internal" href="([^"]+)"', text.split('nnk-filter-bar', 1)[-1]))
    assert links, "the scorecard's claims table has no links"
    missing = []
    for href in sorted(links):
        target, fragment = urldefrag(html_lib.unescape(href))
        path = (page.parent / target).resolve() if target else page
        if not path.exists() or (fragment and f'id="{fragment}"' not in path.read_text()):
            missing.append(href)
    assert not missing, f"scorecard links that lead nowhere: {missing}"


@needs_chromium
def test_scorecard_filters_show_each_status(book_html: Path) -> None:
    """Each status button shows exactly the claims of its status (as many as it says), "all"
    shows every claim, a link to one claim opens it, and the table never scrolls sideways
    at the book's column width."""
    with serve(book_html) as url, browser_page() as (tab, log):
        load(tab, f"{url}/book/scorecard.html")
        state = tab.evaluate(SCORECARD_STATE)
        total = state["total"]
        assert total and len(state["visible"]) == total and state["wide"] == 0
        assert len(state["buttons"]) >= 2
        for name, label in state["buttons"]:
            tab.locator(f'button.nnk-filter[data-filter="{name}"]').first.click()
            tab.wait_for_timeout(100)
            now = tab.evaluate(SCORECARD_STATE)
            shown = now["visible"]
            count = int(re.search(r"\((\d+)\)", label).group(1))
            assert len(shown) == count, f"filter {name!r}: {len(shown)} claims shown, the button says {count}"
            if name == "all":
                assert len(shown) == total
            elif name == "disagree":
                assert all(d for _, _, d in shown)
            else:
                assert all(s == name for _, s, _ in shown), f"filter {name!r} shows other statuses"
            assert now["wide"] == 0, f"filter {name!r}: the table scrolls sideways"
        first = state["visible"][0][0]
        tab.locator('button.nnk-filter[data-filter="all"]').first.click()
        tab.goto(f"{url}/book/scorecard.html#{first}", wait_until="networkidle")
        tab.wait_for_timeout(300)
        assert tab.locator(f"#{first} details").first.evaluate("d => d.open"), "a link to a claim does not open it"
    assert not log.problems(), "; ".join(log.problems()[:8])
