"""One connection of ``tsg serve`` and the reading and answering of its one request.

The request is parsed by the standard library's ``http.server`` and the WSGI application is
called through ``wsgiref.handlers``; this module only refuses what is ambiguous (a repeated
single header, a transfer coding, a target or value with control bytes) with a fixed answer
that never repeats what was sent, and counts instead of logging. Which connection is read
when, by whom and for how long is :mod:`.server`'s concern.
"""

from __future__ import annotations

import contextlib
import io
import re
import socket
from email.utils import formatdate
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from typing import IO, TYPE_CHECKING, Any, Protocol, cast
from urllib.parse import unquote
from wsgiref.handlers import SimpleHandler
from wsgiref.headers import Headers

from .messages import plain_headers

if TYPE_CHECKING:
    from types import TracebackType
    from wsgiref.types import WSGIApplication

SERVER_NAME = "task-state-guard"
#: Headers that may appear once only (a repeat is how request smuggling starts).
_SINGLE = ("host", "content-length", "authorization", "cookie", "content-type",
           "transfer-encoding")
_TARGET = re.compile(r"/[!-~]*")
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
_LENGTH = re.compile(r"[0-9]{1,18}", re.ASCII)

# The states of a connection.
IDLE, QUEUED, READING, ANSWERING, DONE = range(5)


class Conn:
    """One accepted connection: its socket, its client's address, its deadline and state."""

    __slots__ = ("accepted", "client", "deadline", "linger", "reason", "sock", "state")

    def __init__(self, sock: socket.socket, client: str, now: float, deadline: float) -> None:
        self.sock = sock
        self.client = client
        self.accepted = now
        self.deadline = deadline
        self.state = IDLE
        self.reason: str | None = None  # why it was dropped (counted once)
        self.linger = True


class Owner(Protocol):
    """What a request needs of the server that accepted its connection."""

    app: WSGIApplication
    address: tuple[str, int]

    def count(self, conn: Conn, reason: str) -> None:
        """Count ``conn`` as dropped or refused for ``reason`` (once per connection)."""

    def answering(self, conn: Conn) -> bool:
        """Mark ``conn`` as being answered; False when it timed out or the server stops."""


class _Discard(io.TextIOBase):
    """``wsgi.errors``: written to, never shown (nothing is logged)."""

    def write(self, text: str) -> int:
        return len(text)


