"""The preamble every chapter opens with, in one call: :func:`setup`.

A chapter's first code cell after its parameters reads ::

    book = nnk_book.setup(seed)  # threads, global seed, figure style, glue, result store
    generator, record, sweep = book.generator, book.record, book.sweep
    print(book.torch_line)

and gets

* the thread rule of :func:`chapter_threads`, the same in a live kernel (JupyterLab's
  "Run All") as under ``book/tools/run_chapters.py``: ``$NN_KERNELS_THREADS`` when set, else
  the runner's ``$OMP_NUM_THREADS``, else every core when the machine is otherwise idle and
  one thread when it is busy (:func:`nnk_book.results.idle_threads`; two torch threads on a
  two-core machine with one core busy ran chapter 1 ten times slower than one);
* torch's global seed (:func:`nnk_book.results.configure_torch`) and the book's figure style;
* ``generator(*tags)``: :func:`nnk_book.results.generator` with the chapter's seed;
* ``record(name, value)``: a :class:`nnk_book.results.Recorder` that glues results;
* ``sweep(fn, configs, name)``: :func:`nnk_book.store.sweep` (results stored per
  configuration) with :class:`Progress`: in a live kernel one line on stdout that updates
  (never stderr, which JupyterLab shows as red error boxes); under the runner one line per
  configuration on stderr, which reaches the chapter's log (the runner's hang detection reads
  it) and which the book's pages leave out (the sweep's cells are tagged ``remove-stderr``).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import sys
from typing import Any, Callable, Iterable, Mapping, TextIO

from nnk_book.results import Recorder, configure_torch, generator, idle_threads

__all__ = ["Chapter", "Progress", "chapter_threads", "live_kernel", "runner_threads", "setup", "sweep"]

#: Environment variable that fixes the thread count of every chapter (the runner and a reader alike).
THREADS_ENV = "NN_KERNELS_THREADS"
#: Environment variable that ``run_chapters.py`` sets for every chapter it executes (the profile).
RUNNER_ENV = "NN_KERNELS_PROFILE"


def _positive(name: str, text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"${name} must be a positive integer, got {text!r}") from None
    if value < 1:
        raise ValueError(f"${name} must be a positive integer, got {text!r}")
    return value


def chapter_threads(environ: Mapping[str, str] | None = None, *, cores: int | None = None,
                    measure_idle: bool = False, idle: Callable[[int], int] = idle_threads) -> int:
    """The number of torch threads a chapter runs with.

    1. ``$NN_KERNELS_THREADS`` when set: an explicit choice, never second-guessed;
    2. else ``$OMP_NUM_THREADS`` when set (``run_chapters.py`` sets it to its share of the
       cores, ``cores // jobs``), passed through ``idle`` only with ``measure_idle`` (chapter
       6's small batches gain from a second thread only on an idle machine);
    3. else (a live kernel, e.g. JupyterLab) ``idle(cores)``: every core when the others are
       idle, one thread when they are busy (:func:`nnk_book.results.idle_threads`).

    ``environ`` defaults to ``os.environ`` and ``cores`` to ``os.cpu_count()``. The thread
    count changes results only by floating-point rounding.
    """
    env = os.environ if environ is None else environ
    if env.get(THREADS_ENV, "").strip():
        return _positive(THREADS_ENV, env[THREADS_ENV].strip())
    if env.get("OMP_NUM_THREADS", "").strip():
        threads = _positive("OMP_NUM_THREADS", env["OMP_NUM_THREADS"].strip())
        return idle(threads) if measure_idle else threads
    cores = (os.cpu_count() or 1) if cores is None else cores
    if isinstance(cores, bool) or not isinstance(cores, int) or cores < 1:
        raise ValueError(f"cores must be a positive int, got {cores!r}")
    return idle(cores)


def runner_threads(cores: int, jobs: int, environ: Mapping[str, str] | None = None) -> int:
    """The threads ``run_chapters.py`` gives each of ``jobs`` chapters running side by side on
    ``cores`` cores (it exports them as ``$OMP_NUM_THREADS``, which :func:`chapter_threads`
    then respects): ``$NN_KERNELS_THREADS`` when set, else ``max(1, cores // jobs)``."""
    env = os.environ if environ is None else environ
    if env.get(THREADS_ENV, "").strip():
        return _positive(THREADS_ENV, env[THREADS_ENV].strip())
    for name, value in (("cores", cores), ("jobs", jobs)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    return max(1, cores // jobs)


def live_kernel(environ: Mapping[str, str] | None = None) -> bool:
    """True in an interactive IPython kernel (JupyterLab, a Jupyter console); False under
    ``run_chapters.py`` (which sets ``$NN_KERNELS_PROFILE``) and outside IPython."""
    env = os.environ if environ is None else environ
    if RUNNER_ENV in env:
        return False
    try:
        shell = get_ipython()  # type: ignore[name-defined]  # noqa: F821
    except NameError:
        return False
    return type(shell).__name__ == "ZMQInteractiveShell"


_DONE = re.compile(r"\] (\d+)/(\d+) done")
_NOTHING_TO_DO = re.compile(r" configurations: \d+ stored, 0 to compute")


class Progress:
    """Receives :func:`nnk_book.store.sweep`'s progress lines and writes them to ``stream``
    (default: stdout in a live kernel, stderr under the runner).

    ``live=True`` (a reader's kernel): one line that each update overwrites (a carriage
    return, which JupyterLab and terminals honour) and that ends with a newline when the
    sweep is done, so a finished sweep leaves one line. ``live=False`` (the runner, a log):
    one line per update, so the runner's hang detection sees output after each configuration
    and its status line reads the last one.
    """

    def __init__(self, live: bool = False, stream: TextIO | None = None) -> None:
        if not isinstance(live, bool):
            raise TypeError(f"live must be a bool, got {type(live).__name__}")
        self.live = live
        self.stream = stream
        self._width = 0  # length of the line now shown (live), 0 when none is open

    def _out(self) -> TextIO:
        if self.stream is not None:
            return self.stream
        return sys.stdout if self.live else sys.stderr

    def __call__(self, line: str) -> None:
        line = str(line).replace("\n", " ")
        out = self._out()
        if not self.live:
            out.write(line + "\n")
            out.flush()
            return
        done = _DONE.search(line)
        final = bool(_NOTHING_TO_DO.search(line)) or (done is not None and done[1] == done[2])
        out.write("\r" + line.ljust(self._width))
        self._width = max(self._width, len(line))
        if final:
            self.end()
        else:
            out.flush()

    def end(self) -> None:
        """End the open line (live), e.g. after an interrupted sweep; nothing when none is open."""
        if self.live and self._width:
            self._out().write("\n")
            self._out().flush()
        self._width = 0


_AUTO: Any = object()


def sweep(fn: Callable[[Any], Any], configs: Iterable[Any], name: str, *,
          progress: Callable[[str], None] | None = _AUTO, **options: Any) -> list[Any]:
    """:func:`nnk_book.store.sweep` (``[fn(c) for c in configs]``, each result stored and
    reused) with quiet progress: by default a :class:`Progress` on stdout (an updating line in
    a live kernel, a line per configuration under the runner); ``progress`` may be another
    callable, or ``None`` for silence. ``options`` (``depends``, ``store``, ``client``) go to
    :func:`nnk_book.store.sweep`."""
    from nnk_book.store import sweep as store_sweep

    progress = Progress(live_kernel()) if progress is _AUTO else progress
    try:
        return store_sweep(fn, configs, name=name, progress=progress, **options)
    finally:
        if isinstance(progress, Progress):
            progress.end()


@dataclasses.dataclass(frozen=True)
class Chapter:
    """What :func:`setup` gives a chapter: ``generator(*tags)`` (a picklable
    ``functools.partial`` of :func:`nnk_book.results.generator` with the chapter's seed),
    ``record(name, value)`` (glue), ``sweep(fn, configs, name)`` and ``torch_line`` (torch's
    version and thread count, for the chapter to print)."""

    seed: int
    threads: int
    torch_line: str
    record: Recorder
    generator: Callable[..., Any]

    sweep = staticmethod(sweep)  # the one sweep: nnk_book.sweep


def setup(seed: int, *, threads: int | None = None, measure_idle: bool = False, style: bool = True,
          glue: bool = True) -> Chapter:
    """Every chapter's preamble: torch's threads (``threads``, default
    :func:`chapter_threads` with ``measure_idle``) and global seed, the book's figure style
    (``style``), a :class:`~nnk_book.results.Recorder` (``glue=False``: record without
    gluing) and the seeded ``generator``. Returns a :class:`Chapter`."""
    threads = chapter_threads(measure_idle=measure_idle) if threads is None else threads
    line = configure_torch(seed, threads)
    if style:
        from nnk_book.figures import use_book_style

        use_book_style()
    return Chapter(seed=seed, threads=threads, torch_line=line, record=Recorder(glue=glue),
                   generator=functools.partial(generator, seed))
