"""A tiny dependency-free Chrome DevTools Protocol client over ``--remote-debugging-pipe``.

Opens a local HTML file in headless Chromium, collects console errors, uncaught
exceptions, failed loads (Log errors) and JavaScript dialogs (an executed
``alert`` would show up here), evaluates expressions and takes screenshots.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")


def find_browser() -> str | None:
    env = os.environ.get("GMTS_BROWSER")
    if env and shutil.which(env):
        return shutil.which(env)
    for name in CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    return None


class Browser:
    """``with Browser() as b: page = b.open(path)``; see :meth:`open`."""

    def __init__(self, binary: str | None = None, width: int = 1280, height: int = 1600, timeout: float = 60.0):
        self.binary = binary or find_browser()
        if self.binary is None:
            raise RuntimeError("no chromium binary found")
        self.width, self.height, self.timeout = width, height, timeout
        self._id = 0
        self._buf = b""
        self.events: list[dict] = []

    def __enter__(self) -> Browser:
        self._profile = tempfile.mkdtemp(prefix="gmts-chromium-")
        cmd_r, cmd_w = os.pipe()  # we write commands, chromium reads fd 3
        out_r, out_w = os.pipe()  # chromium writes fd 4, we read
        hi_cmd_r = fcntl.fcntl(cmd_r, fcntl.F_DUPFD, 10)
        hi_out_w = fcntl.fcntl(out_w, fcntl.F_DUPFD, 10)
        os.close(cmd_r)
        os.close(out_w)

        def child_fds() -> None:
            os.dup2(hi_cmd_r, 3)
            os.dup2(hi_out_w, 4)

        args = [
            self.binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--disable-extensions", "--disable-dev-shm-usage", "--remote-debugging-pipe",
            f"--user-data-dir={self._profile}", f"--window-size={self.width},{self.height}", "about:blank",
        ]
        self.proc = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=child_fds, pass_fds=(3, 4, hi_cmd_r, hi_out_w),  # noqa: PLW1509 (fds 3 and 4 need dup2)
        )
        os.close(hi_cmd_r)
        os.close(hi_out_w)
        self._w, self._r = cmd_w, out_r
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.send("Browser.close", timeout=5)
        except (OSError, RuntimeError, TimeoutError):  # already gone
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._w, self._r):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self._profile, ignore_errors=True)

    # -- protocol
    def _read_message(self, deadline: float) -> dict:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("chromium did not answer in time")
            ready, _, _ = select.select([self._r], [], [], left)
            if ready:
                chunk = os.read(self._r, 1 << 20)
                if not chunk:
                    raise RuntimeError("chromium closed the pipe")
                self._buf += chunk
        msg, self._buf = self._buf.split(b"\0", 1)
        return json.loads(msg)

    def send(self, method: str, params: dict | None = None, session: str | None = None, timeout: float | None = None) -> dict:
        self._id += 1
        msg: dict[str, Any] = {"id": self._id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            m = self._read_message(deadline)
            if m.get("id") == self._id:
                if "error" in m:
                    raise RuntimeError(f"{method}: {m['error']}")
                return m.get("result", {})
            self._event(m)

    def _event(self, m: dict) -> None:
        self.events.append(m)
        if m.get("method") == "Page.javascriptDialogOpening":  # never leave a dialog blocking the page
            os.write(self._w, json.dumps({"id": 10**9 + len(self.events), "method": "Page.handleJavaScriptDialog",
                                          "params": {"accept": True}, "sessionId": m.get("sessionId")}).encode() + b"\0")

    def wait_event(self, method: str, timeout: float | None = None) -> dict:
        for m in self.events:
            if m.get("method") == method:
                return m
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            m = self._read_message(deadline)
            if "id" in m:
                continue
            self._event(m)
            if m.get("method") == method:
                return m

    # -- a page
    def open(self, path: str | os.PathLike) -> Page:
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for m in ("Page.enable", "Runtime.enable", "Log.enable"):
            self.send(m, session=session)
        self.send("Emulation.setDeviceMetricsOverride",
                  {"width": self.width, "height": self.height, "deviceScaleFactor": 1, "mobile": False}, session=session)
        self.events.clear()
        self.send("Page.navigate", {"url": Path(path).resolve().as_uri()}, session=session)
        self.wait_event("Page.loadEventFired")
        return Page(self, session)


class Page:
    def __init__(self, browser: Browser, session: str):
        self.b, self.session = browser, session

    def eval(self, expr: str) -> Any:
        r = self.b.send("Runtime.evaluate", {"expression": expr, "returnByValue": True, "awaitPromise": True},
                        session=self.session)
        if "exceptionDetails" in r:
            raise RuntimeError(f"evaluate {expr!r}: {r['exceptionDetails'].get('text')}")
        return r["result"].get("value")

    def problems(self) -> list[str]:
        """Console errors, uncaught exceptions, error log entries and dialogs seen so far."""
        self.eval("0")  # flush pending events
        out = []
        for m in self.b.events:
            meth, p = m.get("method"), m.get("params", {})
            if meth == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                out.append("console.error: " + " ".join(str(a.get("value", a.get("description"))) for a in p.get("args", [])))
            elif meth == "Runtime.exceptionThrown":
                d = p.get("exceptionDetails", {})
                out.append("uncaught: " + str(d.get("exception", {}).get("description") or d.get("text")))
            elif meth == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                e = p["entry"]
                out.append(f"log error ({e.get('source')}): {e.get('text')} {e.get('url', '')}")
            elif meth == "Page.javascriptDialogOpening":
                out.append(f"dialog opened: {p.get('type')} {p.get('message')!r}")
        return out

    def screenshot(self, path: str | os.PathLike, y: float = 0, height: float | None = None) -> Path:
        """PNG of the page from ``y`` (CSS pixels) over ``height`` (default: the viewport)."""
        clip = {"x": 0, "y": y, "width": self.b.width, "height": height or self.b.height, "scale": 1}
        r = self.b.send("Page.captureScreenshot", {"format": "png", "clip": clip, "captureBeyondViewport": True},
                        session=self.session)
        p = Path(path)
        p.write_bytes(base64.b64decode(r["data"]))
        return p
