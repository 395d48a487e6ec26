"""The Dramatiq middleware: message hooks translated into calls on the core's adapter runtime."""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Unpack

from dramatiq.middleware import Middleware, MiddlewareError, Shutdown, TimeLimitExceeded
from task_state_guard import Ledger, LedgerError
from task_state_guard.integration import (
    AdapterRuntime,
    AdapterSurface,
    AttemptSpec,
    LostHook,
    LostTask,
    SettingArgs,
    name_label,
    resolve_settings,
)
from task_state_guard.integration import codes as c

from ._ids import MESSAGES, attempt_task_id, logical_task_id
from ._redelivery import broker_window

if TYPE_CHECKING:
    from dramatiq.broker import Broker, MessageProxy
    from dramatiq.message import Message
    from dramatiq.results import Results
    from dramatiq.worker import Worker

__all__ = [
    "ACTOR_OPTION",
    "LedgerUnavailable",
    "TaskLostError",
    "TaskStateGuardMiddleware",
    "add_outermost",
    "find",
    "uninstall",
]

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


class TaskLostError(Exception):
    """Stored in the ``Results`` backend for a message a reconcile found lost.

    ``message.get_result()`` then raises ``dramatiq.results.ResultFailure`` (whose
    ``orig_exc_type`` is ``"TaskLostError"``) instead of timing out. ``args`` are
    ``(message, code)`` with the ledger's reason code.
    """

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "task lost"


class LedgerUnavailable(MiddlewareError):
    """Raised in ``before_worker_boot`` when ``require_ledger`` is set and the ledger cannot be
    used (the reason is logged at ERROR): Dramatiq lets a ``MiddlewareError`` stop the worker
    process, and the CLI then stops the others."""


@dataclass(eq=False)
class _Attempt:
    """Per-delivery state, kept on the MessageProxy (one proxy per delivery)."""

    message_id: str
    parent_id: str
    attempt_id: str
    name: str | None
    retry_enqueued: bool = False
    next_retries: int | None = None
    #: Decided when the body's hooks end, written at the ack (or nack): the attempt's outcome,
    #: the logical task's (None: a retry was scheduled, it stays open) and the retry's attempt.
    outcome: c.Outcome | None = None
    parent_outcome: c.Outcome | None = None
    retry_id: str | None = None
    open: bool = True


