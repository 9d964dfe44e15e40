"""Execute chapters headless with papermill under a named profile; reuse unchanged ones.

    python book/tools/run_chapters.py                      # every chapter, ci profile
    python book/tools/run_chapters.py --profile record 01_ntk
    python book/tools/run_chapters.py --jobs 1 --out /tmp/run
    python book/tools/run_chapters.py --profile paper --set use_real_data=false 02_random_features
    python book/tools/run_chapters.py --no-cache 03_bundling

This is the book's one execution path: ``make book`` and ``make test`` both run the
chapters through it and build the HTML from the notebooks it wrote.

Each notebook in ``chapters/`` runs in its own papermill process with the parameters
of ``book/profiles.yaml`` injected after its ``parameters`` cell (the ``ci`` profile sets
little or nothing, since the notebooks' own values are the teaching scale; ``record`` the
largest settings that fit about 90 min per chapter; ``paper`` the papers' settings), network access blocked in ``ci`` (``netguard/sitecustomize.py``)
and ``OMP_NUM_THREADS`` set so that parallel jobs share the cores (``NN_KERNELS_THREADS=1``
forces one thread per chapter). Executed copies go to ``<out>/<profile>/<chapter>.ipynb``,
cell output streams to ``<chapter>.log`` beside it while it runs (``tail -f`` it), and a
line is printed when a chapter starts, every 30 s while it runs (with the cell it is on
and the CPU time used) and when it ends. A summary table is printed and written as
``summary.json``.

Budgets catch hangs, not slowness. A chapter on a machine three times slower or busier
than the reference must pass, so no limit is a wall-clock speed test with a small margin.
Every second the runner looks at the chapter's process tree (papermill, its kernel and
anything the kernel started) and its log, and stops it when

* **it hangs** (status ``hung``): for ``stall_s`` seconds (default :data:`STALL_S`) the
  log got no new output and the process tree used less than :data:`IDLE_CPU` of one core.
  A cell that sleeps, waits on a lock or a dead connection, or deadlocks is stopped this
  way, however short its chapter's budget; a cell that computes, however slowly, is not.
* **its kernel died** (status ``died``): the kernel process is gone (a segfault, the
  out-of-memory killer, ``os._exit``); papermill normally reports it at once, and the
  runner stops papermill :data:`KERNEL_GRACE_S` seconds later if it does not.
* **it computes far too long** (status ``timeout``): the CPU time of its process tree
  passes ``cpu_s`` per thread (default :data:`CPU_FACTOR` times ``budget_s``; CPU time
  does not grow when other work shares the cores), or its wall time passes
  ``hard_limit_s`` (default :data:`WALL_FACTOR` times ``budget_s``), the hard limit
  that makes every run end, e.g. a busy loop on a machine starved of CPU.

``budget_s`` is thus the chapter's budget on the reference machine (at most 300 s in
``ci``); ``stall_s``, ``cpu_s`` and ``hard_limit_s`` may be set per chapter in a
profile. The summary and the failure message name the cell the chapter was on.

Cache: beside each executed notebook, ``<chapter>.key`` records a hash of everything
the run depends on: the notebook's code cells, the injected parameters, the source of
``kernels/``, ``data_scripts/`` and ``nnk_book``, and the pins. When the key is unchanged
the chapter is not executed again; its outputs are carried over to the current notebook
(so an edit to prose or to a caption shows without a re-run). Anything else re-executes
it. ``--no-cache`` (or ``CI=true`` / ``NN_KERNELS_NO_CACHE=1``) always executes.

Ctrl-C (or SIGTERM) kills every running chapter within seconds and exits with status
130, naming each chapter and the cell it was on. The exit status is non-zero when any
chapter fails, hangs or runs over a limit; the summary names the failing cell.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any, Callable, Iterable

import yaml

from nnk_book.chapter import RUNNER_ENV, runner_threads
from nnk_book.files import atomic_write_text

ROOT = Path(__file__).resolve().parents[2]
CHAPTERS = ROOT / "chapters"
PROFILES = ROOT / "book" / "profiles.yaml"
NETGUARD = Path(__file__).resolve().parent / "netguard"
DEFAULT_OUT = ROOT / "_build" / "executed"
FULL_BUDGET_S = 6 * 3600
# What a chapter's results depend on besides its own code: hashed into its cache key.
# book/runs: the recorded runs and sweeps (JSON) that chapters read and glue from.
SOURCE_DIRS = (ROOT / "kernels", ROOT / "data_scripts", ROOT / "book" / "nnk_book", NETGUARD,
               ROOT / "book" / "runs")
SOURCE_FILES = (ROOT / "constraints.txt", ROOT / "pyproject.toml")
SOURCE_SUFFIXES = {".py", ".cpp", ".h", ".cu", ".json"}
REPORT_EVERY_S = 30.0
# Other names of profiles (none: the profiles are ci, record and paper).
PROFILE_ALIASES: dict[str, str] = {}
# Budgets (see the module docstring): hangs are caught by the absence of progress.
STALL_S = 180.0        # no output and (almost) no CPU for this long: hung
IDLE_CPU = 0.02        # CPU seconds per second (of one core) below which a tree is idle
CPU_FACTOR = 2.0       # default cpu_s = CPU_FACTOR * budget_s, per thread
WALL_FACTOR = 4.0      # default hard_limit_s = WALL_FACTOR * budget_s
KERNEL_GRACE_S = 20.0  # papermill's time to report a dead kernel before it is stopped
POLL_S = 1.0
_CELL_LINE = re.compile(r"Executing Cell (\d+)")


@dataclasses.dataclass
class Result:
    chapter: str
    profile: str
    seconds: float
    status: str  # "ok", "cached", "error", "hung", "died", "timeout", "interrupted"
    threads: int
    output: str
    message: str = ""
    cell: str = ""  # the failing cell ("cell 12: raise ...") or, stopped, the running one
    cpu_s: float = 0.0  # CPU time of the chapter's process tree (papermill and kernel)

    @property
    def ok(self) -> bool:
        return self.status in ("ok", "cached")


def chapter_names() -> list[str]:
    """Stems of every notebook in chapters/, in book order."""
    return sorted(p.stem for p in CHAPTERS.glob("*.ipynb"))


def load_profile(profile: str) -> dict[str, dict[str, Any]]:
    """Return ``{chapter: {"budget_s": int, "parameters": dict}}`` for a profile."""
    data = yaml.safe_load(PROFILES.read_text()) or {}
    profile = PROFILE_ALIASES.get(profile, profile)
    if profile not in data:
        raise SystemExit(f"unknown profile {profile!r}; {PROFILES.name} defines {sorted(data)}")
    section = data[profile] or {}
    out: dict[str, dict[str, Any]] = {}
    for name in chapter_names():
        entry = section.get(name) or {}
        out[name] = {
            "budget_s": int(entry.get("budget_s", FULL_BUDGET_S)),
            "parameters": dict(entry.get("parameters") or {}),
        }
        for limit in ("stall_s", "cpu_s", "hard_limit_s"):
            if limit in entry:
                value = entry[limit]
                if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                    raise SystemExit(f"{PROFILES.name}: {profile}/{name}/{limit} must be a "
                                     f"positive number of seconds, got {value!r}")
                out[name][limit] = float(value)
    unknown = sorted(set(section) - set(out))
    if unknown:
        raise SystemExit(f"{PROFILES.name}: profile {profile!r} names unknown chapters {unknown}")
    return out


def runner_env(threads: int, block_network: bool = True) -> dict[str, str]:
    """Environment for a papermill process: thread count, offline guard, quiet TF/JAX."""
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[var] = str(threads)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.setdefault("JAX_PLATFORMS", "cpu")
    env.setdefault("PYTHONHASHSEED", "0")
    env.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    env[RUNNER_ENV] = env.get(RUNNER_ENV, "")  # also tells nnk_book it runs headless
    if block_network:
        env["NN_KERNELS_NO_NETWORK"] = "1"
        env["PYTHONPATH"] = os.pathsep.join(
            [str(NETGUARD)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
        )
    return env


# --- cache key ----------------------------------------------------------------------

def _sources_digest(dirs: Iterable[Path], files: Iterable[Path]) -> str:
    h = hashlib.sha256()
    paths = [p for d in dirs if d.exists() for p in sorted(d.rglob("*"))
             if p.is_file() and p.suffix in SOURCE_SUFFIXES and "__pycache__" not in p.parts]
    paths += [f for f in files if f.exists()]
    for path in paths:
        h.update(str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path).encode())
        h.update(b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


def cache_key(notebook: Path, parameters: dict[str, Any], profile: str,
              dirs: Iterable[Path] | None = None, files: Iterable[Path] | None = None) -> str:
    """Hash of what an execution of ``notebook`` depends on (not its prose or metadata).

    ``dirs`` and ``files`` default to :data:`SOURCE_DIRS` and :data:`SOURCE_FILES`.
    """
    import nbformat

    dirs = SOURCE_DIRS if dirs is None else dirs
    files = SOURCE_FILES if files is None else files

    nb = nbformat.read(str(notebook), as_version=4)
    h = hashlib.sha256()
    h.update(f"{profile}\0{sys.version_info[:2]}\0".encode())
    h.update(json.dumps(parameters, sort_keys=True, default=str).encode())
    for cell in nb.cells:
        if cell.cell_type == "code":
            h.update(b"\0cell\0" + cell.source.encode())
    h.update(_sources_digest(dirs, files).encode())
    return h.hexdigest()


def cache_disabled() -> bool:
    return os.environ.get("CI", "").lower() == "true" or os.environ.get("NN_KERNELS_NO_CACHE") == "1"


def reuse_cached(chapter: str, profile: str, spec: dict[str, Any], out_dir: Path, key: str,
                 chapters_dir: Path = CHAPTERS) -> Result | None:
    """A Result for a cached execution with this ``key``, its outputs merged into the
    current notebook (new prose, captions and tags; old outputs); None when not cached."""
    import nbformat
    import papermill as pm

    output, key_file = out_dir / f"{chapter}.ipynb", out_dir / f"{chapter}.key"
    try:
        saved = json.loads(key_file.read_text())
        if saved.get("key") != key or not output.exists():
            return None
        old = nbformat.read(str(output), as_version=4)
    except (OSError, ValueError):
        return None
    with tempfile.TemporaryDirectory() as tmp:
        prepared = Path(tmp) / f"{chapter}.ipynb"
        pm.execute_notebook(str(chapters_dir / f"{chapter}.ipynb"), str(prepared),
                            parameters=spec["parameters"], prepare_only=True,
                            kernel_name="python3", progress_bar=False, log_output=False)
        new = nbformat.read(str(prepared), as_version=4)
    old_code = [c for c in old.cells if c.cell_type == "code"]
    new_code = [c for c in new.cells if c.cell_type == "code"]
    if [c.source for c in old_code] != [c.source for c in new_code]:
        return None  # the key matched but the cells did not: execute rather than guess
    for was, now in zip(old_code, new_code):
        now.outputs = was.outputs
        now.execution_count = was.execution_count
        if "papermill" in was.metadata:
            now.metadata["papermill"] = was.metadata["papermill"]
    for name in ("widgets", "papermill"):
        if name in old.metadata:
            new.metadata[name] = old.metadata[name]
    atomic_write_text(output, nbformat.writes(new))
    return Result(chapter, profile, float(saved.get("seconds", 0.0)), "cached",
                  int(saved.get("threads", 0)), str(output),
                  f"unchanged since {saved.get('date', '?')}; executed in {saved.get('seconds', 0):.0f} s")


# --- one chapter ----------------------------------------------------------------------

class _Live:
    """The running chapters' process trees, so that Ctrl-C can stop all of them."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.watches: set[_Watch] = set()
        self.stop = threading.Event()

    def kill_all(self) -> None:
        with self.lock:
            for watch in list(self.watches):
                watch.kill_tree()


