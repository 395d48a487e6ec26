"""A small, bounded HTTP/1.1 server for ``tsg serve`` (standard library only).

The core's only module with network code: imported only by ``tsg serve`` and its alias
``tsg metrics --serve`` (never by ``import task_state_guard`` or another command); the privacy
audit allows sockets here alone.

* One thread (the caller's) accepts connections and reads their requests without blocking, for
  all of them at once: a request's head (request line and headers, at most 16 KiB) and body (at
  most 4 KiB) must arrive within ``read_timeout`` seconds in all, or the connection is closed
  (counted ``timeout``). An idle or slow client therefore costs one socket, never a thread,
  and never delays another client. At most ``max_connections`` are read at once; beyond that,
  and when the queue of complete requests is full, a connection is answered ``503`` at once
  (counted ``overload``): a flood never grows threads or memory.
* A fixed pool of worker threads answers the complete requests; a response must be taken
  within ``write_timeout``. Every response closes its connection (after a short linger, so a
  client never loses its response to a reset).
* Nothing is logged. A client that resets, a malformed request and an error of the
  application are counted by reason (:class:`Counters`); the application's error answers
  ``500`` with a fixed body, never a trace or a path.
* SIGTERM or SIGINT stops it: the listening socket and every connection not being answered
  close at once; requests being answered get up to ``stop_grace`` seconds to finish.
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

from ..model import InvalidInput

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

#: How long a connection may linger half-closed after its response, and how many may at once.
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


def _parse_request(buffer: bytes | bytearray) -> Request | None:
    """The request in ``buffer`` once it is complete (None while more must come);
    ``_Malformed`` when it cannot be one."""
    end = _HEAD_END.search(buffer)
    if end is None:
        if len(buffer) > MAX_HEAD:
            raise _Malformed(431)
        return None
    if end.start() > MAX_HEAD:
        raise _Malformed(431)
    method, target, headers = _parse_head(bytes(buffer[: end.start()]))
    if "transfer-encoding" in headers:
        raise _Malformed(501)
    length_text = headers.get("content-length", "0")
    if not length_text.isdigit() or len(length_text) > 6:
        raise _Malformed(400)
    length = int(length_text)
    if length > MAX_BODY:
        raise _Malformed(413)
    body = bytes(buffer[end.end():])
    if len(body) < length:
        return None
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
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        sock.settimeout(left)
        view = view[sock.send(view):]


@dataclass(slots=True)
class _Reading:
    """A connection whose request is still arriving."""

    deadline: float
    buffer: bytearray = field(default_factory=bytearray)


#: A unit of work for the pool: a connection and its request, or the status of the error to
#: answer it with.
_Job = tuple[socket.socket, "Request | int"]


class HttpServer:
    """The listening socket, its reader loop, its worker pool and its counters (see the
    module's docstring)."""

    def __init__(
        self,
        listen: tuple[str, int],
        app: App,
        *,
        workers: int = 8,
        queued: int = 32,
        max_connections: int = 256,
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
            self._listener.listen(128)
            self._listener.setblocking(False)
        except OSError:
            self._listener.close()
            raise InvalidInput("cannot listen on that address") from None
        self.app = app
        self.counters = counters if counters is not None else Counters()
        self.read_timeout = read_timeout
        self.write_timeout = write_timeout
        self.stop_grace = stop_grace
        self.max_connections = max_connections
        self._jobs: queue.Queue[_Job | None] = queue.Queue(queued)
        self._finished: queue.SimpleQueue[socket.socket] = queue.SimpleQueue()
        self._reading: dict[socket.socket, _Reading] = {}
        self._lingering: dict[socket.socket, float] = {}
        self._answering: set[socket.socket] = set()
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

    @property
    def address(self) -> tuple[str, int]:
        """The bound host and port (the port the system picked for port 0)."""
        name = self._listener.getsockname()
        return str(name[0]), int(name[1])

    # ------------------------------------------------------------------ the reader loop
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
            deadlines = [r.deadline for r in self._reading.values()]
            deadlines += self._lingering.values()
            wait = None if not deadlines else max(0.0, min(deadlines) - time.monotonic())
            for key, _events in self._selector.select(wait):
                sock = key.fileobj
                if sock is self._listener:
                    self._accept()
                elif sock is self._wake_r:
                    with contextlib.suppress(OSError):
                        self._wake_r.recv(4096)
                elif sock in self._reading:
                    self._read(sock)
                elif sock in self._lingering:
                    self._drain(sock)
            self._take_finished()
            now = time.monotonic()
            for conn in [c for c, r in self._reading.items() if r.deadline <= now]:
                self.counters.add("timeout")
                self._drop(conn)
            for conn in [c for c, until in self._lingering.items() if until <= now]:
                self._drop(conn)

    def _accept(self) -> None:
        while not self._stopping.is_set():
            try:
                conn, _peer = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return  # e.g. the client reset before accept, or out of descriptors for now
            conn.setblocking(False)
            if len(self._reading) >= self.max_connections:
                self.counters.add("overload")
                self._refuse(conn)
                continue
            self._reading[conn] = _Reading(time.monotonic() + self.read_timeout)
            self._selector.register(conn, selectors.EVENT_READ)

    def _read(self, conn: socket.socket) -> None:
        state = self._reading[conn]
        try:
            chunk = conn.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            self.counters.add("reset")
            self._drop(conn)
            return
        if not chunk:
            if state.buffer:
                self.counters.add("reset")  # gone in the middle of its request
            self._drop(conn)  # nothing sent at all: a browser's unused preconnect
            return
        state.buffer += chunk
        try:
            request = _parse_request(state.buffer)
        except _Malformed as exc:
            self.counters.add("malformed")
            self._dispatch(conn, exc.status)
            return
        if request is not None:
            self._dispatch(conn, request)

    def _dispatch(self, conn: socket.socket, work: Request | int) -> None:
        """Hand a complete request (or the status of its error) to the pool; 503 when the
        pool's queue is full."""
        self._selector.unregister(conn)
        del self._reading[conn]
        try:
            self._jobs.put_nowait((conn, work))
        except queue.Full:
            self.counters.add("overload")
            self._refuse(conn)

    def _refuse(self, conn: socket.socket) -> None:
        """Answer 503 at once (one non-blocking send of a short answer) and linger."""
        response = plain(503, "busy: retry")
        response.headers.append(("Retry-After", "1"))
        try:
            conn.send(_encode(response, head_only=False))
        except OSError:
            conn.close()
            return
        self._linger(conn)

    def _linger(self, conn: socket.socket) -> None:
        """Half-close ``conn`` and read until the client closes (at most ``LINGER_SECONDS``):
        closing with unread bytes would reset it, and the client could lose its response."""
        try:
            conn.setblocking(False)
            conn.shutdown(socket.SHUT_WR)
        except OSError:
            conn.close()
            return
        if len(self._lingering) >= MAX_LINGERING:
            conn.close()
            return
        self._lingering[conn] = time.monotonic() + LINGER_SECONDS
        self._selector.register(conn, selectors.EVENT_READ)

    def _drain(self, conn: socket.socket) -> None:
        try:
            if conn.recv(65536):
                return
        except BlockingIOError:
            return
        except OSError:
            pass
        self._drop(conn)

    def _drop(self, conn: socket.socket) -> None:
        """Forget a connection the loop watches, and close it."""
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(conn)
        self._reading.pop(conn, None)
        self._lingering.pop(conn, None)
        conn.close()

    def _take_finished(self) -> None:
        """Connections the workers answered: they linger here until the client closes."""
        while True:
            try:
                conn = self._finished.get_nowait()
            except queue.Empty:
                return
            if self._stopping.is_set():
                conn.close()
            else:
                self._linger(conn)

    # ------------------------------------------------------------------ workers
    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            conn, work = job
            with self._lock:
                if self._stopping.is_set():
                    conn.close()
                    continue
                self._answering.add(conn)
            done = False
            try:
                done = self._answer(conn, work)
            except Exception:  # never a trace: counted, the connection is closed below
                self.counters.add("internal")
            finally:
                with self._lock:
                    self._answering.discard(conn)
                    self._answered.notify_all()
                if done and not self._stopping.is_set():
                    self._finished.put(conn)
                    self._wake()
                else:
                    conn.close()

    def _answer(self, conn: socket.socket, work: Request | int) -> bool:
        """Send the response; True when it was sent whole."""
        if isinstance(work, int):
            response, head_only = plain(work), False
        else:
            response, head_only = self._respond(work), work.method == "HEAD"
        try:
            _send_all(conn, _encode(response, head_only), time.monotonic() + self.write_timeout)
        except TimeoutError:
            self.counters.add("timeout")
            return False
        except OSError:  # reset, broken pipe, shut down at stop
            self.counters.add("reset")
            return False
        return True

    def _respond(self, request: Request) -> Response:
        try:
            return self.app(request)
        except Exception:
            self.counters.add("internal")
            return plain(500, "error: InternalError")

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
        for conn in [*self._reading, *self._lingering]:
            conn.close()
        self._reading.clear()
        self._lingering.clear()
        while True:  # complete requests nobody started: closed unanswered
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job[0].close()
        for _ in self._threads:
            with contextlib.suppress(queue.Full):
                self._jobs.put_nowait(None)
        deadline = time.monotonic() + self.stop_grace
        with self._lock:
            while self._answering and time.monotonic() < deadline:
                self._answered.wait(max(0.0, deadline - time.monotonic()))
            for conn in self._answering:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
        joined = time.monotonic() + 1.0
        for thread in self._threads:
            thread.join(max(0.0, joined - time.monotonic()))
        while True:
            try:
                self._finished.get_nowait().close()
            except queue.Empty:
                break
        self._wake_r.close()
        self._wake_w.close()


__all__ = ["App", "Counters", "HttpServer", "Request", "Response", "plain"]
