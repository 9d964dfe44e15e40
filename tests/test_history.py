"""History stays in git: no comment or docstring of the repository's code and configuration
names an issue number, a rename, or the date something was done or measured.

A comment says what the code does and why; when it changed and under which issue is what
``git log`` and ``git blame`` answer, and a date in a comment is out of date the next time the
code moves. Data (a record's ``"recorded"`` field, a test's fake date) is not a comment and is
not checked.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: What history looks like in a comment.
HISTORY = re.compile(
    r"\bissues?\s*#?\s*s?\d+\b"               # issue 31, issue s7, issues 14
    r"|\(issue\b"                             # (issue goal)
    r"|\b20\d\d-\d\d-\d\d\b"                  # 2026-11-28
    r"|\bwas renamed\b|\brenamed from\b|\bformerly\b|\bused to be called\b|\bwas called\b",
    re.IGNORECASE,
)

#: Folders of code and configuration (vendored third-party files, records and results are data).
CODE_DIRS = ("kernels", "data_scripts", "book", "benchmarks", "tests", ".ci")
SKIP_PARTS = {"vendor", "runs", "results", "__pycache__", "_build", "node_modules"}
SUFFIXES = {".py", ".yaml", ".yml", ".toml", ".cpp", ".h", ".sh", ".js", ".css"}
TOP_FILES = ("Makefile", "pyproject.toml", "_config.yml", "_toc.yml", "environment.yml")


def code_files() -> list[Path]:
    files = [ROOT / name for name in TOP_FILES if (ROOT / name).exists()]
    for folder in CODE_DIRS:
        for path in sorted((ROOT / folder).rglob("*")):
            rel = path.relative_to(ROOT)
            if path.is_file() and (path.suffix in SUFFIXES or path.name == "run") \
                    and not SKIP_PARTS & set(rel.parts):
                files.append(path)
    return files


def python_comments(text: str) -> list[tuple[int, str]]:
    """Comments and docstrings of a Python source, with their first line numbers."""
    out = [(tok.start[0], tok.string) for tok in tokenize.generate_tokens(io.StringIO(text).readline)
           if tok.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                out.append((body[0].lineno, body[0].value.value))
    return out


def hash_comments(text: str) -> list[tuple[int, str]]:
    """``#`` comments of YAML, TOML, shell and Makefiles: a ``#`` at a line's start or after a space."""
    return [(i, m.group(0)) for i, line in enumerate(text.splitlines(), 1)
            for m in [re.search(r"(?:^|\s)#.*$", line)] if m]


def slash_comments(text: str) -> list[tuple[int, str]]:
    """``//`` and ``/* */`` comments of C++, JavaScript and CSS."""
    out = []
    for m in re.finditer(r"//[^\n]*|/\*.*?\*/", text, re.S):
        out.append((text.count("\n", 0, m.start()) + 1, m.group(0)))
    return out


def comments(path: Path) -> list[tuple[int, str]]:
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".py":
        return python_comments(text)
    if path.suffix in {".cpp", ".h", ".js", ".css"}:
        return slash_comments(text)
    return hash_comments(text)


def test_the_scanner_finds_history_and_only_in_comments() -> None:
    src = 'x = "issue 31, 2026-11-28"  # fine\n# measured 2026-11-28\ndef f():\n    """As issue 14 asked."""\n'
    found = [line for line, c in python_comments(src) if HISTORY.search(c)]
    assert found == [2, 4]
    assert [n for n, c in hash_comments('a: "#1 issue 3"\nb: 2  # renamed from c\n') if HISTORY.search(c)] == [2]
    assert [n for n, c in slash_comments("int a; // Issue 15\n/* 2026-01-02 */\n") if HISTORY.search(c)] == [1, 2]
    assert not HISTORY.search("the issue of scale; 64 tissues; 2026 was")


@pytest.mark.parametrize("folder", CODE_DIRS + ("top",))
def test_no_history_in_comments(folder: str) -> None:
    files = [p for p in code_files()
             if (p.relative_to(ROOT).parts[0] == folder if folder != "top" else p.parent == ROOT)]
    assert files or folder == ".ci", f"no files found under {folder}"
    found = [f"{p.relative_to(ROOT)}:{line}: {HISTORY.search(c).group(0)!r}"
             for p in files if p.resolve() != Path(__file__).resolve()
             for line, c in comments(p) if HISTORY.search(c)]
    assert not found, "history in comments (git keeps it; say what and why instead):\n" + "\n".join(found)
