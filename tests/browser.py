"""Headless Chromium for checking rendered pages (Debian package ``chromium``)."""

from __future__ import annotations

import contextlib
import functools
import http.server
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Iterator

FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--hide-scrollbars", "--mute-audio",
]


def chromium() -> str | None:
    """Path of a Chromium/Chrome binary, or None."""
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


@contextlib.contextmanager
def serve(directory: Path) -> Iterator[str]:
    """Serve ``directory`` on a free loopback port; yield the base URL."""
    handler = functools.partial(_QuietHandler, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # noqa: D401 - silence request logs
        pass


def render(url: str, screenshot: Path | None = None, budget_ms: int = 20000) -> str:
    """Load ``url``, let its scripts run for ``budget_ms`` of virtual time, return the DOM."""
    binary = chromium()
    if binary is None:
        raise RuntimeError("no Chromium binary found")
    with tempfile.TemporaryDirectory() as profile:
        base = [binary, *FLAGS, f"--user-data-dir={profile}",
                f"--virtual-time-budget={budget_ms}", "--window-size=1280,4000"]
        dom = subprocess.run([*base, "--dump-dom", url], capture_output=True, text=True,
                             timeout=180).stdout
        if screenshot is not None:
            subprocess.run([*base, f"--screenshot={screenshot}", url], capture_output=True,
                           timeout=180)
    return dom
