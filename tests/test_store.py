"""The per-configuration result store (nnk_book.store) and the Dask route (nnk_book.cluster).

Three things are shown here end to end: a chapter killed midway resumes and skips what it
had stored, with the same glued values as a run that was never stopped; two chapters and
one experiment's configurations run on a 2-worker ``LocalCluster`` give the same glued
values as the local run; a worker killed mid-task does not lose its configuration. The first
two are shown on toy chapters and again on chapter 1 at small settings (marked ``slow``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import run_chapters
from nnk_book.results import read_glued
from nbfactory import write_notebook
from nnk_book import store as st

ROOT = Path(__file__).resolve().parents[1]


# --- the store, in process --------------------------------------------------------------

def _square(config):
    return config["x"] ** 2


def test_sweep_stores_each_result_and_reuses_it(tmp_path) -> None:
    calls: list[int] = []

    def fn(config):
        calls.append(config["x"])
        return config["x"] ** 2

    lines: list[str] = []
    configs = [{"x": x} for x in (3, 1, 2, 1)]  # one configuration listed twice runs once
    first = st.sweep(fn, configs, name="sq", store=tmp_path, progress=lines.append)
    assert first == [9, 1, 4, 1] and sorted(calls) == [1, 2, 3]
    assert "4 configurations: 0 stored, 3 to compute here" in lines[0]
    assert lines[-1].startswith("[sq] 3/4 done (3 computed, 0 stored, 0 left")
    again = st.sweep(fn, configs + [{"x": 5}], name="sq", store=tmp_path, progress=lines.append)
    assert again == [9, 1, 4, 1, 25] and sorted(calls) == [1, 2, 3, 5]
    assert "5 configurations: 4 stored, 1 to compute" in lines[-2]
    assert st.ResultStore(tmp_path).count("sq") == 4


def test_keys_follow_the_configuration_and_the_code(tmp_path) -> None:
    store = st.ResultStore(tmp_path)
    code = st.code_digest(_square)
    assert store.key("a", {"x": 1, "y": 2}, code) == store.key("a", {"y": 2, "x": 1}, code)
    assert store.key("a", {"x": 1}, code) != store.key("a", {"x": 2}, code)
    assert store.key("a", {"x": 1}, code) != store.key("b", {"x": 1}, code)
    assert st.code_digest(_square) != st.code_digest(_square, depends=["v2"])

    def other(config):
        return config["x"] ** 3

    assert st.code_digest(other) != code
    # A new function under the same experiment name never reads the old results.
    assert st.sweep(_square, [{"x": 2}], name="e", store=tmp_path, progress=None) == [4]
    assert st.sweep(other, [{"x": 2}], name="e", store=tmp_path, progress=None) == [8]


def test_a_damaged_entry_is_recomputed(tmp_path) -> None:
    st.sweep(_square, [{"x": 4}], name="d", store=tmp_path, progress=None)
    (entry,) = (tmp_path / "d").glob("*.pkl")
    entry.write_bytes(entry.read_bytes()[:10])  # as if cut off (atomic writes never leave this)
    assert st.sweep(_square, [{"x": 4}], name="d", store=tmp_path, progress=None) == [16]
    assert st.ResultStore(tmp_path).get("d", entry.stem) == (True, 16)


def test_an_interrupted_sweep_keeps_what_it_stored(tmp_path) -> None:
    def fn(config):
        if config["x"] == 2:
            raise KeyboardInterrupt
        return config["x"]

    with pytest.raises(KeyboardInterrupt):
        st.sweep(fn, [{"x": 0}, {"x": 1}, {"x": 2}, {"x": 3}], name="i", store=tmp_path, progress=None)
    assert st.ResultStore(tmp_path).count("i") == 2
    assert not list((tmp_path / "i").glob(".*.tmp"))


@pytest.mark.parametrize("config, word", [
    ({"x": float("nan")}, "finite"), ({"x": {1, 2}}, "set"), ({1: 2}, "key"),
    ({"x": object()}, "object"),
])
def test_configurations_json_cannot_hold_exactly_are_refused(config, word) -> None:
    with pytest.raises(TypeError, match="config") as err:
        st.canonical_config(config)
    assert word in str(err.value)


@pytest.mark.parametrize("name", ["", "../up", ".hidden", "a/b", 3])
def test_bad_names_are_refused(tmp_path, name) -> None:
    with pytest.raises(ValueError, match="name"):
        st.sweep(_square, [{"x": 1}], name=name, store=tmp_path, progress=None)


def test_sweep_refuses_a_function_that_is_not_callable(tmp_path) -> None:
    with pytest.raises(TypeError, match="fn"):
        st.sweep(3, [{"x": 1}], name="n", store=tmp_path)


def test_clean_is_one_command(tmp_path) -> None:
    st.sweep(_square, [{"x": 1}], name="one", store=tmp_path, progress=None)
    st.sweep(_square, [{"x": 1}], name="two", store=tmp_path, progress=None)
    env = {**os.environ, st.STORE_ENV: str(tmp_path)}
    listed = subprocess.run([sys.executable, "-m", "nnk_book.store", "list"], env=env,
                            capture_output=True, text=True, check=True).stdout
    assert "one: 1 results" in listed and "two: 1 results" in listed
    subprocess.run([sys.executable, "-m", "nnk_book.store", "clean", "one"], env=env, check=True,
                   capture_output=True)
    assert st.ResultStore(tmp_path).names() == ["two"]
    subprocess.run([sys.executable, "-m", "nnk_book.store", "clean"], env=env, check=True,
                   capture_output=True)
    assert st.ResultStore(tmp_path).names() == []


def test_default_location_follows_the_environment(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv(st.STORE_ENV, str(tmp_path / "s"))
    assert st.default_location() == tmp_path / "s"
    monkeypatch.delenv(st.STORE_ENV)
    assert st.default_location() == ROOT / "_build" / "results"


# --- a chapter killed midway resumes ------------------------------------------------------

TOY = """\
import time
import torch
from myst_nb import glue
from nnk_book.store import sweep

