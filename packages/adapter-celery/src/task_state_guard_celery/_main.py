"""Receivers of the worker's main process (the consumer).

Under prefork the main process sees ``task_received``, ``task_revoked``, the ``task_failure``
of a lost child or a hard time limit, and the ``task_retry`` of ``retry_on_worker_lost`` or a
cold-shutdown cancel. It injects a per-delivery token into each request at receipt, so that it
can later name the attempt the executing process recorded for that delivery.

The main process owns the work of its pool children (``supervise_children`` before each fork),
so a reconcile never finds a child's job lost while this process lives: it reports each loss
itself. A child lost after it stored ``SUCCESS`` (in a ``task_success``/``task_postrun``
receiver, say, before this adapter's close committed) sends no signal at all: Celery logs
"succeeded before the worker was lost" and keeps ``SUCCESS``. So each request's failure callback
is watched (:meth:`MainReceivers.watch_lost_child`): on a lost child the job is closed
``succeeded/worker_completed`` when the backend holds ``SUCCESS``, else the lost attempt
``failed/worker_lost``.
"""

from __future__ import annotations

import threading
import uuid
import weakref
from collections.abc import Callable
from typing import Any

from celery import states  # type: ignore[import-untyped]
from celery.exceptions import (  # type: ignore[import-untyped]
    Reject,
    TimeLimitExceeded,
    WorkerLostError,
)
from task_state_guard.integration import AdapterRuntime, name_label
from task_state_guard.integration import codes as c
from task_state_guard.integration.supervisor import attempt_ran_as, end_if_open

from ._ids import logical_task_id, requeue_attempt_id, retry_attempt_id, token_attempt_id
from ._lost import stored_state, stores_results
from ._replace import ReplaceLinks
from ._request import (
    TOKEN_KEY,
    acks_late,
    attempt_timeout,
    delivers,
    nesting,
    placeholder_attempts,
    redelivered,
    retries,
    token,
)

# Requests of acks_late tasks tracked per Celery id: (token, retries, redelivered, request).
_Tracked = tuple[str, int, bool, "weakref.ref[Any]"]
_TRACK_SWEEP = 1000


