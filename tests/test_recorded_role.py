"""The ``{recorded}`` role (book/_ext/recorded.py): a recorded value reaches the page through the
build, formatted, with its provenance; a misspelt name fails a ``-W`` build; a chapter without a
record reads "(not recorded)".

The pure parts are checked directly; one two-page book (tests/minibook.py) with a fake record of
its chapter ``page`` checks the rendering (a few seconds per build).
"""

from __future__ import annotations

import html
import importlib.util
import json
import re
from pathlib import Path

import pytest
import yaml

from minibook import ROOT, build, make_book

_spec = importlib.util.spec_from_file_location("recorded_ext", ROOT / "book" / "_ext" / "recorded.py")
recorded = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(recorded)

RECORD = {"chapter": "page", "profile": "record", "note": "", "recorded": "2026-11-29", "seconds": 60.0,
          "commit": "abc1234", "code_hash": "0", "parameters": {},
          "machine": {"cpu": "Test CPU", "logical_cores": 2, "threads": 1},
          "values": {"pg_gap": 3.14159, "pg_steps": 2000, "pg_verdict": "better", "pg_inf": "inf"}}
PROSE = ("md", "Gap {recorded}`pg_gap:.2f` dB after {recorded}`pg_steps` steps, "
               "{recorded}`pg_verdict`; unrecorded {recorded}`pg_new:.1f`. Recorded {recorded}`@recorded` "
               "in {recorded}`@minutes:.0f` minutes. Speed-up {benchmark}`pg:rows[h=2,tau=8].speedup:.1f`.")
BENCH = {"machine": {"cpu": "Test CPU", "torch_threads": 1, "date": "2026-11-27 03:54 UTC"},
         "rows": [{"h": 2, "tau": 4, "speedup": 1.0}, {"h": 2, "tau": 8, "speedup": 2.345}]}
TEACHING = ("code", "from nnk_book import Recorder\nrecord = Recorder()\nrecord('pg_new', 1.5)")


def test_split_target_and_format() -> None:
    assert recorded.split_target("rf_x:.2f", "chapters/02_random_features") == ("02_random_features", "rf_x", ".2f")
    assert recorded.split_target("03_bundling/bnd_y", "chapters/02_random_features") == ("03_bundling", "bnd_y", "")
    assert recorded.format_value(3.14159, ".2f") == "3.14"  # as {glue:text} formats
    assert recorded.format_value(2000, "") == "2000"
    assert recorded.format_value("better", "") == "better"
    assert recorded.format_value("inf", ".1f") == "inf"  # non-finite floats are stored as strings
    assert recorded.format_value(0.25, ".1%") == "25.0%"


def test_provenance_says_profile_commit_date_and_currency() -> None:
    line = recorded.provenance(RECORD, None, "the record has no teaching fingerprint")
    assert "record run of 2026-11-29, commit abc1234, Test CPU, 1 thread(s)" in line
    assert "currency not checked: the record has no teaching fingerprint" in line
    assert recorded.mark(RECORD, True) == "record" and recorded.mark(RECORD, False) == "record, stale"
    resumed = {**RECORD, "earlier_starts_seconds": [120.0]}
    assert [recorded.record_fact(resumed, f) for f in ("recorded", "minutes", "starts", "threads", "profile", "commit")] == [
        "2026-11-29", 3.0, 2, 1, "record", "abc1234"]


def _book(tmp_path: Path, cells: list, record: dict | None) -> Path:
    """A mini book whose chapter ``page`` has ``record`` (if any), with a scorecard page that has
    the chapter's provenance anchor, as book/tools/scorecard_page.py writes it."""
    book = make_book(tmp_path, cells)
    import scorecard_page

    (book / "book" / "scorecard.md").write_text("# Reproduction scorecard\n\n" + scorecard_page.provenance("page", []) + "\n")
    (book / "benchmarks" / "results").mkdir(parents=True)
    (book / "benchmarks" / "results" / "bench_pg.json").write_text(json.dumps(BENCH))
    toc = yaml.safe_load((book / "_toc.yml").read_text())
    toc["chapters"].append({"file": "book/scorecard"})
    (book / "_toc.yml").write_text(yaml.safe_dump(toc))
    if record is not None:
        runs = book / "book" / "runs"
        runs.mkdir(parents=True)
        (runs / f"page.{record['profile']}.json").write_text(json.dumps(record))
    return book


def _page(book: Path) -> str:
    return (book / "_build" / "html" / "chapters" / "page.html").read_text()


