"""The Dramatiq middleware that records every message and attempt in a TaskStateGuard ledger."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from dramatiq.middleware import Middleware, Shutdown, TimeLimitExceeded
from task_state_guard import (
    Heartbeater,
    Ledger,
    LedgerError,
    ReconcilePolicy,
    StateConflict,
    Task,
    TaskNotFound,
)

from ._ids import attempt_task_id, label, logical_task_id
from ._settings import Settings, resolve_settings

if TYPE_CHECKING:
    from dramatiq.broker import Broker, MessageProxy
    from dramatiq.message import Message
    from dramatiq.worker import Worker

__all__ = ["ACTOR_OPTION", "TaskStateGuardMiddleware"]

logger = logging.getLogger("task_state_guard_dramatiq")

#: The actor option that gives a message's logical task a user-facing delivery obligation.
ACTOR_OPTION = "tsg_delivery"

_STATE_ATTR = "_tsg_attempt"

# Middleware that must run *inside* ours: if one of them precedes us in the list, its
# before-hooks can skip a message before we see it, and our after-hooks would run before
# Retries/AgeLimit have decided the message's fate.
_INNER_MIDDLEWARE = (
    "AgeLimit",
    "TimeLimit",
    "ShutdownNotifications",
    "Callbacks",
    "Pipelines",
    "Retries",
    "AsyncIO",
    "CurrentMessage",
    "Results",
)

_Outcome = tuple[str, "str | None"]

# Actor names are few and fixed: compute each ledger label once.
_label = lru_cache(maxsize=1024)(label)


@dataclass(eq=False)
class _Attempt:
    """Per-delivery state, kept on the MessageProxy (one proxy per delivery)."""

    message_id: str
    parent_id: str
    attempt_id: str
    name: str | None
    retry_enqueued: bool = False
    next_retries: int | None = None
    parent_outcome: _Outcome | None = None
    deferred_delivery: _Outcome | None = None
    beats: list[str] = field(default_factory=list)


class _ProcessState:
    """Everything that belongs to one OS process (rebuilt after ``fork``)."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        # Guards the counters and tables below. Ledger writes need no lock of ours: the
        # core queues this process's threads on its own per-database writer lock.
        self.lock = threading.Lock()
        self.ledger: Ledger | None = None
        self.heartbeater: Heartbeater | None = None
        self.beats: Counter[str] = Counter()
        self.inflight: dict[str, list[_Attempt]] = {}
        self.errors: Counter[str] = Counter()
        self.late: Counter[str] = Counter()
        self.reconciles = 0
        self.reconcile_stop: threading.Event | None = None
        self.reconcile_thread: threading.Thread | None = None


