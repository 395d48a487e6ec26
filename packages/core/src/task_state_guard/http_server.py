"""A small, bounded HTTP/1.1 server for ``tsg serve`` (standard library only).

The core's only module with network code: imported only by ``tsg serve`` and its alias
``tsg metrics --serve`` (never by ``import task_state_guard`` or another command); the privacy
audit allows sockets here alone.

* The main thread accepts; each connection goes to a fixed pool of worker threads through a
  bounded queue. When every worker is busy and the queue is full, the connection is answered
  ``503`` at once and closed (counted ``overload``): a flood never grows threads or memory.
* A request's head (request line and headers, at most 16 KiB) and body (at most 4 KiB) must
  arrive within ``read_timeout`` seconds in all, and its response must be taken within
  ``write_timeout``: an idle or slow client holds one worker for that long at most and never
  blocks another. Every response closes its connection.
* Nothing is logged. A client that resets or times out, a malformed request and an error of the
  application are counted by reason (:class:`Counters`); the application's error answers ``500``
  with a fixed body, never a trace or a path.
* SIGTERM or SIGINT stops it: the listening socket closes at once, requests in flight get up to
  ``stop_grace`` seconds to finish, then their connections are shut down.
"""

from __future__ import annotations

import contextlib
import ipaddress
import queue
import re
import selectors
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from email.utils import formatdate
from http import HTTPStatus

from .model import InvalidInput

SERVER_NAME = "task-state-guard"
MAX_HEAD = 16 * 1024
MAX_BODY = 4 * 1024
MAX_HEADERS = 64
#: Headers that may appear once only (a repeat is how request smuggling starts).
_SINGLE = frozenset({"host", "content-length", "authorization", "cookie", "content-type",
                     "transfer-encoding"})
_TOKEN = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_HEAD_END = re.compile(rb"\r?\n\r?\n")
_VALUE_BAD = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
_TARGET = re.compile(r"/[!-~]*")

#: How long a connection may linger half-closed after its response, and how many refused
#: connections may linger at once.
LINGER_SECONDS = 2.0
MAX_LINGERING = 256

#: The reasons a connection is counted under.
REASONS = ("reset", "timeout", "overload", "malformed", "internal")


@dataclass(frozen=True, slots=True)
class Request:
    """One parsed request: method, path (still percent-encoded), query string, headers (names
    lowercased) and body."""

    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes


@dataclass(slots=True)
class Response:
    """One response: status, body, content type and further headers."""

    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"
    headers: list[tuple[str, str]] = field(default_factory=list)


#: The application: turns a request into a response (an exception answers 500).
App = Callable[[Request], Response]


