"""Write the Reference pages that come from runs: "Reproduction scorecard" and "Execution status".

    python book/tools/scorecard_page.py --executed _build/executed/ci --out /tmp/book

``build_book.py`` calls :func:`write_pages` while it stages the book: the scorecard is built
from ``book/claims.yaml`` (the papers' claims and their tolerances), the glued values of the
executed chapters (teaching scale) and the recorded runs in ``book/runs/`` (larger scales),
with every status computed by :mod:`nnk_book.scorecard`; the execution-status page lists the
runner's ``summary.json`` and, per chapter, whether its run was reused from the cache and
when it ran (the ``.key`` file beside it). ``tests/test_scorecard.py`` regenerates the
scorecard from the same inputs and compares.
"""

from __future__ import annotations

import argparse
import html
import json
import re
from pathlib import Path
from typing import Any, Mapping, Sequence

import nbformat
import yaml

from nnk_book import scorecard as sc
from nnk_book.files import atomic_write_text
from nnk_book.records import (EXPECTED, RECORD_PROFILES as LARGEST_FIRST, chapter_parameters, machine_dependent,
                              parameter_deviations, provenance_anchor, record_currency, recorded_run, run_seconds,
                              run_starts)
from nnk_book.results import read_glued

ROOT = Path(__file__).resolve().parents[2]
PROFILES = ROOT / "book" / "profiles.yaml"
RECORD_PROFILES = tuple(reversed(LARGEST_FIRST))  # recorded scales of nnk_book.scorecard.SCALES, smallest first
FIGURE = "scorecard_ratios.png"
LABEL = re.compile(r"^[a-z0-9]+-[a-z0-9-]+$")  # the book's labels: chapter prefix, hyphen, name
#: a short name per paper for the counts table's columns
SHORT = {"ntk": "NTK", "snnk": "SNNK", "ski": "SKI/FD-TNN", "lookupffn": "LookupFFN", "fusion": "MLP fusion"}


def load_claims() -> dict[str, Any]:
    data = yaml.safe_load(sc.CLAIMS.read_text())
    sc.validate_claims(data)
    return data


def load_profiles() -> dict[str, Any]:
    return yaml.safe_load(PROFILES.read_text()) or {}


def chapter_labels(notebook: Path) -> set[str]:
    """The MyST labels ``(name)=`` a chapter defines (targets of ``{ref}``)."""
    text = notebook.read_text()
    return set(re.findall(r"\((\w[\w-]*)\)=", text))


def teaching_parameters(chapter: str, executed_nb: Path | None) -> dict[str, Any]:
    """The parameters a teaching run used: the chapter's ``parameters`` cell, updated with what
    the runner injected (papermill's metadata of the executed notebook)."""
    params = chapter_parameters(chapter)
    if executed_nb is not None and executed_nb.exists():
        nb = nbformat.read(str(executed_nb), as_version=4)
        params.update(nb.metadata.get("papermill", {}).get("parameters", {}) or {})
    return params


def _deviation_text(moved: Mapping[str, tuple[Any, Any]]) -> str:
    return "; ".join(f"{k} = {run!r} (profile: {want!r})" for k, (run, want) in moved.items())


def scales_for(chapter: str, teaching: Mapping[str, Any] | None, executed_nb: Path | None = None,
               profiles: Mapping[str, Any] | None = None) -> list[sc.Scale]:
    """The chapter's measured scales: its executed teaching run and its recorded runs, each record
    with its currency (:func:`nnk_book.records.record_currency` against ``teaching``) and its
    departures from the profile."""
    profiles = load_profiles() if profiles is None else profiles
    scales = []
    if teaching is not None:
        scales.append(sc.Scale("teaching", teaching, parameters=teaching_parameters(chapter, executed_nb)))
    patterns = list(machine_dependent(chapter))
    for profile in RECORD_PROFILES:
        data = recorded_run(chapter, profile)
        if data is None:
            continue
        entry = (profiles.get(profile) or {}).get(chapter) or {}
        wanted = entry.get("parameters") or {}
        key = executed_nb.with_suffix(".key") if executed_nb is not None else None
        threads = json.loads(key.read_text()).get("threads") if key is not None and key.exists() else None
        current, why = record_currency(data, teaching, wanted, patterns, threads)
        moved = parameter_deviations(data.get("parameters", {}), wanted)
        deviation = "; ".join(x for x in (_deviation_text(moved) if moved else "",
                                          f"not on a CPU: {entry['not_on_cpu']}" if entry.get("not_on_cpu") else "")
                              if x) or None
        machine = data.get("machine", {})
        scales.append(sc.Scale(
            profile, data.get("values", {}), date=data.get("recorded"), commit=data.get("commit"),
            machine=f"{machine.get('cpu', '?')}, {machine.get('threads', '?')} thread(s)",
            seconds=run_seconds(data), starts=run_starts(data), current=current, stale_why=why,
            parameters=data.get("parameters", {}), deviation=deviation))
    return scales


