"""One preamble and one experiment vocabulary for the chapters (:mod:`nnk_book.chapter`).

The preamble's thread rule and its quiet sweep progress are unit-tested here; the chapters are
read as source (their code cells) to check that each opens with :func:`nnk_book.setup` and that
no function is defined in two chapters, or again in a chapter when ``nnk_book`` defines it,
unless the allow-list below names why.
"""

from __future__ import annotations

import ast
import importlib
import io
import pickle
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import nbformat  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

import nnk_book  # noqa: E402
from nnk_book.chapter import (RUNNER_ENV, THREADS_ENV, Progress, chapter_threads, live_kernel,  # noqa: E402
                              runner_threads)

CHAPTERS = Path(__file__).resolve().parents[1] / "chapters"
NOTEBOOKS = sorted(CHAPTERS.glob("*.ipynb"))


# --- the thread rule -----------------------------------------------------------------

def _never(threads: int) -> int:
    raise AssertionError("the machine must not be measured here")


def test_threads_env_wins_and_is_never_measured() -> None:
    env = {THREADS_ENV: "1", "OMP_NUM_THREADS": "2"}
    assert chapter_threads(env, cores=2, idle=_never) == 1
    assert chapter_threads(env, cores=2, measure_idle=True, idle=_never) == 1
    assert chapter_threads({THREADS_ENV: "3"}, cores=2, idle=_never) == 3


def test_runner_omp_num_threads_is_respected() -> None:
    # run_chapters.py sets OMP_NUM_THREADS to its share of the cores: kept as it is, and
    # measured only where a chapter asks (chapter 6's small batches).
    assert chapter_threads({"OMP_NUM_THREADS": "2"}, cores=16, idle=_never) == 2
    assert chapter_threads({"OMP_NUM_THREADS": "2"}, cores=16, measure_idle=True, idle=lambda n: 1) == 1
    assert chapter_threads({"OMP_NUM_THREADS": "2"}, cores=16, measure_idle=True, idle=lambda n: n) == 2


def test_live_kernel_takes_one_thread_when_the_other_cores_are_busy() -> None:
    seen = []

    def busy(threads: int) -> int:
        seen.append(threads)
        return 1

    assert chapter_threads({}, cores=2, idle=busy) == 1 and seen == [2]
    assert chapter_threads({}, cores=4, idle=lambda n: n) == 4
    assert chapter_threads({"OMP_NUM_THREADS": " "}, cores=2, idle=lambda n: n) == 2, "blank means unset"


def test_live_kernel_rule_uses_the_measured_cores(monkeypatch) -> None:
    import psutil

    monkeypatch.setattr(psutil, "cpu_percent", lambda interval=None: 100.0)  # every core busy
    assert chapter_threads({}, cores=2) == 1
    monkeypatch.setattr(psutil, "cpu_percent", lambda interval=None: 0.0)
    assert chapter_threads({}, cores=2) == 2


@pytest.mark.parametrize("env", [{THREADS_ENV: "0"}, {THREADS_ENV: "two"}, {"OMP_NUM_THREADS": "-1"}])
def test_bad_thread_settings_are_named(env) -> None:
    with pytest.raises(ValueError, match=next(iter(env))):
        chapter_threads(env, cores=2, idle=_never)


def test_bad_cores_are_refused() -> None:
    for bad in (0, True, 1.5):
        with pytest.raises(ValueError, match="cores"):
            chapter_threads({}, cores=bad, idle=_never)


def test_live_kernel_is_false_under_the_runner_and_outside_ipython() -> None:
    assert live_kernel({RUNNER_ENV: "ci"}) is False
    assert live_kernel({}) is False  # pytest is no IPython kernel


