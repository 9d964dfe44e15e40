"""Read the values a chapter recorded with ``myst_nb.glue`` from an executed notebook."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import nbformat

_NUMPY_SCALAR = re.compile(r"^np\.(?:float|int|uint|bool_?)\d*\((.*)\)$")


def _parse(text: str) -> Any:
    """Turn the ``text/plain`` repr of a glued value back into a Python value."""
    text = text.strip()
    m = _NUMPY_SCALAR.match(text)
    if m:  # numpy 2 reprs scalars as np.float64(0.5)
        text = m.group(1)
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text.strip("'\"")


def read_glued(path: str | Path) -> dict[str, Any]:
    """Map each glued name to its value (the last glue wins, as in myst-nb)."""
    nb = nbformat.read(str(path), as_version=4)
    values: dict[str, Any] = {}
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            meta = out.get("metadata", {}).get("scrapbook")
            if not meta:
                continue
            key = meta.get("mime_prefix", "") + "text/plain"
            if key in out.get("data", {}):
                values[meta["name"]] = _parse(out["data"][key])
    return values


def glued_names(path: str | Path) -> list[str]:
    """Every glued name in execution order, repeats included (myst-nb warns on a repeat)."""
    nb = nbformat.read(str(path), as_version=4)
    return [
        out["metadata"]["scrapbook"]["name"]
        for cell in nb.cells
        for out in cell.get("outputs", [])
        if out.get("metadata", {}).get("scrapbook")
    ]