_LIVE = _Live()


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _current_cell(log: Path) -> int | None:
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return None
    found = _CELL_LINE.findall(text)
    return int(found[-1]) if found else None


_SWEEP_LINE = re.compile(r"^\[([\w.-]+)\] (\d+ configurations: .*|\d+/\d+ done \(.*\))$", re.M)


def _sweep_status(log: Path) -> str:
    """The last progress line of a :func:`nnk_book.store.sweep` in a chapter's log, or ''
    (how many configurations of its running experiment are done, stored and left)."""
    try:
        found = _SWEEP_LINE.findall(log.read_text(errors="replace"))
    except OSError:
        return ""
    return f"[{found[-1][0]}] {found[-1][1]}" if found else ""


def _failed_cell(output: Path) -> str:
    """'cell N: ErrorName: message' for the cell papermill marked as failed, or ''."""
    import nbformat

    try:
        nb = nbformat.read(str(output), as_version=4)
    except Exception:  # noqa: BLE001 - a missing or partial notebook names no cell
        return ""
    # Numbered as papermill's log numbers them ("Executing Cell N"): the injected
    # parameters cell counts, the error banners papermill adds afterwards do not.
    cells = [c for c in nb.cells if "papermill-error-cell-tag" not in c.get("metadata", {}).get("tags", [])]
    for number, cell in enumerate(cells, start=1):
        if cell.get("metadata", {}).get("papermill", {}).get("exception"):
            errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
            detail = f"{errors[-1]['ename']}: {errors[-1]['evalue']}"[:200] if errors else "raised"
            first = cell.source.strip().splitlines()[0][:60] if cell.source.strip() else ""
            return f"cell {number} ({first!r}): {detail}"
    return ""


