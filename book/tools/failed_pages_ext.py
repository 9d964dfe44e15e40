"""Sphinx extension staged by build_book.py when a chapter failed to run.

A failed chapter's page is built from its partial (or unexecuted) notebook, with a note
at its top saying where it stopped. Its later cells have no outputs, so references to
their figures and glued values cannot resolve: those warnings, and only those on the
pages listed in ``nnk_failed_pages``, are not counted against the ``-W`` build (they
are shown as info lines and counted in a closing line). Warnings anywhere else still
fail the build.
"""

from __future__ import annotations

import logging
from typing import Any

from docutils import nodes
from sphinx.util import logging as sphinx_logging


class _FailedPageWarnings(logging.Filter):
    def __init__(self, app: Any) -> None:
        super().__init__()
        self.app = app
        self.dropped = 0

    def _docname(self, record: logging.LogRecord) -> str:
        location = getattr(record, "location", None)
        if isinstance(location, tuple):
            return str(location[0] or "")
        if isinstance(location, nodes.Node):
            return str(sphinx_logging.get_node_location(location) or "")
        return str(location or getattr(record, "docname", "") or "")

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        where = self._docname(record)
        for page in self.app.config.nnk_failed_pages:
            if page in where:
                self.dropped += 1
                return False
        return True


def setup(app: Any) -> dict[str, Any]:
    app.add_config_value("nnk_failed_pages", [], "env")
    flt = _FailedPageWarnings(app)
    for handler in logging.getLogger(sphinx_logging.NAMESPACE).handlers:
        if isinstance(handler, sphinx_logging.WarningStreamHandler):
            handler.filters.insert(0, flt)

    def report(app: Any, exc: Exception | None) -> None:  # noqa: ARG001
        if flt.dropped:
            sphinx_logging.getLogger(__name__).info(
                "failed_pages_ext: %d warning(s) on the failed chapters' pages %s not counted",
                flt.dropped, ", ".join(app.config.nnk_failed_pages))

    app.connect("build-finished", report)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
