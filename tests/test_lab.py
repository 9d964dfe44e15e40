"""JupyterLab, where ``make lab`` sends a learner, shows the chapters as the book does.

* Folding: every cell that the book hides by a tag is collapsed in JupyterLab
  (``book/tools/lab_metadata.py`` keeps ``metadata.jupyter`` in step with the tags).
* Prose: the extension ``book/lab/nnk-lab`` renders the chapters' MyST in Markdown cells:
  glued numbers formatted as myst-nb formats them, recorded values (``{recorded}``) from
  ``recorded.json`` formatted the same way with their provenance, references as text, notes
  as quotes, and each figure's caption under its cell.
* A real JupyterLab in Chromium: after "Run All", the prose shows numbers and no raw
  role, the figures have their captions, and the folded cells are collapsed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

import lab_metadata
from browser import browser_page, chromium, jupyterlab, run_all_cells, wait_until_idle

ROOT = Path(__file__).resolve().parents[1]
EXTENSION = ROOT / "book" / "lab"
ENTRY = EXTENSION / "nnk-lab" / "static" / "remoteEntry.js"
CHAPTERS = sorted((ROOT / "chapters").glob("*.ipynb"))
ROLE = re.compile(r"\{[a-z][a-z:-]*\}`")

needs_node = pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
needs_chromium = pytest.mark.skipif(
    chromium() is None, reason="Chromium is not installed (Debian: apt-get install chromium)")


def test_lab_metadata_is_up_to_date() -> None:
    """Folding, the reference index and the recorded values follow the chapters and records
    (rerun the tool after a change)."""
    proc = subprocess.run([sys.executable, str(ROOT / "book" / "tools" / "lab_metadata.py"), "--check"],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, (
        f"run `python book/tools/lab_metadata.py` and commit the result:\n{proc.stdout}{proc.stderr}")


@pytest.mark.parametrize("tags, hidden", [
    (["hide-input"], {"source_hidden": True}),
    (["remove-input"], {"source_hidden": True}),
    (["hide-output"], {"outputs_hidden": True}),
    (["remove-cell"], {"source_hidden": True, "outputs_hidden": True}),
    (["hide-cell", "parameters"], {"source_hidden": True, "outputs_hidden": True}),
    (["parameters"], {}),
    (["remove-stderr"], {}),
])
def test_folding_follows_the_book_tags(tags: list[str], hidden: dict[str, bool]) -> None:
    assert lab_metadata.folding(tags) == hidden


def test_fold_owns_only_its_two_keys() -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("1", metadata={"jupyter": {"source_hidden": True, "other": 1}}),
        nbformat.v4.new_code_cell("2", metadata={"jupyter": {"outputs_hidden": True}}),
        nbformat.v4.new_code_cell("3", metadata={"tags": ["hide-input"]}),
    ]
    lab_metadata.fold(nb)
    assert [c.metadata.get("jupyter") for c in nb.cells] == [{"other": 1}, None, {"source_hidden": True}]


def test_every_reference_of_the_chapters_has_a_text() -> None:
    index = json.loads((EXTENSION / "nnk-lab" / "static" / "references.json").read_text())
    missing = []
    for path in CHAPTERS:
        for cell in nbformat.read(str(path), as_version=4).cells:
            if cell.cell_type != "markdown":
                continue
            for role, content in re.findall(r"\{(ref|numref|doc|cite)\}`([^`]*)`", cell.source):
                target = re.search(r"<([^<>]+)>\s*$", content)
                keys = [target.group(1) if target else content]
                if role == "cite":
                    keys = [k.strip() for k in content.split(",")]
                missing += [f"{path.stem}: {{{role}}}`{k}`" for k in keys if k.strip() not in index[role]]
    assert not missing, missing


def test_citations_read_as_author_and_year() -> None:
    index = json.loads((EXTENSION / "nnk-lab" / "static" / "references.json").read_text())
    assert index["cite"]["jacot2018ntk"] == "Jacot et al. 2018"
    assert index["numref"]["fig-ntk-lazy"] == "Figure 1.1"
    assert index["doc"]["02_random_features"].startswith("Random features")


def _node(script: str, payload: object) -> object:
    program = f"const lab = require({json.dumps(str(ENTRY))});\n" \
              f"const input = JSON.parse(require('fs').readFileSync(0, 'utf8'));\n{script}"
    proc = subprocess.run(["node", "-e", program], input=json.dumps(payload), capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@needs_node
def test_numbers_are_formatted_as_myst_nb_formats_them() -> None:
    """The extension's Python ``format`` agrees with myst-nb's on the chapters' format specs."""
    from myst_nb.core.variables import format_plain_text

    specs = sorted({spec for path in CHAPTERS
                    for spec in re.findall(r"\{glue:text\}`[^`:]*:([^`]*)`", path.read_text())})
    specs += ["", "s", "d", ",d", ".3g", ".2g", "g", ".0g", "#.3g", ".2e", ".3E", ".0e", "+.2%", ",.1f",
              "8.2f", ">6s", "^7s", "08.3f", " .2f", ".1f", ".2f", "f", "e", "%", "_d"]
    values = ["0.0123456", "-0.0004", "1234567.891", "3", "-12", "0.5", "2.675", "1e-07", "123456789.0",
              "np.float64(0.4999)", "np.int64(42)", "0.0", "-0.0", "inf", "nan", "0.9995", "99.95",
              "'relu'", '"it\'s"', "'a\\nb'", "True", "False", "0.125", "0.375",
              "2.5", "1e+22", "5e-324", "0.045", "1.0"]
    cases, expected = [], []
    for value in values:
        for spec in specs:
            try:
                want = format_plain_text(value, spec)
            except Exception:  # myst-nb warns and pastes nothing: not a case to compare
                continue
            cases.append([value, spec])
            expected.append(want)
    got = _node("console.log(JSON.stringify(input.map(([v, s]) => { try { return lab.formatPython(v, s); }"
                " catch (e) { return 'ERROR ' + e.message; } })));", cases)
    wrong = [(v, s, w, g) for (v, s), w, g in zip(cases, expected, got) if w != g]
    assert not wrong, f"{len(wrong)} of {len(cases)} differ (value, spec, myst-nb, extension): {wrong[:20]}"


