"""Seeded generators, recorded results and HTML tables: the bookkeeping of a chapter.

Every random draw of a chapter comes from :func:`generator`, keyed by the chapter's seed
and a few tags that name the experiment, so that adding an experiment never shifts the
draws of another. Every number the prose quotes goes through :class:`Recorder`, which
glues it with ``myst_nb.glue`` (the book and the tests read the glued values) and keeps
it in a dictionary (the "At paper scale" tables read that). :func:`read_glued` reads the
glued values back from an executed notebook, as the tests, the scorecard and the record
tool do.
"""

from __future__ import annotations

import ast
import html
import numbers
import re
import zlib
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import torch


def generator(seed: int, *tags: object) -> torch.Generator:
    """A ``torch.Generator`` seeded from ``seed`` and ``tags``.

    Each tag is hashed (CRC-32 of its ``str``) and :class:`numpy.random.SeedSequence`
    mixes the hashes with ``seed``, so ``generator(0, "a")`` and ``generator(0, "b")``
    give independent streams and the same call always gives the same stream.
    """
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise TypeError(f"seed must be a non-negative int, got {seed!r}")
    words = [int(seed)] + [zlib.crc32(str(tag).encode()) for tag in tags]
    state = np.random.SeedSequence(words).generate_state(1)[0]
    return torch.Generator().manual_seed(int(state))


def plain(value: Any) -> bool | int | float | str:
    """``value`` as a plain Python bool, int, float or str (what a glued result may be).

    numpy and torch scalars (and one-element tensors/arrays) become the matching Python
    type; anything else raises ``TypeError``.
    """
    if isinstance(value, (torch.Tensor, np.ndarray)):
        if value.size == 1 if isinstance(value, np.ndarray) else value.numel() == 1:
            value = value.item()
        else:
            raise TypeError(f"value must be a scalar, got an array of shape {tuple(value.shape)}")
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, str):
        return value
    raise TypeError(f"value must be a number or a string, got {type(value).__name__}")


class Recorder:
    """Glue results under their names and keep them in :attr:`results`.

    Recording a name again (a re-run cell in Jupyter) replaces the value; the test suite
    checks that an executed chapter glues each name once, since the book build warns on
    repeats.

    >>> record = Recorder(glue=False)
    >>> record("answer", np.int64(42)); record.results
    {'answer': 42}
    """

    def __init__(self, glue: bool = True) -> None:
        self.results: dict[str, bool | int | float | str] = {}
        self._glue = glue

    def __call__(self, name: str, value: Any) -> None:
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"name must be an identifier-like string, got {name!r}")
        value = plain(value)
        self.results[name] = value
        if self._glue:
            from myst_nb import glue

            glue(name, value, display=False)


_NUMPY_SCALAR = re.compile(r"^np\.(?:float|int|uint|bool_?)\d*\((.*)\)$")


def _parse_glued(text: str) -> Any:
    """Turn the ``text/plain`` repr of a glued value back into a Python value."""
    text = text.strip()
    m = _NUMPY_SCALAR.match(text)
    if m:  # numpy 2 reprs scalars as np.float64(0.5)
        text = m.group(1)
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text.strip("'\"")


def _glue_outputs(path: str | Path) -> Iterable[dict[str, Any]]:
    import nbformat

    nb = nbformat.read(str(path), as_version=4)
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.get("metadata", {}).get("scrapbook"):
                yield out


def read_glued(path: str | Path) -> dict[str, Any]:
    """Map each name that :class:`Recorder` (or ``myst_nb.glue``) glued in the executed
    notebook at ``path`` to its value (the last glue wins, as in myst-nb)."""
    values: dict[str, Any] = {}
    for out in _glue_outputs(path):
        meta = out["metadata"]["scrapbook"]
        key = meta.get("mime_prefix", "") + "text/plain"
        if key in out.get("data", {}):
            values[meta["name"]] = _parse_glued(out["data"][key])
    return values


def glued_names(path: str | Path) -> list[str]:
    """Every glued name of the executed notebook at ``path`` in execution order, repeats
    included (myst-nb warns on a repeat)."""
    return [out["metadata"]["scrapbook"]["name"] for out in _glue_outputs(path)]


def html_table(header: Sequence[object], rows: Iterable[Sequence[object]], *, escape: bool = False):
    """An ``IPython.display.HTML`` table with ``header`` and ``rows``.

    Cells are inserted as they are (they may hold markup such as ``<b>``) unless
    ``escape`` is true. Every row must have as many cells as the header.
    """
    from IPython.display import HTML

    header = list(header)
    rows = [list(r) for r in rows]
    bad = [i for i, r in enumerate(rows) if len(r) != len(header)]
    if bad:
        raise ValueError(f"rows {bad[:5]} do not have {len(header)} cells like the header")
    text = html.escape if escape else str

    def row_html(cells: list, tag: str) -> str:
        return "<tr>" + "".join(f"<{tag}>{text(str(c))}</{tag}>" for c in cells) + "</tr>"

    body = "".join(row_html(r, "td") for r in rows)
    return HTML(f'<table class="nnk-table"><thead>{row_html(header, "th")}</thead>'
                f"<tbody>{body}</tbody></table>")


def _check_threads(threads: object) -> None:
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be a positive int, got {threads!r}")


def configure_torch(seed: int, threads: int | None = None) -> str:
    """Set torch's thread count and global seed the way every chapter does; describe it.

    ``threads`` defaults to ``$OMP_NUM_THREADS`` (the chapter runner sets it so that
    chapters running side by side share the cores), else every core. The global seed is
    a safeguard for library internals: the chapters draw from :func:`generator`.
    Returns a line such as ``"torch 2.13.0+cpu, 1 thread"`` for the chapter to print.
    """
    import os

    if threads is None:
        threads = int(os.environ.get("OMP_NUM_THREADS") or os.cpu_count() or 1)
    _check_threads(threads)
    generator(seed)  # validates the seed
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    n = torch.get_num_threads()
    return f"torch {torch.__version__}, {n} thread{'s' if n != 1 else ''}"


def idle_threads(threads: int, *, sample_s: float = 0.5, busy_cores: float = 0.5) -> int:
    """``threads`` when the machine is otherwise idle, else 1.

    A second thread speeds up small matrix products (a few hundred rows) only when its core
    is free: chapter 6 at teaching scale ran in 75 s with two threads against 92 s with one
    on a quiet two-core machine, but more than twice as long with two on a busy one, where
    each thread waits for the other's time slice. The use of the other cores is measured
    over ``sample_s`` seconds (``psutil.cpu_percent``; this process sleeps meanwhile):
    below ``busy_cores`` cores in use counts as idle. The thread count changes a chapter's
    results only by floating-point rounding (the order of a few sums).
    """
    _check_threads(threads)
    if isinstance(sample_s, bool) or not isinstance(sample_s, numbers.Real) or not 0 < sample_s <= 10:
        raise ValueError(f"sample_s must be a number of seconds in (0, 10], got {sample_s!r}")
    if isinstance(busy_cores, bool) or not isinstance(busy_cores, numbers.Real) or not busy_cores > 0:
        raise ValueError(f"busy_cores must be a positive number, got {busy_cores!r}")
    if threads == 1:
        return 1
    import os

    import psutil

    in_use = psutil.cpu_percent(interval=float(sample_s)) / 100.0 * (os.cpu_count() or 1)
    return threads if in_use < busy_cores else 1
