"""The book's figure style, and a check that every figure is legible in the text column.

Figures are drawn for the column they are shown in: the book's text column is about
700 CSS px wide, so a figure is at most :data:`COLUMN_WIDTH_IN` inches wide at
:data:`DPI` dots per inch and shown at (nearly) its natural size, and no text in it is
smaller than :data:`MIN_FONT_PT` points (11 px at 100 dpi, about 11 CSS px on the page).
:func:`use_book_style` sets matplotlib's defaults accordingly and, inside IPython,
checks each figure before the inline backend shows it; :func:`figure_png` (used by the
widgets) checks before it renders.
"""

from __future__ import annotations

import base64
import io
from typing import Any

import matplotlib
import matplotlib.text
from matplotlib.figure import Figure

#: Width of the book's text column, in inches at :data:`DPI` (680 px; the column is 688 CSS px at a 1280 px window).
COLUMN_WIDTH_IN = 6.8
#: Resolution at which the book's figures are rendered.
DPI = 100
#: Smallest font size allowed in a figure, in points.
MIN_FONT_PT = 8.0

STYLE: dict[str, Any] = {
    "figure.dpi": DPI,
    "savefig.dpi": DPI,
    "figure.figsize": (COLUMN_WIDTH_IN, 3.6),
    "font.size": 10,
    "axes.titlesize": 10,
    "axes.labelsize": 10,
    "xtick.labelsize": 9,
    "ytick.labelsize": 9,
    "legend.fontsize": 9,
    "legend.title_fontsize": 9,
    "figure.titlesize": 11,
    "axes.grid": True,
    "grid.alpha": 0.3,
}


class FigureLegibilityError(ValueError):
    """A figure is wider than the text column or uses text too small to read there."""


def check_legible(fig: Figure) -> None:
    """Raise :class:`FigureLegibilityError` unless ``fig`` fits the column with legible text.

    Checks the figure's width (at most :data:`COLUMN_WIDTH_IN` inches, with 2 % slack),
    its dpi (:data:`DPI`) and the size of every visible, non-empty text artist (titles,
    labels, tick labels, legends, annotations): at least :data:`MIN_FONT_PT` points.
    """
    if not isinstance(fig, Figure):
        raise TypeError(f"fig must be a matplotlib Figure, got {type(fig).__name__}")
    width = fig.get_figwidth()
    if width > COLUMN_WIDTH_IN * 1.02:
        raise FigureLegibilityError(
            f"figure {fig.number if hasattr(fig, 'number') else ''} is {width:.2f} in wide; the "
            f"text column holds {COLUMN_WIDTH_IN} in at {DPI} dpi (use figsize=(<= {COLUMN_WIDTH_IN}, h), "
            "or stack panels vertically)")
    if abs(fig.dpi - DPI) > 1e-6:
        raise FigureLegibilityError(f"figure dpi is {fig.dpi}, the book renders at {DPI}")
    small = sorted({
        (round(t.get_fontsize(), 1), t.get_text()[:40])
        for t in fig.findobj(matplotlib.text.Text)
        if t.get_visible() and t.get_text().strip() and t.get_fontsize() < MIN_FONT_PT - 1e-9
    })
    if small:
        listed = "; ".join(f"{size} pt {text!r}" for size, text in small[:5])
        raise FigureLegibilityError(
            f"text smaller than {MIN_FONT_PT} pt is illegible in the book's column: {listed}")


def figure_png(fig: Figure, colors: int | None = 128) -> bytes:
    """Render ``fig`` (checked by :func:`check_legible`) to PNG bytes.

    ``colors`` quantises the image to a palette of that many colours (line plots and
    heat maps lose nothing visible, and the file shrinks about threefold, which keeps the
    widget state of a page small); ``None`` keeps full colour.
    """
    check_legible(fig)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI, facecolor="white")
    if colors is None:
        return buffer.getvalue()
    from PIL import Image  # matplotlib depends on Pillow

    buffer.seek(0)
    image = Image.open(buffer).convert("RGB").quantize(colors=colors, method=Image.Quantize.MEDIANCUT)
    out = io.BytesIO()
    image.save(out, format="PNG", optimize=True)
    return out.getvalue()


def png_img_html(png: bytes, alt: str) -> str:
    """An ``<img>`` element holding ``png`` inline, with alt text, scaled to the column."""
    if not alt or not alt.strip():
        raise ValueError("alt must describe what the figure shows")
    data = base64.b64encode(png).decode("ascii")
    safe_alt = (alt.replace("&", "&amp;").replace('"', "&quot;")
                .replace("<", "&lt;").replace(">", "&gt;"))
    return (f'<img class="nnk-figure" alt="{safe_alt}" src="data:image/png;base64,{data}" '
            'style="max-width:100%;height:auto;display:block">')


def _check_open_figures() -> None:
    import matplotlib.pyplot as plt

    for number in plt.get_fignums():
        check_legible(plt.figure(number))


def use_book_style() -> None:
    """Set the book's matplotlib defaults; in IPython, check each figure before it is shown.

    The check runs before the inline backend displays the cell's figures. IPython reports
    a failing check as an error in a callback on the cell's output (the test suite fails a
    chapter whose executed notebook contains one).
    """
    matplotlib.rcParams.update(STYLE)
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover - IPython ships with the book's stack
        return
    shell = get_ipython()
    if shell is None:
        return
    callbacks = shell.events.callbacks["post_execute"]
    if _check_open_figures not in callbacks:
        # First, so that it sees the figures before the inline backend closes them.
        callbacks.insert(0, _check_open_figures)
