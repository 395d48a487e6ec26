"""The Celery guard: signal receivers that mirror Celery's task lifecycle into the ledger.

Model (DESIGN.md section 3):

* the logical task (one Celery task id) is a *parent* ledger task with the
  deterministic id ``uuid5(NAMESPACE, celery task id)``;
* every execution attempt is its own internal child (``delivery_required=False``);
* a retry closes the attempt ``failed/retry_scheduled`` and leaves a *queued*
  placeholder attempt under the parent, which the next delivery claims with
  ``start_task`` (a ``StateConflict`` means another delivery claimed it first: the
  delivery then records a fresh attempt of its own).

Which process sees which signal (research/celery.md): under prefork the main process
sees ``task_received``, ``task_revoked`` and the ``task_failure`` of lost children and
hard time limits; the pool child sees ``task_prerun``/``success``/``failure``/
``retry``/``postrun``. The main process injects a per-delivery token into the
request at receipt so that both sides name the same attempt.
"""

from __future__ import annotations

import logging
import os
import threading
import uuid
import weakref
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any

from celery import signals  # type: ignore[import-untyped]
from celery.exceptions import (  # type: ignore[import-untyped]
    Reject,
    SoftTimeLimitExceeded,
    TimeLimitExceeded,
    WorkerLostError,
)
from task_state_guard import (
    Heartbeater,
    Ledger,
    LedgerBusy,
    ReconcilePolicy,
    StateConflict,
    Task,
    TaskNotFound,
)

from ._config import Settings
from ._ids import (
    logical_task_id,
    name_label,
    replace_attempt_id,
    requeue_attempt_id,
    retry_attempt_id,
    token_attempt_id,
)

log = logging.getLogger("task_state_guard_celery")

#: Key of the per-delivery token injected into ``request_dict`` at receipt.
TOKEN_KEY = "tsg_attempt"

_ATTEMPT = "_tsg_attempt_id"
_PARENT = "_tsg_parent_id"
_CLOSED = "_tsg_closed"
_RELEASED = "_tsg_released"

_TERMINAL = frozenset({"succeeded", "failed", "timed_out", "cancelled"})
_ACTIVE = frozenset({"queued", "running"})

# (signal, receiver method name, signal label) wired by install()/uninstall().
_WIRING: tuple[tuple[Any, str, str], ...] = (
    (signals.task_received, "_on_task_received", "task_received"),
    (signals.task_prerun, "_on_task_prerun", "task_prerun"),
    (signals.task_success, "_on_task_success", "task_success"),
    (signals.task_failure, "_on_task_failure", "task_failure"),
    (signals.task_retry, "_on_task_retry", "task_retry"),
    (signals.task_postrun, "_on_task_postrun", "task_postrun"),
    (signals.task_revoked, "_on_task_revoked", "task_revoked"),
    (signals.before_task_publish, "_on_before_publish", "before_task_publish"),
    (signals.worker_before_create_process, "_on_before_fork", "worker_before_create_process"),
)


def _status(task: Task) -> str:
    return str(task.status)


