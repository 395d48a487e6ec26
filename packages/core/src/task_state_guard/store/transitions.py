"""One-task transitions as the store receives them, and the task row they answer with.

Each step (:data:`Step`) is already validated by the ledger (``task_state_guard.writes``);
a backend runs it with its own SQL (``Database.transition``) as one guarded statement in a
write transaction (its own, or the open group's) whose clock is read once the task's row (or
the database) is locked: the state change, its guard (allowed source state, clock not earlier
than the stored times) and, through the schema's triggers, its events. When the guard refuses,
the same transaction reads the task's row, so the ledger can explain why (:class:`Outcome`).
A backend may first try the statement alone as its own transaction (one round trip, clock read
before any lock wait); a refusal there proves nothing, and the locked path runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple, TypeAlias

from .. import reasons as r
from .. import rules
from ..model import (
    DELIVERY_STATES,
    TASK_STATES,
    DeliveryStatus,
    StorageError,
    Task,
    TaskStatus,
    codes_registered,
    is_canonical,
    is_payload_hash,
    is_valid_name,
)
from .attempts import FLOAT_MAX

#: The columns of a task row, in the order :func:`row_to_task` reads them.
TASK_COLUMNS = (
    "seq, id, parent_id, name, status, terminal_code, delivery_required, delivery_status, "
    "delivery_code, timeout_seconds, deadline_at, created_at, started_at, heartbeat_at, "
    "ended_at, delivery_updated_at, updated_at, owner, payload_hash, version, framework_id"
)


class Create(NamedTuple):
    """Record a queued task (``ON CONFLICT DO NOTHING``): refused when the id exists (then
    ``found`` is its row) or the parent is missing or created after the clock."""

    task_id: str
    parent_id: str | None
    name: str | None
    delivery_required: bool
    payload_hash: str | None
    timeout_seconds: float | None
    framework_id: str | None
    framework: str | None


class Start(NamedTuple):
    """Move a queued task to running, owned by ``owner`` (a token, or None), with its
    redelivery window; refused unless queued, with a clock not earlier than its last change
    and a deadline (clock + timeout) that is a finite timestamp. ``full``: answer with the
    task's row (else only its ``seq``)."""

    task_id: str
    owner: str | None
    redelivery_seconds: float | None
    full: bool = True


class Heartbeat(NamedTuple):
    """Record a running task's sign of life (no event, version unchanged)."""

    task_id: str


class Heartbeats(NamedTuple):
    """Heartbeat every running task among ``task_ids`` (one statement each, in order);
    the outcome's row is ``(count,)``, the rows changed."""

    task_ids: tuple[str, ...]


class Close(NamedTuple):
    """Close a queued or running task with ``status`` and ``code``; with ``settle`` a task
    that owes no delivery has its delivery closed ``not_applicable/internal_task`` in the same
    change (and the task's delivery must still be pending)."""

    task_id: str
    status: str
    code: str | None
    settle: bool = False


class Deliver(NamedTuple):
    """Close the delivery of a terminal task whose delivery is pending, with ``status`` and
    ``code``; ``required`` is the ``delivery_required`` the state needs (0 only for
    ``not_applicable``)."""

    task_id: str
    status: str
    code: str | None
    required: int


class Look(NamedTuple):
    """Change nothing: read the clock and the task's row under the same lock a transition
    takes (to explain a step refused before any statement, or to judge a task first)."""

    task_id: str


Step: TypeAlias = Create | Start | Heartbeat | Heartbeats | Close | Deliver | Look


class Outcome(NamedTuple):
    """What a step did: ``row``, the changed task's row (:data:`TASK_COLUMNS`, or ``(seq,)``
    for a :class:`Create` or a :class:`Start` without ``full``; ``(count,)`` for
    :class:`Heartbeats`), or None when the guard refused; ``now``, the clock reading it was
    judged with; ``found``, when refused (or for :class:`Look`), the task's row as that
    transaction read it (None when there is no such task)."""

    row: tuple[Any, ...] | None
    now: float
    found: tuple[Any, ...] | None


