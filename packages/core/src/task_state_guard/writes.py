"""The ledger's writes: each validates its input, hands the store one step
(``Database.transition``: a one-task step, *begin attempt* or *end attempt*) and, when the
store's guard refused, explains why from the row the refusing transaction read, in the
contract's order.

:class:`~task_state_guard.ledger.Ledger` delegates each public transition here; bad input is
a fixed ``InvalidInput`` and changes nothing.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterable, Mapping
from contextlib import suppress
from typing import Any, NoReturn

from . import reasons as r
from .model import (
    DELIVERY_CLOSED,
    DELIVERY_CODES,
    TASK_CODES,
    TERMINAL_STATES,
    DeliveryStatus,
    InvalidInput,
    StateConflict,
    StorageError,
    Task,
    TaskNotFound,
    TaskStatus,
    canonical_id,
    check_code,
    check_code_shape,
    check_framework,
    check_name,
    check_payload_hash,
    check_seconds,
    check_state,
    check_thread_id,
    is_canonical,
)
from .store import attempts
from .store import protocol as store
from .store.transitions import (
    Close,
    Create,
    Deliver,
    Heartbeat,
    Heartbeats,
    Look,
    Start,
    row_is_valid,
    row_to_task,
)

_READ_ONLY = "the ledger was opened read-only"


def framework_id(value: object) -> str:
    """A framework id as stored: exactly a canonical lowercase UUID (anything else may carry
    user data and is refused)."""
    if isinstance(value, uuid.UUID):
        return str(value)
    if type(value) is str and is_canonical(value):
        return value
    raise InvalidInput("framework id must be a canonical lowercase UUID")


def _writable(db: store.Database) -> None:
    if db.opened.read_only:
        raise StorageError(_READ_ONLY, reason=r.READ_ONLY_LEDGER)


def supervise(db: store.Database) -> None:
    """This process owns what the children it forks start (``Ledger.supervise_children``)."""
    _writable(db)
    db.owners.supervise()


def _current(db: store.Database, tid: str) -> tuple[Any, ...]:
    """The task's row as a transition would see it (TaskNotFound when missing)."""
    row = db.transition(Look(tid)).found
    if row is None:
        raise TaskNotFound("task not found")
    return row


def _clock_behind(row: tuple[Any, ...], now: float) -> bool:
    """True when ``now`` is earlier than the task's last change, heartbeat or delivery change."""
    return now < row[16] or now < row[15] or (row[13] is not None and now < row[13])


def create(
    db: store.Database,
    task_id: str | uuid.UUID | None,
    parent_id: str | uuid.UUID | None,
    timeout_seconds: float | None,
    delivery_required: bool,
    name: str | None,
    payload_hash: str | None,
    fid: str | uuid.UUID | None,
    *,
    quiet: bool,
    framework: str | None = None,
) -> Task | str:
    """``Ledger.create_task``; ``quiet=True`` returns only the task's state (no Task built).
    An existing task keeps the ``framework`` label it was created with."""
    tid = str(uuid.uuid4()) if task_id is None else canonical_id(task_id)
    parent = None if parent_id is None else canonical_id(parent_id, "parent id")
    timeout = (  # any finite duration, as in 0.1.0 (a start checks the deadline)
        None
        if timeout_seconds is None
        else check_seconds(timeout_seconds, "timeout_seconds", allow_zero=True, maximum=None)
    )
    if not isinstance(delivery_required, bool):
        raise InvalidInput("delivery_required must be a boolean")
    label = check_name(name)
    fingerprint = check_payload_hash(payload_hash)
    fid = None if fid is None else framework_id(fid)
    done = db.transition(Create(tid, parent, label, delivery_required, fingerprint, timeout,
                                fid, check_framework(framework)))
    if done.row is None:
        row = done.found
        if row is not None:  # an explicit id that already exists
            if (row[2], bool(row[6]), row[3], row[9], row[18], row[20]) != (
                parent, delivery_required, label, timeout, fingerprint, fid
            ):
                raise StateConflict("a task with this id exists with other attributes")
            if quiet:
                if not row_is_valid(row):
                    raise StorageError(
                        "a stored task row failed validation (run doctor)",
                        reason=r.STORED_ROW_INVALID,
                    )
                return str(row[4])
            return row_to_task(row)
        assert parent is not None
        _current(db, parent)  # TaskNotFound when the parent is missing
        raise StateConflict("clock is earlier than the parent's creation")
    if quiet:
        return "queued"
    now = done.now
    return Task(
        id=tid, parent_id=parent, status=TaskStatus.QUEUED,
        delivery_status=DeliveryStatus.PENDING, delivery_required=delivery_required,
        payload_hash=fingerprint, timeout_seconds=timeout, created_at=now, started_at=None,
        updated_at=now, ended_at=None, deadline_at=None, delivery_updated_at=now,
        terminal_code=None, delivery_code=None, version=0, name=label, framework_id=fid,
    )


