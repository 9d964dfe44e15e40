"""Small timing helpers shared by the ``bench_*.py`` scripts.

What they measure, so that every benchmark reports the same thing:

* **time**: the median of ``repeats`` wall-clock runs (``time.perf_counter``) after one
  warm-up call; the warm-up (which includes any JIT compilation) is timed and reported
  on its own. Implementations that are compared are timed *interleaved* (one run of
  each per round), so that load from other processes on a shared machine hits all of
  them alike.
* **peak memory**: measured in a fresh subprocess per implementation: after the
  warm-up call, the kernel's resident-set high-water mark is reset
  (``/proc/self/clear_refs``) and one more call is made; the figure is the peak RSS
  during that call minus the RSS just before it (MiB), i.e. the extra resident memory
  the call needs, its output included. The subprocess runs with
  ``MALLOC_MMAP_THRESHOLD_`` fixed so that large buffers freed by the warm-up are
  returned to the kernel instead of being recycled invisibly. Linux only; elsewhere
  the figure is ``None``.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

#: This package's folder (``benchmarks/``).
BENCHMARKS_DIR = Path(__file__).resolve().parent
RESULTS_DIR = BENCHMARKS_DIR / "results"

__all__ = [
    "RESULTS_DIR",
    "cpu_name",
    "machine_info",
    "time_interleaved",
    "summarize",
    "onednn_dense_ffn",
    "native_libraries",
    "module_bytes",
    "peak_memory_of_call",
    "peak_memory_workers",
    "run_worker",
    "write_results",
    "markdown_table",
]


def cpu_name() -> str:
    """CPU model from ``/proc/cpuinfo`` (falls back to ``platform.processor()``)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()} ({os.cpu_count()} logical cores)"
    except OSError:
        pass
    return f"{platform.processor() or platform.machine()} ({os.cpu_count()} logical cores)"


def native_libraries() -> str:
    """The BLAS and OpenMP libraries loaded in this process, as ``threadpoolctl`` sees them.

    e.g. ``"openblas 0.3.30 (Haswell, 2 threads); openmp (libgomp, 2 threads)"``.
    """
    try:
        from threadpoolctl import threadpool_info
    except ImportError:  # pragma: no cover - scikit-learn depends on it
        return "unknown (threadpoolctl not installed)"
    import numpy  # noqa: F401 - load numpy's BLAS so that it is listed
    import torch  # noqa: F401 - and torch's OpenMP

    parts = []
    for lib in threadpool_info():
        detail = ", ".join(str(x) for x in (lib.get("architecture"), f"{lib.get('num_threads')} threads") if x)
        name = lib.get("internal_api", "?") + (f" {lib['version']}" if lib.get("version") else "")
        parts.append(f"{name} ({detail})")
    return "; ".join(sorted(set(parts))) or "none found"


def machine_info(**versions: str) -> dict[str, Any]:
    """The ``machine`` record of a results file, the same keys in every benchmark.

    CPU model and logical cores, torch threads, the BLAS/OpenMP libraries and their
    thread counts (``threadpoolctl``), 1-minute load average at the start, torch version,
    then ``versions`` (other libraries' versions, or notes), then the date.
    """
    import torch

    info: dict[str, Any] = {
        "cpu": cpu_name(),
        "torch_threads": torch.get_num_threads(),
        "native_libraries": native_libraries(),
        "load_average_1min": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
        "torch": torch.__version__,
    }
    info.update(versions)
    info["date"] = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return info


