"""The statement connections of one PostgreSQL ledger in one process: a fixed budget.

A process keeps **one** statement connection per ledger, whatever its number of threads
(:data:`BASE_CONNECTIONS`), plus the owner's lock connection when it owns tasks
(``task_state_guard_postgres.owners``): at most two PostgreSQL sessions in all. A thread leases
the connection for one statement or one transaction (:meth:`Pool.lease`; nested leases of one
thread reuse its connection, so a read inside a write transaction joins it) and gives it back
at once; other threads wait meanwhile. The ledger's statements are single round trips of about
a millisecond, so a queue of waiting threads moves fast.

A wait longer than :data:`STALL_SECONDS` means the connection is stuck, not busy: a statement
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
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from task_state_guard import reasons as r
from task_state_guard.model import StorageError

from . import driver

#: Statement connections a process keeps open per ledger (the owner lock's comes on top).
BASE_CONNECTIONS = 1
#: How long a thread waits for a leased connection before it opens an extra one of its own.
STALL_SECONDS = 1.0


class Pool:
    """At most :data:`BASE_CONNECTIONS` kept connections (opened by ``opener`` on first use),
    each leased to one thread at a time; a thread that waited :data:`STALL_SECONDS` opens an
    extra connection, closed when its lease ends."""

    def __init__(self, opener: Callable[[], driver.Conn]) -> None:
        self._opener = opener
        self._closed = False
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._cond = threading.Condition(threading.Lock())
        self._local = threading.local()
        #: connections open in this process (kept and extra), and the kept ones not leased
        self._open: list[driver.Conn] = []
        self._idle: list[driver.Conn] = []
        self._opening = 0

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
        with self._cond:
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
        deadline = time.monotonic() + STALL_SECONDS
        with self._cond:
            while True:
                if self._closed:
                    raise StorageError("the ledger is closed", reason=r.LEDGER_CLOSED)
                while self._idle:
                    conn = self._idle.pop()
                    if conn.usable:
                        return conn
                    self._drop(conn)
                if len(self._open) + self._opening < BASE_CONNECTIONS:
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break  # stuck: an extra connection of this thread's own
                self._cond.wait(remaining)
            self._opening += 1
        try:
            conn = self._opener()
        except BaseException:
            with self._cond:
                self._opening -= 1
                self._cond.notify()
            raise
        with self._cond:
            self._opening -= 1
            self._open.append(conn)
            if self._closed:
                self._drop(conn)
                raise StorageError("the ledger is closed", reason=r.LEDGER_CLOSED)
        return conn

    def _release(self, conn: driver.Conn) -> None:
        if conn.pid != os.getpid():
            return  # leased before a fork: the parent's, never touched here
        with self._cond:
            keep = (
                not self._closed
                and conn.usable
                and not conn.in_transaction
                and conn in self._open
                and len(self._open) <= BASE_CONNECTIONS
            )
            if keep:
                self._idle.append(conn)
            else:
                self._drop(conn)
            self._cond.notify()

    def _drop(self, conn: driver.Conn) -> None:
        """Close ``conn`` and forget it (caller holds the condition)."""
        if conn in self._open:
            self._open.remove(conn)
        conn.close()

    def close(self) -> None:
        """Close every connection this process opened for the ledger; no lease afterwards."""
        self._mine()
        with self._cond:
            self._closed = True
            for conn in list(self._open):
                self._drop(conn)
            self._idle = []
            self._cond.notify_all()


__all__ = ["BASE_CONNECTIONS", "STALL_SECONDS", "Pool"]
