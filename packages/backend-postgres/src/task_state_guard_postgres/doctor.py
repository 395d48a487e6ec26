"""Counts-only health check of a PostgreSQL ledger, with the core's report and rules.

The rules and the report are the core's (``task_state_guard.ops.doctor``); this module supplies
the probes: PostgreSQL's dialect, the count of broken parent links, rows streamed through a
server-side cursor, and the layout check. PostgreSQL has no
``quick_check``: ``quick_check`` is ``"ok"`` when every check could read the ledger (a check
it could not reach is ``None``, listed in ``checks_not_run``), and the schema is checked
against this release's exact layout (``ddl.layout_ok``), as any open does.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable
from typing import Any

from task_state_guard.model import LedgerError
from task_state_guard.ops import doctor as core
from task_state_guard.store.protocol import Database

from . import ddl


def _fin(column: str) -> str:
    # Columns are double precision: NULL, NaN (above every number here) and infinity fail.
    return f"({column} >= 0 AND {column} < 'Infinity'::float8)"


#: Every child joined to its parent once: how many parents are missing (the parent check
#: can be bypassed, by ``session_replication_role``) and how many
#: children do not come after their parent.
_PARENT_LINKS = (
    "SELECT count(*) FILTER (WHERE p.seq IS NULL), "
    f"count(*) FILTER (WHERE NOT ({core.PARENT_ORDER_OK})) "
    "FROM tsg_tasks c LEFT JOIN tsg_tasks p ON p.id = c.parent_id WHERE c.parent_id IS NOT NULL"
)


def _parent_links(conn: Any) -> tuple[int, int]:
    missing, misordered = conn.execute(_PARENT_LINKS).fetchone()
    return int(missing), int(misordered)


def _rows(conn: Any, sql: str) -> Iterable[tuple[Any, ...]]:
    rows: Iterable[tuple[Any, ...]] = conn.stream(sql)  # a server-side cursor, bounded
    return rows


def _parent(conn: Any, task_id: str) -> Any:
    row = conn.run("SELECT parent_id FROM tsg_tasks WHERE id = %(id)s", {"id": task_id}).fetchone()
    return None if row is None else row[0]


PROBES = core.Probes(
    core.Dialect(_fin, false="false", true="true", is_same="IS NOT DISTINCT FROM",
                 as_int="({})::int"),
    _parent_links, _rows, _parent,
)


def _schema_ok(conn: Any, schema: str) -> int | None:
    """The schema version when the layout is exactly this release's, else None."""
    version = ddl.stored_version(conn, schema)
    if version != ddl.SCHEMA_VERSION or not ddl.layout_ok(conn, schema):
        return None
    return version


#: The plan for the event chains on their own connection: one pass merging the two primary
#: keys' orders (tasks by ``seq``, events by ``(task_seq, step)``) and grouping as it goes.
#: Left to itself the planner hashes every event in parallel and sorts the joined rows
#: (gigabytes of temporary files at millions of tasks): 75 s and three processes' CPU against
#: 49 s of one process on 8.4M tasks and 30M events.
_ORDERED_PLAN = (
    "SELECT set_config('enable_hashjoin', 'off', true), set_config('enable_hashagg', 'off', true), "
    "set_config('enable_sort', 'off', true), "
    "set_config('max_parallel_workers_per_gather', '0', true)"
)


class _Beside:
    """Counting queries run on a second connection that reads the same snapshot, each in a
    thread of its own, while the check goes on (``core.Beside``). A query whose connection
    could not be opened runs on the check's own connection when it is waited for; one still
    running when the check ends early is cancelled."""

    def __init__(self, db: Any, conn: Any) -> None:
        self._db = db
        self._conn = conn
        self._snapshot: str | None = None
        self._running: list[tuple[threading.Thread, dict[str, Any]]] = []

    def __call__(self, sql: str) -> Callable[[], tuple[Any, ...]]:
        if self._snapshot is None:
            self._snapshot = self._db.export_snapshot(self._conn)
        state: dict[str, Any] = {}
        thread = threading.Thread(target=self._count, args=(sql, state),
                                  name="tsg-doctor-beside", daemon=True)
        thread.start()
        self._running.append((thread, state))

        def wait() -> tuple[Any, ...]:
            thread.join()
            if "row" in state:
                return tuple(state["row"])
            if "error" in state:
                raise state["error"]
            return tuple(self._conn.execute(sql).fetchone())  # no second connection

        return wait

    def _count(self, sql: str, state: dict[str, Any]) -> None:
        with contextlib.ExitStack() as stack:
            try:
                conn = stack.enter_context(self._db.read_beside(self._snapshot))
            except LedgerError:
                return  # the waiter runs it on the check's own connection
            state["conn"] = conn
            try:
                conn.execute(_ORDERED_PLAN)
                state["row"] = conn.execute(sql).fetchone()
            except LedgerError as exc:
                state["error"] = exc

    def close(self) -> None:
        """Cancel what still runs and wait for it (a cancel that came before its query was
        sent is sent again)."""
        for thread, state in self._running:
            while thread.is_alive():
                conn = state.get("conn")
                if conn is not None:
                    with contextlib.suppress(Exception):
                        conn.raw.cancel()
                thread.join(0.05)


def run_doctor(db: Database, schema: str) -> dict[str, Any]:
    """Check the ledger in ``schema`` and return counts only (the core's report keys). The
    event chains are counted on a second connection reading the same snapshot, beside the
    other checks (a long join at millions of tasks)."""
    findings = core.new_findings()
    findings["integrity_errors"] = 0  # no quick_check: the checks that could not read count
    findings["unexpected_schema_objects"] = 0  # the layout check compares every object
    counts = core.unread_counts()
    version: int | None = None
    read_ok = True
    with db.read() as conn:
        version = _schema_ok(conn, schema)
        if version is not None:
            beside = _Beside(db, conn)
            try:
                core.check(conn, PROBES, findings, counts, lambda read: read(), beside=beside)
            except LedgerError:  # the checks not reached stay None ("not run")
                findings["integrity_errors"] = 1  # a check could not read the ledger
                read_ok = False
            finally:
                beside.close()
    return core.report(version=version, schema_ok=version is not None, read_ok=read_ok,
                       counts=counts, findings=findings)


__all__ = ["PROBES", "run_doctor"]
