"""Doctor: counts only, exit 0 healthy / 1 unhealthy, and tamper fixtures written with a raw
sqlite3 connection; no task id ever appears in the output."""

from __future__ import annotations

import math
import sqlite3
from typing import Any

import pytest
from core_helpers import (
    T0,
    Clock,
    assert_cli_error,
    assert_json_line,
    contradicted_jobs,
    insert_event,
    raw_execute,
    run_cli,
)
from task_state_guard import Ledger

COUNT_KEYS = {
    "integrity_error_count", "foreign_key_violation_count", "invalid_id_count",
    "invalid_value_count", "invalid_state_count", "invalid_code_count",
    "invalid_timestamp_count", "parent_order_violation_count", "parent_cycle_count",
    "event_chain_mismatch_count", "orphan_event_count", "verdict_mismatch_count",
    "unexpected_schema_object_count",
}
REPORT_KEYS = COUNT_KEYS | {
    "healthy", "schema_version", "schema_ok", "quick_check", "task_count", "event_count",
    "task_status_counts", "delivery_status_counts", "warnings", "checks_not_run",
}
#: What doctor counts without calling the ledger unhealthy.
WARNING_KEYS = {"contradicted_close_count"}


def build(db: str) -> dict[str, str]:
    """A small healthy ledger with every kind of task; returns role -> id."""
    clock = Clock()
    with Ledger(db, clock=clock) as led:
        ids = {}
        ids["queued"] = led.create_task(name="q").id
        r = led.create_task(timeout_seconds=500)
        led.start_task(r.id, owner=False)
        clock.advance(5)
        led.heartbeat(r.id)
        ids["running"] = r.id
        root = led.create_task()
        ids["root"] = root.id
        clock.advance(1)
        child = led.create_task(parent_id=root.id, delivery_required=False)
        ids["child"] = child.id
        led.start_task(child.id, owner=False)
        clock.advance(1)
        led.close_task(child.id, "succeeded", code="worker_completed")
        led.set_delivery(child.id, "not_applicable", code="internal_task")
        led.close_task(root.id, "succeeded", code="completed")
        clock.advance(1)
        led.set_delivery(root.id, "delivered", code="transport_acknowledged")
        leaf = led.create_task()
        led.close_task(leaf.id, "cancelled", code="caller_cancelled")
        ids["leaf"] = leaf.id
        report = led.doctor()
        assert report["healthy"] is True
    return ids


def cli_doctor(db: str, ids: dict[str, str], expect_code: int) -> dict:
    result = run_cli("--db", db, "doctor")
    payload = assert_json_line(result)
    assert result.code == expect_code
    for tid in ids.values():
        assert tid not in result.stdout
        assert tid.upper() not in result.stdout
        assert tid.replace("-", "") not in result.stdout
    return payload


def test_healthy_doctor(db: str) -> None:
    ids = build(db)
    report = cli_doctor(db, ids, 0)  # the report's keys at the top level of the line
    assert set(report) == REPORT_KEYS | {"ok"}
    assert report["ok"] is True and report["healthy"] is True
    assert report["task_count"] == 5
    assert report["event_count"] == 1 + 2 + 3 + 4 + 2
    assert Ledger.SCHEMA_VERSION == 9  # each backend reports its own layout:
    postgres = db.startswith("postgresql:")
    assert report["schema_version"] == (10 if postgres else 9)  # SQLite 9, PostgreSQL 10
    assert report["schema_ok"] is True and report["quick_check"] == "ok"
    assert all(type(report[k]) is int and report[k] == 0 for k in COUNT_KEYS)
    assert report["warnings"] == dict.fromkeys(WARNING_KEYS, 0)
    assert report["task_status_counts"] == {
        "queued": 1, "running": 1, "succeeded": 2, "failed": 0, "timed_out": 0, "cancelled": 1,
    }
    assert report["delivery_status_counts"] == {
        "pending": 3, "delivered": 1, "failed": 0, "not_applicable": 1,
    }
    with Ledger(db) as led:
        api = led.doctor()
    assert api == {k: v for k, v in report.items() if k != "ok"}


def test_retained_history_is_still_healthy(db: str) -> None:
    ids = build(db)
    with Ledger(db, clock=Clock(T0 + 10**8)) as led:
        assert led.doctor()["healthy"] is True
    assert cli_doctor(db, ids, 0)["healthy"] is True