class TaskStateGuardMiddleware(Middleware, AdapterSurface):
    """Record Dramatiq messages (logical tasks) and their attempts in a TaskStateGuard ledger.

    Add it **outermost** (first in ``broker.middleware``), before actor modules are imported;
    :func:`task_state_guard_dramatiq.install` does both for you. Settings: argument, then
    ``TSG_<NAME>`` environment variable, then the default shared by every adapter.
    ``mark_delivered``, ``mark_delivery_failed``, ``reconcile``, ``stats`` and ``settings`` are
    the core's :class:`~task_state_guard.integration.AdapterSurface` (one meaning in every
    adapter); the ids are Dramatiq message ids.

    No SQLite connection is opened here: the ledger is opened lazily, per process, on first
    use, so a broker built before a ``fork`` is safe.
    """

    adapter_name = "dramatiq"
    id_scheme = MESSAGES

    def __init__(
        self,
        db: str | os.PathLike[str] | None = None,
        *,
        on_lost: LostHook | None = None,
        **settings: Unpack[SettingArgs],
    ) -> None:
        resolved = resolve_settings(db=db, **settings)
        self.runtime = AdapterRuntime(
            resolved, logger=logger, subject="message", framework="dramatiq", on_lost=on_lost,
            adapter=self.adapter_name,
        )
        self.runtime.fail_lost = self._fail_lost_result
        self._local = threading.local()
        self._broker: Broker | None = None
        # (broker, its redelivery window), read once per broker on first use
        self._window: tuple[Any, float | None] | None = None

    # ------------------------------------------------------------------ public surface

    @property
    def actor_options(self) -> set[str]:
        """Declares the ``tsg_delivery`` actor option."""
        return {ACTOR_OPTION}

    @property
    def ledger(self) -> Ledger:
        """This process's ledger (opened on first use; reopened in a forked child)."""
        return self.runtime.ledger

    def current_attempt_id(self) -> str | None:
        """The attempt id of the message running in this thread (sync actors), if any."""
        state: _Attempt | None = getattr(self._local, "current", None)
        return state.attempt_id if state is not None else None

    def uninstall(self) -> None:
        """Remove this middleware from the broker it was installed on and close it."""
        broker = self._broker
        if broker is not None:
            uninstall(broker)
        else:
            self.close()

    def close(self) -> None:
        """Stop this process's threads and close its ledger handle (idempotent)."""
        self._stop_threads()
        self.runtime.close()

    # ------------------------------------------------------------------ worker lifecycle

    def before_worker_boot(self, broker: Broker, worker: Worker) -> None:
        """Before this process consumes anything: open the ledger (an unusable one is logged
        once at ERROR; with ``require_ledger`` the error is raised and the process does not
        boot), reconcile, publish the verdicts owed to Dramatiq; start this worker process's
        verdict drain (every ``verdict_interval_seconds``, default 10 s) and periodic reconcile
        (when ``reconcile_interval_seconds`` is above 0). A PostgreSQL ledger keeps one
        statement connection per worker thread in this process and one for the consumer thread
        (the ack and nack hooks write there), unless its URL sets ``connections=``."""
        self._check_placement(broker)
        self._attach(broker)
        threads = getattr(worker, "worker_threads", None)
        self.runtime.connections = None if threads is None else threads + 1
        try:
            self.runtime.boot("before_worker_boot")
        except LedgerError as exc:
            if not self.settings.require_ledger:
                raise  # strict mode: Dramatiq logs it, the process boots
            raise LedgerUnavailable(
                f"task-state-guard: the ledger cannot be used ({exc.reason}) and "
                "require_ledger is set"
            ) from None
        self.runtime.start_periodic_reconcile()
        self.runtime.start_verdict_drain()

    def after_worker_shutdown(self, broker: Broker, worker: Worker) -> None:
        """Stop heartbeats, the periodic reconcile and the verdict drain (attempts can run
        until this point)."""
        self._stop_threads()
        stats = self.stats()
        if stats["errors"] or stats["conflicts"]:
            logger.warning(
                "TaskStateGuard summary: ledger errors %s; conflicts %s",
                sorted(stats["errors"].items()),
                sorted(stats["conflicts"].items()),
            )

    def _stop_threads(self) -> None:
        self.runtime.stop_periodic_reconcile()
        self.runtime.stop_verdict_drain()
        self.runtime.stop_heartbeats()

    def _attach(self, broker: Broker) -> None:
        """Remember ``broker`` (if none yet) and consult its ``Results`` backend before a job
        is declared lost: the runtime's success check is set only when the broker has one (a
        broker without results never pays for the check's dry run)."""
        if self._broker is None:
            self._broker = broker
        has_results = _results_of(self._broker) is not None
        self.runtime.framework_success = self._framework_success if has_results else None

    def _stored_result(self, lost: LostTask) -> tuple[Results, Message[Any], int] | None:
        """The ``Results`` middleware, the message to address its stored result by, and the
        actor's result TTL, for a lost message whose actor stores results; else None."""
        broker = self._broker
        if broker is None or lost.name is None or lost.framework_id is None:
            return None  # no message id stored (or no broker yet): nothing to address a result by
        results = _results_of(broker)
        if results is None:
            return None
        try:
            actor = broker.get_actor(lost.name)
        except Exception:
            return None  # not an actor of this broker (the label differs from the actor name)
        if not actor.options.get("store_results", results.store_results):
            return None
        from dramatiq import Message

        message: Message[Any] = Message(
            queue_name=actor.queue_name, actor_name=actor.actor_name, args=(), kwargs={},
            options={}, message_id=lost.framework_id,
        )
        return results, message, actor.options.get("result_ttl", results.result_ttl)

    def _framework_success(self, lost: LostTask) -> bool:
        """The runtime's success check: True when the ``Results`` backend holds a value (not
        an exception) for the lost message. A backend error is raised (the runtime counts it
        and treats the job as not known to have succeeded, its verdict as not publishable
        yet)."""
        if lost.framework_id is None or logical_task_id(lost.framework_id) != lost.task_id:
            return False  # not a Dramatiq message's logical task
        found = self._stored_result(lost)
        if found is None:
            return False
        from dramatiq.results import ResultFailure, ResultMissing

        results, message, _ttl = found
        try:
            results.backend.get_result(message)
        except (ResultMissing, ResultFailure):
            return False  # nothing stored (or expired), or a failure
        return True

    def _fail_lost_result(self, lost: LostTask) -> None:
        """Store :class:`TaskLostError` for a lost message when the ``Results`` middleware is
        configured and the actor stores results, unless a result is stored already."""
        found = self._stored_result(lost)
        if found is None:
            return
        from dramatiq.results import ResultFailure, ResultMissing

        results, message, ttl = found
        try:
            results.backend.get_result(message)
        except ResultMissing:
            pass
        except ResultFailure:
            return  # a failure is stored already
        else:
            return  # a result is stored already: never overwritten
        error = TaskLostError(
            f"task-state-guard: the worker running this message was lost ({lost.code})",
            lost.code,
        )
        results.backend.store_exception(message, error, ttl)

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

        One ledger write, committed before the actor runs (``begin_attempt``): the logical
        task's creation and start (first delivery) and the attempt's creation (or claim) and
        start.
        """
        self._local.current = None
        with self.runtime.guarded("before_process_message"):
            state = self._start_attempt(broker, message)
            setattr(message, _STATE_ATTR, state)
            self._local.current = state

    def _start_attempt(self, broker: Broker, message: MessageProxy) -> _Attempt:
        rt = self.runtime
        # Each read through the worker's MessageProxy is a failed lookup first: read once.
        message_id, options, actor_name = message.message_id, message.options, message.actor_name
        delivery = options.get(ACTOR_OPTION)
        if delivery is None:
            try:
                delivery = broker.get_actor(actor_name).options.get(ACTOR_OPTION)
            except Exception:
                delivery = None
        name = name_label(actor_name)
        parent_id = logical_task_id(message_id)
        retries = int(options.get("retries") or 0)
        # No owner for the logical task: the broker redelivers an unacked message after a
        # crash, so the logical task outlives the process that happens to run an attempt.
        attempt_id = rt.begin_attempt(
            AttemptSpec(
                parent_id, name, candidates=((attempt_task_id(message_id, retries), True),),
                redelivery_seconds=self._redelivery_window(broker),
            ),
            delivery_required=bool(delivery), framework_id=message_id,
        )
        return _Attempt(message_id, parent_id, attempt_id, name)

    def _redelivery_window(self, broker: Broker) -> float | None:
        """How long after an attempt's last sign of life ``broker`` may still redeliver its
        message: Dramatiq acknowledges only after processing, so on any real broker the message
        of a worker that died comes back (see ``_redelivery``)."""
        cached = self._window
        if cached is None or cached[0] is not broker:
            cached = self._window = (broker, broker_window(broker))
        return cached[1]

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
        """Decide the attempt's outcome (and the retry's attempt); the ack writes it."""
        self._local.current = None
        state: _Attempt | None = getattr(message, _STATE_ATTR, None)
        if state is None:
            return
        retry_id: str | None = None
        if exception is None:
            attempt: c.Outcome = (c.SUCCEEDED, c.WORKER_COMPLETED)
            parent: c.Outcome | None = (c.SUCCEEDED, c.WORKER_COMPLETED)
        else:
            retried = state.retry_enqueued and not message.failed
            if isinstance(exception, TimeLimitExceeded):
                attempt = (c.TIMED_OUT, c.TIME_LIMIT_EXCEEDED)
            elif isinstance(exception, Shutdown):
                attempt = (c.CANCELLED, c.INTERRUPTED)
            elif retried:
                attempt = (c.FAILED, c.RETRY_SCHEDULED)
            else:
                attempt = (c.FAILED, c.WORKER_FAILED)
            parent = None if retried else (c.FAILED, c.WORKER_FAILED)
            if retried:
                retries = state.next_retries
                if retries is None:
                    retries = int(message.options.get("retries") or 0)
                retry_id = attempt_task_id(state.message_id, retries)
        state.outcome, state.parent_outcome, state.retry_id = attempt, parent, retry_id

    def after_skip_message(self, broker: Broker, message: MessageProxy) -> None:
        """SkipMessage (e.g. AgeLimit): the attempt is ``cancelled/skipped``."""
        self._local.current = None
        state: _Attempt | None = getattr(message, _STATE_ATTR, None)
        if state is None:
            return
        # A failed skip (AgeLimit) is dead-lettered; a plain skip is acked.
        state.outcome = (c.CANCELLED, c.SKIPPED)
        state.parent_outcome = (c.FAILED, None) if message.failed else (c.CANCELLED, c.SKIPPED)

    def after_ack(self, broker: Broker, message: MessageProxy) -> None:
        """The message is settled and will not come back: close the attempt and the logical
        task (for a scheduled retry: the attempt, and queue the next one)."""
        self._settle(message, "after_ack")

    def after_nack(self, broker: Broker, message: MessageProxy) -> None:
        """The message is dead-lettered: close the attempt and the logical task (failed)."""
        self._settle(message, "after_nack")

    def _settle(self, message: MessageProxy, where: str) -> None:
        """One write (``end_attempt``): for a scheduled retry its queued attempt first, then
        the attempt's close and, unless a retry was scheduled, the logical task's. A process
        that dies before it (after the body, before the ack) leaves the attempt running: it
        is closed ``timed_out/owner_lost`` and the broker redelivers the message."""
        state: _Attempt | None = getattr(message, _STATE_ATTR, None)
        if state is None or not state.open:
            return  # not an attempt of ours (e.g. the ConsumerThread ack of a delay copy)
        state.open = False
        outcome = state.outcome
        if outcome is None:  # no outcome hook ran (a middleware failed before ours)
            outcome = (c.FAILED, c.WORKER_FAILED) if message.failed else (
                c.CANCELLED, c.SKIPPED)
            state.parent_outcome = (c.FAILED, c.WORKER_FAILED) if message.failed else outcome
        retry = None if state.retry_id is None else (state.retry_id, state.name, None)
        with self.runtime.guarded(where):
            self.runtime.end_attempt(
                state.attempt_id, outcome, logical_id=state.parent_id,
                settled=state.parent_outcome, retry=retry, where=where,
            )


def _results_of(broker: Broker) -> Results | None:
    """The broker's ``Results`` middleware, if it has one."""
    from dramatiq.results import Results

    return next((mw for mw in broker.middleware if isinstance(mw, Results)), None)


