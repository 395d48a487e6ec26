"""Counts-only health check: integrity, exact schema, state semantics, timestamps, event chains.

Tasks and events are streamed side by side in (task, event) order, so memory stays bounded.
Findings are counts; no id, code, hash or stored value ever appears in the report.
"""

from __future__ import annotations

import itertools
import math
import re
import sqlite3
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from . import schema
from .connections import translate
from .model import (
    ACTIVE_STATES,
    DELIVERY_CODES,
    DELIVERY_STATES,
    TASK_CODES,
    TASK_STATES,
    TERMINAL_STATES,
    LedgerError,
    canonical_id,
    is_valid_name,
)

if TYPE_CHECKING:
    from .ledger import Ledger

_HEX64 = re.compile(r"[0-9a-f]{64}")
_HEX32 = re.compile(r"[0-9a-f]{32}")
_FINDINGS = (
    "integrity_errors",
    "foreign_key_violations",
    "schema_mismatch",
    "invalid_ids",
    "invalid_states",
    "invalid_codes",
    "invalid_timestamps",
    "parent_order_violations",
    "parent_cycles",
    "event_chain_mismatches",
    "orphan_events",
)
_TASKS = (
    "SELECT seq, id, parent_id, name, status, code, delivery_required, delivery_status, "
    "delivery_code, timeout_seconds, deadline_at, created_at, started_at, heartbeat_at, "
    "closed_at, delivery_closed_at, updated_at, owner, payload_hash FROM tsg_tasks ORDER BY seq"
)
_EVENTS = "SELECT task_seq, step, kind, state, code, at FROM tsg_events ORDER BY task_seq, step"


def _is_time(value: Any) -> bool:
    return isinstance(value, float | int) and not isinstance(value, bool) and math.isfinite(value)


def _canonical(value: Any) -> bool:
    try:
        return isinstance(value, str) and canonical_id(value) == value
    except LedgerError:
        return False


def _state_ok(row: tuple[Any, ...]) -> bool:
    (_seq, _id, _parent, name, status, _code, required, delivery, _dcode, timeout, deadline,
     _created, started, heartbeat, closed, delivery_closed, _updated, owner, payload) = row
    if status not in TASK_STATES or delivery not in DELIVERY_STATES or required not in (0, 1):
        return False
    if name is not None and not (isinstance(name, str) and is_valid_name(name)):
        return False
    if payload is not None and not (isinstance(payload, str) and _HEX64.fullmatch(payload)):
        return False
    if owner is not None and not (isinstance(owner, str) and _HEX32.fullmatch(owner)):
        return False
    if timeout is not None and not (_is_time(timeout) and timeout > 0):
        return False
    if status == "queued" and (started is not None or heartbeat is not None or owner is not None
                               or deadline is not None):
        return False
    if status != "queued" and started is None and status == "running":
        return False
    if status in ACTIVE_STATES and (closed is not None or delivery != "pending"):
        return False
    if status in TERMINAL_STATES and closed is None:
        return False
    if delivery == "pending":
        return bool(delivery_closed is None)
    if delivery_closed is None:
        return False
    return bool((delivery == "not_applicable") != bool(required))


def _codes_ok(row: tuple[Any, ...]) -> bool:
    status, code, delivery, dcode = row[4], row[5], row[7], row[8]
    if code is not None and code not in TASK_CODES.get(status, frozenset()):
        return False
    return dcode is None or dcode in DELIVERY_CODES.get(delivery, frozenset())


def _times_ok(row: tuple[Any, ...]) -> bool:
    (timeout, deadline, created, started, heartbeat, closed, delivery_closed, updated) = (
        row[9], row[10], row[11], row[12], row[13], row[14], row[15], row[16])
    for value in (deadline, started, heartbeat, closed, delivery_closed):
        if value is not None and not _is_time(value):
            return False
    if not _is_time(created) or not _is_time(updated) or updated < created:
        return False
    chain = [t for t in (created, started, closed, delivery_closed) if t is not None]
    if any(a > b for a, b in itertools.pairwise(chain)) or max(chain) > updated:
        return False
    if heartbeat is not None and (
        started is None or heartbeat < started or (closed is not None and heartbeat > closed)
    ):
        return False
    if deadline is not None and (
        started is None or timeout is None or deadline != started + timeout
    ):
        return False
    return not (started is not None and timeout is not None and deadline is None)


