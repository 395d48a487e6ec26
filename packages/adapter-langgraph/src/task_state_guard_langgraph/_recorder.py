"""The only place that writes to the ledger: every call is guarded by :class:`ErrorLog`."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from typing import Any

from ._errors import ErrorLog
from ._ids import sanitize_name

# Reason codes used by the adapter (all from the core registry, DESIGN.md E3).
INVOCATION_COMPLETED = "completed"
ATTEMPT_COMPLETED = "worker_completed"
WORKER_FAILED = "worker_failed"
RETRY_SCHEDULED = "retry_scheduled"
INTERRUPTED = "interrupted"
CALLER_CANCELLED = "caller_cancelled"


class Recorder:
    """Ledger writes for one guarded graph (or one stand-alone callback handler).

    ``owner=True`` makes the process the owner of every task it starts (core E4), so a new
    process's reconcile closes them ``timed_out/owner_lost`` as soon as this one is dead.
    """

    def __init__(
        self,
        ledger: Any,
        errors: ErrorLog,
        *,
        heartbeat_interval: float | None = 30.0,
        owner: bool = True,
    ) -> None:
        self.ledger = ledger
        self.errors = errors
        self.owner = owner
        self._hb_interval = heartbeat_interval
        self._hb: Any = None
        self._hb_pid: int | None = None
        self._hb_lock = threading.Lock()

    # -- heartbeats -------------------------------------------------------------------------

    def _heartbeater(self) -> Any:
        if self.ledger is None or not self._hb_interval:
            return None
        pid = os.getpid()
        if self._hb is not None and self._hb_pid == pid:
            return self._hb
        with self._hb_lock:
            if self._hb is None or self._hb_pid != pid:
                from task_state_guard import Heartbeater

                hb = Heartbeater(self.ledger, interval_seconds=self._hb_interval)
                hb.start()
                self._hb, self._hb_pid = hb, pid
        return self._hb

    def _hb_add(self, task_id: str) -> None:
        hb = self.errors.call("heartbeat", self._heartbeater)
        if hb is not None:
            self.errors.call("heartbeat", lambda: hb.add(task_id))

    def _hb_discard(self, task_id: str) -> None:
        hb = self._hb
        if hb is not None:
            self.errors.call("heartbeat", lambda: hb.discard(task_id))

    def beat(self, task_ids: Iterable[str]) -> int:
        """Heartbeat the given running tasks now (one transaction)."""
        ids = [t for t in task_ids if t]
        if self.ledger is None or not ids:
            return 0
        n = self.errors.call("heartbeat", lambda: self.ledger.heartbeat_many(ids))
        return int(n or 0)

    # -- transitions ------------------------------------------------------------------------

    def exists(self, task_id: str) -> bool:
        """True when the ledger holds ``task_id`` (errors count and read as False)."""
        if self.ledger is None:
            return False
        from task_state_guard import TaskNotFound

        def _get() -> bool:
            try:
                self.ledger.get_task(task_id)
            except TaskNotFound:
                return False
            return True

        return bool(self.errors.call("lookup", _get))

    def get(self, task_id: str) -> Any:
        """The task, or None when it is missing or the ledger fails."""
        if self.ledger is None:
            return None
        from task_state_guard import TaskNotFound

        def _get() -> Any:
            try:
                return self.ledger.get_task(task_id)
            except TaskNotFound:
                return None

        return self.errors.call("lookup", _get)

    def open(
        self,
        task_id: str,
        *,
        parent_id: str | None,
        delivery_required: bool,
        name: object,
        claim_errors: bool = True,
    ) -> bool:
        """Create ``task_id`` (idempotent) and start it; True when this call started it.

        A task that exists but is no longer ``queued`` cannot be started again (core
        ``StateConflict``): that is counted as ``start:StateConflict`` unless ``claim_errors``
        is False (used by ``recover()``, where losing the claim to another process is normal).
        """
        if self.ledger is None:
            return False
        label = sanitize_name(name)
        ledger = self.ledger

        def _create() -> Any:
            from task_state_guard import InvalidInput

            try:
                return ledger.create_task(
                    task_id=task_id,
                    parent_id=parent_id,
                    delivery_required=delivery_required,
                    name=label,
                )
            except InvalidInput:
                if label is None:
                    raise
                # "No name rather than failure."
                return ledger.create_task(
                    task_id=task_id,
                    parent_id=parent_id,
                    delivery_required=delivery_required,
                    name=None,
                )

        if self.errors.call("create", _create) is None:
            return False
        if claim_errors:
            started = self.errors.call(
                "start", lambda: ledger.start_task(task_id, owner=self.owner)
            )
        else:
            from task_state_guard import StateConflict

            try:
                started = ledger.start_task(task_id, owner=self.owner)
            except StateConflict:
                return False
            except Exception as exc:
                self.errors.record("start", exc)
                if self.errors.strict:
                    raise
                return False
        if started is None:
            return False
        self._hb_add(task_id)
        return True

    def close(self, task_id: str, status: str, code: str | None, *, internal: bool) -> None:
        """Close ``task_id``; internal tasks also get delivery ``not_applicable`` at once.

        A conflicting close (the task was already closed otherwise, e.g. timed out by a
        reconcile elsewhere) is rejected by the core and counted as ``close:StateConflict``:
        a terminal record is never rewritten.
        """
        if self.ledger is None:
            return
        self._hb_discard(task_id)
        ledger = self.ledger
        closed = self.errors.call("close", lambda: ledger.close_task(task_id, status, code=code))
        if closed is not None and internal:
            self.errors.call(
                "delivery",
                lambda: ledger.set_delivery(task_id, "not_applicable", code="internal_task"),
            )

    def stop(self) -> None:
        """Stop this process's heartbeat thread (if one was started)."""
        hb, self._hb = self._hb, None
        if hb is not None and self._hb_pid == os.getpid():
            self.errors.call("heartbeat", hb.stop)