def limits(spec: dict[str, Any], threads: int) -> dict[str, float]:
    """The stall, CPU and wall limits of a chapter's ``spec`` (see the module docstring)."""
    budget = float(spec["budget_s"])
    return {
        "stall_s": float(spec.get("stall_s", STALL_S)),
        "cpu_s": float(spec.get("cpu_s", CPU_FACTOR * budget)) * max(1, threads),
        "hard_limit_s": float(spec.get("hard_limit_s", WALL_FACTOR * budget)),
    }


class _Watch:
    """What a running chapter is doing: the cell it is on (from its log), whether its log
    grew, the CPU time its process tree has used, and whether its kernel is alive."""

    def __init__(self, pid: int, log: Path) -> None:
        import psutil

        self._psutil = psutil
        self.root = psutil.Process(pid)
        self.log = log
        self._pos = 0
        self._tail = ""
        self._seen: dict[int, float] = {}
        self.cpu = 0.0  # CPU seconds of the tree so far (processes seen alive)
        self.cell: int | None = None
        self.kernel: Any = None  # psutil.Process of the kernel, once started
        self.kernel_gone_at: float | None = None
        # Every process seen in the tree. jupyter_client starts the kernel in a session of its
        # own, so killing papermill's process group leaves it running (an orphan that only
        # ends when its parent poller notices, a second later, or never under a subreaper):
        # kill_tree kills each process seen, and the groups they lead.
        self._procs: dict[int, Any] = {pid: self.root}
        self._lock = threading.Lock()

    def _read_log(self) -> bool:
        try:
            with open(self.log, "rb") as fh:
                fh.seek(self._pos)
                chunk = fh.read()
        except OSError:
            return False
        if not chunk:
            return False
        self._pos += len(chunk)
        text = self._tail + chunk.decode("utf-8", errors="replace")
        text, _, self._tail = text.rpartition("\n")
        found = _CELL_LINE.findall(text)
        if found:
            self.cell = int(found[-1])
        return True

    def _tree(self) -> list[Any]:
        try:
            tree = [self.root, *self.root.children(recursive=True)]
        except self._psutil.Error:
            return []
        with self._lock:
            for proc in tree:
                self._procs.setdefault(proc.pid, proc)
        return tree

    def kill_tree(self, wait_s: float = 10.0) -> None:
        """SIGKILL papermill, the kernel and everything either started, and wait for them
        to end, so that no kernel computes (or writes a result) after the chapter stopped."""
        self._tree()  # the children started since the last poll, while papermill still lives
        with self._lock:
            procs = list(self._procs.values())
        _kill_group(self.root.pid)  # papermill's group, as before
        for proc in procs:
            try:
                if not proc.is_running():  # compares the start time too: never a recycled pid
                    continue
                if os.getpgid(proc.pid) == proc.pid:
                    _kill_group(proc.pid)  # a group it leads (the kernel leads its own session)
                proc.kill()
            except (self._psutil.Error, ProcessLookupError):
                pass
        self._psutil.wait_procs(procs, timeout=wait_s)

    def poll(self, now: float) -> tuple[bool, float]:
        """Read what changed since the last call: (the log grew, CPU seconds used since)."""
        grew = self._read_log()
        used = 0.0
        for proc in self._tree():
            try:
                times = proc.cpu_times()
                if self.kernel is None and "ipykernel" in " ".join(proc.cmdline()):
                    self.kernel = proc
            except self._psutil.Error:
                continue
            total = times.user + times.system
            used += max(0.0, total - self._seen.get(proc.pid, 0.0))
            self._seen[proc.pid] = total
        self.cpu += used
        if self.kernel is not None and self.kernel_gone_at is None:
            try:
                alive = self.kernel.is_running() and self.kernel.status() != self._psutil.STATUS_ZOMBIE
            except self._psutil.Error:
                alive = False
            if not alive:
                self.kernel_gone_at = now
        return grew, used


