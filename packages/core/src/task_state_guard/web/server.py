"""The bounded server that runs the WSGI application of ``tsg serve`` (standard library only).

With :mod:`.request`, the core's only network code: imported only by ``tsg serve`` and its
alias ``tsg metrics --serve`` (never by ``import task_state_guard`` or another command); the
privacy audit allows sockets in these two modules alone. HTTP is parsed by the standard
library's ``http.server`` and the application is called through ``wsgiref.handlers``
(:mod:`.request`); this module only decides which connection is read when, by whom, and for
how long.

* One thread (the caller's) accepts connections and watches them until their first bytes
  arrive: an idle client costs one socket, never a thread. At most ``max_connections`` are
  held at once, and at most ``per_client`` from one IP address: a client at its cap that
  connects again closes its own oldest idle connection, and a new connection beyond
  ``max_connections`` closes the oldest idle connection of all (both counted ``overload``),
  so idle sockets, however many and from whichever addresses, never keep a request out. A new
  connection is answered ``503`` (counted ``overload``) only when every held one is busy.
* A fixed pool of ``workers`` threads reads and answers the connections that sent something
  (at most ``queued`` wait for a worker; beyond that ``503``). A scrape has a lane of its own:
  a connection whose whole request head has arrived and asks ``GET /metrics`` (or ``HEAD``) is
  answered by one of ``scrape_workers`` threads that answer nothing else (``scrape_queued``
  may wait), so busy page loads and slow clients never make a scrape wait; its head is
  already read, so a scrape worker never waits for a client. Each socket operation times out
  after ``io_timeout``; the request must have arrived ``read_timeout`` seconds after the
  connection was accepted, and its response must be sent ``write_timeout`` seconds after
  that, or the connection is shut down (counted ``timeout``). Every response closes its
  connection (after a short linger, so a client never loses its response to a reset).
* Nothing is logged. A client that resets, a malformed request (answered 4xx/5xx with a fixed
  body that never repeats what was sent) and an error of the application (answered ``500``)
  are counted by reason (:class:`~task_state_guard.web.messages.Counters`).
* SIGTERM or SIGINT stops it: the listening socket and every connection not being answered
  close at once; requests being answered get up to ``stop_grace`` seconds to finish.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import queue
import re
import selectors
import signal
import socket
import threading
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from .. import reasons as r
from ..model import InvalidInput
from .messages import Counters
from .request import (
    ANSWERING,
    DONE,
    IDLE,
    QUEUED,
    READING,
    SERVER_NAME,
    Conn,
    RequestHandler,
    answer,
)

if TYPE_CHECKING:
    from wsgiref.types import WSGIApplication

#: How long a connection may linger half-closed after its response, and how many may at once.
LINGER_SECONDS = 2.0
MAX_LINGERING = 256
#: A scrape's request line, and how much of a request is looked at to find one.
_SCRAPE = re.compile(rb"(?:GET|HEAD) /metrics[ ?]")
_PEEK = 8192

_NEVER = float("inf")


def _oldest_idle(conns: Iterable[Conn]) -> Conn | None:
    """The idle connection accepted first among ``conns`` (None: none is idle)."""
    return min((c for c in conns if c.state == IDLE), key=lambda c: c.accepted, default=None)

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
        scrape_workers: int = 2,
        scrape_queued: int = 8,
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
        self._conns: dict[socket.socket, Conn] = {}  # every connection but lingering ones
        self._lingering: dict[socket.socket, float] = {}
        self._jobs: queue.Queue[Conn | None] = queue.Queue(queued)
        self._scrapes: queue.Queue[Conn | None] = queue.Queue(scrape_queued)
        self._finished: queue.SimpleQueue[Conn] = queue.SimpleQueue()
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
            threading.Thread(target=self._work, args=(self._jobs,), name=f"tsg-serve-{n}",
                             daemon=True)
            for n in range(workers)
        ] + [
            threading.Thread(target=self._work, args=(self._scrapes,),
                             name=f"tsg-scrape-{n}", daemon=True)
            for n in range(scrape_workers)
        ]
        self._lanes = ((self._jobs, workers), (self._scrapes, scrape_workers))
        for thread in self._threads:
            thread.start()

    # ------------------------------------------------------------------ shared with workers
    def count(self, conn: Conn, reason: str) -> None:
        """Count ``conn`` under ``reason``, once per connection (the first reason wins)."""
        with self._lock:
            if conn.reason is None:
                conn.reason = reason
                self.counters.add(reason)

    def answering(self, conn: Conn) -> bool:
        """A worker read ``conn``'s request: its response is due within ``write_timeout``.
        False when it is to be dropped instead (timed out, or the server is stopping)."""
        with self._lock:
            if conn.reason is not None or self._stopping.is_set():
                return False
            conn.state = ANSWERING
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
                evict = refuse = None
                if len(mine) >= self.per_client:  # the client's oldest idle one makes room
                    evict = _oldest_idle(mine)
                    refuse = evict is None
                if not refuse and len(self._conns) >= self.max_connections and evict is None:
                    evict = _oldest_idle(self._conns.values())  # the oldest idle of all
                    refuse = evict is None
                if evict is not None:
                    self._forget(evict, "overload")
                if not refuse:
                    self._conns[sock] = Conn(sock, client, now, now + self.read_timeout)
            if refuse:
                self.counters.add("overload")
                self._refuse(sock)
            else:
                self._selector.register(sock, selectors.EVENT_READ)

    def _forget(self, conn: Conn, reason: str) -> None:
        """Close an idle connection the loop watches (with the lock held), counted."""
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(conn.sock)
        self._conns.pop(conn.sock, None)
        if conn.reason is None:
            conn.reason = reason
            self.counters.add(reason)
        conn.state = DONE
        conn.sock.close()

    def _dispatch(self, sock: socket.socket) -> None:
        """An idle connection sent something: a worker reads it, a scrape worker when it is a
        whole scrape head (503 when the queues are full)."""
        with contextlib.suppress(KeyError, ValueError):  # closed earlier in this round
            self._selector.unregister(sock)
        with self._lock:
            conn = self._conns.get(sock)
            if conn is None:
                return
            conn.state = QUEUED
        try:
            head = sock.recv(_PEEK, socket.MSG_PEEK)
        except OSError:
            head = b""
        lanes = [self._jobs]
        if _SCRAPE.match(head) and b"\r\n\r\n" in head:
            lanes.insert(0, self._scrapes)
        for lane in lanes:
            with contextlib.suppress(queue.Full):
                lane.put_nowait(conn)
                return
        with self._lock:
            self._conns.pop(sock, None)
            conn.state = DONE
        self.counters.add("overload")
        self._refuse(sock)

    def _expire(self) -> None:
        """Drop the connections past their deadline: idle and queued ones are closed here;
        those a worker holds are shut down, and the worker ends them."""
        now = time.monotonic()
        with self._lock:
            for conn in [c for c in self._conns.values() if c.deadline <= now]:
                if conn.state in (IDLE, QUEUED):
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
            sock.send(answer(503, (("Retry-After", "1"),)))
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
    def _work(self, lane: queue.Queue[Conn | None]) -> None:
        while True:
            conn = lane.get()
            if conn is None:
                return
            with self._lock:
                if conn.state != QUEUED or self._stopping.is_set():
                    conn.sock.close()  # timed out in the queue, or the server is stopping
                    continue
                conn.state = READING
            try:
                conn.sock.setblocking(True)
                conn.sock.settimeout(self.io_timeout)
                RequestHandler(conn, self)
            except Exception:  # never a trace: counted, the connection is closed below
                self.count(conn, "internal")
            finally:
                with self._lock:
                    self._conns.pop(conn.sock, None)
                    conn.state = DONE
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
                if conn.state in (IDLE, QUEUED):
                    self._conns.pop(conn.sock, None)
                    conn.state = DONE
                    conn.sock.close()
                elif conn.state == READING:  # no request yet: nothing to finish
                    with contextlib.suppress(OSError):
                        conn.sock.shutdown(socket.SHUT_RDWR)
        for lane, count in self._lanes:
            while True:  # connections nobody started: already closed above
                try:
                    lane.get_nowait()
                except queue.Empty:
                    break
            for _ in range(count):
                with contextlib.suppress(queue.Full):
                    lane.put_nowait(None)
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
