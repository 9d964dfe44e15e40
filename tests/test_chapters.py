"""Papermill regression: every chapter runs in its ci budget and keeps its claims.

Each chapter records its key results with ``myst_nb.glue``. ``tests/expected/<chapter>.yaml``
holds, per glued name, the expected value or bounds and the sentence of the chapter's
text that the check guards. A chapter that raises, hangs, or drifts out of tolerance
fails here; a chapter that did not run fails once, in ``test_chapter_executes``, and its
other tests skip with a pointer to it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

import run_chapters
from nnk_book import checks
from nnk_book.results import glued_names, read_glued

EXPECTED = Path(__file__).resolve().parent / "expected"
CHAPTERS = run_chapters.chapter_names()


def load_expected(chapter: str) -> dict[str, Any]:
    path = EXPECTED / f"{chapter}.yaml"
    return yaml.safe_load(path.read_text()) if path.exists() else {}


def parse_expected(chapter: str, name: str, spec: Any) -> checks.Check:
    """The check of ``tests/expected/<chapter>.yaml``'s entry ``name``: its ``claim`` (the
    sentence of the chapter it guards) aside, a check of :mod:`nnk_book.checks`."""
    if not isinstance(spec, dict):
        raise ValueError(f"{chapter}/{name}: expected a mapping with a claim and a check, got {spec!r}")
    return checks.parse({k: v for k, v in spec.items() if k != "claim"}, f"{chapter}/{name}")


def check_value(name: str, got: Any, spec: dict[str, Any], glued: dict[str, Any]) -> list[str]:
    """The violated criteria of the check ``spec`` (a ``tests/expected`` entry) on the glued
    value ``got`` of ``name``, with every glued value in ``glued`` (empty when it holds)."""
    met, why = checks.evaluate(parse_expected("check", name, spec), got, glued, name=name)
    return [] if met else [why]


def executed_result(executed_chapters, chapter: str):
    if chapter not in executed_chapters:
        pytest.skip(f"{chapter} not selected by NN_KERNELS_TEST_CHAPTERS")
    return executed_chapters[chapter]


def ran_result(executed_chapters, chapter: str):
    """The chapter's Result; skips (one failure, test_chapter_executes, names the cause)
    when the chapter did not run to the end."""
    result = executed_result(executed_chapters, chapter)
    if not result.ok:
        pytest.skip(f"chapter {chapter} did not run ({result.status}): "
                    f"see test_chapter_executes[{chapter}]")
    return result


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_expected_file_is_well_formed(chapter: str) -> None:
    data = load_expected(chapter)
    assert data, f"tests/expected/{chapter}.yaml is missing or empty"
    assert data.get("chapter") == chapter
    entries = data.get("checks") or {}
    assert entries, f"{chapter}: no checks"
    for name, spec in entries.items():
        assert isinstance(spec, dict) and isinstance(spec.get("claim"), str) and len(spec["claim"]) > 10, (
            f"{chapter}/{name}: each check names the claim of the text it guards")
        parse_expected(chapter, name, spec)  # ValueError names the key at fault
    section = data.get("record_checks") or {}
    for name, spec in section.items():
        if name not in ("inherit", "scale_specific", "failed"):
            parse_expected(chapter, f"record_checks/{name}", spec)


@pytest.mark.slow
@pytest.mark.parametrize("chapter", CHAPTERS)
def test_chapter_executes(executed_chapters, chapter: str) -> None:
    """The one test that fails when a chapter did not run; its other tests then skip."""
    result = executed_result(executed_chapters, chapter)
    assert result.ok, (
        f"chapter {chapter} ({result.profile}) {result.status} after {result.seconds:.0f} s "
        f"({result.cpu_s:.0f} CPU-s): {run_chapters.describe_failure(result)}; "
        f"log: {Path(result.output).with_suffix('.log')}")


@pytest.mark.slow
@pytest.mark.parametrize(
    "chapter,name",
    [(c, n) for c in CHAPTERS for n in (load_expected(c).get("checks") or {})],
)
def test_glued_result_matches_expected(executed_chapters, chapter: str, name: str) -> None:
    result = ran_result(executed_chapters, chapter)
    glued = read_glued(result.output)
    spec = load_expected(chapter)["checks"][name]
    assert name in glued, f"{chapter} did not glue {name!r} (glued: {sorted(glued)})"
    errors = check_value(name, glued[name], spec, glued)
    assert not errors, f"{chapter}: claim '{spec['claim']}' fails: " + "; ".join(errors)


@pytest.mark.slow
@pytest.mark.parametrize("chapter", CHAPTERS)
def test_each_result_is_glued_once(executed_chapters, chapter: str) -> None:
    # A name glued twice (say inside a loop) makes the book build warn, which fails it.
    result = ran_result(executed_chapters, chapter)
    names = glued_names(result.output)
    repeated = sorted({n for n in names if names.count(n) > 1})
    assert not repeated, f"{chapter} glues these names more than once: {repeated}"


@pytest.mark.slow
@pytest.mark.parametrize("chapter", CHAPTERS)
def test_figures_are_captioned_column_sized_and_error_free(executed_chapters, chapter: str) -> None:
    """Every figure has a caption and alt text, fits the column; no cell reported an error.

    A figure wider than the column or with text under 8 pt fails nnk_book's check, which
    IPython reports as an error output of the cell that drew it (the run goes on).
    """
    import base64
    import io

    import nbformat
    from PIL import Image

    from nnk_book import figures

    result = ran_result(executed_chapters, chapter)
    nb = nbformat.read(result.output, as_version=4)
    problems, shown = [], 0
    for number, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []):
            if out.output_type == "error":
                problems.append(f"cell {number}: {out.ename}: {out.evalue[:200]}")
            if out.output_type == "stream" and "FigureLegibilityError" in out.text:
                problems.append(f"cell {number}: {out.text[-300:]}")
            png = out.get("data", {}).get("image/png")
            if png is None:
                continue
            shown += 1
            width = Image.open(io.BytesIO(base64.b64decode(png))).size[0]
            if width > figures.COLUMN_WIDTH_IN * figures.DPI * 1.02:
                problems.append(f"cell {number}: a figure {width} px wide (column: "
                                f"{figures.COLUMN_WIDTH_IN * figures.DPI:.0f} px)")
            meta = cell.metadata.get("mystnb", {})
            if not meta.get("figure", {}).get("caption") or not meta.get("image", {}).get("alt"):
                problems.append(f"cell {number}: a figure without mystnb figure.caption and image.alt")
    assert shown, f"{chapter} shows no figure"
    assert not problems, f"{chapter}: " + "; ".join(problems[:10])


def test_check_value_catches_violations() -> None:
    glued = {"a": 1.0, "b": 2.0}
    assert check_value("a", 1.0, {"value": 1.1, "atol": 0.2}, glued) == []
    assert check_value("a", 1.0, {"value": 1.5, "atol": 0.2}, glued)
    assert check_value("a", 1.0, {"max": 0.5}, glued)
    assert check_value("a", 1.0, {"min": 2.0}, glued)
    assert check_value("a", 1.0, {"less_than": "b"}, glued) == []
    assert check_value("b", 2.0, {"less_than": "a"}, glued)
    assert check_value("a", 1.0, {"greater_than": "missing"}, glued)
    assert check_value("a", float("nan"), {"min": 0.0}, glued)
    # a conditional check applies only when its condition holds, and its condition must be glued
    assert check_value("a", 1.0, {"min": 2.0, "when": {"flag": True}}, {**glued, "flag": True})
    assert check_value("a", 1.0, {"min": 2.0, "when": {"flag": True}}, {**glued, "flag": False}) == []
    assert check_value("a", 1.0, {"min": 2.0, "when": {"flag": True}}, glued)
    assert check_value("f", True, {"equals": False}, glued)
    # verdicts computed from glued intervals, whatever word comes out
    glued = {"x": 0.5, "x_hw": 0.03, "y": 0.4, "y_hw": 0.0, "z": 0.45, "z_hw": 0.2}
    assert check_value("v", "behind", {"verdict_of": {"a": "x", "b": "y", "higher_is_better": False}}, glued) == []
    assert check_value("v", "ahead", {"verdict_of": {"a": "x", "b": "y"}}, glued) == []
    assert check_value("v", "tied", {"verdict_of": {"a": "x", "b": "y"}}, glued)
    assert check_value("v", "tied", {"verdict_of": {"a": "x", "b": "z"}}, glued) == []
    assert check_value("v", "ahead", {"verdict_of": {"a": "x", "b": "z"}}, glued)
    assert check_value("v", "tied", {"verdict_of": {"a": "x", "b": "missing"}}, glued)
    assert check_value("v", True, {"verdict_of": {"a": "x", "b": "y", "word": "ahead"}}, glued) == []
    assert check_value("v", True, {"verdict_of": {"a": "x", "b": "z", "word": "ahead"}}, glued)
    assert check_value("w", "not all tied (x ahead of y)", {"all_tied_of": ["x", "y", "z"]}, glued) == []
    assert check_value("w", "tied", {"all_tied_of": ["x", "y", "z"]}, glued)
    assert check_value("w", "tied", {"all_tied_of": ["x", "z"]}, glued) == []
    assert check_value("w", "not all tied (x ahead of z)", {"all_tied_of": ["x", "z"]}, glued)


@pytest.mark.slow
@pytest.mark.parametrize("chapter", CHAPTERS)
def test_sweep_progress_stays_off_the_page(executed_chapters, chapter: str) -> None:
    """Under the runner a sweep writes a line per configuration to stderr (the chapter's log and
    the runner's hang detection read them); every cell that wrote such lines is tagged
    ``remove-stderr``, so the page shows none (nor the result store's path), and no progress
    line reaches stdout, which the page shows."""
    import re

    import nbformat

    progress = re.compile(r"^\s*\[[\w.-]+\] (\d+ configurations: |\d+/\d+ done)", re.M)
    nb = nbformat.read(ran_result(executed_chapters, chapter).output, as_version=4)
    shown = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        tags = set(cell.metadata.get("tags", []))
        for out in cell.get("outputs", []):
            if out.get("output_type") != "stream" or not progress.search(out.get("text", "")):
                continue
            if out.get("name") == "stdout" or "remove-stderr" not in tags:
                shown.append(f"{cell.get('id')} ({out.get('name')})")
    assert not shown, f"{chapter}: sweep progress would show on the page in cells {sorted(set(shown))}"
