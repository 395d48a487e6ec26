"""A guarded job's two writes: *begin attempt* and *end attempt* (the SQLite side).

:class:`Begin` and :class:`End` describe the writes, already validated by the ledger; each
backend runs them as one write (SQLite: one transaction of the statements below; PostgreSQL:
one statement). A step the write refuses (a task closed meanwhile, an id taken, a clock behind
the stored times) is left as it was and reported, and the ledger explains it with its one-task
transitions, which raise the contract's errors.
"""

from __future__ import annotations

import sqlite3
import sys
from dataclasses import dataclass
from typing import Any, NamedTuple

from . import connections
from .placeholders import positional

#: The largest finite timestamp: a start whose deadline would pass it is refused.
FLOAT_MAX = sys.float_info.max


@dataclass(frozen=True, slots=True)
class Begin:
    """*Begin attempt*: open the logical task (create it if missing and start it if queued,
    when ``open_logical``) and start the attempt this delivery runs as: the first of
    ``candidates`` (``(id, create)``: a queued placeholder, recorded first when ``create``)
    that can still be started, else a new attempt ``attempt_id``."""

    logical_id: str
    name: str | None
    delivery_required: bool
    framework_id: str | None
    framework: str | None
    open_logical: bool
    logical_owner: str | None
    candidates: tuple[tuple[str, bool], ...]
    attempt_id: str
    timeout_seconds: float | None
    owner: str
    redelivery_seconds: float | None


@dataclass(frozen=True, slots=True)
class End:
    """*End attempt*: queue ``queue`` (``(id, parent_id, name, timeout_seconds)``: a scheduled
    retry's attempt, first), then close ``closes`` in order (``(id, status, code, mark)``:
    a task that owes no delivery has it closed ``not_applicable/internal_task`` with it; a
    ``mark`` ``(state, code)`` closes a delivering task's delivery in the same change)."""

    closes: tuple[tuple[str, str, str | None, tuple[str, str | None] | None], ...]
    queue: tuple[tuple[str, str, str | None, float | None], ...]


class Ended(NamedTuple):
    """What an *end attempt* wrote: the tasks it closed, the delivery marks it wrote and the
    attempts it queued (anything else it left as it was)."""

    closed: frozenset[str]
    marked: frozenset[str]
    queued: frozenset[str]


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


__all__ = ["FLOAT_MAX", "Begin", "End", "Ended", "sqlite_begin", "sqlite_end"]
