"""Run a snippet of Python in a child process, so that a crash (SIGSEGV, SIGFPE) of the
compiled kernels fails the test that provoked it instead of killing pytest."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]


def run_isolated(code: str, *, timeout: float = 300, env: Optional[dict] = None) -> subprocess.CompletedProcess:
    """Run ``code`` (dedented) with this interpreter in the repository root.

    Returns the completed process; :func:`describe` turns a crash into a readable message.
    """
    full_env = dict(os.environ, OMP_NUM_THREADS="1", **(env or {}))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT, env=full_env)


def describe(proc: subprocess.CompletedProcess) -> str:
    """'killed by SIGSEGV' or 'exit status 1', plus the end of stderr."""
    if proc.returncode < 0:
        how = f"killed by {signal.Signals(-proc.returncode).name}"
    else:
        how = f"exit status {proc.returncode}"
    return f"{how}\n--- stdout\n{proc.stdout[-2000:]}\n--- stderr\n{proc.stderr[-3000:]}"
