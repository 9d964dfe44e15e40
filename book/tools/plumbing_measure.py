"""How much of the chapters' code is plumbing, and what is repeated between chapters.

    python book/tools/plumbing_measure.py            # every chapter
    python book/tools/plumbing_measure.py --no-duplicates

A code line (blank lines and comments excluded) counts as plumbing when it is

1. inside a top-level function whose name is defined in two or more chapters (a helper
   copied between chapters: it belongs in ``nnk_book``);
2. a ``sys.path`` edit, or a path relative to the chapter (``"../``);
3. a result file read by hand (``json.loads(... read_text ...)``);
4. ipywidgets wiring outside ``nnk_book`` (``widgets.``, ``.observe(``, ``jslink(``).

It prints the share per chapter and overall, then (unless ``--no-duplicates``) runs the
``duplicates`` tool, where installed, over the notebooks' code converted to scripts.
Read-only: it writes nothing but a temporary folder it removes.
"""

from __future__ import annotations

import argparse
import ast
import collections
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PATTERN = re.compile(r'sys\.path|"\.\./|json\.loads\(.*read_text|\bwidgets\.|\.observe\(|jslink\(')


def notebook_code(path: Path) -> str:
    cells = json.loads(path.read_text())["cells"]
    code = "\n\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    # IPython magics and shell escapes are not Python
    return "\n".join("pass" if line.lstrip().startswith(("%", "!")) else line for line in code.splitlines())


def measure(chapters: list[Path]) -> tuple[dict[str, tuple[int, int]], list[str]]:
    """``{chapter: (plumbing lines, code lines)}`` and the names defined in 2+ chapters."""
    codes = {p.stem: notebook_code(p) for p in chapters}
    spans, owners = {}, collections.defaultdict(set)
    for name, code in codes.items():
        spans[name] = [(n.name, n.lineno, n.end_lineno) for n in ast.parse(code).body
                       if isinstance(n, ast.FunctionDef)]
        for fn, *_ in spans[name]:
            owners[fn].add(name)
    shared = sorted(fn for fn, where in owners.items() if len(where) > 1)
    counts = {}
    for name, code in codes.items():
        inside = {i for fn, a, b in spans[name] if fn in shared for i in range(a, b + 1)}
        total = plumbing = 0
        for number, line in enumerate(code.splitlines(), start=1):
            text = line.strip()
            if not text or text.startswith("#"):
                continue
            total += 1
            plumbing += number in inside or bool(PATTERN.search(line))
        counts[name] = (plumbing, total)
    return counts, shared


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--no-duplicates", action="store_true", help="skip the duplicates report")
    args = ap.parse_args(argv)
    chapters = sorted((ROOT / "chapters").glob("*.ipynb"))
    counts, shared = measure(chapters)
    for name, (p, t) in counts.items():
        print(f"{name}: {p} of {t} code lines are plumbing ({100 * p / t:.1f} %)")
    p, t = (sum(v[i] for v in counts.values()) for i in (0, 1))
    print(f"all chapters: {p} of {t} ({100 * p / t:.1f} %)")
    print(f"functions defined in two or more chapters: {', '.join(shared) or 'none'}")
    if not args.no_duplicates and shutil.which("duplicates"):
        with tempfile.TemporaryDirectory() as tmp:
            for path in chapters:
                Path(tmp, path.stem + ".py").write_text(notebook_code(path))
            out = subprocess.run(["duplicates", "--repo", tmp, "--most", "20", "--seconds", "30"],
                                 capture_output=True, text=True).stdout
        print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
