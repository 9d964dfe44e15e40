"""Build tiny notebooks for the platform's own tests."""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook


def write_notebook(path: Path, cells: list[tuple[str, str] | tuple[str, str, list[str]]]) -> Path:
    """Write a notebook of ``(kind, source[, tags])`` cells; kind is "md" or "code"."""
    nb_cells = []
    for cell in cells:
        kind, source, tags = (*cell, [])[:3]
        made = new_markdown_cell(source) if kind == "md" else new_code_cell(source)
        if tags:
            made.metadata["tags"] = list(tags)
        nb_cells.append(made)
    nb = new_notebook(cells=nb_cells, metadata={
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(path))
    return path