def answer(status: int, extra: tuple[tuple[str, str], ...] = ()) -> bytes:
    """A whole plain-text answer of the server's own: the status's phrase, nothing sent."""
    phrase = HTTPStatus(status).phrase
    body = (phrase.lower() + "\n").encode("ascii")
    lines = [
        f"HTTP/1.1 {status} {phrase}",
        f"Server: {SERVER_NAME}",
        f"Date: {formatdate(usegmt=True)}",
        "Content-Type: text/plain; charset=utf-8",
        f"Content-Length: {len(body)}",
        "Connection: close",
        *(f"{name}: {value}" for name, value in (*plain_headers(), *extra)),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


class _Wsgi(SimpleHandler):
    """Calls the application for one request (``wsgiref``), counting instead of logging."""

    os_environ: dict[str, str] = {}
    http_version = "1.1"
    origin_server = True
    server_software = SERVER_NAME
    error_status = "500 Internal Server Error"
    error_headers = [("Content-Type", "text/plain; charset=utf-8"), *plain_headers()]
    error_body = b"error: InternalError\n"
    headers: Headers  # set by start_response

    def __init__(self, handler: RequestHandler, environ: dict[str, Any]) -> None:
        super().__init__(handler.rfile, cast("IO[bytes]", handler.wfile), _Discard(), environ,
                         multithread=True, multiprocess=False)
        self._handler = handler

    def cleanup_headers(self) -> None:
        super().cleanup_headers()
        self.headers["Connection"] = "close"

    def log_exception(
        self,
        exc_info: tuple[type[BaseException], BaseException, TracebackType]
        | tuple[None, None, None],
    ) -> None:
        self._handler.owner.count(self._handler.conn, "internal")

    def _write(self, data: bytes) -> None:
        try:
            super()._write(data)
        except TimeoutError:
            self._handler.owner.count(self._handler.conn, "timeout")
            raise ConnectionAbortedError from None  # ends the request quietly
        except OSError:
            self._handler.owner.count(self._handler.conn, "reset")
            raise ConnectionAbortedError from None


class RequestHandler(BaseHTTPRequestHandler):
    """Reads one request with ``http.server`` and answers it through :class:`_Wsgi`."""

    protocol_version = "HTTP/1.1"
    server_version = SERVER_NAME
    sys_version = ""
    timeout = None  # the socket's own timeout is set before

    def __init__(self, conn: Conn, owner: Owner) -> None:
        self.conn = conn
        self.owner = owner
        self.refused = False
        super().__init__(conn.sock, (conn.client, 0), owner)  # type: ignore[arg-type]

    def version_string(self) -> str:
        return SERVER_NAME

    def log_message(self, format: str, *args: Any) -> None:
        """Nothing is logged."""

    def send_error(self, code: int, message: str | None = None,
                   explain: str | None = None) -> None:
        """A fixed answer: never the request line, a header or a value that was sent."""
        self.owner.count(self.conn, "malformed")
        self.refused = True
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.wfile.write(answer(code))

    def handle(self) -> None:
        self.close_connection = True
        try:
            self.raw_requestline = self.rfile.readline(65537)
            if not self.raw_requestline:
                self.conn.linger = False  # closed without a request: a browser's preconnect
                return
            if len(self.raw_requestline) > 65536:
                self.send_error(414)
                return
            if not self.parse_request():
                if not self.refused:
                    self.send_error(400)  # an empty request line: refused without an answer
                return
            refused = self._refused()
        except TimeoutError:
            self.owner.count(self.conn, "timeout")
            return
        except OSError:
            self.owner.count(self.conn, "reset")
            return
        if refused:
            self.send_error(refused)
            return
        if not self.owner.answering(self.conn):
            return  # timed out meanwhile, or the server is stopping
        _Wsgi(self, self._environ()).run(self.owner.app)

    def _refused(self) -> int:
        """The status a parsed request is refused with (0: none)."""
        if self.request_version not in ("HTTP/1.0", "HTTP/1.1") or not _TARGET.fullmatch(
                self.path):
            return 400  # HTTP/0.9, an absolute or non-ASCII target
        if self.headers.defects or self.headers.get_payload():
            return 400  # a line without a colon, a folded line
        if any(_CONTROL.search(value) for value in self.headers.values()):
            return 400
        for name in _SINGLE:
            if len(self.headers.get_all(name) or ()) > 1:
                return 400
        if "transfer-encoding" in self.headers:
            return 501
        length = self.headers.get("content-length")
        if length is not None and not _LENGTH.fullmatch(length.strip(" \t")):
            return 400
        return 0

    def _environ(self) -> dict[str, Any]:
        path, _, query = self.path.partition("?")
        host, port = self.owner.address
        environ: dict[str, Any] = {
            "REQUEST_METHOD": self.command, "SCRIPT_NAME": "",
            "PATH_INFO": unquote(path, "iso-8859-1"), "QUERY_STRING": query,
            "SERVER_NAME": host, "SERVER_PORT": str(port),
            "SERVER_PROTOCOL": self.request_version, "SERVER_SOFTWARE": SERVER_NAME,
            "GATEWAY_INTERFACE": "CGI/1.1", "REMOTE_ADDR": self.conn.client,
            "CONTENT_TYPE": self.headers.get("content-type", ""),
            "CONTENT_LENGTH": self.headers.get("content-length", "").strip(" \t"),
        }
        for name, value in self.headers.items():
            key = "HTTP_" + name.upper().replace("-", "_")
            if key not in ("HTTP_CONTENT_TYPE", "HTTP_CONTENT_LENGTH"):
                text = value.strip()
                environ[key] = f"{environ[key]},{text}" if key in environ else text
        return environ


__all__ = ["ANSWERING", "DONE", "IDLE", "QUEUED", "READING", "SERVER_NAME", "Conn", "Owner",
           "RequestHandler", "answer"]