class Counters:
    """Connections that ended badly, by reason (thread-safe; never reset)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(REASONS, 0)

    def add(self, reason: str) -> None:
        """Count one connection under ``reason`` (one of :data:`REASONS`)."""
        with self._lock:
            self._counts[reason] += 1

    def snapshot(self) -> dict[str, int]:
        """The counts so far, by reason."""
        with self._lock:
            return dict(self._counts)


class _Malformed(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


class _NoRequest(Exception):
    """The client closed before sending a byte (a browser's unused preconnect)."""


def plain(status: int, text: str | None = None) -> Response:
    """A short text response (the status's phrase unless ``text``)."""
    body = (text if text is not None else HTTPStatus(status).phrase.lower()) + "\n"
    return Response(status, body.encode("utf-8"))


def _parse_head(data: bytes) -> tuple[str, str, dict[str, str]]:
    """Method, target and headers of a request head; ``_Malformed`` when it is not HTTP/1.x."""
    lines = data.replace(b"\r\n", b"\n").split(b"\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or not _TOKEN.fullmatch(parts[0]):
        raise _Malformed(400)
    if parts[2] not in (b"HTTP/1.0", b"HTTP/1.1"):
        raise _Malformed(505 if parts[2].startswith(b"HTTP/") else 400)
    try:
        target = parts[1].decode("ascii")
    except UnicodeDecodeError:
        raise _Malformed(400) from None
    if not _TARGET.fullmatch(target):
        raise _Malformed(400)
    headers: dict[str, str] = {}
    if len(lines) - 1 > MAX_HEADERS:
        raise _Malformed(431)
    for line in lines[1:]:
        if not line:
            continue
        name, colon, value = line.partition(b":")
        if not colon or not _TOKEN.fullmatch(name):
            raise _Malformed(400)  # no colon, whitespace before it, or a folded line
        value = value.strip(b" \t")
        if _VALUE_BAD.search(value):
            raise _Malformed(400)
        key = name.decode("ascii").lower()
        if key in headers and key in _SINGLE:
            raise _Malformed(400)
        text = value.decode("latin-1")
        headers[key] = f"{headers[key]}, {text}" if key in headers else text
    return parts[0].decode("ascii"), target, headers


def _remaining(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError
    return left


def _read_request(sock: socket.socket, deadline: float) -> Request:
    buffer = bytearray()
    while True:
        end = _HEAD_END.search(buffer)
        if end is not None:
            break
        if len(buffer) > MAX_HEAD:
            raise _Malformed(431)
        sock.settimeout(_remaining(deadline))
        chunk = sock.recv(4096)
        if not chunk:
            if not buffer:
                raise _NoRequest
            raise ConnectionResetError
        buffer += chunk
    if end.start() > MAX_HEAD:
        raise _Malformed(431)
    method, target, headers = _parse_head(bytes(buffer[: end.start()]))
    body = bytes(buffer[end.end():])
    if "transfer-encoding" in headers:
        raise _Malformed(501)
    length_text = headers.get("content-length", "0")
    if not length_text.isdigit() or len(length_text) > 6:
        raise _Malformed(400)
    length = int(length_text)
    if length > MAX_BODY:
        raise _Malformed(413)
    while len(body) < length:
        sock.settimeout(_remaining(deadline))
        chunk = sock.recv(length - len(body))
        if not chunk:
            raise ConnectionResetError
        body += chunk
    path, _, query = target.partition("?")
    return Request(method, path, query, headers, body[:length])


def _encode(response: Response, head_only: bool) -> bytes:
    phrase = HTTPStatus(response.status).phrase
    lines = [
        f"HTTP/1.1 {response.status} {phrase}",
        f"Server: {SERVER_NAME}",
        f"Date: {formatdate(usegmt=True)}",
        f"Content-Type: {response.content_type}",
        f"Content-Length: {len(response.body)}",
        "Connection: close",
        *(f"{name}: {value}" for name, value in response.headers),
    ]
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head if head_only else head + response.body


def _send_all(sock: socket.socket, data: bytes, deadline: float) -> None:
    view = memoryview(data)
    while view:
        sock.settimeout(_remaining(deadline))
        view = view[sock.send(view):]


class HttpServer:
    """The listening socket, its worker pool and its counters (see the module's docstring)."""

    def __init__(
        self,
        listen: tuple[str, int],
        app: App,
        *,
        workers: int = 8,
        queued: int = 32,
        read_timeout: float = 10.0,
        write_timeout: float = 30.0,
        stop_grace: float = 5.0,
        counters: Counters | None = None,
    ) -> None:
        host, port = listen
        family = socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._listener.bind((host, port))
            self._listener.listen(64)
            self._listener.setblocking(False)
        except OSError:
            self._listener.close()
            raise InvalidInput("cannot listen on that address") from None
        self.app = app
        self.counters = counters if counters is not None else Counters()
        self.read_timeout = read_timeout
        self.write_timeout = write_timeout
        self.stop_grace = stop_grace
        self._queue: queue.Queue[socket.socket | None] = queue.Queue(max(queued, workers))
        # Connections still reading their request (ended at once on stop), and those whose
        # request is being answered (given ``stop_grace`` to finish).
        self._reading: set[socket.socket] = set()
        self._answering: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._answered = threading.Condition(self._lock)
        self._stopping = threading.Event()
        self._closed = False
        self._wake_r, self._wake_w = socket.socketpair()
        self._threads = [
            threading.Thread(target=self._work, name=f"tsg-serve-{n}", daemon=True)
            for n in range(workers)
        ]
        for thread in self._threads:
            thread.start()

    @property
    def address(self) -> tuple[str, int]:
        """The bound host and port (the port the system picked for port 0)."""
        name = self._listener.getsockname()
        return str(name[0]), int(name[1])

    # ------------------------------------------------------------------ accept loop
    def serve_until_signal(self) -> None:
        """Serve until SIGTERM or SIGINT (or :meth:`stop`), then stop (see :meth:`close`)."""

        def on_signal(signum: int, frame: object) -> None:
            self.stop()

        previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            self._accept_loop()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self.close()

    def stop(self) -> None:
        """Ask the accept loop to return (safe from a signal handler or another thread)."""
        self._stopping.set()
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")

    def _accept_loop(self) -> None:
        # Refused connections linger here, half-closed, until the client closes its side (or
        # ``LINGER_SECONDS`` pass): closing a socket with unread data would reset it, and the
        # client could lose the 503 it was sent.
        lingering: dict[socket.socket, float] = {}
        with selectors.DefaultSelector() as selector:
            selector.register(self._listener, selectors.EVENT_READ)
            selector.register(self._wake_r, selectors.EVENT_READ)
            try:
                while not self._stopping.is_set():
                    wait = None if not lingering else max(
                        0.0, min(lingering.values()) - time.monotonic())
                    for key, _events in selector.select(wait):
                        if key.fileobj is self._listener:
                            self._accept(selector, lingering)
                        elif key.fileobj is self._wake_r:
                            with contextlib.suppress(OSError):
                                self._wake_r.recv(64)
                        else:
                            self._drain(key.fileobj, selector, lingering)  # type: ignore[arg-type]
                    now = time.monotonic()
                    for conn in [c for c, until in lingering.items() if until <= now]:
                        _forget(conn, selector, lingering)
            finally:
                for conn in list(lingering):
                    _forget(conn, selector, lingering)

    def _accept(self, selector: selectors.BaseSelector,
                lingering: dict[socket.socket, float]) -> None:
        while not self._stopping.is_set():
            try:
                conn, _peer = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return  # e.g. the client reset before accept, or out of descriptors for now
            conn.setblocking(True)
            try:
                self._queue.put_nowait(conn)
            except queue.Full:
                self.counters.add("overload")
                self._refuse(conn, selector, lingering)

    def _refuse(self, conn: socket.socket, selector: selectors.BaseSelector,
                lingering: dict[socket.socket, float]) -> None:
        """Answer 503 without reading it (one non-blocking send of a short answer), then
        half-close and let it linger."""
        response = plain(503, "busy: retry")
        response.headers.append(("Retry-After", "1"))
        try:
            conn.setblocking(False)
            conn.send(_encode(response, head_only=False))
            conn.shutdown(socket.SHUT_WR)
        except OSError:
            conn.close()
            return
        if len(lingering) >= MAX_LINGERING:
            conn.close()
            return
        lingering[conn] = time.monotonic() + LINGER_SECONDS
        selector.register(conn, selectors.EVENT_READ)

    def _drain(self, conn: socket.socket, selector: selectors.BaseSelector,
               lingering: dict[socket.socket, float]) -> None:
        try:
            if conn.recv(4096):
                return
        except BlockingIOError:
            return
        except OSError:
            pass
        _forget(conn, selector, lingering)

    # ------------------------------------------------------------------ workers
    def _work(self) -> None:
        while True:
            conn = self._queue.get()
            if conn is None:
                return
            with self._lock:
                self._reading.add(conn)
                stopping = self._stopping.is_set()
            try:
                if not stopping:
                    self._serve(conn)
            except Exception:  # never a trace: counted, the connection is closed below
                self.counters.add("internal")
            finally:
                with self._lock:
                    self._reading.discard(conn)
                    self._answering.discard(conn)
                    self._answered.notify_all()
                with contextlib.suppress(OSError):
                    conn.close()

    def _serve(self, conn: socket.socket) -> None:
        head_only = False
        try:
            try:
                request = _read_request(conn, time.monotonic() + self.read_timeout)
            except _NoRequest:
                return
            except _Malformed as exc:
                self.counters.add("malformed")
                response = plain(exc.status)
            else:
                if not self._answer(conn):
                    return  # stopping: a request not yet answered is dropped
                head_only = request.method == "HEAD"
                response = self._respond(request)
            _send_all(conn, _encode(response, head_only), time.monotonic() + self.write_timeout)
            self._linger(conn)
        except TimeoutError:
            self.counters.add("timeout")
        except OSError:  # reset, broken pipe, aborted, shut down at stop
            self.counters.add("reset")

    def _linger(self, conn: socket.socket) -> None:
        """End the response cleanly: half-close, then read until the client closes (at most
        ``LINGER_SECONDS``), so unread request bytes never turn the close into a reset that
        could cost the client the response. A stop ends it at once."""
        with self._lock:
            self._answering.discard(conn)
            self._reading.add(conn)
            if self._stopping.is_set():
                return
        deadline = time.monotonic() + LINGER_SECONDS
        with contextlib.suppress(OSError):
            conn.shutdown(socket.SHUT_WR)
            while True:
                conn.settimeout(_remaining(deadline))
                if not conn.recv(4096):
                    return

    def _answer(self, conn: socket.socket) -> bool:
        """Move ``conn`` from reading to answering; False once the server is stopping."""
        with self._lock:
            if self._stopping.is_set():
                return False
            self._reading.discard(conn)
            self._answering.add(conn)
            return True

    def _respond(self, request: Request) -> Response:
        try:
            return self.app(request)
        except Exception:
            self.counters.add("internal")
            return plain(500, "error: InternalError")

    # ------------------------------------------------------------------ stopping
    def close(self) -> None:
        """Stop accepting and end connections still reading; give requests being answered
        ``stop_grace`` seconds, then end them too."""
        if self._closed:
            return
        self._closed = True
        self._stopping.set()
        self._listener.close()
        while True:  # connections that waited in the queue were never read: just close them
            try:
                waiting = self._queue.get_nowait()
            except queue.Empty:
                break
            if waiting is not None:
                waiting.close()
        for _ in self._threads:
            self._queue.put(None)
        deadline = time.monotonic() + self.stop_grace
        with self._lock:
            _shut(self._reading)
            while self._answering and time.monotonic() < deadline:
                self._answered.wait(max(0.0, deadline - time.monotonic()))
            _shut(self._answering)
        joined = time.monotonic() + 1.0
        for thread in self._threads:
            thread.join(max(0.0, joined - time.monotonic()))
        self._wake_r.close()
        self._wake_w.close()


def _forget(conn: socket.socket, selector: selectors.BaseSelector,
            lingering: dict[socket.socket, float]) -> None:
    with contextlib.suppress(KeyError, ValueError):
        selector.unregister(conn)
    lingering.pop(conn, None)
    conn.close()


def _shut(connections: set[socket.socket]) -> None:
    """Shut ``connections`` down: a worker blocked on one returns at once."""
    for conn in connections:
        with contextlib.suppress(OSError):
            conn.shutdown(socket.SHUT_RDWR)


__all__ = ["App", "Counters", "HttpServer", "Request", "Response", "plain"]
