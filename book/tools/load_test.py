"""Run chapters while their core is busy: correct chapters pass, a hang is still named.

    python book/tools/load_test.py                        # the hang check and 01_ntk
    python book/tools/load_test.py --chapters 06_mlp_fusion 07_ffn_replacements
    python book/tools/load_test.py --chapters none        # only the hang check (~1 min)

The runner, its chapters and ``--competitors`` busy loops (default 2) are pinned to one
core (``os.sched_setaffinity``, as ``taskset`` does), so a chapter gets a third of that
core: a machine three times busier than the reference. Two checks, each with its own
budget (see run_chapters.py):

1. a tiny synthetic notebook whose cell sleeps for ever is stopped as ``hung``, with
   the cell named, within ``--stall`` seconds of its last progress (about a minute);
2. each chapter of ``--chapters`` runs with its ``ci`` profile, one thread, no cache,
   and must pass (01_ntk: about 70 CPU-s, so about 4 min at a third of a core).

Exits 0 when both hold; prints each chapter's wall and CPU time. ``make test-load``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import run_chapters  # noqa: E402


def _hang_notebook(folder: Path) -> None:
    import nbformat
    from nbformat.v4 import new_code_cell, new_notebook

    cells = [new_code_cell("n = 1"), new_code_cell("print('before the hang')"),
             new_code_cell("import threading\nthreading.Event().wait()  # waits for ever")]
    cells[0].metadata["tags"] = ["parameters"]
    nb = new_notebook(cells=cells, metadata={"kernelspec": {
        "name": "python3", "display_name": "Python 3", "language": "python"}})
    nbformat.write(nb, str(folder / "hang.ipynb"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--chapters", nargs="*", default=["01_ntk"],
                    help="chapters to run under load ('none' for only the hang check)")
    ap.add_argument("--core", type=int, default=None, help="the core to share (default: the last)")
    ap.add_argument("--competitors", type=int, default=2, help="busy loops on that core (2 = 3x busier)")
    ap.add_argument("--stall", type=float, default=20.0, help="stall_s of the hang check")
    ap.add_argument("--out", type=Path, default=None, help="folder for executed notebooks and logs")
    args = ap.parse_args(argv)
    chapters = [c for c in args.chapters if c != "none"]
    core = args.core if args.core is not None else max(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {core})  # inherited by papermill, its kernel and the loops
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
             for _ in range(args.competitors)]
    out = args.out or Path(tempfile.mkdtemp(prefix="nnk-load-"))
    ok = True
    try:
        print(f"load_test: core {core} shared with {len(loops)} busy loop(s); output in {out}", flush=True)
        src = out / "synthetic"
        src.mkdir(parents=True, exist_ok=True)
        _hang_notebook(src)
        hang = run_chapters.run_one("hang", "ci", {"budget_s": 300, "stall_s": args.stall, "parameters": {}},
                                    out / "hang", threads=1, chapters_dir=src, progress=print)
        named = hang.status == "hung" and hang.cell.startswith("cell 3")
        ok &= named
        print(f"load_test: hang check {'passed' if named else 'FAILED'}: {hang.status} after "
              f"{hang.seconds:.0f} s, {run_chapters.describe_failure(hang)}", flush=True)
        specs = run_chapters.load_profile("ci")
        for chapter in chapters:
            start = time.perf_counter()
            r = run_chapters.run_one(chapter, "ci", specs[chapter], out / "ci", threads=1, progress=print)
            ok &= r.ok
            print(f"load_test: {chapter} {'passed' if r.ok else 'FAILED'} under load: {r.status}, "
                  f"{time.perf_counter() - start:.0f} s wall, {r.cpu_s:.0f} CPU-s (budget "
                  f"{specs[chapter]['budget_s']} s)"
                  + ("" if r.ok else f": {run_chapters.describe_failure(r)}"), flush=True)
    except KeyboardInterrupt:
        print("load_test: interrupted", flush=True)
        return 130
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
