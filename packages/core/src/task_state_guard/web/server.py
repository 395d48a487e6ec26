"""The bounded server that runs the WSGI application of ``tsg serve`` (standard library only).

The core's only module with network code: imported only by ``tsg serve`` and its alias
``tsg metrics --serve`` (never by ``import task_state_guard`` or another command); the privacy
audit allows sockets here alone. HTTP is parsed by the standard library's ``http.server``
and the application is called through ``wsgiref.handlers``; this module only decides which
connection is read when, by whom, and for how long.

* One thread (the caller's) accepts connections and watches them until their first bytes
  arrive: an idle client costs one socket, never a thread. At most ``max_connections`` are
  held at once (beyond that a new one is answered ``503`` at once, counted ``overload``), and
  at most ``per_client`` from one IP address: a client at its cap that connects again closes
  its own oldest idle connection (counted ``overload``), so one client cannot starve others.
* A fixed pool of ``workers`` threads reads and answers the connections that sent something
  (at most ``queued`` wait for a worker; beyond that ``503``). Each socket operation times out
  after ``io_timeout``; the request must have arrived ``read_timeout`` seconds after the
  connection was accepted, and its response must be sent ``write_timeout`` seconds after
  that, or the connection is shut down (counted ``timeout``). Every response closes its
  connection (after a short linger, so a client never loses its response to a reset).
* Nothing is logged. A client that resets, a malformed request (answered 4xx/5xx with a fixed
  body that never repeats what was sent) and an error of the application (answered ``500``)
  are counted by reason (:class:`~task_state_guard.web.app.Counters`).
* SIGTERM or SIGINT stops it: the listening socket and every connection not being answered
  close at once; requests being answered get up to ``stop_grace`` seconds to finish.
"""

from __future__ import annotations

import contextlib
import errno
import io
import ipaddress
import queue
import re
import selectors
import signal
import socket
import threading
import time
from email.utils import formatdate
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from typing import IO, TYPE_CHECKING, Any, cast
from urllib.parse import unquote
from wsgiref.handlers import SimpleHandler
from wsgiref.headers import Headers

from .. import reasons as r
from ..model import InvalidInput
from .app import Counters, plain_headers

if TYPE_CHECKING:
    from types import TracebackType
    from wsgiref.types import WSGIApplication

SERVER_NAME = "task-state-guard"
#: How long a connection may linger half-closed after its response, and how many may at once.
LINGER_SECONDS = 2.0
MAX_LINGERING = 256
#: Headers that may appear once only (a repeat is how request smuggling starts).
_SINGLE = ("host", "content-length", "authorization", "cookie", "content-type",
           "transfer-encoding")
_TARGET = re.compile(r"/[!-~]*")
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
_LENGTH = re.compile(r"[0-9]{1,18}", re.ASCII)

_NEVER = float("inf")
# The states of a connection.
_IDLE, _QUEUED, _READING, _ANSWERING, _DONE = range(5)


class _Conn:
    """One accepted connection: its socket, its client's address, its deadline and state."""

    __slots__ = ("accepted", "client", "deadline", "linger", "reason", "sock", "state")

    def __init__(self, sock: socket.socket, client: str, now: float, deadline: float) -> None:
        self.sock = sock
        self.client = client
        self.accepted = now
        self.deadline = deadline
        self.state = _IDLE
        self.reason: str | None = None  # why it was dropped (counted once)
        self.linger = True


class _Discard(io.TextIOBase):
    """``wsgi.errors``: written to, never shown (nothing is logged)."""

    def write(self, text: str) -> int:
        return len(text)


def _answer(status: int, extra: tuple[tuple[str, str], ...] = ()) -> bytes:
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

    def __init__(self, handler: _Handler, environ: dict[str, Any]) -> None:
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


class _Handler(BaseHTTPRequestHandler):
    """Reads one request with ``http.server`` and answers it through :class:`_Wsgi`."""

    protocol_version = "HTTP/1.1"
    server_version = SERVER_NAME
    sys_version = ""
    timeout = None  # the socket's own timeout is set before

    def __init__(self, conn: _Conn, owner: HttpServer) -> None:
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
            self.wfile.write(_answer(code))

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


#: The reason of a listening address the system refused, by ``errno`` (else ``listen_failed``).
_LISTEN_REASONS = {
    errno.EADDRINUSE: r.ADDRESS_IN_USE,
    errno.EADDRNOTAVAIL: r.ADDRESS_NOT_AVAILABLE,
    errno.EACCES: r.LISTEN_NOT_PERMITTED,
    errno.EPERM: r.LISTEN_NOT_PERMITTED,
}


