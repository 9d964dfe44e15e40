"""build_book.py: a failed chapter still gives a book, and a subset build succeeds."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import build_book
import run_chapters

LABELS = {"fus-table1": "06_mlp_fusion", "ntk-lazy": "01_ntk"}
TITLES = {"06_mlp_fusion": "MLP fusion", "01_ntk": "NTK"}


def test_links_to_chapters_outside_a_subset_build() -> None:
    text = ("see {ref}`chapter 6 <fus-table1>`, {ref}`ntk-lazy`, {doc}`06_mlp_fusion`, "
            "{numref}`fus-table1` and [6. MLP fusion](../chapters/06_mlp_fusion.ipynb)")
    plain = build_book.unlink_missing(text, {"06_mlp_fusion"}, LABELS, TITLES, {}, "book")
    assert plain == ("see chapter 6 (not in this build), {ref}`ntk-lazy`, MLP fusion (not in "
                     "this build), MLP fusion (not in this build) and 6. MLP fusion (not in this build)")
    pages = {"06_mlp_fusion": "chapters/06_mlp_fusion.html"}
    linked = build_book.unlink_missing(text, {"06_mlp_fusion"}, LABELS, TITLES, pages, "book")
    assert '<a href="../chapters/06_mlp_fusion.html#fus-table1">chapter 6</a>' in linked
    assert '<a href="../chapters/06_mlp_fusion.html">6. MLP fusion</a>' in linked
    from_chapter = build_book.unlink_missing(text, {"06_mlp_fusion"}, LABELS, TITLES, pages, "chapters")
    assert '<a href="06_mlp_fusion.html#fus-table1">chapter 6</a>' in from_chapter


def test_every_label_of_the_book_is_indexed() -> None:
    labels, titles = build_book.chapter_index(run_chapters.CHAPTERS)
    assert labels.get("fus-table1") == "06_mlp_fusion"
    assert set(titles) == set(run_chapters.chapter_names())


def test_failed_chapter_note_and_uncomputed_values() -> None:
    nb = {"cells": [{"cell_type": "markdown", "source": "# Title\nIntro {glue:text}`a:.2f` and "
                     "{glue:text}`b`.", "metadata": {}},
                    {"cell_type": "code", "source": "glue('a', 1)", "metadata": {}, "outputs": [
                        {"output_type": "display_data", "data": {"text/plain": "1"},
                         "metadata": {"scrapbook": {"name": "a", "mime_prefix": ""}}}]}]}
    row = {"profile": "ci", "status": "hung", "cell": "cell 2 ('glue(`a`)')", "message": "no output"}
    out = build_book.mark_failed(nb, "x", row, Path("/tmp/x.log"), executed_partial=True)
    text = out["cells"][0]["source"]
    assert text.startswith("# Title\n\n:::{admonition} This chapter did not run to the end")
    assert "stopped (hung) in cell 2 ('glue('a')')" in text and "/tmp/x.log" in text
    assert "{glue:text}`a:.2f`" in text and "{glue:text}`b`" not in text
    assert "*(not computed)*" in text


@pytest.mark.slow
def test_subset_build_with_a_failed_chapter_builds_and_marks_it(tmp_path, monkeypatch) -> None:
    """`--chapters 01_ntk` whose run hung: the -W build succeeds, the page says where it
    stopped, links to the unbuilt chapters are plain text, and the exit status is 3.
    (No notebook is executed: the page is the unexecuted source, as after an early hang.)"""
    monkeypatch.setattr(build_book, "STAGE_ROOT", tmp_path / "stage")
    executed = tmp_path / "executed"
    executed.mkdir()
    row = {"chapter": "01_ntk", "profile": "ci", "seconds": 200.0, "status": "hung", "threads": 1,
           "output": str(executed / "01_ntk.ipynb"), "message": "no output and no CPU use for 180 s",
           "cell": "cell 5 ('import torch')", "cpu_s": 3.0}
    (executed / "summary.json").write_text(json.dumps([row]))
    out = tmp_path / "html"
    rc = build_book.build("ci", chapters=["01_ntk"], executed=executed, out=out)
    assert rc == build_book.CHAPTER_FAILED
    page = (out / "chapters" / "01_ntk.html").read_text()
    assert "did not run to the end" in page and "cell 5" in page and "01_ntk.log" in page
    intro = (out / "book" / "intro.html").read_text()
    assert "(not in this build)" in intro
    assert not (out / "chapters" / "06_mlp_fusion.html").exists()
    shutil.rmtree(tmp_path / "stage")
