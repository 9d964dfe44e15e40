"""Conventions every chapter notebook keeps (see the book's guide page, 'Writing a chapter')."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import nbformat
import pytest
import yaml

import run_chapters

NOTEBOOKS = sorted(run_chapters.CHAPTERS.glob("*.ipynb"))
IDS = [p.stem for p in NOTEBOOKS]
INSTALL = re.compile(r"(^|[\s!%])(pip|pip3|conda|mamba)\s+install\b", re.M)
# Code that reaches the network on its own. Fetchers for full-size data live in
# data_scripts/ and must not be called by the default (ci) profile; the runner's
# offline guard is the dynamic check, this is the static one.
NETWORK_CALLS = re.compile(
    r"\b(urllib\.request|urlopen|requests\.(get|post)|http\.client|socket\.create_connection|"
    r"snapshot_download|hf_hub_download)\b")


def test_there_are_chapters() -> None:
    assert NOTEBOOKS, "chapters/ holds no notebook"


def _nb(path: Path):
    return nbformat.read(str(path), as_version=4)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_stored_without_outputs(path: Path) -> None:
    for i, cell in enumerate(_nb(path).cells):
        if cell.cell_type == "code":
            assert not cell.outputs, f"{path.name} cell {i} has outputs: clear them before commit"
            assert cell.execution_count is None, f"{path.name} cell {i} has an execution count"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_one_parameters_cell_of_literals(path: Path) -> None:
    cells = [c for c in _nb(path).cells if "parameters" in c.metadata.get("tags", [])]
    assert len(cells) == 1, f"{path.name}: {len(cells)} cells tagged 'parameters', expected 1"
    assert cells[0].cell_type == "code"
    tree = ast.parse(cells[0].source)
    names = []
    for stmt in tree.body:
        assert isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(
            stmt.targets[0], ast.Name), f"{path.name}: parameters cell must hold plain assignments"
        ast.literal_eval(stmt.value)  # raises for anything but a literal
        names.append(stmt.targets[0].id)
    assert names, f"{path.name}: parameters cell is empty"
    for profile in ("ci", "record", "paper"):
        injected = run_chapters.load_profile(profile)[path.stem]["parameters"]
        unknown = set(injected) - set(names)
        assert not unknown, f"book/profiles.yaml {profile}/{path.stem} sets unknown parameters {unknown}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
@pytest.mark.parametrize("profile", ["record", "paper"])
def test_parameters_cell_is_teaching_scale_and_larger_profiles_change_it(path: Path, profile: str) -> None:
    """Opened as it is, a chapter runs the teaching version; ``record`` and ``paper`` change it."""
    spec = run_chapters.load_profile(profile)[path.stem]
    assert spec["parameters"], f"book/profiles.yaml {profile}/{path.stem} holds no larger-scale values"
    assert spec["budget_s"] > run_chapters.load_profile("ci")[path.stem]["budget_s"]
    cell = next(c for c in _nb(path).cells if "parameters" in c.metadata.get("tags", []))
    values = {s.targets[0].id: ast.literal_eval(s.value) for s in ast.parse(cell.source).body}
    differs = [n for n, v in spec["parameters"].items() if values.get(n) != v]
    assert differs, f"{path.stem}: the {profile} profile repeats the parameters cell"


def test_profiles_are_the_three_scales() -> None:
    """Three scales: ci (teaching), record (about 90 min per chapter on two cores), paper; a
    record run fits its budget of 90 min; no other name reaches a profile."""
    import yaml

    data = yaml.safe_load(run_chapters.PROFILES.read_text())
    assert sorted(data) == ["ci", "paper", "record"]
    assert all(spec["budget_s"] <= 5400 for spec in run_chapters.load_profile("record").values())
    with pytest.raises(SystemExit, match="unknown profile"):
        run_chapters.load_profile("full")


def test_chapters_say_how_to_run_at_paper_scale() -> None:
    for path in NOTEBOOKS:
        text = "\n".join(c.source for c in _nb(path).cells[:4] if c.cell_type == "markdown")
        assert any(f"PROFILE={p}" in text or f"--profile {p}" in text for p in ("record", "paper")), (
            f"{path.name}: the opening cells must say how to run the paper-scale version")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_no_package_installs(path: Path) -> None:
    for i, cell in enumerate(_nb(path).cells):
        if cell.cell_type == "code":
            assert not INSTALL.search(cell.source), f"{path.name} cell {i} installs packages"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_no_network_calls_in_notebook(path: Path) -> None:
    for i, cell in enumerate(_nb(path).cells):
        if cell.cell_type == "code":
            m = NETWORK_CALLS.search(cell.source)
            assert not m, f"{path.name} cell {i} reaches the network ({m.group(0)})"


#: Control characters that no cell should hold: in Markdown they are almost always a
#: LaTeX command eaten by a string escape (``"\top"`` written as TAB + "op", ``"\rangle"`` as
#: CR + "angle"), which the book then renders as broken maths.
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_no_control_characters(path: Path) -> None:
    for i, cell in enumerate(_nb(path).cells):
        for line_no, line in enumerate(cell.source.split("\n"), 1):
            found = CONTROL.search(line)
            assert found is None, (
                f"{path.name} cell {i} ({cell.cell_type}) line {line_no} holds the control character "
                f"{found.group()!r}: {line[:80]!r} (a LaTeX command eaten by a string escape?)"
            )
        if cell.cell_type == "markdown":  # a lost backslash before "nabla" leaves "abla" at a line start
            assert not re.search(r"^(abla|angle)\b", cell.source, re.M), (
                f"{path.name} cell {i}: a line starts with 'abla'/'angle' (a '\\nabla' or '\\rangle' "
                "eaten by a string escape?)"
            )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_title_and_kernel(path: Path) -> None:
    nb = _nb(path)
    assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith("# "), (
        f"{path.name}: the first cell is the page title")
    assert nb.metadata.get("kernelspec", {}).get("name") == "python3"


def test_every_chapter_is_in_the_toc() -> None:
    toc = yaml.safe_load((run_chapters.ROOT / "_toc.yml").read_text())
    files = {c["file"] for part in toc["parts"] for c in part["chapters"]}
    for path in NOTEBOOKS:
        assert f"chapters/{path.stem}" in files, f"{path.name} is not in _toc.yml"


GLUED_IN_CODE = re.compile(r"""\brecord\(\s*f?(["'])(?P<name>[^"']+)\1""")
GLUED_IN_PROSE = re.compile(r"\{glue(?::\w+)?\}`(?P<name>[^`:]+)")
FULL_SCALE_NAME = re.compile(r"_full(_|\{|$)")
READS_A_RECORD = re.compile(r"\b(show_recorded_run|largest_recorded_run|recorded_run|current_record)\b"
                            r"|\b\w+\.(record|paper)\.json\b")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_numbers_flow_one_way(path: Path) -> None:
    """A chapter glues only what its own run computed: no name of the retired ``full`` scale
    (``*_full_*``, ``*_full``), and no value read back from a record in ``book/runs/``, which
    reaches the page through the ``{recorded}`` role instead."""
    cells = _nb(path).cells
    glued = {m["name"] for c in cells if c.cell_type == "code" for m in GLUED_IN_CODE.finditer(c.source)}
    glued |= {m["name"].strip() for c in cells if c.cell_type == "markdown" for m in GLUED_IN_PROSE.finditer(c.source)}
    assert glued, f"{path.name}: found no glued name (has the way chapters glue changed?)"
    full = sorted(name for name in glued if FULL_SCALE_NAME.search(name))
    assert not full, f"{path.name} glues names of the retired full scale: {full}"
    readers = [(c.get("id"), m.group(0)) for c in cells if c.cell_type == "code"
               for m in READS_A_RECORD.finditer(c.source)]
    assert not readers, (f"{path.name} reads a record of book/runs/ in a code cell {readers}: "
                         "show recorded values with the {recorded} role in the prose")
