"""One-task transitions on SQLite (see :mod:`task_state_guard.store.transitions`): each step one
guarded statement, its values bound by name, run inside the caller's IMMEDIATE transaction (the
whole database is locked before the clock is read); the schema's triggers write every event.
"""

from __future__ import annotations

import sqlite3

from ..store.transitions import (
    TASK_COLUMNS,
    Heartbeats,
    Look,
    Outcome,
    Step,
    bind,
)
from . import connections

_RETURNING = f" RETURNING {TASK_COLUMNS}"
SELECT_BY_ID = f"SELECT {TASK_COLUMNS} FROM tsg_tasks WHERE id = :id"
_CREATE_INTO = (
    "INSERT INTO tsg_tasks(id, parent_id, name, status, delivery_required, delivery_status, "
    "payload_hash, timeout_seconds, created_at, delivery_updated_at, updated_at, framework_id, "
    "framework) "
)
_CREATE = (
    f"{_CREATE_INTO}"
    "SELECT :id, :parent, :name, 'queued', :required, 'pending', :hash, :timeout, :now, :now, "
    ":now, :fid, :framework "
    "WHERE :parent IS NULL OR EXISTS "
    "(SELECT 1 FROM tsg_tasks WHERE id = :parent AND created_at <= :now) "
    "ON CONFLICT(id) DO NOTHING RETURNING seq"
)
# A root reads no other row: VALUES, which SQLite does not first collect in a temporary B-tree
# as it does any INSERT ... SELECT into a table with triggers.
_CREATE_ROOT = (
    f"{_CREATE_INTO}"
    "VALUES (:id, NULL, :name, 'queued', :required, 'pending', :hash, :timeout, :now, :now, "
    ":now, :fid, :framework) ON CONFLICT(id) DO NOTHING RETURNING seq"
)
# updated_at is the last task-state change or heartbeat; a delivery change moves only
# delivery_updated_at. version counts state and delivery changes (heartbeats do not count).
# :fmax is the largest finite float: a start whose deadline (:now + timeout) would not be a
# finite timestamp is refused (a create takes any finite timeout, as 0.1.0 did).
_START = (
    "UPDATE tsg_tasks SET status = 'running', started_at = :now, "
    "deadline_at = :now + timeout_seconds, owner = :owner, redelivery_seconds = :redelivery, "
    "updated_at = :now, version = version + 1 "
    "WHERE id = :id AND status = 'queued' AND :now >= updated_at "
    "AND (timeout_seconds IS NULL OR timeout_seconds <= :fmax - :now)"
)
_HEARTBEAT = (
    "UPDATE tsg_tasks SET heartbeat_at = :now, updated_at = :now "
    "WHERE id = :id AND status = 'running' "
    "AND :now >= updated_at AND :now >= coalesce(heartbeat_at, 0)"
)
_CLOSE = (
    "UPDATE tsg_tasks SET status = :status, terminal_code = :code, ended_at = :now, "
    "updated_at = :now, version = version + 1 WHERE id = :id AND status IN ('queued','running') "
    "AND :now >= updated_at AND :now >= coalesce(heartbeat_at, 0)"
)
# A close that also settles the delivery of a task that owes none (delivery_required = 0):
# one statement, two events (closed and delivery) written by the triggers, version + 2.
_CLOSE_SETTLED = (
    "UPDATE tsg_tasks SET status = :status, terminal_code = :code, ended_at = :now, "
    "updated_at = :now, "
    "delivery_status = CASE delivery_required WHEN 0 THEN 'not_applicable' "
    "ELSE delivery_status END, "
    "delivery_code = CASE delivery_required WHEN 0 THEN 'internal_task' ELSE delivery_code END, "
    "delivery_updated_at = CASE delivery_required WHEN 0 THEN :now ELSE delivery_updated_at END, "
    "version = version + 2 - delivery_required WHERE id = :id AND status IN ('queued','running') "
    "AND delivery_status = 'pending' AND :now >= updated_at AND :now >= delivery_updated_at "
    "AND :now >= coalesce(heartbeat_at, 0)"
)
_DELIVER = (
    "UPDATE tsg_tasks SET delivery_status = :status, delivery_code = :code, "
    "delivery_updated_at = :now, version = version + 1 WHERE id = :id "
    "AND delivery_status = 'pending' AND status NOT IN ('queued','running') "
    "AND delivery_required = :required AND :now >= updated_at AND :now >= delivery_updated_at"
)
_STATEMENTS = {
    "create": _CREATE, "start": _START + _RETURNING, "start_seq": _START + " RETURNING seq",
    "heartbeat": _HEARTBEAT + _RETURNING, "close": _CLOSE + _RETURNING,
    "close_settled": _CLOSE_SETTLED + _RETURNING, "deliver": _DELIVER + _RETURNING,
}


def run(conn: sqlite3.Connection, spec: Step, now: float) -> Outcome:
    """Run ``spec`` inside the caller's write transaction, judged at ``now`` (read after the
    transaction took the database's write lock); on a refusal, read the task's row."""
    try:
        if isinstance(spec, Heartbeats):
            before = conn.total_changes
            conn.executemany(_HEARTBEAT, [{"now": now, "id": tid} for tid in spec.task_ids])
            return Outcome((conn.total_changes - before,), now, None)
        if not isinstance(spec, Look):
            # Every row fetched: the statement runs to its end and is reset, so its cached
            # compilation is reused by the next call.
            name, values = bind(spec, now)
            sql = _STATEMENTS[name]
            if sql is _CREATE and values["parent"] is None:
                sql = _CREATE_ROOT
            rows = conn.execute(sql, values).fetchall()
            if rows:
                return Outcome(rows[0], now, None)
        found = conn.execute(SELECT_BY_ID, {"id": spec.task_id}).fetchone()
    except sqlite3.Error as exc:
        raise connections.translate(exc) from None
    return Outcome(None, now, found)


__all__ = ["SELECT_BY_ID", "run"]