def _expected_chain(row: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    status, code, delivery, dcode = row[4], row[5], row[7], row[8]
    chain: list[tuple[Any, ...]] = [(1, "created", "queued", "created", row[11])]
    if row[12] is not None:
        chain.append((2, "started", "running", "started", row[12]))
    if status in TERMINAL_STATES:
        chain.append((3, "closed", status, code, row[14]))
    if delivery != "pending":
        chain.append((4, "delivery", delivery, dcode, row[15]))
    return chain


def _events_by_task(conn: sqlite3.Connection) -> Iterator[tuple[Any, list[tuple[Any, ...]]]]:
    current: Any = None
    group: list[tuple[Any, ...]] = []
    for task_seq, step, kind, state, code, at in conn.execute(_EVENTS):
        if task_seq != current and group:
            yield current, group
            group = []
        current = task_seq
        group.append((step, kind, state, code, at))
    if group:
        yield current, group


def _cycles(conn: sqlite3.Connection) -> tuple[int, int]:
    """Count parent-order violations and the distinct cycles reachable from them."""
    suspects = conn.execute(
        "SELECT c.id FROM tsg_tasks c JOIN tsg_tasks p ON p.id = c.parent_id "
        "WHERE NOT (p.seq < c.seq AND p.created_at <= c.created_at)"
    ).fetchall()
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
            cycles.add(frozenset(path[path.index(node):]))
    return len(suspects), len(cycles)


def run_doctor(ledger: Ledger) -> dict[str, Any]:
    """Check the whole ledger and return counts only."""
    findings = dict.fromkeys(_FINDINGS, 0)
    task_count = event_count = 0
    with ledger._read() as conn:
        try:
            integrity = [r[0] for r in conn.execute("PRAGMA quick_check")]
            findings["integrity_errors"] = 0 if integrity == ["ok"] else len(integrity)
            violations = conn.execute("PRAGMA foreign_key_check").fetchall()
            findings["foreign_key_violations"] = len(violations)
            version = schema.detect_version(conn, "main")
            findings["schema_mismatch"] = 0 if version in (1, 2) else 1
        except sqlite3.DatabaseError as exc:
            raise translate(exc) from None
        if findings["schema_mismatch"] or findings["integrity_errors"]:
            try:
                task_count = int(conn.execute("SELECT count(*) FROM tsg_tasks").fetchone()[0])
                event_count = int(conn.execute("SELECT count(*) FROM tsg_events").fetchone()[0])
            except sqlite3.Error:
                pass
        else:
            task_count, event_count = _scan(conn, findings)
            findings["parent_order_violations"], findings["parent_cycles"] = _cycles(conn)
    healthy = not any(findings.values())
    return {
        "healthy": healthy,
        "schema_version": version if version in (1, 2) else None,
        "task_count": task_count,
        "event_count": event_count,
        "findings": findings,
    }


def _scan(conn: sqlite3.Connection, findings: dict[str, int]) -> tuple[int, int]:
    task_count = event_count = 0
    events = _events_by_task(conn)
    pending = next(events, None)
    for row in conn.execute(_TASKS):
        task_count += 1
        seq = row[0]
        while pending is not None and pending[0] < seq:
            findings["orphan_events"] += 1
            event_count += len(pending[1])
            pending = next(events, None)
        actual: list[tuple[Any, ...]] = []
        if pending is not None and pending[0] == seq:
            actual = pending[1]
            event_count += len(actual)
            pending = next(events, None)
        ids_ok = _canonical(row[1]) and (row[2] is None or _canonical(row[2]))
        findings["invalid_ids"] += not ids_ok
        state_ok = _state_ok(row)
        findings["invalid_states"] += not state_ok
        findings["invalid_codes"] += not _codes_ok(row)
        times_ok = _times_ok(row)
        findings["invalid_timestamps"] += not times_ok
        findings["event_chain_mismatches"] += actual != _expected_chain(row)
    while pending is not None:
        findings["orphan_events"] += 1
        event_count += len(pending[1])
        pending = next(events, None)
    return task_count, event_count