def train(config):
    g = torch.Generator().manual_seed(config["seed"])
    time.sleep(config["delay"])
    return float(torch.randn(1000, generator=g, dtype=torch.float64).sum())

values = sweep(train, [{"seed": s, "delay": delay} for s in range(n_configs)], name=name)
glue("total", sum(values), display=False)
glue("first", values[0], display=False)
"""


def _toy_chapters(folder: Path, names: list[str]) -> Path:
    for name in names:
        params = ("code", f"n_configs = 6\ndelay = 0.0\nname = {name!r}", ["parameters"])
        write_notebook(folder / f"{name}.ipynb", [("md", f"# {name}"), params, ("code", TOY)])
    return folder


@pytest.fixture()
def toy_project(tmp_path, monkeypatch) -> Path:
    chapters = _toy_chapters(tmp_path / "chapters", ["toya", "toyb"])
    profiles = tmp_path / "profiles.yaml"
    profiles.write_text("ci:\n  toya: {budget_s: 300}\n  toyb: {budget_s: 300}\n")
    monkeypatch.setattr(run_chapters, "CHAPTERS", chapters)
    monkeypatch.setattr(run_chapters, "PROFILES", profiles)
    monkeypatch.setenv("NN_KERNELS_THREADS", "1")
    return tmp_path


def test_a_killed_chapter_resumes_from_its_stored_configurations(toy_project) -> None:
    # The uninterrupted reference, in a store of its own.
    os.environ[st.STORE_ENV] = str(toy_project / "ref-store")
    try:
        ref, = run_chapters.run(["toya"], "ci", out=toy_project / "ref", progress=None, use_cache=False)
    finally:
        del os.environ[st.STORE_ENV]
    assert ref.status == "ok", ref.message
    expected = read_glued(ref.output)

    # The same chapter with a second per configuration, started as a reader would and
    # stopped with Ctrl-C once two configurations are stored.
    store = toy_project / "store"
    env = {**os.environ, st.STORE_ENV: str(store), "NN_KERNELS_THREADS": "1"}
    cmd = [sys.executable, str(ROOT / "book" / "tools" / "run_chapters.py"), "--set", "delay=1.0",
           "--no-cache", "--out", str(toy_project / "run"),
           "--chapters-dir", str(toy_project / "chapters"),
           "--profiles", str(toy_project / "profiles.yaml"), "toya"]
    proc = subprocess.Popen(cmd, env=env, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 240
    while st.ResultStore(store).count("toya") < 2:
        assert proc.poll() is None, proc.stdout.read()
        assert time.monotonic() < deadline, "no configuration was stored within 240 s"
        time.sleep(0.2)
    os.kill(proc.pid, signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, out
    kept = st.ResultStore(store).count("toya")
    assert 2 <= kept < 6, out

    # The rerun skips the stored configurations and glues what the uninterrupted run glued.
    os.environ[st.STORE_ENV] = str(store)
    try:
        again, = run_chapters.run(["toya"], "ci", out=toy_project / "run", progress=None,
                                  use_cache=False, overrides={"delay": 1.0})
    finally:
        del os.environ[st.STORE_ENV]
    assert again.status == "ok", again.message
    log = (toy_project / "run" / "ci" / "toya.log").read_text()
    assert f"[toya] 6 configurations: {kept} stored, {6 - kept} to compute" in log
    assert run_chapters._sweep_status(toy_project / "run" / "ci" / "toya.log").startswith("[toya] 6/6 done")
    assert read_glued(again.output) == expected


# --- a real chapter killed midway resumes -------------------------------------------------

#: Chapter 1 at a scale where one run takes about 30 CPU-s: every sweep of the chapter runs, each
#: with a few configurations, and the explorer's 56 (activation, depth, width) states are the
#: sweep the run is stopped in (its number of configurations does not depend on the parameters).
NTK_SMALL = {"n_train": 32, "n_test": 64, "lazy_widths": [16, 64, 256], "lazy_steps": 50, "mc_samples": 20000,
             "circle_points": 12, "error_widths": [64, 256], "error_inits": 2, "bias_widths": [4, 16],
             "bias_draws": 256, "dyn_width": 128, "dyn_steps": 50, "ens_width": 64, "ens_members": 4,
             "param_widths": [64, 256, 512], "param_inits": 2, "kr_widths": [16, 64], "kr_steps": 50,
             "nt_points": 8}
#: Chapter 1's sweeps in the order it runs them, with their numbers of configurations at NTK_SMALL.
NTK_SWEEPS = {"ntk_lazy": 9, "ntk_error": 4, "ntk_bias": 4, "ntk_widget": 56, "ntk_ensemble": 4,
              "ntk_param": 6, "ntk_kr": 6}
NTK_STOPPED_IN = "ntk_widget"
#: Glued wall-clock measurements: they differ between any two runs, stored results or not.
NTK_TIMINGS = {"ntk_gram_speedup_vs_loop", "ntk_widget_seconds"}


def _runner_cmd(out: Path, overrides: dict) -> list[str]:
    return [sys.executable, str(ROOT / "book" / "tools" / "run_chapters.py"), "--no-cache", "--jobs", "1",
            "--out", str(out)] + [f"--set={k}={json.dumps(v)}" for k, v in overrides.items()] + ["01_ntk"]


def _wanted(chapter: str) -> bool:
    wanted = [c.strip() for c in os.environ.get("NN_KERNELS_TEST_CHAPTERS", "").split(",") if c.strip()]
    return not wanted or chapter in wanted


@pytest.mark.slow
@pytest.mark.skipif(not _wanted("01_ntk"), reason="NN_KERNELS_TEST_CHAPTERS leaves out 01_ntk")
def test_chapter_one_killed_midway_resumes_with_the_same_glued_values(tmp_path) -> None:
    """Chapter 1, run through the runner with an empty store, is stopped with Ctrl-C once
    some of its explorer's configurations are stored; the rerun reads back every configuration
    stored before the stop, computes the rest, and glues what an uninterrupted run glues."""
    env = {**os.environ, "NN_KERNELS_THREADS": "1"}
    env.pop(st.SCHEDULER_ENV, None)
    # The uninterrupted reference (its own empty store) and the run to be stopped start together.
    ref_store, store = tmp_path / "ref-store", tmp_path / "store"
    ref = subprocess.Popen(_runner_cmd(tmp_path / "ref", NTK_SMALL), env={**env, st.STORE_ENV: str(ref_store)},
                           start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    proc = subprocess.Popen(_runner_cmd(tmp_path / "run", NTK_SMALL), env={**env, st.STORE_ENV: str(store)},
                            start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 600
        while st.ResultStore(store).count(NTK_STOPPED_IN) < 2:
            assert proc.poll() is None, "the run ended before it was stopped:\n" + proc.stdout.read()
            assert time.monotonic() < deadline, f"no {NTK_STOPPED_IN} configuration was stored within 600 s"
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 130, out
        ref_out, _ = ref.communicate(timeout=900)
        assert ref.returncode == 0, ref_out
    finally:
        for p in (proc, ref):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    stored = {name: st.ResultStore(store).count(name) for name in NTK_SWEEPS}
    kept = stored[NTK_STOPPED_IN]
    assert 2 <= kept < NTK_SWEEPS[NTK_STOPPED_IN], (stored, out)
    before = list(NTK_SWEEPS)[:list(NTK_SWEEPS).index(NTK_STOPPED_IN)]
    assert all(stored[name] == NTK_SWEEPS[name] for name in before), stored
    assert all(stored[name] == 0 for name in list(NTK_SWEEPS)[len(before) + 1:]), stored

    # The rerun, as a reader would type it again.
    again = subprocess.run(_runner_cmd(tmp_path / "run", NTK_SMALL), env={**env, st.STORE_ENV: str(store)},
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900)
    assert again.returncode == 0, again.stdout
    # (a) it read back what was stored and computed only the rest (the sweeps' progress lines in its log)
    log = (tmp_path / "run" / "ci" / "01_ntk.log").read_text()
    for name in before:
        n = NTK_SWEEPS[name]
        assert f"[{name}] {n} configurations: {n} stored, 0 to compute" in log, name
    n = NTK_SWEEPS[NTK_STOPPED_IN]
    assert f"[{NTK_STOPPED_IN}] {n} configurations: {kept} stored, {n - kept} to compute" in log
    for name in list(NTK_SWEEPS)[len(before) + 1:]:
        assert f"[{name}] {NTK_SWEEPS[name]} configurations: 0 stored" in log, name
    assert all(st.ResultStore(store).count(name) == n for name, n in NTK_SWEEPS.items())
    ref_log = (tmp_path / "ref" / "ci" / "01_ntk.log").read_text()
    assert all(f"[{name}] {n} configurations: 0 stored" in ref_log for name, n in NTK_SWEEPS.items())
    # (b) and it glued what the uninterrupted run glued, wall-clock timings aside
    expected = read_glued(tmp_path / "ref" / "ci" / "01_ntk.ipynb")
    got = read_glued(tmp_path / "run" / "ci" / "01_ntk.ipynb")
    assert set(got) == set(expected)
    assert NTK_TIMINGS <= set(got)
    differ = sorted(name for name in got if got[name] != expected[name] and name not in NTK_TIMINGS)
    assert not differ, {name: (got[name], expected[name]) for name in differ}


# --- the cluster: chapters and configurations on a 2-worker LocalCluster -------------------

distributed = pytest.importorskip("distributed")


@pytest.fixture(scope="module")
def cluster():
    from distributed import LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                      worker_dashboard_address=None) as c:
        yield c


def _kill_my_worker_once(config):
    """Kill the worker process running this task the first time (a marker file says so)."""
    marker = Path(config["marker"])
    if not marker.exists():
        marker.write_text(str(os.getpid()))
        os._exit(1)  # the worker process dies mid-task, as a lost machine would
    return config["x"] * 10


def test_configurations_on_the_cluster_match_the_local_run(cluster, tmp_path) -> None:
    from distributed import Client

    configs = [{"x": x} for x in range(5)]
    local = st.sweep(_square, configs, name="c", store=tmp_path / "local", progress=None)
    lines: list[str] = []
    with Client(cluster) as client:
        remote = st.sweep(_square, configs, name="c", store=tmp_path / "remote", client=client,
                          progress=lines.append)
    assert remote == local
    assert "on the cluster at tcp://" in lines[0]
    assert st.ResultStore(tmp_path / "remote").count("c") == 5


def test_a_function_that_cannot_be_sent_is_computed_here_and_says_why(cluster, tmp_path) -> None:
    """Chapter 2's adapter sweep read a global model holding a ContextVar: Dask could not pickle
    the task and the record run died in that cell. Now the sweep computes such a function in
    the chapter's own process and names the global that stopped it."""
    import contextvars

    from distributed import Client

    ns = {"__name__": "__main__", "MODEL": contextvars.ContextVar("model")}  # as a notebook defines it
    exec("def run(config):\n    assert MODEL is not None\n    return [n * config['x'] for n in range(3)]", ns)
    configs = [{"x": x} for x in range(4)]
    lines: list[str] = []
    with Client(cluster) as client:
        got = st.sweep(ns["run"], configs, name="c", store=tmp_path / "s", client=client, progress=lines.append)
        assert client.status == "running"  # a client the caller passed is left open
    assert got == [[0, x, 2 * x] for x in range(4)]
    assert "to compute here: fn cannot be sent to the cluster" in lines[0] and "MODEL" in lines[0], lines[0]
    assert st.ResultStore(tmp_path / "s").count("c") == 4
    assert st._unpicklable(_square) is None