def test_runner_threads_split_the_cores_unless_fixed() -> None:
    assert runner_threads(2, 1, {}) == 2 and runner_threads(2, 2, {}) == 1 and runner_threads(16, 3, {}) == 5
    assert runner_threads(2, 4, {}) == 1
    assert runner_threads(16, 1, {THREADS_ENV: "1"}) == 1
    for bad in (0, True):
        with pytest.raises(ValueError):
            runner_threads(bad, 1, {})


def test_the_runner_uses_the_shared_rule_and_marks_its_chapters_headless() -> None:
    import run_chapters

    assert run_chapters.runner_threads is runner_threads
    env = run_chapters.runner_env(2)
    assert env["OMP_NUM_THREADS"] == "2" and RUNNER_ENV in env
    assert live_kernel(env) is False
    assert chapter_threads(env, cores=8, idle=_never) == 2 or THREADS_ENV in env


# --- quiet progress ------------------------------------------------------------------

LINES = ["[e] 3 configurations: 1 stored, 2 to compute here (store: /s)",
         "[e] 2/3 done (1 computed, 1 stored, 1 left; last 0.1 s)",
         "[e] 3/3 done (2 computed, 1 stored, 0 left; last 0.1 s)"]


def test_headless_progress_is_one_line_per_update_on_the_stream() -> None:
    out = io.StringIO()
    p = Progress(live=False, stream=out)
    for line in LINES:
        p(line)
    p.end()
    assert out.getvalue() == "".join(line + "\n" for line in LINES)
    # what the runner's status line and hang detection read in its log
    assert re.findall(r"^\[e\] (\d+/\d+) done", out.getvalue(), re.M) == ["2/3", "3/3"]


def _screen(text: str) -> list[str]:
    """What a terminal or JupyterLab shows: a carriage return goes back to the line's start."""
    lines = []
    for raw in text.split("\n"):
        shown = ""
        for part in raw.split("\r"):
            shown = part + shown[len(part):]
        lines.append(shown)
    return lines


def test_live_progress_updates_one_line_and_ends_it() -> None:
    out = io.StringIO()
    p = Progress(live=True, stream=out)
    for line in LINES:
        p(line)
    text = out.getvalue()
    assert text.count("\n") == 1 and text.endswith("\n"), "a finished sweep leaves one line"
    assert _screen(text)[0].rstrip() == LINES[-1] and _screen(text)[1] == ""
    p.end()
    assert out.getvalue() == text, "ending twice adds nothing"


def test_live_progress_ends_a_sweep_with_nothing_to_compute_at_once() -> None:
    out = io.StringIO()
    Progress(live=True, stream=out)("[e] 4 configurations: 4 stored, 0 to compute here")
    assert out.getvalue() == "\r[e] 4 configurations: 4 stored, 0 to compute here\n"


def test_live_progress_of_an_interrupted_sweep_is_ended_by_end() -> None:
    out = io.StringIO()
    p = Progress(live=True, stream=out)
    p(LINES[0])
    p.end()
    assert out.getvalue().endswith("\n") and out.getvalue().count("\n") == 1


def test_progress_refuses_a_non_bool_live() -> None:
    with pytest.raises(TypeError, match="live"):
        Progress(live=1)


def _cube(config: dict) -> int:
    return config["x"] ** 3


def test_sweep_progress_goes_to_the_log_headless_and_to_one_stdout_line_live(tmp_path, capsys) -> None:
    # headless (the runner, pytest): a line per configuration on stderr, which the pages leave out
    got = nnk_book.sweep(_cube, [{"x": 2}, {"x": 3}], "cubes", store=tmp_path)
    assert got == [8, 27]
    out, err = capsys.readouterr()
    assert out == ""
    assert "[cubes] 2 configurations: 0 stored, 2 to compute here" in err and "[cubes] 2/2 done" in err
    assert len(err.strip().splitlines()) == 3
    assert nnk_book.sweep(_cube, [{"x": 2}], name="cubes", store=tmp_path, progress=None) == [8]
    assert capsys.readouterr() == ("", "")
    # live (a reader's kernel): stdout only, one line that ends once
    live = Progress(True)
    assert nnk_book.sweep(_cube, [{"x": 4}, {"x": 5}], "cubes", store=tmp_path, progress=live) == [64, 125]
    out, err = capsys.readouterr()
    assert err == "" and out.endswith("\n") and out.count("\n") == 1 and "\r" in out


