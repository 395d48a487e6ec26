"""One-task transitions on SQLite (see :mod:`task_state_guard.store.transitions`): each step one
guarded statement, its values bound by name, run inside the caller's IMMEDIATE transaction (the
whole database is locked before the clock is read); the schema's triggers write every event.
"""

from __future__ import annotations

import sqlite3

from ..store.transitions import (
    CREATE_COLUMNS,
    TASK_COLUMNS,
    Heartbeats,
    Look,
    Outcome,
    Step,
    bind,
    create_values,
    guarded,
    statements,
)
from . import connections


def mark(name: str) -> str:
    """SQLite's named parameter."""
    return f":{name}"


SELECT_BY_ID = f"SELECT {TASK_COLUMNS} FROM tsg_tasks WHERE id = :id"
#: The shared guarded statements in SQLite's placeholders (*begin*/*end attempt* run some).
GUARDED = guarded(mark)
_STATEMENTS = statements(mark)
_CREATE = _STATEMENTS["create"]
# A root reads no other row: VALUES, which SQLite does not first collect in a temporary B-tree
# as it does any INSERT ... SELECT into a table with triggers.
_CREATE_ROOT = (
    f"INSERT INTO tsg_tasks({CREATE_COLUMNS}) VALUES ({create_values(mark, 'NULL')}) "
    "ON CONFLICT(id) DO NOTHING RETURNING seq"
)
_HEARTBEAT = GUARDED["heartbeat"]


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