#: The statements a backend writes for the changing steps, by the name :func:`bind` gives:
#: ``start`` and ``close`` answer with the task's row, ``start_seq`` with its ``seq`` only,
#: ``close_settled`` also settles the delivery of a task that owes none.
STATEMENTS = ("create", "start", "start_seq", "heartbeat", "close", "close_settled", "deliver")


#: How a dialect writes the value bound under a name (SQLite ``:name``; psycopg
#: ``%(name)s::type``): the statements below are composed with it, once per backend.
Mark: TypeAlias = Callable[[str], str]
#: The columns a create writes, in the order of :func:`create_values`.
CREATE_COLUMNS = (
    "id, parent_id, name, status, delivery_required, delivery_status, payload_hash, "
    "timeout_seconds, created_at, delivery_updated_at, updated_at, framework_id, framework"
)


def create_values(v: Mark, parent: str) -> str:
    """A create's row (:data:`CREATE_COLUMNS`), its parent written as ``parent``."""
    now = v("now")
    return (f"{v('id')}, {parent}, {v('name')}, 'queued', {v('required')}, 'pending', "
            f"{v('hash')}, {v('timeout')}, {now}, {now}, {now}, {v('fid')}, {v('framework')}")


def close_guard(v: Mark, *, settle: bool, if_queued: bool = False) -> str:
    """The WHERE of a close of one task: still active (with ``if_queued``: still queued),
    within its clock guard; ``settle``: its delivery still pending too (the close settles it in
    the same change)."""
    pending = " AND delivery_status = 'pending'" if settle else ""
    name = "close_settled" if settle else "close"
    source = "= 'queued'" if if_queued else f"IN {rules.ACTIVE_SQL}"
    return (f"WHERE id = {v('id')} AND status {source}{pending} "
            f"AND {rules.clock_guard(name, v('now'))}")


def close_settled_statement(v: Mark, *, if_queued: bool = False) -> str:
    """A close that also settles the delivery of a task that owes none (delivery_required =
    0): one statement, two events (closed and delivery), version + 2; with ``if_queued`` it
    closes only a task still queued (:func:`close_guard`)."""
    now = v("now")
    return (
        f"UPDATE tsg_tasks SET status = {v('status')}, terminal_code = {v('code')}, "
        f"ended_at = {now}, updated_at = {now}, "
        "delivery_status = CASE delivery_required WHEN 0 THEN 'not_applicable' "
        "ELSE delivery_status END, "
        "delivery_code = CASE delivery_required WHEN 0 THEN 'internal_task' "
        "ELSE delivery_code END, "
        f"delivery_updated_at = CASE delivery_required WHEN 0 THEN {now} "
        "ELSE delivery_updated_at END, "
        "version = version + 2 - delivery_required "
        + close_guard(v, settle=True, if_queued=if_queued)
    )


#: The steps :func:`guarded` writes a statement for.
GUARDED = ("create", "start", "heartbeat", "close", "close_settled", "deliver")