class TaskStateGuardMiddleware(Middleware):
    """Record Dramatiq messages (logical tasks) and their attempts in a TaskStateGuard ledger.

    Add it **outermost** (first in ``broker.middleware``), before actor modules are imported;
    :func:`task_state_guard_dramatiq.install` does both checks for you. Settings come from the
    arguments, then from ``TSG_*`` environment variables (see :func:`resolve_settings`).

    No SQLite connection is opened here: the ledger is opened lazily, per process, on first
    use, so a broker built before a ``fork`` is safe.
    """

    def __init__(
        self,
        db: str | os.PathLike[str] | None = None,
        *,
        active_grace_seconds: float | None = None,
        delivery_grace_seconds: float | None = None,
        heartbeat_interval_seconds: float | None = None,
        reconcile_on_boot: bool | None = None,
        reconcile_interval_seconds: float | None = None,
        strict: bool | None = None,
    ) -> None:
        self.settings: Settings = resolve_settings(
            db=db,
            active_grace_seconds=active_grace_seconds,
            delivery_grace_seconds=delivery_grace_seconds,
            heartbeat_interval_seconds=heartbeat_interval_seconds,
            reconcile_on_boot=reconcile_on_boot,
            reconcile_interval_seconds=reconcile_interval_seconds,
            strict=strict,
        )
        self._proc = _ProcessState()
        self._local = threading.local()

    # ------------------------------------------------------------------ plumbing

    @property
    def actor_options(self) -> set[str]:
        """Declares the ``tsg_delivery`` actor option."""
        return {ACTOR_OPTION}

    @property
    def policy(self) -> ReconcilePolicy:
        """The reconcile policy built from the settings."""
        return ReconcilePolicy(
            active_grace_seconds=self.settings.active_grace_seconds,
            delivery_grace_seconds=self.settings.delivery_grace_seconds,
        )

    def _state(self) -> _ProcessState:
        proc = self._proc
        if proc.pid != os.getpid():
            # Forked: never touch the parent's connection, lock or threads.
            proc = self._proc = _ProcessState()
            self._local = threading.local()
        return proc

    @property
    def ledger(self) -> Ledger:
        """This process's ledger (opened on first use; reopened in a forked child)."""
        proc = self._state()
        ledger = proc.ledger
        if ledger is None:
            with proc.lock:
                if proc.ledger is None:
                    proc.ledger = Ledger(self.settings.db)
                ledger = proc.ledger
        return ledger

    def _error(self, kind: str, exc: BaseException) -> None:
        """A ledger call failed inside a hook: log once per kind, count, go on (or raise)."""
        proc = self._state()
        key = f"{kind}:{type(exc).__name__}"
        with proc.lock:
            proc.errors[key] += 1
            first = proc.errors[key] == 1
        if first:
            logger.error(
                "TaskStateGuard ledger error in %s (%s); the message is processed anyway. "
                "Further errors of this kind are counted, not logged.",
                kind,
                type(exc).__name__,
                exc_info=exc,
            )
        if self.settings.strict:
            raise exc

    def _late(self, kind: str, task: str) -> None:
        """A close conflicted with a terminal state written elsewhere: never a rewrite."""
        proc = self._state()
        key = f"{kind}:{task}"
        with proc.lock:
            proc.late[key] += 1
            first = proc.late[key] == 1
        if first:
            logger.warning(
                "TaskStateGuard: late %s of an %s that is already closed with another "
                "state (e.g. timed out by reconcile); the ledger keeps the first outcome. "
                "Further occurrences are counted, not logged.",
                kind,
                task,
            )

    def stats(self) -> dict[str, Any]:
        """Counters of this process: ledger errors per kind, late completions, reconciles."""
        proc = self._state()
        with proc.lock:
            return {
                "errors": dict(proc.errors),
                "late_completions": dict(proc.late),
                "reconciles": proc.reconciles,
                "inflight": sum(len(v) for v in proc.inflight.values()),
            }

    def _beat(self, proc: _ProcessState, state: _Attempt, ids: list[str]) -> None:
        hb = proc.heartbeater
        with proc.lock:
            for task_id in ids:
                proc.beats[task_id] += 1
                if proc.beats[task_id] == 1 and hb is not None:
                    hb.add(task_id)
                state.beats.append(task_id)

    def _unbeat(self, proc: _ProcessState, state: _Attempt) -> None:
        hb = proc.heartbeater
        with proc.lock:
            for task_id in state.beats:
                proc.beats[task_id] -= 1
                if proc.beats[task_id] <= 0:
                    del proc.beats[task_id]
                    if hb is not None:
                        hb.discard(task_id)
            state.beats.clear()

    # ------------------------------------------------------------------ worker lifecycle

    def before_worker_boot(self, broker: Broker, worker: Worker) -> None:
        """Reconcile (before this process consumes anything), then start the heartbeater."""
        self._check_placement(broker)
        proc = self._state()
        if self.settings.reconcile_on_boot:
            self.reconcile(kind="before_worker_boot")
        try:
            ledger = self.ledger
            with proc.lock:
                if proc.heartbeater is None:
                    proc.heartbeater = Heartbeater(
                        ledger, interval_seconds=self.settings.heartbeat_interval_seconds
                    )
                    for task_id in proc.beats:
                        proc.heartbeater.add(task_id)
                    proc.heartbeater.start()
        except Exception as exc:
            self._error("before_worker_boot", exc)
        interval = self.settings.reconcile_interval_seconds
        if interval is not None and proc.reconcile_thread is None:
            stop = threading.Event()
            thread = threading.Thread(
                target=self._reconcile_loop,
                args=(stop, interval),
                name="tsg-reconcile",
                daemon=True,
            )
            proc.reconcile_stop, proc.reconcile_thread = stop, thread
            thread.start()

    def after_worker_shutdown(self, broker: Broker, worker: Worker) -> None:
        """Stop heartbeats (attempts can run, and even start, until this point)."""
        proc = self._state()
        with proc.lock:
            hb, proc.heartbeater = proc.heartbeater, None
            stop, thread = proc.reconcile_stop, proc.reconcile_thread
            proc.reconcile_stop = proc.reconcile_thread = None
        if stop is not None:
            stop.set()
        if thread is not None:
            thread.join(timeout=5)
        if hb is not None:
            try:
                hb.stop()
            except Exception as exc:
                self._error("after_worker_shutdown", exc)
        stats = self.stats()
        if stats["errors"] or stats["late_completions"]:
            logger.warning(
                "TaskStateGuard summary: ledger errors %s; late completions %s",
                sorted(stats["errors"].items()),
                sorted(stats["late_completions"].items()),
            )

    def _reconcile_loop(self, stop: threading.Event, interval: float) -> None:
        while not stop.wait(interval):
            self.reconcile(kind="periodic_reconcile")

    def reconcile(self, *, kind: str = "reconcile") -> dict[str, Any] | None:
        """Run the core's reconcile with this middleware's graces; errors are guarded."""
        try:
            report = self.ledger.reconcile(self.policy)
        except Exception as exc:
            self._error(kind, exc)
            return None
        proc = self._state()
        with proc.lock:
            proc.reconciles += 1
        logger.info("TaskStateGuard reconcile (%s): %s", kind, report)
        return report

    def _check_placement(self, broker: Broker) -> None:
        for mw in broker.middleware:
            if mw is self:
                return
            if type(mw).__name__ in _INNER_MIDDLEWARE:
                logger.warning(
                    "TaskStateGuardMiddleware is placed after %s; it must be the outermost "
                    "middleware (use task_state_guard_dramatiq.install) or skipped and retried "
                    "messages are recorded wrongly.",
                    type(mw).__name__,
                )
                return

    # ------------------------------------------------------------------ messages

    def before_process_message(self, broker: Broker, message: MessageProxy) -> None:
        """Open (or find) the logical task and record a new running attempt under it.

        One ledger transaction, committed before the actor runs: the logical task's creation
        and start (first delivery) and the attempt's creation (or claim) and start.
        """
        self._local.current = None
        try:
            state = self._start_attempt(broker, message)
        except Exception as exc:
            self._error("before_process_message", exc)
            return
        setattr(message, _STATE_ATTR, state)
        self._local.current = state

    def _start_attempt(self, broker: Broker, message: MessageProxy) -> _Attempt:
        ledger = self.ledger
        proc = self._state()
        message_id = message.message_id
        options = message.options
        delivery = options.get(ACTOR_OPTION)
        if delivery is None:
            try:
                delivery = broker.get_actor(message.actor_name).options.get(ACTOR_OPTION)
            except Exception:
                delivery = None
        name = _label(message.actor_name)
        parent_id = logical_task_id(message_id)
        retries = int(options.get("retries") or 0)
        expected_id = attempt_task_id(message_id, retries)
        with ledger.atomic():
            self._open_parent(ledger, parent_id, bool(delivery), name)
            attempt_id = self._claim_attempt(
                ledger, parent_id, expected_id, name, queued=retries > 0
            )
        state = _Attempt(
            message_id=message_id, parent_id=parent_id, attempt_id=attempt_id, name=name
        )
        self._beat(proc, state, [attempt_id, parent_id])
        with proc.lock:
            proc.inflight.setdefault(message_id, []).append(state)
        return state

    @staticmethod
    def _open_parent(
        ledger: Ledger, parent_id: str, delivery_required: bool, name: str | None
    ) -> None:
        """Create the logical task (idempotent) and start it if it is still queued."""
        try:
            queued = (
                ledger.create_task(
                    task_id=parent_id, delivery_required=delivery_required, name=name
                ).status
                == "queued"
            )
        except StateConflict:
            # Same message, other attributes (e.g. the actor option changed between
            # deployments): keep the existing logical task as it is; start it if queued.
            queued = True
        if queued:
            # owner=False: the broker redelivers an unacked message after a crash, so the
            # logical task outlives the process that happens to run an attempt. A
            # StateConflict means it is not queued (another delivery started it first).
            with contextlib.suppress(StateConflict):
                ledger.start_task(parent_id, owner=False)

    @staticmethod
    def _claim_attempt(
        ledger: Ledger, parent_id: str, expected_id: str, name: str | None, *, queued: bool
    ) -> str:
        """Start the expected attempt; if another delivery already has it, record a fresh one.

        ``queued``: a retry scheduled this attempt, so it normally exists already (queued).
        Returns the id of the attempt now running, owned by this process.
        """
        if queued:
            try:
                ledger.start_task(expected_id, owner=True)
                return expected_id
            except TaskNotFound:
                pass  # the retry was not recorded (ledger error then): create it now
            except StateConflict:
                return TaskStateGuardMiddleware._fresh_attempt(ledger, parent_id, name)
        try:
            task = ledger.create_task(
                task_id=expected_id, parent_id=parent_id, delivery_required=False, name=name
            )
            if task.status != "queued":  # this message's first attempt exists: a duplicate
                return TaskStateGuardMiddleware._fresh_attempt(ledger, parent_id, name)
            ledger.start_task(expected_id, owner=True)
            return expected_id
        except StateConflict:
            return TaskStateGuardMiddleware._fresh_attempt(ledger, parent_id, name)

    @staticmethod
    def _fresh_attempt(ledger: Ledger, parent_id: str, name: str | None) -> str:
        task = ledger.create_task(parent_id=parent_id, delivery_required=False, name=name)
        ledger.start_task(task.id, owner=True)
        return task.id

    def after_enqueue(self, broker: Broker, message: Message[Any], delay: int | None) -> None:
        """Notice Retries (or any middleware) re-enqueueing the message being processed."""
        current: _Attempt | None = getattr(self._local, "current", None)
        if current is not None and current.message_id == message.message_id:
            current.retry_enqueued = True
            retries = message.options.get("retries")
            current.next_retries = int(retries) if retries is not None else None

    def after_process_message(
        self,
        broker: Broker,
        message: MessageProxy,
        *,
        result: Any | None = None,
        exception: BaseException | None = None,
    ) -> None:
        """Close the attempt; with it, in one transaction, queue the next attempt of a retry."""
        self._local.current = None
        state: _Attempt | None = getattr(message, _STATE_ATTR, None)
        if state is None:
            return
        self._unbeat(self._state(), state)
        retry_id: str | None = None
        if exception is None:
            attempt: _Outcome = ("succeeded", "worker_completed")
            parent: _Outcome | None = ("succeeded", "worker_completed")
        else:
            retried = state.retry_enqueued and not message.failed
            if isinstance(exception, TimeLimitExceeded):
                attempt = ("timed_out", "time_limit_exceeded")
            elif isinstance(exception, Shutdown):
                attempt = ("cancelled", "interrupted")
            elif retried:
                attempt = ("failed", "retry_scheduled")
            else:
                attempt = ("failed", "worker_failed")
            parent = None if retried else ("failed", "worker_failed")
            if retried:
                retries = state.next_retries
                if retries is None:
                    retries = int(message.options.get("retries") or 0)
                retry_id = attempt_task_id(state.message_id, retries)
        state.parent_outcome = parent
        self._close_attempt(state, attempt, retry_id)

    def after_skip_message(self, broker: Broker, message: MessageProxy) -> None:
        """SkipMessage (e.g. AgeLimit): the attempt is ``cancelled/skipped``."""
        self._local.current = None
        state: _Attempt | None = getattr(message, _STATE_ATTR, None)
        if state is None:
            return
        self._unbeat(self._state(), state)
        # A failed skip (AgeLimit) is dead-lettered; a plain skip is acked.
        state.parent_outcome = ("failed", None) if message.failed else ("cancelled", "skipped")
        self._close_attempt(state, ("cancelled", "skipped"), None)

    def _close_attempt(self, state: _Attempt, outcome: _Outcome, retry_id: str | None) -> None:
        """Close the attempt and, for a scheduled retry, create its queued successor.

        Both in one transaction. The successor goes first, so the logical task never has a
        moment without an open child. A conflict of either one changes nothing by itself
        and does not stop the other; errors are reported once the transaction is over.
        """
        status, code = outcome
        errors: list[BaseException] = []
        late = False
        try:
            ledger = self.ledger
            with ledger.atomic():
                if retry_id is not None:
                    try:
                        ledger.create_task(
                            task_id=retry_id,
                            parent_id=state.parent_id,
                            delivery_required=False,
                            name=state.name,
                        )
                    except LedgerError as exc:
                        errors.append(exc)
                try:
                    ledger.close_task(state.attempt_id, status, code=code)
                except StateConflict:
                    late = True
        except Exception as exc:
            errors.append(exc)
        if late:
            self._late("completion", "attempt")
        for error in errors:
            self._error("after_process_message", error)

    def after_ack(self, broker: Broker, message: MessageProxy) -> None:
        """The message is settled and will not come back: close the logical task."""
        self._settle(message, "after_ack")

    def after_nack(self, broker: Broker, message: MessageProxy) -> None:
        """The message is dead-lettered: close the logical task (failed)."""
        self._settle(message, "after_nack")

    def _settle(self, message: MessageProxy, kind: str) -> None:
        state: _Attempt | None = getattr(message, _STATE_ATTR, None)
        if state is None:
            return  # not an attempt of ours (e.g. the ConsumerThread ack of a delay copy)
        proc = self._state()
        with proc.lock:
            same = proc.inflight.get(state.message_id)
            if same is not None:
                if state in same:
                    same.remove(state)
                if not same:
                    del proc.inflight[state.message_id]
        outcome = state.parent_outcome
        if outcome is None:
            if state.deferred_delivery is not None:
                logger.warning(
                    "TaskStateGuard: a delivery mark made during an attempt that was retried "
                    "is dropped; call mark_delivered once the logical task has finished."
                )
            return
        self._close_parent(state, outcome, kind)

    def _close_parent(self, state: _Attempt, outcome: _Outcome, kind: str) -> None:
        """Close the logical task and write a delivery mark made by the actor, in one go."""
        status, code = outcome
        errors: list[tuple[str, BaseException]] = []
        late = False
        try:
            ledger = self.ledger
            with ledger.atomic():
                try:
                    ledger.close_task(state.parent_id, status, code=code)
                except StateConflict:
                    late = True
                if state.deferred_delivery is not None:
                    dstatus, dcode = state.deferred_delivery
                    try:
                        ledger.set_delivery(state.parent_id, dstatus, code=dcode)
                    except LedgerError as exc:
                        errors.append(("mark_delivered", exc))
        except Exception as exc:
            errors.append((kind, exc))
        if late:
            self._late("completion", "logical task")
        for where, error in errors:
            self._error(where, error)

    # ------------------------------------------------------------------ public helpers

    def logical_task_id(self, message_id: str) -> str:
        """The ledger id of the logical task of ``message_id`` (see module function)."""
        return logical_task_id(message_id)

    def current_attempt_id(self) -> str | None:
        """The attempt id of the message running in this thread (sync actors), if any."""
        state: _Attempt | None = getattr(self._local, "current", None)
        return state.attempt_id if state is not None else None

    def mark_delivered(self, message_id: str) -> Task | None:
        """Record that the result of ``message_id`` reached its user (transport acknowledged).

        Call it only after your transport confirmed; a broker ack is not a delivery.
        Called while that message is still being processed in this process (from inside
        the actor), the mark is applied as soon as the logical task closes and ``None`` is
        returned. Otherwise it is written at once and the updated logical task returned;
        ledger errors (for example ``StateConflict`` while the logical task is still
        running elsewhere) are raised to the caller.
        """
        return self._mark(message_id, ("delivered", "transport_acknowledged"))

    def mark_delivery_failed(self, message_id: str) -> Task | None:
        """Record that delivering the result of ``message_id`` failed (same rules as above)."""
        return self._mark(message_id, ("failed", "transport_failed"))

    def _mark(self, message_id: str, outcome: _Outcome) -> Task | None:
        parent_id = logical_task_id(message_id)
        proc = self._state()
        with proc.lock:
            inflight = proc.inflight.get(message_id)
            if inflight:
                inflight[-1].deferred_delivery = outcome
                return None
        status, code = outcome
        return self.ledger.set_delivery(parent_id, status, code=code)