def test_a_worker_killed_mid_task_does_not_lose_its_configuration(cluster, tmp_path) -> None:
    from distributed import Client

    marker = tmp_path / "killed-once"
    configs = [{"x": 7, "marker": str(marker)}]
    with Client(cluster) as client:
        got = st.sweep(_kill_my_worker_once, configs, name="k", store=tmp_path / "s",
                       client=client, progress=None)
        client.wait_for_workers(2, timeout=60)  # the nanny brings the dead worker back
    assert marker.exists(), "the first attempt should have killed its worker"
    assert got == [70]
    assert st.ResultStore(tmp_path / "s").count("k") == 1


def test_two_chapters_and_their_configurations_on_the_cluster(cluster, toy_project) -> None:
    os.environ[st.STORE_ENV] = str(toy_project / "local-store")
    try:
        local = run_chapters.run(["toya", "toyb"], "ci", out=toy_project / "local", progress=None,
                                 use_cache=False)
    finally:
        del os.environ[st.STORE_ENV]
    assert all(r.ok for r in local), [r.message for r in local]

    lines: list[str] = []
    os.environ[st.STORE_ENV] = str(toy_project / "cluster-store")
    try:
        remote = run_chapters.run(["toya", "toyb"], "ci", out=toy_project / "cluster",
                                  progress=lines.append, use_cache=False,
                                  scheduler=cluster.scheduler_address)
    finally:
        del os.environ[st.STORE_ENV]
    assert [r.status for r in remote] == ["ok", "ok"], [r.message for r in remote]
    assert any("sent to the cluster" in ln for ln in lines)
    for a, b in zip(local, remote):
        assert read_glued(b.output) == read_glued(a.output)
        log = Path(b.output).with_suffix(".log").read_text()
        assert "on the cluster at tcp://" in log  # the chapter's own configurations went there too
    assert st.ResultStore(toy_project / "cluster-store").count("toya") == 6


