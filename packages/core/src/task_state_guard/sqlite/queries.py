"""SQLite's answers to the aggregates' reads and a reconcile pass's writes (``queries``).

In-process statements cost no round trip: status streams the rows and counts them in Python
(SQLite's GROUP BY would sort every row, spilling on large ledgers) and reads each at-risk
figure through the open-work index; the history streams the few recent closes; a pass's writes
run one statement per row, the schema's triggers writing their events and totals. A write
transaction holds the whole database, so a pass's rows need no lock of their own.
"""

from __future__ import annotations

import math
import sqlite3
from collections import Counter
from typing import Any

from ..queries import (
    AT_RISK,
    OPEN_BATCH,
    OPEN_WORK,
    ROOT_CLOSES,
    STATUS_KEY,
    GroupKey,
    StatusGroups,
    add_group,
    render,
)


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


class SQLiteQueries:
    """The SQLite backend's :class:`~task_state_guard.queries.Queries`."""

    claim_lock = ""  # a write transaction already holds the whole database

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


__all__ = ["CLOSE_DELIVERY", "TIME_OUT", "SQLiteQueries"]
