"""Upgrading a ledger written by the published 0.1.0: the file in ``tests/fixtures/`` (see its
README) is copied into a private directory, then opened the way a 0.1.0 user's upgrade would
open it.

A writable open migrates it to the current schema in one transaction; every task reads back with
exactly the values 0.1.0 returned; doctor calls it healthy; reconcile, new transitions and the
CLI work on it. A read-only open (the CLI's dry-run and read commands) leaves it untouched. A
file whose schema is neither ours nor exactly 0.1.0's still fails closed, byte for byte.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from core_helpers import (
    TASK_KEYS,
    Clock,
    assert_cli_error,
    assert_json_line,
    check_report,
    guarded_job,
    run_cli,
    snapshot_entries,
)
from task_state_guard import (
    DeliveryStatus,
    Ledger,
    StateConflict,
    StorageError,
    TaskStatus,
)
from task_state_guard.integration import AdapterRuntime, AttemptSpec, resolve_settings

FIXTURES = Path(__file__).parents[1] / "fixtures"
EXPECTED: dict[str, dict[str, Any]] = json.loads(
    (FIXTURES / "ledger-0.1.0.expected.json").read_text()
)["tasks"]
CLOCK_0 = 1_700_000_000.0  # the fixture's synthetic clock started here
AFTER = CLOCK_0 + 100  # a clock after everything the fixture holds


def fixture_copy(tmp_path: Path, name: str = "d") -> str:
    directory = tmp_path / name
    directory.mkdir(mode=0o700)
    db = directory / "tasks.sqlite"
    shutil.copyfile(FIXTURES / "ledger-0.1.0.sqlite", db)
    os.chmod(db, 0o600)
    return str(db)


def digest(path: str) -> str:
    with open(path, "rb") as handle:
        return hashlib.sha256(handle.read()).hexdigest()


def table_names(db: str) -> list[str]:
    conn = sqlite3.connect(db)  # a plain reader: closes cleanly, leaves no sidecars
    try:
        rows = conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' "
            "ORDER BY name"
        ).fetchall()
        return [r[0] for r in rows]
    finally:
        conn.close()


def test_fixture_is_a_0_1_0_ledger() -> None:
    """Guard the fixture itself: 0.1.0's tables, eight tasks, one per role."""
    assert table_names(str(FIXTURES / "ledger-0.1.0.sqlite")) == [
        "schema_meta", "task_events", "tasks"]
    assert len(EXPECTED) == 8
    assert {t["status"] for t in EXPECTED.values()} == {
        "queued", "running", "succeeded", "failed", "timed_out", "cancelled"}


def test_migration_reads_every_task_back_unchanged(tmp_path: Path) -> None:
    db = fixture_copy(tmp_path)
    with Ledger(db, clock=Clock(AFTER)) as led:
        assert led.schema_version == Ledger.SCHEMA_VERSION == 9
        for role, expected in EXPECTED.items():
            task = led.get_task(expected["id"])
            got = task.to_dict(include_payload_hash=True)
            assert got == expected, role
            for key in ("created_at", "updated_at", "delivery_updated_at"):
                assert type(got[key]) is float, (role, key)
            assert isinstance(task.status, TaskStatus) and task.status.value == expected["status"]
            assert isinstance(task.delivery_status, DeliveryStatus)
            assert task.name is None and task.has_owner is False and task.framework_id is None
        report = led.doctor()
    assert report["healthy"] is True and report["schema_ok"] is True
    assert report["schema_version"] == 9 and report["quick_check"] == "ok"
    assert report["task_count"] == 8 and report["event_count"] == 23
    assert report["task_status_counts"] == {
        "queued": 1, "running": 1, "succeeded": 3, "failed": 1, "timed_out": 1, "cancelled": 1}
    assert report["delivery_status_counts"] == {
        "pending": 5, "delivered": 1, "failed": 1, "not_applicable": 1}
    # Migrated in place to exactly the current layout: 0.1.0's tables are gone.
    assert table_names(db) == ["tsg_events", "tsg_meta", "tsg_tasks", "tsg_totals", "tsg_verdicts"]
    fresh = str(tmp_path / "fresh" / "tasks.sqlite")
    Ledger(fresh).close()
    q = ("SELECT type, name, tbl_name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_%' "
         "ORDER BY name")
    a, b = sqlite3.connect(db), sqlite3.connect(fresh)
    try:
        assert a.execute(q).fetchall() == b.execute(q).fetchall()
    finally:
        a.close()
        b.close()
    # Reopening finds the current schema: nothing migrates twice.
    before = digest(db)
    Ledger(db, clock=Clock(AFTER)).close()
    assert digest(db) == before


