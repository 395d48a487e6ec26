"""SQLite's answers to the aggregates' reads and passes' writes (``queries``), in SQLite's SQL.

In-process statements cost no round trip: status streams the rows and counts them in Python
(SQLite's GROUP BY would sort every row, spilling on large ledgers) and reads each at-risk
figure through the open-work index; the history streams the few recent closes; a pass's writes
run one statement per row, the schema's triggers writing their events and totals. A write
transaction holds the whole database, so a pass's rows need no lock of their own. Lists of
values go as one ``?`` each (the callers bound their length).
"""

from __future__ import annotations

import math
import sqlite3
from collections import Counter
from typing import Any

from .. import rules
from ..model import ATTEMPT_SQL, LOST_CODES
from ..store.queries import (
    AT_RISK,
    FIND_IDLE_SINCE,
    FIND_IDLE_SINCE_CLOSED,
    LIST_ATTEMPTS,
    LIST_ORDERS,
    OPEN_BATCH,
    OPEN_WORK,
    PRUNABLE,
    ROOT_CLOSES,
    STATUS_KEY,
    FindQuery,
    GroupKey,
    StatusGroups,
    TaskQuery,
    add_group,
    render,
)
from ..store.transitions import TASK_COLUMNS


def _mark(name: str) -> str:
    return f":{name}"  # SQLite's named parameters


_GROUP_ROWS = f"SELECT {STATUS_KEY} FROM tsg_tasks"
_AT_RISK = {
    name: render(f"SELECT {agg}({column}) FROM tsg_tasks WHERE {OPEN_WORK} AND {cond}",
                 _mark, "now", "stale_before")
    for name, (agg, column, cond) in AT_RISK.items()}
_CLOSES = render(f"SELECT ended_at, status, terminal_code {ROOT_CLOSES}", _mark, "start", "end")
_OPEN_BATCH = render(OPEN_BATCH, _mark, "before", "limit")
# The schema's triggers write the matching events, totals and verdicts.
TIME_OUT = (
    "UPDATE tsg_tasks SET status = 'timed_out', terminal_code = ?, ended_at = ?, updated_at = ?, "
    "version = version + 1 WHERE seq = ?"
)
CLOSE_DELIVERY = (
    "UPDATE tsg_tasks SET delivery_status = ?, delivery_code = ?, delivery_updated_at = ?, "
    "version = version + 1 WHERE seq = ?"
)
_COUNT_OPEN = f"SELECT count(*) FROM tsg_tasks WHERE {OPEN_WORK}"
# A lost attempt's broker may still redeliver the job while this is true (``?``: the cutoff).
_REDELIVERY_OPEN = (f"(redelivery_seconds IS NOT NULL AND {rules.RUNNING_IDLE_SINCE_SQL} "
                    "+ redelivery_seconds > ?)")