def _cell_label(notebook: Path, number: int | None) -> str:
    """'cell N ('first line')' for papermill's cell N of ``notebook``, or 'cell N'."""
    if not number:
        return ""
    import nbformat

    try:
        nb = nbformat.read(str(notebook), as_version=4)
        cells = [c for c in nb.cells
                 if "papermill-error-cell-tag" not in c.get("metadata", {}).get("tags", [])]
        source = cells[number - 1].source.strip()
    except Exception:  # noqa: BLE001 - a notebook being written names no source
        return f"cell {number}"
    first = source.splitlines()[0][:60] if source else ""
    return f"cell {number} ({first!r})" if first else f"cell {number}"


def run_one(
    chapter: str,
    profile: str,
    spec: dict[str, Any],
    out_dir: Path,
    threads: int,
    block_network: bool = True,
    chapters_dir: Path = CHAPTERS,
    progress: Callable[[str], None] | None = None,
    key: str | None = None,
) -> Result:
    """Execute one chapter; never raises for a failing notebook (the Result says so).

    ``spec`` holds ``budget_s`` and ``parameters``, and optionally ``stall_s``, ``cpu_s``
    and ``hard_limit_s`` (see the module docstring and :func:`limits`). ``progress``
    receives a line every ``REPORT_EVERY_S`` seconds while the chapter runs; ``key``
    (see :func:`cache_key`) is recorded beside a successful run.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    output = out_dir / f"{chapter}.ipynb"
    log = out_dir / f"{chapter}.log"
    (out_dir / f"{chapter}.key").unlink(missing_ok=True)
    env = runner_env(threads, block_network)
    env[RUNNER_ENV] = profile
    env["PYTHONUNBUFFERED"] = "1"
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as fh:
        yaml.safe_dump(spec["parameters"], fh)
        params_file = fh.name
    cmd = [
        sys.executable, "-m", "papermill", str(chapters_dir / f"{chapter}.ipynb"), str(output),
        "-f", params_file, "--cwd", str(chapters_dir), "-k", "python3",
        "--no-progress-bar", "--log-output", "--log-level", "INFO",
    ]
    limit = limits(spec, threads)
    start = time.perf_counter()
    status, message, cell, rc = "ok", "", "", None
    watch: _Watch | None = None

    def stop(new_status: str, why: str) -> None:
        nonlocal status, message, cell, rc
        watch.kill_tree()
        proc.wait()
        watch.poll(time.perf_counter())
        status, message, rc = new_status, why, None
        if new_status == "interrupted":
            cell = f"cell {watch.cell}" if watch.cell else ""
        else:
            cell = _cell_label(output, watch.cell)

    try:
        with open(log, "w") as logfh:
            proc = subprocess.Popen(cmd, stdout=logfh, stderr=subprocess.STDOUT, env=env,
                                    cwd=ROOT, start_new_session=True)
            watch = _Watch(proc.pid, log)
            with _LIVE.lock:
                _LIVE.watches.add(watch)
            next_report = REPORT_EVERY_S
            last_progress, cpu_at_progress = start, 0.0
            try:
                while True:
                    try:
                        rc = proc.wait(timeout=POLL_S)
                    except subprocess.TimeoutExpired:
                        rc = None
                    now = time.perf_counter()
                    elapsed = now - start
                    if _LIVE.stop.is_set():  # killed by Ctrl-C, or about to be
                        stop("interrupted", "stopped by Ctrl-C / SIGTERM")
                        break
                    if rc is not None:
                        watch.poll(now)
                        break
                    grew, _ = watch.poll(now)
                    # Progress: new output, or more CPU than an idle tree uses (papermill
                    # and an idle kernel poll a little) since the last progress.
                    if grew or watch.cpu - cpu_at_progress > IDLE_CPU * (now - last_progress) + 0.1:
                        last_progress, cpu_at_progress = now, watch.cpu
                    idle = now - last_progress
                    if watch.kernel_gone_at is not None and now - watch.kernel_gone_at > KERNEL_GRACE_S:
                        stop("died", "its kernel died (the process is gone; see the log)")
                        break
                    if idle > limit["stall_s"]:
                        stop("hung", f"no output and no CPU use for {idle:.0f} s "
                                     f"(stall_s = {limit['stall_s']:.0f}): the cell hangs")
                        break
                    if watch.cpu > limit["cpu_s"]:
                        stop("timeout", f"used {watch.cpu:.0f} CPU-s, over its CPU limit of "
                                        f"{limit['cpu_s']:.0f} s (cpu_s x {threads} thread(s))")
                        break
                    if elapsed > limit["hard_limit_s"]:
                        stop("timeout", f"ran {elapsed:.0f} s, over its hard limit of "
                                        f"{limit['hard_limit_s']:.0f} s")
                        break
                    if progress and elapsed >= next_report:
                        sweep = _sweep_status(log)
                        progress(f"  {chapter}: {elapsed:.0f} s, {watch.cpu:.0f} CPU-s"
                                 + (f", on cell {watch.cell}" if watch.cell else "")
                                 + (f", idle {idle:.0f} s" if idle >= 5 else "")
                                 + (f"; {sweep}" if sweep else ""))
                        next_report += REPORT_EVERY_S
            finally:
                watch.kill_tree()  # stray kernel processes, if any
                with _LIVE.lock:
                    _LIVE.watches.discard(watch)
        if status == "ok" and rc != 0:
            # (The kernel is also gone when papermill shuts it down after an error.)
            died = _kernel_died(log)
            status = "died" if died else "error"
            if died:
                cell = _cell_label(output, watch.cell)
                message = "its kernel died (the process is gone; see the log)"
            else:
                cell = _failed_cell(output) or _cell_label(output, watch.cell)
                message = _last_error(log)
    finally:
        os.unlink(params_file)
    seconds = round(time.perf_counter() - start, 1)
    if status == "ok" and key is not None:
        atomic_write_text(out_dir / f"{chapter}.key", json.dumps({
            "key": key, "seconds": seconds, "threads": threads,
            "date": time.strftime("%Y-%m-%d %H:%M:%S")}))
    return Result(chapter, profile, seconds, status, threads, str(output), message, cell,
                  round(watch.cpu if watch else 0.0, 1))


def _kernel_died(log: Path) -> bool:
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return False
    return "DeadKernelError" in text or "Kernel died" in text


def _last_error(log: Path) -> str:
    lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    for ln in reversed(lines):
        if "Error" in ln or "Exception" in ln:
            return ln.strip()[:300]
    return lines[-1][:300] if lines else "papermill failed without output"


# --- many chapters --------------------------------------------------------------------

class Interrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM stopped the run; ``results`` holds what had finished."""

    def __init__(self, results: list[Result]) -> None:
        super().__init__("interrupted")
        self.results = results


