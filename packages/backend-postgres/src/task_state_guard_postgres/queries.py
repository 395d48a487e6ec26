"""PostgreSQL's answers to the aggregates' reads and a reconcile pass's writes (``queries``).

The server groups: status reads one row per group with the at-risk figures as filtered
aggregates (``queries.AT_RISK``), the history one row per bucket. A pass holds the open rows it
reads until it commits (without blocking foreign-key checks) and skips a row a worker's
transaction holds at that moment (that work is being changed right now; the next pass judges
it): a pass never waits for a worker, so a worker's transaction and a pass can never deadlock.
A pass's closes go as one set-based statement per distinct set of values, which writes the
rows' events, totals and verdicts itself (the rules), instead of a statement and a trigger call
per row.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from task_state_guard import rules
from task_state_guard.model import LOST_CODES, TASK_KIND_SQL
from task_state_guard.queries import (
    AT_RISK,
    OPEN_BATCH,
    OPEN_WORK,
    ROOT_CLOSES,
    STATUS_KEY,
    GroupKey,
    StatusGroups,
    add_group,
    before,
    render,
)

from . import ddl
from .driver import Conn

PASS_KIND = "tsg-pass"
#: Rows a pass reads stay its own until it commits; rows a worker holds now are skipped.
HOLD = " FOR NO KEY UPDATE SKIP LOCKED"


def _mark(name: str) -> str:
    return f"%({name})s"  # psycopg's named parameters


_STATUS_GROUPS = render(
    f"SELECT {STATUS_KEY}, count(*), "
    + ", ".join(f"{agg}({column}) FILTER (WHERE {OPEN_WORK} AND {cond})"
                for agg, column, cond in AT_RISK.values())
    + " FROM tsg_tasks GROUP BY 1, 2, 3, 4, 5", _mark, "now", "stale_before")
_ROOT_CLOSES = render(
    "SELECT floor((ended_at - {start}) / {width}), status, terminal_code, count(*) "
    f"{ROOT_CLOSES} GROUP BY 1, 2, 3", _mark, "start", "width", "end")
_OPEN_BATCH = render(OPEN_BATCH, _mark, "before", "limit")
# Reconcile's per-row statements (last parameter: the row's seq) as one statement per batch
# and set of values, writing what the event trigger writes for the same rows (the trigger
# steps aside while ``ddl.PASS_EVENTS`` is on). The guards (still active / still pending)
# hold for every row a pass sends, since it holds them; they keep events exact regardless.
_TASKS_SEQ = "seq = ANY(%(seqs)s::bigint[])"
_DELIVERED = rules.EVENTS_BY_KIND["delivery"]
PASS_WRITES = {
    "time_out": (
        "WITH u AS (UPDATE tsg_tasks SET status = 'timed_out', terminal_code = %(code)s, "
        f"ended_at = %(at)s, updated_at = %(at)s, version = version + 1 WHERE {_TASKS_SEQ} "
        f"AND status IN {rules.ACTIVE_SQL} "
        "RETURNING seq, status, terminal_code, ended_at, parent_id, delivery_required, "
        "framework), "
        f"e AS ({rules.event_insert_select(rules.EVENTS_BY_KIND['closed'], 'u')}), "
        # the verdict each lost logical task owes its framework (as the row trigger writes it)
        "v AS (INSERT INTO tsg_verdicts(task_seq, framework, state, recorded_at) "
        "SELECT seq, framework, 'pending', ended_at FROM u WHERE framework IS NOT NULL "
        f"AND terminal_code IN {rules.sql_set(LOST_CODES)} ON CONFLICT (task_seq) DO NOTHING) "
        "INSERT INTO tsg_totals(event, kind, state, code, total) "
        f"SELECT 'closed', {TASK_KIND_SQL.format(row='')}, status, "
        "coalesce(terminal_code, ''), count(*) FROM u GROUP BY 2, 3, 4"
    ),
    "close_delivery": (
        "WITH u AS (UPDATE tsg_tasks SET delivery_status = %(state)s, delivery_code = %(code)s, "
        f"delivery_updated_at = %(at)s, version = version + 1 WHERE {_TASKS_SEQ} "
        "AND delivery_status = 'pending' "
        "RETURNING seq, delivery_status, delivery_code, delivery_updated_at, delivery_required), "
        f"c AS (SELECT * FROM u WHERE {_DELIVERED.present.sql()}), "
        f"e AS ({rules.event_insert_select(_DELIVERED, 'c')}) "
        "INSERT INTO tsg_totals(event, kind, state, code, total) "
        f"SELECT 'delivery', {rules.DELIVERY_KIND_SQL.format(row='')}, "
        "delivery_status, coalesce(delivery_code, ''), count(*) FROM c GROUP BY 2, 3, 4"
    ),
}
_PASS_EVENTS = f"SELECT set_config('{ddl.PASS_EVENTS}', %(on)s, true)"


class PostgresQueries:
    """The PostgreSQL backend's :class:`~task_state_guard.queries.Queries`."""

    claim_lock = HOLD

    @staticmethod
    def status_groups(conn: Conn, now: float, stale_before: float,
                      bound: int) -> StatusGroups:
        counts: Counter[GroupKey] = Counter()
        least: dict[str, Any] = dict.fromkeys(("queued", "running", "owed"))
        past_deadline = stale = 0
        cursor = conn.run(_STATUS_GROUPS, {"now": now, "stale_before": stale_before})
        while rows := cursor.fetchmany(4096):
            for status, delivery, name, root, owed, count, *risk in rows:
                add_group(counts, (status, delivery, name, bool(root), bool(owed)), count, bound)
                for what, value in zip(("queued", "running", "owed"), risk, strict=False):
                    if value is not None and (least[what] is None or before(value, least[what])):
                        least[what] = value
                past_deadline += risk[3]
                stale += risk[4]
        return StatusGroups(counts, least, past_deadline, stale)

    @staticmethod
    def root_closes(conn: Conn, start: float, width: float,
                    end: float) -> list[tuple[Any, Any, Any, int]]:
        params = {"start": start, "width": width, "end": end}
        return [tuple(row) for row in conn.run(_ROOT_CLOSES, params).fetchall()]

    @staticmethod
    def open_batch(conn: Conn, before_seq: int, limit: int,
                   hold: bool) -> list[tuple[Any, ...]]:
        sql = _OPEN_BATCH + HOLD if hold else _OPEN_BATCH
        params = {"before": before_seq, "limit": limit}
        return [tuple(row) for row in conn.run(sql, params).fetchall()]

    @staticmethod
    def close_lost(conn: Conn, timeouts: list[tuple[str, float, int]],
                   deliveries: list[tuple[str, str, float, int]]) -> None:
        closes: dict[tuple[str, float], list[int]] = {}
        settles: dict[tuple[str, str, float], list[int]] = {}
        for code, at, seq in timeouts:
            closes.setdefault((code, at), []).append(seq)
        for state, dcode, at, seq in deliveries:
            settles.setdefault((state, dcode, at), []).append(seq)
        conn.run(_PASS_EVENTS, {"on": "on"})
        for (code, at), seqs in closes.items():
            conn.run(PASS_WRITES["time_out"], {"code": code, "at": at, "seqs": seqs})
        for (state, dcode, at), seqs in settles.items():
            conn.run(PASS_WRITES["close_delivery"],
                     {"state": state, "code": dcode, "at": at, "seqs": seqs})
        conn.run(_PASS_EVENTS, {"on": "off"})  # a failure above aborts the transaction


__all__ = ["HOLD", "PASS_KIND", "PASS_WRITES", "PostgresQueries"]