def _explain_start(row: tuple[Any, ...] | None, now: float) -> NoReturn:
    """Why a guarded start was refused (the row as the refusing transaction read it)."""
    if row is None:
        raise TaskNotFound("task not found")
    if row[4] != "queued":
        raise StateConflict("only a queued task can start")
    if row[9] is not None and not math.isfinite(now + float(row[9])):
        raise InvalidInput("the task's deadline would not be a finite timestamp")
    raise StateConflict("clock is earlier than the task's stored times")


def start(
    db: store.Database, task_id: str | uuid.UUID, *, owner: bool,
    redelivery_seconds: float | None, full: bool,
) -> Task | None:
    """``Ledger.start_task``; with ``full=False`` nothing is built (None returned).

    The owner lock (file) is made only for a start with an owner, once the task was found
    queued, outside the write transaction (its creation never waits for, or holds up, another
    writer); once this process holds it, the guarded update alone decides.
    """
    tid = canonical_id(task_id)
    if not isinstance(owner, bool):
        raise InvalidInput("owner must be a boolean")
    bound = None if redelivery_seconds is None else check_seconds(
        redelivery_seconds, "redelivery_seconds", allow_zero=True
    )
    _writable(db)
    token = db.owners.held() if owner else None
    if owner and token is None:
        if _current(db, tid)[4] != "queued":  # judged before the lock exists
            raise StateConflict("only a queued task can start")
        token = db.owners.own()
    done = db.transition(Start(tid, token, bound, full))
    if done.row is None:
        _explain_start(done.found, done.now)
    return row_to_task(done.row) if full else None


def heartbeat(db: store.Database, task_id: str | uuid.UUID) -> Task:
    """``Ledger.heartbeat``."""
    done = db.transition(Heartbeat(canonical_id(task_id)))
    if done.row is not None:
        return row_to_task(done.row)
    row = done.found
    if row is None:
        raise TaskNotFound("task not found")
    if row[4] != "running":
        raise StateConflict("only a running task can heartbeat")
    raise StateConflict("clock is earlier than the task's stored times")


def heartbeat_many(db: store.Database, task_ids: Iterable[str | uuid.UUID]) -> int:
    """``Ledger.heartbeat_many``."""
    if isinstance(task_ids, str | bytes) or not isinstance(task_ids, Iterable):
        raise InvalidInput("task_ids must be an iterable of task ids")
    ids = tuple(canonical_id(t) for t in task_ids)
    if not ids:
        return 0
    done = db.transition(Heartbeats(ids))
    assert done.row is not None
    return int(done.row[0])


def close(db: store.Database, task_id: str | uuid.UUID, status: str, code: str | None) -> Task:
    """``Ledger.close_task``: a repeat of the stored terminal state returns the stored task."""
    tid = canonical_id(task_id)
    state = check_state(status, TERMINAL_STATES, "terminal task status")
    reason = check_code_shape(code)
    code_ok = reason is None or reason in TASK_CODES[state]
    done = db.transition(Close(tid, state, reason) if code_ok else Look(tid))
    if done.row is not None:
        return row_to_task(done.row)
    row = done.found
    if row is None:  # explain, in the contract's precedence order
        raise TaskNotFound("task not found")
    if row[4] == state:  # a repeat of the same close, whatever its code (as in 0.1.0):
        return row_to_task(row)  # the stored task, its stored code included
    if row[4] in TERMINAL_STATES:
        raise StateConflict("the task already closed with another state")
    if _clock_behind(row, done.now):
        raise StateConflict("clock is earlier than the task's stored times")
    check_code(reason, state, TASK_CODES)
    raise StateConflict("the task could not be closed")  # open, valid code and clock