_ACTIVE_CHILDREN = (
    f"SELECT parent_id, seq, status, {_REDELIVERY_OPEN} FROM tsg_tasks "
    "WHERE parent_id IN ({marks}) AND (status IN ('queued','running') "
    f"OR (status = 'timed_out' AND terminal_code IN {rules.sql_set(LOST_CODES)} "
    f"AND {_REDELIVERY_OPEN}))"
)
# An older layout (read in place by a read-only open) records no redelivery windows.
_ACTIVE_CHILDREN_OLD = (
    "SELECT parent_id, seq, status, 0 FROM tsg_tasks "
    "WHERE parent_id IN ({marks}) AND status IN ('queued','running')"
)
_RUNS_FOR_OWNER = (
    "SELECT 1 FROM tsg_tasks WHERE delivery_status = 'pending' AND status = 'running' "
    "AND owner = ? LIMIT 1"
)
_OWNERS = (
    "SELECT owner, count(*) FROM tsg_tasks WHERE delivery_status = 'pending' "
    "AND status = 'running' AND owner IS NOT NULL GROUP BY owner"
)
_TOTALS = "SELECT event, kind, state, code, total FROM tsg_totals"
_TASK_SEQ = "SELECT seq FROM tsg_tasks WHERE id = ?"
_EVENTS = "SELECT step, kind, state, code, at FROM tsg_events WHERE task_seq = ? ORDER BY step"
_TASK = f"SELECT {TASK_COLUMNS} FROM tsg_tasks WHERE id = ?"
_EXISTS = "SELECT 1 FROM tsg_tasks WHERE id = ?"
_CHILDREN = f"SELECT {TASK_COLUMNS} FROM tsg_tasks WHERE parent_id = ? ORDER BY seq"
_COUNT_PRUNABLE = "SELECT count(*) FROM tsg_tasks WHERE " + render(PRUNABLE, _mark, "cutoff")
_PRUNABLE_ROOTS = (
    "SELECT seq, delivery_updated_at FROM tsg_tasks WHERE " + render(PRUNABLE, _mark, "cutoff")
    + " AND (delivery_updated_at, seq) > (:updated, :seq) "
    "ORDER BY delivery_updated_at, seq LIMIT :limit"
)
# A task whose lost verdict no adapter has published yet (current layout only).
_OWED = "(SELECT count(*) FROM tsg_verdicts v WHERE v.task_seq = t.seq AND v.state = 'pending')"
_TREES = (
    "WITH RECURSIVE tree(root, seq, id) AS ("
    " SELECT seq, seq, id FROM tsg_tasks WHERE seq IN ({marks})"
    " UNION ALL SELECT tree.root, c.seq, c.id FROM tsg_tasks c"
    " JOIN tree ON c.parent_id = tree.id)"
    " SELECT tree.root, t.seq, t.status, t.delivery_status,"
    " CASE WHEN t.updated_at > t.delivery_updated_at THEN t.updated_at"
    " ELSE t.delivery_updated_at END,"
    " (SELECT count(*) FROM tsg_events e WHERE e.task_seq = t.seq),"
    " {owed}"
    " FROM tree JOIN tsg_tasks t ON t.seq = tree.seq"
)
_DELETES = (
    "DELETE FROM tsg_events WHERE task_seq = ?",
    # their published verdicts go with them (a pending one kept its tree)
    "DELETE FROM tsg_verdicts WHERE task_seq = ?",
    "DELETE FROM tsg_tasks WHERE seq = ?",
)
_PENDING_FREE = (
    "framework = ? AND state = 'pending' AND (lease_until IS NULL OR lease_until <= ?)"
)
_ANY_CLAIMABLE = f"SELECT 1 FROM tsg_verdicts WHERE {_PENDING_FREE} LIMIT 1"
_OF_TASKS = "task_seq IN (SELECT seq FROM tsg_tasks WHERE id IN ({marks}))"
_CLAIM = (
    "UPDATE tsg_verdicts SET lease_until = ?, claim = ? WHERE task_seq IN ("
    f"SELECT task_seq FROM tsg_verdicts WHERE {_PENDING_FREE}{{only}} "
    "ORDER BY task_seq LIMIT ?) RETURNING task_seq"
)
_CLAIMED = (
    "SELECT t.id, t.framework_id, t.name, t.terminal_code, v.framework, v.recorded_at "
    "FROM tsg_verdicts v JOIN tsg_tasks t ON t.seq = v.task_seq "
    "WHERE v.task_seq IN ({marks}) ORDER BY v.task_seq"
)
_PUBLISH = (
    "UPDATE tsg_verdicts SET state = 'published', published_at = ?, lease_until = NULL, "
    f"claim = NULL WHERE state = 'pending' AND {_OF_TASKS} RETURNING task_seq"
)
_RELEASE = (
    "UPDATE tsg_verdicts SET lease_until = NULL, claim = NULL WHERE state = 'pending' "
    f"AND claim = ? AND {_OF_TASKS} RETURNING task_seq"
)
_VERDICT_COUNTS = (
    "SELECT framework, state, count(*), min(recorded_at) FROM tsg_verdicts GROUP BY 1, 2"
)


def _marks(count: int) -> str:
    return ",".join("?" * count)


def _listing(columns: str, query: TaskQuery) -> tuple[str, list[Any]]:
    """The listing's statement and its values (see :class:`TaskQuery`)."""
    clauses = [ATTEMPT_SQL if query.attempts else f"NOT {ATTEMPT_SQL}"]
    params: list[Any] = []
    if query.job is not None:  # one job: the task itself, or its attempts
        clauses.append("parent_id = ?" if query.attempts else "id = ?")
        params.append(query.job)
    if query.open_only:
        clauses.append("delivery_status = 'pending'")  # the open-work index
    if query.status is not None:
        clauses.append("status = ?")
        params.append(query.status)
    elif query.active_only:
        clauses.append("status IN ('queued','running')")
    if query.name is not None:
        clauses.append("name = ?")
        params.append(query.name)
    if query.idle_before is not None:
        clauses.append(f"{rules.IDLE_SINCE_SQL} <= ?")
        params.append(query.idle_before)
    if query.created_before is not None:
        clauses.append("created_at <= ?")
        params.append(query.created_before)
    key = LIST_ORDERS[query.order]
    direction, beyond = ("DESC", "<") if query.descending else ("ASC", ">")
    if query.after is not None:
        clauses.append(f"({key} {beyond} ? OR ({key} = ? AND seq {beyond} ?))")
        params += [query.after[0], query.after[0], query.after[1]]
    ordering = f"seq {direction}" if query.order == "created" else (
        f"{key} {direction}, seq {direction}")
    sql = (
        f"SELECT {columns}, {LIST_ATTEMPTS}, {rules.IDLE_SINCE_SQL}, {key}, seq FROM tsg_tasks "
        f"WHERE {' AND '.join(clauses)} ORDER BY {ordering} LIMIT ?"
    )
    return sql, [*params, query.limit]


