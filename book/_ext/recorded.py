"""Sphinx extension: the role ``{recorded}`` puts a recorded value into the prose at build time.

    The record scale closes the gap to {recorded}`rf_siren_psnr_gap:.1f` dB.
    Chapter 2's record says {recorded}`02_random_features/rf_siren_psnr_gap:.1f`.

A chapter computes its results at teaching scale and glues them; its larger runs are recorded
by ``book/tools/record_run.py`` in ``book/runs/<chapter>.<profile>.json``. The role reads a value
of the chapter's record (the page's own chapter, or the one named before a ``/``) and renders it
with a format spec as ``{glue:text}`` does (``name:.2f``), so the number goes from the record to
the page and never back through the notebook. The record shown is the one the scorecard counts
(:func:`nnk_book.records.current_record`): the largest current record, else the largest whose
currency cannot be told, else the largest stale one. Its provenance (profile, date, commit,
machine, currency) is the value's tooltip, and a small mark after it names the profile and links
to the chapter's line under "Reproduction scorecard".

Currency compares the record with this build's teaching values: the glued values of the
chapter's executed notebook as this build renders it (``chapters/<chapter>.ipynb`` in the
staged book), at the thread count the runner wrote beside it. A build that executes the
notebooks itself has no executed file to read, and the mark says "currency not checked".

A name that starts with ``@`` is a fact about the record itself rather than one of its values:
``@recorded`` (its date), ``@minutes`` (wall time over all its starts), ``@starts``, ``@threads``,
``@profile`` and ``@commit``, as in "recorded {recorded}`@recorded` in {recorded}`@minutes:.0f`
minutes".

The role ``{benchmark}`` does the same for a committed benchmark result,
``benchmarks/results/bench_<name>.json``: ``{benchmark}`lookup:rows[h=256,tau=8].speedup:.2f```
is the field ``speedup`` of the one row of the list ``rows`` whose ``h`` is 256 and ``tau`` 8;
its tooltip names the machine and date of the benchmark run. A path that selects nothing, or more
than one row, warns.

A name the record lacks renders "(not recorded)". When the name is in none of the chapter's
records and the chapter's teaching run does not glue it either, the role also warns, so that a
``-W`` build catches a misspelt name. A chapter without any record renders "(not recorded)"
without a warning.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from docutils import nodes
from sphinx.util import logging
from sphinx.util.docutils import SphinxRole

logger = logging.getLogger(__name__)

NOT_RECORDED = "(not recorded)"
_CACHE: dict[tuple[str, str], dict[str, Any]] = {}  # (records folder, chapter) -> chapter_records


class recorded_value(nodes.inline):
    """A recorded value; HTML shows its provenance as the ``title`` tooltip."""


class recorded_source(nodes.inline):
    """The mark after a recorded value; linked to the scorecard page when the book has it."""


def split_target(text: str, docname: str) -> tuple[str, str, str]:
    """``(chapter, name, format spec)`` of the role's text ``[chapter/]name[:spec]``; the chapter
    defaults to the page's own (the last part of ``docname``)."""
    target, _, spec = text.strip().partition(":")
    chapter, _, name = target.rpartition("/")
    return (chapter or docname.rsplit("/", 1)[-1]).strip(), name.strip(), spec.strip()


def format_value(value: Any, spec: str) -> str:
    """``value`` as ``{glue:text}`` shows a glued value with format ``spec``."""
    from myst_nb.core.variables import format_plain_text

    return format_plain_text(repr(value), spec)


def _teaching(srcdir: Path, chapter: str) -> tuple[dict[str, Any] | None, int | None]:
    """This build's teaching values of ``chapter`` and the thread count of their run."""
    from nnk_book.results import read_glued

    notebook = srcdir / "chapters" / f"{chapter}.ipynb"
    if not notebook.exists():
        return None, None
    values = read_glued(notebook) or None
    threads = None
    try:
        output = json.loads(notebook.read_text())["metadata"]["papermill"]["output_path"]
        key = Path(output).with_suffix(".key")
        threads = json.loads(key.read_text()).get("threads") if key.exists() else None
    except (KeyError, TypeError, ValueError, OSError):
        pass
    return values, threads


def record_fact(data: dict[str, Any], name: str) -> Any:
    """The fact ``@name`` about a record (see the module docstring); ``KeyError`` for another name."""
    from nnk_book.records import run_seconds, run_starts

    seconds = run_seconds(data)
    facts = {"recorded": data.get("recorded"), "minutes": None if seconds is None else seconds / 60,
             "starts": run_starts(data), "threads": data.get("machine", {}).get("threads"),
             "profile": data.get("profile"), "commit": data.get("commit")}
    return facts[name]