def _print(line: str) -> None:
    # One write per line: chapters report from several threads, and print() writes the
    # text and its newline separately, so two lines could run together.
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def run(
    chapters: Iterable[str],
    profile: str = "ci",
    out: Path = DEFAULT_OUT,
    jobs: int | None = None,
    block_network: bool = True,
    overrides: dict[str, Any] | None = None,
    use_cache: bool | None = None,
    progress: Callable[[str], None] | None = _print,
    scheduler: str | None = None,
) -> list[Result]:
    """Run chapters (in parallel where cores allow) and write ``summary.json``.

    ``scheduler`` (a Dask scheduler address) sends each chapter that is not cached to the
    cluster as an independent job (:func:`_run_on_cluster`), and lets the chapters send
    their own configurations there too (``$NN_KERNELS_DASK_SCHEDULER``).

    ``overrides`` are parameters injected on top of the profile's, in every chapter run
    (e.g. ``{"use_real_data": False}`` for a record run on a machine without network).
    ``use_cache`` (default: on, except under ``CI=true`` or ``NN_KERNELS_NO_CACHE=1``)
    reuses chapters whose cache key is unchanged. ``progress`` gets one line per event
    (``None`` for silence). Raises :class:`Interrupted` on Ctrl-C/SIGTERM, after killing
    every running chapter.
    """
    say = progress or (lambda line: None)
    profile = PROFILE_ALIASES.get(profile, profile)
    specs = load_profile(profile)
    for spec in specs.values():
        spec["parameters"].update(overrides or {})
    chapters = list(chapters)
    missing = [c for c in chapters if c not in specs]
    if missing:
        raise SystemExit(f"no such chapter(s) {missing}; chapters are {sorted(specs)}")
    use_cache = (not cache_disabled()) if use_cache is None else use_cache
    out_dir = Path(out) / profile
    out_dir.mkdir(parents=True, exist_ok=True)

    results: dict[str, Result] = {}
    keys = {c: cache_key(CHAPTERS / f"{c}.ipynb", specs[c]["parameters"], profile) for c in chapters}
    todo = []
    for c in chapters:
        cached = reuse_cached(c, profile, specs[c], out_dir, keys[c], CHAPTERS) if use_cache else None
        if cached is not None:
            results[c] = cached
            say(f"[{c}] unchanged: reusing its executed notebook ({cached.message})")
        else:
            todo.append(c)

    cores = os.cpu_count() or 1
    jobs = max(1, min(jobs or cores, len(todo) or 1, cores))
    # NN_KERNELS_THREADS overrides the split: on a machine shared with other work,
    # 1 thread per chapter avoids OpenMP threads waiting on each other for busy cores.
    # The chapters' nnk_book.setup reads the same variable, then OMP_NUM_THREADS.
    threads = runner_threads(cores, jobs)

    def one(c: str) -> Result:
        lim = limits(specs[c], threads)
        say(f"[{c}] started ({profile}, budget {specs[c]['budget_s']} s; stopped when idle "
            f"{lim['stall_s']:.0f} s, past {lim['cpu_s']:.0f} CPU-s or {lim['hard_limit_s']:.0f} s; "
            f"{threads} thread{'s' if threads > 1 else ''}; log: {out_dir / (c + '.log')})")
        r = run_one(c, profile, specs[c], out_dir, threads, block_network, CHAPTERS,
                    progress=say, key=keys[c])
        say(f"[{c}] {r.status} after {r.seconds:.0f} s ({r.cpu_s:.0f} CPU-s; budget "
            f"{specs[c]['budget_s']} s)"
            + (f": {r.cell + ': ' if r.cell else ''}{r.message}; log: {out_dir / (c + '.log')}"
               if not r.ok else ""))
        return r

    if scheduler and todo:
        for c, r in _run_on_cluster(scheduler, todo, profile, specs, out_dir, block_network,
                                    overrides or {}, say).items():
            results[c] = r
        ordered = [results[c] for c in chapters]
        _write_summary(out_dir, ordered)
        return ordered

    previous = _install_sigterm()
    _LIVE.stop.clear()
    try:
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            futures = {pool.submit(one, c): c for c in todo}
            try:
                for future in as_completed(futures):
                    results[futures[future]] = future.result()
            except KeyboardInterrupt:
                _LIVE.stop.set()
                _LIVE.kill_all()
                for future in futures:
                    future.cancel()
                for future in futures:  # the running ones return within a second
                    if not future.cancelled():
                        results[futures[future]] = future.result()
                ordered = [results[c] for c in chapters if c in results]
                _write_summary(out_dir, ordered)
                running = [r for r in ordered if r.status == "interrupted"]
                say("interrupted: " + (", ".join(
                    f"{r.chapter} (at {r.cell or 'its start'})" for r in running) or "nothing was running"))
                raise Interrupted(ordered) from None
    finally:
        _restore_sigterm(previous)
        _LIVE.stop.clear()
    ordered = [results[c] for c in chapters]
    _write_summary(out_dir, ordered)
    return ordered


