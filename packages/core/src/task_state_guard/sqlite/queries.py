"""SQLite's answers to the aggregates' reads and passes' writes (``queries``), in SQLite's SQL.

In-process statements cost no round trip: status streams the rows and counts them in Python
(SQLite's GROUP BY would sort every row, spilling on large ledgers) and reads each at-risk
figure through the open-work index; the history streams the few recent closes; a pass's writes
run one statement per row, the schema's triggers writing their events and totals. A write
transaction holds the whole database, so a pass's rows need no lock of their own. The
statements both backends run come from ``store.queries.statements`` in SQLite's placeholders;
a list of values goes as one named parameter each (the callers bound their length).
"""

from __future__ import annotations

import math
import sqlite3
from collections import Counter
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from ..store.queries import (
    AT_RISK,
    COUNT_OPEN,
    LEAST,
    OPEN_BATCH,
    OPEN_RUNNING_OWNERS,
    OPEN_WORK,
    ROOT_CLOSES,
    STATUS_KEY,
    TOTALS,
    VERDICT_COUNTS,
    Dialect,
    FindQuery,
    GroupKey,
    StatusGroups,
    TaskQuery,
    add_group,
    finding,
    listing,
    render,
    statements,
)
from .transitions import mark


def _among(column: str, name: str, kind: str) -> str:
    # A list's slot, filled with one named parameter a value when the statement runs (_list).
    return f"{column} IN ({{{name}}})"


_DIALECT = Dialect(mark, _among)
_SQL = statements(_DIALECT)
_GROUP_ROWS = f"SELECT {STATUS_KEY} FROM tsg_tasks"
_AT_RISK = {
    name: render(f"SELECT {agg}({column}) FROM tsg_tasks WHERE {OPEN_WORK} AND {cond}",
                 mark, "now", "stale_before")
    for name, (agg, column, cond) in AT_RISK.items()}
_CLOSES = render(f"SELECT ended_at, status, terminal_code {ROOT_CLOSES}", mark, "start", "end")
_OPEN_BATCH = render(OPEN_BATCH, mark, "before", "limit")
# The schema's triggers write the matching events, totals and verdicts.
TIME_OUT = (
    "UPDATE tsg_tasks SET status = 'timed_out', terminal_code = ?, ended_at = ?, updated_at = ?, "
    "version = version + 1 WHERE seq = ?"
)
CLOSE_DELIVERY = (
    "UPDATE tsg_tasks SET delivery_status = ?, delivery_code = ?, delivery_updated_at = ?, "
    "version = version + 1 WHERE seq = ?"
)
_TASK_SEQ = "SELECT seq FROM tsg_tasks WHERE id = ?"
_EVENTS = "SELECT step, kind, state, code, at FROM tsg_events WHERE task_seq = ? ORDER BY step"
_DELETES = (
    "DELETE FROM tsg_events WHERE task_seq = ?",
    # their published verdicts go with them (a pending one kept its tree)
    "DELETE FROM tsg_verdicts WHERE task_seq = ?",
    "DELETE FROM tsg_tasks WHERE seq = ?",
)


def _list(sql: str, params: dict[str, Any], name: str, values: list[Any]) -> str:
    """Fill the slot of the list ``name`` in ``sql`` with one named parameter a value (added
    to ``params``)."""
    keys = [f"{name}_{i}" for i in range(len(values))]
    params.update(zip(keys, values, strict=True))
    return sql.format(**{name: ",".join(mark(key) for key in keys)})