def test_sweep_ends_the_live_line_when_fn_raises(tmp_path) -> None:
    out = io.StringIO()

    def fail(config):
        raise RuntimeError("stop")

    with pytest.raises(RuntimeError):
        nnk_book.sweep(fail, [{"x": 1}], "fails", store=tmp_path, progress=Progress(True, out))
    assert out.getvalue().endswith("\n")


# --- the preamble --------------------------------------------------------------------

def test_setup_gives_threads_seed_generator_record_and_sweep(monkeypatch) -> None:
    saved = torch.get_num_threads()
    monkeypatch.setenv(THREADS_ENV, "1")
    try:
        book = nnk_book.setup(3, glue=False)
        assert torch.get_num_threads() == 1 and book.threads == 1 and book.torch_line.endswith("1 thread")
        assert torch.equal(torch.randn(4), (torch.manual_seed(3), torch.randn(4))[1]), "global seed"
        assert torch.equal(torch.randn(5, generator=book.generator("a", 1)),
                           torch.randn(5, generator=nnk_book.generator(3, "a", 1)))
        assert pickle.loads(pickle.dumps(book.generator)).args == (3,), "a sweep's fn may read it on a worker"
        book.record("x", 2)
        assert book.record.results == {"x": 2}
        assert book.sweep is nnk_book.sweep
        assert nnk_book.setup(0, threads=2, style=False, glue=False).threads == 2
    finally:
        torch.set_num_threads(saved)


# --- the chapters --------------------------------------------------------------------

def _code(path: Path) -> list[tuple[str, str]]:
    """(cell id, source) of the code cells, IPython magics and shell lines blanked."""
    nb = nbformat.read(path, as_version=4)
    out = []
    for cell in nb.cells:
        if cell.cell_type == "code":
            src = "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in cell.source.splitlines())
            out.append((cell.get("id", "?"), src))
    return out


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_chapter_opens_with_the_one_preamble_call(path: Path) -> None:
    source = "\n".join(src for _, src in _code(path))
    calls = re.findall(r"\bnnk_book\.setup\(seed\b", source)
    assert len(calls) == 1, f"{path.stem} calls nnk_book.setup(seed, ...) once"
    for own in ("configure_torch(", "use_book_style(", "Recorder(", "functools.partial(nnk_book.generator",
                "partial(nnk_book.generator", "file=sys.stderr"):
        assert own not in source, f"{path.stem}: {own!r} belongs to nnk_book.setup"
    assert "progress=" not in source, f"{path.stem}: sweep progress is nnk_book's (quiet, on stdout)"


def definitions(path: Path) -> dict[str, list[str]]:
    """Function and class names a chapter defines -> the cells defining them, at any depth
    (inside functions, ``if`` and ``with`` blocks); a class's methods belong to the class."""
    found: dict[str, list[str]] = {}
    for cid, src in _code(path):
        try:
            tree = ast.parse(src)
        except SyntaxError:
            continue
        methods = {id(item) for node in ast.walk(tree) if isinstance(node, ast.ClassDef) for item in node.body}
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and id(node) not in methods:
                found.setdefault(node.name, []).append(cid)
    return found


def _nnk_book_names() -> set[str]:
    names = set(nnk_book.__all__)
    for module in ("chapter", "figures", "stats", "store", "training", "widgets"):
        mod = importlib.import_module(f"nnk_book.{module}")
        names |= set(getattr(mod, "__all__", ()))
    return names