class MainReceivers:
    """The main process's receivers for one guard."""

    def __init__(
        self, runtime: AdapterRuntime, ours: Callable[[Any], bool], links: ReplaceLinks
    ) -> None:
        self.rt = runtime
        self.ours = ours
        self.links = links
        # Deliveries of acks_late tasks, so that a redelivery can close the attempt of an
        # earlier delivery whose process died silently (acks_late + reject_on_worker_lost
        # sends no signal at all).
        self._inflight: dict[str, list[_Tracked]] = {}
        self._inflight_lock = threading.Lock()
        # Per result backend object: whether it keeps results that can be read back.
        self._stores: dict[int, tuple[Any, bool]] = {}

    # ------------------------------------------------------------------ helpers

    def _resolve(self, ctx: Any, celery_id: str, *, with_nesting: bool = True) -> str | None:
        """The attempt a delivery ran as: the token's fresh attempt if recorded, else a running
        placeholder the executing process claimed."""
        return attempt_ran_as(
            self.rt,
            token_attempt_id(token(ctx)) if token(ctx) else None,
            placeholder_attempts(ctx, celery_id, with_nesting=with_nesting),
        )

    def _queue(self, attempt_id: str, celery_id: str, task: Any) -> None:
        self.rt.queue_attempt(
            attempt_id,
            logical_task_id(celery_id),
            name=name_label(getattr(task, "name", None)),
            timeout_seconds=attempt_timeout(task),
        )

    # ------------------------------------------------------------------ receipt

    def on_before_fork(self, sender: Any = None, **_: Any) -> None:
        """Right before the pool forks a child: the child's work is owned by this process,
        which reports its end even when the child dies (``task_failure`` with
        ``WorkerLostError``, or the success Celery stored before: :meth:`watch_lost_child`),
        so no reconcile declares it lost in between; no open connection may be inherited."""
        self.rt.supervise_children("worker_before_create_process")
        self.rt.drop_ledger()

    def on_received(self, sender: Any = None, request: Any = None, **_: Any) -> None:
        """Tag the delivery with a token; record an ETA task's parent as queued."""
        if request is None or not self.ours(sender):
            return
        tag = uuid.uuid4().hex
        try:
            request.request_dict[TOKEN_KEY] = tag
            cached = request.__dict__.get("_context")
            if cached is not None:
                setattr(cached, TOKEN_KEY, tag)
        except Exception as exc:  # pragma: no cover - celery internals changed
            self.rt.policy.error("task_received", exc)
            return
        celery_id = request.id
        task = getattr(request, "task", None)
        count = int(request.request_dict.get("retries") or 0)
        again = redelivered(request)
        if task is not None and acks_late(task):
            self._track(celery_id, tag, count, again, request)
        self.watch_lost_child(request)
        with self.rt.guarded("task_received"):
            if again:
                self._close_silently_lost(celery_id, request)
            if count == 0 and getattr(request, "eta", None) and not nesting(request):
                # A task that waits for its ETA/countdown is visible as queued meanwhile.
                # Immediate tasks get their parent at prerun, which keeps this write (and its
                # lock wait) off the consumer loop of the prefork main process.
                self.rt.open_logical(
                    logical_task_id(celery_id),
                    delivery_required=delivers(task),
                    name=name_label(getattr(task, "name", None)),
                    start=False,
                    framework_id=celery_id,
                )

    def watch_lost_child(self, request: Any) -> None:
        """Watch ``request``'s failure callback for the loss of the child running it.

        The pool calls ``request.on_failure`` when that child dies; Celery's own handling runs
        first, unchanged, then :meth:`on_child_lost`. The wrapper holds the request weakly (no
        reference cycle) and costs nothing until a child is lost.
        """
        method = getattr(type(request), "on_failure", None)
        if method is None:  # pragma: no cover - celery internals changed
            return
        ref = weakref.ref(request)
        after = self.on_child_lost

        def on_failure(exc_info: Any, *args: Any, **kwargs: Any) -> Any:
            req = ref()
            try:
                return method(req, exc_info, *args, **kwargs)
            finally:
                if req is not None and _lost_child(req, exc_info):
                    after(req)

        request.on_failure = on_failure

    def _stored_state(self, request: Any, celery_id: str) -> str | None:
        """What the result backend holds for this request (``None``: it stores nothing)."""
        task = request.task
        if getattr(request, "ignore_result", False):
            return None
        backend = task.backend
        known = self._stores.get(id(backend))
        if known is None or known[0] is not backend:
            known = self._stores[id(backend)] = (backend, stores_results(backend))
        return stored_state(backend, celery_id) if known[1] else None

    def on_child_lost(self, request: Any) -> None:
        """The child running ``request`` died, and Celery has handled it. When the result
        backend holds ``SUCCESS`` (Celery keeps it and logs "succeeded before the worker was
        lost"), the job is closed ``succeeded/worker_completed`` as the child would have;
        otherwise the lost attempt is closed ``failed/worker_lost`` (Celery's ``task_failure``
        closed it already, or the message went back to the broker: ``reject_on_worker_lost``,
        and the redelivery runs as a new attempt). One backend read, only on a lost child."""
        celery_id = getattr(request, "id", None)
        ctx = getattr(request, "_context", None)
        if not celery_id or ctx is None:  # pragma: no cover - celery internals changed
            return
        where = "worker_lost"
        with self.rt.guarded(where):
            attempt = self._resolve(ctx, celery_id)
            if self._stored_state(request, celery_id) != states.SUCCESS:
                end_if_open(self.rt, attempt, (c.FAILED, c.WORKER_LOST), where=where,
                            states=(c.RUNNING,))
                return
            done = (c.SUCCEEDED, c.WORKER_COMPLETED)
            end_if_open(self.rt, attempt, done, where=where)
            self.links.end_delivery(ctx, celery_id, attempt, *done, settle=False, where=where)
            self.rt.close_logical(logical_task_id(celery_id), *done, where=where)

    def _track(self, celery_id: str, tag: str, count: int, again: bool, request: Any) -> None:
        with self._inflight_lock:
            if len(self._inflight) > _TRACK_SWEEP:
                for key in list(self._inflight):
                    alive = [e for e in self._inflight[key] if e[3]() is not None]
                    if alive:
                        self._inflight[key] = alive
                    else:
                        del self._inflight[key]
            self._inflight.setdefault(celery_id, []).append(
                (tag, count, again, weakref.ref(request))
            )

    def _close_silently_lost(self, celery_id: str, current: Any) -> None:
        """Close attempts of earlier deliveries of this id that ended with no signal."""
        from celery.worker import state as worker_state  # type: ignore[import-untyped]

        with self._inflight_lock:
            entries = list(self._inflight.get(celery_id, ()))
        keep = []
        for entry in entries:
            tag, count, again, ref = entry
            req = ref()
            if req is current or (
                req is not None
                and (req in worker_state.active_requests or req in worker_state.reserved_requests)
            ):
                keep.append(entry)
                continue
            earlier = _Earlier(tag, count, again)
            attempt = self._resolve(earlier, celery_id, with_nesting=False)
            end_if_open(
                self.rt, attempt, (c.FAILED, c.WORKER_LOST), where="task_received",
                states=(c.RUNNING,),
            )
        with self._inflight_lock:
            if keep:
                self._inflight[celery_id] = keep
            else:
                self._inflight.pop(celery_id, None)

    # ------------------------------------------------------------------ outcomes

    def on_failure(self, task: Any, ctx: Any, task_id: str, exception: BaseException) -> None:
        """A lost child, a hard time limit or a rejection, seen by the main process."""
        if not isinstance(exception, WorkerLostError | TimeLimitExceeded | Reject):
            # Exceptions raised in the task body are seen where the attempt runs; an attempt
            # that could not be recorded there has nothing to close.
            return
        with self.rt.guarded("task_failure"):
            same = ctx is not None and getattr(ctx, "id", None) == task_id
            parent = logical_task_id(task_id)
            if isinstance(exception, Reject):  # without requeue: Celery stores FAILURE
                status, code = c.FAILED, c.WORKER_FAILED
            elif isinstance(exception, TimeLimitExceeded):
                status, code = c.TIMED_OUT, c.TIME_LIMIT_EXCEEDED
            else:
                status, code = c.FAILED, c.WORKER_LOST
            attempt = self._resolve(ctx, task_id) if same else None
            requeued = (
                isinstance(exception, TimeLimitExceeded)
                and acks_late(task)
                and not bool(getattr(task, "acks_on_timeout", True))
            )
            if requeued:
                self._queue(requeue_attempt_id(task_id, retries(ctx) if same else 0), task_id, task)
            if attempt is None and not requeued and code == c.WORKER_LOST and (
                not same or retries(ctx) == 0
            ):
                # A child lost before task_prerun recorded anything: Celery stores FAILURE
                # (WorkerLostError); the job is recorded here so that the ledger says so too.
                self.rt.open_logical(
                    parent, delivery_required=delivers(task),
                    name=name_label(getattr(task, "name", None)), start=False,
                    framework_id=task_id,
                )
            end_if_open(self.rt, attempt, (status, code), where="task_failure")
            if same:  # Celery fails the rest of a chain / a chord's body with this task
                self.links.end_delivery(
                    ctx, task_id, attempt, status, code, settle=not requeued, where="task_failure"
                )
            if not requeued:
                self.rt.close_logical(parent, status, code, where="task_failure")

    def on_retry(self, sender: Any, ctx: Any, celery_id: str, reason: Any) -> None:
        """``retry_on_worker_lost`` (with a reason) or a cold-shutdown / connection-loss cancel
        (no reason; nothing is republished)."""
        with self.rt.guarded("task_retry"):
            count = retries(ctx)
            attempt = self._resolve(ctx, celery_id)
            parent_close = False
            if reason is not None:
                self._queue(retry_attempt_id(celery_id, count + 1), celery_id, sender)
                self.links.queue_retry(ctx, celery_id, sender)
                status, code = c.FAILED, c.RETRY_SCHEDULED
            else:
                status, code = c.CANCELLED, c.INTERRUPTED
                parent_close = not acks_late(sender)
                if not parent_close:
                    # acks_late: the broker gets the message back; keep the parent open.
                    self._queue(requeue_attempt_id(celery_id, count), celery_id, sender)
            end_if_open(self.rt, attempt, (status, code), where="task_retry")
            self.links.end_delivery(
                ctx, celery_id, attempt, status, code, settle=parent_close, where="task_retry"
            )
            if parent_close:
                self.rt.close_logical(logical_task_id(celery_id), status, code, where="task_retry")

    def on_revoked(
        self,
        sender: Any = None,
        request: Any = None,
        terminated: bool = False,
        expired: bool = False,
        **_: Any,
    ) -> None:
        """A revoked task: its parent closes ``cancelled/revoked`` (and a terminated attempt)."""
        if sender is None or not self.ours(sender):
            return
        celery_id = getattr(request, "id", None)
        if not celery_id:
            return
        with self.rt.guarded("task_revoked"):
            count = retries(request)
            parent = logical_task_id(celery_id)
            if count == 0:
                self.rt.open_logical(
                    parent,
                    delivery_required=delivers(sender),
                    name=name_label(getattr(sender, "name", None)),
                    start=False,
                    framework_id=celery_id,
                )
            attempt = None
            if terminated:
                attempt = self._resolve(request, celery_id, with_nesting=False)
                if attempt is not None:
                    self.rt.close_attempt(attempt, c.CANCELLED, c.REVOKED, where="task_revoked")
            elif count > 0:
                # A retry still waiting in the broker (its countdown) is cancelled with it.
                end_if_open(
                    self.rt, retry_attempt_id(celery_id, count), (c.CANCELLED, c.REVOKED),
                    where="task_revoked", states=(c.QUEUED,),
                )
            self.links.end_delivery(
                request, celery_id, attempt, c.CANCELLED, c.REVOKED, settle=True,
                where="task_revoked",
            )
            self.rt.close_logical(parent, c.CANCELLED, c.REVOKED, where="task_revoked")


def _lost_child(request: Any, exc_info: Any) -> bool:
    """Whether a pool's failure callback reports the child lost (not an error of the task, nor
    the exit of a child this worker cancelled or revoked itself)."""
    exc = getattr(exc_info, "exception", None)
    exc = getattr(exc, "exc", exc)  # billiard's ExceptionWithTraceback
    if isinstance(exc, WorkerLostError):
        return True
    return isinstance(exc, SystemExit | KeyboardInterrupt) and not (
        getattr(request, "_already_cancelled", False) or getattr(request, "_already_revoked", False)
    )


class _Earlier:
    """The request fields of an earlier delivery, as tracked at its receipt."""

    def __init__(self, tag: str, count: int, again: bool) -> None:
        setattr(self, TOKEN_KEY, tag)
        self.retries = count
        self.delivery_info = {"redelivered": again}