def close_settled(
    db: store.Database, task_id: str | uuid.UUID, status: str, code: str | None
) -> Task:
    """``Ledger.close_task_settled``."""
    tid = canonical_id(task_id)
    state = check_state(status, TERMINAL_STATES, "terminal task status")
    reason = check_code_shape(code)
    if reason is None or reason in TASK_CODES[state]:
        done = db.transition(Close(tid, state, reason, settle=True))
        if done.row is not None:
            return row_to_task(done.row)
    with db.group():  # the one-step transitions explain (or close, then settle)
        task = close(db, tid, state, reason)
        if task.delivery_required or task.delivery_status != DeliveryStatus.PENDING:
            return task
        return set_delivery(db, tid, "not_applicable", "internal_task")


def set_delivery(
    db: store.Database, task_id: str | uuid.UUID, status: str, code: str | None
) -> Task:
    """``Ledger.set_delivery``: a repeat of the stored delivery state returns the stored task."""
    tid = canonical_id(task_id)
    state = check_state(status, DELIVERY_CLOSED, "delivery status")
    reason = check_code_shape(code)
    code_ok = reason is None or reason in DELIVERY_CODES[state]
    required = int(state != "not_applicable")
    done = db.transition(Deliver(tid, state, reason, required) if code_ok else Look(tid))
    if done.row is not None:
        return row_to_task(done.row)
    row = done.found
    if row is None:  # explain, in the contract's precedence order
        raise TaskNotFound("task not found")
    if row[4] not in TERMINAL_STATES:
        raise StateConflict("delivery can close only after the task is terminal")
    if row[7] != "pending" and row[7] != state:
        raise StateConflict("the delivery already closed with another state")
    if row[7] == "pending":
        if row[6] != required:
            raise StateConflict(
                "delivering tasks cannot be not_applicable; internal tasks can only be"
            )
        if _clock_behind(row, done.now):
            raise StateConflict("clock is earlier than the task's stored times")
    check_code(reason, state, DELIVERY_CODES)
    if row[7] != state:  # a pending delivery with a valid code and clock would have closed
        raise StateConflict("the delivery could not be closed")
    return row_to_task(row)  # identical repeat: the original is kept


def begin_attempt(
    db: store.Database,
    logical_id: str | uuid.UUID,
    *,
    name: str | None,
    delivery_required: bool,
    fid: str | uuid.UUID | None,
    framework: str | None,
    open_logical: bool,
    logical_owner: bool,
    candidates: Iterable[tuple[str | uuid.UUID, bool]],
    attempt_id: str | uuid.UUID | None,
    timeout_seconds: float | None,
    redelivery_seconds: float | None,
    parent_id: str | uuid.UUID | None = None,
    attempt: bool = True,
    thread_id: str | None = None,
) -> str:
    """``Ledger.begin_attempt``: one write; a step it refused is explained (or done) by the
    one-task transitions, in one group."""
    spec = _begin_spec(
        db, logical_id, name=name, delivery_required=delivery_required, fid=fid,
        framework=framework, open_logical=open_logical, logical_owner=logical_owner,
        candidates=candidates, attempt_id=attempt_id, timeout_seconds=timeout_seconds,
        redelivery_seconds=redelivery_seconds, parent_id=parent_id, attempt=attempt,
        thread_id=thread_id)
    begun = db.transition(spec)
    if begun is not None:
        return begun
    with db.group():
        return _begin_steps(db, spec)