#: Names defined in two or more chapters (or also in nnk_book) that stay, with the reason.
#: "differs": the definitions compute different things under one name; "numbers": a shared
#: version would change a chapter's teaching values (another order of operations or draws).
ALLOWED = {
    "accuracy": "differs: ch. 1 scores one-hot regression outputs, ch. 3 logits against labels, ch. 7 a model "
                "and head on a split",
    "cell": "differs: local helpers (a table cell's text) of unrelated tables",
    "classifier_run": "differs: ch. 2 an MLP on digits, ch. 4 a Toeplitz classifier on a sequence task",
    "encode": "differs: ch. 3 MiniLM sentence embeddings, ch. 6 and 7 tokenisation of their tasks",
    "evaluate": "differs: each chapter evaluates its own model kind (local closures in ch. 6)",
    "finetune": "numbers: ch. 6 and 7 fine-tune with their own criteria windows and checkpoint schedules; "
                "both already use nnk_book.train_loop and nnk_book.converged",
    "keep_input": "differs: local forward hooks of different modules",
    "last_fifth_change": "numbers: nnk_book's (ch. 1 and 5; ch. 1 at its logged steps, steps=) compares two "
                         "points; ch. 2 compares the means of the last two tenths and ch. 4 of the last two fifths, "
                         "whose teaching values would move under one formula",
    "lm_run": "differs: ch. 4 trains Toeplitz language models, ch. 5 LookupFFN ones (sweep functions)",
    "probe_loss": "differs: local loss probes of each chapter's fine-tuning",
    "rel_err": "differs: ch. 3 and 7 take the Frobenius norm, ch. 6 the largest entry",
    "train_classifier": "differs: ch. 2 an Adam MLP loop, ch. 4 a Toeplitz network loop",
    "train_lm": "differs: ch. 4 and 5 train different models with different schedules",
    "train_to_criterion": "numbers: ch. 1 continues a gradient-descent run to 2x and 4x its steps, logging on "
                          "its own grid; nnk_book's (ch. 3 and 4) restarts the run with twice the steps",
    "widget_alt": "differs: each widget's alternative text",
}
#: Method names every torch module or class defines.
INHERENT = {"__init__", "forward", "__enter__", "__exit__", "__call__", "extra_repr"}


def repeated_definitions() -> dict[str, list[str]]:
    """Name -> the chapters (and "nnk_book") defining it, for names defined twice or more."""
    where: dict[str, set[str]] = {}
    for path in NOTEBOOKS:
        for name in definitions(path):
            where.setdefault(name, set()).add(path.stem)
    shared = _nnk_book_names()
    out = {}
    for name, chapters in where.items():
        homes = sorted(chapters) + (["nnk_book"] if name in shared else [])
        if len(homes) > 1 and name not in INHERENT:
            out[name] = homes
    return out


def test_definitions_finds_top_level_and_nested_functions(tmp_path) -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("%matplotlib inline\ndef a():\n    def b():\n        pass\n"
                                          "class C:\n    def m(self):\n        pass\n", id="x1")]
    path = tmp_path / "nb.ipynb"
    nbformat.write(nb, path)
    assert definitions(path) == {"a": ["x1"], "b": ["x1"], "C": ["x1"]}


def test_no_function_is_defined_twice_across_the_chapters_or_again_beside_nnk_book() -> None:
    repeated = repeated_definitions()
    new = {name: homes for name, homes in repeated.items() if name not in ALLOWED}
    assert not new, ("defined in two or more chapters, or in a chapter and nnk_book: define it once in nnk_book "
                     f"and call it (or add it to ALLOWED with the reason): {new}")
    stale = sorted(set(ALLOWED) - set(repeated))
    assert not stale, f"ALLOWED names that are no longer repeated (remove them): {stale}"
    for name in ("sweep", "converged", "train_loop", "frozen_copy", "setup", "max_rel_err"):
        assert name not in repeated, f"{name} is nnk_book's and no chapter redefines it"


# --- shared measures -----------------------------------------------------------------