def guarded_statement(v: Mark, name: str) -> str:
    """One changing step's guarded statement (``name``: one of :data:`GUARDED`) in a dialect
    (``v``), without what it answers (a create answers its ``seq`` itself); ``v`` is asked only
    for the values this statement binds. Every backend runs these texts; the guards (source
    state, :func:`rules.clock_guard`, the active and terminal sets) come from the rules.

    ``updated_at`` is the last task-state change or heartbeat; a delivery change moves only
    ``delivery_updated_at``; ``version`` counts state and delivery changes (a heartbeat does
    not). A start whose deadline (now + timeout) would not be a finite timestamp is refused
    (``fmax``: the largest finite float); a create takes any finite timeout, as 0.1.0 did.
    """
    now = v("now")
    if name == "create":
        parent = v("parent")
        return (
            f"INSERT INTO tsg_tasks({CREATE_COLUMNS}) SELECT {create_values(v, parent)} "
            f"WHERE {parent} IS NULL OR EXISTS "
            f"(SELECT 1 FROM tsg_tasks WHERE id = {parent} AND created_at <= {now}) "
            "ON CONFLICT(id) DO NOTHING RETURNING seq"
        )
    if name == "start":
        return (
            f"UPDATE tsg_tasks SET status = 'running', started_at = {now}, "
            f"deadline_at = {now} + timeout_seconds, owner = {v('owner')}, "
            f"redelivery_seconds = {v('redelivery')}, updated_at = {now}, "
            f"version = version + 1 WHERE id = {v('id')} AND status = 'queued' "
            f"AND {rules.clock_guard('start', now)} "
            f"AND (timeout_seconds IS NULL OR timeout_seconds <= {v('fmax')} - {now})"
        )
    if name == "heartbeat":
        return (
            f"UPDATE tsg_tasks SET heartbeat_at = {now}, updated_at = {now} "
            f"WHERE id = {v('id')} AND status = 'running' "
            f"AND {rules.clock_guard('heartbeat', now)}"
        )
    if name == "close":
        return (
            f"UPDATE tsg_tasks SET status = {v('status')}, terminal_code = {v('code')}, "
            f"ended_at = {now}, updated_at = {now}, version = version + 1 "
            + close_guard(v, settle=False)
        )
    if name == "close_settled":
        return close_settled_statement(v)
    if name == "deliver":
        return (
            f"UPDATE tsg_tasks SET delivery_status = {v('status')}, "
            f"delivery_code = {v('code')}, delivery_updated_at = {now}, "
            f"version = version + 1 WHERE id = {v('id')} AND delivery_status = 'pending' "
            # "Not active" rather than "terminal": the same rows under the table's CHECK, and
            # SQLite compares a list of two one by one where a list of four builds a lookup
            # table every time the statement runs.
            f"AND status NOT IN {rules.ACTIVE_SQL} AND delivery_required = {v('required')} "
            f"AND {rules.clock_guard('deliver', now)}"
        )
    raise KeyError(name)


def guarded(v: Mark) -> dict[str, str]:
    """Every step's :func:`guarded_statement` in a dialect (``v``), by name."""
    return {name: guarded_statement(v, name) for name in GUARDED}


def statement(v: Mark, name: str) -> str:
    """One statement of :data:`STATEMENTS` in a dialect (``v``): :func:`guarded_statement`'s,
    answering what its step answers; ``v`` is asked only for the values it binds (so a
    dialect that numbers its parameters composes each statement with a mark of its own)."""
    if name == "create":
        return guarded_statement(v, "create")
    if name == "start_seq":
        return guarded_statement(v, "start") + " RETURNING seq"
    return guarded_statement(v, name) + f" RETURNING {TASK_COLUMNS}"


def statements(v: Mark) -> dict[str, str]:
    """Every statement of :data:`STATEMENTS` in a dialect (``v``), by name."""
    return {name: statement(v, name) for name in STATEMENTS}


def _create(step: Create, now: float) -> tuple[str, dict[str, Any]]:
    return "create", {
        "now": now, "id": step.task_id, "parent": step.parent_id, "name": step.name,
        "required": int(step.delivery_required), "hash": step.payload_hash,
        "timeout": step.timeout_seconds, "fid": step.framework_id, "framework": step.framework,
    }


def _start(step: Start, now: float) -> tuple[str, dict[str, Any]]:
    # fmax, the largest finite float: a start whose deadline (now + timeout) would not be a
    # finite timestamp is refused.
    return "start" if step.full else "start_seq", {
        "now": now, "id": step.task_id, "owner": step.owner,
        "redelivery": step.redelivery_seconds, "fmax": FLOAT_MAX,
    }


def _heartbeat(step: Heartbeat, now: float) -> tuple[str, dict[str, Any]]:
    return "heartbeat", {"now": now, "id": step.task_id}