def test_running_task_keeps_its_heartbeat(tmp_path: Path) -> None:
    """0.1.0 folded a heartbeat into updated_at; it becomes this version's heartbeat_at, so
    reconcile judges the task's freshness from the same instant."""
    db = fixture_copy(tmp_path)
    running = EXPECTED["running"]
    with Ledger(db, clock=Clock(AFTER)) as led:
        task = led.get_task(running["id"])
        assert task.heartbeat_at == running["updated_at"] == CLOCK_0 + 2
        assert task.to_dict(extras=True)["heartbeat_at"] == CLOCK_0 + 2
        assert led.get_task(EXPECTED["queued"]["id"]).heartbeat_at is None


def test_read_only_access_leaves_the_file_untouched(tmp_path: Path) -> None:
    db = fixture_copy(tmp_path)
    directory = os.path.dirname(db)
    before = snapshot_entries(directory)
    with Ledger(db, read_only=True, clock=Clock(CLOCK_0 + 1000)) as ro:
        assert ro.schema_version == 2  # what 0.1.0 calls its layout; not migrated
        for role, expected in EXPECTED.items():
            assert ro.get_task(expected["id"]).to_dict(include_payload_hash=True) == expected, role
        report = ro.doctor()
        assert report["healthy"] is True and report["task_count"] == 8
        preview = ro.reconcile(active_grace_seconds=600, delivery_grace_seconds=600,
                               dry_run=True)
    check_report(preview, dry_run=True)
    # the running task is past its deadline; failed, timed_out and cancelled deliveries expired
    assert preview["tasks_timed_out"] == 1 and preview["fresh_active_retained"] == 1
    assert preview["deliveries_failed"] == 3 and preview["pending_delivery_retained"] == 1
    cli = run_cli("--db", db, "reconcile", "--dry-run")
    assert cli.code == 0 and assert_json_line(cli)["reconcile"]["tasks_timed_out"] == 1
    doctor = run_cli("--db", db, "doctor")
    assert doctor.code == 0 and assert_json_line(doctor)["healthy"] is True
    got = assert_json_line(run_cli("--db", db, "get", EXPECTED["succeeded_delivered"]["id"]))
    expected = dict(EXPECTED["succeeded_delivered"])
    expected.pop("payload_hash")  # the CLI prints only has_payload_hash
    assert got == {"ok": True, "task": expected}
    assert snapshot_entries(directory) == before  # transient sidecars came and went
    assert table_names(db) == ["schema_meta", "task_events", "tasks"]


