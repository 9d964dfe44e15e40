"""Shared fixtures: the headless ci-profile run of every chapter, done once per session.

The chapters run through the book's one execution path, ``book/tools/run_chapters.py``,
into ``_build/executed/ci`` (the folder ``make book`` builds from), with its cache: a
chapter whose code, parameters and package sources are unchanged since its last
successful run there is not executed again (CI, a clean checkout with ``CI=true``,
always executes). While the chapters run, the runner's progress lines go straight to
the terminal. While working on one chapter, NN_KERNELS_TEST_CHAPTERS=05_lookupffn
(comma-separated stems) executes only those chapters (the other chapters' regression
tests skip), and NN_KERNELS_EXECUTED_OUT=/tmp/somewhere keeps the run apart.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ROOT / "book" / "tools"

import run_chapters  # book/tools is on pytest's pythonpath (pyproject.toml)

EXECUTED_OUT = Path(os.environ.get("NN_KERNELS_EXECUTED_OUT") or run_chapters.DEFAULT_OUT)
_RUN_RESULTS: list = []


def selected_chapters() -> list[str]:
    """Chapters the session executes: all, or those named in NN_KERNELS_TEST_CHAPTERS."""
    every = run_chapters.chapter_names()
    wanted = [c.strip() for c in os.environ.get("NN_KERNELS_TEST_CHAPTERS", "").split(",") if c.strip()]
    unknown = sorted(set(wanted) - set(every))
    if unknown:
        raise pytest.UsageError(f"NN_KERNELS_TEST_CHAPTERS names unknown chapters {unknown}; have {every}")
    return wanted or every


@pytest.fixture(scope="session")
def executed_chapters(request) -> dict[str, "run_chapters.Result"]:
    """Run every chapter with the ci profile (network blocked); map chapter -> Result."""
    capture = request.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():
        print("\nexecuting the chapters (ci profile); progress below, logs in "
              f"{EXECUTED_OUT / 'ci'}", flush=True)
        results = run_chapters.run(selected_chapters(), "ci", out=EXECUTED_OUT, block_network=True)
    _RUN_RESULTS[:] = results
    return {r.chapter: r for r in results}


@pytest.fixture(scope="session")
def executed_dir(executed_chapters) -> Path:
    return EXECUTED_OUT / "ci"


def pytest_terminal_summary(terminalreporter, exitstatus, config):  # noqa: ARG001
    if _RUN_RESULTS:
        terminalreporter.section("chapters executed (ci profile)")
        terminalreporter.write_line(run_chapters.format_table(_RUN_RESULTS))