def page_glue(document: nodes.document) -> dict[str, Any] | None:
    """The values the page's notebook glued in this build, when myst-nb executed it itself
    (``jupyter-book build .``); ``None`` on a page that is not such a notebook."""
    from nnk_book.results import _parse_glued

    try:
        glue = document["nb_renderer"].renderer.nb_client.glue_data
    except (KeyError, AttributeError):
        return None
    return {name: _parse_glued(str(out.get("data", {}).get("text/plain", ""))) for name, out in glue.items()}


def chapter_records(srcdir: Path, runs: Path, chapter: str, glued: dict[str, Any] | None = None) -> dict[str, Any]:
    """What the role needs of one chapter: the record it shows with its currency, the names
    every record and the teaching run know. ``glued``: the chapter's values of this build when
    its notebook file holds none (myst-nb executed it in memory)."""
    from nnk_book.records import RECORD_PROFILES, current_record, recorded_run

    teaching, threads = _teaching(srcdir, chapter)
    if teaching is None and glued:
        teaching = glued
    data, current, why = current_record(chapter, teaching, threads, runs)
    known = set(teaching or {})
    for profile in RECORD_PROFILES:
        other = recorded_run(chapter, profile, runs)
        known |= set((other or {}).get("values", {}))
    return {"record": data, "current": current, "why": why, "known": known}


def provenance(data: dict[str, Any], current: bool | None, why: str | None) -> str:
    """One line: which run of which commit on which machine, and whether it is current."""
    machine = data.get("machine", {})
    state = {True: "current: its commit's teaching values are this build's",
             False: f"stale: {why}",
             None: f"currency not checked: {why}"}[current]
    return (f"{data.get('profile', '?')} run of {data.get('recorded', '?')}, commit {data.get('commit', '?')}, "
            f"{machine.get('cpu', '?')}, {machine.get('threads', '?')} thread(s); {state}")


def mark(data: dict[str, Any], current: bool | None) -> str:
    """The mark after a value: its profile, and "stale" or "currency not checked" where so."""
    return data.get("profile", "?") + {True: "", False: ", stale", None: ", currency not checked"}[current]


class RecordedRole(SphinxRole):
    """``{recorded}`[chapter/]name[:format]```: a value of the chapter's record."""

    def run(self) -> tuple[list[nodes.Node], list[nodes.system_message]]:
        config = self.env.config
        chapter, name, spec = split_target(self.text, self.env.docname)
        srcdir = Path(self.env.srcdir)
        runs = srcdir / config.nnk_recorded_runs
        key = (str(runs), chapter)
        try:
            if key not in _CACHE:
                own = chapter == self.env.docname.rsplit("/", 1)[-1]
                _CACHE[key] = chapter_records(srcdir, runs, chapter, page_glue(self.inliner.document) if own else None)
        except ValueError as err:  # a chapter name that cannot be a record's
            logger.warning(f"recorded: {err}", location=self.get_location(), type="nnk", subtype="recorded")
            return [nodes.inline(NOT_RECORDED, NOT_RECORDED, classes=["nnk-recorded", "nnk-not-recorded"])], []
        found = _CACHE[key]
        data = found["record"]
        values = dict((data or {}).get("values", {}))
        if name.startswith("@"):
            try:
                values = {name: record_fact(data or {}, name[1:])}
            except KeyError:
                logger.warning(f"recorded: {name!r} is not a fact of a record (@recorded, @minutes, @starts, "
                               "@threads, @profile, @commit)", location=self.get_location(), type="nnk",
                               subtype="recorded")
                values = {}
            found = {**found, "known": found["known"] | {name}}
        if name not in values or values[name] is None:
            if data is not None and name not in found["known"]:
                logger.warning(f"recorded: no record of {chapter} has {name!r}, and its teaching run does "
                               "not glue it", location=self.get_location(), type="nnk", subtype="recorded")
            return [nodes.inline(NOT_RECORDED, NOT_RECORDED, classes=["nnk-recorded", "nnk-not-recorded"])], []
        try:
            text = format_value(values[name], spec)
        except (TypeError, ValueError) as err:
            logger.warning(f"recorded: cannot format {name} = {values[name]!r} with {spec!r}: {err}",
                           location=self.get_location(), type="nnk", subtype="recorded")
            text = str(values[name])
        value = recorded_value(text, text, classes=["nnk-recorded"],
                               title=provenance(data, found["current"], found["why"]))
        label = mark(data, found["current"])
        source = recorded_source("", "", classes=["nnk-recorded-source"], chapter=chapter, label=label)
        return [value, source], []


_STEP = re.compile(r"(?P<key>[^.\[\]]+)(?:\[(?P<select>[^\]]*)\])?")