def test_reconcile_and_new_transitions_after_the_upgrade(tmp_path: Path) -> None:
    db = fixture_copy(tmp_path)
    clock = Clock(AFTER)
    ids = {role: t["id"] for role, t in EXPECTED.items()}
    with Ledger(db, clock=clock) as led:
        # the migrated running task heartbeats (no version change) and closes (+1)
        beat = led.heartbeat(ids["running"])
        assert beat.version == EXPECTED["running"]["version"] and beat.updated_at == AFTER
        closed = led.close_task(ids["running"], "succeeded", code="worker_completed")
        assert closed.version == EXPECTED["running"]["version"] + 1 and closed.ended_at == AFTER
        # the queued one starts with an owner, gets a child and a delivery
        started = led.start_task(ids["queued"])
        assert started.status == "running" and started.deadline_at == AFTER + 300
        assert started.version == 1 and started.has_owner
        child = led.create_task(parent_id=ids["queued"], delivery_required=False)
        assert child.version == 0 and child.delivery_updated_at == child.created_at == AFTER
        # a terminal 0.1.0 task: a repeat is idempotent, a conflict is refused
        again = led.close_task(ids["failed_pending_delivery"], "failed", code="worker_lost")
        assert again.to_dict(include_payload_hash=True) == EXPECTED["failed_pending_delivery"]
        with pytest.raises(StateConflict):
            led.close_task(ids["failed_pending_delivery"], "succeeded")
        delivered = led.set_delivery(ids["failed_pending_delivery"], "failed",
                                     code="transport_failed")
        assert delivered.version == 3 and delivered.delivery_updated_at == AFTER
        assert delivered.updated_at == EXPECTED["failed_pending_delivery"]["updated_at"]
        clock.advance(1000)
        report = led.reconcile(active_grace_seconds=600, delivery_grace_seconds=600)
        check_report(report, dry_run=False)
        assert report["tasks_timed_out"] == 1  # the started queued task: its 300 s are over
        assert led.get_task(ids["queued"]).terminal_code == "deadline_exceeded"
        assert led.get_task(ids["timed_out"]).delivery_status == "failed"
        assert led.get_task(ids["cancelled_from_queue"]).delivery_code == (
            "delivery_grace_expired")
        doctor = led.doctor()
        assert doctor["healthy"] is True, doctor
        assert doctor["task_count"] == 9
    # the CLI on the upgraded file
    out = assert_json_line(run_cli("--db", db, "delivery", ids["queued"], "--status",
                                   "failed", "--code", "transport_failed"))
    assert out["ok"] is True and set(out["task"]) == TASK_KEYS
    assert out["task"]["delivery_status"] == "failed" and out["task"]["version"] == 3
    doctor_line = run_cli("--db", db, "doctor")
    assert doctor_line.code == 0 and assert_json_line(doctor_line)["healthy"] is True
    status = assert_json_line(run_cli("--db", db, "status"))["status"]
    assert sum(status["tasks"].values()) == 9


def test_a_guarded_job_on_the_upgraded_file_writes_what_a_fresh_ledger_writes(
    tmp_path: Path,
) -> None:
    """The upgraded file has the current layout's insert of rows already running: *begin
    attempt* and *end attempt* on it store the tasks and event chains (created then started,
    at the same instant) a fresh ledger stores."""
    db = fixture_copy(tmp_path)
    with Ledger(db, clock=(clock := Clock(AFTER))) as led:
        upgraded = guarded_job(led, clock)
        assert led.doctor()["healthy"] is True
    with Ledger(str(tmp_path / "fresh" / "tasks.sqlite"), clock=(clock := Clock(AFTER))) as led:
        assert guarded_job(led, clock) == upgraded
    logical, first, retry = upgraded
    assert [e[:3] for e in first[1]] == [("created", "queued", "created"),
                                         ("started", "running", "started"),
                                         ("closed", "failed", "retry_scheduled"),
                                         ("delivery", "not_applicable", "internal_task")]
    assert first[1][0][3] == first[1][1][3] == AFTER and first[0]["version"] == 3
    assert logical[1][0][3] == logical[1][1][3] == AFTER and len(logical[1]) == 4
    assert retry[1][1][3] == AFTER + 2  # created queued at the retry's schedule, started later


