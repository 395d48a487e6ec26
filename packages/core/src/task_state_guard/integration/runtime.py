"""The adapter runtime: everything an adapter needs between its framework's hooks and the ledger.

One :class:`AdapterRuntime` per installed adapter. It owns

* the per-process ledger handle: opened lazily on first use in each process; a forked child
  never touches its parent's handle, heartbeat thread or counters (it starts afresh);
* ref-counted heartbeats: :meth:`hold` a running task while a job runs, :meth:`release` it after;
  one daemon thread per process beats every held task every ``heartbeat_seconds``;
* opening, claiming and closing attempts (closing an attempt closes its delivery
  ``not_applicable/internal_task`` in the same transaction) and logical tasks;
* the error policy (:class:`~task_state_guard.integration.ErrorPolicy`);
* delivery marks (:meth:`mark_delivered`, :meth:`mark_delivery_failed`), reconcile and the
  counters behind every adapter's ``stats()``.

Transition methods raise ledger errors; an adapter wraps each framework hook in
:meth:`guarded` so that the policy (count, log once per kind, raise only when strict) decides.
Refused closes of terminal records are counted as conflicts inside the close methods.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import uuid
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import Any

from ..heartbeat import Heartbeater
from ..ledger import Ledger
from ..model import LedgerBusy, LedgerError, StateConflict, Task, TaskNotFound
from ..reconcile import ReconcilePolicy
from . import codes
from .errors import ErrorPolicy
from .settings import Settings

#: One close: ``(task_id, status, code, internal)``; ``internal`` marks an attempt.
Closing = tuple[str, str, "str | None", bool]

_BOOT_RECONCILE_TRIES = 5


class _Process:
    """State that belongs to one OS process (rebuilt after fork, never inherited)."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.lock = threading.Lock()
        self.open_lock = threading.Lock()
        self.ledger: Ledger | None = None
        self.heartbeater: Heartbeater | None = None
        self.refs: Counter[str] = Counter()
        self.deferred: dict[str, codes.Outcome] = {}
        self.reconciles = 0