def _run_on_cluster(scheduler: str, todo: list[str], profile: str, specs: dict[str, Any],
                    out_dir: Path, block_network: bool, overrides: dict[str, Any],
                    say: Callable[[str], None]) -> dict[str, Result]:
    """Each chapter of ``todo`` as one Dask task (:func:`nnk_book.cluster.run_chapter_job`).

    The workers run this runner for one chapter each, into the same output folder (a
    shared file system), and the chapters' own configurations go to the same cluster. A
    line is printed when a chapter is sent, every ``REPORT_EVERY_S`` while it runs (with
    the cell it is on, read from its log) and when it ends. Ctrl-C stops every chapter.
    """
    from distributed import Client, Event, as_completed

    from nnk_book.cluster import run_chapter_job

    args = [f"--set={k}={json.dumps(v)}" for k, v in overrides.items()]
    args.append("--block-network" if block_network else "--allow-network")
    args += [f"--chapters-dir={CHAPTERS}", f"--profiles={PROFILES}"]
    env = {"NN_KERNELS_DASK_SCHEDULER": scheduler}
    for var in ("NN_KERNELS_RESULTS", "NN_KERNELS_THREADS"):  # the store, and thread counts
        if os.environ.get(var):
            env[var] = os.environ[var]
    stop_name = f"nnk-stop-{os.getpid()}-{time.monotonic_ns()}"
    results: dict[str, Result] = {}
    previous = _install_sigterm()
    with Client(scheduler) as client:
        stop = Event(stop_name)
        futures = {}
        for c in todo:
            say(f"[{c}] sent to the cluster at {scheduler} ({profile}, budget "
                f"{specs[c]['budget_s']} s; log: {out_dir / (c + '.log')})")
            futures[client.submit(run_chapter_job, str(ROOT), c, profile, str(out_dir.parent),
                                  args + [f"--summary-json={out_dir / ('.' + c + '.summary.json')}"],
                                  env, stop_name, pure=False, key=f"chapter-{c}-{stop_name}")] = c
        started = time.perf_counter()
        next_report = REPORT_EVERY_S
        pending = as_completed(futures)
        try:
            while len(results) < len(futures):
                for future in pending.next_batch(block=False) if pending.has_ready() else []:
                    c = futures[future]
                    row = future.result()
                    fields = {f.name for f in dataclasses.fields(Result)}
                    results[c] = Result(**{k: v for k, v in row.items() if k in fields})
                    r = results[c]
                    say(f"[{c}] {r.status} after {r.seconds:.0f} s on {row.get('worker', '?')}"
                        + (f": {r.cell or r.message}" if not r.ok else ""))
                if len(results) < len(futures):
                    time.sleep(0.5)
                    if time.perf_counter() - started >= next_report:
                        next_report += REPORT_EVERY_S
                        for c in todo:
                            if c not in results:
                                n = _current_cell(out_dir / f"{c}.log")
                                sweep = _sweep_status(out_dir / f"{c}.log")
                                say(f"  {c}: {time.perf_counter() - started:.0f} s on the cluster"
                                    + (f", on cell {n}" if n else "") + (f"; {sweep}" if sweep else ""))
        except KeyboardInterrupt:
            stop.set()
            for future, c in futures.items():
                if c in results:
                    continue
                try:
                    row = future.result(timeout=30)
                    fields = {f.name for f in dataclasses.fields(Result)}
                    results[c] = Result(**{k: v for k, v in row.items() if k in fields})
                except Exception:  # noqa: BLE001 - not started, or gone: it did not finish
                    future.cancel()
                    results[c] = Result(c, profile, 0.0, "interrupted", 1,
                                        str(out_dir / f"{c}.ipynb"), "stopped by Ctrl-C / SIGTERM")
            ordered = [results[c] for c in todo]
            _write_summary(out_dir, ordered)
            say("interrupted: " + ", ".join(f"{r.chapter} (at {r.cell or 'its start'})" for r in ordered))
            raise Interrupted(ordered) from None
        finally:
            _restore_sigterm(previous)
    return results


