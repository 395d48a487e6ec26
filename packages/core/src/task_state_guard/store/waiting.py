"""Write transactions that begin at once or not at all, for a thread that must never wait.

A thread that must not wait for the database (an event loop's) asks, inside :func:`no_wait`,
that the write transaction it begins meanwhile starts at once: a backend that can tell raises
:class:`WouldWait` before it began anything when it could not. The SQLite backend can: a write
transaction would wait when another thread of the process is writing (its writer lock is
held) or another process holds the database's write lock (``SQLITE_BUSY`` with no busy wait).
The request covers the beginning of the transaction only; once begun, its statements and its
commit run as any other's (a transaction that holds the write lock waits for no one).

A backend that cannot tell ignores the request: a PostgreSQL write is a round trip to its
server however free the database is, so a caller asks only a SQLite ledger
(:meth:`~task_state_guard.integration.handle.LedgerHandle.write_now`).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from .. import reasons as r
from ..model import LedgerBusy


class WouldWait(LedgerBusy):
    """The write transaction was not begun: beginning it would have waited (see the module
    docstring). Nothing was written."""

    def __init__(self) -> None:
        super().__init__("beginning the write transaction would wait", reason=r.DATABASE_BUSY)


class _Request(threading.local):
    """The calling thread's request (see :func:`no_wait`)."""

    on: bool = False


#: Read by a backend as it begins a write transaction: ``REQUEST.on`` while the calling
#: thread is inside :func:`no_wait`.
REQUEST = _Request()


@contextmanager
def no_wait() -> Iterator[None]:
    """In the block, the calling thread's write transactions begin at once or raise
    :class:`WouldWait` (on a backend that can tell; see the module docstring)."""
    before = REQUEST.on
    REQUEST.on = True
    try:
        yield
    finally:
        REQUEST.on = before


__all__ = ["REQUEST", "WouldWait", "no_wait"]