def add_outermost(broker: Broker, middleware: TaskStateGuardMiddleware) -> None:
    """Add ``middleware`` to ``broker`` before every other middleware, and remember the broker
    (for :meth:`TaskStateGuardMiddleware.uninstall`)."""
    if broker.middleware:
        broker.add_middleware(middleware, before=type(broker.middleware[0]))
        if broker.middleware[0] is not middleware:  # pragma: no cover - defensive
            broker.middleware.remove(middleware)
            broker.middleware.insert(0, middleware)
    else:
        broker.add_middleware(middleware)
    middleware._broker = None
    middleware._attach(broker)


def find(broker: Broker) -> TaskStateGuardMiddleware | None:
    """The TaskStateGuard middleware installed on ``broker``, if any."""
    for mw in broker.middleware:
        if isinstance(mw, TaskStateGuardMiddleware):
            return mw
    return None


def uninstall(broker: Broker) -> bool:
    """Remove the middleware that ``install`` added; ``True`` if there was one.

    Stops its heartbeat, periodic-reconcile and verdict-drain threads in this process, closes
    its ledger handle, and withdraws the ``tsg_delivery`` actor option unless another
    middleware still declares it. Actors already declared keep their options (Dramatiq does
    not re-validate).
    """
    middleware = find(broker)
    if middleware is None:
        return False
    broker.middleware.remove(middleware)
    middleware._broker = None
    middleware.runtime.framework_success = None
    middleware.after_worker_shutdown(broker, None)  # type: ignore[arg-type]
    middleware.runtime.close()
    if not any(ACTOR_OPTION in mw.actor_options for mw in broker.middleware):
        broker.actor_options.discard(ACTOR_OPTION)
    return True
