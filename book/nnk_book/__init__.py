"""Notebook plumbing for the chapters of *Neural Network Kernels*.

The chapters import what they need from here instead of copying it from chapter to
chapter: seeded generators and result recording (:mod:`nnk_book.results`), the book's
figure style and its legibility check (:mod:`nnk_book.figures`), and widgets whose
figures are drawn at execution time so that they work in the static HTML book, where
there is no kernel (:mod:`nnk_book.widgets`), readers of committed benchmark results
and recorded paper-scale runs (:mod:`nnk_book.records`), and atomic file writes
(:mod:`nnk_book.files`).

This package belongs to the book, not to the method library: ``kernels`` never imports
it. It is installed with the project (``pip install -e .``), so a notebook needs no
``sys.path`` edits.
"""

from nnk_book.stats import intervals_separate, mean_interval
from nnk_book.records import bench_results, machine_line, paper_scale_rows, recorded_run, show_recorded_run
from nnk_book.figures import FigureLegibilityError, check_legible, figure_png, use_book_style
from nnk_book.results import Recorder, configure_torch, generator, html_table, plain
from nnk_book.widgets import Choice, figure_explorer

__all__ = [
    "Choice",
    "FigureLegibilityError",
    "Recorder",
    "bench_results",
    "machine_line",
    "paper_scale_rows",
    "recorded_run",
    "show_recorded_run",
    "check_legible",
    "configure_torch",
    "figure_explorer",
    "figure_png",
    "generator",
    "html_table",
    "intervals_separate",
    "mean_interval",
    "plain",
    "use_book_style",
]