@pytest.mark.slow
@pytest.mark.skipif(not _wanted("01_ntk"), reason="NN_KERNELS_TEST_CHAPTERS leaves out 01_ntk")
def test_chapter_one_on_the_cluster_glues_what_the_local_run_glues(cluster, tmp_path) -> None:
    """Both levels on a real chapter: chapter 1 (small settings) is sent to the 2-worker
    cluster as a job, its sweeps' configurations are computed by the cluster's workers, and it
    glues what the same chapter run locally glues, wall-clock timings aside."""
    env = {**os.environ, "NN_KERNELS_THREADS": "1"}
    env.pop(st.SCHEDULER_ENV, None)
    local = subprocess.Popen(_runner_cmd(tmp_path / "local", NTK_SMALL),
                             env={**env, st.STORE_ENV: str(tmp_path / "local-store")},
                             start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        remote = subprocess.run(_runner_cmd(tmp_path / "cluster", NTK_SMALL)[:2]
                                + ["--scheduler", cluster.scheduler_address]
                                + _runner_cmd(tmp_path / "cluster", NTK_SMALL)[2:],
                                env={**env, st.STORE_ENV: str(tmp_path / "cluster-store")},
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900)
        local_out, _ = local.communicate(timeout=900)
    finally:
        if local.poll() is None:
            os.killpg(local.pid, signal.SIGKILL)
            local.wait()
    assert local.returncode == 0, local_out
    assert remote.returncode == 0, remote.stdout
    assert "sent to the cluster" in remote.stdout, remote.stdout
    log = (tmp_path / "cluster" / "ci" / "01_ntk.log").read_text()
    for name, n in NTK_SWEEPS.items():  # every configuration went to the cluster's workers
        assert f"[{name}] {n} configurations: 0 stored, {n} to compute on the cluster at tcp://" in log, name
        assert st.ResultStore(tmp_path / "cluster-store").count(name) == n, name
    expected = read_glued(tmp_path / "local" / "ci" / "01_ntk.ipynb")
    got = read_glued(tmp_path / "cluster" / "ci" / "01_ntk.ipynb")
    assert set(got) == set(expected)
    differ = sorted(name for name in got if got[name] != expected[name] and name not in NTK_TIMINGS)
    assert not differ, {name: (got[name], expected[name]) for name in differ}
