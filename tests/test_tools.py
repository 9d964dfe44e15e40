"""The project's tools explain themselves: make help, and --help on every script."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(
    p for folder in ("book/tools", "benchmarks", "data_scripts")
    for p in (ROOT / folder).glob("*.py") if 'if __name__ == "__main__"' in p.read_text())


def _tree_state() -> set[str]:
    """Every file under the repository (except .venv and caches), to catch side effects. The
    skipped folders are pruned from the walk, not filtered after it (.venv alone holds about
    100,000 files)."""
    skip = {".venv", ".git", "__pycache__", ".pytest_cache"}
    found = set()
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in skip]
        base = Path(folder).relative_to(ROOT)
        found.update(str(base / name) for name in files)
    return found


def test_there_are_scripts_to_check() -> None:
    names = {p.name for p in SCRIPTS}
    assert {"run_chapters.py", "build_book.py", "record_run.py", "bench_fusion.py"} <= names


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_script_answers_help_without_side_effects(script: Path, tmp_path: Path) -> None:
    before = _tree_state()
    env = dict(os.environ, NN_KERNELS_EXT_DIR=str(tmp_path / "ext"))
    # The benchmarks are a package: python -m benchmarks.bench_x from the repository root.
    command = ([sys.executable, "-m", f"benchmarks.{script.stem}"] if script.parent.name == "benchmarks"
               else [sys.executable, str(script)])
    proc = subprocess.run([*command, "--help"], capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "usage" in proc.stdout.lower(), proc.stdout[:500]
    assert _tree_state() == before, "--help created or removed files"
    assert not (tmp_path / "ext").exists(), "--help started a build"


def test_setup_env_and_extension_answer_help(tmp_path: Path) -> None:
    proc = subprocess.run(["bash", str(ROOT / "book/tools/setup_env.sh"), "--help"],
                          capture_output=True, text=True, timeout=30, env=dict(os.environ, VENV=str(tmp_path / "v")))
    assert proc.returncode == 0 and "--relock" in proc.stdout
    assert not (tmp_path / "v").exists(), "--help created a virtual environment"
    env = dict(os.environ, NN_KERNELS_EXT_DIR=str(tmp_path / "ext"))
    proc = subprocess.run([sys.executable, "-m", "kernels._ext", "--help"], capture_output=True,
                          text=True, timeout=60, env=env)
    assert proc.returncode == 0 and "usage" in proc.stdout
    assert not (tmp_path / "ext").exists(), "--help started a build"


def test_no_code_edits_sys_path() -> None:
    """Nothing edits ``sys.path``: the packages are installed (``kernels``, ``data_scripts``,
    ``nnk_book``), the benchmarks run as modules of the ``benchmarks`` package, a script in
    ``book/tools`` finds its neighbours as every script does (its folder is ``sys.path[0]``), and
    the tests find them through pytest's ``pythonpath`` (pyproject.toml). A child process that
    needs one of them gets ``cwd`` or ``PYTHONPATH``."""
    edit = re.compile(r"sys\.path\s*(\.\w+\(|\[|\+?=)")  # sys.path.insert(, sys.path[0] =, sys.path +=
    assert edit.search("sys.path.insert(0, here)") and not edit.search("none edits ``sys.path``")
    this = Path(__file__).resolve()
    files = [p for d in ("kernels", "data_scripts", "book", "benchmarks", "tests")
             for p in sorted((ROOT / d).rglob("*.py")) if p.resolve() != this]
    assert len(files) > 60 and any(p.parent.name == "benchmarks" for p in files)
    edits = [str(p.relative_to(ROOT)) for p in files if edit.search(p.read_text())]
    assert not edits, f"these files edit sys.path: {edits}"


def test_make_bench_runs_the_benchmarks_as_modules() -> None:
    makefile = (ROOT / "Makefile").read_text()
    bench = makefile.split("\nbench:", 1)[1].split("\n\n", 1)[0]
    assert "-m benchmarks.$$" in bench and "$(PY) $$f" not in bench, bench


def test_make_help_lists_every_target() -> None:
    proc = subprocess.run(["make", "-s", "help"], capture_output=True, text=True, cwd=ROOT, timeout=30)
    assert proc.returncode == 0
    makefile = (ROOT / "Makefile").read_text()
    phony = next(line for line in makefile.splitlines() if line.startswith(".PHONY:"))
    targets = phony.split(":", 1)[1].split()
    for target in targets:
        if target != "help":
            assert f"make {target}" in proc.stdout, f"make help does not list {target}"


def test_lab_kernel_imports_this_project() -> None:
    """make lab starts JupyterLab from .venv: its python3 kernel must import kernels and nnk_book."""
    jupyter = Path(sys.executable).with_name("jupyter")
    assert jupyter.exists() and Path(sys.executable).with_name("jupyter-lab").exists(), "jupyterlab missing"
    specs = json.loads(subprocess.run([str(jupyter), "kernelspec", "list", "--json"], capture_output=True,
                                      text=True, check=True).stdout)["kernelspecs"]
    argv = specs["python3"]["spec"]["argv"]
    python = sys.executable if argv[0] in ("python", "python3") else argv[0]
    proc = subprocess.run([python, "-c", "import kernels, nnk_book, data_scripts; print(kernels.__file__)"],
                          capture_output=True, text=True, cwd=ROOT / "chapters", timeout=120)
    assert proc.returncode == 0, proc.stderr[-1000:]
    assert proc.stdout.strip().startswith(str(ROOT / "kernels"))


def test_benchmark_harness_reports_spread_and_machine() -> None:
    from benchmarks import _harness

    stats = _harness.summarize([1.0, 2.0, 3.0, 4.0, 100.0])
    assert stats["median_s"] == 3.0 and stats["min_s"] == 1.0
    assert stats["q1_s"] == 2.0 and stats["q3_s"] == 4.0 and stats["iqr_s"] == 2.0
    with pytest.raises(ValueError):
        _harness.summarize([])
    timed = _harness.time_interleaved({"a": lambda: None, "b": lambda: None}, 5)
    assert set(timed["a"]) >= {"first_s", "median_s", "min_s", "q1_s", "q3_s", "iqr_s"}
    machine = _harness.machine_info()
    assert {"cpu", "torch_threads", "native_libraries", "load_average_1min", "torch", "date"} <= set(machine)
    row = {"case": "c", "shape": "s", "ours": "o", "ours_s": 0.002, "ours_iqr_s": 0.0001,
           "ref": "r", "ref_s": 0.004, "ref_iqr_s": 0.0002, "speedup": 2.0}
    table = _harness.markdown_table([row], memory=False)
    assert "2.0 ms (IQR 0.1 ms)" in table and "4.0 ms (IQR 0.2 ms)" in table


def test_module_bytes_counts_parameters_and_optionally_buffers() -> None:
    import torch
    from torch import nn

    from benchmarks import _harness

    module = nn.BatchNorm1d(10)  # 2 x 10 float32 parameters; buffers: 2 x 10 float32 + one int64
    assert _harness.module_bytes(module, buffers=False) == 2 * 10 * 4
    assert _harness.module_bytes(module) == 4 * 10 * 4 + 8
    assert _harness.module_bytes(nn.Linear(3, 2).to(torch.float64)) == (6 + 2) * 8


def test_peak_memory_workers_collects_figures_and_survives_a_failed_worker(tmp_path) -> None:
    from benchmarks import _harness

    script = tmp_path / "worker.py"
    script.write_text(textwrap.dedent('''
        import json, sys
        if sys.argv[1] == "fail":
            sys.exit("this worker fails")
        print("progress")
        print(json.dumps({"peak_mb": float(sys.argv[1])}))
    '''))
    got = _harness.peak_memory_workers(script, {"a": ["2.5"], "b": ["fail"], "c": ["0"]})
    assert got == {"a": 2.5, "b": None, "c": 0.0}


@pytest.mark.parametrize("d,hidden,lead", [(8, 32, (5,)), (384, 1536, (4, 24)), (17, 3, (70,))])
def test_onednn_dense_ffn_anchor_matches_torch_ffn(d, hidden, lead) -> None:
    """The oneDNN anchor of the FFN benchmarks computes the same FFN as torch (exact GELU),
    on 2-D and 3-D inputs, and declines (None) rather than time a different function."""
    import torch
    from torch import nn

    from benchmarks import _harness

    torch.manual_seed(d)
    ffn = nn.Sequential(nn.Linear(d, hidden), nn.GELU(), nn.Linear(hidden, d))
    x = torch.randn(*lead, d)
    anchor = _harness.onednn_dense_ffn(ffn[0].weight, ffn[0].bias, ffn[2].weight, ffn[2].bias, x)
    if anchor is None:
        assert not hasattr(torch.ops.mkldnn, "_linear_pointwise") or not torch.backends.mkldnn.is_available()
        pytest.skip("torch.ops.mkldnn._linear_pointwise is not available in this torch")
    with torch.no_grad():
        want, got = ffn(x), anchor()
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    # weights of the wrong layout or a function that differs: no anchor, not a wrong one
    assert _harness.onednn_dense_ffn(ffn[0].weight.t(), ffn[0].bias, ffn[2].weight, ffn[2].bias, x) is None \
        or d == hidden
    assert _harness.onednn_dense_ffn(ffn[0].weight, ffn[0].bias, ffn[2].weight, ffn[2].bias, x[..., :-1]) is None


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs sched_setaffinity and at least 2 CPUs")
def test_limit_cpus_pins_existing_and_new_threads_and_children() -> None:
    """In a child process (the test process stays unpinned): a thread started before the call
    and one started after it, and a grandchild process, all end up on one CPU."""
    code = textwrap.dedent('''
        import json, os, subprocess, sys, threading
        from benchmarks import _harness
        ready, done, seen = threading.Event(), threading.Event(), {}
        def early():
            ready.set(); done.wait(); seen["early"] = sorted(os.sched_getaffinity(0))
        t = threading.Thread(target=early); t.start(); ready.wait()
        note = _harness.limit_cpus(1)
        done.set(); t.join()
        late = threading.Thread(target=lambda: seen.__setitem__("late", sorted(os.sched_getaffinity(0))))
        late.start(); late.join()
        child = subprocess.run([sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
                               capture_output=True, text=True).stdout.strip()
        print(json.dumps({"note": note, "main": sorted(os.sched_getaffinity(0)), "child": child, **seen}))
    ''')
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-1000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(got["main"]) == 1 and got["early"] == got["late"] == got["main"]
    assert got["child"] == str(got["main"]) and "pinned to CPU" in got["note"]
    from benchmarks import _harness

    with pytest.raises(ValueError, match="threads"):
        _harness.limit_cpus(0)
    assert _harness.limit_cpus(len(os.sched_getaffinity(0))).startswith("all ")  # nothing to restrict


def test_adapter_epoch_sweep_settles_where_the_verdict_stops_changing() -> None:
    from record_adapter_epochs import by_epoch, settled_length

    assert settled_length(["tied"] * 10 + ["ahead"] * 30) == 11
    assert settled_length(["ahead"] * 5) == 1
    assert settled_length(["tied"] * 30 + ["ahead"] * 10) == 31
    assert settled_length(["tied", "ahead"] * 10) == 20
    assert settled_length(["ahead", "tied", "ahead", "ahead"]) == 3
    with pytest.raises(ValueError, match="verdicts"):
        settled_length([])
    # per epoch: verdict of the SNNK adapter against the bottleneck by the 95% intervals over 3 seeds
    curves = {"snnk": [[0.5, 0.80, 0.90], [0.6, 0.81, 0.91], [0.4, 0.79, 0.92]],
              "bottleneck": [[0.5, 0.80, 0.70], [0.4, 0.90, 0.71], [0.6, 0.70, 0.72]],
              "probe": [[0.5, 0.5, 0.5]] * 3}
    rows = by_epoch(curves)
    assert [r["verdict"] for r in rows] == ["tied", "tied", "ahead"]
    assert [r["epochs"] for r in rows] == [1, 2, 3]
    assert abs(rows[2]["snnk"][0] - 0.91) < 1e-12 and abs(rows[2]["bottleneck"][0] - 0.71) < 1e-12


def test_lm_length_sweep_checks_its_lengths_and_records_what_the_chapter_compares() -> None:
    import nbformat
    import record_lm_lengths as tool

    assert tool.check_lengths([1200, 2400]) == [1200, 2400]
    for bad in ([1200], [2400, 1200], [0, 600], [600, 600]):
        with pytest.raises(ValueError, match="--steps"):
            tool.check_lengths(bad)
    with pytest.raises(SystemExit, match="--steps"):
        tool.main(["--steps", "1200"])
    # every recorded parameter exists in the chapter's parameters cell, and the chapter checks the
    # same keys before it uses the record
    params = tool.chapter_parameters(tool.CHAPTER)
    assert set(tool.LM_KEYS) <= set(params)
    nb = nbformat.read(str(ROOT / "chapters" / f"{tool.CHAPTER}.ipynb"), as_version=4)
    source = next(c.source for c in nb.cells if "LM_RECORD_KEYS = " in c.source)
    assert f"LM_RECORD_KEYS = {tool.LM_KEYS!r}".replace("'", '"') in " ".join(source.split())


def test_lm_length_sweep_keep_extends_only_a_record_of_the_same_settings(tmp_path) -> None:
    import record_lm_lengths as tool

    assert tool.check_new_lengths([9600], [1200, 2400, 4800]) == [9600]
    for bad in ([4800], [2400, 9600], [9600, 9600], [], [0]):
        with pytest.raises(ValueError, match="--steps"):
            tool.check_new_lengths(bad, [1200, 2400, 4800])
    params = {k: i for i, k in enumerate(tool.LM_KEYS)}
    length = {"steps": 1200, "a": {"valids": [1.0], "changes": [0.0]}}
    rec = {"parameters": dict(params), "pair": ["a", "b"], "lengths": [length], "lr_sweep": {"dense": {}},
           "commit": "abc1234", "recorded": "2026-01-01", "seconds": 10.0}
    path = tmp_path / "rec.json"
    with pytest.raises(ValueError, match="no record"):
        tool.kept_record(path, params)
    path.write_text(json.dumps({**rec, "parameters": {**params, "lm_steps": -1}}))
    with pytest.raises(ValueError, match="lm_steps"):
        tool.kept_record(path, params)
    path.write_text(json.dumps({**rec, "lengths": []}))
    with pytest.raises(ValueError, match="no lengths"):
        tool.kept_record(path, params)
    path.write_text(json.dumps(rec))
    kept = tool.kept_record(path, params)
    new = {"pair": ["a", "b"], "lengths": [{**length, "steps": 9600}], "lr_sweep": {}}
    merged = tool.merge_kept(kept, new)
    assert [L["steps"] for L in merged["lengths"]] == [1200, 9600]
    assert merged["lr_sweep"] == {"dense": {}}  # the record's sweep, not this run's empty one
    assert merged["kept"] == [{"steps": [1200], "commit": "abc1234", "recorded": "2026-01-01", "seconds": 10.0}]
    assert [k["commit"] for k in tool.merge_kept({**kept, "kept": merged["kept"], "commit": "def5678"}, new)["kept"]] \
        == ["abc1234", "def5678"]
    with pytest.raises(ValueError, match="compares"):
        tool.merge_kept(kept, {**new, "pair": ["a", "c"]})


def test_lr_sweep_records_what_chapter_4_reads() -> None:
    # the tool records every setting the chapter compares before it uses the record, and the committed record
    # holds one run per candidate rate x mixer x task x seed, each with what the chapter's rule reads
    import ast

    import nbformat
    import record_lr_sweep as tool

    params = tool.chapter_parameters(tool.CHAPTER)
    assert set(tool.SETTINGS) <= set(params)
    nb = nbformat.read(str(ROOT / "chapters" / f"{tool.CHAPTER}.ipynb"), as_version=4)
    source = next(c.source for c in nb.cells if "LR_SETTINGS = (" in c.source)
    tree = ast.parse(source)
    chapter_keys = next(ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
                        and getattr(node.targets[0], "id", "") == "LR_SETTINGS")
    assert set(chapter_keys) <= set(tool.SETTINGS)
    if not tool.OUT.exists():
        pytest.skip(f"{tool.OUT} not recorded")
    rec = json.loads(tool.OUT.read_text())
    assert {"recorded", "commit", "seconds", "machine", "parameters", "runs"} <= set(rec)
    seeds = range(rec["parameters"]["train_seeds"])
    want = {(task, kind, lr, s) for task in ("listops", "brackets") for kind in ("tno", "ski", "fd")
            for lr in rec["parameters"]["lr_candidates"] for s in seeds}
    want |= {("lm", kind, lr, s) for kind in ("tno", "fd") for lr in rec["parameters"]["lm_lr_candidates"] for s in seeds}
    got = [(r["task"], r["kind"], r["lr"], r["seed"]) for r in rec["runs"]]
    assert sorted(got) == sorted(want)
    for r in rec["runs"]:
        assert 0.0 <= r["change"] and r["steps"] > 0 and math.isfinite(r["val_loss"])
        assert 0.0 <= r["accuracy"] <= 1.0 if r["task"] != "lm" else r["bpc"] > 0


def test_siren_study_varies_one_factor_and_reads_shorter_runs_off_the_loss_curve() -> None:
    import math

    import nbformat
    import record_siren_study as tool
    from nnk_book.stats import mean_interval

    # one factor at a time from the teaching (24, 48): the base once, m = width / 4
    configs = tool.configurations([24, 64], [24, 48], 24, 48)
    assert [(c["width"], c["size"], c["m"]) for c in configs] == [(24, 48, 6), (64, 48, 16), (24, 24, 6)]
    for bad in ([], [2], [24.0]):
        with pytest.raises(ValueError, match="widths"):
            tool.configurations(bad, [48], 24, 48)
    assert tool.check_steps([600, 1200]) == [600, 1200]
    for bad in ([], [1200, 600], [5, 600], [600, 600]):
        with pytest.raises(ValueError, match="--steps"):
            tool.check_steps(bad)
    # losses[t] is the MSE before update t + 1: the network after s updates has loss losses[s]
    losses = [4.0 * 10 ** (-t / 10) for t in range(100)]  # PSNR 10 log10(4 / loss) = t dB
    assert abs(tool.psnr_after(losses, 40, final_psnr=99.0) - 40.0) < 1e-9
    assert tool.psnr_after(losses, 100, final_psnr=99.0) == 99.0
    with pytest.raises(ValueError, match="steps"):
        tool.psnr_after(losses, 101, final_psnr=99.0)
    # the chapter's criterion: dB gained over the last fifth (mean of last tenth vs the tenth before)
    assert abs(tool.gain_last_fifth(losses) - 10 * math.log10(
        sum(losses[80:90]) / sum(losses[90:]))) < 1e-12
    flat = [1.0] * 100
    assert tool.gain_last_fifth(flat) == 0.0
    # summary: paired gap per step count (independent reference: mean_interval of the differences)
    runs = {"SIREN": [{"losses": [4.0 * 10 ** (-(20 + r) / 10)] * 100, "psnr": 30.0 + r} for r in range(3)],
            "SNNK-SIREN, m = 6": [{"losses": [4.0 * 10 ** (-(10 + 2 * r) / 10)] * 100, "psnr": 25.0} for r in range(3)]}
    rows = tool.summarise(runs, [50, 100], criterion_db=0.5)
    assert [r["steps"] for r in rows] == [50, 100]
    want = mean_interval([(20 + r) - (10 + 2 * r) for r in range(3)])
    assert abs(rows[0]["gap"][0] - want[0]) < 1e-9 and abs(rows[0]["gap"][1] - want[1]) < 1e-9
    assert rows[0]["verdict"] == "ahead" and rows[0]["converged"]
    assert abs(rows[1]["gap"][0] - 6.0) < 1e-9  # final PSNRs 30, 31, 32 against 25
    # the cells the study executes exist in the chapter, and the chapter checks the recorded settings
    nb = nbformat.read(str(ROOT / "chapters" / f"{tool.CHAPTER}.ipynb"), as_version=4)
    ids = {c.get("id") for c in nb.cells if c.cell_type == "code"}
    assert set(tool.CELLS) <= ids
    assert set(tool.SIREN_KEYS) <= set(tool.chapter_parameters(tool.CHAPTER))
    with pytest.raises(SystemExit, match="--steps"):
        tool.main(["--steps", "1200", "600"])


def test_fusion_ntk_study_ranks_fusion_under_every_measure() -> None:
    import record_fusion_ntk_study as tool
    from nnk_book.stats import mean_interval

    base = {"intermediate": 384, "n_eval": 16}
    configs = tool.configurations([192, 384], [16, 48], ["ffn", "all_ffns"], base)
    assert configs == [{"k": 384, "n": 16, "scope": "ffn"}, {"k": 192, "n": 16, "scope": "ffn"},
                       {"k": 384, "n": 48, "scope": "ffn"}, {"k": 384, "n": 16, "scope": "all_ffns"}]
    with pytest.raises(ValueError, match="scopes"):
        tool.configurations([384], [16], ["whole model"], base)
    with pytest.raises(ValueError, match="ks"):
        tool.configurations([1], [16], ["ffn"], base)
    assert tool.rank_of({"fusion": 0.5, "a": 0.1, "b": 0.9, "c": 0.4}) == 3
    assert tool.rank_of({"fusion": 0.1, "a": 0.1}) == 1  # a tie shares the better rank
    with pytest.raises(ValueError, match="fusion"):
        tool.rank_of({"a": 1.0})
    # synthetic runs: fusion lowest with separated intervals on sign_rel, second on output
    def runs_for(level, out):
        return [{**{m: level + 0.01 * i for m in tool.MEASURES}, "output": out + i} for i in range(3)]
    runs = {"fusion": runs_for(0.1, 5.0), "svd": runs_for(0.5, 2.0), "random": runs_for(0.9, 9.0)}
    s = tool.summarise(runs)
    assert s["sign_rel"]["fusion_rank"] == 1 and s["sign_rel"]["fusion_lowest"] and s["sign_rel"]["best"] == "fusion"
    assert s["output"]["fusion_rank"] == 2 and not s["output"]["fusion_lowest"] and s["output"]["best"] == "svd"
    assert s["sgd_rel"]["mean_hw"]["svd"] == list(mean_interval([0.5, 0.51, 0.52]))
    assert set(s) == set(tool.MEASURES)
    assert set(tool.KEYS) <= set(tool.chapter_parameters(tool.CHAPTER))
    with pytest.raises(SystemExit, match="scopes"):
        tool.main(["--scopes", "everything"])