def compute(executed: Path | None, chapters: Sequence[str]) -> tuple[dict[str, Any], list[sc.ClaimResult]]:
    """Claims and their results. ``executed``: folder of executed chapters (teaching values).

    Every chapter with an executed notebook there counts, also outside ``chapters`` (a subset
    build keeps the other chapters' last executed values, so it shows the same scorecard)."""
    data = load_claims()
    profiles = load_profiles()
    scales = {}
    for chapter in sorted({c["chapter"] for c in data["claims"]}):
        nb = executed / f"{chapter}.ipynb" if executed else None
        teaching = read_glued(nb) if (nb is not None and nb.exists()) else None
        scales[chapter] = scales_for(chapter, teaching, nb, profiles)
    return data, [sc.claim_status(claim, scales[claim["chapter"]]) for claim in data["claims"]]


# --------------------------------------------------------------------------- HTML pieces
def _e(text: Any) -> str:
    return html.escape(" ".join(str(text).split()), quote=True)


def anchor(chapter: str, section: str) -> str:
    """The page and anchor of a chapter section: its MyST label, or the id Sphinx gives its heading."""
    from docutils.nodes import make_id

    target = section if LABEL.match(section) else make_id(section)
    return f"../chapters/{chapter}.html#{target}"


def _link(chapter: str, section: str, text: str | None = None) -> str:
    return f'<a class="reference internal" href="{anchor(chapter, section)}">{_e(text or section)}</a>'


def _slug(status: str) -> str:
    return re.sub(r"[^a-z]+", "-", status.lower()).strip("-")


def _ours(m: sc.Measurement | None, claim: Mapping[str, Any]) -> str:
    if m is None or m.value is None:
        return "—"
    text = _e(sc.format_value(m.value))
    if m.interval is not None:
        text += f" ± {_e(sc.format_value(m.interval))}"
    extra = []
    for key, word in (("seeds", "seeds"), ("steps", "steps")):
        name = claim.get(key)
        if name and sc._usable(m.scale.values.get(name)):
            extra.append(f"{sc.format_value(m.scale.values[name])} {word}")
    if m.stand_in:
        extra.append("stand-in data")
    if m.scale.current is False:
        extra.append("stale")
    return text + (f' <span class="nnk-small">({_e(", ".join(extra))})</span>' if extra else "")


def _paper_cell(claim: Mapping[str, Any]) -> str:
    parts = []
    if claim.get("paper_value") is not None:
        parts.append(_e(sc.format_value(claim["paper_value"])))
    if claim.get("paper_text"):
        parts.append(_e(claim["paper_text"]))
    if claim.get("prediction"):
        parts.append(f'<span class="nnk-small">book predicts {_e(sc.format_value(claim["prediction"]["value"]))}</span>')
    return "<br>".join(parts)


def _status_cell(r: sc.ClaimResult) -> str:
    badge = f'<span class="nnk-badge nnk-badge-{_slug(r.status)}">{_e(r.status)}</span>'
    if r.status == sc.STAND_IN:
        badge += f' <span class="nnk-small">({_e(r.outcome)}' + (
            f", at {_e(r.decided_by)} scale)" if r.decided_by != "teaching" else ")") + "</span>"
        return badge + (' <span class="nnk-badge nnk-badge-disagree">scales disagree</span>' if r.disagreement else "")
    if r.decided_by and r.decided_by != "teaching":
        badge += f' <span class="nnk-small">({_e(r.decided_by)})</span>'
    if r.disagreement:
        badge += ' <span class="nnk-badge nnk-badge-disagree">scales disagree</span>'
    return badge


