"""Headless Chromium for checking rendered pages (Debian package ``chromium``).

``render`` dumps a page's DOM with the plain binary; ``browser_page`` drives a page with
Playwright (pinned in the test extra) using that same system binary, never a browser
that Playwright would download.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import http.server
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Any, Iterator

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


# --- Driving pages: Playwright with the system Chromium ------------------------------

@dataclasses.dataclass
class PageLog:
    """What a page reported while it loaded and while a test drove it."""

    errors: list[str] = dataclasses.field(default_factory=list)  # console errors, exceptions
    failed: list[str] = dataclasses.field(default_factory=list)  # failed or >= 400 requests

    def problems(self) -> list[str]:
        return self.errors + self.failed


@contextlib.contextmanager
def browser_page(width: int = 1280, height: int = 900) -> Iterator[tuple[Any, PageLog]]:
    """A fresh Chromium page (Playwright, system binary) and the log of its problems.

    Every console message of type "error", every uncaught exception, every request
    that fails and every response with status >= 400 is logged: a clean page logs none.
    """
    from playwright.sync_api import sync_playwright

    binary = chromium()
    if binary is None:
        raise RuntimeError("no Chromium binary found")
    log = PageLog()
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=binary, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": width, "height": height})
            page.on("console", lambda m: m.type == "error" and log.errors.append(
                f"console error: {m.text[:300]} ({m.location.get('url', '')})"))
            page.on("pageerror", lambda e: log.errors.append(f"exception: {str(e)[:300]}"))
            page.on("requestfailed", lambda r: log.failed.append(
                f"request failed: {r.url[:200]} ({r.failure})"))
            page.on("response", lambda r: r.status >= 400 and log.failed.append(
                f"HTTP {r.status}: {r.url[:200]}"))
            yield page, log
        finally:
            browser.close()


def load(page: Any, url: str, settle_ms: int = 1500) -> None:
    """Open ``url`` and wait until the network is idle and the widgets have rendered."""
    page.goto(url, wait_until="networkidle", timeout=120_000)
    page.wait_for_timeout(settle_ms)


def shown_figure(explorer: Any) -> tuple[str, str]:
    """(sha1 of the visible image's bytes, its alt text) inside one figure explorer."""
    images = explorer.locator("img.nnk-figure")
    visible = [images.nth(i) for i in range(images.count()) if images.nth(i).is_visible()]
    if len(visible) != 1:
        raise AssertionError(f"expected one visible figure in the explorer, found {len(visible)}")
    src = visible[0].get_attribute("src") or ""
    return hashlib.sha1(src.encode()).hexdigest(), visible[0].get_attribute("alt") or ""


def explorer_controls(explorer: Any) -> list[tuple[str, Any]]:
    """The controls of one explorer, in order: ("slider"|"dropdown"|"buttons", locator)."""
    controls = []
    boxes = explorer.locator(".widget-hbox").first.locator(":scope > .widget-inline-hbox, :scope > div")
    for i in range(boxes.count()):
        box = boxes.nth(i)
        if box.locator(".noUi-handle").count():
            controls.append(("slider", box))
        elif box.locator("select").count():
            controls.append(("dropdown", box))
        elif box.locator("button").count():
            controls.append(("buttons", box))
    return controls


def control_positions(kind: str, control: Any) -> int:
    """How many positions a control offers."""
    if kind == "slider":
        handle = control.locator(".noUi-handle").first
        return int(float(handle.get_attribute("aria-valuemax") or 0)) + 1
    if kind == "dropdown":
        return control.locator("option").count()
    return control.locator("button").count()


def set_position(page: Any, kind: str, control: Any, position: int) -> None:
    """Move a control to ``position`` the way a reader would (keys, selection, click)."""
    if kind == "slider":
        handle = control.locator(".noUi-handle").first
        handle.focus()
        page.keyboard.press("Home")
        for _ in range(position):
            page.keyboard.press("ArrowRight")
    elif kind == "dropdown":
        control.locator("select").first.select_option(index=position)
    else:
        control.locator("button").nth(position).click()
    page.wait_for_timeout(150)


def current_position(kind: str, control: Any) -> int:
    if kind == "slider":
        return int(float(control.locator(".noUi-handle").first.get_attribute("aria-valuenow") or 0))
    if kind == "dropdown":
        return int(control.locator("select").first.evaluate("s => s.selectedIndex"))
    buttons = control.locator("button")
    for i in range(buttons.count()):
        if "mod-active" in (buttons.nth(i).get_attribute("class") or ""):
            return i
    raise AssertionError("no toggle button is active")


# --- A live JupyterLab ----------------------------------------------------------------

def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def jupyterlab(root_dir: Path, state_dir: Path, extensions: Path,
               env: dict[str, str] | None = None) -> Iterator[str]:
    """A JupyterLab server on a free loopback port; yield its URL with the token.

    Its configuration, data, settings and workspaces live in ``state_dir`` (a user's own
    are not read), autosave is off so that a test never writes into ``root_dir``, and
    ``extensions`` is added to the lab-extension path as ``make lab`` adds it.
    """
    import json
    import os
    import secrets
    import sys
    import time
    import urllib.request

    port, token = _free_port(), secrets.token_hex(16)
    settings = state_dir / "settings" / "@jupyterlab" / "docmanager-extension"
    settings.mkdir(parents=True, exist_ok=True)
    (settings / "plugin.jupyterlab-settings").write_text(json.dumps({"autosave": False}))
    news = state_dir / "settings" / "@jupyterlab" / "apputils-extension"
    news.mkdir(parents=True, exist_ok=True)
    (news / "notification.jupyterlab-settings").write_text(json.dumps({"fetchNews": "false"}))
    server_env = dict(os.environ, **(env or {}),
                      JUPYTER_CONFIG_DIR=str(state_dir / "config"),
                      JUPYTER_DATA_DIR=str(state_dir / "data"),
                      JUPYTER_RUNTIME_DIR=str(state_dir / "runtime"),
                      JUPYTERLAB_SETTINGS_DIR=str(state_dir / "settings"),
                      JUPYTERLAB_WORKSPACES_DIR=str(state_dir / "workspaces"))
    command = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
               f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root_dir}",
               f"--LabApp.extra_labextensions_path={extensions}"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        command.append("--allow-root")
    log = open(state_dir / "server.log", "w")
    server = subprocess.Popen(command, env=server_env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=5).read()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"JupyterLab did not start: see {state_dir / 'server.log'}")
                time.sleep(0.5)
        yield f"{base}/lab/tree/{{path}}?token={token}"
    finally:
        server.terminate()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