def time_interleaved(
    fns: dict[str, Callable[[], Any]], repeats: int, *, pause_s: float = 0.0
) -> dict[str, dict[str, float]]:
    """Time several zero-argument callables, interleaved round by round.

    Each callable must block until its result is ready (e.g. call
    ``block_until_ready`` on JAX outputs). ``pause_s`` seconds of idle time (not
    measured) precede every timed call, so that the worker threads of the previous
    implementation (OpenMP, XLA's pool), which spin for a while after their work, are
    asleep when the next one starts. Returns, per name, ``first_s`` (the warm-up call,
    compilation included), and over ``repeats`` rounds ``median_s``, ``min_s``, the
    quartiles ``q1_s`` and ``q3_s`` and the interquartile range ``iqr_s`` (the spread
    reported beside each median).
    """
    out: dict[str, dict[str, float]] = {}
    for name, fn in fns.items():
        if pause_s > 0:
            time.sleep(pause_s)
        t0 = time.perf_counter()
        fn()
        out[name] = {"first_s": time.perf_counter() - t0}
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            if pause_s > 0:
                time.sleep(pause_s)
            t0 = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - t0)
    for name, values in samples.items():
        out[name].update(summarize(values))
    return out


def summarize(values: Sequence[float]) -> dict[str, float]:
    """``median_s``, ``min_s``, quartiles ``q1_s``/``q3_s`` and ``iqr_s`` of timed rounds."""
    if not values:
        raise ValueError("values must hold at least one timing")
    if len(values) >= 2:
        q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    else:
        q1 = q3 = values[0]
    return {"median_s": statistics.median(values), "min_s": min(values),
            "q1_s": q1, "q3_s": q3, "iqr_s": q3 - q1}


def onednn_dense_ffn(w1: Any, b1: Any, w2: Any, b2: Any, x: Any) -> Optional[Callable[[], Any]]:
    """A dense GELU FFN ``gelu(x w1^T + b1) w2^T + b2`` (``nn.Linear`` layouts: ``w1``
    ``(hidden, d)``, ``w2`` ``(d, hidden)``; exact-erf GELU) on oneDNN's inner product with
    the GELU fused into the first product, as a zero-argument callable on ``x`` ``(..., d)``.

    The dense anchor of the FFN benchmarks: torch's public float32 paths (eager and
    ``torch.compile``) run their GEMMs on the BLAS torch was built with (OpenBLAS here,
    about half of oneDNN's rate on this CPU), so a replacement's speedup over torch's FFN
    is not its speedup over the fastest dense FFN a user could run. The op,
    ``torch.ops.mkldnn._linear_pointwise``, is private: this returns ``None`` when it is
    missing, fails, or disagrees with the same FFN in plain torch on a probe of 64 rows
    (relative 1e-4), and every caller then reports the anchor as not available.
    """
    try:
        import torch
        import torch.nn.functional as F

        op = torch.ops.mkldnn._linear_pointwise
        w1c, w2c = w1.detach().contiguous(), w2.detach().contiguous()
        b1c, b2c = b1.detach().contiguous(), b2.detach().contiguous()
        d = w1c.shape[1]
        flat = x.detach().reshape(-1, d).contiguous()
        shape = tuple(x.shape[:-1]) + (w2c.shape[0],)

        def ffn() -> Any:
            return op(op(flat, w1c, b1c, "gelu", [], "none"), w2c, b2c, "none", [], "").view(shape)

        with torch.no_grad():
            probe = flat[:64]
            want = F.linear(F.gelu(F.linear(probe, w1c, b1c)), w2c, b2c)
            got = op(op(probe, w1c, b1c, "gelu", [], "none"), w2c, b2c, "none", [], "")
        scale = float(want.abs().max()) or 1.0
        if got.shape != want.shape or float((got - want).abs().max()) > 1e-4 * scale:
            return None
        return ffn
    except (RuntimeError, AttributeError, TypeError, ValueError, IndexError):
        return None


def _status_mib(key: str) -> Optional[float]:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


def peak_memory_of_call(fn: Callable[[], Any]) -> Optional[float]:
    """Extra peak RSS (MiB) of one call of ``fn`` after a warm-up call (see module doc).

    Meant to run in a fresh process (:func:`run_worker`). Returns ``None`` where
    ``/proc`` is unavailable or the high-water mark cannot be reset.
    """
    import gc

    fn()  # warm-up: compilation, caches, allocator pools
    gc.collect()
    before = _status_mib("VmRSS")
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")  # reset VmHWM to the current RSS
    except OSError:
        return None
    result = fn()
    peak = _status_mib("VmHWM")
    del result
    if before is None or peak is None:
        return None
    return max(peak - before, 0.0)


