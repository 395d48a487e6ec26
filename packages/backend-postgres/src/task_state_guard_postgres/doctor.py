"""Counts-only health check of a PostgreSQL ledger, with the core's report and rules.

State, code, value, parent and event-chain rules are the core's (``task_state_guard.doctor``);
only the statements that SQLite writes in its own dialect are restated here. PostgreSQL has no
``quick_check``: ``quick_check`` is ``"ok"`` when every check could read the ledger, and the
schema is checked against the exact column layout and the event triggers of this release.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from task_state_guard import doctor as core
from task_state_guard import rules, verdicts
from task_state_guard.model import LedgerError

from . import ddl

if TYPE_CHECKING:
    from .database import PostgresDatabase


def _fin(column: str) -> str:
    # Columns are double precision: NULL, NaN (above every number here) and infinity fail.
    return f"({column} >= 0 AND {column} < 'Infinity'::float8)"


_SHAPES = f"""SELECT status, terminal_code, delivery_status, delivery_code, delivery_required,
    started_at IS NULL, heartbeat_at IS NULL, ended_at IS NULL,
    deadline_at IS NULL, owner IS NULL, {core.times_ok_sql(_fin, "false")}, count(*)
    FROM tsg_tasks GROUP BY 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11"""

_EVENT_CHAINS = rules.event_chain_sql(
    is_same="IS NOT DISTINCT FROM", as_int="({})::int", false="false", true="true")

_OUTBOX_VALUES = core.outbox_values_sql(_fin)
_OUTBOX = verdicts.consistency_sql(_fin)

_MISSING_PARENTS = (
    "SELECT count(*) FROM tsg_tasks c WHERE c.parent_id IS NOT NULL "
    "AND NOT EXISTS (SELECT 1 FROM tsg_tasks p WHERE p.id = c.parent_id)"
)

# The exact layout of this release: (table, column, type, nullable) and the event triggers.
_LAYOUT = """SELECT table_name, column_name, data_type, is_nullable FROM information_schema.columns
    WHERE table_schema = ? AND table_name IN ('tsg_tasks', 'tsg_events', 'tsg_totals',
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
    WHERE n.nspname = ? AND c.relname = 'tsg_tasks' AND g.tgenabled <> 'D'
    AND g.tgname IN ('tsg_event_created', 'tsg_event_changed')"""


class _Streamed:
    """The connection as ``core._check_values`` reads it: its one query over every row comes
    through a server-side cursor, a bounded number of rows at a time."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn

    def execute(self, sql: str) -> Any:
        return self._conn.stream(sql)


def _schema_ok(conn: Any, schema: str) -> int | None:
    """The schema version when the layout is exactly this release's, else None."""
    version = ddl.stored_version(conn, schema)
    if version != ddl.SCHEMA_VERSION:
        return None
    layout = [tuple(row) for row in conn.execute(_LAYOUT, (schema,)).fetchall()]
    if layout != _EXPECTED_LAYOUT:
        return None
    if conn.execute(_TRIGGERS, (schema,)).fetchone()[0] != 2:
        return None
    return version


def run_doctor(db: PostgresDatabase) -> dict[str, Any]:
    """Check the whole ledger and return counts only (the core's report keys)."""
    findings = dict.fromkeys(core._FINDINGS, 0)
    task_count = event_count = 0
    tasks = dict.fromkeys(core._TASK_ORDER, 0)
    deliveries = dict.fromkeys(core._DELIVERY_ORDER, 0)
    version: int | None = None
    read_ok = True
    with db.read() as conn:
        version = _schema_ok(conn, db.schema)
        if version is not None:
            try:
                task_count = core._count(conn, "SELECT count(*) FROM tsg_tasks")
                event_count = core._count(conn, "SELECT count(*) FROM tsg_events")
                tasks, deliveries = core._state_counts(conn)
                findings["foreign_key_violations"] = core._count(conn, _MISSING_PARENTS)
                findings["orphan_events"] = core._count(conn, core._ORPHAN_EVENTS)
                core._check_shapes(conn, findings, _SHAPES)
                core._check_values(_Streamed(conn), findings)
                findings["event_chain_mismatches"] = core._count(conn, _EVENT_CHAINS)
                findings["parent_order_violations"], findings["parent_cycles"] = core._cycles(
                    conn
                )
                findings["invalid_values"] += core._count(conn, _OUTBOX_VALUES)
                findings["verdict_mismatches"] = core._count(conn, _OUTBOX)
            except LedgerError:
                findings["integrity_errors"] += 1  # a check could not read the ledger
                read_ok = False
    schema_ok = version is not None
    report: dict[str, Any] = {
        "healthy": schema_ok and not any(findings.values()),
        "schema_version": version,
        "schema_ok": schema_ok,
        "quick_check": "ok" if read_ok else "failed",
        "task_count": task_count,
        "event_count": event_count,
        "task_status_counts": tasks,
        "delivery_status_counts": deliveries,
    }
    for name, count in findings.items():
        report[core._COUNT_KEYS[name]] = count
    return report


__all__ = ["run_doctor"]
