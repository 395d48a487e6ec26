"""Closing a job's tasks, and the delivery marks that close with them.

A delivery of a job *ends* with one write (:meth:`Closes.end_attempt`): the attempt closed
(its delivery ``not_applicable/internal_task`` in the same transaction) and, once the framework
settled the job, the logical task with the delivery mark its job made, if any. Refused closes
of terminal records are counted as conflicts here; other errors go through the error policy.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from contextlib import suppress

from ..ledger import Ledger
from ..model import LedgerError, StateConflict, Task
from ..store.attempts import Ended
from . import codes
from .attempts import Attempts, AttemptSpec
from .handle import LedgerHandle
from .heartbeats import Heartbeats

#: One close: ``(task_id, status, code, internal)``; ``internal`` marks an attempt.
Closing = tuple[str, str, "str | None", bool]
#: One queued attempt to record: ``(attempt_id, parent_id, name, timeout_seconds)``.
Queued = tuple[str, str, "str | None", "float | None"]


class Closes:
    """The writes that close a job's tasks and mark their deliveries."""

    def __init__(self, handle: LedgerHandle, heartbeats: Heartbeats, attempts: Attempts) -> None:
        self._handle = handle
        self._release = heartbeats.release
        self._attempts = attempts
        self._policy = handle.policy

    def end_attempt(
        self,
        attempt_id: str,
        outcome: codes.Outcome,
        *,
        logical_id: str,
        settled: codes.Outcome | None,
        retry: tuple[str, str | None, float | None] | None = None,
        also: Sequence[Closing] = (),
        if_queued: Collection[str] = (),
        where: str = "close",
    ) -> int:
        """A delivery of a job ended: one write (``Ledger.end_attempt``) that closes the
        attempt with ``outcome`` (its delivery ``not_applicable/internal_task``), the tasks of
        ``also`` (after it), and, when the framework has ``settled`` the job, the logical task
        with that outcome and the delivery mark its job made, if any; a scheduled ``retry``
        (``(attempt_id, name, timeout_seconds)``) is queued first; the tasks of ``also`` named
        in ``if_queued`` are closed only while still queued. A job that ends without
        settling drops its delivery mark (counted). Releases the attempt and the logical task
        (held by ``begin_attempt``). Conflicts and errors as :meth:`close_tasks`; returns
        how many tasks this call closed.
        """
        self._release(attempt_id, logical_id)
        closings: list[Closing] = [(attempt_id, outcome[0], outcome[1], True), *also]
        if settled is not None:
            closings.append((logical_id, settled[0], settled[1], False))
        queue = () if retry is None else ((retry[0], logical_id, retry[1], retry[2]),)
        closed = self.close_tasks(closings, where=where, queue=queue, if_queued=if_queued)
        if settled is None:
            self.drop_deferred_mark(logical_id)
        return closed

    def close_and_claim(
        self, closings: Sequence[Closing], attempt: AttemptSpec, *, where: str = "close"
    ) -> str | None:
        """:meth:`close_tasks` of ``closings`` and then ``claim_attempt(attempt)`` as one write
        (``Ledger.end_and_begin_attempt``): a boundary between two attempts. Refused closes are
        explained and counted as :meth:`close_tasks` does; returns the attempt started, or None
        when its start was refused (the closes still committed; ``claim_attempt`` explains it).
        When the write itself fails, nothing was written and the error is raised."""
        proc = self._handle.state()
        with proc.lock:
            marks = {c[0]: proc.deferred.pop(c[0]) for c in closings if c[0] in proc.deferred}
        try:
            ended, begun = self._handle.ledger.end_and_begin_attempt(
                [(c[0], c[1], c[2]) for c in closings], attempt.logical_id, marks=marks,
                name=attempt.name, candidates=attempt.candidates, attempt_id=attempt.attempt_id,
                timeout_seconds=attempt.timeout_seconds,
                redelivery_seconds=attempt.redelivery_seconds,
            )
        except BaseException:
            with proc.lock:  # nothing was written: the marks wait for the next close
                for task_id, mark in marks.items():
                    proc.deferred.setdefault(task_id, mark)
            raise
        errors: list[BaseException] = []
        self._explain(ended, closings, (), marks, errors)
        for error in errors:
            self._policy.error(where, error)
        return begun

    def close_tasks(
        self,
        closings: Sequence[Closing],
        *,
        where: str = "close",
        queue: Sequence[Queued] = (),
        if_queued: Collection[str] = (),
    ) -> int:
        """Close several tasks in one write (``Ledger.end_attempt``), in the given order
        (innermost first), after recording the queued attempts of ``queue`` (``(attempt_id,
        parent_id, name, timeout_seconds)``: a scheduled retry, idempotent).

        The tasks named in ``if_queued`` (work that never started: a skipped stage) are closed
        first, and only while still queued: one that started meanwhile is left running for its
        own delivery to close, one closed meanwhile as it was (neither is a conflict).

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
        proc = self._handle.state()
        errors: list[BaseException] = []
        closed = 0
        with proc.lock:
            marks = {c[0]: proc.deferred.pop(c[0]) for c in closings if c[0] in proc.deferred}
        try:
            ended = self._handle.ledger.end_attempt(
                [(c[0], c[1], c[2]) for c in closings], marks=marks, queue=queue,
                if_queued=if_queued,
            )
            closed = len(ended.closed)
            # What the write refused is explained (or done) one task at a time.
            closed += self._explain(ended, closings, queue, marks, errors, if_queued)
        except Exception as exc:
            errors.append(exc)
        for error in errors:
            self._policy.error(where, error)
        return closed

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

    def _explain(
        self,
        ended: Ended,
        closings: Sequence[Closing],
        queue: Sequence[Queued],
        marks: dict[str, codes.Outcome],
        errors: list[BaseException],
        if_queued: Collection[str] = (),
    ) -> int:
        """What an *end attempt* refused, explained (or done) one task at a time: how many
        more tasks were closed so (ledger errors are added to ``errors``). A close of
        ``if_queued`` it refused needs none: that task was no longer queued."""
        led = self._handle.ledger
        closed = 0
        for attempt, parent, name, timeout in queue:
            if attempt not in ended.queued:
                try:
                    self._attempts.queue_attempt(
                        attempt, parent, name=name, timeout_seconds=timeout)
                except LedgerError as exc:
                    errors.append(exc)
        for task_id, status, code, internal in closings:
            if task_id in ended.closed or task_id in if_queued:
                continue
            try:
                closed += self._close_one(led, task_id, status, code, internal)
                mark = marks.get(task_id)
                if mark is not None:
                    led.set_delivery(task_id, mark[0], code=mark[1])
            except LedgerError as exc:
                errors.append(exc)
        return closed

    def _close_one(
        self, led: Ledger, task_id: str, status: str, code: str | None, internal: bool
    ) -> int:
        try:
            # One statement closes the task and, when it owes no delivery, its delivery too.
            led.close_task_settled(task_id, status, code=code)
        except StateConflict:
            self._policy.conflict("attempt_close" if internal else "logical_close")
            # Closed otherwise (e.g. by a reconcile): an internal task still owes nobody a
            # delivery; the core refuses this for a delivering task, which keeps its own.
            with suppress(StateConflict):
                led.set_delivery(task_id, codes.NOT_APPLICABLE, code=codes.INTERNAL_TASK)
            return 0
        return 1

    # ------------------------------------------------------------------ delivery marks

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
        proc = self._handle.state()
        with proc.lock:
            if logical_id in proc.refs:
                proc.deferred[logical_id] = outcome
                return None
        return self._handle.ledger.set_delivery(logical_id, outcome[0], code=outcome[1])

    def drop_deferred_mark(self, logical_id: str) -> None:
        """Forget a delivery mark made inside a job that ended without closing its logical task."""
        proc = self._handle.state()
        with proc.lock:
            dropped = proc.deferred.pop(logical_id, None)
        if dropped is not None:
            self._policy.conflict("delivery_mark_dropped")


__all__ = ["Closes", "Closing", "Queued"]
