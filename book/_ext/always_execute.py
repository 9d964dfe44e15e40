"""Sphinx extension: treat every notebook as changed on every build.

Sphinx re-reads only documents whose source changed since the last build, so with
``execute_notebooks: force`` an unchanged notebook would still keep its old outputs on
a rebuild. This marks all notebooks outdated, so each build executes them again and a
chapter that has started to fail (say, after a change in ``kernels``) fails the build.
"""

from __future__ import annotations

from typing import Any


def _all_notebooks(app: Any, env: Any, added: set, changed: set, removed: set) -> list[str]:
    return [doc for doc in env.found_docs
            if env.doc2path(doc, base=False).endswith(".ipynb") and doc not in added | changed]


def setup(app: Any) -> dict[str, Any]:
    app.connect("env-get-outdated", _all_notebooks)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