class HttpServer:
    """The listening socket, its accept loop, its worker pool and its counters (see the
    module's docstring); ``app`` is any WSGI application."""

    def __init__(
        self,
        listen: tuple[str, int],
        app: WSGIApplication,
        *,
        workers: int = 8,
        queued: int = 32,
        max_connections: int = 256,
        per_client: int = 32,
        read_timeout: float = 10.0,
        write_timeout: float = 30.0,
        io_timeout: float = 10.0,
        stop_grace: float = 5.0,
        counters: Counters | None = None,
    ) -> None:
        host, port = listen
        family = socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._listener.bind((host, port))
            self._listener.listen(128)
            self._listener.setblocking(False)
        except OSError as exc:
            self._listener.close()
            reason = _LISTEN_REASONS.get(exc.errno or 0, r.LISTEN_FAILED)
            raise InvalidInput("cannot listen on that address", reason=reason) from None
        name = self._listener.getsockname()
        self.address: tuple[str, int] = (str(name[0]), int(name[1]))
        self.app = app
        self.counters = counters if counters is not None else Counters()
        self.max_connections = max_connections
        self.per_client = per_client
        self.read_timeout = read_timeout
        self.write_timeout = write_timeout
        self.io_timeout = io_timeout
        self.stop_grace = stop_grace
        self._conns: dict[socket.socket, _Conn] = {}  # every connection but lingering ones
        self._lingering: dict[socket.socket, float] = {}
        self._jobs: queue.Queue[_Conn | None] = queue.Queue(queued)
        self._finished: queue.SimpleQueue[_Conn] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._answered = threading.Condition(self._lock)
        self._stopping = threading.Event()
        self._closed = False
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_w.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ)
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._threads = [
            threading.Thread(target=self._work, name=f"tsg-serve-{n}", daemon=True)
            for n in range(workers)
        ]
        for thread in self._threads:
            thread.start()

    # ------------------------------------------------------------------ shared with workers
    def count(self, conn: _Conn, reason: str) -> None:
        """Count ``conn`` under ``reason``, once per connection (the first reason wins)."""
        with self._lock:
            if conn.reason is None:
                conn.reason = reason
                self.counters.add(reason)

    def answering(self, conn: _Conn) -> bool:
        """A worker read ``conn``'s request: its response is due within ``write_timeout``.
        False when it is to be dropped instead (timed out, or the server is stopping)."""
        with self._lock:
            if conn.reason is not None or self._stopping.is_set():
                return False
            conn.state = _ANSWERING
            conn.deadline = time.monotonic() + self.write_timeout
            return True

    # ------------------------------------------------------------------ the accept loop
    def serve_until_signal(self) -> None:
        """Serve until SIGTERM or SIGINT (or :meth:`stop`), then :meth:`close`."""

        def on_signal(signum: int, frame: object) -> None:
            self.stop()

        previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
        # A signal may land on a worker thread; the wake socket then still wakes the loop, so
        # the handler runs in this thread instead of waiting for the next connection.
        wakeup = signal.set_wakeup_fd(self._wake_w.fileno(), warn_on_full_buffer=False)
        try:
            self._loop()
        finally:
            signal.set_wakeup_fd(wakeup)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self.close()

    def stop(self) -> None:
        """Ask the loop to return (safe from a signal handler or another thread)."""
        self._stopping.set()
        self._wake()

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # a full wake socket is already awake
            self._wake_w.send(b"x")

    def _loop(self) -> None:
        while not self._stopping.is_set():
            with self._lock:  # a connection already shut down has no deadline (infinite)
                deadlines = [c.deadline for c in self._conns.values() if c.deadline < _NEVER]
            deadlines += self._lingering.values()
            wait = None if not deadlines else max(0.0, min(deadlines) - time.monotonic())
            for key, _events in self._selector.select(wait):
                sock = key.fileobj
                if sock is self._listener:
                    self._accept()
                elif sock is self._wake_r:
                    with contextlib.suppress(OSError):
                        self._wake_r.recv(4096)
                elif sock in self._lingering:
                    self._drain(sock)
                elif isinstance(sock, socket.socket):
                    self._dispatch(sock)
            self._take_finished()
            self._expire()

    def _accept(self) -> None:
        while not self._stopping.is_set():
            try:
                sock, peer = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return  # e.g. the client reset before accept, or out of descriptors for now
            sock.setblocking(False)
            client = str(peer[0])
            now = time.monotonic()
            with self._lock:
                mine = [c for c in self._conns.values() if c.client == client]
                idle = [c for c in mine if c.state == _IDLE]
                evict = min(idle, key=lambda c: c.accepted) if (
                    len(mine) >= self.per_client and idle) else None
                refuse = evict is None and (len(mine) >= self.per_client
                                            or len(self._conns) >= self.max_connections)
                if evict is not None:  # the client's oldest idle connection makes room
                    self._forget(evict, "overload")
                if not refuse:
                    self._conns[sock] = _Conn(sock, client, now, now + self.read_timeout)
            if refuse:
                self.counters.add("overload")
                self._refuse(sock)
            else:
                self._selector.register(sock, selectors.EVENT_READ)

    def _forget(self, conn: _Conn, reason: str) -> None:
        """Close an idle connection the loop watches (with the lock held), counted."""
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(conn.sock)
        self._conns.pop(conn.sock, None)
        if conn.reason is None:
            conn.reason = reason
            self.counters.add(reason)
        conn.state = _DONE
        conn.sock.close()

    def _dispatch(self, sock: socket.socket) -> None:
        """An idle connection sent something: a worker reads it (503 when the queue is full)."""
        with contextlib.suppress(KeyError, ValueError):  # closed earlier in this round
            self._selector.unregister(sock)
        with self._lock:
            conn = self._conns.get(sock)
            if conn is None:
                return
            conn.state = _QUEUED
        try:
            self._jobs.put_nowait(conn)
        except queue.Full:
            with self._lock:
                self._conns.pop(sock, None)
                conn.state = _DONE
            self.counters.add("overload")
            self._refuse(sock)

    def _expire(self) -> None:
        """Drop the connections past their deadline: idle and queued ones are closed here;
        those a worker holds are shut down, and the worker ends them."""
        now = time.monotonic()
        with self._lock:
            for conn in [c for c in self._conns.values() if c.deadline <= now]:
                if conn.state in (_IDLE, _QUEUED):
                    self._forget(conn, "timeout")
                    continue
                if conn.reason is None:
                    conn.reason = "timeout"
                    self.counters.add("timeout")
                conn.deadline = _NEVER
                with contextlib.suppress(OSError):
                    conn.sock.shutdown(socket.SHUT_RDWR)
        for sock in [s for s, until in self._lingering.items() if until <= now]:
            self._drop_lingering(sock)

    def _refuse(self, sock: socket.socket) -> None:
        """Answer 503 at once (one non-blocking send of a short answer) and linger."""
        try:
            sock.send(_answer(503, (("Retry-After", "1"),)))
        except OSError:
            sock.close()
            return
        self._linger(sock)

    def _linger(self, sock: socket.socket) -> None:
        """Half-close ``sock`` and read until the client closes (at most ``LINGER_SECONDS``):
        closing with unread bytes would reset it, and the client could lose its response."""
        try:
            sock.setblocking(False)
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            sock.close()
            return
        if len(self._lingering) >= MAX_LINGERING:
            sock.close()
            return
        self._lingering[sock] = time.monotonic() + LINGER_SECONDS
        self._selector.register(sock, selectors.EVENT_READ)

    def _drain(self, sock: socket.socket) -> None:
        try:
            if sock.recv(65536):
                return
        except BlockingIOError:
            return
        except OSError:
            pass
        self._drop_lingering(sock)

    def _drop_lingering(self, sock: socket.socket) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(sock)
        self._lingering.pop(sock, None)
        sock.close()

    def _take_finished(self) -> None:
        """Connections the workers answered: they linger here until the client closes."""
        while True:
            try:
                conn = self._finished.get_nowait()
            except queue.Empty:
                return
            if self._stopping.is_set():
                conn.sock.close()
            else:
                self._linger(conn.sock)

    # ------------------------------------------------------------------ workers
    def _work(self) -> None:
        while True:
            conn = self._jobs.get()
            if conn is None:
                return
            with self._lock:
                if conn.state != _QUEUED or self._stopping.is_set():
                    conn.sock.close()  # timed out in the queue, or the server is stopping
                    continue
                conn.state = _READING
            try:
                conn.sock.setblocking(True)
                conn.sock.settimeout(self.io_timeout)
                _Handler(conn, self)
            except Exception:  # never a trace: counted, the connection is closed below
                self.count(conn, "internal")
            finally:
                with self._lock:
                    self._conns.pop(conn.sock, None)
                    conn.state = _DONE
                    self._answered.notify_all()
                    done = conn.reason is None and conn.linger and not self._stopping.is_set()
                if done:
                    self._finished.put(conn)
                    self._wake()
                else:
                    conn.sock.close()

    # ------------------------------------------------------------------ stopping
    def close(self) -> None:
        """Stop accepting; close every connection not being answered; give the requests being
        answered ``stop_grace`` seconds, then end them too."""
        if self._closed:
            return
        self._closed = True
        self._stopping.set()
        self._selector.close()
        self._listener.close()
        for sock in self._lingering:
            sock.close()
        self._lingering.clear()
        with self._lock:
            for conn in list(self._conns.values()):
                if conn.state in (_IDLE, _QUEUED):
                    self._conns.pop(conn.sock, None)
                    conn.state = _DONE
                    conn.sock.close()
                elif conn.state == _READING:  # no request yet: nothing to finish
                    with contextlib.suppress(OSError):
                        conn.sock.shutdown(socket.SHUT_RDWR)
        while True:  # connections nobody started: already closed above
            try:
                self._jobs.get_nowait()
            except queue.Empty:
                break
        for _ in self._threads:
            with contextlib.suppress(queue.Full):
                self._jobs.put_nowait(None)
        deadline = time.monotonic() + self.stop_grace
        with self._lock:
            while self._conns and time.monotonic() < deadline:
                self._answered.wait(max(0.0, deadline - time.monotonic()))
            for conn in self._conns.values():
                with contextlib.suppress(OSError):
                    conn.sock.shutdown(socket.SHUT_RDWR)
        joined = time.monotonic() + 1.0
        for thread in self._threads:
            thread.join(max(0.0, joined - time.monotonic()))
        while True:
            try:
                self._finished.get_nowait().sock.close()
            except queue.Empty:
                break
        self._wake_r.close()
        self._wake_w.close()


__all__ = ["SERVER_NAME", "HttpServer"]