def _write_summary(out_dir: Path, results: list[Result]) -> None:
    atomic_write_text(out_dir / "summary.json",
                      json.dumps([dataclasses.asdict(r) for r in results], indent=2))


def _raise_interrupt(signum: int, frame: Any) -> None:  # noqa: ARG001
    raise KeyboardInterrupt


def _install_sigterm() -> Any:
    """SIGTERM and SIGINT raise KeyboardInterrupt in the main thread while chapters run.

    SIGINT too: a process started in the background by a non-interactive shell (a CI
    script, ``cmd &``) inherits SIGINT ignored, and Python then keeps it ignored, so
    neither Ctrl-C nor ``kill -INT`` would stop the runner.
    """
    if threading.current_thread() is not threading.main_thread():
        return None
    return (signal.signal(signal.SIGTERM, _raise_interrupt),
            signal.signal(signal.SIGINT, signal.default_int_handler))


def _restore_sigterm(previous: Any) -> None:
    if previous is not None:
        signal.signal(signal.SIGTERM, previous[0])
        signal.signal(signal.SIGINT, previous[1])


def parse_overrides(items: Iterable[str]) -> dict[str, Any]:
    """``["use_real_data=false", "seed=1"]`` -> ``{"use_real_data": False, "seed": 1}`` (values as YAML)."""
    out: dict[str, Any] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip().isidentifier():
            raise SystemExit(f"--set expects NAME=VALUE with a Python identifier as NAME, got {item!r}")
        out[name.strip()] = yaml.safe_load(value)
    return out