class SQLiteQueries:
    """The SQLite backend's :class:`~task_state_guard.store.queries.Queries`; ``read`` opens
    the database object's read transaction (a read of one task runs in one of its own)."""

    def __init__(self, read: Callable[[], AbstractContextManager[sqlite3.Connection]]) -> None:
        self._read = read

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
        least = {name: found[name] for name in LEAST}
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
    def open_batch(conn: sqlite3.Connection, before_seq: int,
                   limit: int) -> list[tuple[Any, ...]]:
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
        return int(conn.execute(COUNT_OPEN).fetchone()[0])

    @staticmethod
    def active_children(conn: sqlite3.Connection, parent_ids: list[str],
                        cutoff: float | None) -> list[tuple[Any, Any, Any, Any]]:
        params: dict[str, Any] = {"cutoff": cutoff}
        sql = _SQL["active_children_old" if cutoff is None else "active_children"]
        return conn.execute(_list(sql, params, "parents", parent_ids), params).fetchall()

    def runs_for_owner(self, token: str) -> bool:
        with self._read() as conn:
            return conn.execute(_SQL["runs_for_owner"], {"owner": token}).fetchone() is not None

    @staticmethod
    def open_running_owners(conn: sqlite3.Connection) -> list[tuple[Any, int]]:
        return conn.execute(OPEN_RUNNING_OWNERS).fetchall()

    @staticmethod
    def totals(conn: sqlite3.Connection) -> list[tuple[Any, Any, Any, Any, Any]]:
        return conn.execute(TOTALS).fetchall()

    def task_events(self, task_id: str) -> list[tuple[Any, ...]] | None:
        with self._read() as conn:
            found = conn.execute(_TASK_SEQ, (task_id,)).fetchone()
            if found is None:
                return None
            return conn.execute(_EVENTS, (found[0],)).fetchall()

    @staticmethod
    def list_tasks(conn: sqlite3.Connection, columns: str,
                   query: TaskQuery) -> list[tuple[Any, ...]]:
        return conn.execute(*listing(_DIALECT, columns, query)).fetchall()

    def task(self, task_id: str) -> tuple[Any, ...] | None:
        with self._read() as conn:
            row: tuple[Any, ...] | None = conn.execute(_SQL["task"], {"id": task_id}).fetchone()
        return row

    def children(self, task_id: str, limit: int | None) -> list[tuple[Any, ...]] | None:
        with self._read() as conn:
            if conn.execute(_SQL["exists"], {"id": task_id}).fetchone() is None:
                return None
            if limit is None:
                return conn.execute(_SQL["children"], {"id": task_id}).fetchall()
            params = {"id": task_id, "limit": limit}
            return conn.execute(_SQL["children_limit"], params).fetchall()

    @staticmethod
    def find_ids(conn: sqlite3.Connection, query: FindQuery) -> list[Any]:
        return [row[0] for row in conn.execute(*finding(_DIALECT, query))]

    @staticmethod
    def count_prunable(conn: sqlite3.Connection, cutoff: float) -> int:
        return int(conn.execute(_SQL["count_prunable"], {"cutoff": cutoff}).fetchone()[0])

    @staticmethod
    def prunable_roots(conn: sqlite3.Connection, cutoff: float, after: tuple[float, int],
                       limit: int) -> list[tuple[Any, Any]]:
        params = {"cutoff": cutoff, "updated": after[0], "seq": after[1], "limit": limit}
        return conn.execute(_SQL["prunable_roots"], params).fetchall()

    @staticmethod
    def trees(conn: sqlite3.Connection, roots: list[int],
              outbox: bool) -> list[tuple[Any, Any, Any, Any, Any, Any, Any]]:
        params: dict[str, Any] = {}
        sql = _list(_SQL["trees" if outbox else "trees_old"], params, "seqs", roots)
        return conn.execute(sql, params).fetchall()

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
        params = {"framework": framework, "now": now}
        return conn.execute(_SQL["any_claimable"], params).fetchone() is not None

    @staticmethod
    def claim_verdicts(conn: sqlite3.Connection, framework: str, now: float, until: float,
                       token: str, task_ids: list[str] | None, limit: int) -> list[int]:
        params: dict[str, Any] = {"until": until, "token": token, "framework": framework,
                                  "now": now, "limit": limit}
        sql = _SQL["claim"] if task_ids is None else _list(
            _SQL["claim_only"], params, "ids", task_ids)
        return [row[0] for row in conn.execute(sql, params).fetchall()]

    @staticmethod
    def claimed(conn: sqlite3.Connection, seqs: list[int], threads: bool) -> list[tuple[Any, ...]]:
        params: dict[str, Any] = {}
        sql = _SQL["claimed_threads" if threads else "claimed"]
        return conn.execute(_list(sql, params, "seqs", seqs), params).fetchall()

    @staticmethod
    def publish_verdicts(conn: sqlite3.Connection, now: float, task_ids: list[str]) -> int:
        params: dict[str, Any] = {"now": now}
        sql = _list(_SQL["publish"], params, "ids", task_ids)
        return len(conn.execute(sql, params).fetchall())

    @staticmethod
    def release_verdicts(conn: sqlite3.Connection, token: str, task_ids: list[str]) -> int:
        params: dict[str, Any] = {"token": token}
        sql = _list(_SQL["release"], params, "ids", task_ids)
        return len(conn.execute(sql, params).fetchall())

    @staticmethod
    def verdict_counts(conn: sqlite3.Connection) -> list[tuple[Any, Any, Any, Any]]:
        return conn.execute(VERDICT_COUNTS).fetchall()


__all__ = ["CLOSE_DELIVERY", "TIME_OUT", "SQLiteQueries"]