def test_attempts_that_contradict_a_close_are_a_warning_not_a_finding(db: str) -> None:
    """A job closed other than succeeded with an attempt that succeeded after the close (a
    revoked Celery id that ran anyway, a job closed lost whose message came back): the records
    obey every rule, so doctor stays healthy (exit 0) and counts the jobs under ``warnings``;
    ``tsg tasks --contradicted`` names them."""
    clock = Clock()
    with Ledger(db, clock=clock) as led:
        ids = contradicted_jobs(led, clock)
    report = cli_doctor(db, ids, 0)
    assert report["healthy"] is True and set(report) == REPORT_KEYS | {"ok"}
    assert all(report[k] == 0 for k in COUNT_KEYS)
    assert report["warnings"] == {"contradicted_close_count": 2}
    with Ledger(db, read_only=True) as led:
        assert led.doctor()["warnings"] == {"contradicted_close_count": 2}
    text = run_cli("--db", db, "doctor", "--format", "text")
    assert text.code == 0 and text.stdout.startswith("DOCTOR: healthy\n")
    warnings = text.stdout[text.stdout.index("WARNINGS"):].splitlines()
    assert warnings[1].split() == ["jobs", "whose", "attempts", "contradict", "their", "close",
                                   "2"]
    assert all(tid not in text.stdout for tid in ids.values())
    # The operator finds them: the jobs, or the attempts that contradict their close.
    for args, expected in (
        ([], [ids["revoked"], ids["lost"]]),
        (["--status", "timed_out"], [ids["lost"]]),
        (["--attempts"], [ids["revoked_success"], ids["lost_success"]]),
        (["--celery", "not-one-of-these"], []),
    ):
        listed = assert_json_line(run_cli("--db", db, "tasks", "--contradicted", "--details",
                                          *args))
        assert [row["id"] for row in listed["tasks"]] == expected, args
    rows = run_cli("--db", db, "tasks", "--contradicted", "--format", "text")
    assert rows.code == 0 and ids["revoked"] in rows.stdout and ids["parts"] not in rows.stdout
    # Rows only: the id list refuses it (as it does --attempts), whatever else is given.
    refused = run_cli("--explain", "--db", db, "tasks", "--status", "cancelled",
                      "--contradicted")
    assert_cli_error(refused, "InvalidInput", reason="missing_argument")


def test_a_success_before_a_lost_close_contradicts_nothing(db: str) -> None:
    """A job reconciled lost after one of its attempts (a part of it) succeeded is not
    counted; the contradicted closes stay as they were (a close is never rewritten)."""
    clock = Clock()
    with Ledger(db, clock=clock) as led:
        ids = contradicted_jobs(led, clock)
        close = ("status", "terminal_code", "ended_at")
        before = [led.get_task(ids["revoked"]).to_dict()[k] for k in close]
        clock.advance(10)
        led.reconcile(active_grace_seconds=5, delivery_grace_seconds=5)
        lost = led.get_task(ids["open"])
        assert (lost.status.value, lost.terminal_code) == ("timed_out", "restart_stale")
        assert [led.get_task(ids["revoked"]).to_dict()[k] for k in close] == before
        report = led.doctor()
    assert report["healthy"] is True
    assert report["warnings"] == {"contradicted_close_count": 2}


