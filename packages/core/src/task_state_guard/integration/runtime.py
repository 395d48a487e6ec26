"""The adapter runtime: everything an adapter needs between its framework's hooks and the ledger.

One :class:`AdapterRuntime` per installed adapter. It owns

* the per-process ledger handle: opened lazily on first use in each process; a forked child
  never touches its parent's handle, heartbeat thread or counters (it starts afresh);
  :meth:`AdapterRuntime.check_ledger` opens it at worker start and says loudly when it cannot
  be used (``require_ledger`` refuses to start);
* ref-counted heartbeats: :meth:`hold` a running task while a job runs, :meth:`release` it after;
  one daemon thread per process beats every held task every ``heartbeat_seconds``;
* opening, claiming and closing attempts (closing an attempt closes its delivery
  ``not_applicable/internal_task`` in the same transaction) and logical tasks, which carry the
  adapter's framework label so that the ledger knows whom a lost verdict is owed to;
* the error policy (:class:`~task_state_guard.integration.ErrorPolicy`);
* delivery marks (:meth:`mark_delivered`, :meth:`mark_delivery_failed`), reconcile (at boot,
  periodically in a worker's main process, or on request) and the counters behind every
  adapter's ``stats()`` (with ``metrics_dir`` set, every increment is also added to the
  directory's counters file, so ``tsg metrics`` shows the sums of every process);
* lost jobs: whoever closes a logical task of this framework as lost (any reconcile, the CLI,
  another host), the ledger records a pending verdict in the same transaction (the verdict
  outbox). :meth:`publish_verdicts` drains them: each claimed verdict becomes a
  :class:`LostTask`, handed first to the adapter's result-backend writer
  (:attr:`AdapterRuntime.fail_lost`, unless ``fail_lost_results`` is off) and then to the
  user's ``on_lost`` hook, and is marked published. Adapters drain at worker start, after each
  reconcile they run (boot, periodic) and on request.

Transition methods raise ledger errors; an adapter wraps each framework hook in
:meth:`guarded` so that the policy (count, log once per kind, raise only when strict) decides.
Refused closes of terminal records are counted as conflicts inside the close methods.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

from ..heartbeat import Heartbeater
from ..ledger import Ledger
from ..metrics import adapter_counters
from ..model import (
    LedgerBusy,
    LedgerError,
    StateConflict,
    Task,
    TaskNotFound,
    check_framework,
    is_canonical,
)
from ..ops.reconcile import DecisionCallback, ReconcilePolicy
from ..ops.verdicts import Verdict
from ..process import THIS
from ..store.attempts import Ended
from . import codes
from .errors import ErrorPolicy, Guarded
from .metrics import CONFLICT_KINDS
from .settings import Settings

#: One close: ``(task_id, status, code, internal)``; ``internal`` marks an attempt.
Closing = tuple[str, str, "str | None", bool]


def _stored_id(framework_id: str | None) -> str | None:
    """A framework id as the ledger stores it: only a canonical UUID (else None)."""
    return framework_id if type(framework_id) is str and is_canonical(framework_id) else None

_BOOT_RECONCILE_TRIES = 5
# The report keys that count changes a pass made (the others count what it examined or kept).
_CHANGES = ("tasks_timed_out", "deliveries_failed", "deliveries_not_applicable")


#: Verdicts one drain step claims, and the lease it holds them for while it publishes.
VERDICT_BATCH = 100
VERDICT_LEASE_SECONDS = 60.0


@dataclass(frozen=True, slots=True)
class LostTask:
    """A job found lost: what the ``on_lost`` hook receives (in-process only, never logged).

    ``framework_id``: the framework's id of the job (Celery task id, Dramatiq message id,
    LangGraph invocation id) when it is known: a verdict carries it only where it was stored
    (a canonical UUID), else ``None`` (a custom Celery id, say: the hook still gets the ledger
    id and the name); ``task_id``: its logical task's ledger id; ``name``: the name label
    (task, actor or graph name); ``code``: why it was closed (``owner_lost``,
    ``restart_stale`` or ``deadline_exceeded``); ``thread_id``: the LangGraph thread, else
    ``None``.
    """

    framework_id: str | None
    task_id: str
    name: str | None
    code: str
    thread_id: str | None = None


#: The ``on_lost`` hook: called once per lost job, after the reconcile that found it committed.
LostHook = Callable[[LostTask], object]


class _Process:
    """State that belongs to one OS process (rebuilt after fork, never inherited)."""

    def __init__(self) -> None:
        self.pid = THIS.pid
        self.lock = threading.Lock()
        self.open_lock = threading.Lock()
        self.ledger: Ledger | None = None
        self.heartbeater: Heartbeater | None = None
        self.refs: Counter[str] = Counter()
        self.deferred: dict[str, codes.Outcome] = {}
        self.reconciles = 0
        self.published = 0
        self.counted = False  # has this process added to the metrics directory yet
        self.reconciler: tuple[threading.Event, threading.Thread] | None = None


class AdapterRuntime:
    """The integration layer one installed adapter runs on (see the module docstring).

    ``ledger``: an already open ledger to use instead of opening ``settings.db`` per process
    (the caller keeps closing it). ``subject`` names the framework's unit of work in log lines.
    ``framework``: the adapter's framework label (``celery``, ``dramatiq``, ``langgraph``): the
    logical tasks it opens carry it, so a close that declares one lost owes this framework a
    verdict, which :meth:`publish_verdicts` drains (``None``: no verdicts).
    ``on_lost``: the user's hook for lost jobs.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        logger: logging.Logger,
        subject: str = "job",
        ledger: Ledger | None = None,
        framework: str | None = None,
        on_lost: LostHook | None = None,
        adapter: str = "adapter",
    ) -> None:
        self.settings = settings
        self.logger = logger
        #: The ``adapter`` label of this runtime's counters (``celery``, ``dramatiq``, ...).
        self.adapter = adapter
        self.policy = ErrorPolicy(logger, strict=settings.strict, subject=subject)
        self._counters_failed = False
        if settings.metrics_dir is not None:
            self.policy.on_count = self._count_in_directory
        self._external = ledger
        self._proc = _Process()
        self.framework = check_framework(framework)
        #: ``(usable, reason)`` of this process's last attempt to open the ledger
        #: (``usable`` None: not tried yet); see :meth:`check_ledger`.
        self._health: tuple[bool | None, str | None] = (None if ledger is None else True, None)
        if on_lost is not None and not callable(on_lost):
            raise TypeError("on_lost must be callable")
        #: The user's hook for lost jobs (see :class:`LostTask`).
        self.on_lost: LostHook | None = on_lost
        #: The adapter's writer of a failure into the framework's result backend.
        self.fail_lost: LostHook | None = None
        #: How :meth:`publish_verdicts` publishes one claimed verdict: True when published
        #: (it is then marked), False to give it back for a later drain. ``None``: the
        #: default, :meth:`notify_lost` of its :class:`LostTask` (result backend, then
        #: ``on_lost``). An adapter that publishes otherwise (LangGraph: report and resume
        #: the lost thread) sets its own and keeps the claim, lease and marking here.
        self.publish_verdict: Callable[[Verdict], bool] | None = None
        #: Whether each applied reconcile (and a boot without one) drains this framework's
        #: verdicts. False for an adapter whose own passes publish them (LangGraph: a recovery
        #: pass reconciles, then reports and resumes the lost threads it finds, where it knows
        #: their thread ids; a plain reconcile of the same process leaves them pending for it).
        self.drain_after_reconcile = True
        #: The report of this process's last reconcile (counts only), if any.
        self.last_reconcile: dict[str, Any] | None = None

    # ------------------------------------------------------------------ counters

    def _count_in_directory(self, family: str, labels: Mapping[str, str]) -> None:
        """Add one increment to the metrics directory's counters file; never raises (a failure
        is logged once per process, and the in-process counters still count)."""
        directory = self.settings.metrics_dir
        if directory is None:
            return
        increments: list[adapter_counters.Increment] = [
            (family, {**labels, "adapter": self.adapter}, 1)]
        proc = self._state()
        if not proc.counted:  # this process's first: its adapter's counters appear at zero
            proc.counted = True
            increments += [("tsg_adapter_conflicts_total", {"adapter": self.adapter, "kind": k}, 0)
                           for k in CONFLICT_KINDS]
            increments.append(("tsg_adapter_reconciles_total", {"adapter": self.adapter}, 0))
            increments.append(
                ("tsg_adapter_verdicts_published_total", {"adapter": self.adapter}, 0))
        try:
            adapter_counters.add(directory, increments)
        except (OSError, ValueError) as exc:
            if not self._counters_failed:
                self._counters_failed = True
                self.logger.warning(
                    "task-state-guard: the adapter counters cannot be added to the metrics "
                    "directory (%s); this process's counters stay in stats() only.",
                    type(exc).__name__,
                )

    # ------------------------------------------------------------------ per process

    def _state(self) -> _Process:
        proc = self._proc
        if proc.pid != THIS.pid:
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
                    try:
                        led = Ledger(
                            self.settings.db, busy_timeout_ms=self.settings.busy_timeout_ms
                        )
                    except LedgerError as exc:
                        self._health = (False, exc.reason)
                        raise
                    self._health = (True, None)
                    proc.ledger = led
        return led

    def check_ledger(self, where: str = "worker_start") -> bool:
        """Open this process's ledger now (at worker start, before any job): True when usable.

        An unusable ledger (an unsafe or missing location, a foreign schema, an unreachable
        server) is logged once at ERROR with its fixed reason, counted as an error of ``where``
        (like any hook's), shows in :meth:`stats` (``ledger_usable``, ``ledger_reason``) and,
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
        """Stop this process's heartbeats and periodic reconcile and close its own ledger
        handle (idempotent)."""
        self.stop_periodic_reconcile()
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

    def guarded(self, where: str) -> Guarded:
        """Apply the error policy to the block (for the body of a framework hook)."""
        return self.policy.guarded(where)

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
        framework_id: str | None = None,
    ) -> None:
        """Record the logical task (idempotent) and, with ``start``, start it if still queued.

        A logical task recorded earlier with other attributes (say the delivery option changed
        between deployments) is kept as it is. ``owner=True`` records this process as its owner:
        only right when no other process can take the job over (no broker redelivery).
        ``framework_id`` is stored only when it is a canonical UUID (Celery's default task ids,
        Dramatiq message ids); any other id may carry user data and is never stored.
        """
        led = self.ledger
        with led.atomic():
            try:
                queued = led.create_task(
                    task_id=task_id, delivery_required=delivery_required, name=name,
                    framework_id=_stored_id(framework_id), framework=self.framework,
                ).status == codes.QUEUED
            except StateConflict:
                queued = True
            if start and queued:
                with suppress(StateConflict):  # already started by a concurrent delivery
                    led.start_task(task_id, owner=owner)

    def start_task(
        self,
        task_id: str,
        *,
        parent_id: str | None,
        delivery_required: bool,
        name: str | None,
        timeout_seconds: float | None = None,
        owner: bool = True,
        framework_id: str | None = None,
        redelivery_seconds: float | None = None,
    ) -> None:
        """Create ``task_id`` (idempotent) and start it, in one transaction.

        ``StateConflict`` when it exists and is no longer queued (another process claimed it).
        ``framework_id`` is stored only when it is a canonical UUID (see :meth:`open_logical`);
        a task without a parent is a logical task and carries this runtime's framework label, as
        does a child that owes its own delivery (a LangGraph resume or recovery run: a job of its
        own, whose loss is owed a verdict like a root's).
        ``redelivery_seconds``: the attempt's redelivery window, recorded with the start (see
        :meth:`claim_attempt`).
        """
        led = self.ledger
        with led.atomic():
            led.create_task(
                task_id=task_id, parent_id=parent_id, timeout_seconds=timeout_seconds,
                delivery_required=delivery_required, name=name,
                framework_id=_stored_id(framework_id),
                # a job carries the framework's label (see open_logical); an attempt does not
                framework=self.framework if parent_id is None or delivery_required else None,
            )
            led.start_task(task_id, owner=owner, redelivery_seconds=redelivery_seconds)

    def begin_task(
        self,
        task_id: str,
        *,
        parent_id: str | None,
        name: str | None,
        framework_id: str | None = None,
    ) -> None:
        """:meth:`start_task` of a delivering task owned by this process (no timeout, no
        redelivery window) as one write: the core's *begin attempt* of the task alone
        (``Ledger.begin_attempt`` with ``attempt=False``), the same records and errors."""
        self.ledger.begin_attempt(
            task_id, parent_id=parent_id, name=name, delivery_required=True,
            framework_id=_stored_id(framework_id), framework=self.framework,
            open_logical=True, logical_owner=True, attempt=False,
        )

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
        self.ledger.create_task(
            task_id=attempt_id, parent_id=parent_id, timeout_seconds=timeout_seconds,
            delivery_required=False, name=name,
        )

    def claim_attempt(
        self,
        parent_id: str,
        *,
        name: str | None,
        timeout_seconds: float | None = None,
        expected: Iterable[tuple[str, bool]] = (),
        fresh_id: str | None = None,
        redelivery_window: float | None = None,
    ) -> str:
        """Start the attempt this delivery runs as, owned by this process; return its id.

        ``expected``: ``(attempt_id, create)`` candidates in order, e.g. the queued placeholder of
        a scheduled retry (``create=True`` records it first when its own signal has not arrived
        yet). The first one that can still be started is claimed. When none can (another
        delivery of the same message has it: two deliveries never share an attempt), a fresh
        attempt is recorded, with id ``fresh_id`` or a random one. ``TaskNotFound`` when the
        logical task does not exist. One write (``Ledger.begin_attempt``).

        ``redelivery_window``: when the broker hands this delivery's job to another worker if
        this one dies (late acknowledgement, visibility timeout), how long after the attempt's
        last sign of life the broker puts it back in its queue (see
        :mod:`~task_state_guard.integration.redelivery`). It is recorded with the start itself,
        no extra write; once the attempt is lost, reconcile keeps the logical task fresh for
        that window plus its active grace (for the requeued job to reach a free worker), so a
        job that will run again is not declared lost before then.
        """
        return self.ledger.begin_attempt(
            parent_id, name=name, open_logical=False, candidates=expected, attempt_id=fresh_id,
            timeout_seconds=timeout_seconds, redelivery_seconds=redelivery_window,
        )

    def begin_attempt(
        self,
        logical_id: str,
        *,
        delivery_required: bool,
        name: str | None,
        framework_id: str | None = None,
        open_logical: bool = True,
        logical_owner: bool = False,
        expected: Iterable[tuple[str, bool]] = (),
        fresh_id: str | None = None,
        timeout_seconds: float | None = None,
        redelivery_window: float | None = None,
    ) -> str:
        """A delivery of a job begins: one write, committed before the body runs
        (``Ledger.begin_attempt``), then the attempt and its logical task are held
        (heartbeaten) until :meth:`end_attempt`; returns the attempt's id.

        With ``open_logical`` the logical task is recorded (with this runtime's framework
        label; ``framework_id`` stored only when it is a canonical UUID) and started if still
        queued (``logical_owner``: see :meth:`open_logical`); then the attempt is claimed as
        :meth:`claim_attempt` does (``expected``, ``fresh_id``, ``redelivery_window``).
        ``TaskNotFound`` when the logical task does not exist (and is not opened).
        """
        attempt = self.ledger.begin_attempt(
            logical_id, name=name, delivery_required=delivery_required,
            framework_id=_stored_id(framework_id), framework=self.framework,
            open_logical=open_logical, logical_owner=logical_owner, candidates=expected,
            attempt_id=fresh_id, timeout_seconds=timeout_seconds,
            redelivery_seconds=redelivery_window,
        )
        self.hold(attempt, logical_id)
        return attempt

    # ------------------------------------------------------------------ closing

    def end_attempt(
        self,
        attempt_id: str,
        outcome: codes.Outcome,
        *,
        logical_id: str,
        settled: codes.Outcome | None,
        retry: tuple[str, str | None, float | None] | None = None,
        also: Sequence[Closing] = (),
        where: str = "close",
    ) -> int:
        """A delivery of a job ended: one write (``Ledger.end_attempt``) that closes the
        attempt with ``outcome`` (its delivery ``not_applicable/internal_task``), the tasks of
        ``also`` (after it), and, when the framework has ``settled`` the job, the logical task
        with that outcome and the delivery mark its job made, if any; a scheduled ``retry``
        (``(attempt_id, name, timeout_seconds)``) is queued first. A job that ends without
        settling drops its delivery mark (counted). Releases the attempt and the logical task
        (held by :meth:`begin_attempt`). Conflicts and errors as :meth:`close_tasks`; returns
        how many tasks this call closed.
        """
        self.release(attempt_id, logical_id)
        closings: list[Closing] = [(attempt_id, outcome[0], outcome[1], True), *also]
        if settled is not None:
            closings.append((logical_id, settled[0], settled[1], False))
        queue = () if retry is None else ((retry[0], logical_id, retry[1], retry[2]),)
        closed = self.close_tasks(closings, where=where, queue=queue)
        if settled is None:
            self.drop_deferred_mark(logical_id)
        return closed

    def close_and_claim(
        self,
        closings: Sequence[Closing],
        parent_id: str,
        *,
        name: str | None,
        fresh_id: str,
        where: str = "close",
    ) -> str | None:
        """:meth:`close_tasks` of ``closings`` and then :meth:`claim_attempt` of a new attempt
        ``fresh_id`` under ``parent_id`` as one write (``Ledger.end_and_begin_attempt``): a
        boundary between two attempts. Refused closes are explained and counted as
        :meth:`close_tasks` does; returns the attempt started, or None when its start was
        refused (the closes still committed; ``claim_attempt`` explains it). When the write
        itself fails, nothing was written and the error is raised."""
        proc = self._state()
        with proc.lock:
            marks = {c[0]: proc.deferred.pop(c[0]) for c in closings if c[0] in proc.deferred}
        try:
            ended, begun = self.ledger.end_and_begin_attempt(
                [(c[0], c[1], c[2]) for c in closings], parent_id, marks=marks, name=name,
                attempt_id=fresh_id,
            )
        except BaseException:
            with proc.lock:  # nothing was written: the marks wait for the next close
                for task_id, mark in marks.items():
                    proc.deferred.setdefault(task_id, mark)
            raise
        errors: list[BaseException] = []
        self._explain(ended, closings, (), marks, errors)
        for error in errors:
            self.policy.error(where, error)
        return begun

    def _explain(
        self,
        ended: Ended,
        closings: Sequence[Closing],
        queue: Sequence[tuple[str, str, str | None, float | None]],
        marks: dict[str, tuple[str, str | None]],
        errors: list[BaseException],
    ) -> int:
        """What an *end attempt* refused, explained (or done) one task at a time: how many
        more tasks were closed so (ledger errors are added to ``errors``)."""
        led = self.ledger
        closed = 0
        for attempt, parent, name, timeout in queue:
            if attempt not in ended.queued:
                try:
                    self.queue_attempt(attempt, parent, name=name, timeout_seconds=timeout)
                except LedgerError as exc:
                    errors.append(exc)
        for task_id, status, code, internal in closings:
            if task_id in ended.closed:
                continue
            try:
                closed += self._close_one(led, task_id, status, code, internal)
                mark = marks.get(task_id)
                if mark is not None:
                    led.set_delivery(task_id, mark[0], code=mark[1])
            except LedgerError as exc:
                errors.append(exc)
        return closed

    def close_tasks(
        self,
        closings: Sequence[Closing],
        *,
        where: str = "close",
        queue: Sequence[tuple[str, str, str | None, float | None]] = (),
    ) -> int:
        """Close several tasks in one write (``Ledger.end_attempt``), in the given order
        (innermost first), after recording the queued attempts of ``queue`` (``(attempt_id,
        parent_id, name, timeout_seconds)``: a scheduled retry, idempotent).

        A task that owes no delivery (every attempt, and a logical task without a delivery
        obligation) has its delivery closed ``not_applicable/internal_task`` in the same
        change; ``internal`` marks an attempt (it names the conflict kind). A logical task
        gets the delivery mark its running job made (:meth:`mark_delivered` from inside the
        job), also in the same change. Each close is judged on its own: a refused close
        (a terminal record is never rewritten) is counted as a conflict and does not undo the
        others; any other error goes through the error policy under ``where`` once the write is
        over. Returns how many tasks this call closed.
        """
        if not closings and not queue:
            return 0
        proc = self._state()
        errors: list[BaseException] = []
        closed = 0
        with proc.lock:
            marks = {c[0]: proc.deferred.pop(c[0]) for c in closings if c[0] in proc.deferred}
        try:
            ended = self.ledger.end_attempt(
                [(c[0], c[1], c[2]) for c in closings], marks=marks, queue=queue
            )
            closed = len(ended.closed)
            # What the write refused is explained (or done) one task at a time.
            closed += self._explain(ended, closings, queue, marks, errors)
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
            led.close_task_settled(task_id, status, code=code)
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

    def reconcile(
        self, *, dry_run: bool = False, on_decision: DecisionCallback | None = None
    ) -> dict[str, Any]:
        """Run the core's reconcile with the settings' graces (raises ledger errors).

        ``on_decision`` receives each task the pass closed or whose delivery it closed (see
        :class:`~task_state_guard.ReconcileDecision`). An applied pass is followed by a drain
        of this framework's verdicts (:meth:`publish_verdicts`, under the error policy): the
        jobs this pass found lost, and any a reconcile elsewhere left owed. The returned
        report is counts only.
        """
        report = dict(
            self.ledger.reconcile(
                self.reconcile_policy, dry_run=dry_run, on_decision=on_decision
            )
        )
        if not dry_run:
            proc = self._state()
            with proc.lock:
                proc.reconciles += 1
            if self.policy.on_count is not None:
                self.policy.on_count("tsg_adapter_reconciles_total", {})
            self.last_reconcile = report
            if self.drain_after_reconcile:
                self.policy.call("publish_verdicts", self.publish_verdicts)
        return report

    # ------------------------------------------------------------------ lost jobs (the outbox)

    def _label(self) -> str:
        if self.framework is None:
            raise TypeError("this runtime has no framework label: it is owed no verdicts")
        return self.framework

    def claim_verdicts(
        self,
        *,
        limit: int = VERDICT_BATCH,
        lease_seconds: float = VERDICT_LEASE_SECONDS,
        task_ids: Iterable[str] | None = None,
    ) -> list[Verdict]:
        """Claim pending verdicts owed to this framework (see ``Ledger.claim_verdicts``): for an
        adapter that publishes in its own way (LangGraph resumes a lost thread); then
        :meth:`mark_published` or :meth:`release_verdicts`. Raises ledger errors."""
        return self.ledger.claim_verdicts(
            self._label(), limit=limit, lease_seconds=lease_seconds, task_ids=task_ids
        )

    def mark_published(self, verdicts: Iterable[Verdict]) -> int:
        """Mark claimed verdicts published; returns how many changed (raises ledger errors)."""
        done = self.ledger.mark_verdicts_published([v.task_id for v in verdicts])
        proc = self._state()
        with proc.lock:
            proc.published += done
        if self.policy.on_count is not None:
            for _ in range(done):
                self.policy.on_count("tsg_adapter_verdicts_published_total", {})
        return done

    def release_verdicts(self, verdicts: Iterable[Verdict]) -> int:
        """Give claimed verdicts back unpublished, for the next drain (raises ledger errors)."""
        return self.ledger.release_verdicts(verdicts)

    @staticmethod
    def lost_task(verdict: Verdict) -> LostTask:
        """The :class:`LostTask` the hook receives for a verdict."""
        return LostTask(verdict.framework_id, verdict.task_id, verdict.name, verdict.code)

    def publish_verdicts(self) -> int:
        """Drain the verdicts owed to this framework: claim a batch with a lease, publish each
        (:meth:`notify_lost`), mark it published; until none is left. Returns how many this
        call published. Raises ledger errors (the boot and periodic drains run it under the
        error policy).

        At least once across crashes (a process that dies between publishing and marking
        leaves the verdict to the next drain once its lease expired), exactly once otherwise;
        two live processes never hold the same verdict. A verdict whose result-backend write
        failed is released and this drain stops (the next one retries it); an ``on_lost`` hook
        that raises is counted and not called again for that verdict. Each verdict is published
        by :attr:`publish_verdict` when the adapter set one (an exception it raises is counted
        under ``publish_verdict:<Class>`` and the verdict given back).
        """
        if self.framework is None:
            return 0
        published = 0
        while True:
            batch = self.claim_verdicts()
            failed: list[Verdict] = []
            for verdict in batch:
                if self._publish_one(verdict):
                    published += self.mark_published([verdict])
                else:
                    failed.append(verdict)
            if failed:
                self.release_verdicts(failed)
            if failed or len(batch) < VERDICT_BATCH:
                return published

    def _publish_one(self, verdict: Verdict) -> bool:
        custom = self.publish_verdict
        if custom is None:
            return self.notify_lost(self.lost_task(verdict))
        try:
            return bool(custom(verdict))
        except Exception as exc:
            self.policy.record("publish_verdict", exc)
            return False

    def notify_lost(self, lost: LostTask) -> bool:
        """Write the failure into the result backend (unless ``fail_lost_results`` is off),
        then call ``on_lost``. An error of either is counted (``fail_lost_result:<Class>``,
        ``on_lost:<Class>``) and logged once per kind, never raised. Returns False when the
        result-backend write failed (the hook was not called: publish again later)."""
        writer = self.fail_lost
        if writer is not None and self.settings.fail_lost_results:
            try:
                writer(lost)
            except Exception as exc:
                self.policy.record("fail_lost_result", exc)
                return False
        hook = self.on_lost
        if hook is not None:
            try:
                hook(lost)
            except Exception as exc:
                self.policy.record("on_lost", exc)
        return True

    def start_periodic_reconcile(self, where: str = "periodic_reconcile") -> bool:
        """Reconcile every ``reconcile_interval_seconds`` in a daemon thread of this process
        (for a worker's main process); False when the interval is 0 or it already runs."""
        interval = self.settings.reconcile_interval_seconds
        if interval <= 0:
            return False
        proc = self._state()
        with proc.lock:
            if proc.reconciler is not None:
                return False
            stop = threading.Event()
            thread = threading.Thread(
                target=self._reconcile_loop, args=(stop, interval, where),
                name="tsg-reconcile", daemon=True,
            )
            proc.reconciler = (stop, thread)
        thread.start()
        return True

    def stop_periodic_reconcile(self) -> None:
        """Stop this process's periodic reconcile, if it runs (idempotent)."""
        proc = self._state()
        with proc.lock:
            running, proc.reconciler = proc.reconciler, None
        if running is not None:
            running[0].set()
            if running[1] is not threading.current_thread():
                running[1].join(timeout=5)

    def _reconcile_loop(self, stop: threading.Event, interval: float, where: str) -> None:
        while not stop.wait(interval):
            self.guarded_reconcile(where, quiet_when_unchanged=True)

    def boot(self, where: str = "boot") -> dict[str, Any] | None:
        """What a worker does when it starts, before it consumes: :meth:`check_ledger` (an
        unusable ledger is logged once at ERROR; with ``require_ledger`` it raises, and the
        worker must not start), then, when the ledger is usable, :meth:`boot_reconcile` (the
        reconcile if ``reconcile_on_boot``, and the drain of this framework's verdicts).
        Returns the reconcile's report, if one ran."""
        if not self.check_ledger(where):
            return None
        return self.boot_reconcile(where)

    def boot_reconcile(self, where: str = "boot_reconcile") -> dict[str, Any] | None:
        """Reconcile when a worker boots, if ``reconcile_on_boot``; guarded by the error policy.

        A busy ledger (several workers booting at once) is retried a few times; reconcile is
        idempotent. Logs the counts-only report (compact JSON) at info level. Either way the
        verdicts owed to this framework are drained (a reconcile elsewhere may have left some).
        """
        if not self.settings.reconcile_on_boot:
            if self.drain_after_reconcile:
                self.guarded_publish(where)
            return None
        return self.guarded_reconcile(where)

    def guarded_publish(self, where: str = "publish_verdicts") -> int | None:
        """:meth:`publish_verdicts` under the error policy (``None`` on error)."""
        return self.policy.call(where, self.publish_verdicts)

    def guarded_reconcile(
        self, where: str = "reconcile", *, quiet_when_unchanged: bool = False
    ) -> dict[str, Any] | None:
        """:meth:`reconcile` under the error policy (``None`` on error); logs the counts-only
        report at info level, or at debug level when ``quiet_when_unchanged`` and the pass
        changed nothing (a periodic pass: a quiet fleet logs nothing at info level)."""
        with self.guarded(where):
            for attempt in range(_BOOT_RECONCILE_TRIES):
                try:
                    report = self.reconcile()
                except LedgerBusy:
                    if attempt == _BOOT_RECONCILE_TRIES - 1:
                        raise
                    continue
                changed = any(report[key] for key in _CHANGES)
                self.logger.log(
                    logging.DEBUG if quiet_when_unchanged and not changed else logging.INFO,
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
        process holds right now; ``verdicts_published``: lost-job verdicts this process
        published; ``ledger_usable``: whether this process's ledger could be opened (``None``
        before the first try) and ``ledger_reason``: the fixed reason when it could not.
        """
        proc = self._state()
        with proc.lock:
            reconciles, held, published = proc.reconciles, len(proc.refs), proc.published
        usable, reason = self._health
        return {
            "errors": self.policy.errors(),
            "conflicts": self.policy.conflicts(),
            "reconciles": reconciles,
            "heartbeating": held,
            "verdicts_published": published,
            "ledger_usable": usable,
            "ledger_reason": reason,
        }


__all__ = [
    "VERDICT_BATCH", "VERDICT_LEASE_SECONDS", "AdapterRuntime", "Closing", "LostHook", "LostTask",
]
