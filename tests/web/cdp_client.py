"""A small Chrome DevTools Protocol client: headless Chromium from the system's packages,
driven over its websocket (``websockets``' synchronous client).

``Chromium(tmp)`` starts ``chromium`` as the CI machine runs it (as root: ``--no-sandbox``;
no background networking, component updates, sync or QUIC, which a closed network refuses)
with a fresh profile under ``tmp``; ``browser.page()`` opens a tab that records every request
it makes (``page.requests``).
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from websockets.sync.client import ClientConnection, connect

FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-default-apps", "--disable-extensions", "--no-default-browser-check",
    "--hide-scrollbars", "--mute-audio",
)
_LISTENING = re.compile(r"DevTools listening on (ws://\S+)")


def chromium_path() -> str | None:
    """The system's Chromium (Debian's ``chromium`` package), or None."""
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    return None


class CdpError(AssertionError):
    """A DevTools command failed, or an expected event did not come."""


class Chromium:
    """One headless Chromium process and the websocket to its browser target."""

    def __init__(self, tmp: Path, *, width: int = 1280, height: int = 900) -> None:
        exe = chromium_path()
        if exe is None:
            raise CdpError("chromium is not installed (scripts/dev.py test installs it: "
                           "apt-get install -y chromium chromium-driver)")
        profile = tmp / "chromium-profile"
        profile.mkdir(parents=True, exist_ok=True)
        self.log_path = tmp / "chromium.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            [exe, *FLAGS, f"--user-data-dir={profile}", "--remote-debugging-port=0",
             f"--window-size={width},{height}", "about:blank"],
            stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.width, self.height = width, height
        url = self._devtools_url(profile)
        self._stack = contextlib.ExitStack()
        self.ws: ClientConnection = self._stack.enter_context(
            connect(url, max_size=64 * 1024 * 1024, open_timeout=30))
        self._ids = itertools.count(1)
        self._events: list[dict[str, Any]] = []

    def _devtools_url(self, profile: Path) -> str:
        deadline = time.monotonic() + 60
        port_file = profile / "DevToolsActivePort"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise CdpError(f"chromium exited: {self.log_path.read_text(errors='replace')}")
            match = _LISTENING.search(self.log_path.read_text(errors="replace"))
            if match:
                return match.group(1)
            if port_file.exists():
                lines = port_file.read_text().split()
                if len(lines) == 2:
                    return f"ws://127.0.0.1:{lines[0]}{lines[1]}"
            time.sleep(0.1)
        raise CdpError("chromium did not open its DevTools port")

    # ------------------------------------------------------------------ protocol
    def call(self, method: str, params: dict[str, Any] | None = None,
             session: str | None = None, timeout: float = 60.0) -> dict[str, Any]:
        """Send one command and wait for its answer (events meanwhile are kept)."""
        ident = next(self._ids)
        message: dict[str, Any] = {"id": ident, "method": method, "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        self.ws.send(json.dumps(message))
        deadline = time.monotonic() + timeout
        while True:
            data = self._receive(deadline, method)
            if data.get("id") == ident:
                if "error" in data:
                    raise CdpError(f"{method}: {data['error']}")
                return dict(data.get("result", {}))
            if "method" in data:
                self._events.append(data)

    def _receive(self, deadline: float, what: str) -> dict[str, Any]:
        left = deadline - time.monotonic()
        if left <= 0:
            raise CdpError(f"no answer to {what}")
        try:
            raw = self.ws.recv(timeout=left)
        except TimeoutError:
            raise CdpError(f"no answer to {what}") from None
        return dict(json.loads(raw))

    def wait_event(self, method: str, session: str | None, timeout: float = 60.0) -> dict[str, Any]:
        """The next event ``method`` of ``session`` (earlier ones are consumed first)."""
        deadline = time.monotonic() + timeout
        while True:
            for index, event in enumerate(self._events):
                if event["method"] == method and event.get("sessionId") == session:
                    del self._events[index]
                    return event
            data = self._receive(deadline, method)
            if "method" in data:
                self._events.append(data)

    def drain(self, session: str) -> list[dict[str, Any]]:
        """Take the events of ``session`` received so far (reads what is already queued)."""
        with contextlib.suppress(TimeoutError):
            while True:
                data = json.loads(self.ws.recv(timeout=0.05))
                if "method" in data:
                    self._events.append(data)
        mine = [e for e in self._events if e.get("sessionId") == session]
        self._events = [e for e in self._events if e.get("sessionId") != session]
        return mine

    def page(self) -> Page:
        """A new tab, attached, with Page, Network and Runtime events on."""
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})[
            "sessionId"]
        page = Page(self, session)
        for domain in ("Page", "Network", "Runtime", "Log"):
            self.call(f"{domain}.enable", session=session)
        self.call("Emulation.setDeviceMetricsOverride", {
            "width": self.width, "height": self.height, "deviceScaleFactor": 1,
            "mobile": False}, session=session)
        return page

    def close(self) -> None:
        """Close the websocket and stop the browser (its whole process group)."""
        with contextlib.suppress(Exception):
            self._stack.close()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self._log.close()


class Page:
    """One tab: navigate, read its text, take screenshots; ``requests`` lists every URL it
    requested (documents, sub-resources, redirects, prefetches), ``log`` what the browser
    reported about it (a refused script or style, a failed load)."""

    def __init__(self, browser: Chromium, session: str) -> None:
        self.browser = browser
        self.session = session
        self.requests: list[str] = []
        self.log: list[str] = []

    def _collect(self) -> None:
        for event in self.browser.drain(self.session):
            if event["method"] == "Network.requestWillBeSent":
                self.requests.append(event["params"]["request"]["url"])
            elif event["method"] == "Log.entryAdded":
                entry = event["params"]["entry"]
                self.log.append(f"{entry.get('level')}: {entry.get('text')}")

    def call(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        """A command to this tab."""
        return self.browser.call(method, params, session=self.session)

    def goto(self, url: str) -> None:
        """Load ``url`` and wait for its load event."""
        result = self.call("Page.navigate", {"url": url})
        if result.get("errorText"):
            raise CdpError(f"navigation failed: {result['errorText']}")
        self.browser.wait_event("Page.loadEventFired", self.session)
        self._collect()

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (works with page scripts off)."""
        result = self.call("Runtime.evaluate", {"expression": expression,
                                                "returnByValue": True})
        if "exceptionDetails" in result:
            raise CdpError(f"evaluate failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    def text(self) -> str:
        """The page's visible text (``innerText`` of the body)."""
        return str(self.evaluate("document.body.innerText"))

    def url(self) -> str:
        """The address of the document shown."""
        return str(self.evaluate("location.href"))

    def click(self, selector: str) -> None:
        """Follow the link (or submit the button) ``selector`` names, and wait for the load."""
        box = self.evaluate(
            f"(function(){{var e=document.querySelector({json.dumps(selector)});"
            "if(!e)return null;e.scrollIntoView();var r=e.getBoundingClientRect();"
            "return [r.left+r.width/2,r.top+r.height/2];})()")
        if box is None:
            raise CdpError(f"nothing matches {selector}")
        for kind in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", {"type": kind, "x": box[0], "y": box[1],
                                                   "button": "left", "clickCount": 1})
        self.browser.wait_event("Page.loadEventFired", self.session)
        self._collect()

    def type_into(self, selector: str, text: str) -> None:
        """Focus ``selector`` and type ``text`` as keystrokes."""
        self.evaluate(f"document.querySelector({json.dumps(selector)}).focus()")
        self.call("Input.insertText", {"text": text})

    def scripts(self, enabled: bool) -> None:
        """Turn the page's own JavaScript on or off (DevTools' evaluation keeps working)."""
        self.call("Emulation.setScriptExecutionDisabled", {"value": not enabled})

    def screenshot(self, path: Path) -> Path:
        """Save the whole page as a PNG."""
        data = self.call("Page.captureScreenshot", {"format": "png",
                                                    "captureBeyondViewport": True})["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    def settle(self, seconds: float) -> None:
        """Let ``seconds`` pass while collecting the page's requests (for refresh checks)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            time.sleep(0.1)
            self._collect()


__all__ = ["CdpError", "Chromium", "Page", "chromium_path"]
