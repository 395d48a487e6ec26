"""*Begin attempt* and *end attempt* on SQLite: each one transaction of guarded statements
(see :mod:`task_state_guard.store.attempts`); the schema's triggers write every event and total.

*Begin* inserts a new logical task and a new attempt already running, one INSERT each (layout
7: the insert's triggers write the created and started events, the chain a create followed by
a start at the same instant holds); only a task recorded earlier (a logical task, a queued
placeholder) is started by an UPDATE."""

from __future__ import annotations

import sqlite3
from typing import Any

from .. import reasons as r
from .. import rules
from ..model import StorageError
from ..store.attempts import FLOAT_MAX, Begin, Boundary, End, Ended
from ..store.transitions import close_guard, close_settled_statement
from . import connections
from .transitions import GUARDED
from .transitions import mark as _mark

# SQLite collects the rows of any INSERT ... SELECT into a table with triggers in a temporary
# B-tree first, a VALUES row not: a row's guards decide its id instead, and a row whose id is
# NULL breaks its NOT NULL constraint, which OR IGNORE turns into no row (an existing id too).
# The insert's triggers inherit OR IGNORE: :func:`_insert_new` refuses a row whose events were
# not all written (they collide only with events a damaged file kept of a removed task).
#
# A value known to be NULL in a statement's shape is written NULL in its text, not bound: the
# sqlite3 module passes each bound None through its adaptation protocol (a registry lookup and,
# on CPython 3.11, a failed attribute lookup that formats an error message), ~0.3 µs a value,
# 12 values a job before. Each shape below is a constant chosen by the caller.
_PARENT_EXISTS = "EXISTS (SELECT 1 FROM tsg_tasks WHERE id = :parent AND created_at <= :now)"
_PARENT_FITS = f"(:parent IS NULL OR {_PARENT_EXISTS})"
_NAMES = (
    "id, parent_id, name, status, delivery_required, delivery_status, "
    "timeout_seconds, deadline_at, created_at, started_at, owner, redelivery_seconds, "
    "delivery_updated_at, updated_at, version, framework_id, framework"
)
_COLUMNS = f"tsg_tasks({_NAMES}) "
_THREAD_COLUMNS = f"tsg_tasks({_NAMES}, thread_id) "
# A new queued attempt (a scheduled retry), under a parent that exists and was created no
# later than now.
_INSERT_QUEUED = (
    "INSERT OR IGNORE INTO tsg_tasks(id, parent_id, name, status, delivery_required, "
    "delivery_status, timeout_seconds, created_at, delivery_updated_at, updated_at) "
    f"VALUES (CASE WHEN {_PARENT_FITS} THEN :id END, :parent, :name, 'queued', 0, 'pending', "
    ":timeout, :now, :now, :now)"
)
# A new logical task already running (no deadline, no redelivery window): what an insert
# followed by a start at the same instant store; a root needs no guard.
_LOGICAL_ROW = (
    ":name, 'running', :required, 'pending', NULL, NULL, :now, :now, :owner, NULL, :now, :now, "
    "1, :fid, :framework"
)

def _logical_insert(child: bool, thread: bool) -> str:
    """The INSERT of a logical task already running, in one shape: ``child`` under
    ``:parent`` (which must exist), ``thread`` with its thread id (a layout without the
    column never gets one)."""
    columns, row = (_THREAD_COLUMNS, f"{_LOGICAL_ROW}, :thread") if thread else (
        _COLUMNS, _LOGICAL_ROW)
    if not child:
        return f"INSERT INTO {columns}VALUES (:id, NULL, {row}) ON CONFLICT(id) DO NOTHING"
    return (f"INSERT OR IGNORE INTO {columns}VALUES (CASE WHEN {_PARENT_EXISTS} THEN :id END, "
            f":parent, {row})")


# Every shape of :func:`_logical_insert`, by (child, thread).
_INSERT_LOGICAL = {(child, thread): _logical_insert(child, thread)
                   for child in (False, True) for thread in (False, True)}


