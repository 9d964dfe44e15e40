"""Sphinx extension: a static book that loads nothing it does not serve itself.

sphinx-thebe (a default extension of Jupyter Book 1) adds a script that declares
``const THEBE_JS_URL`` to every page, and adds it twice when Jupyter Book reads the
sources twice, which raises "Identifier 'THEBE_JS_URL' has already been declared" in
every page's console. Its only use is live code through Binder, which this book does
not offer (it has no launch buttons: its pages are read as they are, and chapters are
run locally, see the README). This extension removes sphinx-thebe's event handlers,
so neither the script nor its configuration block reaches the pages.
"""

from __future__ import annotations

from typing import Any


def _drop_thebe(app: Any) -> None:
    for handlers in app.events.listeners.values():
        handlers[:] = [h for h in handlers
                       if getattr(h.handler, "__module__", "") != "sphinx_thebe"]


def setup(app: Any) -> dict[str, Any]:
    # builder-inited runs after every extension has connected its handlers.
    app.connect("builder-inited", _drop_thebe, priority=0)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