TAMPERS: dict[str, Any] = {
    "schema_extra_index": ["CREATE INDEX sneaky ON tsg_tasks(terminal_code)"],
    "schema_extra_column": ["ALTER TABLE tsg_tasks ADD COLUMN prompt TEXT"],
    "schema_extra_table": ["CREATE TABLE tsg_notes(body TEXT)"],
    "schema_meta_version": ["UPDATE tsg_meta SET value = '10' WHERE key = 'schema_version'"],
    "schema_meta_extra_key": ["INSERT INTO tsg_meta(key, value) VALUES ('host', 'x')"],
    "event_deleted": [
        "DELETE FROM tsg_events WHERE kind = 'started' AND task_seq = "
        "(SELECT seq FROM tsg_tasks WHERE status = 'running')"
    ],
    "event_deleted_created": [
        "DELETE FROM tsg_events WHERE kind = 'created' AND task_seq = "
        "(SELECT seq FROM tsg_tasks WHERE status = 'queued')"
    ],
    "event_extra": lambda conn: insert_event(
        conn,
        conn.execute("SELECT seq FROM tsg_tasks WHERE status = 'queued'").fetchone()[0],
        "closed", "succeeded", "completed", T0 + 3,
    ),
    "event_altered_time": [
        "UPDATE tsg_events SET at = at + 1 WHERE kind = 'delivery' AND state = 'delivered'"
    ],
    "event_altered_code": [
        "UPDATE tsg_events SET code = 'worker_completed' WHERE code = 'completed'"
    ],
    "event_altered_state": [
        "UPDATE tsg_events SET state = 'failed' WHERE kind = 'closed' AND state = 'cancelled'"
    ],
    "event_orphan": lambda conn: insert_event(conn, 999, "created", "queued", "created", T0),
    "timestamp_disorder_closed_before_start": [
        "UPDATE tsg_tasks SET ended_at = started_at - 100 WHERE status = 'succeeded' "
        "AND started_at IS NOT NULL"
    ],
    "timestamp_disorder_heartbeat_before_start": [
        "UPDATE tsg_tasks SET heartbeat_at = started_at - 1 WHERE status = 'running'"
    ],
    "timestamp_disorder_updated_before_created": [
        "UPDATE tsg_tasks SET updated_at = created_at - 1 WHERE status = 'queued'"
    ],
    "timestamp_deadline_mismatch": [
        "UPDATE tsg_tasks SET deadline_at = deadline_at + 1 WHERE status = 'running'"
    ],
    "timestamp_non_finite_inf": [
        ("UPDATE tsg_tasks SET heartbeat_at = ? WHERE status = 'running'", (math.inf,))
    ],
    "timestamp_non_finite_neg_inf": [
        ("UPDATE tsg_tasks SET created_at = ? WHERE status = 'queued'", (-math.inf,))
    ],
    "timestamp_text": ["UPDATE tsg_tasks SET ended_at = 'yesterday' WHERE status = 'cancelled'"],
    "timestamp_pending_delivery_moved": [
        "UPDATE tsg_tasks SET delivery_updated_at = created_at + 1 WHERE status = 'queued'"
    ],
    "timestamp_delivery_before_end": [
        "UPDATE tsg_tasks SET delivery_updated_at = created_at WHERE delivery_status = "
        "'delivered'"
    ],
    "event_version_below_changes": [
        "UPDATE tsg_tasks SET version = 1 WHERE delivery_status = 'delivered'"
    ],
    "event_version_text": ["UPDATE tsg_tasks SET version = 'two' WHERE status = 'running'"],
    "parent_cycle": [
        "UPDATE tsg_tasks SET parent_id = (SELECT id FROM tsg_tasks c WHERE c.parent_id = "
        "tsg_tasks.id) WHERE parent_id IS NULL AND status = 'succeeded'"
    ],
    "parent_self_cycle": [
        "UPDATE tsg_tasks SET parent_id = id WHERE status = 'cancelled'"
    ],
    "parent_order": [
        "UPDATE tsg_tasks SET created_at = created_at + 100 WHERE parent_id IS NULL "
        "AND status = 'succeeded'"
    ],
    "non_canonical_id_upper": ["UPDATE tsg_tasks SET id = upper(id) WHERE status = 'cancelled'"],
    "non_canonical_id_braces": [
        "UPDATE tsg_tasks SET id = '{' || id || '}' WHERE status = 'queued'"
    ],
    "non_canonical_id_text": ["UPDATE tsg_tasks SET id = 'task-1' WHERE status = 'running'"],
    "bad_state_running_delivered": [
        "UPDATE tsg_tasks SET delivery_status = 'delivered', delivery_updated_at = updated_at "
        "WHERE status = 'running'"
    ],
    "bad_state_terminal_without_closed_at": [
        "UPDATE tsg_tasks SET ended_at = NULL WHERE status = 'cancelled'"
    ],
    "bad_state_delivering_not_applicable": [
        "UPDATE tsg_tasks SET delivery_status = 'not_applicable' WHERE delivery_status = "
        "'delivered'"
    ],
    "bad_state_queued_with_owner": [
        "UPDATE tsg_tasks SET owner = 'ffffffffffffffffffffffffffffffff' WHERE status = 'queued'"
    ],
    "bad_code_for_state": [
        "UPDATE tsg_tasks SET terminal_code = 'revoked' WHERE terminal_code = 'completed'"
    ],
    "bad_name_free_text": ["UPDATE tsg_tasks SET name = 'free text here' WHERE name = 'q'"],
    "bad_payload_hash": ["UPDATE tsg_tasks SET payload_hash = 'abc' WHERE status = 'queued'"],
    "foreign_key_dangling_parent": [
        "PRAGMA foreign_keys=OFF",
        "UPDATE tsg_tasks SET parent_id = '99999999-9999-4999-8999-999999999999' "
        "WHERE status = 'cancelled'",
    ],
}


