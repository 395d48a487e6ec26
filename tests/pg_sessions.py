"""The PostgreSQL sessions of one ``application_name``, counted while a test runs.

A ledger URL carrying ``application_name=NAME`` gives that name to every session the ledger
opens (statement and owner lock connections alike), so ``pg_stat_activity`` counts exactly the
sessions the process holds for it.
"""

from __future__ import annotations

import threading
import time
import uuid
from types import TracebackType

import psycopg
from pg_fixtures import PG_BASE


def session_name() -> str:
    """A fresh ``application_name`` (to append as ``&application_name=...``)."""
    return f"tsg-sessions-{uuid.uuid4().hex[:12]}"


def count_sessions(name: str) -> int:
    """How many sessions of ``name`` the server has now."""
    with psycopg.connect(PG_BASE, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (name,)
        ).fetchone()
    return int(row[0]) if row else 0


def settled(name: str, expected: int, timeout: float = 10.0) -> int:
    """The sessions of ``name`` once they number ``expected`` (a closed session leaves the
    server's view a moment after its client closed it), or after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while (count := count_sessions(name)) != expected and time.monotonic() < deadline:
        time.sleep(0.05)
    return count


class PeakSessions:
    """Samples the sessions of ``name`` every 5 ms in a thread of its own (a context manager):
    ``peak`` is the most seen at once, ``samples`` how many readings were taken."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.peak = 0
        self.samples = 0
        self._stop = threading.Event()
        self._conn = psycopg.connect(PG_BASE, autocommit=True)
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def now(self) -> int:
        row = self._conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (self.name,)
        ).fetchone()
        return int(row[0]) if row else 0

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.now())
            self.samples += 1
            self._stop.wait(0.005)

    def __enter__(self) -> PeakSessions:
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join()
        self._conn.close()