class _ProcessState:
    """State that belongs to one process (rebuilt after fork, never inherited)."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.heartbeater: Heartbeater | None = None
        self.refs: Counter[str] = Counter()
        self.lock = threading.Lock()


class CeleryGuard:
    """Records a Celery app's task lifecycle in a TaskStateGuard ledger.

    Create it with :func:`task_state_guard_celery.install`; do not instantiate directly.
    """

    def __init__(self, app: Any, settings: Settings) -> None:
        self.app = app
        self.settings = settings
        self._ledger: Ledger | None = None
        self._ledger_lock = threading.Lock()
        self._stats_lock = threading.Lock()
        self._errors: Counter[str] = Counter()
        self._conflicts: Counter[str] = Counter()
        self._logged: set[str] = set()
        self._proc = _ProcessState()
        self._installed = False
        # Main process only: deliveries of acks_late tasks, so that a redelivery can
        # close the attempt of an earlier delivery whose process died silently
        # (acks_late + reject_on_worker_lost sends no signal at all).
        self._inflight: dict[str, list[tuple[str, int, bool, weakref.ref[Any]]]] = {}
        self._inflight_lock = threading.Lock()
        #: The report of the last reconcile on boot in this process (counts only).
        self.last_boot_report: dict[str, Any] | None = None

    # ------------------------------------------------------------------ public API

    @property
    def ledger(self) -> Ledger:
        """The ledger (opened lazily; the core reopens its connections after fork)."""
        led = self._ledger
        if led is None:
            with self._ledger_lock:
                led = self._ledger
                if led is None:
                    led = Ledger(self.settings.db, busy_timeout_ms=self.settings.busy_timeout_ms)
                    self._ledger = led
        return led

    @property
    def installed(self) -> bool:
        """Whether the guard's receivers are connected."""
        return self._installed

    def logical_task_id(self, celery_task_id: str) -> str:
        """The ledger id of the logical task (parent) of ``celery_task_id``."""
        return logical_task_id(celery_task_id)

    def mark_delivered(self, celery_task_id: str) -> Task | None:
        """Record that the application's transport acknowledged the task's result.

        Only application code knows this; a broker ack or a stored result is not a
        delivery. The task must be terminal. Returns the updated parent, or ``None``
        when the ledger refused or failed (logged and counted; raised when strict).
        """
        return self._set_delivery(celery_task_id, "delivered", "transport_acknowledged")

    def mark_delivery_failed(self, celery_task_id: str) -> Task | None:
        """Record that delivering the task's result failed (``failed/transport_failed``)."""
        return self._set_delivery(celery_task_id, "failed", "transport_failed")

    def reconcile(self, *, dry_run: bool = False) -> dict[str, Any]:
        """Run the core's reconcile with this guard's graces; returns the nine counts."""
        policy = ReconcilePolicy(
            active_grace_seconds=self.settings.active_grace_seconds,
            delivery_grace_seconds=self.settings.delivery_grace_seconds,
        )
        return dict(self.ledger.reconcile(policy, dry_run=dry_run))

    def stats(self) -> dict[str, dict[str, int]]:
        """This process's counters: ledger errors and rejected conflicts, by kind."""
        with self._stats_lock:
            return {"errors": dict(self._errors), "conflicts": dict(self._conflicts)}

    def uninstall(self) -> None:
        """Disconnect every receiver and the boot step, stop heartbeats, close the ledger."""
        from . import _install

        _install.uninstall_guard(self)

    # ------------------------------------------------------------ wiring helpers

    def _dispatch_uid(self, label: str) -> str:
        return f"task_state_guard_celery:{id(self.app)}:{label}"

    def _connect(self) -> None:
        for signal, method, label in _WIRING:
            signal.connect(
                getattr(self, method), weak=False, dispatch_uid=self._dispatch_uid(label)
            )
        self._installed = True

    def _disconnect(self) -> None:
        for signal, _method, label in _WIRING:
            signal.disconnect(dispatch_uid=self._dispatch_uid(label))
        self._installed = False
        proc = self._proc
        if proc.pid == os.getpid() and proc.heartbeater is not None:
            try:
                proc.heartbeater.stop()
            except Exception as exc:
                self._error("uninstall", exc)
        self._proc = _ProcessState()
        led = self._ledger
        self._ledger = None
        if led is not None:
            try:
                led.close()
            except Exception as exc:
                self._error("uninstall", exc)

    # ------------------------------------------------------------ error handling

    def _note_once(self, key: str, message: str, *args: Any) -> None:
        with self._stats_lock:
            if key in self._logged:
                return
            self._logged.add(key)
        log.warning(message, *args)

    def _error(self, hook: str, exc: BaseException) -> None:
        kind = f"{hook}:{type(exc).__name__}"
        with self._stats_lock:
            self._errors[kind] += 1
        self._note_once(
            "error:" + kind,
            "task-state-guard: ledger error in %s (%s: %s); the task runs on. "
            "Further errors of this kind are counted, not logged.",
            hook,
            type(exc).__name__,
            exc,
        )
        if self.settings.strict:
            raise exc

    def _conflict(self, kind: str) -> None:
        with self._stats_lock:
            self._conflicts[kind] += 1
        self._note_once(
            "conflict:" + kind,
            "task-state-guard: rejected conflicting transition (%s); the terminal record "
            "was not rewritten. Further conflicts of this kind are counted, not logged.",
            kind,
        )

    @contextmanager
    def _guarded(self, hook: str) -> Iterator[None]:
        try:
            yield
        except Exception as exc:
            self._error(hook, exc)

    def _ours(self, sender: Any) -> bool:
        app = getattr(sender, "app", None)
        return app is None or app is self.app

    # ------------------------------------------------------------ ledger helpers

    def _close(self, task_id: str, status: str, code: str, conflict_kind: str) -> bool:
        try:
            self.ledger.close_task(task_id, status, code=code)
        except StateConflict:
            self._conflict(conflict_kind)
            return False
        return True

    def _get(self, task_id: str) -> Task | None:
        try:
            return self.ledger.get_task(task_id)
        except TaskNotFound:
            return None

    def _ensure_parent(self, celery_id: str, task: Any) -> str:
        parent = logical_task_id(celery_id)
        self.ledger.create_task(
            task_id=parent,
            delivery_required=_delivers(task),
            name=name_label(getattr(task, "name", None)),
        )
        return parent

    def _new_attempt(self, attempt_id: str, parent: str, task: Any) -> None:
        self.ledger.create_task(
            task_id=attempt_id,
            parent_id=parent,
            delivery_required=False,
            name=name_label(getattr(task, "name", None)),
            timeout_seconds=_attempt_timeout(task),
        )

    def _resolve_attempt(
        self, token: Any, celery_id: str, retries: int, redelivered: bool, nesting: int = 0
    ) -> str | None:
        """Find the attempt a delivery ran as, from the main process.

        The executing process took, in order: the retry placeholder (retries > 0), the
        replacement placeholder (``Task.replace()``), the requeue placeholder (redelivered),
        or a fresh attempt named by the token.
        """
        if token:
            attempt = token_attempt_id(token)
            if attempt is not None and self._get(attempt) is not None:
                return attempt
        candidates = []
        if nesting > 0 and retries == 0:
            candidates.append(replace_attempt_id(celery_id, nesting))
        if redelivered:
            candidates.append(requeue_attempt_id(celery_id, retries))
        if retries > 0:
            candidates.append(retry_attempt_id(celery_id, retries))
        for candidate in candidates:
            found = self._get(candidate)
            if found is not None and _status(found) == "running":
                return candidate
        return None

    # ------------------------------------------------------------ heartbeats

    def _process_state(self) -> _ProcessState:
        proc = self._proc
        if proc.pid != os.getpid():
            # Forked: drop the inherited object without touching it.
            proc = _ProcessState()
            self._proc = proc
        return proc

    def _hold(self, attempt: str, parent: str) -> None:
        proc = self._process_state()
        with proc.lock:
            if proc.heartbeater is None:
                hb = Heartbeater(self.ledger, interval_seconds=self.settings.heartbeat_seconds)
                hb.start()
                proc.heartbeater = hb
            hb = proc.heartbeater
            proc.refs[attempt] += 1
            proc.refs[parent] += 1
            hb.add(attempt)
            hb.add(parent)

    def _release(self, ctx: Any) -> None:
        if getattr(ctx, _RELEASED, True):
            return
        setattr(ctx, _RELEASED, True)
        proc = self._process_state()
        with proc.lock:
            hb = proc.heartbeater
            for task_id in (getattr(ctx, _ATTEMPT, None), getattr(ctx, _PARENT, None)):
                if not task_id:
                    continue
                proc.refs[task_id] -= 1
                if proc.refs[task_id] <= 0:
                    del proc.refs[task_id]
                    if hb is not None:
                        hb.discard(task_id)

    # ------------------------------------------------------------ delivery

    def _set_delivery(self, celery_task_id: str, status: str, code: str) -> Task | None:
        try:
            return self.ledger.set_delivery(logical_task_id(celery_task_id), status, code=code)
        except StateConflict:
            self._conflict(f"delivery_{status}")
            if self.settings.strict:
                raise
            return None
        except Exception as exc:
            self._error(f"mark_{status}", exc)
            return None

    # ------------------------------------------------------------ boot reconcile

    def _boot_reconcile(self) -> None:
        if not self.settings.reconcile_on_boot:
            return
        with self._guarded("boot_reconcile"):
            report: dict[str, Any] | None = None
            for attempt in range(5):
                try:
                    report = self.reconcile()
                    break
                except LedgerBusy:
                    if attempt == 4:
                        raise
            self.last_boot_report = report
            log.info("task-state-guard: reconcile on boot %s", _compact(report))

    # ------------------------------------------------------------ receivers

    def _on_before_fork(self, sender: Any = None, **_: Any) -> None:
        # Main process, right before the pool forks a child: make sure no open
        # connection is inherited (the core would not reuse it anyway, E1).
        # Closing makes a core Ledger unusable, so drop it: the next hook in this
        # process opens a fresh one lazily (forks are rare: pool start, replacements).
        with self._ledger_lock:
            led, self._ledger = self._ledger, None
        if led is not None:
            with self._guarded("before_fork"):
                led.close()

    def _on_task_received(self, sender: Any = None, request: Any = None, **_: Any) -> None:
        if request is None or not self._ours(sender):
            return
        token = uuid.uuid4().hex
        try:
            request.request_dict[TOKEN_KEY] = token
            cached = request.__dict__.get("_context")
            if cached is not None:
                setattr(cached, TOKEN_KEY, token)
        except Exception as exc:  # pragma: no cover - celery internals changed
            self._error("task_received", exc)
            return
        celery_id = request.id
        task = getattr(request, "task", None)
        retries = int(request.request_dict.get("retries") or 0)
        redelivered = bool((request.delivery_info or {}).get("redelivered"))
        if task is not None and getattr(task, "acks_late", False):
            self._track(celery_id, token, retries, redelivered, request)
        with self._guarded("task_received"):
            if redelivered:
                self._close_silently_lost(celery_id, request)
            if retries == 0 and getattr(request, "eta", None) and not _nesting(request):
                # A task that waits for its ETA/countdown is visible as queued meanwhile.
                # Immediate tasks get their parent at prerun, which keeps this write
                # (and its lock wait) off the consumer loop of the prefork main process.
                self._ensure_parent(celery_id, task)

    def _track(
        self, celery_id: str, token: str, retries: int, redelivered: bool, request: Any
    ) -> None:
        with self._inflight_lock:
            if len(self._inflight) > 1000:
                for key in list(self._inflight):
                    alive = [e for e in self._inflight[key] if e[3]() is not None]
                    if alive:
                        self._inflight[key] = alive
                    else:
                        del self._inflight[key]
            self._inflight.setdefault(celery_id, []).append(
                (token, retries, redelivered, weakref.ref(request))
            )

    def _close_silently_lost(self, celery_id: str, current: Any) -> None:
        """Close attempts of earlier deliveries of this id that ended with no signal."""
        from celery.worker import state as worker_state  # type: ignore[import-untyped]

        with self._inflight_lock:
            entries = list(self._inflight.get(celery_id, ()))
        keep = []
        for entry in entries:
            token, retries, redelivered, ref = entry
            req = ref()
            if req is current:
                keep.append(entry)
                continue
            if req is not None and (
                req in worker_state.active_requests or req in worker_state.reserved_requests
            ):
                keep.append(entry)
                continue
            attempt = self._resolve_attempt(token, celery_id, retries, redelivered)
            if attempt is not None:
                found = self._get(attempt)
                if found is not None and _status(found) == "running":
                    self._close(attempt, "failed", "worker_lost", "attempt_close_conflict")
        with self._inflight_lock:
            if keep:
                self._inflight[celery_id] = keep
            else:
                self._inflight.pop(celery_id, None)

    def _on_before_publish(self, sender: Any = None, headers: Any = None, **_: Any) -> None:
        """``Task.replace()``: queue the replacement's attempt before the message leaves.

        The replacement runs under the same Celery id, hence the same logical task; the queued
        attempt keeps that task open (and fresh) until the replacement claims it, whether the
        replaced task's own ``task_postrun`` comes first or last.
        """
        if not isinstance(headers, dict) or not headers.get("replaced_task_nesting"):
            return
        from celery import current_task  # type: ignore[import-untyped]

        task = current_task._get_current_object() if current_task else None
        if task is None or not self._ours(task):
            return
        ctx = task.request
        celery_id = getattr(ctx, "id", None)
        parent = getattr(ctx, _PARENT, None)
        try:
            nesting = int(headers["replaced_task_nesting"])
        except (TypeError, ValueError):
            return
        if not parent or headers.get("id") != celery_id or nesting <= _nesting(ctx):
            return
        replacement = self.app.tasks.get(headers.get("task"))
        with self._guarded("before_task_publish"):
            self.ledger.create_task(
                task_id=replace_attempt_id(celery_id, nesting),
                parent_id=parent,
                delivery_required=False,
                name=name_label(headers.get("task")),
                timeout_seconds=_attempt_timeout(replacement) if replacement else None,
            )

    def _on_task_prerun(
        self, sender: Any = None, task_id: str | None = None, task: Any = None, **_: Any
    ) -> None:
        task = task if task is not None else sender
        if task is None or not self._ours(task):
            return
        ctx = task.request
        celery_id = getattr(ctx, "id", None) or task_id
        if not celery_id or getattr(ctx, _ATTEMPT, None):
            return
        with self._guarded("task_prerun"):
            led = self.ledger
            parent = logical_task_id(celery_id)
            owner = not bool(getattr(task, "acks_late", False)) or bool(
                getattr(ctx, "is_eager", False)
            )
            retries = int(getattr(ctx, "retries", 0) or 0)
            redelivered = bool((getattr(ctx, "delivery_info", None) or {}).get("redelivered"))
            token = getattr(ctx, TOKEN_KEY, None)
            nesting = _nesting(ctx)
            # One transaction for the parent and the attempt (fewer writer-lock rounds).
            with led.atomic():
                if retries == 0 and nesting == 0:
                    # First delivery: make sure the parent exists (idempotent) and runs.
                    self._ensure_parent(celery_id, task)
                    with suppress(StateConflict):  # already running: a concurrent delivery
                        led.start_task(parent, owner=owner)
                claim = (celery_id, parent, task, retries, redelivered, token, nesting)
                try:
                    attempt = self._claim(*claim)
                except TaskNotFound:
                    # A retry or replacement whose parent was never recorded (the ledger
                    # was unavailable when the first attempt ran): record the parent now.
                    self._ensure_parent(celery_id, task)
                    with suppress(StateConflict):
                        led.start_task(parent, owner=owner)
                    attempt = self._claim(*claim)
            setattr(ctx, _ATTEMPT, attempt)
            setattr(ctx, _PARENT, parent)
            setattr(ctx, _CLOSED, False)
            setattr(ctx, _RELEASED, False)
            self._hold(attempt, parent)

    def _claim(
        self,
        celery_id: str,
        parent: str,
        task: Any,
        retries: int,
        redelivered: bool,
        token: Any,
        nesting: int,
    ) -> str:
        led = self.ledger
        if retries > 0:
            placeholder = retry_attempt_id(celery_id, retries)
            # The retry's own signal may still be on its way: create it if missing.
            self._new_attempt(placeholder, parent, task)
            try:
                led.start_task(placeholder, owner=True)
                return placeholder
            except StateConflict:
                pass  # another delivery of the same retry claimed it
        elif nesting > 0:
            # A Task.replace() replacement: its placeholder was queued before it was sent.
            placeholder = replace_attempt_id(celery_id, nesting)
            with suppress(StateConflict, TaskNotFound):
                led.start_task(placeholder, owner=True)
                return placeholder
        if redelivered:
            placeholder = requeue_attempt_id(celery_id, retries)
            try:
                led.start_task(placeholder, owner=True)
                return placeholder
            except (StateConflict, TaskNotFound):
                pass
        attempt = (token_attempt_id(token) if token else None) or str(uuid.uuid4())
        self._new_attempt(attempt, parent, task)
        led.start_task(attempt, owner=True)
        return attempt

    def _finish(
        self,
        ctx: Any,
        hook: str,
        status: str,
        code: str,
        *,
        parent_close: bool = True,
        placeholder: Callable[[], str | None] | None = None,
    ) -> None:
        attempt = getattr(ctx, _ATTEMPT, None)
        parent = getattr(ctx, _PARENT, None)
        if not attempt or getattr(ctx, _CLOSED, False):
            return
        setattr(ctx, _CLOSED, True)
        try:
            with self._guarded(hook), self.ledger.atomic():
                if placeholder is not None:
                    placeholder()
                self._close(attempt, status, code, "attempt_close_conflict")
                if parent_close and parent:
                    self._close(parent, status, code, "parent_close_conflict")
        finally:
            self._release(ctx)

    def _on_task_success(self, sender: Any = None, **_: Any) -> None:
        if sender is None or not self._ours(sender):
            return
        ctx = sender.request
        self._finish(ctx, "task_success", "succeeded", "worker_completed")

    def _on_task_failure(
        self,
        sender: Any = None,
        task_id: str | None = None,
        exception: BaseException | None = None,
        **_: Any,
    ) -> None:
        if sender is None or not self._ours(sender):
            return
        ctx = getattr(sender, "request", None)
        if ctx is not None and getattr(ctx, _ATTEMPT, None) and not getattr(ctx, _CLOSED, False):
            # The executing process (pool child, thread, solo or eager caller).
            if isinstance(exception, (SoftTimeLimitExceeded, TimeLimitExceeded)):
                self._finish(ctx, "task_failure", "timed_out", "time_limit_exceeded")
            elif isinstance(exception, Reject):
                return  # closed by task_postrun(REJECTED)
            else:
                self._finish(ctx, "task_failure", "failed", "worker_failed")
            return
        if not task_id or not isinstance(
            exception, (WorkerLostError, TimeLimitExceeded, Reject)
        ):
            # Exceptions raised in the task body are seen where the attempt runs; an
            # attempt that could not be recorded there has nothing to close.
            return
        # The main process: a lost child, a hard time limit or a rejection.
        with self._guarded("task_failure"):
            self._main_failure(sender, ctx, task_id, exception)

    def _main_failure(
        self, task: Any, ctx: Any, task_id: str, exception: BaseException | None
    ) -> None:
        same = ctx is not None and getattr(ctx, "id", None) == task_id
        token = getattr(ctx, TOKEN_KEY, None) if same else None
        retries = int(getattr(ctx, "retries", 0) or 0) if same else 0
        redelivered = (
            bool((getattr(ctx, "delivery_info", None) or {}).get("redelivered")) if same else False
        )
        parent = logical_task_id(task_id)
        if isinstance(exception, Reject):
            status, code = "cancelled", "rejected"
        elif isinstance(exception, TimeLimitExceeded):
            status, code = "timed_out", "time_limit_exceeded"
        else:
            status, code = "failed", "worker_lost"
        attempt = (
            self._resolve_attempt(token, task_id, retries, redelivered, _nesting(ctx))
            if same
            else None
        )
        requeued = (
            isinstance(exception, TimeLimitExceeded)
            and bool(getattr(task, "acks_late", False))
            and not bool(getattr(task, "acks_on_timeout", True))
        )
        if requeued:
            self._new_attempt(requeue_attempt_id(task_id, retries), parent, task)
        if attempt is not None:
            found = self._get(attempt)
            if found is not None and _status(found) in _ACTIVE:
                self._close(attempt, status, code, "attempt_close_conflict")
        if not requeued:
            self._close(parent, status, code, "parent_close_conflict")

    def _on_task_retry(
        self,
        sender: Any = None,
        request: Any = None,
        reason: Any = None,
        einfo: Any = None,
        **_: Any,
    ) -> None:
        if sender is None or not self._ours(sender):
            return
        ctx = request
        if ctx is None or not getattr(ctx, _ATTEMPT, None):
            own = getattr(sender, "request", None)
            if own is not None and getattr(own, _ATTEMPT, None):
                ctx = own
        celery_id = getattr(ctx, "id", None)
        if not celery_id:
            return
        retries = int(getattr(ctx, "retries", 0) or 0)
        if getattr(ctx, _ATTEMPT, None) and reason is not None:
            parent = getattr(ctx, _PARENT)

            def make_placeholder() -> str:
                placeholder = retry_attempt_id(celery_id, retries + 1)
                self._new_attempt(placeholder, parent, sender)
                return placeholder

            self._finish(
                ctx,
                "task_retry",
                "failed",
                "retry_scheduled",
                parent_close=False,
                placeholder=make_placeholder,
            )
            return
        # Main process: retry_on_worker_lost (with a reason) or a cancel by cold
        # shutdown / connection loss (no reason; nothing is republished).
        with self._guarded("task_retry"):
            token = getattr(ctx, TOKEN_KEY, None)
            redelivered = bool((getattr(ctx, "delivery_info", None) or {}).get("redelivered"))
            parent = logical_task_id(celery_id)
            attempt = self._resolve_attempt(token, celery_id, retries, redelivered, _nesting(ctx))
            if reason is not None:
                self._new_attempt(retry_attempt_id(celery_id, retries + 1), parent, sender)
                status, code = "failed", "retry_scheduled"
                parent_close = False
            else:
                status, code = "cancelled", "interrupted"
                parent_close = not bool(getattr(sender, "acks_late", False))
                if not parent_close:
                    # acks_late: the broker gets the message back; keep the parent open.
                    self._new_attempt(requeue_attempt_id(celery_id, retries), parent, sender)
            if attempt is not None:
                found = self._get(attempt)
                if found is not None and _status(found) in _ACTIVE:
                    self._close(attempt, status, code, "attempt_close_conflict")
            if parent_close:
                self._close(parent, status, code, "parent_close_conflict")

    def _on_task_postrun(
        self,
        sender: Any = None,
        task_id: str | None = None,
        task: Any = None,
        retval: Any = None,
        state: str | None = None,
        **_: Any,
    ) -> None:
        task = task if task is not None else sender
        if task is None or not self._ours(task):
            return
        ctx = task.request
        attempt = getattr(ctx, _ATTEMPT, None)
        if not attempt:
            return
        try:
            if getattr(ctx, _CLOSED, False) or state is None:
                return
            celery_id = getattr(ctx, "id", None) or task_id
            retries = int(getattr(ctx, "retries", 0) or 0)
            if state == "IGNORED":
                self._finish(ctx, "task_postrun", "cancelled", "ignored", parent_close=False)
                with self._guarded("task_postrun"):
                    self._close_parent_if_idle(getattr(ctx, _PARENT), "cancelled", "ignored")
            elif state == "REJECTED":
                # Only an unacknowledged message can be requeued: with early acks the
                # message is gone whatever the Reject says.
                requeue = bool(getattr(retval, "requeue", False)) and bool(
                    getattr(task, "acks_late", False)
                )
                parent = getattr(ctx, _PARENT)

                def make_placeholder() -> str:
                    placeholder = requeue_attempt_id(str(celery_id), retries)
                    self._new_attempt(placeholder, parent, task)
                    return placeholder

                self._finish(
                    ctx,
                    "task_postrun",
                    "cancelled",
                    "rejected",
                    parent_close=not requeue,
                    placeholder=make_placeholder if requeue else None,
                )
            elif state == "SUCCESS":
                self._finish(ctx, "task_postrun", "succeeded", "worker_completed")
            elif state == "FAILURE":
                # e.g. eager mode with task_eager_propagates (task_internal_error instead
                # of task_failure).
                self._finish(ctx, "task_postrun", "failed", "worker_failed")
        finally:
            self._release(ctx)

    def _close_parent_if_idle(self, parent: str, status: str, code: str) -> None:
        found = self._get(parent)
        if found is None or _status(found) in _TERMINAL:
            return  # e.g. Task.replace(): the replacement already closed it
        if any(_status(child) in _ACTIVE for child in self.ledger.children_of(parent)):
            return
        self._close(parent, status, code, "parent_close_conflict")

    def _on_task_revoked(
        self,
        sender: Any = None,
        request: Any = None,
        terminated: bool = False,
        expired: bool = False,
        **_: Any,
    ) -> None:
        if sender is None or not self._ours(sender):
            return
        celery_id = getattr(request, "id", None)
        if not celery_id:
            return
        with self._guarded("task_revoked"):
            retries = int(getattr(request, "retries", 0) or 0)
            parent = self._ensure_parent(celery_id, sender) if retries == 0 else None
            parent = parent or logical_task_id(celery_id)
            if terminated:
                token = getattr(request, TOKEN_KEY, None)
                redelivered = bool(
                    (getattr(request, "delivery_info", None) or {}).get("redelivered")
                )
                attempt = self._resolve_attempt(token, celery_id, retries, redelivered)
                if attempt is not None:
                    self._close(attempt, "cancelled", "revoked", "attempt_close_conflict")
            elif retries > 0:
                placeholder = self._get(retry_attempt_id(celery_id, retries))
                if placeholder is not None and _status(placeholder) == "queued":
                    self._close(placeholder.id, "cancelled", "revoked", "attempt_close_conflict")
            self._close(parent, "cancelled", "revoked", "parent_close_conflict")


def _nesting(ctx: Any) -> int:
    """How many ``Task.replace()`` replacements led to this execution (0: none)."""
    value = getattr(ctx, "replaced_task_nesting", None)
    if value is None:
        value = (getattr(ctx, "request_dict", None) or {}).get("replaced_task_nesting")
    try:
        return max(0, int(value or 0))
    except (TypeError, ValueError):
        return 0


def _delivers(task: Any) -> bool:
    return bool(getattr(task, "tsg_delivery", False))


def _attempt_timeout(task: Any) -> float | None:
    value = getattr(task, "tsg_timeout", None)
    if value is None:
        return None
    try:
        result = float(value)
    except (TypeError, ValueError):
        return None
    return result if result > 0 else None


def _compact(report: Any) -> str:
    import json

    try:
        return json.dumps(report, sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError):
        return repr(report)