def _details(r: sc.ClaimResult) -> str:
    c = r.claim
    quote = " […] ".join(_e(f) for f in sc.quote_fragments(c))
    out = [f"<p><b>The claim:</b> {_e(c['statement'])}</p>",
           f'<blockquote class="nnk-quote">“{quote}”<br><span class="nnk-small">{_e(c["where"])}</span></blockquote>',
           f"<p><b>The paper’s setting:</b> {_e(c['setting'])}.",
           f" <b>Data:</b> the paper: {_e(c['data']['paper'])}; the book: {_e(c['data']['ours'])}"
           + (" (a stand-in)" if c["data"].get("stand_in") else "") + ".</p>"]
    if c.get("value_from"):
        out.append(f"<p><b>The paper’s value:</b> {_e(c['value_from'])}.</p>")
    if c.get("prediction"):
        out.append(f"<p><b>The book’s prediction</b> (not the paper’s number): {_e(sc.format_value(c['prediction']['value']))}: "
                   f"{_e(c['prediction']['why'])}.</p>")
    if c.get("not_run"):
        out.append(f"<p><b>Not run:</b> {_e(c['not_run'])}.</p>")
        if c.get("tolerance"):
            out.append(f"<p><b>What would count:</b> {_e(sc.format_tolerance(c))}. {_e(c.get('tolerance_why', ''))}</p>")
    else:
        out.append(f"<p><b>Tolerance:</b> {_e(sc.format_tolerance(c))}"
                   + (" (decided on the 95 % interval)" if c.get("interval") else "")
                   + f". <b>Why this width:</b> {_e(c['tolerance_why'])}"
                   + (f" <b>A null result</b> ({_e(c['null_result']['what'])}) gives "
                      f"{_e(sc.format_value(c['null_result']['value']))}, which fails it." if c.get("null_result") else "") + "</p>")
        out.append(f"<p><b>Measured</b> as <code>{_e(c['measure'])}</code> in {_link(c['chapter'], c['section'])}.</p>")
    if c.get("differs") and r.status == sc.DIFFERS:
        d = c["differs"]
        out.append(f"<p><b>Why it differs:</b> {_e(d['why'])} (measured in {_link(c['chapter'], d['section'])}).</p>")
    if r.disagreement:
        out.append("<p><b>The scales disagree:</b> "
                   + "; ".join(f"{_e(s)}: {_e(o)}" for s, o in r.disagreement) + ".</p>")
    if r.trend:
        out.append(f"<p><b>Teaching → largest record:</b> {_e(r.trend if r.trend == 'unchanged' else r.trend + ' the paper')}.</p>")
    return "".join(out)


ABBREVIATIONS = ("Fig", "Figs", "Eq", "Eqs", "Sec", "Tab", "e.g", "i.e", "vs", "al", "cf", "App", "approx")


def short_statement(text: str, limit: int = 170) -> str:
    """The claim in a few words for its table row: the statement's first clause (the whole
    statement is folded under the row), cut at a word and marked when still too long. A clause
    ends at '. ', '; ' or ': ' outside parentheses, not after an abbreviation ("Fig. 3")."""
    text = " ".join(str(text).split())
    depth, end = 0, len(text)
    for i, ch in enumerate(text):
        depth += ch in "([" and 1 or (-1 if ch in ")]" and depth else 0)
        if i < 40 or depth or ch not in ".;:" or text[i + 1:i + 2] != " ":
            continue
        word = re.split(r"[\s(]", text[:i])[-1]
        if ch == "." and (word in ABBREVIATIONS or re.fullmatch(r"\d+|[A-Z]", word or "")):
            continue
        end = i + (ch == ".")
        break
    first = text[:end]
    if len(first) <= limit:
        return first
    return first[:limit].rsplit(" ", 1)[0] + " …"


def _record_cell(r: sc.ClaimResult) -> str:
    records = [m for m in r.measurements if m.scale.name != "teaching"]
    shown = [m for m in records if m.value is not None]
    if not shown:
        return "—"
    if len(shown) == 1:
        return _ours(shown[0], r.claim)
    return "<br>".join(f"{_e(m.scale.name)}: {_ours(m, r.claim)}" for m in shown)


