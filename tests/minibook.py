"""A two-page book built with the project's own ``_config.yml``, for platform tests."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import vendor_assets
import yaml

from nbfactory import write_notebook

ROOT = Path(__file__).resolve().parents[1]
JUPYTER_BOOK = str(Path(sys.executable).with_name("jupyter-book"))


def make_book(dest: Path, cells: list) -> Path:
    """Write a book whose only chapter is a notebook with ``cells``."""
    shutil.copytree(ROOT / "book" / "_static", dest / "book" / "_static",
                    ignore=shutil.ignore_patterns("vendor"))
    shutil.copy2(ROOT / "_config.yml", dest / "_config.yml")
    shutil.copy2(ROOT / "book" / "references.bib", dest / "book" / "references.bib")
    shutil.copytree(ROOT / "book" / "_ext", dest / "book" / "_ext")
    vendor_assets.vendor()  # MathJax and the widget manager, fetched once from npm
    shutil.copytree(vendor_assets.VENDOR, dest / "book" / "_static" / "vendor")
    (dest / "book" / "bibliography.md").write_text("# Bibliography\n\n```{bibliography}\n```\n")
    (dest / "book" / "intro.md").write_text("# Mini book\n\nA page.\n")
    toc = {"format": "jb-book", "root": "book/intro",
           "chapters": [{"file": "chapters/page"}, {"file": "book/bibliography"}]}
    (dest / "_toc.yml").write_text(yaml.safe_dump(toc))
    write_notebook(dest / "chapters" / "page.ipynb", [("md", "# Page"), *cells])
    return dest


def build(book: Path) -> subprocess.CompletedProcess:
    """Build exactly as the project does: -W -n --keep-going."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.run([JUPYTER_BOOK, "build", str(book), "-W", "-n", "--keep-going"],
                          capture_output=True, text=True, env=env)
