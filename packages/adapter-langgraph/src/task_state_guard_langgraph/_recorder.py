"""The only place that writes to the ledger: every call is guarded by :class:`ErrorLog`.

Transitions that happen at the same moment share one ledger transaction
(``Ledger.atomic()``): creating and starting a task, closing an attempt and marking its
delivery ``not_applicable``, closing the leftovers of an invocation together with the
invocation. Nothing is deferred: every transition is committed before the event that caused
it returns, so a node attempt is a committed ``running`` record while its node runs.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Sequence
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

#: One close: ``(task_id, status, code, internal)``.
Closing = tuple[str, str, str | None, bool]

_LABELS_MAX = 4096


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
        self._live: set[str] = set()
        self._live_pid = os.getpid()
        # Name -> ledger label (None: no label); names repeat on every invocation.
        self._labels: dict[str, str | None] = {}

    # -- heartbeats -------------------------------------------------------------------------
    #
    # The recorder keeps the ids of the tasks it opened and has not closed yet in a plain set
    # (one set operation per open/close, no lock, no id parsing); one heartbeat thread per
    # process beats a snapshot of that set every interval.

    def _live_ids(self) -> set[str]:
        pid = os.getpid()
        if self._live_pid != pid:  # forked: the parent's tasks are not ours
            self._live, self._live_pid = set(), pid
        return self._live

    def _heartbeater(self) -> Any:
        hb = self._hb
        if hb is not None and self._hb_pid == os.getpid():
            return hb
        if self.ledger is None or not self._hb_interval:
            return None
        with self._hb_lock:
            pid = os.getpid()
            if self._hb is None or self._hb_pid != pid:
                hb = _live_heartbeater(self.ledger, self._hb_interval, self._snapshot)
                hb.start()
                self._hb, self._hb_pid = hb, pid
            return self._hb

    def _snapshot(self) -> list[str]:
        return list(self._live_ids().copy())

    def _hb_add(self, task_id: str) -> None:
        self._live_ids().add(task_id)
        if self._hb_interval and (self._hb is None or self._hb_pid != os.getpid()):
            try:
                self._heartbeater()
            except Exception as exc:
                self.errors.record("heartbeat", exc)
                if self.errors.strict:
                    raise

    def _hb_discard(self, task_id: str) -> None:
        self._live_ids().discard(task_id)

    def beat(self, task_ids: Iterable[str]) -> int:
        """Heartbeat the given running tasks now (one transaction)."""
        ids = [t for t in task_ids if t]
        if self.ledger is None or not ids:
            return 0
        n = self.errors.call("heartbeat", lambda: self.ledger.heartbeat_many(ids))
        return int(n or 0)

    # -- reads ------------------------------------------------------------------------------

    def exists(self, task_id: str) -> bool:
        """True when the ledger holds ``task_id`` (errors count and read as False)."""
        return self.get(task_id) is not None

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

    # -- transitions ------------------------------------------------------------------------

    def label(self, name: object) -> str | None:
        """The ledger label for a graph or node name (cached per name)."""
        if not isinstance(name, str):
            return None
        try:
            return self._labels[name]
        except KeyError:
            label = sanitize_name(name)
            if len(self._labels) < _LABELS_MAX:
                self._labels[name] = label
            return label

    def _forget_label(self, name: object) -> None:
        if isinstance(name, str) and name in self._labels:
            self._labels[name] = None

    def open(
        self,
        task_id: str,
        *,
        parent_id: str | None,
        delivery_required: bool,
        name: object,
        claim_errors: bool = True,
    ) -> bool:
        """Create ``task_id`` (idempotent) and start it, in one transaction; True when this
        call started it.

        A task that exists but is no longer ``queued`` cannot be started again (core
        ``StateConflict``): that is counted as ``start:StateConflict`` unless ``claim_errors``
        is False (used by ``recover()``, where losing the claim to another process is normal).
        Nothing is written when the start is refused.
        """
        ledger = self.ledger
        if ledger is None:
            return False
        from task_state_guard import InvalidInput, StateConflict

        label = self.label(name)
        stage = "create"
        try:
            with ledger.atomic():
                try:
                    ledger.create_task(
                        task_id=task_id,
                        parent_id=parent_id,
                        delivery_required=delivery_required,
                        name=label,
                    )
                except InvalidInput:
                    if label is None:
                        raise
                    # "No name rather than failure."
                    self._forget_label(name)
                    ledger.create_task(
                        task_id=task_id,
                        parent_id=parent_id,
                        delivery_required=delivery_required,
                        name=None,
                    )
                stage = "start"
                try:
                    ledger.start_task(task_id, owner=self.owner)
                except StateConflict:
                    if claim_errors:
                        raise
                    return False  # another process claimed it: not an error
        except Exception as exc:
            self.errors.record(stage, exc)
            if self.errors.strict:
                raise
            return False
        self._hb_add(task_id)
        return True

    def close(self, task_id: str, status: str, code: str | None, *, internal: bool) -> None:
        """Close ``task_id``; internal tasks also get delivery ``not_applicable`` (same
        transaction).

        A conflicting close (the task was already closed otherwise, e.g. timed out by a
        reconcile elsewhere) is rejected by the core and counted as ``close:StateConflict``:
        a terminal record is never rewritten.
        """
        self.close_many(((task_id, status, code, internal),))

    def close_many(self, closings: Sequence[Closing]) -> None:
        """Close several tasks (innermost first) in one transaction.

        Each close is judged on its own: a refused close (counted) does not undo the others.
        """
        ledger = self.ledger
        if ledger is None or not closings:
            return
        for closing in closings:
            self._hb_discard(closing[0])
        counted = False
        try:
            with ledger.atomic():
                for task_id, status, code, internal in closings:
                    operation = "close"
                    try:
                        ledger.close_task(task_id, status, code=code)
                        if internal:
                            operation = "delivery"
                            ledger.set_delivery(task_id, "not_applicable", code="internal_task")
                    except Exception as exc:
                        # The refused transition changed nothing; the others go on.
                        self.errors.record(operation, exc)
                        if self.errors.strict:
                            counted = True
                            raise
        except Exception as exc:
            # Entering or committing the transaction failed (or strict mode re-raises).
            if not counted:
                self.errors.record("close", exc)
            if self.errors.strict:
                raise

    def stop(self) -> None:
        """Stop this process's heartbeat thread (if one was started)."""
        hb, self._hb = self._hb, None
        if hb is not None and self._hb_pid == os.getpid():
            self.errors.call("heartbeat", hb.stop)


def _live_heartbeater(ledger: Any, interval: float, snapshot: Callable[[], list[str]]) -> Any:
    """A core ``Heartbeater`` (thread, interval, fork handling) that beats ``snapshot()``."""
    from task_state_guard import Heartbeater

    return Heartbeater(ledger, interval_seconds=interval, source=snapshot)