def claims_table(results: Sequence[sc.ClaimResult]) -> list[str]:
    """The raw-HTML claims table: one row per claim, its quote, tolerance, data and explanation
    folded under it (one line per element: MyST ends a raw HTML block at a blank line)."""
    out = ['<div class="nnk-scorecard-wrap"><table class="nnk-scorecard">',
           "<colgroup><col class=\"nnk-col-claim\"><col class=\"nnk-col-paper\"><col class=\"nnk-col-ours\">"
           "<col class=\"nnk-col-ours\"><col class=\"nnk-col-status\"></colgroup>",
           "<thead><tr><th>claim</th><th>paper</th><th>ours, teaching</th><th>ours, record</th><th>status</th></tr></thead>"]
    for r in results:
        c = r.claim
        teach = next((m for m in r.measurements if m.scale.name == "teaching"), None)
        ours = "not measured" if c.get("measure") is None else _ours(teach, c) if teach else "chapter not run"
        disagree = ' data-disagree="1"' if r.disagreement else ""
        out.append(f'<tbody class="nnk-claim" id="claim-{_e(c["id"])}" data-status="{_slug(r.status)}"{disagree}>')
        out.append(f"<tr><td>{_e(short_statement(c['statement']))} <span class='nnk-small'>({_e(c['id'])})</span></td>"
                   f"<td>{_paper_cell(c)}</td><td>{ours}</td><td>{_record_cell(r)}</td><td>{_status_cell(r)}</td></tr>")
        out.append(f'<tr class="nnk-claim-details"><td colspan="5"><details><summary>the paper’s words, tolerance, '
                   f"data</summary>{_details(r)}</details></td></tr>")
        out.append("</tbody>")
    out.append("</table></div>")
    return out


def _counts_table(data: Mapping[str, Any], results: Sequence[sc.ClaimResult]) -> list[str]:
    keys = list(data["papers"])
    lines = ["| status | " + " | ".join(SHORT.get(k, k) for k in keys) + " | total |",
             "|---" * (len(keys) + 2) + "|"]
    for status in sc.STATUSES:
        row = [sum(r.status == status for r in results if r.claim["paper"] == k) for k in keys]
        lines.append(f"| {status} | " + " | ".join(str(n) for n in row) + f" | **{sum(row)}** |")
    lines.append("| **claims** | " + " | ".join(f"**{sum(r.claim['paper'] == k for r in results)}**" for k in keys)
                 + f" | **{len(results)}** |")
    return lines


def _filter_bar(results: Sequence[sc.ClaimResult]) -> str:
    counts = sc.count_statuses(results)
    buttons = [f'<button type="button" class="nnk-filter" data-filter="all" aria-pressed="true">all ({len(results)})</button>']
    buttons += [f'<button type="button" class="nnk-filter" data-filter="{_slug(s)}" aria-pressed="false">{_e(s)} ({n})</button>'
                for s, n in counts.items() if n]
    n = sum(1 for r in results if r.disagreement)
    if n:
        buttons.append(f'<button type="button" class="nnk-filter" data-filter="disagree" aria-pressed="false">'
                       f"scales disagree ({n})</button>")
    return '<div class="nnk-filter-bar" role="group" aria-label="show claims by status">' + "".join(buttons) + "</div>"


def provenance(chapter: str, scales: Sequence[sc.Scale], anchor: bool = True) -> str:
    """One line per chapter: where each scale's values come from, and whether each record is current.
    ``anchor``: give the line the id that the ``{recorded}`` role's marks link to
    (:func:`nnk_book.records.provenance_anchor`; once per chapter on the page)."""
    parts = []
    for s in scales:
        if s.name == "teaching":
            parts.append("teaching values from this build's executed chapter")
            continue
        minutes = (f", {s.seconds / 60:.0f} min" + (f" in {s.starts} starts" if s.starts > 1 else "")) if s.seconds else ""
        state = {True: "current: its commit's teaching values are this build's",
                 False: f"**stale**: {s.stale_why}",
                 None: f"currency unknown: {s.stale_why}"}[s.current]
        text = f"`{s.name}` run of {s.date}, commit {s.commit}, {s.machine}{minutes}; {state}"
        if s.deviation:
            text += f"; departs from its profile: {s.deviation}"
        parts.append(text)
    if not parts:
        parts.append("no run of the chapter in this build and no record")
    target = f'<span id="{provenance_anchor(chapter)}"></span>' if anchor else ""
    return f"* {target}Chapter `{chapter}`: " + "; ".join(parts) + "."


