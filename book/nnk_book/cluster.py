"""Chapters as independent jobs on a Dask cluster (``run_chapters.py --scheduler ADDRESS``).

Each chapter the runner sends out becomes one Dask task, :func:`run_chapter_job`, which
starts the book's own runner for that one chapter on the worker (``run_chapters.py
--jobs 1 --no-cache``), with the same profile, parameters, budget and output folder, and
returns the runner's summary row. The worker must see the repository and the output
folder at the same paths as the submitting machine (a shared file system, as on any
SLURM cluster; trivially so for a ``LocalCluster``), and have the project's environment.

While the chapter runs, the task leaves its worker's thread slot (``distributed.secede``),
so the configurations the chapter itself sends to the cluster through
:func:`nnk_book.store.sweep` can use that worker too: two chapters on two single-thread
workers do not wait on each other. Ctrl-C on the submitting machine sets a Dask ``Event``
that every running job watches; each kills its chapter's process group within a second.
A worker that dies mid-chapter makes the scheduler run the job again elsewhere; the
chapter's stored configurations (:mod:`nnk_book.store`) are then skipped.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

#: The runner script, relative to the repository root.
RUNNER = Path("book") / "tools" / "run_chapters.py"


def run_chapter_job(root: str, chapter: str, profile: str, out: str, args: list[str],
                    env: dict[str, str], stop_event: str | None = None) -> dict[str, Any]:
    """Run one chapter with the book's runner on this (worker) machine; return its summary row.

    ``root`` is the repository, ``out`` the output folder (``--out``), ``args`` further
    runner arguments (``--set``, ``--block-network``), ``env`` variables to set for it
    (the store's folder, the scheduler address for the chapter's own configurations).
    ``stop_event`` names a ``distributed.Event``; once it is set the chapter is killed.
    """
    cmd = [sys.executable, str(Path(root) / RUNNER), "--profile", profile, "--out", out,
           "--jobs", "1", "--no-cache", *args, chapter]
    full_env = {**os.environ, **env}
    event = None
    try:
        from distributed import Event, secede

        secede()
        if stop_event:
            event = Event(stop_event)
    except (ImportError, ValueError):  # not inside a Dask task: run as a plain function
        pass
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=root, env=full_env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True, text=True)
    stopped = False
    try:
        while True:
            try:
                proc.wait(timeout=1.0)
                break
            except subprocess.TimeoutExpired:
                pass
            if event is not None and event.is_set():
                stopped = True
                _kill(proc.pid)
                proc.wait()
                break
    finally:
        _kill(proc.pid)
    tail = (proc.stdout.read() if proc.stdout else "")[-4000:]
    row: dict[str, Any] = {"chapter": chapter, "profile": profile,
                           "seconds": round(time.perf_counter() - start, 1),
                           "status": "interrupted" if stopped else "error", "threads": 1,
                           "output": str(Path(out) / profile / f"{chapter}.ipynb"),
                           "message": "stopped by Ctrl-C / SIGTERM" if stopped else tail[-300:],
                           "cell": ""}
    summary = next((a.split("=", 1)[1] for a in args if a.startswith("--summary-json=")),
                   str(Path(out) / profile / "summary.json"))
    if not stopped:
        try:
            rows = json.loads(Path(summary).read_text())
            found = [r for r in rows if r.get("chapter") == chapter]
            if found:
                row = found[0]
        except (OSError, ValueError):
            pass
    row["worker"] = _worker_address()
    return row


def _kill(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _worker_address() -> str:
    try:
        from distributed import get_worker

        return str(get_worker().address)
    except Exception:  # noqa: BLE001 - not on a worker
        return "local"
