"""*Begin attempt* and *end attempt* on SQLite: each one transaction of guarded statements
(see :mod:`task_state_guard.attempts`); the schema's triggers write every event and total."""

from __future__ import annotations

import sqlite3
from typing import Any

from ..attempts import FLOAT_MAX, Begin, End, Ended
from ..placeholders import positional
from . import connections

_INSERT = (
    "INSERT INTO tsg_tasks(id, parent_id, name, status, delivery_required, delivery_status, "
    "timeout_seconds, created_at, delivery_updated_at, updated_at, framework_id, framework) "
    "SELECT ?2, ?3, ?4, 'queued', ?5, 'pending', ?6, ?1, ?1, ?1, ?7, ?8 "
    "WHERE ?3 IS NULL OR EXISTS (SELECT 1 FROM tsg_tasks WHERE id = ?3 AND created_at <= ?1) "
    "ON CONFLICT(id) DO NOTHING RETURNING seq"
)
_START = (
    "UPDATE tsg_tasks SET status = 'running', started_at = ?1, "
    "deadline_at = ?1 + timeout_seconds, owner = ?3, redelivery_seconds = ?4, updated_at = ?1, "
    "version = version + 1 WHERE id = ?2 AND status = 'queued' AND ?1 >= updated_at "
    "AND (timeout_seconds IS NULL OR timeout_seconds <= ?5 - ?1) RETURNING seq"
)
# A placeholder recorded earlier is claimed only when it is the one this begin would record.
_START_SAME = _START.replace(
    " RETURNING seq",
    " AND parent_id = ?6 AND delivery_required = 0 AND name IS ?7 AND timeout_seconds IS ?8 "
    "AND payload_hash IS NULL AND framework_id IS NULL RETURNING seq",
)
# The close of a task with, in the same change, its delivery: ``not_applicable/internal_task``
# when it owes none, the job's own mark (?5, ?6) when it owes one and made one.
_CLOSE = (
    "UPDATE tsg_tasks SET status = ?3, terminal_code = ?4, ended_at = ?1, updated_at = ?1, "
    "delivery_status = CASE WHEN delivery_required = 0 THEN 'not_applicable' "
    "WHEN ?5 IS NOT NULL THEN ?5 ELSE delivery_status END, "
    "delivery_code = CASE WHEN delivery_required = 0 THEN 'internal_task' "
    "WHEN ?5 IS NOT NULL THEN ?6 ELSE delivery_code END, "
    "delivery_updated_at = CASE WHEN delivery_required = 0 OR ?5 IS NOT NULL THEN ?1 "
    "ELSE delivery_updated_at END, "
    "version = version + CASE WHEN delivery_required = 0 OR ?5 IS NOT NULL THEN 2 ELSE 1 END "
    "WHERE id = ?2 AND status IN ('queued','running') AND delivery_status = 'pending' "
    "AND (?5 IS NULL OR delivery_required = 1) AND ?1 >= updated_at "
    "AND ?1 >= delivery_updated_at AND ?1 >= coalesce(heartbeat_at, 0) RETURNING seq"
)


def _one(conn: sqlite3.Connection, sql: str, params: tuple[Any, ...]) -> bool:
    return conn.execute(*positional(sql, params)).fetchone() is not None


def sqlite_begin(conn: sqlite3.Connection, spec: Begin, now: float) -> str | None:
    """Run *begin attempt* inside the caller's write transaction: the attempt's id, or None
    when no attempt could be started here (the caller explains)."""
    try:
        if spec.open_logical:
            lid = spec.logical_id
            _one(conn, _INSERT, (now, lid, None, spec.name, int(spec.delivery_required), None,
                                 spec.framework_id, spec.framework))
            # A logical task recorded earlier is started if still queued (else left as it is).
            _one(conn, _START, (now, lid, spec.logical_owner, None, FLOAT_MAX))
        for candidate, create in spec.candidates:
            if create:
                _one(conn, _INSERT, (now, candidate, spec.logical_id, spec.name, 0,
                                     spec.timeout_seconds, None, None))
                started = _one(conn, _START_SAME, (
                    now, candidate, spec.owner, spec.redelivery_seconds, FLOAT_MAX,
                    spec.logical_id, spec.name, spec.timeout_seconds))
            else:
                started = _one(conn, _START, (
                    now, candidate, spec.owner, spec.redelivery_seconds, FLOAT_MAX))
            if started:
                return candidate
        fresh = spec.attempt_id
        if not _one(conn, _INSERT, (now, fresh, spec.logical_id, spec.name, 0,
                                    spec.timeout_seconds, None, None)):
            return None
        if not _one(conn, _START, (now, fresh, spec.owner, spec.redelivery_seconds, FLOAT_MAX)):
            return None
        return fresh
    except sqlite3.Error as exc:
        raise connections.translate(exc) from None


def sqlite_end(conn: sqlite3.Connection, spec: End, now: float) -> Ended:
    """Run *end attempt* inside the caller's write transaction."""
    queued: set[str] = set()
    closed: set[str] = set()
    marked: set[str] = set()
    try:
        for attempt, parent, name, timeout in spec.queue:
            if _one(conn, _INSERT, (now, attempt, parent, name, 0, timeout, None, None)):
                queued.add(attempt)
        for task_id, status, code, mark in spec.closes:
            state, mcode = mark if mark is not None else (None, None)
            if _one(conn, _CLOSE, (now, task_id, status, code, state, mcode)):
                closed.add(task_id)
                if mark is not None:
                    marked.add(task_id)
    except sqlite3.Error as exc:
        raise connections.translate(exc) from None
    return Ended(frozenset(closed), frozenset(marked), frozenset(queued))


__all__ = ["sqlite_begin", "sqlite_end"]