def draw_figure(results: Sequence[sc.ClaimResult], path: Path) -> bool:
    """Ours / paper (left; or ours - paper where a ratio means nothing, right) per numeric
    claim at each measured scale. Returns False when no claim has a number to draw."""
    points: dict[str, list[tuple[str, str, float]]] = {"ratio": [], "difference": []}
    for r in results:
        for m in r.measurements:
            got = sc.ratio_to_paper(m.value, r.claim)
            if got is not None:
                points[got[0]].append((r.claim["id"], m.scale.name + ("" if m.scale.current is not False else " (stale)"), got[1]))
    if not any(points.values()):
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from nnk_book.figures import check_legible, use_book_style

    use_book_style()
    kinds = [k for k in ("ratio", "difference") if points[k]]
    rows = max(len({p[0] for p in points[k]}) for k in kinds)
    fig, axes = plt.subplots(1, len(kinds), figsize=(6.8, 0.28 * rows + 1.4), squeeze=False)
    markers = {"teaching": "o", "record": "s", "record (stale)": "s", "paper": "D", "paper (stale)": "D"}
    for ax, kind in zip(axes[0], kinds):
        ids = sorted({p[0] for p in points[kind]}, reverse=True)
        where = {cid: i for i, cid in enumerate(ids)}
        for scale in sorted({p[1] for p in points[kind]}):
            xs = [p[2] for p in points[kind] if p[1] == scale]
            ys = [where[p[0]] for p in points[kind] if p[1] == scale]
            ax.scatter(xs, ys, marker=markers.get(scale, "o"), label=scale, s=22)
        ax.axvline(1.0 if kind == "ratio" else 0.0, color="0.5", lw=1)
        ax.set_yticks(range(len(ids)), ids, fontsize=8)
        if kind == "ratio":
            ax.set_xscale("log")
        ax.set_xlabel("ours / paper" if kind == "ratio" else "ours − paper")
        ax.set_title("ratio to the paper" if kind == "ratio" else "difference (paper value 0)", fontsize=9)
        ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    check_legible(fig)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def record_notes(chapter: str, scales: Sequence[sc.Scale]) -> str | None:
    """A folded list of what each record of the chapter found, with the recorded values: the
    predictions it did not meet (``<profile>_checks: failed``) and the descriptions written after
    it ran (``<profile>_findings``), from ``tests/expected/<chapter>.yaml``. Not asserted here."""
    path = EXPECTED / f"{chapter}.yaml"
    expected = yaml.safe_load(path.read_text()) if path.exists() else {}
    items = []
    for s in scales:
        if s.name == "teaching":
            continue
        failed = ((expected.get(f"{s.name}_checks") or {}).get("failed") or {})
        found = expected.get(f"{s.name}_findings") or {}
        for kind, entries in (("prediction not met", failed), ("finding", found)):
            for name, text in entries.items():
                value = sc.format_value(s.values.get(name)) if name in s.values else "—"
                items.append(f"<li><b>{_e(kind)}</b> ({_e(s.name)}): {_e(text)} "
                             f"<code>{_e(name)}</code> = {_e(value)}</li>")
    if not items:
        return None
    return (f'<details class="nnk-record-notes"><summary>What the records of <code>{_e(chapter)}</code> found '
            f"({len(items)} notes, written after the runs: descriptions, not checks)</summary><ul>"
            + "".join(items) + "</ul></details>")