@pytest.mark.sqlite_only(reason="tampers with the SQLite file (sqlite3)")
@pytest.mark.parametrize("name", sorted(TAMPERS))
def test_tamper_makes_doctor_unhealthy(tmp_path, name: str) -> None:
    db = str(tmp_path / "d" / "tasks.sqlite")
    ids = build(db)
    statements = TAMPERS[name]
    if callable(statements):
        conn = sqlite3.connect(db, isolation_level=None)
        try:
            conn.execute("BEGIN")
            statements(conn)
            conn.execute("COMMIT")
        finally:
            conn.close()
        statements = []
    pragmas = [s for s in statements if isinstance(s, str) and s.startswith("PRAGMA")]
    rest = [s for s in statements if s not in pragmas]
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        for pragma in pragmas:
            conn.execute(pragma)
        conn.execute("BEGIN")
        for statement in rest:
            if isinstance(statement, tuple):
                cur = conn.execute(*statement)
            else:
                cur = conn.execute(statement)
            assert cur.rowcount != 0, f"tamper {name} changed nothing"
        conn.execute("COMMIT")
    finally:
        conn.close()
    report = cli_doctor(db, ids, 1)
    assert report["ok"] is False
    assert report["healthy"] is False
    for key in COUNT_KEYS:  # a count, or None for a check that could not run (and why)
        assert (type(report[key]) is int and report[key] >= 0) or (
            report[key] is None and report["checks_not_run"][key] == "schema_not_recognized")
    if name.startswith("schema"):
        assert report["schema_ok"] is False and report["schema_version"] is None
        if report["task_count"] is None:
            # no rule can be checked on a layout this release does not know: nothing reads 0
            # (the schema itself was read: its objects are compared, the rules are not)
            assert report["invalid_state_count"] is None
            assert set(report["checks_not_run"]) >= COUNT_KEYS - {
                "integrity_error_count", "unexpected_schema_object_count"}
        else:  # every object of a known layout is there (plus others): its rows were checked
            assert report["checks_not_run"] == {}
            assert report["invalid_state_count"] is not None
    else:
        assert report["checks_not_run"] == {}
        assert sum(report[k] for k in COUNT_KEYS) >= 1
    if name.startswith("schema"):
        pass
    elif name.startswith("parent_cycle") or name == "parent_self_cycle":
        assert report["parent_cycle_count"] >= 1
    elif name.startswith("non_canonical"):
        assert report["invalid_id_count"] >= 1
    elif name.startswith("timestamp"):
        assert report["invalid_timestamp_count"] >= 1
    elif name.startswith("event"):
        assert report["event_chain_mismatch_count"] + report["orphan_event_count"] >= 1
    elif name.startswith("bad_state"):
        assert report["invalid_state_count"] >= 1


@pytest.mark.sqlite_only(reason="tampers with the SQLite file (sqlite3)")
def test_api_doctor_reports_tamper_without_ids(tmp_path) -> None:
    db = str(tmp_path / "d" / "tasks.sqlite")
    ids = build(db)
    raw_execute(db, "UPDATE tsg_tasks SET id = upper(id) WHERE status = 'cancelled'",
                "DELETE FROM tsg_events WHERE kind = 'delivery'")
    with Ledger(db, clock=Clock()) as led:
        report = led.doctor()
    assert report["healthy"] is False
    assert report["invalid_id_count"] == 1
    assert report["event_chain_mismatch_count"] == 2
    text = repr(report)
    for tid in ids.values():
        assert tid not in text and tid.upper() not in text


@pytest.mark.sqlite_only(reason="the SQLite directory's entries and sidecars")
def test_doctor_is_read_only(tmp_path) -> None:
    from core_helpers import sidecars, snapshot_entries

    db = str(tmp_path / "d" / "tasks.sqlite")
    ids = build(db)
    raw_execute(db, "DELETE FROM tsg_events WHERE kind = 'started'")
    before = snapshot_entries(str(tmp_path / "d"))
    cli_doctor(db, ids, 1)
    cli_doctor(db, ids, 1)
    assert snapshot_entries(str(tmp_path / "d")) == before
    assert sidecars(db) == []