def _attempt_insert(checked: bool, timed: bool, redelivered: bool) -> str:
    """The INSERT of an attempt already running under its logical task (``:parent``), in one
    shape: ``checked`` when its guards are known to hold (a logical task this begin inserted
    at this instant, a deadline that is a finite timestamp), ``timed`` when it has a timeout,
    ``redelivered`` when it has a redelivery window."""
    timeout, deadline = (":timeout", ":now + :timeout") if timed else ("NULL", "NULL")
    redelivery = ":redelivery" if redelivered else "NULL"
    row = (f":parent, :name, 'running', 0, 'pending', {timeout}, {deadline}, :now, :now, "
           f":owner, {redelivery}, :now, :now, 1, NULL, NULL")
    if checked:
        return f"INSERT INTO {_COLUMNS}VALUES (:id, {row}) ON CONFLICT(id) DO NOTHING"
    guard = _PARENT_EXISTS + (" AND :timeout <= :fmax - :now" if timed else "")
    return f"INSERT OR IGNORE INTO {_COLUMNS}VALUES (CASE WHEN {guard} THEN :id END, {row})"


# Every shape of :func:`_attempt_insert`, by (checked, timed, redelivered).
_INSERT_ATTEMPT = {
    (checked, timed, redelivered): _attempt_insert(checked, timed, redelivered)
    for checked in (False, True) for timed in (False, True) for redelivered in (False, True)
}
# The start of a task recorded earlier: the one-task transition's statement.
_START = GUARDED["start"]
# A placeholder recorded earlier is claimed only when it is the one this begin would record.
_START_SAME = (
    _START + " AND parent_id = :parent AND delivery_required = 0 AND name IS :name "
    "AND timeout_seconds IS :timeout AND payload_hash IS NULL AND framework_id IS NULL"
)
# The close of a task with, in the same change, its delivery: ``not_applicable/internal_task``
# when it owes none (:data:`_CLOSE`, the one-task close that settles); the job's own mark
# (:mstate, :mcode) when it owes one and made one (:data:`_CLOSE_MARKED`: a task that owes none
# is not closed with a mark).
# The closes of :attr:`End.if_queued <task_state_guard.store.attempts.End.if_queued>` close a
# task only while it is still queued.
_CLOSE = {False: GUARDED["close_settled"], True: close_settled_statement(_mark, if_queued=True)}
_CLOSE_MARKED = {
    queued: (
        "UPDATE tsg_tasks SET status = :status, terminal_code = :code, ended_at = :now, "
        "updated_at = :now, delivery_status = :mstate, delivery_code = :mcode, "
        "delivery_updated_at = :now, version = version + 2 "
        + close_guard(_mark, settle=True, if_queued=queued) + " AND delivery_required = 1"
    )
    for queued in (False, True)
}


# An attempt queued and closed by the same *end attempt* (a step's history, committed after
# it ended) is inserted as its final row at once: the row a queued insert and a settling close
# would leave (no start, its delivery ``not_applicable/internal_task``, two changes counted),
# one statement instead of two. The insert's trigger writes its created event; its closed and
# delivery events and their outcome totals, which the triggers of a close would write, are
# written from the rows themselves, for every such row of the write at once (they are the
# rows past ``:mark``, the largest ``seq`` before the inserts, that are closed).
_INSERT_CLOSED = (
    "INSERT OR IGNORE INTO tsg_tasks(id, parent_id, name, status, terminal_code, "
    "delivery_required, delivery_status, delivery_code, timeout_seconds, created_at, ended_at, "
    "delivery_updated_at, updated_at, version) "
    f"VALUES (CASE WHEN {_PARENT_FITS} THEN :id END, :parent, :name, :status, :code, 0, "
    "'not_applicable', 'internal_task', :timeout, :now, :now, :now, :now, 2)"
)
_LAST_SEQ = "SELECT coalesce(max(seq), 0) FROM tsg_tasks"
_CLOSED_SINCE = f"tsg_tasks WHERE seq > :mark AND status IN {rules.TERMINAL_SQL}"
_CLOSED_IDS = f"SELECT id FROM {_CLOSED_SINCE}"
# One statement each (a compound SELECT would be collected in a temporary table first).
_CLOSED_WRITES = (
    *(rules.event_insert_select(rules.EVENTS_BY_KIND[kind], _CLOSED_SINCE)
      for kind in ("closed", "delivery")),
    *(rules.TOTAL_RULES[event].upsert(_CLOSED_SINCE, where=False)
      for event in ("closed", "delivery")),
)


