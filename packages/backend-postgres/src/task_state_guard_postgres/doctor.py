"""Counts-only health check of a PostgreSQL ledger, with the core's report and rules.

The rules and the report are the core's (``task_state_guard.ops.doctor``); this module supplies
the probes: PostgreSQL's dialect, the count of broken parent links, rows streamed through a
server-side cursor, and the layout check. PostgreSQL has no
``quick_check``: ``quick_check`` is ``"ok"`` when every check could read the ledger (a check
it could not reach is ``None``, listed in ``checks_not_run``), and the schema is checked
against this release's exact layout (``ddl.layout_ok``), as any open does.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from task_state_guard.model import LedgerError
from task_state_guard.ops import doctor as core
from task_state_guard.store.protocol import Database

from . import ddl


def _fin(column: str) -> str:
    # Columns are double precision: NULL, NaN (above every number here) and infinity fail.
    return f"({column} >= 0 AND {column} < 'Infinity'::float8)"


_MISSING_PARENTS = (
    "SELECT count(*) FROM tsg_tasks c WHERE c.parent_id IS NOT NULL "
    "AND NOT EXISTS (SELECT 1 FROM tsg_tasks p WHERE p.id = c.parent_id)"
)

def _missing_parents(conn: Any) -> int:
    return int(conn.execute(_MISSING_PARENTS).fetchone()[0])


def _rows(conn: Any, sql: str) -> Iterable[tuple[Any, ...]]:
    rows: Iterable[tuple[Any, ...]] = conn.stream(sql)  # a server-side cursor, bounded
    return rows


def _parent(conn: Any, task_id: str) -> Any:
    row = conn.run("SELECT parent_id FROM tsg_tasks WHERE id = %(id)s", {"id": task_id}).fetchone()
    return None if row is None else row[0]


PROBES = core.Probes(
    core.Dialect(_fin, false="false", true="true", is_same="IS NOT DISTINCT FROM",
                 as_int="({})::int"),
    _missing_parents, _rows, _parent,
)


def _schema_ok(conn: Any, schema: str) -> int | None:
    """The schema version when the layout is exactly this release's, else None."""
    version = ddl.stored_version(conn, schema)
    if version != ddl.SCHEMA_VERSION or not ddl.layout_ok(conn, schema):
        return None
    return version


def run_doctor(db: Database, schema: str) -> dict[str, Any]:
    """Check the ledger in ``schema`` and return counts only (the core's report keys)."""
    findings = core.new_findings()
    findings["integrity_errors"] = 0  # no quick_check: the checks that could not read count
    findings["unexpected_schema_objects"] = 0  # the layout check compares every object
    counts = core.unread_counts()
    version: int | None = None
    read_ok = True
    with db.read() as conn:
        version = _schema_ok(conn, schema)
        if version is not None:
            try:
                core.check(conn, PROBES, findings, counts, lambda read: read())
            except LedgerError:  # the checks not reached stay None ("not run")
                findings["integrity_errors"] = 1  # a check could not read the ledger
                read_ok = False
    return core.report(version=version, schema_ok=version is not None, read_ok=read_ok,
                       counts=counts, findings=findings)


__all__ = ["PROBES", "run_doctor"]