def limit_cpus(threads: int) -> str:
    """Pin this process (every thread it has, and every thread and child process it starts
    later) to ``threads`` of its CPUs with ``os.sched_setaffinity``; return a description
    for the machine record.

    Thread settings are requests, not limits: XLA's CPU runtime used a second core at times
    although ``XLA_FLAGS`` asked for one thread (its process CPU time exceeded its wall
    time, and its dense FFN ran above one core's peak GFLOP/s). Pinning makes "1 thread"
    true for every library in the comparison. With ``threads`` at least the number of
    CPUs available nothing is changed.
    """
    if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
        raise ValueError(f"threads must be an integer >= 1, got {threads!r}")
    if not hasattr(os, "sched_setaffinity"):
        return "not pinned (this platform has no sched_setaffinity)"
    cpus = sorted(os.sched_getaffinity(0))
    if threads >= len(cpus):
        return f"all {len(cpus)} CPUs"
    chosen = set(cpus[:threads])
    tasks = Path("/proc/self/task")
    tids = [int(t.name) for t in tasks.iterdir()] if tasks.is_dir() else [0]
    for tid in tids:  # the calling thread's affinity alone would leave existing pool threads free
        try:
            os.sched_setaffinity(tid, chosen)
        except (ProcessLookupError, PermissionError):
            pass
    os.sched_setaffinity(0, chosen)
    return f"pinned to CPU {', '.join(str(c) for c in sorted(chosen))} (os.sched_setaffinity)"


def run_worker(
    script: Path,
    args: Sequence[str],
    env: Optional[dict[str, str]] = None,
    *,
    for_memory: bool = False,
) -> Any:
    """Run ``python script *args`` in a fresh process; its last stdout line is JSON. A
    script of this package runs as its module (``python -m benchmarks.<name>``, the
    repository root on ``PYTHONPATH``), so that its ``benchmarks._harness`` import works.

    ``for_memory=True`` fixes glibc's mmap threshold so that big buffers are mmapped and
    given back on free (see module doc). Timing workers keep the default allocator
    behaviour: a fixed threshold makes every large temporary a fresh mmap with page
    faults, which would distort the times.
    """
    full_env = dict(os.environ)
    if for_memory:
        full_env["MALLOC_MMAP_THRESHOLD_"] = str(1 << 20)
    full_env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    if env:
        full_env.update(env)
    command = [sys.executable, str(script), *args]
    script = Path(script)
    if script.resolve().parent == BENCHMARKS_DIR:
        command = [sys.executable, "-m", f"benchmarks.{script.stem}", *args]
        full_env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(BENCHMARKS_DIR.parent), full_env.get("PYTHONPATH", "")) if p)
    proc = subprocess.run(
        command,
        capture_output=True,
        text=True,
        env=full_env,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"worker {script.name} {' '.join(args)} failed ({proc.returncode}):\n"
            f"{proc.stderr[-3000:]}"
        )
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    return json.loads(lines[-1])


def module_bytes(module: Any, buffers: bool = True) -> int:
    """Bytes of a module's parameters (and, unless ``buffers`` is false, its buffers): the
    weights a model holds, beside the per-call peak of :func:`peak_memory_of_call`."""
    tensors = list(module.parameters()) + (list(module.buffers()) if buffers else [])
    return sum(t.numel() * t.element_size() for t in tensors)


def peak_memory_workers(script: Path, args_by_name: dict[str, list[str]]) -> dict[str, Optional[float]]:
    """Peak memory of several calls, each measured by ``script`` in a fresh process
    (:func:`run_worker` with ``for_memory=True``; the worker prints ``{"peak_mb": ...}``,
    from :func:`peak_memory_of_call`): ``{name: MiB}``, ``None`` (with a line on stderr)
    for a worker that failed, so that a missing figure never stops a benchmark."""
    out: dict[str, Optional[float]] = {}
    for name, args in args_by_name.items():
        try:
            out[name] = run_worker(script, args, for_memory=True)["peak_mb"]
        except (RuntimeError, KeyError, ValueError) as exc:
            print(f"memory worker {name} ({' '.join(args)}) failed: {exc}", file=sys.stderr)
            out[name] = None
    return out