def _one(conn: sqlite3.Connection, sql: str, params: dict[str, Any]) -> bool:
    """Run one guarded INSERT or UPDATE of one task; whether it wrote its row (the count of
    rows the statement itself changed, a trigger's writes not counted; no ``RETURNING``,
    which makes SQLite collect the rows in a temporary table first)."""
    return conn.execute(sql, params).rowcount == 1


def _insert_new(conn: sqlite3.Connection, sql: str, params: dict[str, Any], events: int) -> bool:
    """Run an ``INSERT OR IGNORE`` of one task whose triggers write ``events`` events: whether
    it wrote its row. A row written without all its events is a write the database rejected
    (as the insert without OR IGNORE would have failed): the caller's transaction is undone."""
    before = conn.total_changes
    if conn.execute(sql, params).rowcount != 1:
        return False
    if conn.total_changes - before != 1 + events:
        raise StorageError("the database rejected the write", reason=r.WRITE_REJECTED)
    return True


def _start(now: float, task_id: str, owner: str | None,
           redelivery: float | None) -> dict[str, Any]:
    return {"now": now, "id": task_id, "owner": owner, "redelivery": redelivery,
            "fmax": FLOAT_MAX}


def sqlite_begin(conn: sqlite3.Connection, spec: Begin, now: float) -> str | None:
    """Run *begin attempt* inside the caller's write transaction: the attempt's id, or None
    when no attempt could be started here (the caller explains)."""
    lid, name, timeout = spec.logical_id, spec.name, spec.timeout_seconds
    try:
        owner, redelivery = spec.owner, spec.redelivery_seconds
        parent = spec.parent_id
        opened = spec.open_logical and _insert_new(
            conn, _INSERT_LOGICAL[parent is not None, spec.thread_id is not None],
            {"now": now, "id": lid, "parent": parent, "name": name,
             "required": int(spec.delivery_required), "owner": spec.logical_owner,
             "fid": spec.framework_id, "framework": spec.framework,
             "thread": spec.thread_id}, 2)
        if spec.open_logical and not opened:
            if not spec.attempt:  # recorded earlier: the ledger runs the steps and explains
                return None
            # A logical task recorded earlier is started if still queued (else left as it is).
            _one(conn, _START, _start(now, lid, spec.logical_owner, None))
        if not spec.attempt:
            return lid if spec.open_logical else None
        fits = timeout is None or timeout <= FLOAT_MAX - now  # a finite deadline
        insert = _INSERT_ATTEMPT[opened and fits, timeout is not None, redelivery is not None]
        for candidate, create in spec.candidates:
            if create:
                started = _insert_new(conn, insert, _attempt(
                    now, candidate, lid, name, timeout, owner, redelivery), 2)
                # A placeholder recorded earlier is claimed if it is the one this would record.
                started = started or _one(conn, _START_SAME, {
                    **_start(now, candidate, owner, redelivery),
                    "parent": lid, "name": name, "timeout": timeout})
            else:
                started = _one(conn, _START, _start(now, candidate, owner, redelivery))
            if started:
                return candidate
        fresh = spec.attempt_id
        if not _insert_new(conn, insert, _attempt(now, fresh, lid, name, timeout, owner,
                                                  redelivery), 2):
            return None
        return fresh
    except sqlite3.Error as exc:
        raise connections.translate(exc) from None


def _attempt(now: float, task_id: str, parent: str, name: str | None, timeout: float | None,
             owner: str | None, redelivery: float | None) -> dict[str, Any]:
    """The parameters of an :data:`_INSERT_ATTEMPT` (a shape binds only those it names)."""
    return {"now": now, "id": task_id, "parent": parent, "name": name, "timeout": timeout,
            "owner": owner, "redelivery": redelivery, "fmax": FLOAT_MAX}


