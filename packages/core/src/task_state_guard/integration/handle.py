"""The per-process ledger handle every part of the adapter runtime shares.

:class:`LedgerHandle` holds the state that belongs to one OS process (:class:`ProcessState`:
the ledger it opened, its heartbeat thread, held tasks, deferred delivery marks, its periodic
reconcile and verdict drain, and counters) and rebuilds it after a fork without touching the
parent's. It opens the process's ledger lazily on first use and remembers whether that
worked (:meth:`LedgerHandle.check_ledger` at worker start says loudly when it cannot be used).
"""

from __future__ import annotations

import logging
import os
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

from ..heartbeat import Heartbeater
from ..ledger import Ledger
from ..model import LedgerError
from ..process import THIS
from ..store.backends import kind_of
from ..store.waiting import WouldWait, no_wait
from . import codes
from .errors import ErrorPolicy
from .settings import Settings


class ProcessState:
    """State that belongs to one OS process (rebuilt after fork, never inherited)."""

    def __init__(self) -> None:
        self.pid = THIS.pid
        #: Guards the fields below but ``ledger`` (which ``open_lock`` guards).
        self.lock = threading.Lock()
        self.open_lock = threading.Lock()
        self.ledger: Ledger | None = None
        self.heartbeater: Heartbeater | None = None
        #: Held task ids, ref-counted (see :class:`~.heartbeats.Heartbeats`).
        self.refs: Counter[str] = Counter()
        #: Delivery marks made inside a running job, written with its logical task's close.
        self.deferred: dict[str, codes.Outcome] = {}
        self.reconciles = 0
        self.published = 0
        self.counted = False  # has this process added to the metrics directory yet
        self.reconciler: tuple[threading.Event, threading.Thread] | None = None
        self.drainer: tuple[threading.Event, threading.Thread] | None = None
        #: Held by a background thread's pass over the ledger (a periodic reconcile, a verdict
        #: drain) and by a fork in preparation, from the ledger's close to the fork itself: no
        #: connection is in use, or open, at the moment this process forks (see
        #: :meth:`LedgerHandle.close_for_fork`).
        self.passes = threading.Lock()


# Locks ``close_for_fork`` holds until the fork it prepares (released in the parent after it).
_HELD_FOR_FORK: list[threading.Lock] = []


def _release_after_fork() -> None:
    while _HELD_FOR_FORK:
        _HELD_FOR_FORK.pop().release()


def _forget_in_child() -> None:
    _HELD_FOR_FORK.clear()  # the child's state is rebuilt: its copies are never used


os.register_at_fork(after_in_parent=_release_after_fork, after_in_child=_forget_in_child)