def select(data: Any, path: str) -> Any:
    """The value at ``path`` in a benchmark's results: dot-separated keys, a key followed by
    ``[i]`` (an index) or ``[name=value,...]`` (the one row of a list whose fields have those
    values, compared as text). ``LookupError`` when the path selects nothing or several rows."""
    here = data
    for step in _split_path(path):
        m = _STEP.fullmatch(step)
        if m is None or not isinstance(here, dict) or m["key"] not in here:
            raise LookupError(f"no {step!r} in the results at this point of {path!r}")
        here = here[m["key"]]
        if m["select"] is None:
            continue
        if re.fullmatch(r"-?\d+", m["select"].strip()):
            here = here[int(m["select"])]
            continue
        wanted = dict(part.split("=", 1) for part in m["select"].split(",") if "=" in part)
        rows = [r for r in here if isinstance(r, dict)
                and all(str(r.get(k.strip())) == v.strip() for k, v in wanted.items())]
        if len(rows) != 1:
            raise LookupError(f"{step!r} selects {len(rows)} rows of {m['key']!r}, not one")
        here = rows[0]
    return here


def _split_path(path: str) -> list[str]:
    steps, depth, start = [], 0, 0
    for i, ch in enumerate(path):
        depth += (ch == "[") - (ch == "]")
        if ch == "." and depth == 0:
            steps.append(path[start:i])
            start = i + 1
    return steps + [path[start:]]


class BenchmarkRole(SphinxRole):
    """``{benchmark}`name:path[:format]```: a value of ``benchmarks/results/bench_<name>.json``."""

    def run(self) -> tuple[list[nodes.Node], list[nodes.system_message]]:
        name, _, rest = self.text.strip().partition(":")
        path, _, spec = rest.partition(":")
        file = Path(self.env.srcdir) / "benchmarks" / "results" / f"bench_{name.strip()}.json"
        try:
            data = json.loads(file.read_text())
            value = select(data, path.strip())
            text = format_value(value, spec.strip())
        except (OSError, ValueError, LookupError, TypeError) as err:
            logger.warning(f"benchmark: {self.text!r}: {err}", location=self.get_location(), type="nnk",
                           subtype="recorded")
            return [nodes.inline(NOT_RECORDED, NOT_RECORDED, classes=["nnk-recorded", "nnk-not-recorded"])], []
        machine = data.get("machine", {})
        title = (f"benchmarks/results/{file.name}, run {machine.get('date', '?')} on {machine.get('cpu', '?')}"
                 + (f", {machine['torch_threads']} torch thread(s)" if "torch_threads" in machine else ""))
        return [recorded_value(text, text, classes=["nnk-recorded"], title=title)], []


def resolve_sources(app: Any, doctree: nodes.document, docname: str) -> None:
    """Each value's mark becomes a link to its chapter's provenance on the scorecard page,
    or plain text when the book has no scorecard page."""
    from nnk_book.records import provenance_anchor

    target = app.config.nnk_recorded_scorecard
    for node in list(doctree.findall(recorded_source)):
        text = nodes.superscript("", f"[{node['label']}]")
        if target in app.env.all_docs:
            try:
                uri = app.builder.get_relative_uri(docname, target) + "#" + provenance_anchor(node["chapter"])
            except Exception:  # a builder without pages (linkcheck, gettext)
                uri = None
            if uri is not None:
                text = nodes.reference("", "", text, refuri=uri, internal=True,
                                       reftitle="where this record comes from")
        node.replace_self(nodes.inline("", "", text, classes=node["classes"]))


def _forget(app: Any) -> None:
    _CACHE.clear()  # records and executed chapters may have changed since an earlier build


def visit_value_html(self: Any, node: recorded_value) -> None:
    self.body.append(self.starttag(node, "span", "", title=node["title"]))


def depart_value_html(self: Any, node: recorded_value) -> None:
    self.body.append("</span>")


def _visit_inline(self: Any, node: nodes.Node) -> None:
    self.visit_inline(node)


def _depart_inline(self: Any, node: nodes.Node) -> None:
    self.depart_inline(node)


def setup(app: Any) -> dict[str, Any]:
    app.add_config_value("nnk_recorded_runs", "book/runs", "env", [str])
    app.add_config_value("nnk_recorded_scorecard", "book/scorecard", "env", [str])
    other = (_visit_inline, _depart_inline)
    app.add_node(recorded_value, html=(visit_value_html, depart_value_html),
                 latex=other, text=other, man=other, texinfo=other)
    app.add_role("recorded", RecordedRole())
    app.add_role("benchmark", BenchmarkRole())
    app.connect("builder-inited", _forget)
    app.connect("doctree-resolved", resolve_sources)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
