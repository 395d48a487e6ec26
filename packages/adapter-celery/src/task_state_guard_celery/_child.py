"""Receivers of the process that executes a task (a prefork pool child, a thread, solo, eager).

Celery sends ``task_prerun``, ``task_success``, ``task_failure`` (for exceptions raised by the
task body), ``task_retry`` and ``task_postrun`` where the task runs, and ``before_task_publish``
where ``Task.replace()`` sends the replacement and where a replacement's tasks publish the next
ones (followed by :class:`~._replace.ReplaceLinks`). The attempt this delivery runs as is claimed
at prerun, kept on the request context (:class:`~._request.Attempt`) and closed by the first of
the outcome signals.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from celery.exceptions import (  # type: ignore[import-untyped]
    Reject,
    SoftTimeLimitExceeded,
    TimeLimitExceeded,
)
from task_state_guard import TaskNotFound
from task_state_guard.integration import AdapterRuntime, AttemptSpec, name_label
from task_state_guard.integration import codes as c
from task_state_guard.integration.replacement import begin_with_stages, settle_if_idle

from ._ids import logical_task_id, requeue_attempt_id, retry_attempt_id, stage_fallback_id
from ._redelivery import broker_window
from ._replace import ReplaceLinks
from ._request import (
    Attempt,
    acks_late,
    attempt_of,
    attempt_timeout,
    delivers,
    expected_attempts,
    fresh_attempt_id,
    nesting,
    replaced_ids,
    retries,
    set_attempt,
)


class ChildReceivers:
    """The executing process's receivers for one guard."""

    def __init__(
        self, runtime: AdapterRuntime, ours: Callable[[Any], bool], links: ReplaceLinks
    ) -> None:
        self.rt = runtime
        self.ours = ours
        self.links = links
        self._broker_window: tuple[float | None] | None = None  # read once, on first use

    def redelivery_window(self, task: Any, ctx: Any) -> float | None:
        """How long after this attempt's last sign of life the broker may still hand its job
        to another worker: only an ``acks_late`` message outlives its worker (see
        ``_redelivery``)."""
        if not acks_late(task) or bool(getattr(ctx, "is_eager", False)):
            return None
        if self._broker_window is None:
            self._broker_window = (broker_window(self.links.app),)
        return self._broker_window[0]

    # ------------------------------------------------------------------ start

    def on_prerun(
        self, sender: Any = None, task_id: str | None = None, task: Any = None, **_: Any
    ) -> None:
        """Record the logical task (first delivery) and claim this delivery's attempt."""
        task = task if task is not None else sender
        if task is None or not self.ours(task):
            return
        ctx = task.request
        celery_id = getattr(ctx, "id", None) or task_id
        if not celery_id or attempt_of(ctx) is not None:
            return
        rt = self.rt
        with rt.guarded("task_prerun"):
            parent = logical_task_id(celery_id)
            # An acks_late message comes back to another worker if this one dies: the logical
            # task then outlives this process, so it gets no owner.
            owner = not acks_late(task) or bool(getattr(ctx, "is_eager", False))
            name = name_label(getattr(task, "name", None))

            spec = AttemptSpec(
                parent, name, candidates=expected_attempts(ctx, celery_id),
                attempt_id=fresh_attempt_id(ctx), timeout_seconds=attempt_timeout(task),
                redelivery_seconds=self.redelivery_window(task, ctx),
            )

            def begin(open_logical: bool) -> str:
                return rt.begin_attempt(
                    spec, delivery_required=delivers(task), framework_id=celery_id,
                    open_logical=open_logical, logical_owner=owner,
                )

            waiting = self.links.waiting(ctx, celery_id) if replaced_ids(ctx) else []
            # A replacement's last task runs under the replaced task's id, whose parent
            # exists; the other tasks of a replacement (a stage: they carry the replaced ids)
            # are logical tasks of their own.
            opens = retries(ctx) == 0 and (nesting(ctx) == 0 or bool(replaced_ids(ctx)))
            stages: dict[str, str] = {}
            if not waiting:  # one write
                try:
                    attempt = begin(opens)
                except TaskNotFound:
                    # A retry or replacement whose parent was never recorded (the ledger
                    # was unavailable when the first attempt ran): record the parent now.
                    attempt = begin(True)
            else:

                def begin_or_open() -> str:
                    try:
                        return begin(opens)
                    except TaskNotFound:  # as above
                        return begin(True)

                # One transaction: this delivery's attempt and its stage claims.
                attempt, stages = begin_with_stages(
                    rt, begin_or_open, parent, self.links.stages(ctx, celery_id, waiting),
                    fallback_id=stage_fallback_id, name=name,
                    timeout_seconds=attempt_timeout(task),
                )
            set_attempt(ctx, Attempt(attempt, parent, stages=stages))

    # ------------------------------------------------------------------ outcomes

    def _finish(
        self,
        ctx: Any,
        hook: str,
        status: str,
        code: str,
        *,
        parent_close: bool = True,
        retry: tuple[str, str | None, float | None] | None = None,
    ) -> None:
        """One write (``end_attempt``): ``retry``'s queued attempt first (a scheduled retry or
        requeue), the attempt, its stages and, with ``parent_close``, the logical task."""
        att = attempt_of(ctx)
        if att is None or att.closed:
            return
        att.closed = True
        also = self.links.stage_closings(att.stages, status, code)
        skipped: frozenset[str] = frozenset()
        try:
            with self.rt.guarded(hook):
                if parent_close and status != c.SUCCEEDED and att.stages:
                    # Celery fails the rest of the chain and the chord's body with this task:
                    # the replaced tasks waiting on it end with it.
                    endings = self.links.end_replaced(att.stages, status, code)
                    also += endings.closings
                    skipped = endings.if_queued
                att.released = True  # end_attempt releases the attempt and its logical task
                if att.stages:
                    self.rt.release(*att.stages.values())
                self.rt.end_attempt(
                    att.attempt_id, (status, code), logical_id=att.parent_id,
                    settled=(status, code) if parent_close else None, retry=retry,
                    also=also, if_queued=skipped, where=hook,
                )
        finally:
            self._release(att)

    def _release(self, att: Attempt) -> None:
        if not att.released:
            att.released = True
            self.rt.release(att.attempt_id, att.parent_id, *att.stages.values())

    def on_success(self, sender: Any = None, **_: Any) -> None:
        """The task body returned."""
        if sender is not None and self.ours(sender):
            self._finish(sender.request, "task_success", c.SUCCEEDED, c.WORKER_COMPLETED)

    def on_failure(self, ctx: Any, exception: BaseException | None) -> None:
        """The task body raised (called by the guard when this process runs the attempt)."""
        if isinstance(exception, SoftTimeLimitExceeded | TimeLimitExceeded):
            self._finish(ctx, "task_failure", c.TIMED_OUT, c.TIME_LIMIT_EXCEEDED)
        elif not isinstance(exception, Reject):  # a Reject is closed by task_postrun
            self._finish(ctx, "task_failure", c.FAILED, c.WORKER_FAILED)

    def on_retry(self, sender: Any, ctx: Any, celery_id: str) -> None:
        """``self.retry()``: close the attempt, queue the next one; the parent stays open."""
        att = attempt_of(ctx)
        assert att is not None
        placeholder = retry_attempt_id(celery_id, retries(ctx) + 1)
        self._finish(
            ctx,
            "task_retry",
            c.FAILED,
            c.RETRY_SCHEDULED,
            parent_close=False,
            retry=(placeholder, name_label(getattr(sender, "name", None)),
                   attempt_timeout(sender)),
        )

    def on_postrun(
        self,
        sender: Any = None,
        task_id: str | None = None,
        task: Any = None,
        retval: Any = None,
        state: str | None = None,
        **_: Any,
    ) -> None:
        """The last signal of an execution: close what no outcome signal closed."""
        task = task if task is not None else sender
        if task is None or not self.ours(task):
            return
        ctx = task.request
        att = attempt_of(ctx)
        if att is None:
            return
        try:
            if att.closed or state is None:
                return
            if state == "IGNORED":
                # Task.replace() raises Ignore after publishing the replacement, which keeps
                # the parent (and the replaced tasks this one worked for) open.
                self._finish(ctx, "task_postrun", c.CANCELLED, c.IGNORED, parent_close=False)
                with self.rt.guarded("task_postrun"):
                    for logical in (att.parent_id, *map(logical_task_id, att.stages)):
                        settle_if_idle(
                            self.rt, logical, (c.CANCELLED, c.IGNORED), where="task_postrun"
                        )
            elif state == "REJECTED":
                self._rejected(task, ctx, att, retval, task_id)
            elif state == "SUCCESS":
                self._finish(ctx, "task_postrun", c.SUCCEEDED, c.WORKER_COMPLETED)
            elif state == "FAILURE":
                # e.g. eager mode with task_eager_propagates (task_internal_error instead
                # of task_failure).
                self._finish(ctx, "task_postrun", c.FAILED, c.WORKER_FAILED)
        finally:
            self._release(att)
            # A delivery mark made by the job is written with the parent's close; a job that
            # ended without closing its parent (retry, requeue) leaves it behind: drop it.
            self.rt.drop_deferred_mark(att.parent_id)

    def _rejected(self, task: Any, ctx: Any, att: Attempt, retval: Any, task_id: Any) -> None:
        asked = bool(getattr(retval, "requeue", False))
        # Only an unacknowledged message can be requeued: with early acks the message is
        # gone whatever the Reject says.
        requeue = asked and acks_late(task)
        # Celery records a Reject without requeue as a FAILURE (and sends task_failure): the
        # job ends failed here too. A Reject that asks for a requeue is a cancel (the requeued
        # message runs as a new attempt; with early acks nothing runs it again).
        status, code = (c.CANCELLED, c.REJECTED) if asked else (c.FAILED, c.WORKER_FAILED)
        celery_id = str(getattr(ctx, "id", None) or task_id)
        placeholder = requeue_attempt_id(celery_id, retries(ctx))
        self._finish(
            ctx,
            "task_postrun",
            status,
            code,
            parent_close=not requeue,
            retry=(placeholder, name_label(getattr(task, "name", None)), attempt_timeout(task))
            if requeue
            else None,
        )

    # ------------------------------------------------------------------ Task.replace()

    def on_before_publish(
        self, sender: Any = None, headers: Any = None, body: Any = None, **_: Any
    ) -> None:
        """A message published while one of this app's tasks runs here: ``Task.replace()``
        publishing the replacement, or a replacement's task publishing the next one."""
        if not isinstance(headers, dict):
            return
        task = self.links.app.current_task  # the task running in this thread, if any
        if task is None or not self.ours(task):
            return
        att = attempt_of(task.request)
        if att is None:
            return
        with self.rt.guarded("before_task_publish"):
            self.links.on_publish(task.request, att, headers, body)
