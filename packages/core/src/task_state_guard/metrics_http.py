"""A read-only HTTP endpoint serving ``tsg metrics`` (standard library ``http.server``).

The core's only module with network code: imported only by ``tsg metrics --serve`` (never by
``import task_state_guard`` or any other command), and the privacy audit allows it here alone.

``GET /metrics`` opens the ledger read-only, reads a fresh status, closes it and answers the
text exposition; every other path is 404, every other method 501. Requests are served one at
a time (a scrape never runs beside another), nothing is logged, and the endpoint never writes
the ledger. An error answers 503 with the error's category only (no path, no id, no text).
"""

from __future__ import annotations

import ipaddress
import signal
import socket
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, HTTPServer
from urllib.parse import urlsplit

from .metrics import CONTENT_TYPE
from .model import InvalidInput, LedgerError

#: Renders one scrape (raises a ``LedgerError`` when the ledger cannot be read).
Render = Callable[[], str]
#: Names an error's category for the 503 body.
Categorize = Callable[[LedgerError], str]


class _Server(HTTPServer):
    def __init__(self, address: tuple[str, int], render: Render, categorize: Categorize) -> None:
        self.address_family = (
            socket.AF_INET6 if ipaddress.ip_address(address[0]).version == 6 else socket.AF_INET
        )
        self.render = render
        self.categorize = categorize
        super().__init__(address, _Handler)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    server_version = "task-state-guard"
    sys_version = ""

    def do_GET(self) -> None:
        if urlsplit(self.path).path != "/metrics":
            self._send(404, "not found\n", "text/plain; charset=utf-8")
            return
        try:
            body = self.server.render()
        except LedgerError as exc:
            self._send(503, f"error: {self.server.categorize(exc)}\n", "text/plain; charset=utf-8")
            return
        except Exception:
            self._send(503, "error: InternalError\n", "text/plain; charset=utf-8")
            return
        self._send(200, body, CONTENT_TYPE)

    def _send(self, code: int, text: str, content_type: str) -> None:
        data = text.encode("utf-8")
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        """Log nothing (client addresses and paths stay out of the process's output)."""


def bind(listen: tuple[str, int], render: Render, categorize: Categorize) -> HTTPServer:
    """Bind the endpoint (``serve_forever()`` runs it); an address in use is ``InvalidInput``."""
    try:
        return _Server(listen, render, categorize)
    except OSError:
        raise InvalidInput("cannot listen on that address") from None




class _Stop(BaseException):  # not an Exception: a request in progress cannot swallow it
    pass


def run(server: HTTPServer) -> None:
    """Serve until SIGTERM or SIGINT, then close the socket."""

    def stop(signum: int, frame: object) -> None:
        raise _Stop()

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        server.serve_forever()
    except _Stop:
        pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        server.server_close()


__all__ = ["bind", "run"]
