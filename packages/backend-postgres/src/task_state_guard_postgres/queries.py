"""PostgreSQL's answers to the aggregates' reads and passes' writes (``queries``), in its SQL.

The server groups: status reads one row per group with the at-risk figures as filtered
aggregates (``queries.AT_RISK``), the history one row per bucket. A pass holds the open rows it
reads until it commits (without blocking foreign-key checks) and skips a row a worker's
transaction holds at that moment (that work is being changed right now; the next pass judges
it): a pass never waits for a worker, so a worker's transaction and a pass can never deadlock.
A pass's closes go as one set-based statement per distinct set of values, which writes the
rows' events, totals and verdicts itself (the rules), instead of a statement and a trigger call
per row. Statements are written with psycopg's named placeholders and run as written
(``Conn.run``); a list of values goes as one array parameter (``= ANY(...)``).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from task_state_guard import rules
from task_state_guard.model import ATTEMPT_SQL, LOST_CODES, TASK_KIND_SQL
from task_state_guard.store.queries import (
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
    before,
    render,
)
from task_state_guard.store.transitions import TASK_COLUMNS

from . import ddl
from .driver import Conn

PASS_KIND = "tsg-pass"
#: Rows a pass reads stay its own until it commits; rows a worker holds now are skipped.
HOLD = " FOR NO KEY UPDATE SKIP LOCKED"
#: Prune's rows: held against new children (a child's foreign-key check waits for it).
DELETE_HOLD = " FOR UPDATE SKIP LOCKED"
_HOLD_CHUNK = 1000  # rows held per statement


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
_COUNT_OPEN = f"SELECT count(*) FROM tsg_tasks WHERE {OPEN_WORK}"
# A lost attempt's broker may still redeliver the job while this is true.
_REDELIVERY_OPEN = (f"(redelivery_seconds IS NOT NULL AND {rules.RUNNING_IDLE_SINCE_SQL} "
                    "+ redelivery_seconds > %(cutoff)s)")
_PARENTS = "parent_id = ANY(%(parents)s::text[])"
_ACTIVE_CHILDREN = (
    f"SELECT parent_id, seq, status, {_REDELIVERY_OPEN} FROM tsg_tasks "
    f"WHERE {_PARENTS} AND (status IN ('queued','running') "
    f"OR (status = 'timed_out' AND terminal_code IN {rules.sql_set(LOST_CODES)} "
    f"AND {_REDELIVERY_OPEN}))"
)
# An older layout (read in place by a read-only open) records no redelivery windows.
_ACTIVE_CHILDREN_OLD = (
    f"SELECT parent_id, seq, status, 0 FROM tsg_tasks WHERE {_PARENTS} "
    "AND status IN ('queued','running')"
)
_RUNS_FOR_OWNER = (
    "SELECT 1 FROM tsg_tasks WHERE delivery_status = 'pending' AND status = 'running' "
    "AND owner = %(owner)s LIMIT 1"
)
_OWNERS = (
    "SELECT owner, count(*) FROM tsg_tasks WHERE delivery_status = 'pending' "
    "AND status = 'running' AND owner IS NOT NULL GROUP BY owner"
)
_TOTALS = "SELECT event, kind, state, code, total FROM tsg_totals"
_EVENTS = (
    "SELECT e.step, e.kind, e.state, e.code, e.at FROM tsg_tasks t "
    "LEFT JOIN tsg_events e ON e.task_seq = t.seq WHERE t.id = %(id)s ORDER BY e.step"
)
_TASK = f"SELECT {TASK_COLUMNS} FROM tsg_tasks WHERE id = %(id)s"
_EXISTS = "SELECT 1 FROM tsg_tasks WHERE id = %(id)s"
_CHILDREN = f"SELECT {TASK_COLUMNS} FROM tsg_tasks WHERE parent_id = %(id)s ORDER BY seq"
_COUNT_PRUNABLE = "SELECT count(*) FROM tsg_tasks WHERE " + render(PRUNABLE, _mark, "cutoff")
_PRUNABLE_ROOTS = (
    "SELECT seq, delivery_updated_at FROM tsg_tasks WHERE " + render(PRUNABLE, _mark, "cutoff")
    + " AND (delivery_updated_at, seq) > (%(updated)s, %(seq)s) "
    "ORDER BY delivery_updated_at, seq LIMIT %(limit)s"
)
_SEQS = "= ANY(%(seqs)s::bigint[])"
# A task whose lost verdict no adapter has published yet (current layout only).
_OWED = "(SELECT count(*) FROM tsg_verdicts v WHERE v.task_seq = t.seq AND v.state = 'pending')"
_TREES = (
    "WITH RECURSIVE tree(root, seq, id) AS ("
    f" SELECT seq, seq, id FROM tsg_tasks WHERE seq {_SEQS}"
    " UNION ALL SELECT tree.root, c.seq, c.id FROM tsg_tasks c"
    " JOIN tree ON c.parent_id = tree.id)"
    " SELECT tree.root, t.seq, t.status, t.delivery_status,"
    " CASE WHEN t.updated_at > t.delivery_updated_at THEN t.updated_at"
    " ELSE t.delivery_updated_at END,"
    " (SELECT count(*) FROM tsg_events e WHERE e.task_seq = t.seq),"
    " {owed}"
    " FROM tree JOIN tsg_tasks t ON t.seq = tree.seq"
)
_HOLD_ROWS = f"SELECT seq FROM tsg_tasks WHERE seq {_SEQS} ORDER BY seq{DELETE_HOLD}"
# One statement per table: a task's foreign-key check runs at the end of the statement, when
# its deleted children are gone too.
_DELETES = (
    f"DELETE FROM tsg_events WHERE task_seq {_SEQS}",
    # their published verdicts go with them (a pending one kept its tree)
    f"DELETE FROM tsg_verdicts WHERE task_seq {_SEQS}",
    f"DELETE FROM tsg_tasks WHERE seq {_SEQS}",
)
_PENDING_FREE = (
    "framework = %(framework)s AND state = 'pending' "
    "AND (lease_until IS NULL OR lease_until <= %(now)s)"
)
_ANY_CLAIMABLE = f"SELECT 1 FROM tsg_verdicts WHERE {_PENDING_FREE} LIMIT 1"
_OF_TASKS = "task_seq IN (SELECT seq FROM tsg_tasks WHERE id = ANY(%(ids)s::text[]))"
_CLAIM = (
    "UPDATE tsg_verdicts SET lease_until = %(until)s, claim = %(token)s WHERE task_seq IN ("
    f"SELECT task_seq FROM tsg_verdicts WHERE {_PENDING_FREE}{{only}} "
    f"ORDER BY task_seq LIMIT %(limit)s{HOLD}) RETURNING task_seq"
)
_CLAIMED = (
    "SELECT t.id, t.framework_id, t.name, t.terminal_code, v.framework, v.recorded_at "
    f"FROM tsg_verdicts v JOIN tsg_tasks t ON t.seq = v.task_seq WHERE v.task_seq {_SEQS} "
    "ORDER BY v.task_seq"
)
_PUBLISH = (
    "UPDATE tsg_verdicts SET state = 'published', published_at = %(now)s, "
    f"lease_until = NULL, claim = NULL WHERE state = 'pending' AND {_OF_TASKS} "
    "RETURNING task_seq"
)
_RELEASE = (
    "UPDATE tsg_verdicts SET lease_until = NULL, claim = NULL WHERE state = 'pending' "
    f"AND claim = %(token)s AND {_OF_TASKS} RETURNING task_seq"
)
_VERDICT_COUNTS = (
    "SELECT framework, state, count(*), min(recorded_at) FROM tsg_verdicts GROUP BY 1, 2"
)


def _listing(columns: str, query: TaskQuery) -> tuple[str, dict[str, Any]]:
    """The listing's statement and its values (see :class:`TaskQuery`)."""
    clauses = [ATTEMPT_SQL if query.attempts else f"NOT {ATTEMPT_SQL}"]
    params: dict[str, Any] = {"limit": query.limit}
    if query.job is not None:  # one job: the task itself, or its attempts
        clauses.append("parent_id = %(job)s" if query.attempts else "id = %(job)s")
        params["job"] = query.job
    if query.open_only:
        clauses.append("delivery_status = 'pending'")  # the open-work index
    if query.status is not None:
        clauses.append("status = %(status)s")
        params["status"] = query.status
    elif query.active_only:
        clauses.append("status IN ('queued','running')")
    if query.name is not None:
        clauses.append("name = %(name)s")
        params["name"] = query.name
    if query.idle_before is not None:
        clauses.append(f"{rules.IDLE_SINCE_SQL} <= %(idle_before)s")
        params["idle_before"] = query.idle_before
    if query.created_before is not None:
        clauses.append("created_at <= %(created_before)s")
        params["created_before"] = query.created_before
    key = LIST_ORDERS[query.order]
    direction, beyond = ("DESC", "<") if query.descending else ("ASC", ">")
    if query.after is not None:
        clauses.append(f"({key} {beyond} %(key)s OR ({key} = %(key)s "
                       f"AND seq {beyond} %(after_seq)s))")
        params["key"], params["after_seq"] = query.after
    ordering = f"seq {direction}" if query.order == "created" else (
        f"{key} {direction}, seq {direction}")
    sql = (
        f"SELECT {columns}, {LIST_ATTEMPTS}, {rules.IDLE_SINCE_SQL}, {key}, seq FROM tsg_tasks "
        f"WHERE {' AND '.join(clauses)} ORDER BY {ordering} LIMIT %(limit)s"
    )
    return sql, params


