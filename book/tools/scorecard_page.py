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
import json
import re
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from glued import read_glued  # noqa: E402

from nnk_book import scorecard as sc  # noqa: E402
from nnk_book.files import atomic_write_text  # noqa: E402
from nnk_book.records import recorded_run, run_seconds, run_starts  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PROFILES = ROOT / "book" / "profiles.yaml"
RECORD_PROFILES = ("full", "record", "paper")  # scale names of nnk_book.scorecard.SCALES
FIGURE = "scorecard_ratios.png"
LABEL = re.compile(r"^[a-z0-9]+-[a-z0-9-]+$")  # the book's labels: chapter prefix, hyphen, name


def load_claims() -> dict[str, Any]:
    data = yaml.safe_load(sc.CLAIMS.read_text())
    sc.validate_claims(data)
    return data


def chapter_labels(notebook: Path) -> set[str]:
    """The MyST labels ``(name)=`` a chapter defines (targets of ``{ref}``)."""
    text = notebook.read_text()
    return set(re.findall(r"\((\w[\w-]*)\)=", text))


def scales_for(chapter: str, teaching: Mapping[str, Any] | None) -> list[sc.Scale]:
    """The chapter's measured scales: its executed teaching run and its recorded runs."""
    scales = []
    if teaching is not None:
        scales.append(sc.Scale("teaching", teaching))
    for profile in RECORD_PROFILES:
        data = recorded_run(chapter, profile)
        if data is None:
            continue
        machine = data.get("machine", {})
        scales.append(sc.Scale(
            profile, data.get("values", {}), date=data.get("recorded"), commit=data.get("commit"),
            machine=f"{machine.get('cpu', '?')}, {machine.get('threads', '?')} thread(s)",
            seconds=run_seconds(data), starts=run_starts(data), current=data.get("current"),
            parameters=data.get("parameters", {})))
    return scales


def compute(executed: Path | None, chapters: Sequence[str]) -> tuple[dict[str, Any], list[sc.ClaimResult]]:
    """Claims and their results. ``executed``: folder of executed chapters (teaching values)."""
    data = load_claims()
    teaching: dict[str, dict[str, Any] | None] = {}
    for chapter in {c["chapter"] for c in data["claims"]}:
        nb = executed / f"{chapter}.ipynb" if executed else None
        teaching[chapter] = read_glued(nb) if (nb and chapter in chapters and nb.exists()) else None
    scales = {chapter: scales_for(chapter, values) for chapter, values in teaching.items()}
    return data, [sc.claim_status(claim, scales[claim["chapter"]]) for claim in data["claims"]]


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _section_link(chapter: str, section: str, chapters: Sequence[str], labels: Mapping[str, set[str]]) -> str:
    if chapter not in chapters:
        return _cell(section)
    if LABEL.match(section) and section in labels.get(chapter, set()):
        return f"{{ref}}`{section}`"
    return f"[{_cell(section)}](../chapters/{chapter}.ipynb)"


def _ours(m: sc.Measurement | None, values: Mapping[str, Any], claim: Mapping[str, Any]) -> str:
    if m is None or m.value is None:
        return "—"
    text = sc.format_value(m.value)
    if m.interval is not None:
        text += f" ± {sc.format_value(m.interval)}"
    extra = []
    for key, word in (("seeds", "seeds"), ("steps", "steps")):
        name = claim.get(key)
        if name and values.get(name) is not None:
            extra.append(f"{sc.format_value(values[name])} {word}")
    return text + (f" ({', '.join(extra)})" if extra else "")


def _record_cell(result: sc.ClaimResult) -> str:
    records = [m for m in result.measurements if m.scale.name != "teaching" and m.value is not None]
    if not records:
        return "not yet run at this scale"
    m = records[-1]
    s = m.scale
    state = "" if s.current else " **stale**: the chapter changed since"
    minutes = f", {s.seconds / 60:.0f} min" + (f" in {s.starts} starts" if s.starts > 1 else "") if s.seconds else ""
    return (f"{_ours(m, s.values, result.claim)} — `{s.name}` run of {s.date}, commit {s.commit}, "
            f"{s.machine}{minutes}{state}")


def _status_cell(result: sc.ClaimResult, chapters: Sequence[str], labels: Mapping[str, set[str]]) -> str:
    text = f"**{result.status}**"
    if result.status == sc.DIFFERS:
        d = result.claim["differs"]
        text += f": {_cell(d['why'])} ({_section_link(result.claim['chapter'], d['section'], chapters, labels)})"
    if result.decided_by and result.decided_by != "teaching":
        text += f" (at `{result.decided_by}` scale)"
    if result.trend:
        text += f"; teaching → record: {result.trend}" + ("" if result.trend == "unchanged" else " the paper")
    return text


