"""SQLite's answers to the aggregates' reads and passes' writes (``queries``), in SQLite's SQL.

In-process statements cost no round trip: status has SQLite count the groups one seq range
at a time (a whole-table GROUP BY would sort every row, spilling on large ledgers; a small
range's sort stays in cache), the overview's chart buckets counted as one more key of the same
statement, and reads the at-risk figures in one walk of the open-work index; the history alone
streams the window's closes; a pass's writes run one statement per row, the schema's
triggers writing their events and totals. A write
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

from ..model import TASK_CODES
from ..rules import DELIVERY_ORDER, TASK_ORDER
from ..store.queries import (
    AT_RISK,
    COUNT_OPEN,
    INVALID_LABEL,
    LEAST,
    OPEN_BATCH,
    OPEN_RUNNING_OWNERS,
    OPEN_WORK,
    ROOT_CLOSED_IN,
    ROOT_CLOSES,
    TOTALS,
    VERDICT_COUNTS,
    CloseWindow,
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


def _code(column: str, values: tuple[str, ...]) -> str:
    # A known value's position in ``values``; any other value (only tampering) is len(values).
    cases = " ".join(f"WHEN '{value}' THEN {n}" for n, value in enumerate(values))
    return f"(CASE {column} {cases} ELSE {len(values)} END)"


# STATUS_KEY with its four small columns packed in one integer (small integers cost Python no
# object a row, strings do): state, delivery state, is a root, owes its delivery.
_DELIVERY_SPAN = 2 * 2 * (len(DELIVERY_ORDER) + 1)
_GROUP_SELECT = (
    f"SELECT name, {_code('status', TASK_ORDER)} * {_DELIVERY_SPAN} + "
    f"{_code('delivery_status', DELIVERY_ORDER)} * 4 + (parent_id IS NULL) * 2 + "
    "(delivery_required IS 1)"
)
# One range of seq counted per group by SQLite: a range's sort is small and stays in cache,
# and Python sees one row a group and range, not one a task (a whole-table GROUP BY would
# sort every row at once). Ranges advance by seq (the table's own order), their width adapting
# to how densely the range before was filled.
_RANGE = "WHERE seq >= {low} AND seq < {high}"
_GROUP_ROWS = render(f"{_GROUP_SELECT}, NULL, count(*) FROM tsg_tasks {_RANGE} GROUP BY 1, 2",
                     mark, "low", "high")
# The same groups with a third key, for a root closed in the history's window: its bucket and
# its close's code packed in one integer (NULL for every other row).
_CLOSE_CODES = tuple(sorted(set().union(*TASK_CODES.values())))
_CODE_SPAN = len(_CLOSE_CODES) + 1
_GROUP_ROWS_CLOSES = render(
    f"{_GROUP_SELECT}, CASE WHEN {ROOT_CLOSED_IN} THEN CAST((ended_at - {{start}}) / {{width}} "
    f"AS INTEGER) * {_CODE_SPAN} + {_code('terminal_code', _CLOSE_CODES)} END, count(*) "
    f"FROM tsg_tasks {_RANGE} GROUP BY 1, 2, 3",
    mark, "start", "end", "width", "low", "high")
_SEQ_SPAN = "SELECT min(seq), max(seq) FROM tsg_tasks"
_RANGE_ROWS = 8192  # the rows a range aims at
# Every at-risk figure in one pass over the open work (one statement, not one each).
_AT_RISK = render(
    "SELECT " + ", ".join(
        f"{agg}(CASE WHEN {cond} THEN {'1' if column == '*' else column} END)"
        for agg, column, cond in AT_RISK.values())
    + f" FROM tsg_tasks WHERE {OPEN_WORK}", mark, "now", "stale_before")
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


def _count_groups(conn: sqlite3.Connection, sql: str, params: dict[str, Any],
                  bound: int) -> Counter[tuple[Any, int, Any]]:
    """The counts of ``sql``'s groups (a name, a packed group, a packed close) over every
    range of seq. Past ``bound`` (name, group) pairs, a new one has its name folded (as
    :func:`add_group` does), so the first ``bound`` groups met keep theirs."""
    packed: Counter[tuple[Any, int, Any]] = Counter()
    groups: set[tuple[Any, int]] = set()
    low, last = conn.execute(_SEQ_SPAN).fetchone()
    width = _RANGE_ROWS
    while low is not None and low <= last:
        found = 0
        for name, code, close, count in conn.execute(sql, {**params, "low": low,
                                                           "high": low + width}):
            found += count
            label = name
            if (name, code) not in groups and len(groups) >= bound:
                label = None if name is None else INVALID_LABEL
            else:
                groups.add((name, code))
            packed[(label, code, close)] += count
        low += width
        if found < _RANGE_ROWS // 2:  # sparse (pruned) seq: wider ranges
            width = min(width * 2, 1 << 40)
        elif found > _RANGE_ROWS * 2:
            width = max(width // 2, 1)
    return packed


def _known(values: tuple[str, ...], index: int) -> str | None:
    """The value at ``index`` of a packed code; None for a value no state has."""
    return values[index] if index < len(values) else None


class SQLiteQueries:
    """The SQLite backend's :class:`~task_state_guard.store.queries.Queries`; ``read`` opens
    the database object's read transaction (a read of one task runs in one of its own)."""

    def __init__(self, read: Callable[[], AbstractContextManager[sqlite3.Connection]]) -> None:
        self._read = read

    @staticmethod
    def status_groups(conn: sqlite3.Connection, now: float, stale_before: float, bound: int,
                      closes: CloseWindow | None = None) -> StatusGroups:
        params: dict[str, Any] = {}
        if closes is not None:
            params = {"start": closes.start, "width": closes.width, "end": closes.end}
        packed = _count_groups(conn, _GROUP_ROWS if closes is None else _GROUP_ROWS_CLOSES,
                               params, bound)
        counts: Counter[GroupKey] = Counter()
        closed: Counter[tuple[Any, Any, Any]] = Counter()
        for (name, code, close), count in packed.items():
            state, rest = divmod(code, _DELIVERY_SPAN)
            delivery, root_owed = divmod(rest, 4)
            status = _known(TASK_ORDER, state)
            key = (status, _known(DELIVERY_ORDER, delivery), name, root_owed >> 1, root_owed & 1)
            add_group(counts, key, count, bound)
            if close is not None:
                bucket, ended_code = divmod(close, _CODE_SPAN)
                closed[(bucket, status, _known(_CLOSE_CODES, ended_code))] += count
        params = {"now": now, "stale_before": stale_before}
        found = dict(zip(AT_RISK, conn.execute(_AT_RISK, params).fetchone(), strict=True))
        least = {name: found[name] for name in LEAST}
        return StatusGroups(counts, least, int(found["past_deadline"]), int(found["stale"]),
                            [(*key, count) for key, count in closed.items()])

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
    def hold_open(conn: sqlite3.Connection,
                  rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        return rows  # a write transaction keeps every other writer out: the rows read stand

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
    def hold_for_delete(conn: sqlite3.Connection,
                        seqs: list[int]) -> tuple[set[int], list[tuple[Any, Any]]] | None:
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
