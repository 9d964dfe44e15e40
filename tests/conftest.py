"""Shared fixtures: the headless ci-profile run of every chapter, done once per session.

Set NN_KERNELS_REUSE_EXECUTED=1 to reuse the executed notebooks of a previous test run
(``_build/test-executed/ci``) while iterating on the checks; CI never sets it.
While working on one chapter, NN_KERNELS_TEST_CHAPTERS=05_lookupffn (comma-separated
stems) executes only those chapters (the other chapters' regression tests skip), and
NN_KERNELS_EXECUTED_OUT=/tmp/somewhere keeps the run apart from other runs.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ROOT / "book" / "tools"
sys.path.insert(0, str(TOOLS))

import run_chapters  # noqa: E402

EXECUTED_OUT = Path(os.environ.get("NN_KERNELS_EXECUTED_OUT") or ROOT / "_build" / "test-executed")
_RUN_RESULTS: list = []


def _reuse() -> list | None:
    summary = EXECUTED_OUT / "ci" / "summary.json"
    if os.environ.get("NN_KERNELS_REUSE_EXECUTED") != "1" or not summary.exists():
        return None
    rows = json.loads(summary.read_text())
    return [run_chapters.Result(**row) for row in rows]


def selected_chapters() -> list[str]:
    """Chapters the session executes: all, or those named in NN_KERNELS_TEST_CHAPTERS."""
    every = run_chapters.chapter_names()
    wanted = [c.strip() for c in os.environ.get("NN_KERNELS_TEST_CHAPTERS", "").split(",") if c.strip()]
    unknown = sorted(set(wanted) - set(every))
    if unknown:
        raise pytest.UsageError(f"NN_KERNELS_TEST_CHAPTERS names unknown chapters {unknown}; have {every}")
    return wanted or every


@pytest.fixture(scope="session")
def executed_chapters() -> dict[str, "run_chapters.Result"]:
    """Run every chapter with the ci profile (network blocked); map chapter -> Result."""
    results = _reuse() or run_chapters.run(
        selected_chapters(), "ci", out=EXECUTED_OUT, block_network=True)
    _RUN_RESULTS[:] = results
    return {r.chapter: r for r in results}


@pytest.fixture(scope="session")
def executed_dir(executed_chapters) -> Path:
    return EXECUTED_OUT / "ci"


def pytest_terminal_summary(terminalreporter, exitstatus, config):  # noqa: ARG001
    if _RUN_RESULTS:
        terminalreporter.section("chapters executed (ci profile)")
        terminalreporter.write_line(run_chapters.format_table(_RUN_RESULTS))