@needs_node
def test_every_role_and_directive_of_the_chapters_is_rendered() -> None:
    """No MyST role or directive is left in any Markdown cell once the chapter has run."""
    index = json.loads((EXTENSION / "nnk-lab" / "static" / "references.json").read_text())
    recorded = json.loads((EXTENSION / "nnk-lab" / "static" / "recorded.json").read_text())
    cells = []
    for path in CHAPTERS:
        for cell in nbformat.read(str(path), as_version=4).cells:
            if cell.cell_type == "markdown":
                names = re.findall(r"\{glue:text\}`([^`:]*)", cell.source)
                cells.append({"source": cell.source, "values": {n: "0.5" for n in names}, "chapter": path.stem})
    out = _node("console.log(JSON.stringify(input.cells.map(c => { const st = {values: c.values,"
                " index: input.index, recorded: input.recorded, chapter: c.chapter, pending: 0};"
                " return [lab.mystToMarkdown(c.source, st), st.pending]; })));",
                {"cells": cells, "index": index, "recorded": recorded})
    left = [text[:200] for text, pending in out if pending or ROLE.search(text)
            or re.search(r"^\s*(```|:::)\{", text, re.M) or re.search(r"^\([^)]*\)=\s*$", text, re.M)
            or "(not recorded)" in text]
    assert not left, left[:5]
    assert any("{recorded}" in c["source"] for c in cells), "no chapter uses the role {recorded} any more"
    before = _node("const st = {values: {}, index: {}, pending: 0};"
                   "console.log(JSON.stringify([lab.mystToMarkdown(input, st), st.pending]));",
                   "The error is {glue:text}`ntk_error:.3f`.")
    assert before == ["The error is ⟨ntk\\_error⟩.", 1]


