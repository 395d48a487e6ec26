"""Opening and claiming a job's tasks: logical tasks, attempts and their begin.

A delivery of a job *begins* with one write (:meth:`Attempts.begin_attempt`): the logical
task recorded (with the runtime's framework label, so that the ledger knows whom a lost
verdict is owed to) and started if still queued, then the attempt this delivery runs as
claimed, described by one :class:`AttemptSpec`; both are held (heartbeaten) until the
delivery ends (:class:`~.closing.Closes`). The other writes here open the tasks of adapters
that record their jobs otherwise (a LangGraph invocation, a queued retry).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import suppress
from typing import NamedTuple

from ..model import StateConflict, Task, TaskNotFound, is_canonical
from . import codes
from .handle import LedgerHandle
from .heartbeats import Heartbeats


class AttemptSpec(NamedTuple):
    """Which attempt a delivery starts, under which logical task (every claim of an attempt
    takes one: :meth:`Attempts.begin_attempt`, :meth:`Attempts.claim_attempt`,
    :meth:`~.closing.Closes.close_and_claim`).

    ``logical_id``: the logical task (the attempt's parent). ``name``: the attempt's name
    label. ``candidates``: ``(attempt_id, create)`` in order, e.g. the queued placeholder of a
    scheduled retry (``create=True`` records it first when its own signal has not arrived yet):
    the first one that can still be started is claimed. When none can (another delivery of the
    same message has it: two deliveries never share an attempt), a fresh attempt is recorded,
    with id ``attempt_id`` or a random one. ``timeout_seconds``: the attempt's deadline.
    ``redelivery_seconds``: when the broker hands this delivery's job to another worker if this
    one dies (late acknowledgement, visibility timeout), how long after the attempt's last sign
    of life the broker puts it back in its queue (see
    :mod:`~task_state_guard.integration.redelivery`). It is recorded with the start itself, no
    extra write; once the attempt is lost, reconcile keeps the logical task fresh for that
    window plus its active grace (for the requeued job to reach a free worker), so a job that
    will run again is not declared lost before then. The names are ``Ledger.begin_attempt``'s.
    """

    logical_id: str
    name: str | None
    candidates: Sequence[tuple[str, bool]] = ()
    attempt_id: str | None = None
    timeout_seconds: float | None = None
    redelivery_seconds: float | None = None


def stored_id(framework_id: str | None) -> str | None:
    """A framework id as the ledger stores it: only a canonical UUID (else None)."""
    return framework_id if type(framework_id) is str and is_canonical(framework_id) else None


class Attempts:
    """The writes that open and start a job's tasks (this process's ledger, this runtime's
    framework label)."""

    def __init__(
        self, handle: LedgerHandle, heartbeats: Heartbeats, framework: str | None
    ) -> None:
        self._handle = handle
        self._hold = heartbeats.hold
        self.framework = framework

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
        led = self._handle.ledger
        with led.atomic():
            try:
                queued = led.create_task(
                    task_id=task_id, delivery_required=delivery_required, name=name,
                    framework_id=stored_id(framework_id), framework=self.framework,
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
        :class:`AttemptSpec`).
        """
        led = self._handle.ledger
        with led.atomic():
            led.create_task(
                task_id=task_id, parent_id=parent_id, timeout_seconds=timeout_seconds,
                delivery_required=delivery_required, name=name,
                framework_id=stored_id(framework_id),
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
        thread_id: str | None = None,
        owner: bool = True,
    ) -> None:
        """:meth:`start_task` of a delivering task (owned by this process unless ``owner`` is
        False; no timeout, no redelivery window) as one write: the core's *begin attempt* of
        the task alone (``Ledger.begin_attempt`` with ``attempt=False``), the same records and
        errors. ``thread_id``: the framework's thread of the task (a LangGraph thread id),
        stored with it."""
        self._handle.ledger.begin_attempt(
            task_id, parent_id=parent_id, name=name, delivery_required=True,
            framework_id=stored_id(framework_id), framework=self.framework,
            open_logical=True, logical_owner=owner, attempt=False, thread_id=thread_id,
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
        self._handle.ledger.create_task(
            task_id=attempt_id, parent_id=parent_id, timeout_seconds=timeout_seconds,
            delivery_required=False, name=name,
        )

    def claim_attempt(self, attempt: AttemptSpec) -> str:
        """Start the attempt ``attempt`` describes under its logical task, owned by this
        process; return its id. ``TaskNotFound`` when the logical task does not exist;
        ``StateConflict`` when ``attempt.attempt_id`` exists and is no longer queued. One write
        (``Ledger.begin_attempt`` without opening the logical task)."""
        return self._handle.ledger.begin_attempt(
            attempt.logical_id, name=attempt.name, open_logical=False,
            candidates=attempt.candidates, attempt_id=attempt.attempt_id,
            timeout_seconds=attempt.timeout_seconds,
            redelivery_seconds=attempt.redelivery_seconds,
        )

    def begin_attempt(
        self,
        attempt: AttemptSpec,
        *,
        delivery_required: bool,
        framework_id: str | None = None,
        open_logical: bool = True,
        logical_owner: bool = False,
    ) -> str:
        """A delivery of a job begins: one write, committed before the body runs
        (``Ledger.begin_attempt``), then the attempt and its logical task are held
        (heartbeaten) until ``end_attempt``; returns the attempt's id.

        With ``open_logical`` the logical task ``attempt.logical_id`` is recorded (with this
        runtime's framework label and ``delivery_required``; ``framework_id`` stored only when
        it is a canonical UUID) and started if still queued (``logical_owner``: see
        :meth:`open_logical`); then the attempt is claimed as :meth:`claim_attempt` does.
        ``TaskNotFound`` when the logical task does not exist (and is not opened).
        """
        logical_id = attempt.logical_id
        begun = self._handle.ledger.begin_attempt(
            logical_id, name=attempt.name, delivery_required=delivery_required,
            framework_id=stored_id(framework_id), framework=self.framework,
            open_logical=open_logical, logical_owner=logical_owner,
            candidates=attempt.candidates, attempt_id=attempt.attempt_id,
            timeout_seconds=attempt.timeout_seconds,
            redelivery_seconds=attempt.redelivery_seconds,
        )
        self._hold(begun, logical_id)
        return begun

    def get(self, task_id: str) -> Task | None:
        """The task, or ``None`` when the ledger has no such task."""
        try:
            return self._handle.ledger.get_task(task_id)
        except TaskNotFound:
            return None


__all__ = ["AttemptSpec", "Attempts", "stored_id"]