def _finding(query: FindQuery) -> tuple[str, list[Any]]:
    """The statement and values of a :class:`FindQuery`."""
    sql = "SELECT id FROM tsg_tasks WHERE " + (
        "delivery_status = 'pending' AND status = ?" if query.open_only else "status = ?")
    params: list[Any] = [query.status]
    if query.idle_before is not None:
        since = FIND_IDLE_SINCE.get(query.status, FIND_IDLE_SINCE_CLOSED)
        sql += f" AND {since} <= ?"
        params.append(query.idle_before)
    if query.name is not None:
        sql += " AND name = ?"
        params.append(query.name)
    if query.created_before is not None:
        sql += " AND created_at <= ?"
        params.append(query.created_before)
    if query.job is not None:
        sql += " AND (id = ? OR parent_id = ?)"
        params += [query.job, query.job]
    sql += " ORDER BY seq"
    if query.limit is not None:
        sql += " LIMIT ?"
        params.append(query.limit)
    return sql, params


class SQLiteQueries:
    """The SQLite backend's :class:`~task_state_guard.store.queries.Queries`."""

    @staticmethod
    def status_groups(conn: sqlite3.Connection, now: float, stale_before: float,
                      bound: int) -> StatusGroups:
        counts: Counter[GroupKey] = Counter()
        cursor = conn.execute(_GROUP_ROWS)
        while rows := cursor.fetchmany(4096):
            if len(counts) < bound:
                counts.update(rows)
            else:
                for row in rows:
                    add_group(counts, row, 1, bound)
        params = {"now": now, "stale_before": stale_before}
        found = {name: conn.execute(sql, params).fetchone()[0] for name, sql in _AT_RISK.items()}
        least = {name: found[name] for name in ("queued", "running", "owed")}
        return StatusGroups(counts, least, int(found["past_deadline"]), int(found["stale"]))

    @staticmethod
    def root_closes(conn: sqlite3.Connection, start: float, width: float,
                    end: float) -> list[tuple[Any, Any, Any, int]]:
        counts: Counter[tuple[Any, Any, Any]] = Counter()
        cursor = conn.execute(_CLOSES, {"start": start, "end": end})
        while batch := cursor.fetchmany(4096):
            for ended, status, code in batch:
                if isinstance(ended, int | float) and math.isfinite(ended):
                    counts[(int((ended - start) / width), status, code)] += 1
        return [(*key, count) for key, count in counts.items()]

    @staticmethod
    def open_batch(conn: sqlite3.Connection, before_seq: int, limit: int,
                   hold: bool) -> list[tuple[Any, ...]]:
        return conn.execute(_OPEN_BATCH, {"before": before_seq, "limit": limit}).fetchall()

    @staticmethod
    def close_lost(conn: sqlite3.Connection, timeouts: list[tuple[str, float, int]],
                   deliveries: list[tuple[str, str, float, int]]) -> None:
        if timeouts:
            conn.executemany(TIME_OUT, [(code, at, at, seq) for code, at, seq in timeouts])
        if deliveries:
            conn.executemany(CLOSE_DELIVERY, deliveries)

    @staticmethod
    def count_open(conn: sqlite3.Connection) -> int:
        return int(conn.execute(_COUNT_OPEN).fetchone()[0])

    @staticmethod
    def active_children(conn: sqlite3.Connection, parent_ids: list[str],
                        cutoff: float | None) -> list[tuple[Any, Any, Any, Any]]:
        marks = _marks(len(parent_ids))
        if cutoff is None:
            return conn.execute(_ACTIVE_CHILDREN_OLD.format(marks=marks), parent_ids).fetchall()
        return conn.execute(_ACTIVE_CHILDREN.format(marks=marks),
                            [cutoff, *parent_ids, cutoff]).fetchall()

    @staticmethod
    def runs_for_owner(conn: sqlite3.Connection, token: str) -> bool:
        return conn.execute(_RUNS_FOR_OWNER, (token,)).fetchone() is not None

    @staticmethod
    def open_running_owners(conn: sqlite3.Connection) -> list[tuple[Any, int]]:
        return conn.execute(_OWNERS).fetchall()

    @staticmethod
    def totals(conn: sqlite3.Connection) -> list[tuple[Any, Any, Any, Any, Any]]:
        return conn.execute(_TOTALS).fetchall()

    @staticmethod
    def task_events(conn: sqlite3.Connection, task_id: str) -> list[tuple[Any, ...]] | None:
        found = conn.execute(_TASK_SEQ, (task_id,)).fetchone()
        if found is None:
            return None
        return conn.execute(_EVENTS, (found[0],)).fetchall()

    @staticmethod
    def list_tasks(conn: sqlite3.Connection, columns: str,
                   query: TaskQuery) -> list[tuple[Any, ...]]:
        return conn.execute(*_listing(columns, query)).fetchall()

    @staticmethod
    def task(conn: sqlite3.Connection, task_id: str) -> tuple[Any, ...] | None:
        row: tuple[Any, ...] | None = conn.execute(_TASK, (task_id,)).fetchone()
        return row

    @staticmethod
    def children(conn: sqlite3.Connection, task_id: str,
                 limit: int | None) -> list[tuple[Any, ...]] | None:
        if conn.execute(_EXISTS, (task_id,)).fetchone() is None:
            return None
        if limit is None:
            return conn.execute(_CHILDREN, (task_id,)).fetchall()
        return conn.execute(_CHILDREN + " LIMIT ?", (task_id, limit)).fetchall()

    @staticmethod
    def find_ids(conn: sqlite3.Connection, query: FindQuery) -> list[Any]:
        return [row[0] for row in conn.execute(*_finding(query))]

    @staticmethod
    def count_prunable(conn: sqlite3.Connection, cutoff: float) -> int:
        return int(conn.execute(_COUNT_PRUNABLE, {"cutoff": cutoff}).fetchone()[0])

    @staticmethod
    def prunable_roots(conn: sqlite3.Connection, cutoff: float, after: tuple[float, int],
                       limit: int) -> list[tuple[Any, Any]]:
        params = {"cutoff": cutoff, "updated": after[0], "seq": after[1], "limit": limit}
        return conn.execute(_PRUNABLE_ROOTS, params).fetchall()

    @staticmethod
    def trees(conn: sqlite3.Connection, roots: list[int],
              outbox: bool) -> list[tuple[Any, Any, Any, Any, Any, Any, Any]]:
        sql = _TREES.format(marks=_marks(len(roots)), owed=_OWED if outbox else "0")
        return conn.execute(sql, roots).fetchall()

    @staticmethod
    def hold_for_delete(conn: sqlite3.Connection, seqs: list[int]) -> set[int] | None:
        return None  # a write transaction already holds the whole database

    @staticmethod
    def delete_tasks(conn: sqlite3.Connection, seqs: list[int]) -> None:
        keys = [(seq,) for seq in seqs]
        for statement in _DELETES:
            conn.executemany(statement, keys)

    @staticmethod
    def any_claimable(conn: sqlite3.Connection, framework: str, now: float) -> bool:
        return conn.execute(_ANY_CLAIMABLE, (framework, now)).fetchone() is not None

    @staticmethod
    def claim_verdicts(conn: sqlite3.Connection, framework: str, now: float, until: float,
                       token: str, task_ids: list[str] | None, limit: int) -> list[int]:
        only = "" if task_ids is None else " AND " + _OF_TASKS.format(
            marks=_marks(len(task_ids)))
        params = [until, token, framework, now, *(task_ids or []), limit]
        return [row[0] for row in conn.execute(_CLAIM.format(only=only), params).fetchall()]

    @staticmethod
    def claimed(conn: sqlite3.Connection, seqs: list[int]) -> list[tuple[Any, ...]]:
        return conn.execute(_CLAIMED.format(marks=_marks(len(seqs))), seqs).fetchall()

    @staticmethod
    def publish_verdicts(conn: sqlite3.Connection, now: float, task_ids: list[str]) -> int:
        sql = _PUBLISH.format(marks=_marks(len(task_ids)))
        return len(conn.execute(sql, [now, *task_ids]).fetchall())

    @staticmethod
    def release_verdicts(conn: sqlite3.Connection, token: str, task_ids: list[str]) -> int:
        sql = _RELEASE.format(marks=_marks(len(task_ids)))
        return len(conn.execute(sql, [token, *task_ids]).fetchall())

    @staticmethod
    def verdict_counts(conn: sqlite3.Connection) -> list[tuple[Any, Any, Any, Any]]:
        return conn.execute(_VERDICT_COUNTS).fetchall()


__all__ = ["CLOSE_DELIVERY", "TIME_OUT", "SQLiteQueries"]