def test_role_renders_the_record_with_its_provenance(tmp_path: Path) -> None:
    book = _book(tmp_path, [TEACHING, PROSE], RECORD)
    proc = build(book)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    page = _page(book)
    spans = re.findall(r'<span class="nnk-recorded" title="([^"]*)">([^<]*)</span>', page)
    assert [text for _, text in spans] == ["3.14", "2000", "better", "2026-11-29", "1", "2.3"], spans
    assert "bench_pg.json, run 2026-11-27 03:54 UTC on Test CPU, 1 torch thread(s)" in html.unescape(spans[-1][0])
    title = html.unescape(spans[0][0])
    assert "record run of 2026-11-29, commit abc1234" in title and "currency not checked" in title, title
    # the mark after each value links to the chapter's line on the scorecard page
    links = re.findall(r'<a class="reference internal" href="([^"]+)"[^>]*><sup>\[([^]]+)\]</sup></a>', page)
    assert links == [("../book/scorecard.html#provenance-page", "record, currency not checked")] * 5, links
    assert 'unrecorded <span class="nnk-recorded nnk-not-recorded">(not recorded)' in page


def test_misspelt_name_fails_the_build(tmp_path: Path) -> None:
    book = _book(tmp_path, [("md", "A typo: {recorded}`pg_gpa:.2f`, {recorded}`@minuets`, "
                                   "{benchmark}`pg:rows[h=2].speedup`.")], RECORD)
    proc = build(book)
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "'pg_gpa'" in out and "'@minuets'" in out and "selects 2 rows" in out


def test_chapter_without_a_record_reads_not_recorded(tmp_path: Path) -> None:
    book = _book(tmp_path, [("md", "No record: {recorded}`pg_gap:.2f`.")], None)
    proc = build(book)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "(not recorded)" in _page(book)



def test_benchmark_paths() -> None:
    assert recorded.select(BENCH, "rows[h=2,tau=8].speedup") == 2.345
    assert recorded.select(BENCH, "rows[0].tau") == 4
    assert recorded.select(BENCH, "machine.cpu") == "Test CPU"
    for bad in ("rows[h=3].speedup", "rows[h=2].speedup", "nothing", "rows[h=2,tau=8].nothing"):
        with pytest.raises(LookupError):
            recorded.select(BENCH, bad)


def _staged(srcdir: Path, values: dict, threads: int) -> None:
    """An executed chapter ``page`` in a staged book, and the runner's key file with its threads."""
    import nbformat

    executed = srcdir / "executed" / "page.ipynb"
    cell = nbformat.v4.new_code_cell("record(...)")
    cell.outputs = [nbformat.v4.new_output(
        "display_data", data={"application/papermill.record/text/plain": repr(v)},
        metadata={"scrapbook": {"name": k, "mime_prefix": "application/papermill.record/"}})
        for k, v in values.items()]
    nb = nbformat.v4.new_notebook(cells=[cell], metadata={"papermill": {"output_path": str(executed)}})
    (srcdir / "chapters").mkdir(parents=True)
    nbformat.write(nb, str(srcdir / "chapters" / "page.ipynb"))
    executed.parent.mkdir()
    executed.with_suffix(".key").write_text(json.dumps({"threads": threads}))


def test_currency_is_the_scorecards(tmp_path: Path) -> None:
    """The record is current while this build's teaching values are its fingerprint's; the
    largest current record is shown before a larger stale one."""
    runs = tmp_path / "runs"
    runs.mkdir()
    fingerprint = {"commit": "abc1234", "threads": 1, "values": {"pg_teach": 0.5}}
    (runs / "page.record.json").write_text(json.dumps({**RECORD, "teaching_fingerprint": fingerprint}))
    paper = {**RECORD, "profile": "paper", "values": {"pg_gap": 9.0},
             "teaching_fingerprint": {**fingerprint, "values": {"pg_teach": 0.7}}}
    (runs / "page.paper.json").write_text(json.dumps(paper))
    _staged(tmp_path, {"pg_teach": 0.5, "pg_other": 1}, threads=1)
    found = recorded.chapter_records(tmp_path, runs, "page")
    assert found["record"]["profile"] == "record" and found["current"] is True, found
    assert found["known"] == {"pg_gap", "pg_steps", "pg_verdict", "pg_inf", "pg_teach", "pg_other"}
    assert recorded.mark(found["record"], True) == "record"
    (runs / "page.record.json").unlink()  # only the stale paper record is left: shown, marked stale
    found = recorded.chapter_records(tmp_path, runs, "page")
    assert found["record"]["profile"] == "paper" and found["current"] is False
    assert "pg_teach: 0.7 then, 0.5 now" in recorded.provenance(found["record"], False, found["why"])
