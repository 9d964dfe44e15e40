"""Notebook plumbing for the chapters of *Neural Network Kernels*.

The chapters import what they need from here instead of copying it from chapter to
chapter: the preamble every chapter opens with, one call to :func:`setup` (threads,
seeds, figure style, glue and ``sweep`` with quiet progress: :mod:`nnk_book.chapter`),
seeded generators and result recording (:mod:`nnk_book.results`), the book's
figure style and its legibility check (:mod:`nnk_book.figures`), and widgets whose
figures are drawn at execution time so that they work in the static HTML book, where
there is no kernel (:mod:`nnk_book.widgets`), readers of committed benchmark results
and recorded paper-scale runs (:mod:`nnk_book.records`), atomic file writes
(:mod:`nnk_book.files`), intervals, verdicts and relative errors (:mod:`nnk_book.stats`),
the training vocabulary (:mod:`nnk_book.training`: the convergence measures and
criterion, training to a criterion, the training loop with its warm-up/decay schedule,
smoothed loss curves, and the frozen-encoder plumbing of chapters 6 and 7: the encoder's
tail from cached attention states and mean pooling), and the per-configuration result
store that lets long runs resume and spread over a Dask cluster (:mod:`nnk_book.store`,
:mod:`nnk_book.cluster`).

This package belongs to the book, not to the method library: ``kernels`` never imports
it. It is installed with the project (``pip install -e .``), so a notebook needs no
``sys.path`` edits.
"""

from nnk_book.store import ResultStore
from nnk_book.chapter import Chapter, Progress, chapter_threads, live_kernel, setup, sweep
from nnk_book.stats import format_interval, intervals_separate, max_rel_err, mean_interval, verdict
from nnk_book.training import (
    attention_output,
    converged,
    encoder_tail,
    frozen_copy,
    hidden_states,
    last_fifth_change,
    mean_pool,
    plot_seed_losses,
    plot_smoothed,
    pooled_tail,
    random_batches,
    smooth,
    train_loop,
    train_to_criterion,
    warmup_linear_decay,
)
from nnk_book.records import bench_results, machine_line, recorded_run
from nnk_book.figures import FigureLegibilityError, check_legible, figure_png, use_book_style
from nnk_book.results import Recorder, configure_torch, generator, html_table, idle_threads, plain
from nnk_book.widgets import Choice, figure_explorer

__all__ = [
    "Chapter",
    "Choice",
    "FigureLegibilityError",
    "Recorder",
    "ResultStore",
    "attention_output",
    "bench_results",
    "chapter_threads",
    "check_legible",
    "configure_torch",
    "converged",
    "encoder_tail",
    "figure_explorer",
    "figure_png",
    "format_interval",
    "frozen_copy",
    "generator",
    "hidden_states",
    "html_table",
    "idle_threads",
    "intervals_separate",
    "last_fifth_change",
    "live_kernel",
    "machine_line",
    "max_rel_err",
    "mean_interval",
    "mean_pool",
    "plain",
    "plot_seed_losses",
    "Progress",
    "plot_smoothed",
    "pooled_tail",
    "random_batches",
    "recorded_run",
    "setup",
    "smooth",
    "sweep",
    "train_loop",
    "train_to_criterion",
    "use_book_style",
    "verdict",
    "warmup_linear_decay",
]