def test_the_upgraded_file_has_the_verdict_outbox(tmp_path: Path) -> None:
    """0.1.0's own tasks owe no framework anything (no adapter opened them, even the one a
    reconcile times out); a job an adapter opens on the upgraded file owes its framework a
    verdict once a reconcile finds it lost."""
    db = fixture_copy(tmp_path)
    clock = Clock(AFTER)
    with Ledger(db, clock=clock) as led:
        settings = resolve_settings(db_required=False, heartbeat_seconds=0)
        runtime = AdapterRuntime(settings, logger=logging.getLogger("test"), ledger=led,
                                 framework="celery")
        job = "00000000-0000-4000-8000-0000000000aa"
        runtime.open_logical(job, delivery_required=True, name="app.job")
        runtime.claim_attempt(AttemptSpec(job, "app.job"))
        clock.advance(1000)
        report = led.reconcile(active_grace_seconds=600, delivery_grace_seconds=600)
        assert report["tasks_timed_out"] == 3  # the job, its attempt, and 0.1.0's running one
        assert [v.task_id for v in led.claim_verdicts("celery")] == [job]
        assert led.status()["verdicts"]["pending"]["celery"] == 1
        assert led.doctor()["healthy"] is True


def test_the_cli_apply_path_migrates_too(tmp_path: Path) -> None:
    db = fixture_copy(tmp_path)
    result = run_cli("--db", db, "reconcile", "--active-grace-seconds", "600",
                     "--delivery-grace-seconds", "600")
    report = assert_json_line(result)["reconcile"]
    assert result.code == 0 and report["tasks_timed_out"] == 1
    assert table_names(db) == ["tsg_events", "tsg_meta", "tsg_tasks", "tsg_totals", "tsg_verdicts"]
    init = assert_json_line(run_cli("--db", db, "init"))
    assert init["storage"]["schema_version"] == 9


def _tampered(db: str, *statements: str) -> None:
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        conn.execute("BEGIN")
        for statement in statements:
            conn.execute(statement)
        conn.execute("COMMIT")
    finally:
        conn.close()


@pytest.mark.parametrize(
    "statements",
    [
        ["CREATE INDEX extra ON tasks(created_at)"],
        ["CREATE TABLE notes(body TEXT)"],
        ["UPDATE schema_meta SET value = '3' WHERE key = 'schema_version'"],
        ["UPDATE schema_meta SET value = '00' WHERE key = 'schema_fingerprint'"],
        ["INSERT INTO schema_meta(key, value) VALUES ('host', 'x')"],
        ["DROP INDEX tasks_status_idx"],
    ],
    ids=["extra-index", "extra-table", "meta-version", "meta-fingerprint", "meta-extra-key",
         "missing-index"],
)
def test_a_schema_that_is_neither_ours_nor_0_1_0_fails_closed(
    tmp_path: Path, statements: list[str]
) -> None:
    db = fixture_copy(tmp_path)
    _tampered(db, *statements)
    before = digest(db)
    for read_only in (False, True):
        with pytest.raises(StorageError):
            Ledger(db, read_only=read_only)
    for args in (["init"], ["reconcile", "--dry-run"], ["get", EXPECTED["queued"]["id"]]):
        assert_cli_error(run_cli("--db", db, *args), "StateConflict")
    # --explain changes no report; an internal error would name its class (seen once, under load)
    doctor = run_cli("--explain", "--db", db, "doctor")
    assert doctor.code == 1 and assert_json_line(doctor)["schema_ok"] is False
    assert digest(db) == before
    assert "schema_meta" in table_names(db)


@pytest.mark.parametrize(
    "statement",
    [
        # an event this version cannot carry: the migration refuses and changes nothing
        "UPDATE task_events SET code = 'resumed' WHERE event_kind = 'task_transition' "
        "AND to_value = 'running' AND sequence = 3",
        # a reason outside the registry
        "UPDATE tasks SET terminal_code = 'because the worker said so' WHERE status = 'failed'",
    ],
    ids=["unknown-event", "legacy-reason"],
)
def test_data_the_migration_cannot_carry_fails_closed_in_one_piece(
    tmp_path: Path, statement: str
) -> None:
    db = fixture_copy(tmp_path)
    _tampered(db, statement)
    before = digest(db)
    with pytest.raises(StorageError):
        Ledger(db)
    assert_cli_error(run_cli("--db", db, "init"), "StateConflict")
    # rolled back as one transaction: still exactly the 0.1.0 file
    assert digest(db) == before
    assert table_names(db) == ["schema_meta", "task_events", "tasks"]