def _begin_spec(
    db: store.Database,
    logical_id: str | uuid.UUID,
    *,
    name: str | None,
    delivery_required: bool,
    fid: str | uuid.UUID | None,
    framework: str | None,
    open_logical: bool,
    logical_owner: bool,
    candidates: Iterable[tuple[str | uuid.UUID, bool]],
    attempt_id: str | uuid.UUID | None,
    timeout_seconds: float | None,
    redelivery_seconds: float | None,
    parent_id: str | uuid.UUID | None,
    attempt: bool,
    thread_id: str | None = None,
) -> attempts.Begin:
    """The validated :class:`~task_state_guard.store.attempts.Begin` of a ``begin_attempt``."""
    lid = canonical_id(logical_id)
    thread = None if thread_id is None else check_thread_id(thread_id)
    if thread is not None and (attempt or not delivery_required):
        raise InvalidInput("thread_id is only for a delivering task opened without an attempt")
    if not isinstance(attempt, bool):
        raise InvalidInput("flags must be booleans")
    parent = None if parent_id is None else canonical_id(parent_id, "parent id")
    if attempt and parent is not None:
        raise InvalidInput("parent_id is only for a logical task opened without an attempt")
    if not attempt and not open_logical:
        raise InvalidInput("attempt=False needs open_logical")
    for flag in (delivery_required, open_logical, logical_owner):
        if not isinstance(flag, bool):
            raise InvalidInput("flags must be booleans")
    if type(candidates) is not tuple and type(candidates) is not list and (
        isinstance(candidates, str | bytes) or not isinstance(candidates, Iterable)
    ):
        raise InvalidInput("candidates must be an iterable of (task id, create) pairs")
    picks: list[tuple[str, bool]] = []
    for candidate, create_it in candidates:
        if not isinstance(create_it, bool):
            raise InvalidInput("flags must be booleans")
        picks.append((canonical_id(candidate), create_it))
    timeout = None if timeout_seconds is None else check_seconds(
        timeout_seconds, "timeout_seconds", allow_zero=True, maximum=None
    )
    bound = None if redelivery_seconds is None else check_seconds(
        redelivery_seconds, "redelivery_seconds", allow_zero=True
    )
    _writable(db)
    token = db.owners.held() or db.owners.own()
    return attempts.Begin(
        logical_id=lid, name=check_name(name), delivery_required=delivery_required,
        framework_id=None if fid is None else framework_id(fid),
        framework=check_framework(framework), open_logical=open_logical,
        logical_owner=token if logical_owner else None, candidates=tuple(picks),
        attempt_id=str(uuid.uuid4()) if attempt_id is None else canonical_id(attempt_id),
        timeout_seconds=timeout, owner=token, redelivery_seconds=bound, parent_id=parent,
        attempt=attempt,
        # A layout without the thread column (an older file SQLite kept as it was) stores none.
        thread_id=thread if db.layout.has_threads else None,
    )


def _begin_steps(db: store.Database, spec: attempts.Begin) -> str:
    """:func:`begin_attempt` one transition at a time (inside a group)."""
    lid, name, bound = spec.logical_id, spec.name, spec.redelivery_seconds
    if not spec.attempt:
        # create_task and start_task: an identical task still queued is started, another
        # one refused (StateConflict, TaskNotFound for a missing parent).
        create(db, lid, spec.parent_id, None, spec.delivery_required, name, None,
               spec.framework_id, quiet=True, framework=spec.framework)
        start(db, lid, owner=spec.logical_owner is not None, redelivery_seconds=None,
              full=False)
        return lid
    if spec.open_logical:
        try:
            queued = create(
                db, lid, None, None, spec.delivery_required, name, None, spec.framework_id,
                quiet=True, framework=spec.framework,
            ) == "queued"
        except StateConflict:
            queued = True
        if queued:
            with suppress(StateConflict):  # started by a concurrent delivery
                start(db, lid, owner=spec.logical_owner is not None, redelivery_seconds=None,
                      full=False)
    for candidate, create_it in spec.candidates:
        try:
            if create_it:
                create(db, candidate, lid, spec.timeout_seconds, False, name, None, None,
                       quiet=True)
            start(db, candidate, owner=True, redelivery_seconds=bound, full=False)
            return candidate
        except (StateConflict, TaskNotFound):
            continue
    fresh = spec.attempt_id
    create(db, fresh, lid, spec.timeout_seconds, False, name, None, None, quiet=True)
    start(db, fresh, owner=True, redelivery_seconds=bound, full=False)
    return fresh


