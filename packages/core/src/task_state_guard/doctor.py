"""Counts-only health check: integrity, exact schema, state semantics, timestamps, event chains.

The report (0.1.0's keys): ``healthy``, ``schema_version``, ``schema_ok``, ``quick_check``
(``"ok"`` or ``"failed"``), ``task_count``, ``event_count``, ``task_status_counts`` and
``delivery_status_counts`` (every state, zeros included), and one integer ``*_count`` per class
of finding (this version adds ``verdict_mismatch_count``: the verdict outbox disagrees with the
closes it records).

Memory stays bounded whatever the ledger size: state and code rules are judged once per distinct
row *shape* (SQLite groups the rows), timestamp and event-chain rules are counting queries
evaluated inside SQLite, and identifiers are checked in one streaming pass. Findings are counts;
no id, code, hash or stored value ever appears in the report.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from . import rules, verdicts
from .model import (
    DELIVERY_CODES,
    DELIVERY_STATES,
    FRAMEWORK_LABELS,
    TASK_CODES,
    TASK_STATES,
)
from .sqlite import schema

if TYPE_CHECKING:
    from .store import Database

_FINDINGS = (
    "integrity_errors",
    "foreign_key_violations",
    "orphan_events",
    "invalid_ids",
    "invalid_values",
    "invalid_states",
    "invalid_codes",
    "invalid_timestamps",
    "parent_order_violations",
    "parent_cycles",
    "event_chain_mismatches",
    "verdict_mismatches",
)
#: The report key of each finding class.
_COUNT_KEYS = {
    "integrity_errors": "integrity_error_count",
    "foreign_key_violations": "foreign_key_violation_count",
    "orphan_events": "orphan_event_count",
    "invalid_ids": "invalid_id_count",
    "invalid_values": "invalid_value_count",
    "invalid_states": "invalid_state_count",
    "invalid_codes": "invalid_code_count",
    "invalid_timestamps": "invalid_timestamp_count",
    "parent_order_violations": "parent_order_violation_count",
    "parent_cycles": "parent_cycle_count",
    "event_chain_mismatches": "event_chain_mismatch_count",
    "verdict_mismatches": "verdict_mismatch_count",
}
_TASK_ORDER = rules.TASK_ORDER
_DELIVERY_ORDER = rules.DELIVERY_ORDER
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_NAME = re.compile(r"[A-Za-z0-9_<][A-Za-z0-9_.:/<>\-]{0,199}")
_HEX32 = re.compile(r"[0-9a-f]{32}")
_HEX64 = re.compile(r"[0-9a-f]{64}")


#: The largest finite float as an SQL literal: a stored infinity compares above it.
FLOAT_MAX_SQL = "1.7976931348623157e308"


def _fin(column: str) -> str:
    return (f"(typeof({column}) IN ('real','integer') "
            f"AND {column} BETWEEN 0 AND {FLOAT_MAX_SQL})")


def times_ok_sql(fin: Callable[[str], str], false: str = "0") -> str:
    """The timestamp rules of one row as one SQL expression (``fin``: the finite-number test
    of a column; ``false``: the dialect's false literal)."""
    _fin = fin
    return f"""coalesce((
    {_fin("created_at")} AND {_fin("updated_at")} AND updated_at >= created_at
    AND (timeout_seconds IS NULL OR {_fin("timeout_seconds")})
    AND (started_at IS NULL OR ({_fin("started_at")} AND started_at >= created_at
         AND updated_at >= started_at))
    AND (ended_at IS NULL OR ({_fin("ended_at")}
         AND ended_at >= coalesce(started_at, created_at) AND updated_at >= ended_at))
    AND {_fin("delivery_updated_at")}
    AND CASE WHEN delivery_status = 'pending' THEN delivery_updated_at = created_at
        ELSE delivery_updated_at >= coalesce(ended_at, started_at, created_at) END
    AND (heartbeat_at IS NULL OR ({_fin("heartbeat_at")} AND started_at IS NOT NULL
         AND heartbeat_at >= started_at AND updated_at >= heartbeat_at
         AND (ended_at IS NULL OR heartbeat_at <= ended_at)))
    AND (deadline_at IS NULL OR ({_fin("deadline_at")} AND started_at IS NOT NULL
         AND timeout_seconds IS NOT NULL AND deadline_at = started_at + timeout_seconds))
    AND NOT (started_at IS NOT NULL AND timeout_seconds IS NOT NULL AND deadline_at IS NULL)
    ), {false})"""


_TIMES_OK = times_ok_sql(_fin)

# One row per distinct shape: states, codes, which optional fields are set, timestamps valid.
_SHAPES = f"""SELECT status, terminal_code, delivery_status, delivery_code, delivery_required,
    started_at IS NULL, heartbeat_at IS NULL, ended_at IS NULL,
    deadline_at IS NULL, owner IS NULL, {_TIMES_OK}, count(*)
    FROM tsg_tasks GROUP BY 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11"""

_VALUES = "SELECT id, parent_id, name, owner, payload_hash, version, framework_id FROM tsg_tasks"

# A task's events must be exactly those its row has made (``rules.expected_events``), each
# with the task's own state, code and time; and the task's version counts at least those
# changes (a 0.1.0 ledger may have counted more).
_EVENT_CHAINS = rules.event_chain_sql(
    is_same="IS", as_int="({})", false="0", true="1", extra=" OR typeof(version) != 'integer'")

def outbox_values_sql(fin: Callable[[str], str]) -> str:
    """Count the task rows whose outbox columns (current layout) are malformed: a framework
    label outside the closed set or on an attempt (a child that owes no delivery; a child that
    owes its own, a LangGraph resume or recovery run, is a job), or a redelivery bound that is
    not a finite duration of a started task."""
    return f"""SELECT count(*) FROM tsg_tasks WHERE
    (framework IS NOT NULL AND (framework NOT IN {rules.sql_set(FRAMEWORK_LABELS)}
        OR (parent_id IS NOT NULL AND delivery_required = 0)))
    OR (redelivery_seconds IS NOT NULL AND NOT ({fin("redelivery_seconds")}
        AND redelivery_seconds <= 1e10 AND started_at IS NOT NULL))"""


_OUTBOX_VALUES = outbox_values_sql(_fin)
_OUTBOX = verdicts.consistency_sql(_fin)

_ORPHAN_EVENTS = (
    "SELECT count(*) FROM tsg_events e "
    "WHERE NOT EXISTS (SELECT 1 FROM tsg_tasks t WHERE t.seq = e.task_seq)"
)

_PARENT_ORDER = (
    "SELECT c.id FROM tsg_tasks c JOIN tsg_tasks p ON p.id = c.parent_id "
    "WHERE NOT (p.seq < c.seq AND p.created_at <= c.created_at)"
)


def _shape_ok(shape: tuple[Any, ...]) -> tuple[bool, bool]:
    """Judge one distinct shape: (states consistent, codes in the registry)."""
    (status, code, delivery, dcode, required, no_start, no_beat, no_close,
     no_deadline, no_owner) = shape
    codes_ok = (code is None or code in TASK_CODES.get(status, ())) and (
        dcode is None or dcode in DELIVERY_CODES.get(delivery, ())
    )
    if status not in TASK_STATES or delivery not in DELIVERY_STATES or required not in (0, 1):
        return False, codes_ok
    if status == "queued":
        ok = no_start and no_beat and no_close and no_deadline and no_owner and code is None
    elif status == "running":
        ok = not no_start and no_close and code is None
    else:
        ok = not no_close
    if status in ("queued", "running") and delivery != "pending":
        ok = False
    if delivery == "pending":
        ok = ok and dcode is None
    else:
        ok = ok and (delivery == "not_applicable") != (required == 1)
    return bool(ok), bool(codes_ok)


def _count(conn: Any, sql: str) -> int:
    return int(conn.execute(sql).fetchone()[0])


def _check_shapes(conn: Any, findings: dict[str, int], shapes_sql: str = _SHAPES) -> None:
    for *shape, times_ok, count in conn.execute(shapes_sql):
        states_ok, codes_ok = _shape_ok(tuple(shape))
        findings["invalid_states"] += 0 if states_ok else count
        findings["invalid_codes"] += 0 if codes_ok else count
        findings["invalid_timestamps"] += 0 if times_ok else count


def _check_values(conn: Any, findings: dict[str, int]) -> None:
    uuid_ok, name_ok = _UUID.fullmatch, _NAME.fullmatch
    known_names: set[str] = set()
    bad_ids = bad_values = 0
    for task_id, parent, name, owner, payload, version, framework in conn.execute(_VALUES):
        if (
            not (type(task_id) is str and uuid_ok(task_id))
            or (parent is not None and not (type(parent) is str and uuid_ok(parent)))
            or (framework is not None and not (type(framework) is str and uuid_ok(framework)))
        ):
            bad_ids += 1
        if name is not None and name not in known_names:
            if type(name) is str and name_ok(name):
                if len(known_names) < 10_000:
                    known_names.add(name)
            else:
                bad_values += 1
                continue
        if (
            (owner is not None and not (type(owner) is str and _HEX32.fullmatch(owner)))
            or (payload is not None and not (type(payload) is str and _HEX64.fullmatch(payload)))
            or type(version) is not int
            or version < 0
        ):
            bad_values += 1
    findings["invalid_ids"] = bad_ids
    findings["invalid_values"] = bad_values


def _cycles(conn: Any) -> tuple[int, int]:
    """Count parent-order violations and the distinct cycles reachable from them.

    The API only links a child to an existing, older parent, so a cycle always contains an
    order violation: walking up from the violators alone finds every cycle.
    """
    suspects = conn.execute(_PARENT_ORDER).fetchall()
    cycles: set[frozenset[str]] = set()
    for (start,) in suspects:
        path: list[str] = []
        seen: set[str] = set()
        node: Any = start
        while node is not None and node not in seen and len(path) < 100_000:
            seen.add(node)
            path.append(node)
            row = conn.execute("SELECT parent_id FROM tsg_tasks WHERE id = ?", (node,)).fetchone()
            node = None if row is None else row[0]
        if node is not None and node in seen:
            cycles.add(frozenset(path[path.index(node) :]))
    return len(suspects), len(cycles)


_STATUS_COUNTS = "SELECT status, delivery_status, count(*) FROM tsg_tasks GROUP BY 1, 2"


def _state_counts(conn: Any) -> tuple[dict[str, int], dict[str, int]]:
    tasks = dict.fromkeys(_TASK_ORDER, 0)
    deliveries = dict.fromkeys(_DELIVERY_ORDER, 0)
    for status, delivery, count in conn.execute(_STATUS_COUNTS):
        if status in tasks:
            tasks[status] += count
        if delivery in deliveries:
            deliveries[delivery] += count
    return tasks, deliveries


def run_doctor(db: Database) -> dict[str, Any]:
    """Check the whole ledger and return counts only (see the module docstring).

    A damaged file is reported as such, never as an empty healthy one: ``quick_check`` is
    ``"failed"``, ``schema_ok`` is false (a damaged file's schema cannot be vouched for), and a
    count that could not be read is ``None`` (``task_count``, ``event_count``, the state counts);
    each part that could not be read adds one to ``integrity_error_count``.
    """
    findings = dict.fromkeys(_FINDINGS, 0)
    report: dict[str, Any] = {
        "task_count": None, "event_count": None,
        "task_status_counts": None, "delivery_status_counts": None,
    }
    with db.read() as conn:
        try:
            integrity = [r[0] for r in conn.execute("PRAGMA quick_check")]
        except sqlite3.DatabaseError:  # damaged so that SQLite stops checking (not only lists)
            integrity = ["unreadable"]
        try:
            fmt = schema.detect_format(conn, "main")
        except sqlite3.DatabaseError as exc:
            raise db.translate(exc) from None
        integrity_ok = integrity == ["ok"]
        findings["integrity_errors"] = 0 if integrity_ok else len(integrity)
        readable = True

        def part(read: Callable[[], Any]) -> Any:
            nonlocal readable
            try:
                return read()
            except sqlite3.DatabaseError:  # damaged beyond what this part could read
                readable = False
                findings["integrity_errors"] += 1
                return None

        if fmt in schema.KNOWN:
            report["task_count"] = part(lambda: _count(conn, "SELECT count(*) FROM tsg_tasks"))
            report["event_count"] = part(lambda: _count(conn, "SELECT count(*) FROM tsg_events"))
            counts = part(lambda: _state_counts(conn))
            if counts is not None:
                report["task_status_counts"], report["delivery_status_counts"] = counts
            findings["foreign_key_violations"] = part(
                lambda: len(conn.execute("PRAGMA foreign_key_check").fetchall())) or 0
            findings["orphan_events"] = part(lambda: _count(conn, _ORPHAN_EVENTS)) or 0
            part(lambda: _check_shapes(conn, findings))
            part(lambda: _check_values(conn, findings))
            findings["event_chain_mismatches"] = part(
                lambda: _count(conn, _EVENT_CHAINS)) or 0
            cycles = part(lambda: _cycles(conn))
            if cycles is not None:
                findings["parent_order_violations"], findings["parent_cycles"] = cycles
            if fmt in schema.OUTBOX_LAYOUTS:  # older layouts have no outbox
                findings["invalid_values"] += part(lambda: _count(conn, _OUTBOX_VALUES)) or 0
                findings["verdict_mismatches"] = part(lambda: _count(conn, _OUTBOX)) or 0
        else:
            report["task_count"] = report["event_count"] = 0
            report["task_status_counts"] = dict.fromkeys(_TASK_ORDER, 0)
            report["delivery_status_counts"] = dict.fromkeys(_DELIVERY_ORDER, 0)
    schema_ok = fmt in schema.KNOWN and integrity_ok and readable
    result: dict[str, Any] = {
        "healthy": schema_ok and not any(findings.values()),
        "schema_version": schema.STORED_VERSION[fmt] if fmt in schema.KNOWN else None,
        "schema_ok": schema_ok,
        "quick_check": "ok" if integrity_ok and readable else "failed",
        **report,
    }
    for name, count in findings.items():
        result[_COUNT_KEYS[name]] = count
    return result
