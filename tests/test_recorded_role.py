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
               "{recorded}`pg_verdict`; unrecorded {recorded}`pg_new:.1f`.")
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


def _book(tmp_path: Path, cells: list, record: dict | None) -> Path:
    """A mini book whose chapter ``page`` has ``record`` (if any), with a scorecard page that has
    the chapter's provenance anchor, as book/tools/scorecard_page.py writes it."""
    book = make_book(tmp_path, cells)
    (book / "book" / "scorecard.md").write_text(
        "# Reproduction scorecard\n\n* <span id=\"provenance-page\"></span>Chapter `page`: a record.\n")
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
    assert [text for _, text in spans] == ["3.14", "2000", "better"], spans
    title = html.unescape(spans[0][0])
    assert "record run of 2026-11-29, commit abc1234" in title and "currency not checked" in title, title
    # the mark after each value links to the chapter's line on the scorecard page
    links = re.findall(r'<a class="reference internal" href="([^"]+)"[^>]*><sup>\[([^]]+)\]</sup></a>', page)
    assert links == [("../book/scorecard.html#provenance-page", "record, currency not checked")] * 3, links
    assert 'unrecorded <span class="nnk-recorded nnk-not-recorded">(not recorded)' in page


def test_misspelt_name_fails_the_build(tmp_path: Path) -> None:
    book = _book(tmp_path, [("md", "A typo: {recorded}`pg_gpa:.2f`.")], RECORD)
    proc = build(book)
    assert proc.returncode != 0
    assert "pg_gpa" in proc.stdout + proc.stderr


def test_chapter_without_a_record_reads_not_recorded(tmp_path: Path) -> None:
    book = _book(tmp_path, [("md", "No record: {recorded}`pg_gap:.2f`.")], None)
    proc = build(book)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "(not recorded)" in _page(book)



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
