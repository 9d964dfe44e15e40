"""How the book is built: re-execution, failures, warnings, widgets, math, launch buttons.

These build a two-page book with the project's own ``_config.yml`` (a few seconds
each), so they check the configuration itself rather than any chapter.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from browser import (browser_page, chromium, explorer_controls, load, render, serve, set_position,
                     shown_figure)
from minibook import ROOT, build, make_book

TOKEN = ("code", "import time\nprint('token', time.time_ns())")
WIDGET = ("code", """\
import matplotlib.pyplot as plt
from nnk_book import Choice, figure_explorer, use_book_style
use_book_style()
def draw(n, style):
    fig, ax = plt.subplots(figsize=(4, 2))
    ax.plot(range(5), [n * x for x in range(5)], style)
    ax.set(title=f"slope {n}", xlabel="x (units)", ylabel="y (units)")
    return fig
figure_explorer(draw, {"n": Choice("slope", [1, 2, 3], default=2),
                       "style": Choice("marker", ["o-", "s--"], kind="dropdown")},
                alt=lambda n, style: f"A line of slope {n} drawn with {style}")""")
FIGURE = ("code", "import matplotlib.pyplot as plt\n"
                  "fig, ax = plt.subplots()\nax.plot([1, 2, 3])\nax.set_title('static')\nplt.show()")
MATH = ("md", "Inline $e^{i\\pi} + 1 = 0$ and displayed\n\n$$\\Theta(x, x') = \\nabla f(x)^\\top \\nabla f(x')$$")
RENDERED_SLIDER = re.compile(r'class="[^"]*\bwidget-slider\b')


@pytest.fixture(scope="module")
def widget_book(tmp_path_factory) -> Path:
    book = make_book(tmp_path_factory.mktemp("widget_book"), [MATH, TOKEN, WIDGET, FIGURE])
    proc = build(book)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return book


def _page(book: Path) -> str:
    return (book / "_build" / "html" / "chapters" / "page.html").read_text()


def test_unchanged_rebuild_executes_again(widget_book: Path) -> None:
    first = re.findall(r"token \d+", _page(widget_book))
    proc = build(widget_book)
    assert proc.returncode == 0
    second = re.findall(r"token \d+", _page(widget_book))
    assert first and second and first != second, "the rebuild reused stale outputs"


def test_raising_notebook_fails_the_build(tmp_path: Path) -> None:
    book = make_book(tmp_path, [("code", "raise RuntimeError('boom in cell')")])
    proc = build(book)
    assert proc.returncode != 0
    assert "boom in cell" in proc.stdout + proc.stderr


def test_warning_fails_the_build(tmp_path: Path) -> None:
    book = make_book(tmp_path, [("md", "A citation that does not exist {cite}`no_such_key`.")])
    proc = build(book)
    assert proc.returncode != 0
    assert "no_such_key" in proc.stdout + proc.stderr


def test_widget_scripts_are_served_with_the_book(widget_book: Path) -> None:
    html = _page(widget_book)
    assert "application/vnd.jupyter.widget-state+json" in html, "widget state not embedded"
    assert "application/vnd.jupyter.widget-view+json" in html
    srcs = re.findall(r'<script[^>]*\bsrc="([^"]+)"', html)
    assert any(s.startswith("../_static/vendor/require.js") for s in srcs), srcs
    assert any(s.startswith("../_static/vendor/html-manager/embed-amd.js") for s in srcs), srcs
    assert not [s for s in srcs if s.startswith("http")], "a script is loaded from the network"
    assert any(s.startswith("../_static/vendor/mathjax/tex-mml-chtml.js") for s in srcs), srcs
    static = widget_book / "_build" / "html" / "_static" / "vendor"
    assert (static / "html-manager" / "embed-amd.js").stat().st_size > 1_000_000
    assert list((static / "mathjax" / "output" / "chtml" / "fonts" / "woff-v2").glob("*.woff"))


def test_no_button_leads_nowhere(widget_book: Path) -> None:
    """No launch/repository/issue buttons (no public repository yet); download stays."""
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    assert not config["launch_buttons"].get("binderhub_url")
    assert not config["launch_buttons"].get("colab_url")
    assert "repository" not in config, "a repository URL in _config.yml must be real: remove it until it is"
    assert not any(config["html"].get(k) for k in
                   ("use_repository_button", "use_issues_button", "use_edit_page_button"))
    urls = re.findall(r"https?://[^\s\"'<>]+", (ROOT / "_config.yml").read_text())
    assert all("cdn.jsdelivr.net" in u or "jupyterbook.org" in u for u in urls), urls
    html = _page(widget_book)
    for bad in ("colab.research.google.com", "mybinder.org", "github.com", "THEBE_JS_URL"):
        assert bad not in html, f"the page still mentions {bad}"
    assert ".ipynb" in html, "the download-.ipynb button is gone"


@pytest.mark.skipif(chromium() is None, reason="Chromium is not installed (Debian: apt-get install chromium)")
def test_widget_renders_offline_in_chromium(widget_book: Path, tmp_path: Path) -> None:
    html_dir = widget_book / "_build" / "html"
    assert not RENDERED_SLIDER.search(_page(widget_book)), "slider markup before any script ran"
    with serve(html_dir) as url:
        dom = render(f"{url}/chapters/page.html", screenshot=tmp_path / "page.png")
    assert RENDERED_SLIDER.search(dom), "the embedded widget did not render"
    assert 'alt="A line of slope 2 drawn with o-"' in dom, "the explorer's default figure is missing"
    assert re.search(r'<img[^>]+src="[^"]*\.png"', dom), "the static figure is missing"
    assert dom.count("<mjx-container") >= 2, "MathJax did not typeset the equations"


@pytest.mark.skipif(chromium() is None, reason="Chromium is not installed (Debian: apt-get install chromium)")
def test_explorer_responds_and_console_is_clean(widget_book: Path) -> None:
    with serve(widget_book / "_build" / "html") as url, browser_page() as (tab, log):
        load(tab, f"{url}/chapters/page.html")
        explorer = tab.locator(".nnk-explorer").first
        (slider, ctl), (dropdown, menu) = explorer_controls(explorer)
        assert (slider, dropdown) == ("slider", "dropdown")
        assert shown_figure(explorer)[1] == "A line of slope 2 drawn with o-"
        set_position(tab, slider, ctl, 0)
        assert shown_figure(explorer)[1] == "A line of slope 1 drawn with o-"
        set_position(tab, dropdown, menu, 1)
        assert shown_figure(explorer)[1] == "A line of slope 1 drawn with s--"
        set_position(tab, slider, ctl, 2)
        assert shown_figure(explorer)[1] == "A line of slope 3 drawn with s--"
        math = tab.locator("mjx-container").count()
    assert math >= 2
    assert not log.problems(), log.problems()


def test_local_extensions_are_registered_and_present() -> None:
    """Every extension _config.yml loads exists in book/_ext, and the {recorded} role's is among them."""
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    local = config["sphinx"]["local_extensions"]
    assert "recorded" in local
    for name, folder in local.items():
        assert (ROOT / folder / f"{name}.py").exists(), name
