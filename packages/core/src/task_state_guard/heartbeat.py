"""A background heartbeat thread for the running tasks a process owns."""

from __future__ import annotations

import logging
import os
import threading
import uuid
from collections.abc import Callable, Iterable

from .ledger import Ledger
from .model import InvalidInput, LedgerError, canonical_id, check_seconds

log = logging.getLogger("task_state_guard.heartbeat")


class Heartbeater:
    """Heartbeats a set of task ids every ``interval_seconds`` from a daemon thread.

    Fork-aware: a child process starts with an empty set and its own thread on first use.
    Ledger errors are logged and counted (``errors``), never raised into the caller.
    """

    def __init__(
        self,
        ledger: Ledger,
        interval_seconds: float = 30.0,
        *,
        source: Callable[[], Iterable[str | uuid.UUID]] | None = None,
    ) -> None:
        if not isinstance(ledger, Ledger):
            raise InvalidInput("ledger must be a Ledger")
        self.interval = check_seconds(interval_seconds, "interval_seconds", allow_zero=False)
        if source is not None and not callable(source):
            raise InvalidInput("source must be callable")
        self.ledger = ledger
        self.source = source  # when set, each beat asks it for the ids instead of add()/discard()
        self.errors = 0
        self.beats = 0
        self._ids: set[str] = set()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()

    def _check_fork(self) -> None:
        if os.getpid() != self._pid:
            self._pid = os.getpid()
            self._lock = threading.Lock()
            self._ids = set()
            self._thread = None
            self._wake = threading.Event()
            self._stop = threading.Event()

    def add(self, task_id: str | uuid.UUID) -> None:
        """Start heartbeating ``task_id`` (starts the thread when needed)."""
        self._check_fork()
        tid = canonical_id(task_id)
        with self._lock:
            self._ids.add(tid)
        self.start()

    def discard(self, task_id: str | uuid.UUID) -> None:
        """Stop heartbeating ``task_id``."""
        self._check_fork()
        with self._lock:
            self._ids.discard(canonical_id(task_id))

    def tracked(self) -> int:
        """How many ids are being heartbeaten."""
        self._check_fork()
        return len(self._ids)

    def start(self) -> None:
        """Start the thread (idempotent)."""
        self._check_fork()
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return
            self._stop.clear()
            self._thread = threading.Thread(
                target=self._run, name="tsg-heartbeat", daemon=True
            )
            self._thread.start()

    def stop(self, timeout: float | None = 5.0) -> None:
        """Stop the thread and wait for it (idempotent)."""
        self._check_fork()
        self._stop.set()
        self._wake.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        self._thread = None

    def beat_now(self) -> int:
        """Heartbeat every tracked id at once; return how many were refreshed."""
        if self.source is not None:
            ids = list(self.source())
        else:
            with self._lock:
                ids = list(self._ids)
        if not ids:
            return 0
        try:
            count = self.ledger.heartbeat_many(ids)
        except LedgerError as exc:
            self.errors += 1
            log.warning("task-state-guard heartbeat failed: %s", type(exc).__name__)
            return 0
        self.beats += 1
        return count

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.interval)
            self._wake.clear()
            if self._stop.is_set():
                return
            self.beat_now()
