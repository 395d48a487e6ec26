"""Doctor's probes of a SQLite ledger: SQLite's own integrity check, the exact layout, and the
core's rules (:mod:`task_state_guard.ops.doctor`) in SQLite's dialect.

A damaged file is reported as such, never as an empty healthy one: ``quick_check`` is
``"failed"``, ``schema_ok`` is false (a damaged file's schema cannot be vouched for), and a
count that could not be read is ``None`` (``task_count``, ``event_count``, the state counts,
the findings of that part) and listed in ``checks_not_run``; each part that could not be read
adds one to ``integrity_error_count``. A file whose layout is not a ledger's runs no check. An
object in the schema that no known layout has (a trigger added by hand, whatever its name) is
counted in ``unexpected_schema_object_count``; ``schema_ok`` is then false, and the rows are
still checked when every object of a known layout is there.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterable
from typing import Any

from ..ops import doctor
from ..store.protocol import Database
from . import connections, schema


def _fin(column: str) -> str:
    return (f"(typeof({column}) IN ('real','integer') "
            f"AND {column} BETWEEN 0 AND {doctor.FLOAT_MAX_SQL})")


def _parent_links(conn: sqlite3.Connection) -> tuple[int, int]:
    missing = len(conn.execute("PRAGMA foreign_key_check").fetchall())
    return missing, int(conn.execute(doctor.PARENT_ORDER_COUNT).fetchone()[0])


def _rows(conn: sqlite3.Connection, sql: str) -> Iterable[tuple[Any, ...]]:
    return conn.execute(sql)  # SQLite steps through the rows as they are read


def _parent(conn: sqlite3.Connection, task_id: str) -> Any:
    row = conn.execute("SELECT parent_id FROM tsg_tasks WHERE id = ?", (task_id,)).fetchone()
    return None if row is None else row[0]


PROBES = doctor.Probes(
    doctor.Dialect(_fin, false="0", true="1", is_same="IS", as_int="({})",
                   chain_extra=" OR typeof(version) != 'integer'"),
    _parent_links, _rows, _parent,
)


def run_doctor(db: Database) -> dict[str, Any]:
    """Check the whole ledger and return counts only (the core's report)."""
    findings = doctor.new_findings()
    counts = doctor.unread_counts()
    with db.read() as conn:
        try:
            integrity = [r[0] for r in conn.execute("PRAGMA quick_check")]
        except sqlite3.DatabaseError:  # damaged so that SQLite stops checking (not only lists)
            integrity = ["unreadable"]
        try:
            fmt = schema.detect_format(conn, "main")
        except sqlite3.DatabaseError as exc:
            raise connections.translate(exc) from None
        integrity_ok = integrity == ["ok"]
        findings["integrity_errors"] = 0 if integrity_ok else len(integrity)
        readable = True

        def part(read: Callable[[], Any]) -> Any:
            nonlocal readable
            try:
                return read()
            except sqlite3.DatabaseError:  # damaged beyond what this part could read
                readable = False
                findings["integrity_errors"] = (findings["integrity_errors"] or 0) + 1
                return None

        findings["unexpected_schema_objects"] = 0
        layout = fmt
        if fmt not in schema.KNOWN and fmt != schema.NEWER:
            # a tampered ledger: its extra objects counted, its rows checked if it has them all
            layout, extra = schema.unexpected_objects(conn, "main")
            findings["unexpected_schema_objects"] = extra
            if layout is not None and schema.compat_views(layout):
                layout = None  # an older layout is read only through views of a known file
        if layout in schema.KNOWN:  # else no rule can be checked: each count says "not run"
            doctor.check(conn, PROBES, findings, counts, part,
                         outbox=layout in schema.OUTBOX_LAYOUTS)
    schema_ok = fmt in schema.KNOWN and integrity_ok and readable
    return doctor.report(
        version=schema.STORED_VERSION[fmt] if fmt in schema.KNOWN else None,
        schema_ok=schema_ok, read_ok=integrity_ok and readable, counts=counts,
        findings=findings,
    )


__all__ = ["PROBES", "run_doctor"]
