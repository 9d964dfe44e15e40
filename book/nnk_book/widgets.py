"""Widgets that work in the static HTML book: precomputed figures chosen in the browser.

The rendered book has no Python kernel, so a widget whose figure a Python callback
redraws is dead there. :func:`figure_explorer` draws the figure for every state of its
controls when the notebook executes, holds each as an inline PNG (with its own alt text)
in a ``widgets.HTML`` child of a ``widgets.Stack``, and ties each control's ``index`` to
the stacks' ``selected_index`` with ``widgets.jslink``. The links live in the saved
widget state and run in JavaScript, so the controls respond in the static book and in
Jupyter alike. Two or more controls nest the stacks: the first control picks among
stacks of the second, and so on.

Each state costs one PNG (about 20-60 KB here); choose one or two controls that teach and
a few dozen states, so that a page's widget state stays under about 2 MB.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any, Callable, Mapping, Sequence

from nnk_book.figures import figure_png, png_img_html

#: Most states one explorer may draw (keeps a page's widget state small).
MAX_STATES = 48


@dataclasses.dataclass(frozen=True)
class Choice:
    """One control of a :func:`figure_explorer`: the values it offers and how it looks.

    ``options`` are the values passed to the drawing function; ``labels`` (default
    ``str`` of each option) are what the control shows; ``default`` is the value shown
    first (default: the first option); ``kind`` is ``"slider"`` (an ordered choice,
    operated with the mouse or arrow keys), ``"dropdown"`` or ``"buttons"``.
    """

    description: str
    options: Sequence[Any]
    default: Any = None
    labels: Sequence[str] | None = None
    kind: str = "slider"

    def __post_init__(self) -> None:
        if not isinstance(self.description, str) or not self.description:
            raise ValueError("description must be a non-empty string")
        if len(self.options) < 2:
            raise ValueError(f"{self.description}: options must offer at least 2 values")
        if self.labels is not None and len(self.labels) != len(self.options):
            raise ValueError(f"{self.description}: labels must match options one to one")
        if self.default is not None and self.default not in list(self.options):
            raise ValueError(f"{self.description}: default {self.default!r} is not among the options")
        if self.kind not in ("slider", "dropdown", "buttons"):
            raise ValueError(f"kind must be 'slider', 'dropdown' or 'buttons', got {self.kind!r}")

    @property
    def default_index(self) -> int:
        return 0 if self.default is None else list(self.options).index(self.default)

    def option_labels(self) -> list[str]:
        return list(self.labels) if self.labels is not None else [str(o) for o in self.options]

    def control(self):
        """The ipywidgets control, at its default; its ``index`` is what the links use."""
        import ipywidgets as widgets

        # Options as (label, position) pairs: every control then carries a plain int,
        # and jslink ties its integer `index` to a stack's `selected_index`.
        pairs = list(zip(self.option_labels(), range(len(self.options))))
        common = dict(options=pairs, value=self.default_index, description=self.description,
                      style={"description_width": "initial"})
        if self.kind == "slider":
            return widgets.SelectionSlider(continuous_update=True, **common)
        if self.kind == "dropdown":
            return widgets.Dropdown(**common)
        return widgets.ToggleButtons(**common)


def _check_controls(controls: Mapping[str, Choice]) -> None:
    if not isinstance(controls, Mapping) or not controls:
        raise ValueError("controls must be a non-empty mapping of argument name -> Choice")
    for name, choice in controls.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"control names must be argument names, got {name!r}")
        if not isinstance(choice, Choice):
            raise TypeError(f"controls[{name!r}] must be a Choice, got {type(choice).__name__}")


def figure_explorer(
    draw: Callable[..., Any],
    controls: Mapping[str, Choice],
    alt: Callable[..., str],
    *,
    max_states: int = MAX_STATES,
    colors: int | None = 128,
    progress: bool = False,
):
    """A widget that shows ``draw(**state)`` for the state its controls select.

    ``draw`` takes one keyword argument per control (the option values) and returns a
    matplotlib ``Figure``, which is checked for legibility, rendered to PNG and closed.
    ``alt(**state)`` returns the alt text of that state's image: what it shows, in words.
    Returns an ``ipywidgets.VBox`` (controls above, figure below) to ``display``.

    The figure is drawn ``prod(len(options))`` times, at most ``max_states``.
    """
    import ipywidgets as widgets
    import matplotlib.pyplot as plt

    _check_controls(controls)
    if not callable(draw) or not callable(alt):
        raise TypeError("draw and alt must be callables")
    names = list(controls)
    sizes = [len(controls[n].options) for n in names]
    total = 1
    for s in sizes:
        total *= s
    if total > max_states:
        raise ValueError(f"the controls span {total} states, more than max_states={max_states}: "
                         "offer fewer options (each state is one PNG in the page)")

    pages: dict[tuple[int, ...], widgets.HTML] = {}
    for index in itertools.product(*(range(s) for s in sizes)):
        state = {n: controls[n].options[i] for n, i in zip(names, index)}
        fig = draw(**state)
        try:
            png = figure_png(fig, colors=colors)
        finally:
            plt.close(fig)
        pages[index] = widgets.HTML(png_img_html(png, alt(**state)))
        if progress:
            print(f"drew state {len(pages)} of {total}", flush=True)

    inputs = [controls[n].control() for n in names]
    links = []

    def build(prefix: tuple[int, ...]):
        level = len(prefix)
        if level == len(names):
            return pages[prefix]
        stack = widgets.Stack([build(prefix + (i,)) for i in range(sizes[level])],
                              selected_index=controls[names[level]].default_index)
        links.append(widgets.jslink((inputs[level], "index"), (stack, "selected_index")))
        return stack

    figure = build(())
    box = widgets.VBox([widgets.HBox(inputs, layout=widgets.Layout(flex_flow="row wrap")), figure])
    box.add_class("nnk-explorer")
    box._nnk_links = links  # keep the Link widgets referenced alongside the box
    return box
