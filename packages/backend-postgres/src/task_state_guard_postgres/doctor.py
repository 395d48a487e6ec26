"""Counts-only health check of a PostgreSQL ledger, with the core's report and rules.

The rules and the report are the core's (``task_state_guard.doctor``); this module supplies
the probes: PostgreSQL's dialect, the count of broken parent links, rows streamed through a
server-side cursor, and the layout check. PostgreSQL has no
``quick_check``: ``quick_check`` is ``"ok"`` when every check could read the ledger, and the
schema is checked against the exact column layout and the event triggers of this release.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from task_state_guard import doctor as core
from task_state_guard import rules
from task_state_guard.model import LedgerError
from task_state_guard.store import Database

from . import ddl


def _fin(column: str) -> str:
    # Columns are double precision: NULL, NaN (above every number here) and infinity fail.
    return f"({column} >= 0 AND {column} < 'Infinity'::float8)"


_MISSING_PARENTS = (
    "SELECT count(*) FROM tsg_tasks c WHERE c.parent_id IS NOT NULL "
    "AND NOT EXISTS (SELECT 1 FROM tsg_tasks p WHERE p.id = c.parent_id)"
)

# The exact layout of this release: (table, column, type, nullable) and the event triggers.
_LAYOUT = """SELECT table_name, column_name, data_type, is_nullable FROM information_schema.columns
    WHERE table_schema = %(schema)s AND table_name IN ('tsg_tasks', 'tsg_events', 'tsg_totals',
        'tsg_verdicts')
    ORDER BY table_name, ordinal_position"""
_EXPECTED_LAYOUT = [
    ("tsg_events", "task_seq", "bigint", "NO"),
    ("tsg_events", "step", "integer", "NO"),
    ("tsg_events", "kind", "text", "NO"),
    ("tsg_events", "state", "text", "NO"),
    ("tsg_events", "code", "text", "YES"),
    ("tsg_events", "at", "double precision", "NO"),
    *[("tsg_tasks", c.name, c.postgres_type, "YES" if c.nullable else "NO")
      for c in rules.TASK_COLUMNS],
    ("tsg_totals", "event", "text", "NO"),
    ("tsg_totals", "kind", "text", "NO"),
    ("tsg_totals", "state", "text", "NO"),
    ("tsg_totals", "code", "text", "NO"),
    ("tsg_totals", "total", "bigint", "NO"),
    ("tsg_verdicts", "task_seq", "bigint", "NO"),
    ("tsg_verdicts", "framework", "text", "NO"),
    ("tsg_verdicts", "state", "text", "NO"),
    *[("tsg_verdicts", column, "double precision", nullable) for column, nullable in (
        ("recorded_at", "NO"), ("lease_until", "YES"))],
    ("tsg_verdicts", "claim", "text", "YES"),
    ("tsg_verdicts", "published_at", "double precision", "YES"),
]
_TRIGGERS = """SELECT count(*) FROM pg_catalog.pg_trigger g
    JOIN pg_catalog.pg_class c ON c.oid = g.tgrelid
    JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname = %(schema)s AND c.relname = 'tsg_tasks' AND g.tgenabled <> 'D'
    AND g.tgname IN ('tsg_event_created', 'tsg_event_changed')"""


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
    if version != ddl.SCHEMA_VERSION:
        return None
    layout = [tuple(row) for row in conn.run(_LAYOUT, {"schema": schema}).fetchall()]
    if layout != _EXPECTED_LAYOUT:
        return None
    if conn.run(_TRIGGERS, {"schema": schema}).fetchone()[0] != 2:
        return None
    return version


def run_doctor(db: Database, schema: str) -> dict[str, Any]:
    """Check the ledger in ``schema`` and return counts only (the core's report keys)."""
    findings = core.new_findings()
    counts = core.empty_counts()
    version: int | None = None
    read_ok = True
    with db.read() as conn:
        version = _schema_ok(conn, schema)
        if version is not None:
            try:
                core.check(conn, PROBES, findings, counts, lambda read: read())
            except LedgerError:
                findings["integrity_errors"] += 1  # a check could not read the ledger
                read_ok = False
    return core.report(version=version, schema_ok=version is not None, read_ok=read_ok,
                       counts=counts, findings=findings)


__all__ = ["PROBES", "run_doctor"]