def describe_failure(r: Result) -> str:
    """'in cell N (...): why' for a chapter that did not run to the end."""
    if r.status == "error":
        return r.cell or r.message
    return (f"in {r.cell}: " if r.cell else "") + r.message


def format_table(results: list[Result]) -> str:
    rows = [("chapter", "profile", "seconds", "CPU-s", "threads", "status")]
    rows += [(r.chapter, r.profile, f"{r.seconds:.1f}", f"{r.cpu_s:.1f}", str(r.threads),
              r.status + (f" ({describe_failure(r)})" if not r.ok else "")) for r in results]
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row[:5], widths)) + "  " + row[5]
             for row in rows]
    lines.insert(1, "-" * max(len(ln) for ln in lines))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("chapters", nargs="*", help="chapter stems (default: all)")
    ap.add_argument("--profile", default="ci", help="profile in book/profiles.yaml (ci, record, paper)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder")
    ap.add_argument("--jobs", type=int, default=None, help="parallel notebooks (default: cores)")
    ap.add_argument("--no-cache", dest="cache", action="store_false", default=None,
                    help="execute every chapter even when nothing it depends on changed")
    net = ap.add_mutually_exclusive_group()
    net.add_argument("--allow-network", dest="block", action="store_false", default=None,
                     help="let notebooks reach the network (full-size fetchers)")
    net.add_argument("--block-network", dest="block", action="store_true",
                     help="refuse non-loopback connections (the default for the ci profile)")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="NAME=VALUE",
                    help="inject a parameter on top of the profile's (VALUE is read as YAML); repeatable")
    ap.add_argument("--scheduler", default=None, metavar="ADDRESS",
                    help="a Dask scheduler (tcp://host:8786): each chapter runs as a job on its "
                         "workers, and the chapters' configurations too (book/guide.md: On a cluster)")
    ap.add_argument("--summary-json", type=Path, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--chapters-dir", type=Path, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--profiles", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    global CHAPTERS, PROFILES
    if args.chapters_dir is not None:  # a cluster job runs the submitter's files
        CHAPTERS = args.chapters_dir.resolve()
    if args.profiles is not None:
        PROFILES = args.profiles.resolve()
    block = (args.profile == "ci") if args.block is None else args.block
    try:
        results = run(args.chapters or chapter_names(), args.profile, args.out, args.jobs,
                      block_network=block, overrides=parse_overrides(args.overrides),
                      use_cache=args.cache, scheduler=args.scheduler)
    except Interrupted as stop:
        print(format_table(stop.results), flush=True)
        return 130
    if args.summary_json is not None:  # one chapter's own row, for nnk_book.cluster
        atomic_write_text(args.summary_json,
                          json.dumps([dataclasses.asdict(r) for r in results], indent=2))
    print(format_table(results))
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