def test_recorded_values_are_each_chapters_largest_record() -> None:
    """``recorded.json`` holds what the book's ``{recorded}`` role reads: the values of the
    chapter's largest record as Python reprs (as glued values are), its facts and provenance."""
    recorded = json.loads((EXTENSION / "nnk-lab" / "static" / "recorded.json").read_text())
    runs = ROOT / "book" / "runs"
    for path in CHAPTERS:
        files = [runs / f"{path.stem}.{profile}.json" for profile in ("paper", "record")]
        file = next((f for f in files if f.exists()), None)
        if file is None:
            assert path.stem not in recorded
            continue
        data = json.loads(file.read_text())
        entry = recorded[path.stem]
        assert entry["values"] == {k: repr(v) for k, v in data["values"].items() if v is not None}
        assert entry["facts"]["profile"] == repr(data["profile"]) and entry["facts"]["recorded"] == repr(data["recorded"])
        assert data["commit"] in entry["title"] and file.name in entry["title"]


@needs_node
def test_the_recorded_role_reads_as_the_book_renders_it() -> None:
    """``{recorded}`[chapter/]name:spec``: the record's value formatted as the book formats it
    (``book/_ext/recorded.py``), then a mark ``[profile]`` whose title is its provenance."""
    from myst_nb.core.variables import format_plain_text

    def format_value(value: object, spec: str) -> str:  # as book/_ext/recorded.py formats a value
        return format_plain_text(repr(value), spec)

    recorded = {"02_random_features": {"title": "record run of 2026-11-29, commit abc & <x>",
                                       "values": {"rf_gap": repr(13.24999), "rf_data": repr("digits (8x8)")},
                                       "facts": {"recorded": repr("2026-11-29"), "minutes": repr(341.6),
                                                 "threads": repr(1), "profile": repr("record")}}}
    source = ("Gap {recorded}`rf_gap:.1f` dB on {recorded}`rf_data`, recorded {recorded}`@recorded` in "
              "{recorded}`@minutes:.0f` min; {recorded}`02_random_features/rf_gap:.3f`; {recorded}`rf_none`")
    out = _node("const st = {values: {}, index: {}, recorded: input, chapter: null, pending: 0};"
                f"console.log(JSON.stringify([lab.mystToMarkdown({json.dumps(source)}, st), st.pending]));", recorded)
    mark = '<sup class="nnk-lab-recorded" title="record run of 2026-11-29, commit abc &amp; &lt;x&gt;">[record]</sup>'
    text = out[0].replace(mark, "[R]")
    want = (f"Gap {format_value(13.24999, '.1f')}[R] dB on digits (8x8)[R], recorded 2026-11-29[R] in "
            f"{format_value(341.6, '.0f')}[R] min; {format_value(13.24999, '.3f')}[R]; (not recorded)")
    assert [text, out[1]] == [want, 0]


# --- In a real JupyterLab ------------------------------------------------------------