def _finding(query: FindQuery) -> tuple[str, dict[str, Any]]:
    """The statement and values of a :class:`FindQuery`."""
    sql = "SELECT id FROM tsg_tasks WHERE " + (
        "delivery_status = 'pending' AND status = %(status)s" if query.open_only
        else "status = %(status)s")
    params: dict[str, Any] = {"status": query.status}
    if query.idle_before is not None:
        since = FIND_IDLE_SINCE.get(query.status, FIND_IDLE_SINCE_CLOSED)
        sql += f" AND {since} <= %(idle_before)s"
        params["idle_before"] = query.idle_before
    if query.name is not None:
        sql += " AND name = %(name)s"
        params["name"] = query.name
    if query.created_before is not None:
        sql += " AND created_at <= %(created_before)s"
        params["created_before"] = query.created_before
    if query.job is not None:
        sql += " AND (id = %(job)s OR parent_id = %(job)s)"
        params["job"] = query.job
    sql += " ORDER BY seq"
    if query.limit is not None:
        sql += " LIMIT %(limit)s"
        params["limit"] = query.limit
    return sql, params


def _rows(conn: Conn, sql: str, params: dict[str, Any] | None = None) -> list[Any]:
    return [tuple(row) for row in conn.run(sql, params).fetchall()]