def sqlite_boundary(conn: sqlite3.Connection, spec: Boundary,
                    now: float) -> tuple[Ended, str | None]:
    """Run a :class:`~task_state_guard.store.attempts.Boundary` inside the caller's write
    transaction: the end, then the begin under a savepoint (a refused begin leaves nothing).
    A begin that is one INSERT (a fresh attempt under a logical task that exists) needs no
    savepoint: refused, it wrote nothing."""
    ended = sqlite_end(conn, spec.end, now)
    begin = spec.begin
    if not begin.open_logical and not begin.candidates:
        return ended, sqlite_begin(conn, begin, now)
    try:
        conn.execute("SAVEPOINT tsg_boundary")
        begun = sqlite_begin(conn, spec.begin, now)
        if begun is None:
            conn.execute("ROLLBACK TO tsg_boundary")
        conn.execute("RELEASE tsg_boundary")
    except sqlite3.Error as exc:
        raise connections.translate(exc) from None
    return ended, begun


def sqlite_end(conn: sqlite3.Connection, spec: End, now: float) -> Ended:
    """Run *end attempt* inside the caller's write transaction."""
    queued: set[str] = set()
    closed: set[str] = set()
    marked: set[str] = set()
    try:
        final = {c[0]: c for c in spec.closes if c[3] is None} if spec.queue else {}
        if final and all(q[0] in final for q in spec.queue):
            closed.update(_insert_closed(conn, spec.queue, final, now))
            queued.update(closed)
        else:
            for attempt, parent, name, timeout in spec.queue:
                if _insert_new(conn, _INSERT_QUEUED, {"now": now, "id": attempt,
                                                      "parent": parent, "name": name,
                                                      "timeout": timeout}, 1):
                    queued.add(attempt)
        if_queued = spec.if_queued
        for task_id, status, code, mark in spec.closes:
            if task_id in closed:
                continue
            only = task_id in if_queued
            if mark is None:
                done = _one(conn, _CLOSE[only], {"now": now, "id": task_id,
                                                   "status": status, "code": code})
            else:
                done = _one(conn, _CLOSE_MARKED[only], {
                    "now": now, "id": task_id, "status": status, "code": code,
                    "mstate": mark[0], "mcode": mark[1]})
            if done:
                closed.add(task_id)
                if mark is not None:
                    marked.add(task_id)
    except sqlite3.Error as exc:
        raise connections.translate(exc) from None
    return Ended(frozenset(closed), frozenset(marked), frozenset(queued))


def _insert_closed(
    conn: sqlite3.Connection,
    queue: tuple[tuple[str, str, str | None, float | None], ...],
    final: dict[str, tuple[str, str, str | None, tuple[str, str | None] | None]],
    now: float,
) -> set[str]:
    """Insert every attempt of ``queue`` (each closed by ``final``, its close) as its final
    row, in order (a parent before its children), with its events and outcome totals; the ids
    inserted (an id recorded already, or under a parent that is not, is left to the close)."""
    mark = conn.execute(_LAST_SEQ).fetchone()[0]
    before = conn.total_changes
    inserted = conn.executemany(_INSERT_CLOSED, [
        {"now": now, "id": attempt, "parent": parent, "name": name, "timeout": timeout,
         "status": final[attempt][1], "code": final[attempt][2]}
        for attempt, parent, name, timeout in queue
    ]).rowcount
    if conn.total_changes - before != 2 * inserted:  # a row without its created event
        raise StorageError("the database rejected the write", reason=r.WRITE_REJECTED)
    if not inserted:
        return set()
    params = {"mark": mark}
    for statement in _CLOSED_WRITES:
        conn.execute(statement, params)
    if inserted == len(queue):
        return {q[0] for q in queue}
    return {row[0] for row in conn.execute(_CLOSED_IDS, params)}


__all__ = ["sqlite_begin", "sqlite_boundary", "sqlite_end"]
