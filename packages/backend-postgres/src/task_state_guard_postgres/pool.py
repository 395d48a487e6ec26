"""The statement connections of one PostgreSQL ledger in one process: a fixed budget.

A process keeps at most ``connections`` statement connections per ledger (a URL parameter; unset,
the number its opener asked for: an adapter's worker threads, else :data:`BASE_CONNECTIONS`:
one), whatever its number of threads, plus the owner's lock
connection when it owns tasks (``task_state_guard_postgres.owners``): by default at most two
PostgreSQL sessions in all. A thread leases a connection for one statement or one transaction
(:meth:`Pool.lease`; nested leases of one thread reuse its connection, so a read inside a write
transaction joins it) and gives it back at once; other threads wait meanwhile, first come,
first served (a release hands the connection to the longest waiting thread). The ledger's
statements are single round trips of about a millisecond, so the queue moves fast.

A wait longer than :data:`STALL_SECONDS` means the connections are stuck, not busy: a statement
waits for a row or advisory lock another session holds (for up to the ledger's busy timeout),
or a long pass holds its transaction. The waiting thread then opens an extra connection of its
own for its statement, and closes it when it gives it back, so a blocked write holds up its own
caller only, and the process returns to its budget as soon as the block ends.

A connection is used only by the process that opened it: a forked child starts with an empty
pool of its own (the parent's connections are never used or closed there, see ``driver``).
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from task_state_guard import reasons as r
from task_state_guard.model import StorageError

from . import driver

#: Statement connections a process keeps per ledger by default (the owner lock's comes on top).
BASE_CONNECTIONS = 1
#: How long a thread waits for a leased connection before it opens an extra one of its own.
STALL_SECONDS = 1.0


class _Waiter:
    """A thread waiting for a connection: handed one (``conn``), or woken to open one."""

    def __init__(self) -> None:
        self.ready = threading.Event()
        self.conn: driver.Conn | None = None
        #: woken to open a connection, its place in the budget already counted
        self.reserved = False


class Pool:
    """At most ``size`` kept connections (opened by ``opener`` as needed), each leased to one
    thread at a time; a thread that waited :data:`STALL_SECONDS` opens an extra connection,
    closed when its lease ends."""

    def __init__(self, opener: Callable[[], driver.Conn], size: int = BASE_CONNECTIONS) -> None:
        self._opener = opener
        self._size = size
        self._closed = False
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._local = threading.local()
        #: connections open in this process (kept and extra), and the kept ones not leased
        self._open: list[driver.Conn] = []
        self._idle: list[driver.Conn] = []
        self._opening = 0
        self._waiters: deque[_Waiter] = deque()

    def _mine(self) -> None:
        if self._pid != os.getpid():  # forked: never touch the parent's connections
            self._reset()

    def held(self) -> driver.Conn | None:
        """The connection this thread leases now, if any."""
        self._mine()
        conn: driver.Conn | None = getattr(self._local, "conn", None)
        return conn

    def connections(self) -> int:
        """How many connections this process has open for the ledger now."""
        self._mine()
        with self._lock:
            return len(self._open)

    @contextmanager
    def lease(self) -> Iterator[driver.Conn]:
        """This thread's connection for one statement or transaction (nested: the same)."""
        held = self.held()
        if held is not None:
            yield held
            return
        conn = self._acquire()
        self._local.conn = conn
        try:
            yield conn
        finally:
            self._local.conn = None
            self._release(conn)

    def peek(self) -> driver.Conn:
        """A kept connection without a lease (opened when none is): for one-thread inspection
        of the session's settings, never for statements beside other threads."""
        held = self.held()
        if held is not None:
            return held
        with self.lease() as conn:
            return conn

    def _acquire(self) -> driver.Conn:
        waiter: _Waiter | None = None
        with self._lock:
            if self._closed:
                raise StorageError("the ledger is closed", reason=r.LEDGER_CLOSED)
            conn = self._take_idle()
            if conn is not None:
                return conn
            if len(self._open) + self._opening < self._size:
                self._opening += 1
            else:  # first come, first served: a release hands its connection to the head
                waiter = _Waiter()
                self._waiters.append(waiter)
        if waiter is not None:
            waiter.ready.wait(STALL_SECONDS)
            with self._lock:
                if waiter.conn is not None:
                    return waiter.conn
                if not waiter.reserved:  # stuck: an extra connection of its own
                    self._waiters.remove(waiter)
                    self._opening += 1
                if self._closed:
                    self._opening -= 1
                    raise StorageError("the ledger is closed", reason=r.LEDGER_CLOSED)
        try:
            conn = self._opener()
        except BaseException:
            with self._lock:
                self._opening -= 1
                self._wake_one()
            raise
        with self._lock:
            self._opening -= 1
            self._open.append(conn)
            if self._closed:
                self._drop(conn)
                raise StorageError("the ledger is closed", reason=r.LEDGER_CLOSED)
        return conn

    def _take_idle(self) -> driver.Conn | None:
        """A usable idle connection (unusable ones dropped), or None (caller holds the lock)."""
        while self._idle:
            conn = self._idle.pop()
            if conn.usable:
                return conn
            self._drop(conn)
        return None

    def _wake_one(self) -> None:
        """Let the first waiter open a connection when the budget has room (lock held)."""
        if self._waiters and len(self._open) + self._opening < self._size:
            waiter = self._waiters.popleft()
            waiter.reserved = True
            self._opening += 1
            waiter.ready.set()

    def _release(self, conn: driver.Conn) -> None:
        if conn.pid != os.getpid():
            return  # leased before a fork: the parent's, never touched here
        with self._lock:
            keep = (
                not self._closed
                and conn.usable
                and not conn.in_transaction
                and conn in self._open
                and len(self._open) <= self._size
            )
            if not keep:
                self._drop(conn)
                self._wake_one()
            elif self._waiters:
                waiter = self._waiters.popleft()
                waiter.conn = conn
                waiter.ready.set()
            else:
                self._idle.append(conn)

    def _drop(self, conn: driver.Conn) -> None:
        """Close ``conn`` and forget it (caller holds the lock)."""
        if conn in self._open:
            self._open.remove(conn)
        conn.close()

    def close(self) -> None:
        """Close every connection this process opened for the ledger; no lease afterwards."""
        self._mine()
        with self._lock:
            self._closed = True
            for conn in list(self._open):
                self._drop(conn)
            self._idle = []
            while self._waiters:
                waiter = self._waiters.popleft()
                waiter.reserved = True
                self._opening += 1  # undone by the waiter, which finds the pool closed
                waiter.ready.set()


__all__ = ["BASE_CONNECTIONS", "STALL_SECONDS", "Pool"]