def scorecard_markdown(data: Mapping[str, Any], results: Sequence[sc.ClaimResult], chapters: Sequence[str],
                       figure: bool) -> str:
    out = ["(scorecard)=", "# Reproduction scorecard", "",
           "Every headline claim of the five papers this book reproduces, in the paper's own words, beside what "
           "the book measured. The claims, their tolerances and the reason for each tolerance's width are in "
           "`book/claims.yaml`; nothing on this page is typed in. Teaching-scale values are those the chapters "
           "glued in the run that rendered this book (the `ci` profile); larger scales come from the recorded runs "
           "in `book/runs/` (`record`: larger settings, sized for about 90 minutes on a 2-core CPU; `paper`: the "
           "papers' own settings). `nnk_book.scorecard` computes every status.", "",
           "How a status is computed: the largest scale whose record is current decides. Where the chapter "
           "glues a 95 % interval, the claim is *met* only when the whole interval lies inside the tolerance, "
           "and *inconclusive* when the interval crosses its edge. A met claim is *reproduced* when it does not "
           "depend on scale (an identity, a count) or was met by a `paper` run without deviations; *reproduced at "
           "smaller scale* when it was met on the paper's kind of data at a smaller scale. A claim measured only "
           "where the data set itself was replaced (the 8 × 8 digits for MNIST, the docstring task for GLUE) is "
           "*measured on stand-in data only*, whatever the outcome, which the row shows beside it. A "
           "claim that is not met *differs*: *explained* when a chapter section measures why, else *not yet "
           "explained*. A claim the book does not measure is *not yet run*, with the reason.", "",
           "A record is *current* while its numbers would be the same if it ran today: it stores the "
           "teaching-scale values of the commit it ran at, and it stays current while this build's teaching "
           "values agree with them (timings left out) and its parameters are still its profile's. A stale record "
           "is shown, not counted.", "",
           "## Counts", ""]
    out += _counts_table(data, results)
    if figure:
        out += ["", "```{figure} " + FIGURE, ":name: scorecard-figure",
                ":alt: Dot plot, one row per claim with a number: our value divided by the paper's on a "
                "log axis (left), or our value minus the paper's where the paper's is zero (right), one "
                "marker per measured scale.", "",
                "Ours against the paper, per claim and scale: a point on the grey line is the paper's number.",
                "```"]
    out += ["", "## The claims", "",
            "Each row folds out to the paper's words with their place, the tolerance and why it has that width, "
            "and the data. The buttons show the claims of one status.", "", _filter_bar(results)]
    scales = {r.claim["chapter"]: [m.scale for m in r.measurements] for r in results}
    anchored: set[str] = set()
    for key, paper in data["papers"].items():
        mine = [r for r in results if r.claim["paper"] == key]
        counts = sc.count_statuses(mine)
        out += ["", f"### {paper['title']}", "",
                f"The paper's setting: {paper['setting']}. "
                + "; ".join(f"{counts[s]} {s}" for s in sc.STATUSES if counts[s]) + ".", ""]
        chapters_here = sorted({r.claim["chapter"] for r in mine})
        for chapter in chapters_here:
            out.append(provenance(chapter, scales[chapter], anchor=chapter not in anchored))
            anchored.add(chapter)
        for chapter in chapters_here:
            notes = record_notes(chapter, scales[chapter])
            if notes:
                out += ["", notes]
        out += [""] + claims_table(mine)
    return "\n".join(out) + "\n"


def execution_markdown(executed: Path | None) -> str:
    """The execution-status page: the runner's summary, and for each chapter whether its run
    was reused from the cache and when it ran."""
    out = ["# Execution status", "",
           "The chapters are executed by `book/tools/run_chapters.py` (papermill, the profile's "
           "parameters, a time budget, the network blocked) and the book is rendered from those executed "
           "notebooks with execution off. A chapter whose code, parameters and package sources are "
           "unchanged since its last successful run is not executed again: its earlier run is reused "
           "from the cache, and the table says when that run happened.", ""]
    summary = executed / "summary.json" if executed else None
    if not summary or not summary.exists():
        return "\n".join(out + ["No runner summary was found for this build.", ""])
    rows = json.loads(summary.read_text())
    out += ["| chapter | profile | status | run | seconds | threads |", "|---|---|---|---|---|---|"]
    for r in rows:
        key = executed / f"{r['chapter']}.key"
        when = "?"
        if key.exists():
            try:
                when = json.loads(key.read_text()).get("date", "?")
            except ValueError:
                pass
        status = r["status"]
        run = f"reused from the cache; ran {when}" if status == "cached" else f"executed for this build, {when}"
        if status not in ("ok", "cached"):
            run = f"failed{' (' + str(r.get('cell')) + ')' if r.get('cell') else ''}"
        out.append(f"| {r['chapter']} | {r['profile']} | {status} | {run} | {r['seconds']:.1f} | {r['threads']} |")
    return "\n".join(out) + "\n"


def write_pages(book_dir: Path, executed: Path | None, chapters: Sequence[str]) -> list[sc.ClaimResult]:
    """Write ``scorecard.md`` (+ its figure) and ``execution_status.md`` into ``book_dir``."""
    data, results = compute(executed, chapters)
    book_dir.mkdir(parents=True, exist_ok=True)
    figure = draw_figure(results, book_dir / FIGURE)
    atomic_write_text(book_dir / "scorecard.md", scorecard_markdown(data, results, chapters, figure))
    atomic_write_text(book_dir / "execution_status.md", execution_markdown(executed))
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--executed", type=Path, default=None, help="folder of executed chapters")
    ap.add_argument("--out", type=Path, required=True, help="folder to write the pages into")
    ap.add_argument("--chapters", nargs="*", default=None)
    args = ap.parse_args(argv)
    import run_chapters

    args.out.mkdir(parents=True, exist_ok=True)
    results = write_pages(args.out, args.executed, args.chapters or run_chapters.chapter_names())
    for status, n in sc.count_statuses(results).items():
        print(f"{n:3d}  {status}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
