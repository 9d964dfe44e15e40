"""The chapter runner: parameters injected, failures, budgets and the offline guard."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from pathlib import Path

import nbformat
import pytest

import run_chapters
from nnk_book.results import read_glued
from nbfactory import write_notebook

SPEC = {"budget_s": 120, "parameters": {"n": 3}}


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("chapters")
    params = ("code", "n = 1000", ["parameters"])
    glue = "from myst_nb import glue\nglue('square', n * n, display=False)"
    write_notebook(src / "ok.ipynb", [("md", "# ok"), params, ("code", glue)])
    write_notebook(src / "raises.ipynb", [params, ("code", "raise RuntimeError('boom in cell')")])
    write_notebook(src / "slow.ipynb", [params, ("code", "import time\ntime.sleep(60)")])
    # Hangs: a cell that sleeps for ever (no output, no CPU), a kernel that dies.
    write_notebook(src / "hangs.ipynb", [params, ("code", "print('before')"),
                                         ("code", "import time\nwhile True:\n    time.sleep(1)")])
    write_notebook(src / "dies.ipynb", [params, ("code", "import os\nos._exit(3)")])
    write_notebook(src / "killed.ipynb", [params, ("code", "import os, signal\n"
                                                           "os.kill(os.getpid(), signal.SIGKILL)")])
    # Slow but working: computes (no output) for ~12 s, about half a core.
    spin = ("import time\nend = time.time() + 12\n"
            "while time.time() < end:\n"
            "    t = time.process_time()\n"
            "    while time.process_time() - t < 0.05:\n        pass\n"
            "    time.sleep(0.05)\n"
            "from myst_nb import glue\nglue('done', 1, display=False)")
    write_notebook(src / "spins.ipynb", [params, ("code", spin)])
    write_notebook(src / "busy_loop.ipynb", [params, ("code", "while True:\n    pass")])
    # Writes its kernel's pid, then computes for ever without output.
    write_notebook(src / "pid_loop.ipynb", [("code", "pid_file = ''", ["parameters"]),
                                            ("code", "import os\nopen(pid_file, 'w').write(str(os.getpid()))"),
                                            ("code", "while True:\n    pass")])
    write_notebook(src / "pid_sleep.ipynb", [("code", "pid_file = ''", ["parameters"]),
                                             ("code", "import os\nopen(pid_file, 'w').write(str(os.getpid()))"),
                                             ("code", "import time\nwhile True:\n    time.sleep(1)")])
    net = ("import socket\n"
           "socket.create_connection(('192.0.2.1', 80), timeout=1)")  # TEST-NET-1: never routed
    write_notebook(src / "network.ipynb", [params, ("code", net)])
    return src


def _run(fixtures: Path, tmp_path: Path, name: str, spec=SPEC, block=True):
    return run_chapters.run_one(name, "ci", spec, tmp_path, threads=1, block_network=block,
                                chapters_dir=fixtures)


def test_parameters_are_injected_and_glued(fixtures, tmp_path) -> None:
    result = _run(fixtures, tmp_path, "ok")
    assert result.status == "ok", result.message
    assert read_glued(result.output) == {"square": 9}
    assert "ok" in run_chapters.format_table([result])


def test_raising_notebook_is_an_error(fixtures, tmp_path) -> None:
    result = _run(fixtures, tmp_path, "raises")
    assert result.status == "error"
    assert "boom in cell" in result.message or "RuntimeError" in result.message


def test_a_sleeping_cell_is_stopped_as_hung_and_named(fixtures, tmp_path) -> None:
    # A generous budget: the hang is caught by the lack of progress, not by the budget.
    spec = {"budget_s": 300, "stall_s": 6, "parameters": {}}
    result = _run(fixtures, tmp_path, "hangs", spec=spec)
    assert result.status == "hung", (result.status, result.message)
    assert result.cell.startswith("cell 3 ('import time')"), result.cell
    assert "no output and no CPU" in result.message
    assert result.seconds < 40, "a hang is stopped after stall_s, not after the budget"
    line = run_chapters.format_table([result])
    assert "hung" in line and "cell 3" in line


def test_a_slow_computing_cell_passes_its_old_wall_budget(fixtures, tmp_path) -> None:
    """12 s of half-a-core work without output: past a 4 s budget and a 3 s stall limit
    in wall time, yet it computes, so it is slow (a busy machine), not hung."""
    spec = {"budget_s": 4, "stall_s": 3, "cpu_s": 60, "hard_limit_s": 120, "parameters": {}}
    result = _run(fixtures, tmp_path, "spins", spec=spec)
    assert result.status == "ok", (result.status, result.cell, result.message)
    assert result.seconds > 12 > spec["budget_s"]
    assert result.cpu_s > 3, "the CPU time of the kernel is measured"
    assert read_glued(result.output) == {"done": 1}


@pytest.mark.parametrize("name", ["dies", "killed"])
def test_a_dead_kernel_is_reported_with_its_cell(fixtures, tmp_path, name) -> None:
    result = _run(fixtures, tmp_path, name, spec={"budget_s": 300, "stall_s": 30, "parameters": {}})
    assert result.status == "died", (result.status, result.message)
    assert result.cell.startswith("cell 2 ('import os"), result.cell
    assert "kernel died" in result.message
    assert result.seconds < 60


def test_hard_limit_and_cpu_limit_end_a_busy_loop(fixtures, tmp_path) -> None:
    wall = _run(fixtures, tmp_path, "busy_loop",
                spec={"budget_s": 300, "hard_limit_s": 25, "parameters": {}})
    assert wall.status == "timeout" and "hard limit of 25 s" in wall.message, wall.message
    assert wall.cell.startswith("cell 2 ('while True:')"), wall.cell
    assert wall.seconds < 60
    cpu = _run(fixtures, tmp_path, "busy_loop", spec={"budget_s": 300, "cpu_s": 3, "parameters": {}})
    assert cpu.status == "timeout" and "CPU limit" in cpu.message, cpu.message
    assert cpu.cpu_s >= 3


@pytest.mark.parametrize("name, limit, status", [("pid_loop", {"hard_limit_s": 15}, "timeout"),
                                                 ("pid_sleep", {"stall_s": 5}, "hung")])
def test_a_stopped_chapter_leaves_no_kernel_running(fixtures, tmp_path, name, limit, status) -> None:
    """jupyter_client starts the kernel in a session of its own: killing papermill's group
    left it computing (and writing results) until its parent poller noticed. The runner
    returns only once the kernel is gone."""
    import psutil

    pid_file = tmp_path / "kernel.pid"
    spec = {"budget_s": 300, **limit, "parameters": {"pid_file": str(pid_file)}}
    result = _run(fixtures, tmp_path, name, spec=spec)
    assert result.status == status, result.message
    pid = int(pid_file.read_text())
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, \
        "the chapter's kernel outlived the runner's stop"


def test_limits_default_from_the_budget() -> None:
    got = run_chapters.limits({"budget_s": 300, "parameters": {}}, threads=2)
    assert got == {"stall_s": run_chapters.STALL_S,
                   "cpu_s": run_chapters.CPU_FACTOR * 300 * 2,
                   "hard_limit_s": run_chapters.WALL_FACTOR * 300}
    # A chapter three times slower or busier than the reference is inside every limit.
    assert got["hard_limit_s"] >= 3 * 300 and got["cpu_s"] / 2 >= 1.5 * 300
    assert run_chapters.limits({"budget_s": 10, "stall_s": 5, "cpu_s": 7, "hard_limit_s": 9},
                               threads=1) == {"stall_s": 5, "cpu_s": 7, "hard_limit_s": 9}


def test_profile_limits_are_checked(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(run_chapters, "CHAPTERS", tmp_path)
    write_notebook(tmp_path / "a.ipynb", [("code", "x = 1", ["parameters"])])
    profiles = tmp_path / "profiles.yaml"
    monkeypatch.setattr(run_chapters, "PROFILES", profiles)
    profiles.write_text("ci:\n  a: {budget_s: 60, stall_s: 30}\n")
    assert run_chapters.load_profile("ci")["a"]["stall_s"] == 30
    profiles.write_text("ci:\n  a: {budget_s: 60, stall_s: -1}\n")
    with pytest.raises(SystemExit, match="stall_s must be a positive"):
        run_chapters.load_profile("ci")


def test_network_is_blocked_inside_the_kernel(fixtures, tmp_path) -> None:
    result = _run(fixtures, tmp_path, "network")
    assert result.status == "error"
    log = Path(result.output).with_suffix(".log").read_text()
    assert "network access" in log and "blocked" in log


def test_guard_allows_loopback() -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    threading.Thread(target=lambda: server.accept()[0].close(), daemon=True).start()
    code = (f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=5).close();"
            "import sys\n"
            "try:\n socket.getaddrinfo('example.org', 80)\nexcept OSError as e:\n"
            " sys.exit(0 if 'blocked' in str(e) else 3)\nsys.exit(4)")
    env = run_chapters.runner_env(threads=1, block_network=True)
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    server.close()
    assert proc.returncode == 0, proc.stderr


def test_ci_profile_names_only_real_chapters() -> None:
    specs = run_chapters.load_profile("ci")
    assert set(specs) == set(run_chapters.chapter_names())
    for name, spec in specs.items():
        assert 0 < spec["budget_s"] <= 300, f"{name}: ci budget must be at most 5 minutes"


def test_set_overrides_are_parsed_as_yaml() -> None:
    assert run_chapters.parse_overrides(["use_real_data=false", "seed=1", "sizes=[8, 16]", "name=a=b"]) == {
        "use_real_data": False, "seed": 1, "sizes": [8, 16], "name": "a=b"}
    for bad in ("no_equals", "=1", "not an identifier=1"):
        with pytest.raises(SystemExit, match="NAME=VALUE"):
            run_chapters.parse_overrides([bad])


# --- cache, progress, interruption, failing cell, atomic summary -------------------------

@pytest.fixture()
def mini_project(tmp_path, monkeypatch) -> Path:
    """A chapters folder, a profile and a 'package' source folder the runner hashes."""
    chapters, pkg = tmp_path / "chapters", tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "lib.py").write_text("def f(x):\n    return x + 1\n")
    params = ("code", "n = 2", ["parameters"])
    write_notebook(chapters / "a.ipynb", [("md", "# First prose"), params,
                                          ("code", "import time\nfrom myst_nb import glue\n"
                                                   "glue('stamp', time.time_ns(), display=False)")])
    profiles = tmp_path / "profiles.yaml"
    profiles.write_text("ci:\n  a:\n    budget_s: 120\n")
    monkeypatch.setattr(run_chapters, "CHAPTERS", chapters)
    monkeypatch.setattr(run_chapters, "PROFILES", profiles)
    monkeypatch.setattr(run_chapters, "SOURCE_DIRS", (pkg,))
    monkeypatch.setattr(run_chapters, "SOURCE_FILES", ())
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("NN_KERNELS_NO_CACHE", raising=False)
    return tmp_path


def _stamp(result) -> int:
    return read_glued(result.output)["stamp"]


def test_cache_reuses_after_a_prose_edit_and_reexecutes_after_a_source_edit(mini_project) -> None:
    out = mini_project / "out"
    lines: list[str] = []
    first, = run_chapters.run(["a"], "ci", out=out, progress=lines.append)
    assert first.status == "ok" and (out / "ci" / "a.key").exists()
    first_stamp = _stamp(first)  # the same file is rewritten by later runs
    assert any(ln.startswith("[a] started") for ln in lines) and any(ln.startswith("[a] ok") for ln in lines)

    # Prose edit: reused, and the executed notebook shows the new prose with the old outputs.
    nb_path = mini_project / "chapters" / "a.ipynb"
    nb_path.write_text(nb_path.read_text().replace("# First prose", "# Edited prose"))
    second, = run_chapters.run(["a"], "ci", out=out, progress=lines.append)
    assert second.status == "cached" and _stamp(second) == first_stamp
    assert "# Edited prose" in Path(second.output).read_text()
    assert any("unchanged" in ln for ln in lines)

    # An edit to a function of the package the chapter depends on: executed again.
    (mini_project / "pkg" / "lib.py").write_text("def f(x):\n    return x + 2\n")
    third, = run_chapters.run(["a"], "ci", out=out, progress=None)
    assert third.status == "ok" and _stamp(third) != first_stamp

    # A code edit and a parameter change re-execute too; --no-cache always executes.
    key = run_chapters.cache_key(nb_path, {}, "ci")
    assert run_chapters.cache_key(nb_path, {"n": 3}, "ci") != key
    nb_path.write_text(nb_path.read_text().replace("n = 2", "n = 5"))
    assert run_chapters.cache_key(nb_path, {}, "ci") != key
    fourth, = run_chapters.run(["a"], "ci", out=out, progress=None, use_cache=False)
    assert fourth.status == "ok"


def test_cache_key_follows_recorded_runs(tmp_path) -> None:
    """Chapters read and glue book/runs/ (records and sweeps): editing one re-executes them."""
    assert run_chapters.ROOT / "book" / "runs" in run_chapters.SOURCE_DIRS
    nb = tmp_path / "a.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1")]), str(nb))
    runs = tmp_path / "runs" / "sweeps"
    runs.mkdir(parents=True)
    (runs / "a.sweep.json").write_text('{"lr": [0.01]}')
    key = run_chapters.cache_key(nb, {}, "ci", dirs=[tmp_path / "runs"], files=[])
    (runs / "a.sweep.json").write_text('{"lr": [0.02]}')
    assert run_chapters.cache_key(nb, {}, "ci", dirs=[tmp_path / "runs"], files=[]) != key


def test_ci_environment_disables_the_cache(monkeypatch) -> None:
    monkeypatch.setenv("CI", "true")
    assert run_chapters.cache_disabled()
    monkeypatch.delenv("CI")
    monkeypatch.setenv("NN_KERNELS_NO_CACHE", "1")
    assert run_chapters.cache_disabled()


def test_failed_chapter_names_its_cell(fixtures, tmp_path) -> None:
    result = _run(fixtures, tmp_path, "raises")
    assert result.cell.startswith("cell 3") and "boom in cell" in result.cell, result.cell
    assert "cell 3" in run_chapters.format_table([result])


def test_progress_lines_name_the_running_cell(fixtures, tmp_path, monkeypatch) -> None:
    # No parameters are injected here, so the sleeping cell is cell 2 of the run.
    monkeypatch.setattr(run_chapters, "REPORT_EVERY_S", 2.0)
    lines: list[str] = []
    result = _run_with_progress(fixtures, tmp_path, "slow",
                                {"budget_s": 300, "stall_s": 7, "parameters": {}}, lines)
    assert result.status == "hung" and result.cell == "cell 2 ('import time')", result.cell
    assert any("on cell 2" in ln for ln in lines), lines
    assert any("idle" in ln for ln in lines), lines
    log = Path(result.output).with_suffix(".log").read_text()
    assert "Executing Cell 2" in log, "cell progress is streamed to the chapter's log"


def _run_with_progress(fixtures, tmp_path, name, spec, lines):
    return run_chapters.run_one(name, "ci", spec, tmp_path, threads=1, chapters_dir=fixtures,
                                progress=lines.append)


def test_ctrl_c_stops_the_runner_and_its_chapters(fixtures, tmp_path) -> None:
    """SIGINT to the runner kills papermill and its kernel within seconds, exit 130."""
    import os
    import signal
    import time

    profiles = tmp_path / "profiles.yaml"
    profiles.write_text("ci:\n  slow:\n    budget_s: 600\n")
    script = (
        "import sys, run_chapters\n"
        "from pathlib import Path\n"
        f"run_chapters.CHAPTERS = Path({str(fixtures)!r})\n"
        f"run_chapters.PROFILES = Path({str(profiles)!r})\n"
        f"sys.exit(run_chapters.main(['slow', '--out', {str(tmp_path / 'out')!r}, '--no-cache']))\n")
    env = dict(os.environ, PYTHONPATH=str(run_chapters.Path(run_chapters.__file__).parent))
    # Started with SIGINT ignored, as a background job of a non-interactive shell (a CI
    # script) is: the runner must still stop on it.
    proc = subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    log = tmp_path / "out" / "ci" / "slow.log"
    deadline = time.time() + 60
    while time.time() < deadline and "Executing Cell 2" not in (log.read_text() if log.exists() else ""):
        time.sleep(0.5)
    assert "Executing Cell 2" in log.read_text(), "the slow cell never started"
    start = time.time()
    os.kill(proc.pid, signal.SIGINT)
    out, _ = proc.communicate(timeout=30)
    assert time.time() - start < 15
    assert proc.returncode == 130, out
    assert "interrupted" in out and "slow (at cell 2)" in out, out
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert str(fixtures / "slow.ipynb") not in ps, "a papermill process survived Ctrl-C"


def test_summary_is_written_atomically(tmp_path, monkeypatch) -> None:
    import nnk_book.files as files

    target = tmp_path / "summary.json"
    target.write_text('{"old": true}')

    def broken_fsync(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(files.os, "fsync", broken_fsync)
    with pytest.raises(OSError, match="No space"):
        run_chapters._write_summary(tmp_path, [])
    assert target.read_text() == '{"old": true}', "a failed write must leave the old file intact"
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"], "temporary file left behind"