class LedgerHandle:
    """This process's ledger and :class:`ProcessState`, shared by the runtime's parts.

    ``external``: an already open ledger to use instead of opening ``settings.db`` per process
    (its owner keeps closing it).
    """

    def __init__(
        self,
        settings: Settings,
        policy: ErrorPolicy,
        logger: logging.Logger,
        external: Ledger | None = None,
    ) -> None:
        self.settings = settings
        self.policy = policy
        self.logger = logger
        self._external = external
        self._proc = ProcessState()
        #: ``(usable, reason)`` of this process's last attempt to open the ledger
        #: (``usable`` None: not tried yet); see :meth:`check_ledger`.
        self.health: tuple[bool | None, str | None] = (
            None if external is None else True, None)
        #: The statement connections a PostgreSQL ledger opened from here keeps per process
        #: when its URL sets none (None: one); the adapter sizes it to its worker's threads.
        self.connections: int | None = None
        #: The last ledger :meth:`on_file` looked at, and whether it is a SQLite ledger.
        self._kind: tuple[Ledger, bool] | None = None

    def state(self) -> ProcessState:
        """This process's state (a forked child gets a fresh one)."""
        proc = self._proc
        if proc.pid != THIS.pid:
            # Forked: drop the inherited state without touching it.
            proc = self._proc = ProcessState()
        return proc

    @property
    def ledger(self) -> Ledger:
        """This process's ledger (opened on first use; a forked child opens its own)."""
        if self._external is not None:
            return self._external
        proc = self.state()
        led = proc.ledger
        if led is None:
            with proc.open_lock:
                led = proc.ledger
                if led is None:
                    try:
                        led = Ledger(
                            self.settings.db, busy_timeout_ms=self.settings.busy_timeout_ms,
                            connections=self.connections,
                        )
                    except LedgerError as exc:
                        self.health = (False, exc.reason)
                        raise
                    self.health = (True, None)
                    proc.ledger = led
        return led

    def check_ledger(self, where: str = "worker_start") -> bool:
        """Open this process's ledger now (at worker start, before any job): True when usable.

        An unusable ledger (an unsafe or missing location, a foreign schema, an unreachable
        server) is logged once at ERROR with its fixed reason, counted as an error of ``where``
        (like any hook's), shows in ``stats()`` (``ledger_usable``, ``ledger_reason``) and,
        with ``require_ledger``, is raised so that the worker refuses to start; otherwise the
        worker runs with nothing recorded and every hook counts its error.
        """
        try:
            self.ledger  # noqa: B018 - opening it runs every safety check
        except LedgerError as exc:
            self.policy.record(where, exc)
            self.logger.error(
                "task-state-guard: the ledger cannot be used at worker start (%s%s); nothing is "
                "recorded until it can.%s",
                type(exc).__name__,
                "" if exc.reason is None else f", reason {exc.reason}",
                " require_ledger is set: the worker does not start."
                if self.settings.require_ledger
                else " Set require_ledger (TSG_REQUIRE_LEDGER=1) to refuse to start instead.",
            )
            if self.settings.require_ledger:
                raise
            return False
        return True

    @property
    def opened(self) -> Ledger | None:
        """The ledger this process holds now, without opening one (``None``: none open)."""
        return self._external if self._external is not None else self.state().ledger

    def ledger_or_none(self) -> Ledger | None:
        """The ledger, or ``None`` when it cannot be opened right now (not counted)."""
        try:
            return self.ledger
        except LedgerError:
            return None

    @contextmanager
    def write_now(self) -> Iterator[bool]:
        """A write transaction of the calling thread (an event loop's), begun only if it can
        begin at once (``store.waiting``): yields True with it open (the block's writes join
        it; it commits at the end of the block, or rolls back on an error), or False with
        nothing begun: another thread of this process is writing, another process holds the
        SQLite ledger's write lock, this process has not opened its ledger yet (opening it can
        wait), the ledger is read-only, or it is a PostgreSQL ledger (each of its writes is a
        round trip to the server)."""
        led = self.opened
        if led is None or led.read_only or not self.on_file():
            yield False
            return
        with ExitStack() as stack:
            try:
                with no_wait():
                    stack.enter_context(led.atomic())
            except WouldWait:
                began = False
            else:
                began = True
            yield began

    def on_file(self) -> bool:
        """Whether this process has its ledger open and it is a SQLite file (its reads never
        wait for a writer, nor for a server)."""
        led = self.opened
        if led is None:
            return False
        known = self._kind
        if known is None or known[0] is not led:
            known = self._kind = (led, kind_of(led.path) == "sqlite")
        return known[1]

    @contextmanager
    def background_pass(self, wait: float) -> Iterator[bool]:
        """Around a background thread's use of the ledger (a periodic pass): yields True when
        it may run, False when a fork in preparation held it off for ``wait`` seconds (skip
        this pass). A fork never copies a connection in use, and the thread's connection is
        closed before the fork (:meth:`close_for_fork`)."""
        gate = self.state().passes
        if not gate.acquire(timeout=max(wait, 0.0)):
            yield False
            return
        try:
            yield True
        finally:
            gate.release()

    def close_for_fork(self) -> None:
        """Right before this process forks: wait for a background pass in progress, close the
        ledger (every thread's connection: a copy of an open SQLite connection, or of its
        locks, must never reach the child), and hold background passes off until the fork
        happened (released in the parent right after it)."""
        gate = self.state().passes
        if gate not in _HELD_FOR_FORK:
            gate.acquire()
            _HELD_FOR_FORK.append(gate)
        self.close_ledger()

    def close_ledger(self) -> None:
        """Close this process's own ledger handle, if open (the next use opens a fresh one);
        an error is counted under ``close``. Never closes an external ledger."""
        proc = self.state()
        with proc.open_lock:
            led, proc.ledger = proc.ledger, None
        if led is not None:
            with self.policy.guarded("close"):
                led.close()


__all__ = ["LedgerHandle", "ProcessState"]