class AdapterRuntime:
    """The integration layer one installed adapter runs on (see the module docstring).

    ``ledger``: an already open ledger to use instead of opening ``settings.db`` per process
    (the caller keeps closing it). ``subject`` names the framework's unit of work in log lines.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        logger: logging.Logger,
        subject: str = "job",
        ledger: Ledger | None = None,
    ) -> None:
        self.settings = settings
        self.logger = logger
        self.policy = ErrorPolicy(logger, strict=settings.strict, subject=subject)
        self._external = ledger
        self._proc = _Process()
        #: The report of this process's last reconcile (counts only), if any.
        self.last_reconcile: dict[str, Any] | None = None

    # ------------------------------------------------------------------ per process

    def _state(self) -> _Process:
        proc = self._proc
        if proc.pid != os.getpid():
            # Forked: drop the inherited state without touching it.
            proc = self._proc = _Process()
        return proc

    @property
    def ledger(self) -> Ledger:
        """This process's ledger (opened on first use; a forked child opens its own)."""
        if self._external is not None:
            return self._external
        proc = self._state()
        led = proc.ledger
        if led is None:
            with proc.open_lock:
                led = proc.ledger
                if led is None:
                    led = Ledger(self.settings.db, busy_timeout_ms=self.settings.busy_timeout_ms)
                    proc.ledger = led
        return led

    def ledger_or_none(self) -> Ledger | None:
        """The ledger, or ``None`` when it cannot be opened right now (not counted)."""
        try:
            return self.ledger
        except LedgerError:
            return None

    def drop_ledger(self) -> None:
        """Close this process's own ledger handle (e.g. right before the framework forks).

        The next use opens a fresh one; held tasks keep being heartbeaten.
        """
        proc = self._state()
        with proc.open_lock:
            led, proc.ledger = proc.ledger, None
        with proc.lock:
            hb, proc.heartbeater = proc.heartbeater, None
        if hb is not None:
            with self.guarded("heartbeat"):
                hb.stop()
        if led is not None:
            with self.guarded("close"):
                led.close()
        if proc.refs and self.settings.heartbeat_seconds > 0:
            self._start_heartbeats(proc)

    def close(self) -> None:
        """Stop this process's heartbeats and close its own ledger handle (idempotent)."""
        proc = self._state()
        with proc.lock:
            hb, proc.heartbeater = proc.heartbeater, None
            proc.refs.clear()
        if hb is not None:
            with self.guarded("close"):
                hb.stop()
        with proc.open_lock:
            led, proc.ledger = proc.ledger, None
        if led is not None:
            with self.guarded("close"):
                led.close()

    @contextmanager
    def guarded(self, where: str) -> Iterator[None]:
        """Apply the error policy to the block (for the body of a framework hook)."""
        with self.policy.guarded(where):
            yield

    # ------------------------------------------------------------------ heartbeats

    def hold(self, *task_ids: str) -> None:
        """Heartbeat ``task_ids`` until released (counted: hold twice, release twice)."""
        proc = self._state()
        with proc.lock:
            proc.refs.update(task_ids)
            start = proc.heartbeater is None and self.settings.heartbeat_seconds > 0
        if start:
            self._start_heartbeats(proc)

    def release(self, *task_ids: str) -> None:
        """Undo one :meth:`hold` of each of ``task_ids``."""
        proc = self._state()
        with proc.lock:
            refs = proc.refs
            for task_id in task_ids:
                left = refs.get(task_id, 0) - 1
                if left > 0:
                    refs[task_id] = left
                else:
                    refs.pop(task_id, None)

    def held(self, task_id: str) -> bool:
        """True while a job of this process holds ``task_id``."""
        proc = self._state()
        with proc.lock:
            return task_id in proc.refs

    def _held_ids(self) -> list[str]:
        proc = self._state()
        with proc.lock:
            return list(proc.refs)

    def _start_heartbeats(self, proc: _Process) -> None:
        try:
            hb = Heartbeater(
                self.ledger, interval_seconds=self.settings.heartbeat_seconds,
                source=self._held_ids,
            )
        except Exception as exc:
            self.policy.error("heartbeat", exc)
            return
        with proc.lock:
            if proc.heartbeater is not None:
                return
            proc.heartbeater = hb
        hb.start()

    def stop_heartbeats(self) -> None:
        """Stop this process's heartbeat thread (held tasks stay held; :meth:`hold` restarts)."""
        proc = self._state()
        with proc.lock:
            hb, proc.heartbeater = proc.heartbeater, None
        if hb is not None:
            with self.guarded("heartbeat"):
                hb.stop()

    # ------------------------------------------------------------------ opening

    def open_logical(
        self,
        task_id: str,
        *,
        delivery_required: bool,
        name: str | None,
        start: bool = True,
        owner: bool = False,
    ) -> None:
        """Record the logical task (idempotent) and, with ``start``, start it if still queued.

        A logical task recorded earlier with other attributes (say the delivery option changed
        between deployments) is kept as it is. ``owner=True`` records this process as its owner:
        only right when no other process can take the job over (no broker redelivery).
        """
        led = self.ledger
        with led.atomic():
            try:
                state = led._create(task_id, None, None, delivery_required, name, None, quiet=True)
                queued = state == codes.QUEUED
            except StateConflict:
                queued = True
            if start and queued:
                with suppress(StateConflict):  # already started by a concurrent delivery
                    led._start_quiet(task_id, owner=owner)

    def start_task(
        self,
        task_id: str,
        *,
        parent_id: str | None,
        delivery_required: bool,
        name: str | None,
        timeout_seconds: float | None = None,
        owner: bool = True,
    ) -> None:
        """Create ``task_id`` (idempotent) and start it, in one transaction.

        ``StateConflict`` when it exists and is no longer queued (another process claimed it).
        """
        led = self.ledger
        with led.atomic():
            led._create(
                task_id, parent_id, timeout_seconds, delivery_required, name, None, quiet=True
            )
            led._start_quiet(task_id, owner=owner)

    def queue_attempt(
        self,
        attempt_id: str,
        parent_id: str,
        *,
        name: str | None,
        timeout_seconds: float | None = None,
    ) -> None:
        """Record a queued attempt under ``parent_id`` (idempotent): a retry or requeue that the
        broker will deliver later. It keeps the logical task fresh until a delivery claims it."""
        self.ledger._create(attempt_id, parent_id, timeout_seconds, False, name, None, quiet=True)

    def claim_attempt(
        self,
        parent_id: str,
        *,
        name: str | None,
        timeout_seconds: float | None = None,
        expected: Iterable[tuple[str, bool]] = (),
        fresh_id: str | None = None,
    ) -> str:
        """Start the attempt this delivery runs as, owned by this process; return its id.

        ``expected``: ``(attempt_id, create)`` candidates in order, e.g. the queued placeholder of
        a scheduled retry (``create=True`` records it first when its own signal has not arrived
        yet). The first one that can still be started is claimed. When none can (another
        delivery of the same message has it: two deliveries never share an attempt), a fresh
        attempt is recorded, with id ``fresh_id`` or a random one. ``TaskNotFound`` when the
        logical task does not exist. One transaction.
        """
        led = self.ledger
        with led.atomic():
            for candidate, create in expected:
                try:
                    if create:
                        self.queue_attempt(
                            candidate, parent_id, name=name, timeout_seconds=timeout_seconds
                        )
                    led._start_quiet(candidate, owner=True)
                    return candidate
                except (StateConflict, TaskNotFound):
                    continue
            attempt = fresh_id or str(uuid.uuid4())
            self.start_task(
                attempt,
                parent_id=parent_id,
                delivery_required=False,
                name=name,
                timeout_seconds=timeout_seconds,
            )
            return attempt

    # ------------------------------------------------------------------ closing

    def close_tasks(self, closings: Sequence[Closing], *, where: str = "close") -> int:
        """Close several tasks in one transaction, in the given order (innermost first).

        A task that owes no delivery (every attempt, and a logical task without a delivery
        obligation) has its delivery closed ``not_applicable/internal_task`` in the same
        transaction; ``internal`` marks an attempt (it names the conflict kind). A logical task
        gets the delivery mark its running job made (:meth:`mark_delivered` from inside the
        job), also in the same transaction. Each close is judged on its own: a refused close
        (a terminal record is never rewritten) is counted as a conflict and does not undo the
        others; any other error goes through the error policy under ``where`` once the block
        is over. Returns how many tasks this call closed.
        """
        if not closings:
            return 0
        proc = self._state()
        errors: list[BaseException] = []
        closed = 0
        with proc.lock:
            marks = {c[0]: proc.deferred.pop(c[0]) for c in closings if c[0] in proc.deferred}
        try:
            led = self.ledger
            with led.atomic():
                for task_id, status, code, internal in closings:
                    try:
                        closed += self._close_one(led, task_id, status, code, internal)
                        mark = marks.get(task_id)
                        if mark is not None:
                            led.set_delivery(task_id, mark[0], code=mark[1])
                    except LedgerError as exc:
                        errors.append(exc)
        except Exception as exc:
            errors.append(exc)
        for error in errors:
            self.policy.error(where, error)
        return closed

    def _close_one(
        self, led: Ledger, task_id: str, status: str, code: str | None, internal: bool
    ) -> int:
        try:
            # One statement closes the task and, when it owes no delivery, its delivery too.
            led._close_settled_quiet(task_id, status, code)
        except StateConflict:
            self.policy.conflict("attempt_close" if internal else "logical_close")
            # Closed otherwise (e.g. by a reconcile): an internal task still owes nobody a
            # delivery; the core refuses this for a delivering task, which keeps its own.
            with suppress(StateConflict):
                led.set_delivery(task_id, codes.NOT_APPLICABLE, code=codes.INTERNAL_TASK)
            return 0
        return 1

    def close_attempt(
        self, attempt_id: str, status: str, code: str | None, *, where: str = "close"
    ) -> bool:
        """Close one attempt and its delivery (``not_applicable/internal_task``) together."""
        return self.close_tasks(((attempt_id, status, code, True),), where=where) == 1

    def close_logical(
        self, task_id: str, status: str, code: str | None, *, where: str = "close"
    ) -> bool:
        """Close a logical task (with the delivery mark its job made, if any); one that owes no
        delivery has it closed ``not_applicable/internal_task`` at once."""
        return self.close_tasks(((task_id, status, code, False),), where=where) == 1

    def get(self, task_id: str) -> Task | None:
        """The task, or ``None`` when the ledger has no such task."""
        try:
            return self.ledger.get_task(task_id)
        except TaskNotFound:
            return None

    # ------------------------------------------------------------------ deliveries

    def mark_delivered(self, logical_id: str) -> Task | None:
        """Record that the job's result reached its recipient (``transport_acknowledged``).

        Outside the running job: written at once; returns the updated logical task and raises
        the core's errors (``InvalidInput``, ``TaskNotFound``, ``StateConflict`` when the logical
        task is not terminal yet or its delivery closed otherwise, ``StorageError``), whatever
        ``strict`` says: the caller asked for this write. Inside the running job of that logical
        task in this process: the mark is kept and written in the transaction that closes the
        logical task; returns ``None``. If the job ends without closing it (a retry was
        scheduled), the mark is dropped with a warning and counted as a conflict.
        """
        return self._mark(logical_id, (codes.DELIVERED, codes.TRANSPORT_ACKNOWLEDGED))

    def mark_delivery_failed(self, logical_id: str) -> Task | None:
        """Record that delivering the result failed (``failed/transport_failed``); see
        :meth:`mark_delivered` for the rules."""
        return self._mark(logical_id, (codes.DELIVERY_FAILED, codes.TRANSPORT_FAILED))

    def _mark(self, logical_id: str, outcome: codes.Outcome) -> Task | None:
        proc = self._state()
        with proc.lock:
            if logical_id in proc.refs:
                proc.deferred[logical_id] = outcome
                return None
        return self.ledger.set_delivery(logical_id, outcome[0], code=outcome[1])

    def drop_deferred_mark(self, logical_id: str) -> None:
        """Forget a delivery mark made inside a job that ended without closing its logical task."""
        proc = self._state()
        with proc.lock:
            dropped = proc.deferred.pop(logical_id, None)
        if dropped is not None:
            self.policy.conflict("delivery_mark_dropped")

    # ------------------------------------------------------------------ reconcile, counters

    @property
    def reconcile_policy(self) -> ReconcilePolicy:
        """The reconcile policy built from the settings' graces."""
        return ReconcilePolicy(
            active_grace_seconds=self.settings.active_grace_seconds,
            delivery_grace_seconds=self.settings.delivery_grace_seconds,
        )

    def reconcile(self, *, dry_run: bool = False) -> dict[str, Any]:
        """Run the core's reconcile with the settings' graces (raises ledger errors)."""
        report = dict(self.ledger.reconcile(self.reconcile_policy, dry_run=dry_run))
        if not dry_run:
            proc = self._state()
            with proc.lock:
                proc.reconciles += 1
            self.last_reconcile = report
        return report

    def boot_reconcile(self, where: str = "boot_reconcile") -> dict[str, Any] | None:
        """Reconcile when a worker boots, if ``reconcile_on_boot``; guarded by the error policy.

        A busy ledger (several workers booting at once) is retried a few times; reconcile is
        idempotent. Logs the counts-only report (compact JSON) at info level.
        """
        if not self.settings.reconcile_on_boot:
            return None
        return self.guarded_reconcile(where)

    def guarded_reconcile(self, where: str = "reconcile") -> dict[str, Any] | None:
        """:meth:`reconcile` under the error policy (``None`` on error)."""
        with self.guarded(where):
            for attempt in range(_BOOT_RECONCILE_TRIES):
                try:
                    report = self.reconcile()
                except LedgerBusy:
                    if attempt == _BOOT_RECONCILE_TRIES - 1:
                        raise
                    continue
                self.logger.info(
                    "task-state-guard: reconcile (%s) %s",
                    where,
                    json.dumps(report, sort_keys=True, separators=(",", ":")),
                )
                return report
        return None

    def stats(self) -> dict[str, Any]:
        """This process's counters, with the same keys in every adapter.

        ``errors``: ledger errors by ``"<where>:<ExceptionClass>"``; ``conflicts``: refused
        rewrites of terminal records by kind (``attempt_close``, ``logical_close``,
        ``delivery_mark_dropped``); ``reconciles``: reconciles run; ``heartbeating``: tasks this
        process holds right now.
        """
        proc = self._state()
        with proc.lock:
            reconciles, held = proc.reconciles, len(proc.refs)
        return {
            "errors": self.policy.errors(),
            "conflicts": self.policy.conflicts(),
            "reconciles": reconciles,
            "heartbeating": held,
        }


__all__ = ["AdapterRuntime", "Closing"]