def _counts_table(data: Mapping[str, Any], results: Sequence[sc.ClaimResult]) -> list[str]:
    header = "| paper | " + " | ".join(sc.STATUSES) + " | claims |"
    lines = [header, "|---" * (len(sc.STATUSES) + 2) + "|"]
    for key, paper in data["papers"].items():
        mine = [r for r in results if r.claim["paper"] == key]
        counts = sc.count_statuses(mine)
        lines.append(f"| {_cell(paper['title'])} | " + " | ".join(str(counts[s]) for s in sc.STATUSES)
                     + f" | {len(mine)} |")
    total = sc.count_statuses(results)
    lines.append("| **total** | " + " | ".join(f"**{total[s]}**" for s in sc.STATUSES) + f" | **{len(results)}** |")
    return lines


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
    markers = {"teaching": "o", "full": "x", "full (stale)": "x", "record": "s", "paper": "D"}
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


def scorecard_markdown(data: Mapping[str, Any], results: Sequence[sc.ClaimResult], chapters: Sequence[str],
                       figure: bool) -> str:
    labels = {c: chapter_labels(ROOT / "chapters" / f"{c}.ipynb") for c in chapters}
    profiles = yaml.safe_load(PROFILES.read_text()) or {}
    paper_profile = profiles.get("paper") or {}
    out = ["(scorecard)=", "# Reproduction scorecard", "",
           "Every headline claim of the five papers this book reproduces, the tolerance that counts as "
           "reproducing it (written down in `book/claims.yaml` before the runs), and what the book measured. "
           "Nothing on this page is typed in: the values are the ones the chapters glued in the run that "
           "rendered this book (teaching scale, the `ci` profile) and in the recorded runs of `book/runs/` "
           "(`record`: larger settings, sized for about 90 minutes on a 2-core CPU, each record with its measured "
           "run time; `paper`: the "
           "papers' own settings; `full`: the older paper-scale profile these replaced), and each status is "
           "computed from them by `nnk_book.scorecard`.", "",
           "A claim met at teaching scale is *reproduced at smaller scale*; it is *reproduced* when it does "
           "not depend on scale (an identity or a count) or was met by a current `paper` run. A claim not met "
           "*differs*, with a link to the section that explains why, or *differs, not yet explained*. A "
           "record whose chapter changed since it ran is shown as stale and does not count.", "",
           "## Counts", ""]
    out += _counts_table(data, results)
    if figure:
        out += ["", "```{figure} " + FIGURE, ":name: scorecard-figure",
                ":alt: Dot plot, one row per claim with a number: our value divided by the paper's on a "
                "log axis (left), or our value minus the paper's where the paper's is zero (right), one "
                "marker per measured scale.", "",
                "Ours against the paper, per claim and scale: a point on the grey line is the paper's number.",
                "```"]
    for key, paper in data["papers"].items():
        mine = [r for r in results if r.claim["paper"] == key]
        counts = sc.count_statuses(mine)
        out += ["", f"## {paper['title']}", "",
                f"The paper's setting: {paper['setting']}. "
                + "; ".join(f"{counts[s]} {s}" for s in sc.STATUSES if counts[s]) + "."]
        for chapter in sorted({r.claim["chapter"] for r in mine}):
            note = (paper_profile.get(chapter) or {}).get("not_on_cpu")
            if note:
                out += ["", f"The `paper` profile of `{chapter}` on a CPU: {note}"]
        out += ["", f"```{{table}} The claims of {paper['title']}", ":class: nnk-scorecard", "",
                "| claim | paper | ours, teaching scale | ours, largest recorded scale | tolerance | status | section |",
                "|---|---|---|---|---|---|---|"]
        for r in mine:
            c = r.claim
            teach = next((m for m in r.measurements if m.scale.name == "teaching"), None)
            paper_value = sc.format_value(c["paper_value"]) if c["paper_value"] is not None else ""
            if c.get("paper_text"):
                paper_value = f"{paper_value} ({c['paper_text']})" if paper_value else c["paper_text"]
            if c.get("measure") is None:
                ours = "not measured by the chapter"
            elif teach is None:
                ours = "chapter not in this build"
            else:
                ours = _ours(teach, teach.scale.values, c)
            out.append("| " + " | ".join([
                f"<span id=\"claim-{c['id']}\"></span>**{_cell(c['where'])}**: {_cell(c['statement'])} (`{c['id']}`)",
                f"{_cell(paper_value)}; {_cell(c['setting'])}",
                _cell(ours), _cell(_record_cell(r)), _cell(sc.format_tolerance(c)),
                _status_cell(r, chapters, labels),
                _section_link(c["chapter"], c["section"], chapters, labels)]) + " |")
        out.append("```")
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