def end_and_begin_attempt(
    db: store.Database,
    closes: Iterable[tuple[str | uuid.UUID, str, str | None]],
    marks: Mapping[str, tuple[str, str | None]] | None,
    queue: Iterable[tuple[str | uuid.UUID, str | uuid.UUID, str | None, float | None]],
    logical_id: str | uuid.UUID,
    *,
    name: str | None,
    candidates: Iterable[tuple[str | uuid.UUID, bool]],
    attempt_id: str | uuid.UUID | None,
    timeout_seconds: float | None,
    redelivery_seconds: float | None,
) -> tuple[attempts.Ended, str | None]:
    """``Ledger.end_and_begin_attempt``: :func:`end_attempt` and then :func:`begin_attempt`
    (under a logical task that exists) as one write; the begin is None when it was refused
    (the end still commits; the caller explains the begin with ``begin_attempt``)."""
    spec = _begin_spec(
        db, logical_id, name=name, delivery_required=False, fid=None, framework=None,
        open_logical=False, logical_owner=False, candidates=candidates,
        attempt_id=attempt_id, timeout_seconds=timeout_seconds,
        redelivery_seconds=redelivery_seconds, parent_id=None, attempt=True)
    end = _end_spec(closes, marks, queue)
    if not end.closes and not end.queue:
        return attempts.Ended(frozenset(), frozenset(), frozenset()), db.transition(spec)
    return db.transition(attempts.Boundary(end, spec))


def end_attempt(
    db: store.Database,
    closes: Iterable[tuple[str | uuid.UUID, str, str | None]],
    marks: Mapping[str, tuple[str, str | None]] | None,
    queue: Iterable[tuple[str | uuid.UUID, str | uuid.UUID, str | None, float | None]],
    if_queued: Iterable[str | uuid.UUID] = (),
) -> attempts.Ended:
    """``Ledger.end_attempt``: the steps the ledger would refuse anyway are left out (the
    caller's one-task transitions explain them); the others go to the store as one write."""
    spec = _end_spec(closes, marks, queue, if_queued)
    if not spec.closes and not spec.queue:
        return attempts.Ended(frozenset(), frozenset(), frozenset())
    _writable(db)
    return db.transition(spec)


def _end_spec(
    closes: Iterable[tuple[str | uuid.UUID, str, str | None]],
    marks: Mapping[str, tuple[str, str | None]] | None,
    queue: Iterable[tuple[str | uuid.UUID, str | uuid.UUID, str | None, float | None]],
    if_queued: Iterable[str | uuid.UUID] = (),
) -> attempts.End:
    """The validated :class:`~task_state_guard.store.attempts.End` of an ``end_attempt``: the
    closes of ``if_queued`` first (each backend writes them so), the others after, each in the
    given order."""
    marked = {} if marks is None else {canonical_id(k): v for k, v in marks.items()}
    rows: list[tuple[str, str, str | None, tuple[str, str | None] | None]] = []
    for task_id, status, code in closes:
        tid = canonical_id(task_id)
        state = check_state(status, TERMINAL_STATES, "terminal task status")
        reason = check_code_shape(code)
        mark = marked.get(tid)
        if mark is not None:
            mstate = check_state(mark[0], DELIVERY_CLOSED, "delivery status")
            mcode = check_code_shape(mark[1])
            if mstate == "not_applicable" or (
                mcode is not None and mcode not in DELIVERY_CODES[mstate]
            ):
                continue  # left to set_delivery, which explains
            mark = (mstate, mcode)
        if reason is None or reason in TASK_CODES[state]:
            rows.append((tid, state, reason, mark))
    queued: list[tuple[str, str, str | None, float | None]] = []
    for attempt, parent, name, timeout in queue:
        queued.append((
            canonical_id(attempt), canonical_id(parent, "parent id"), check_name(name),
            None if timeout is None else check_seconds(
                timeout, "timeout_seconds", allow_zero=True, maximum=None),
        ))
    only = frozenset(canonical_id(task_id) for task_id in if_queued) if if_queued else None
    if not only:
        return attempts.End(tuple(rows), tuple(queued))
    first = [row for row in rows if row[0] in only]
    rest = [row for row in rows if row[0] not in only]
    return attempts.End((*first, *rest), tuple(queued), frozenset(row[0] for row in first))


__all__ = [
    "begin_attempt", "close", "close_settled", "create", "end_and_begin_attempt", "end_attempt",
    "framework_id",
    "heartbeat", "heartbeat_many", "set_delivery", "start", "supervise",
]