def _demo_notebook(path: Path) -> None:
    """A small chapter: a folded glue cell, prose that quotes it, a folded figure with a caption."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [
        nbformat.v4.new_code_cell(
            "from nnk_book import Recorder\nrecord = Recorder()\n"
            "record('demo_error', 0.0123456)\nrecord('demo_activation', 'relu')",
            metadata={"tags": ["remove-cell"]}),
        nbformat.v4.new_markdown_cell(
            "(demo-section)=\n## A section\n\nThe error is {glue:text}`demo_error:.3f` with "
            "{glue:text}`demo_activation` {cite}`jacot2018ntk`; see {ref}`ntk-lazy` and "
            "{numref}`fig-ntk-lazy`. Recorded: {recorded}`02_random_features/rf_siren_psnr_gap:.1f` dB and "
            "{recorded}`rf_siren_psnr_gap:.2f` dB.\n\n```{note}\nIn a note: {glue:text}`demo_error:.1e`.\n```"),
        nbformat.v4.new_code_cell(
            "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()",
            metadata={"tags": ["hide-input"], "mystnb": {"figure": {
                "name": "fig-ntk-lazy", "caption": "A line of slope $-1/2$ in the demo."}}}),
    ]
    nbformat.write(lab_metadata.fold(nb), str(path))


def _expected(path: Path) -> dict[str, int]:
    """How many figure captions and collapsed inputs and outputs the notebook at ``path`` has."""
    cells = nbformat.read(str(path), as_version=4).cells
    return {
        "figures": sum(bool(c.metadata.get("mystnb", {}).get("figure", {}).get("caption")) for c in cells),
        "folded": sum(c.cell_type == "code" and c.metadata.get("jupyter", {}).get("source_hidden", False)
                      for c in cells),
        "outputs_folded": sum(c.cell_type == "code" and c.metadata.get("jupyter", {}).get("outputs_hidden", False)
                              for c in cells),
    }


def _check_notebook_reads(page, figures: int, folded: int, outputs_folded: int) -> list[str]:
    """What is wrong with the open notebook as a reader sees it (empty: nothing)."""
    wrong = []
    # (textContent: JupyterLab does not lay out cells out of view, whose innerText is empty)
    prose = "\n".join(page.locator(".jp-MarkdownCell .jp-RenderedMarkdown").all_text_contents())
    if len(prose) < 100:
        wrong.append(f"the prose is missing: {prose!r}")
    for raw in ("{glue:text}", "{recorded}", "{cite}", "{ref}", "{numref}", "{doc}", "```{", ":::{", ")=\n"):
        if raw in prose:
            wrong.append(f"the prose shows {raw!r}")
    pending = page.locator('.jp-RenderedMarkdown[data-nnk-pending]:not([data-nnk-pending="0"])')
    if pending.count():
        wrong.append(f"{pending.count()} cells still wait for glued values after Run All, "
                     f"e.g. {pending.first.text_content()[:200]!r}")
    captions = [" ".join(c.split()) for c in page.locator(".nnk-lab-caption").all_text_contents()]
    if len(captions) != figures or not all(re.match(r"Figure \d+\.\d+\. \S", c) for c in captions):
        wrong.append(f"expected {figures} figure captions, found {captions[:3]}")
    collapsed = page.locator(".jp-CodeCell .jp-InputPlaceholder").count()
    if collapsed != folded:
        wrong.append(f"expected {folded} collapsed code cells, found {collapsed}")
    collapsed = page.locator(".jp-CodeCell .jp-OutputPlaceholder").count()
    if collapsed != outputs_folded:
        wrong.append(f"expected {outputs_folded} collapsed outputs, found {collapsed}")
    return wrong


def _problems(log) -> list[str]:
    """The page's problems, less jupyter_server's race of listing a kernel that is still
    starting (GET /api/kernels answers 500, KeyError 'last_activity', on a busy machine)."""
    return [p for p in log.problems() if "/api/kernels?" not in p]


@pytest.fixture()
def lab_server(tmp_path):
    def start(root: Path, env: dict[str, str] | None = None):
        return jupyterlab(root, tmp_path / "lab-state", EXTENSION, env=env)
    return start


@needs_chromium
def test_demo_notebook_reads_as_in_the_book_after_run_all(tmp_path, lab_server) -> None:
    root = tmp_path / "notebooks"
    root.mkdir()
    _demo_notebook(root / "demo.ipynb")
    with lab_server(root) as url, browser_page(1280, 1000) as (page, log):
        page.goto(url.format(path="demo.ipynb"), timeout=120_000)
        page.wait_for_selector(".jp-MarkdownCell .jp-RenderedMarkdown", timeout=120_000)
        page.wait_for_timeout(1500)
        before = page.locator(".jp-MarkdownCell .jp-RenderedMarkdown").first.inner_text()
        assert "⟨demo_error⟩" in before and "{glue:text}" not in before
        run_all_cells(page)
        page.wait_for_timeout(1000)
        wait_until_idle(page, timeout_s=120)
        page.screenshot(path=str(tmp_path / "demo.png"))
        page.wait_for_function("() => !document.querySelector('.jp-RenderedMarkdown[data-nnk-pending]:not("
                               "[data-nnk-pending=\"0\"])')", timeout=10_000)
        prose = page.locator(".jp-MarkdownCell .jp-RenderedMarkdown").first.inner_text()
        assert "The error is 0.012 with relu [Jacot et al. 2018]" in prose, prose
        assert "Wide networks train like linear models and Figure 1.1." in prose, prose
        assert "In a note: 1.2e-02." in prose, prose
        from myst_nb.core.variables import format_plain_text

        gap = json.loads((EXTENSION / "nnk-lab" / "static" / "recorded.json").read_text()
                         )["02_random_features"]["values"]["rf_siren_psnr_gap"]
        assert (f"Recorded: {format_plain_text(gap, '.1f')}[record] dB and "
                f"{format_plain_text(gap, '.2f')}[record] dB.") in prose, prose
        assert "record run of" in (page.locator(".nnk-lab-recorded").first.get_attribute("title") or "")
        assert _expected(root / "demo.ipynb") == {"figures": 1, "folded": 2, "outputs_folded": 1}
        assert _check_notebook_reads(page, **_expected(root / "demo.ipynb")) == []
        assert page.locator(".nnk-lab-caption mjx-container, .nnk-lab-caption .MathJax").count() >= 1, \
            "the caption's math is not typeset"
        assert not _problems(log), _problems(log)


@needs_chromium
@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("NN_KERNELS_LAB_CHAPTERS") != "1",
                    reason="a whole chapter in JupyterLab takes 8-10 min: make test-lab runs it "
                           "(test_demo_* runs the same checks on a small notebook in make test)")
@pytest.mark.parametrize("name", ["01_ntk", "04_toeplitz"])
def test_chapter_reads_as_in_the_book_after_run_all(tmp_path, lab_server, name: str) -> None:
    """A chapter run in JupyterLab as a learner runs it (chapter 4 is the quickest).

    The notebook is opened where ``make lab`` opens it (autosave is off: nothing is written
    back), on one thread and an empty result store of its own. Several minutes each.
    """
    chapter = ROOT / "chapters" / f"{name}.ipynb"
    before = chapter.read_bytes()
    env = {"OMP_NUM_THREADS": "1", "NN_KERNELS_THREADS": "1", "NN_KERNELS_RESULTS": str(tmp_path / "results")}
    with lab_server(chapter.parent, env=env) as url, browser_page(1280, 1000) as (page, log):
        page.goto(url.format(path=chapter.name), timeout=120_000)
        page.wait_for_selector(".jp-MarkdownCell .jp-RenderedMarkdown", timeout=120_000)
        page.wait_for_timeout(2000)
        run_all_cells(page)
        page.wait_for_timeout(2000)
        wait_until_idle(page, timeout_s=1500, quiet_s=10)
        page.wait_for_timeout(2000)
        page.screenshot(path=str(tmp_path / "chapter.png"))
        page.locator(".nnk-lab-caption").first.scroll_into_view_if_needed()
        page.wait_for_timeout(1000)
        page.screenshot(path=str(tmp_path / "chapter-figure.png"))
        wrong = _check_notebook_reads(page, **_expected(chapter))
        assert not wrong, wrong
        assert not _problems(log), _problems(log)
    assert chapter.read_bytes() == before, "the test wrote into the chapter"


def test_make_lab_loads_the_extension_and_starts_as_root() -> None:
    """``make lab`` puts book/lab on the extension path, and passes --allow-root only as root."""
    import os

    proc = subprocess.run(["make", "-n", "lab", "VENV=.venv"], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    line = next(line for line in proc.stdout.splitlines() if "jupyter lab" in line)
    assert f"--LabApp.extra_labextensions_path={EXTENSION}" in line
    assert ("--allow-root" in line) == (os.geteuid() == 0)