def test_last_fifth_change_at_logged_steps_and_at_even_points() -> None:
    # chapter 1: losses logged at steps, 0.8 T among them
    assert nnk_book.last_fifth_change([4.0, 2.0, 1.25, 1.0], steps=[0, 5, 8, 10]) == pytest.approx(0.25)
    # chapter 5: evenly spaced points, the point round(0.8 (n - 1))
    assert nnk_book.last_fifth_change([5.0, 4.0, 3.0, 2.0, 1.5, 1.0]) == pytest.approx(0.5)
    assert nnk_book.last_fifth_change([-4.0, -3.0, -2.0, -1.5, -1.0, -0.5]) == pytest.approx(1.0), "relative to |v(T)|"
    with pytest.raises(ValueError, match="round"):
        nnk_book.last_fifth_change([1.0, 2.0, 3.0], steps=[0, 1, 3])
    with pytest.raises(ValueError, match="one step per value"):
        nnk_book.last_fifth_change([1.0, 2.0], steps=[0, 1, 2])
    with pytest.raises(ValueError, match="two"):
        nnk_book.last_fifth_change([1.0])


def test_max_rel_err_keeps_the_operands_precision() -> None:
    import numpy as np

    want = torch.tensor([1.0, -4.0], dtype=torch.float64)
    assert nnk_book.max_rel_err(np.array([1.0, -3.0]), want) == 0.25
    got32, want32 = torch.tensor([1.0, 1.0 / 3.0]), torch.tensor([1.0, 0.3])
    assert nnk_book.max_rel_err(got32, want32) == float((got32 - want32).abs().max() / want32.abs().max())
    assert nnk_book.max_rel_err([0.0], torch.zeros(1, dtype=torch.float64)) == 0.0


def test_train_to_criterion_doubles_until_the_criterion_is_met() -> None:
    assert nnk_book.train_to_criterion(lambda s: s, 10, lambda r: r >= 40) == (40, 40, [10, 20, 40])
    assert nnk_book.train_to_criterion(lambda s: s, 10, lambda r: False) == (40, 40, [10, 20, 40]), "at most twice"
    assert nnk_book.train_to_criterion(lambda s: s, 10, lambda r: False, max_doublings=0) == (10, 10, [10])
    assert nnk_book.train_to_criterion(lambda s: s, 10, lambda r: True) == (10, 10, [10])
    for bad in ({"steps": 0}, {"max_doublings": -1}):
        kwargs = {"steps": 10, "max_doublings": 2, **bad}
        with pytest.raises(ValueError):
            nnk_book.train_to_criterion(lambda s: s, met=lambda r: True, **kwargs)


def _global_stores(tree: ast.AST) -> set[str]:
    """Names a cell binds in the notebook's namespace (outside functions, classes, lambdas and
    comprehensions, which have scopes of their own)."""
    names: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda, ast.ListComp,
                                  ast.SetComp, ast.DictComp, ast.GeneratorExp)):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    names.add(child.name)
                continue
            if isinstance(child, ast.Name) and isinstance(child.ctx, ast.Store):
                names.add(child.id)
            visit(child)

    visit(tree)
    return names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_chapter_rebinds_the_preambles_names(path: Path) -> None:
    # a later `sweep = {}` at the top level of a cell would replace nnk_book's sweep for every cell below
    for name in ("book", "generator", "record", "sweep"):
        cells = [cid for cid, src in _code(path) if name in _global_stores(ast.parse(src))]
        assert len(cells) <= 1, f"{path.stem}: {name} is bound in cells {cells}; only the preamble binds it"


def test_global_stores_see_blocks_but_not_function_scopes() -> None:
    tree = ast.parse("with a:\n    sweep = {}\ndef f():\n    record = 1\nx = [generator for generator in y]\n"
                     "for book in z:\n    pass\n")
    assert _global_stores(tree) == {"sweep", "f", "x", "book"}