def _close(step: Close, now: float) -> tuple[str, dict[str, Any]]:
    return "close_settled" if step.settle else "close", {
        "now": now, "id": step.task_id, "status": step.status, "code": step.code,
    }


def _deliver(step: Deliver, now: float) -> tuple[str, dict[str, Any]]:
    return "deliver", {
        "now": now, "id": step.task_id, "status": step.status, "code": step.code,
        "required": step.required,
    }


_BINDERS: dict[type, Callable[[Any, float], tuple[str, dict[str, Any]]]] = {
    Create: _create, Start: _start, Heartbeat: _heartbeat, Close: _close, Deliver: _deliver,
}


def bind(step: Step, now: float) -> tuple[str, dict[str, Any]]:
    """The statement (one of :data:`STATEMENTS`) that runs a changing ``step`` (not
    :class:`Heartbeats` or :class:`Look`) judged at ``now``, and the values it binds by name
    (``now``, ``id`` and the step's own); every backend's text for that statement uses
    exactly these names."""
    return _BINDERS[type(step)](step, now)


def row_to_task(row: tuple[Any, ...]) -> Task:
    """Build a Task from a row selected with TASK_COLUMNS; a tampered row is never returned."""
    if not row_is_valid(row):
        raise StorageError(
            "a stored task row failed validation (run doctor)", reason=r.STORED_ROW_INVALID
        )
    return Task(
        id=row[1],
        parent_id=row[2],
        status=TaskStatus(row[4]),
        delivery_status=DeliveryStatus(row[7]),
        delivery_required=bool(row[6]),
        payload_hash=row[18],
        timeout_seconds=_float(row[9]),
        created_at=float(row[11]),
        started_at=_float(row[12]),
        updated_at=float(row[16]),
        ended_at=_float(row[14]),
        deadline_at=_float(row[10]),
        delivery_updated_at=float(row[15]),
        terminal_code=row[5],
        delivery_code=row[8],
        version=int(row[19]),
        name=row[3],
        heartbeat_at=_float(row[13]),
        has_owner=row[17] is not None,
        framework_id=row[20],
    )


def row_is_valid(row: tuple[Any, ...]) -> bool:
    """Cheap shape check of a task row before any of its values leaves the ledger."""
    status, code, delivery, dcode = row[4], row[5], row[7], row[8]
    if not (
        status in TASK_STATES
        and delivery in DELIVERY_STATES
        and codes_registered(status, code, delivery, dcode)
        and type(row[1]) is str
        and is_canonical(row[1])
        and (row[2] is None or (type(row[2]) is str and is_canonical(row[2])))
        and (row[3] is None or (type(row[3]) is str and is_valid_name(row[3])))
        and (row[18] is None or (type(row[18]) is str and is_payload_hash(row[18])))
        and row[6] in (0, 1)
        and row[11] is not None
        and row[15] is not None
        and row[16] is not None
        and type(row[19]) is int
        and row[19] >= 0
        and (row[20] is None or (type(row[20]) is str and is_canonical(row[20])))
    ):
        return False
    for value in row[9:17]:  # timeout, deadline and every timestamp: None or a finite number
        if value is not None and not (type(value) in (float, int) and math.isfinite(value)):
            return False
    return True


def _float(value: Any) -> float | None:
    # RETURNING hands back integral REAL values as int; callers always get floats.
    return None if value is None else float(value)


__all__ = [
    "CREATE_COLUMNS",
    "GUARDED",
    "STATEMENTS",
    "TASK_COLUMNS",
    "Close",
    "Create",
    "Deliver",
    "Heartbeat",
    "Heartbeats",
    "Look",
    "Mark",
    "Outcome",
    "Start",
    "Step",
    "bind",
    "close_guard",
    "close_settled_statement",
    "create_values",
    "guarded",
    "guarded_statement",
    "row_is_valid",
    "row_to_task",
    "statement",
    "statements",
]