class PostgresQueries:
    """The PostgreSQL backend's :class:`~task_state_guard.store.queries.Queries`."""

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

    @staticmethod
    def count_open(conn: Conn) -> int:
        return int(_rows(conn, _COUNT_OPEN)[0][0])

    @staticmethod
    def active_children(conn: Conn, parent_ids: list[str],
                        cutoff: float | None) -> list[tuple[Any, Any, Any, Any]]:
        if cutoff is None:
            return _rows(conn, _ACTIVE_CHILDREN_OLD, {"parents": parent_ids})
        return _rows(conn, _ACTIVE_CHILDREN,
                     {"parents": parent_ids, "cutoff": cutoff})

    @staticmethod
    def runs_for_owner(conn: Conn, token: str) -> bool:
        return conn.run(_RUNS_FOR_OWNER, {"owner": token}).fetchone() is not None

    @staticmethod
    def open_running_owners(conn: Conn) -> list[tuple[Any, int]]:
        return _rows(conn, _OWNERS)

    @staticmethod
    def totals(conn: Conn) -> list[tuple[Any, Any, Any, Any, Any]]:
        return _rows(conn, _TOTALS)

    @staticmethod
    def task_events(conn: Conn, task_id: str) -> list[tuple[Any, ...]] | None:
        rows = _rows(conn, _EVENTS, {"id": task_id})
        if not rows:
            return None
        return [row for row in rows if row[0] is not None]  # a task without events: one NULL row

    @staticmethod
    def list_tasks(conn: Conn, columns: str, query: TaskQuery) -> list[tuple[Any, ...]]:
        return _rows(conn, *_listing(columns, query))

    @staticmethod
    def task(conn: Conn, task_id: str) -> tuple[Any, ...] | None:
        row = conn.run(_TASK, {"id": task_id}).fetchone()
        return None if row is None else tuple(row)

    @staticmethod
    def children(conn: Conn, task_id: str, limit: int | None) -> list[tuple[Any, ...]] | None:
        if conn.run(_EXISTS, {"id": task_id}).fetchone() is None:
            return None
        if limit is None:
            return _rows(conn, _CHILDREN, {"id": task_id})
        return _rows(conn, _CHILDREN + " LIMIT %(limit)s", {"id": task_id, "limit": limit})

    @staticmethod
    def find_ids(conn: Conn, query: FindQuery) -> list[Any]:
        return [row[0] for row in conn.run(*_finding(query)).fetchall()]

    @staticmethod
    def count_prunable(conn: Conn, cutoff: float) -> int:
        return int(_rows(conn, _COUNT_PRUNABLE, {"cutoff": cutoff})[0][0])

    @staticmethod
    def prunable_roots(conn: Conn, cutoff: float, after: tuple[float, int],
                       limit: int) -> list[tuple[Any, Any]]:
        params = {"cutoff": cutoff, "updated": after[0], "seq": after[1], "limit": limit}
        return _rows(conn, _PRUNABLE_ROOTS, params)

    @staticmethod
    def trees(conn: Conn, roots: list[int],
              outbox: bool) -> list[tuple[Any, Any, Any, Any, Any, Any, Any]]:
        sql = _TREES.format(owed=_OWED if outbox else "0")
        return _rows(conn, sql, {"seqs": roots})

    @staticmethod
    def hold_for_delete(conn: Conn, seqs: list[int]) -> set[int] | None:
        held: set[int] = set()
        for start in range(0, len(seqs), _HOLD_CHUNK):
            part = seqs[start : start + _HOLD_CHUNK]
            held.update(row[0] for row in conn.run(_HOLD_ROWS, {"seqs": part}).fetchall())
        return held

    @staticmethod
    def delete_tasks(conn: Conn, seqs: list[int]) -> None:
        for statement in _DELETES:
            conn.run(statement, {"seqs": seqs})

    @staticmethod
    def any_claimable(conn: Conn, framework: str, now: float) -> bool:
        params = {"framework": framework, "now": now}
        return conn.run(_ANY_CLAIMABLE, params).fetchone() is not None

    @staticmethod
    def claim_verdicts(conn: Conn, framework: str, now: float, until: float, token: str,
                       task_ids: list[str] | None, limit: int) -> list[int]:
        only = "" if task_ids is None else f" AND {_OF_TASKS}"
        params = {"until": until, "token": token, "framework": framework, "now": now,
                  "ids": task_ids, "limit": limit}
        return [row[0] for row in conn.run(_CLAIM.format(only=only), params).fetchall()]

    @staticmethod
    def claimed(conn: Conn, seqs: list[int]) -> list[tuple[Any, ...]]:
        return _rows(conn, _CLAIMED, {"seqs": seqs})

    @staticmethod
    def publish_verdicts(conn: Conn, now: float, task_ids: list[str]) -> int:
        return len(conn.run(_PUBLISH, {"now": now, "ids": task_ids}).fetchall())

    @staticmethod
    def release_verdicts(conn: Conn, token: str, task_ids: list[str]) -> int:
        return len(conn.run(_RELEASE, {"token": token, "ids": task_ids}).fetchall())

    @staticmethod
    def verdict_counts(conn: Conn) -> list[tuple[Any, Any, Any, Any]]:
        return _rows(conn, _VERDICT_COUNTS)


__all__ = ["DELETE_HOLD", "HOLD", "PASS_KIND", "PASS_WRITES", "PostgresQueries"]