def run_all_cells(page: Any) -> None:
    """Run every cell of the open notebook from the menu, as a reader would."""
    page.click('.lm-MenuBar-itemLabel:text-is("Run")')
    page.click('.lm-Menu-itemLabel:text-is("Run All Cells")')


def wait_until_idle(page: Any, timeout_s: float, quiet_s: float = 5.0) -> None:
    """Wait until the open notebook's kernel has been idle for ``quiet_s`` with no cell queued.

    A queued or running cell shows ``[*]`` in its prompt (collapsed cells show no prompt,
    hence the kernel status too; it is idle for a moment between two cells, hence the quiet
    period).
    """
    page.wait_for_function(
        """(quietMs) => {
            const status = document.querySelector('.jp-Notebook-ExecutionIndicator');
            const prompts = [...document.querySelectorAll('.jp-Notebook .jp-InputArea-prompt')];
            const busy = !status || status.getAttribute('data-status') !== 'idle'
                || prompts.some(p => p.textContent.includes('*'));
            const now = Date.now();
            if (busy) { window.__nnkIdleSince = undefined; return false; }
            if (window.__nnkIdleSince === undefined) window.__nnkIdleSince = now;
            return now - window.__nnkIdleSince >= quietMs;
        }""", arg=quiet_s * 1000, timeout=timeout_s * 1000, polling=500)
