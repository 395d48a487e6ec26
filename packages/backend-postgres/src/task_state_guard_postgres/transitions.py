"""One-task transitions on PostgreSQL (see :mod:`task_state_guard.store.transitions`): each step
one guarded statement composed with the server's own parameters (``$n``, every value cast to its
type, so a ``NULL`` needs nothing more), prepared on the server once per connection.

:func:`try_alone` runs the statement as its own transaction (autocommit: one round trip; at READ
COMMITTED a statement that waited for the row's lock re-judges its guard against the row
committed meanwhile); its clock was read before any lock wait, so a refusal proves nothing.
:func:`run_locked` runs inside the caller's transaction: it first holds the task's row, then
reads the clock, then runs the statement, so concurrent writers of one task queue on its row
lock as SQLite's queue on the database lock; on a refusal it reads the row that explains it.
Each changing statement writes its rows' events, totals and verdicts itself
(:mod:`.writes`: the step's statement as a sub-statement, what its rows owe beside it).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from task_state_guard.store.transitions import (
    STATEMENTS,
    TASK_COLUMNS,
    Heartbeats,
    Look,
    Mark,
    Outcome,
    Step,
    bind,
    guarded,
    guarded_statement,
    statement,
)

from . import writes
from .driver import Conn, prepared

#: The type each bound value is cast to (so a ``NULL`` needs nothing more).
TYPES = {
    "now": "float8", "id": "text", "parent": "text", "name": "text", "required": "int",
    "hash": "text", "timeout": "float8", "fid": "text", "framework": "text", "owner": "text",
    "redelivery": "float8", "fmax": "float8", "status": "text", "code": "text",
}


def mark(name: str) -> str:
    """psycopg's named parameter, cast to its type (:data:`TYPES`), for the statements run
    through a cursor (:meth:`Conn.run`)."""
    return f"%({name})s::{TYPES[name]}"


_LOCK = f"SELECT 1 FROM tsg_tasks WHERE id = {mark('id')} FOR NO KEY UPDATE"
_SELECT_BY_ID = prepared(
    TYPES, lambda v: f"SELECT {TASK_COLUMNS} FROM tsg_tasks WHERE id = {v('id')}"
)
#: The events each changing statement's rows owe (by the statement names of ``STATEMENTS``;
#: a heartbeat owes none).
OWES = {
    "create": ("created",), "start": ("started",), "start_seq": ("started",),
    "close": ("closed",), "close_settled": ("closed", "delivery"), "deliver": ("delivery",),
}
_CREATE_ANSWER = " RETURNING seq"


def _writing(v: Mark, name: str) -> str:
    """The shared statement ``name`` as a sub-statement, with what its rows owe beside it
    (:data:`OWES`), answering what the shared statement answers."""
    if name not in OWES:
        return statement(v, name)
    change = guarded_statement(v, "start" if name == "start_seq" else name)
    if name == "create":
        assert change.endswith(_CREATE_ANSWER)
        change = change[: -len(_CREATE_ANSWER)]
    answer = "seq" if name in ("create", "start_seq") else TASK_COLUMNS
    owed = ",\n".join(writes.owed("w", OWES[name]))
    return f"WITH w AS ({change} RETURNING *),\n{owed}\nSELECT {answer} FROM w"


#: The shared statements, each composed on its own with the server's parameters.
_STATEMENTS = {
    name: prepared(TYPES, partial(_writing, name=name)) for name in STATEMENTS
}
_HEARTBEAT = guarded(mark)["heartbeat"]


def has_fast_path(spec: Step) -> bool:
    """True for a step :func:`try_alone` can run (one task, one change)."""
    return not isinstance(spec, Heartbeats | Look)


def try_alone(conn: Conn, spec: Step, now: float) -> tuple[Any, ...] | None:
    """Run a changing step's statement as its own transaction (outside any transaction
    block): its row, or None (refused: that proves nothing)."""
    name, values = bind(spec, now)
    rows = conn.fetch_named(_STATEMENTS[name], values)
    return rows[0] if rows else None


def run_locked(conn: Conn, spec: Step, now: Callable[[], float]) -> Outcome:
    """Run ``spec`` inside the caller's transaction: hold the task's row, read the clock
    (``now()``), run the statement; on a refusal read the task's row."""
    if isinstance(spec, Heartbeats):
        at = now()
        changed = conn.run_many(_HEARTBEAT, [{"now": at, "id": tid} for tid in spec.task_ids])
        return Outcome((changed,), at, None)
    conn.run(_LOCK, {"id": spec.task_id})
    at = now()
    if not isinstance(spec, Look):
        name, values = bind(spec, at)
        rows = conn.fetch_named(_STATEMENTS[name], values)
        if rows:
            return Outcome(rows[0], at, None)
    found = conn.fetch_named(_SELECT_BY_ID, {"id": spec.task_id})
    return Outcome(None, at, found[0] if found else None)


__all__ = ["has_fast_path", "run_locked", "try_alone"]
