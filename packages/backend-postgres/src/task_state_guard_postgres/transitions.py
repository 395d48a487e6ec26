"""One-task transitions on PostgreSQL (see :mod:`task_state_guard.store.transitions`): each step
one guarded statement in psycopg's named placeholders (every value cast to its type, so a
``NULL`` needs nothing more), prepared on the server once per connection.

:func:`try_alone` runs the statement as its own transaction (autocommit: one round trip; at READ
COMMITTED a statement that waited for the row's lock re-judges its guard against the row
committed meanwhile); its clock was read before any lock wait, so a refusal proves nothing.
:func:`run_locked` runs inside the caller's transaction: it first holds the task's row, then
reads the clock, then runs the statement, so concurrent writers of one task queue on its row
lock as SQLite's queue on the database lock; on a refusal it reads the row that explains it.
The row trigger writes every event, total and verdict.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from task_state_guard.store.transitions import (
    TASK_COLUMNS,
    Heartbeats,
    Look,
    Outcome,
    Step,
    bind,
)

from .driver import Conn

_NOW = "%(now)s::float8"
_ID = "%(id)s::text"
_RETURNING = f" RETURNING {TASK_COLUMNS}"
_LOCK = f"SELECT 1 FROM tsg_tasks WHERE id = {_ID} FOR NO KEY UPDATE"
_SELECT_BY_ID = f"SELECT {TASK_COLUMNS} FROM tsg_tasks WHERE id = {_ID}"
_CREATE = (
    "INSERT INTO tsg_tasks(id, parent_id, name, status, delivery_required, delivery_status, "
    "payload_hash, timeout_seconds, created_at, delivery_updated_at, updated_at, framework_id, "
    "framework) "
    f"SELECT {_ID}, %(parent)s::text, %(name)s::text, 'queued', %(required)s::int, 'pending', "
    f"%(hash)s::text, %(timeout)s::float8, {_NOW}, {_NOW}, {_NOW}, %(fid)s::text, "
    "%(framework)s::text "
    "WHERE %(parent)s::text IS NULL OR EXISTS "
    f"(SELECT 1 FROM tsg_tasks WHERE id = %(parent)s::text AND created_at <= {_NOW}) "
    "ON CONFLICT(id) DO NOTHING RETURNING seq"
)
# As on SQLite: %(fmax)s is the largest finite float (a start whose deadline would not be a
# finite timestamp is refused); a heartbeat moves updated_at, a delivery change does not.
_START = (
    f"UPDATE tsg_tasks SET status = 'running', started_at = {_NOW}, "
    f"deadline_at = {_NOW} + timeout_seconds, owner = %(owner)s::text, "
    f"redelivery_seconds = %(redelivery)s::float8, updated_at = {_NOW}, version = version + 1 "
    f"WHERE id = {_ID} AND status = 'queued' AND {_NOW} >= updated_at "
    f"AND (timeout_seconds IS NULL OR timeout_seconds <= %(fmax)s::float8 - {_NOW})"
)
_HEARTBEAT = (
    f"UPDATE tsg_tasks SET heartbeat_at = {_NOW}, updated_at = {_NOW} "
    f"WHERE id = {_ID} AND status = 'running' "
    f"AND {_NOW} >= updated_at AND {_NOW} >= coalesce(heartbeat_at, 0)"
)
_CLOSE = (
    f"UPDATE tsg_tasks SET status = %(status)s::text, terminal_code = %(code)s::text, "
    f"ended_at = {_NOW}, updated_at = {_NOW}, version = version + 1 "
    f"WHERE id = {_ID} AND status IN ('queued','running') "
    f"AND {_NOW} >= updated_at AND {_NOW} >= coalesce(heartbeat_at, 0)"
)
# The close that also settles the delivery of a task that owes none: version + 2, two events.
_CLOSE_SETTLED = (
    f"UPDATE tsg_tasks SET status = %(status)s::text, terminal_code = %(code)s::text, "
    f"ended_at = {_NOW}, updated_at = {_NOW}, "
    "delivery_status = CASE delivery_required WHEN 0 THEN 'not_applicable' "
    "ELSE delivery_status END, "
    "delivery_code = CASE delivery_required WHEN 0 THEN 'internal_task' ELSE delivery_code END, "
    f"delivery_updated_at = CASE delivery_required WHEN 0 THEN {_NOW} "
    "ELSE delivery_updated_at END, "
    "version = version + 2 - delivery_required "
    f"WHERE id = {_ID} AND status IN ('queued','running') AND delivery_status = 'pending' "
    f"AND {_NOW} >= updated_at AND {_NOW} >= delivery_updated_at "
    f"AND {_NOW} >= coalesce(heartbeat_at, 0)"
)
_DELIVER = (
    "UPDATE tsg_tasks SET delivery_status = %(status)s::text, delivery_code = %(code)s::text, "
    f"delivery_updated_at = {_NOW}, version = version + 1 WHERE id = {_ID} "
    "AND delivery_status = 'pending' AND status IN ('succeeded','failed','timed_out','cancelled') "
    f"AND delivery_required = %(required)s::int AND {_NOW} >= updated_at "
    f"AND {_NOW} >= delivery_updated_at"
)
_STATEMENTS = {
    "create": _CREATE, "start": _START + _RETURNING, "start_seq": _START + " RETURNING seq",
    "heartbeat": _HEARTBEAT + _RETURNING, "close": _CLOSE + _RETURNING,
    "close_settled": _CLOSE_SETTLED + _RETURNING, "deliver": _DELIVER + _RETURNING,
}


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
