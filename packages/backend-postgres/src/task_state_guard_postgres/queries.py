"""PostgreSQL's answers to the aggregates' reads and passes' writes (``queries``), in its SQL.

The server groups: status reads one row per group with the at-risk figures as filtered
aggregates (``queries.AT_RISK``), the history one row per bucket. A pass reads open work
without holding it, and holds only the rows it is about to change, checked again as they are
now (``hold_open``), until it commits (without blocking a new child's parent check): it skips a
row a worker's transaction holds at that moment (that work is being changed right now; the
next pass judges it), so a pass never waits for a worker and the two can never deadlock, and
a worker waits for a pass only to change a row the pass is closing (benchmarks/LOG.md).
A pass's closes go as one set-based statement per distinct set of values, which writes the
rows' events, totals and verdicts itself (:mod:`.writes`, as every statement that changes a
state does). The statements both backends run come from ``store.queries.statements`` in psycopg's
named placeholders and run as written (``Conn.run``); a list of values goes as one array
parameter (``= ANY(...)``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from contextlib import AbstractContextManager
from functools import partial
from typing import Any

from task_state_guard import rules
from task_state_guard.store.queries import (
    AT_RISK,
    COUNT_OPEN,
    LEAST,
    OPEN_BATCH,
    OPEN_COLUMNS,
    OPEN_RUNNING_OWNERS,
    OPEN_WORK,
    ROOT_CLOSES,
    STATUS_KEY,
    TOTALS,
    VERDICT_COUNTS,
    CloseWindow,
    Dialect,
    FindQuery,
    GroupKey,
    StatusGroups,
    TaskQuery,
    add_group,
    before,
    finding,
    listing,
    render,
    statements,
    tree_walk,
)

from . import writes
from .driver import Conn, Prepared, int_array, prepared, text_array

PASS_KIND = "tsg-pass"
#: Rows a pass changes stay its own until it commits; rows a worker holds now are skipped.
HOLD = " FOR NO KEY UPDATE SKIP LOCKED"
#: Prune's rows: held against new children (a child's parent check waits for it).
DELETE_HOLD = " FOR UPDATE SKIP LOCKED"
_HOLD_CHUNK = 1000  # rows held per statement


def _mark(name: str) -> str:
    return f"%({name})s"  # psycopg's named parameters


def _among(column: str, name: str, kind: str) -> str:
    return f"{column} = ANY({_mark(name)}::{kind}[])"  # a list goes as one array


DIALECT = Dialect(_mark, _among, HOLD,
                  lambda column, marked: f"strpos({column}, {marked}) > 0")
_SQL = statements(DIALECT)


def _by_parent_index(read: Callable[[Dialect], str]) -> Prepared:
    """A read of tasks under bound seqs (prune's) as a server-side prepared statement: its one
    generic plan follows the parent index from each task (a plan made for the bound values
    merge-joined the whole table, 14 times slower at 1M tasks)."""
    def compose(mark: Callable[[str], str]) -> str:
        return read(Dialect(mark, lambda column, name, kind: f"{column} = ANY({mark(name)})"))
    return prepared({"seqs": "bigint[]"}, compose)


_TREES = {outbox: _by_parent_index(partial(tree_walk, outbox=outbox))
          for outbox in (True, False)}
#: Prune's check after its hold: every child of the held rows, by their ids (bound as an
#: array's text form: one probe of the parent index each, no read of the held rows again).
_CHILDREN_OF = prepared({"ids": "text[]"}, lambda mark: (
    f"SELECT parent_id, seq FROM tsg_tasks WHERE parent_id = ANY({mark('ids')})"))
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
# and set of values, each writing what its rows owe (their events, their outcome totals
# grouped into a few rows, their verdicts: :mod:`.writes`). The guards (still active / still
# pending) hold for every row a pass sends, since it holds them; they keep events exact
# regardless.
_SEQS = _among("seq", "seqs", "bigint")
PASS_WRITES = {
    "time_out": (
        "WITH u AS (UPDATE tsg_tasks SET status = 'timed_out', terminal_code = %(code)s, "
        f"ended_at = %(at)s, updated_at = %(at)s, version = version + 1 WHERE {_SEQS} "
        f"AND status IN {rules.ACTIVE_SQL} RETURNING {writes.returning()}), "
        + ", ".join(writes.owed("u", ("closed",), prefix="u", grouped=True))
        + " SELECT count(*) FROM u"
    ),
    "close_delivery": (
        "WITH u AS (UPDATE tsg_tasks SET delivery_status = %(state)s, delivery_code = %(code)s, "
        f"delivery_updated_at = %(at)s, version = version + 1 WHERE {_SEQS} "
        f"AND delivery_status = 'pending' RETURNING {writes.returning()}), "
        + ", ".join(writes.owed("u", ("delivery",), prefix="u", grouped=True))
        + " SELECT count(*) FROM u"
    ),
}
_EVENTS = (
    "SELECT e.step, e.kind, e.state, e.code, e.at FROM tsg_tasks t "
    "LEFT JOIN tsg_events e ON e.task_seq = t.seq WHERE t.id = %(id)s ORDER BY e.step"
)
# A pass's rows to change, held (a locking read in read committed returns a row's newest
# version, and re-checks the condition on it), with what tells whether a worker wrote one
# since the pass read it: every write but a heartbeat counts in ``version``.
_HOLD_OPEN = (f"SELECT seq, version, heartbeat_at FROM tsg_tasks WHERE {_SEQS} "
              f"AND {OPEN_WORK}{HOLD}")
_OPEN_ROWS = f"SELECT {OPEN_COLUMNS} FROM tsg_tasks WHERE {_SEQS}"
_HOLD_ROWS = f"SELECT seq, id FROM tsg_tasks WHERE {_SEQS} ORDER BY seq{DELETE_HOLD}"
# One statement per table. No child of a deleted task can remain: the rows were held, their
# children read again after the hold, and a new child's parent check waits for the hold.
_DELETES = (
    f"DELETE FROM tsg_events WHERE {_among('task_seq', 'seqs', 'bigint')}",
    # their published verdicts go with them (a pending one kept its tree)
    f"DELETE FROM tsg_verdicts WHERE {_among('task_seq', 'seqs', 'bigint')}",
    f"DELETE FROM tsg_tasks WHERE {_SEQS}",
)


def _rows(conn: Conn, sql: str, params: dict[str, Any] | None = None) -> list[Any]:
    return [tuple(row) for row in conn.run(sql, params).fetchall()]


class PostgresQueries:
    """The PostgreSQL backend's :class:`~task_state_guard.store.queries.Queries`; ``read``
    opens the database object's read transaction (a read of one task runs in one of its
    own)."""

    def __init__(self, read: Callable[[], AbstractContextManager[Conn]]) -> None:
        self._read = read

    @staticmethod
    def status_groups(conn: Conn, now: float, stale_before: float, bound: int,
                      closes: CloseWindow | None = None) -> StatusGroups:
        counts: Counter[GroupKey] = Counter()
        least: dict[str, Any] = dict.fromkeys(LEAST)
        past_deadline = stale = 0
        cursor = conn.run(_STATUS_GROUPS, {"now": now, "stale_before": stale_before})
        while rows := cursor.fetchmany(4096):
            for status, delivery, name, root, owed, count, *risk in rows:
                add_group(counts, (status, delivery, name, bool(root), bool(owed)), count, bound)
                for what, value in zip(LEAST, risk, strict=False):
                    if value is not None and (least[what] is None or before(value, least[what])):
                        least[what] = value
                past_deadline += risk[3]
                stale += risk[4]
        found = StatusGroups(counts, least, past_deadline, stale)
        if closes is not None:  # the server groups each read apart: a second statement
            found.closes = PostgresQueries.root_closes(conn, closes.start, closes.width,
                                                       closes.end)
        return found

    @staticmethod
    def root_closes(conn: Conn, start: float, width: float,
                    end: float) -> list[tuple[Any, Any, Any, int]]:
        params = {"start": start, "width": width, "end": end}
        return [tuple(row) for row in conn.run(_ROOT_CLOSES, params).fetchall()]

    @staticmethod
    def open_batch(conn: Conn, before_seq: int, limit: int) -> list[tuple[Any, ...]]:
        return _rows(conn, _OPEN_BATCH, {"before": before_seq, "limit": limit})

    @staticmethod
    def hold_open(conn: Conn, rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        if not rows:
            return []
        read = {row[0]: row for row in rows}
        held = conn.run(_HOLD_OPEN, {"seqs": int_array(list(read))}).fetchall()
        # (version, heartbeat) as read: the row as read (the common case, no second decode)
        now = {seq: read[seq] for seq, version, beat in held
               if read[seq][14] == version and read[seq][4] == beat}
        if len(now) < len(held):  # written since: read again (this pass holds them now)
            changed = [seq for seq, _version, _beat in held if seq not in now]
            now.update((row[0], row) for row in _rows(conn, _OPEN_ROWS,
                                                      {"seqs": int_array(changed)}))
        return [now[seq] for seq in sorted(now, reverse=True)]

    @staticmethod
    def close_lost(conn: Conn, timeouts: list[tuple[str, float, int]],
                   deliveries: list[tuple[str, str, float, int]]) -> None:
        closes: dict[tuple[str, float], list[int]] = {}
        settles: dict[tuple[str, str, float], list[int]] = {}
        for code, at, seq in timeouts:
            closes.setdefault((code, at), []).append(seq)
        for state, dcode, at, seq in deliveries:
            settles.setdefault((state, dcode, at), []).append(seq)
        for (code, at), seqs in closes.items():
            conn.run(PASS_WRITES["time_out"], {"code": code, "at": at, "seqs": int_array(seqs)})
        for (state, dcode, at), seqs in settles.items():
            conn.run(PASS_WRITES["close_delivery"],
                     {"state": state, "code": dcode, "at": at, "seqs": int_array(seqs)})

    @staticmethod
    def count_open(conn: Conn) -> int:
        return int(_rows(conn, COUNT_OPEN)[0][0])

    @staticmethod
    def active_children(conn: Conn, parent_ids: list[str],
                        cutoff: float | None) -> list[tuple[Any, Any, Any, Any]]:
        if cutoff is None:
            return _rows(conn, _SQL["active_children_old"], {"parents": parent_ids})
        return _rows(conn, _SQL["active_children"], {"parents": parent_ids, "cutoff": cutoff})

    def runs_for_owner(self, token: str) -> bool:
        with self._read() as conn:
            return conn.run(_SQL["runs_for_owner"], {"owner": token}).fetchone() is not None

    @staticmethod
    def open_running_owners(conn: Conn) -> list[tuple[Any, int]]:
        return _rows(conn, OPEN_RUNNING_OWNERS)

    @staticmethod
    def totals(conn: Conn) -> list[tuple[Any, Any, Any, Any, Any]]:
        return _rows(conn, TOTALS)

    def task_events(self, task_id: str) -> list[tuple[Any, ...]] | None:
        with self._read() as conn:
            rows = _rows(conn, _EVENTS, {"id": task_id})
        if not rows:
            return None
        return [row for row in rows if row[0] is not None]  # a task without events: one NULL row

    @staticmethod
    def list_tasks(conn: Conn, columns: str, query: TaskQuery) -> list[tuple[Any, ...]]:
        return _rows(conn, *listing(DIALECT, columns, query))

    def task(self, task_id: str) -> tuple[Any, ...] | None:
        with self._read() as conn:
            row = conn.run(_SQL["task"], {"id": task_id}).fetchone()
        return None if row is None else tuple(row)

    def children(self, task_id: str, limit: int | None) -> list[tuple[Any, ...]] | None:
        with self._read() as conn:
            if conn.run(_SQL["exists"], {"id": task_id}).fetchone() is None:
                return None
            if limit is None:
                return _rows(conn, _SQL["children"], {"id": task_id})
            return _rows(conn, _SQL["children_limit"], {"id": task_id, "limit": limit})

    @staticmethod
    def find_ids(conn: Conn, query: FindQuery) -> list[Any]:
        return [row[0] for row in conn.run(*finding(DIALECT, query)).fetchall()]

    @staticmethod
    def count_prunable(conn: Conn, cutoff: float) -> int:
        return int(_rows(conn, _SQL["count_prunable"], {"cutoff": cutoff})[0][0])

    @staticmethod
    def prunable_roots(conn: Conn, cutoff: float, after: tuple[float, int],
                       limit: int) -> list[tuple[Any, Any]]:
        params = {"cutoff": cutoff, "updated": after[0], "seq": after[1], "limit": limit}
        return _rows(conn, _SQL["prunable_roots"], params)

    @staticmethod
    def trees(conn: Conn, roots: list[int],
              outbox: bool) -> list[tuple[Any, Any, Any, Any, Any, Any, Any]]:
        return conn.fetch_named(_TREES[outbox], {"seqs": roots})

    @staticmethod
    def hold_for_delete(conn: Conn,
                        seqs: list[int]) -> tuple[set[int], list[tuple[Any, Any]]] | None:
        seq_of: dict[str, int] = {}
        for start in range(0, len(seqs), _HOLD_CHUNK):
            part = seqs[start : start + _HOLD_CHUNK]
            seq_of.update((task_id, seq) for seq, task_id in conn.run(
                _HOLD_ROWS, {"seqs": int_array(part)}).fetchall())
        if not seq_of:
            return set(), []
        # A statement of its own: its snapshot, taken once every row is held, sees a child
        # committed before the hold, which the hold's own snapshot may predate.
        children = conn.fetch_named(_CHILDREN_OF, {"ids": text_array(sorted(seq_of))})
        return set(seq_of.values()), [(seq_of[parent], child) for parent, child in children]

    @staticmethod
    def delete_tasks(conn: Conn, seqs: list[int]) -> None:
        values = {"seqs": int_array(seqs)}
        for statement in _DELETES:
            conn.run(statement, values)

    @staticmethod
    def any_claimable(conn: Conn, framework: str, now: float) -> bool:
        params = {"framework": framework, "now": now}
        return conn.run(_SQL["any_claimable"], params).fetchone() is not None

    @staticmethod
    def claim_verdicts(conn: Conn, framework: str, now: float, until: float, token: str,
                       task_ids: list[str] | None, limit: int) -> list[int]:
        sql = _SQL["claim" if task_ids is None else "claim_only"]
        params = {"until": until, "token": token, "framework": framework, "now": now,
                  "ids": task_ids, "limit": limit}
        return [row[0] for row in conn.run(sql, params).fetchall()]

    @staticmethod
    def claimed(conn: Conn, seqs: list[int], threads: bool) -> list[tuple[Any, ...]]:
        return _rows(conn, _SQL["claimed_threads" if threads else "claimed"], {"seqs": seqs})

    @staticmethod
    def publish_verdicts(conn: Conn, now: float, task_ids: list[str]) -> int:
        return len(conn.run(_SQL["publish"], {"now": now, "ids": task_ids}).fetchall())

    @staticmethod
    def release_verdicts(conn: Conn, token: str, task_ids: list[str]) -> int:
        return len(conn.run(_SQL["release"], {"token": token, "ids": task_ids}).fetchall())

    @staticmethod
    def verdict_counts(conn: Conn) -> list[tuple[Any, Any, Any, Any]]:
        return _rows(conn, VERDICT_COUNTS)


__all__ = ["DELETE_HOLD", "HOLD", "PASS_KIND", "PASS_WRITES", "PostgresQueries"]