def markdown_table(
    rows: Sequence[dict[str, Any]],
    *,
    size_key: Optional[str] = None,
    fastest: bool = False,
    memory: bool = True,
    ms_decimals: int = 1,
) -> str:
    """Rows of a results file as a GitHub markdown table.

    Columns: case, [``size_key``], shape, ours, ours time, reference, ref time, speedup
    (ref/ours), [speedup of fastest runs], [ours peak MiB, ref peak MiB], goal, met. The
    optional ones: ``size_key`` names a row key (e.g. ``"n"``) shown as its own column
    after the case; ``fastest`` adds the rows' ``speedup_of_min``; ``memory=False``
    drops the two peak-memory columns (with them, a row without ``*_peak_mb`` shows
    "n/a"). Times under one second are printed in ms with ``ms_decimals`` decimals.
    Rows without a goal leave "goal" and "met" empty. A row with ``ours_iqr_s`` /
    ``ref_iqr_s`` shows the interquartile range beside the median.
    """

    def fmt_s(v: float, iqr: Optional[float] = None) -> str:
        text = f"{v * 1e3:.{ms_decimals}f} ms" if v < 1 else f"{v:.2f} s"
        if iqr is not None:  # the interquartile range of the timed rounds
            text += f" (IQR {iqr * 1e3:.{ms_decimals}f} ms)" if v < 1 else f" (IQR {iqr:.2f} s)"
        return text

    def fmt_mb(v: Optional[float]) -> str:
        return "n/a" if v is None else f"{v:.0f}"

    header = ["case"] + ([size_key] if size_key else [])
    header += ["shape", "ours", "ours time", "reference", "ref time", "speedup (ref/ours)"]
    header += ["speedup of fastest runs"] if fastest else []
    header += ["ours peak MiB", "ref peak MiB"] if memory else []
    header += ["goal", "met"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        goal = r.get("goal") or ""
        met = ("yes" if r.get("goal_met") else "**NO**") if goal else ""
        cells = [str(r["case"])] + ([str(r[size_key])] if size_key else [])
        cells += [str(r["shape"]), str(r["ours"]), fmt_s(r["ours_s"], r.get("ours_iqr_s")), str(r["ref"])]
        cells += [fmt_s(r["ref_s"], r.get("ref_iqr_s")), f"{r['speedup']:.2f}x"]
        cells += [f"{r['speedup_of_min']:.2f}x"] if fastest else []
        if memory:
            cells += [fmt_mb(r.get("ours_peak_mb")), fmt_mb(r.get("ref_peak_mb"))]
        cells += [goal, met]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_results(
    name: str,
    machine: dict[str, Any],
    rows: list[dict[str, Any]],
    notes: str,
    out_dir: Path = RESULTS_DIR,
) -> tuple[Path, Path]:
    """Write ``<name>.json`` (``{"benchmark", "machine", "rows"}``) and ``<name>.md``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"bench_{name}"
    json_path = out_dir / f"{stem}.json"
    md_path = out_dir / f"{stem}.md"
    payload = {"benchmark": name, "machine": machine, "rows": rows}
    _atomic_write(json_path, json.dumps(payload, indent=2) + "\n")
    header = [
        f"# Benchmark `{name}`",
        "",
        "Machine: " + ", ".join(f"{k}: {v}" for k, v in machine.items()),
        "",
        markdown_table(rows),
        "",
        notes.strip(),
        "",
    ]
    _atomic_write(md_path, "\n".join(header))
    return json_path, md_path


def _atomic_write(path: Path, text: str) -> None:
    from nnk_book.files import atomic_write_text

    atomic_write_text(path, text)
