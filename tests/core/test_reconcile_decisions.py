"""Reconcile hands its decisions to in-process callers; framework ids that can be traced."""

from __future__ import annotations

import json
import sqlite3
import uuid

import pytest
from core_helpers import Clock, raw_execute, run_cli
from task_state_guard import InvalidInput, Ledger, ReconcileDecision, StateConflict

CELERY_ID = str(uuid.uuid4())


def _ids_absent(text: str, *ids: str) -> None:
    for task_id in ids:
        assert task_id not in text, task_id


def test_decisions_name_each_closed_task_and_delivery(ledger: Ledger, clock: Clock) -> None:
    parent = ledger.create_task(name="app.job", framework_id=CELERY_ID)
    attempt = ledger.create_task(parent_id=parent.id, delivery_required=False, name="app.job")
    ledger.start_task(parent.id, owner=False)
    ledger.start_task(attempt.id, owner=False)
    overdue = ledger.create_task(name="app.report")
    ledger.start_task(overdue.id, owner=False)
    ledger.close_task(overdue.id, "succeeded", code="worker_completed")
    fresh = ledger.create_task()
    clock.advance(700)
    ledger.start_task(fresh.id, owner=False)

    seen: list[ReconcileDecision] = []
    report = ledger.reconcile(delivery_grace_seconds=0, on_decision=seen.append)

    assert report == {
        "active_examined": 3, "tasks_timed_out": 2, "fresh_active_retained": 1,
        "pending_delivery_examined": 3, "deliveries_failed": 2,
        "deliveries_not_applicable": 1, "pending_delivery_retained": 0,
        "dry_run": False, "applied": True,
    }
    by_task = {(d.task_id, d.kind): d for d in seen}
    assert len(seen) == 5 == len(by_task)
    assert by_task[(attempt.id, "task")] == ReconcileDecision(
        "task", attempt.id, parent.id, None, "app.job", "timed_out", "restart_stale"
    )
    assert by_task[(attempt.id, "delivery")].status == "not_applicable"
    assert by_task[(attempt.id, "delivery")].code == "internal_task"
    assert by_task[(parent.id, "task")] == ReconcileDecision(
        "task", parent.id, None, CELERY_ID, "app.job", "timed_out", "restart_stale"
    )
    assert by_task[(parent.id, "delivery")] == ReconcileDecision(
        "delivery", parent.id, None, CELERY_ID, "app.job", "failed", "delivery_grace_expired"
    )
    assert by_task[(overdue.id, "delivery")] == ReconcileDecision(
        "delivery", overdue.id, None, None, "app.report", "failed", "delivery_grace_expired"
    )
    # Newest first, and a task's own close before its delivery's.
    order = [(d.task_id, d.kind) for d in seen]
    assert order.index((attempt.id, "task")) < order.index((attempt.id, "delivery"))
    assert order.index((attempt.id, "task")) < order.index((parent.id, "task"))
    # The pass's writes match what the decisions said.
    assert ledger.get_task(parent.id).terminal_code == "restart_stale"
    assert ledger.get_task(overdue.id).delivery_code == "delivery_grace_expired"
    # The report itself carries counts only.
    _ids_absent(json.dumps(report), parent.id, attempt.id, overdue.id, CELERY_ID)
    assert ledger.doctor()["healthy"]


def test_dry_run_hands_over_what_it_would_decide(ledger: Ledger, clock: Clock) -> None:
    task = ledger.create_task(framework_id=CELERY_ID, name="app.job")
    ledger.start_task(task.id, owner=False)
    clock.advance(700)
    seen: list[ReconcileDecision] = []
    report = ledger.reconcile(dry_run=True, on_decision=seen.append)
    assert report["tasks_timed_out"] == 1 and report["dry_run"] is True
    assert [(d.kind, d.task_id, d.framework_id, d.code) for d in seen] == [
        ("task", task.id, CELERY_ID, "restart_stale")
    ]
    assert ledger.get_task(task.id).status == "running"  # nothing written


def test_no_callback_no_decisions_and_bad_callback_refused(ledger: Ledger, clock: Clock) -> None:
    task = ledger.create_task()
    ledger.start_task(task.id, owner=False)
    clock.advance(700)
    with pytest.raises(InvalidInput):
        ledger.reconcile(on_decision="not callable")  # type: ignore[arg-type]
    assert ledger.get_task(task.id).status == "running"  # bad input changes nothing
    assert ledger.reconcile()["tasks_timed_out"] == 1


def test_callback_error_propagates_after_the_pass_committed(ledger: Ledger, clock: Clock) -> None:
    task = ledger.create_task()
    ledger.start_task(task.id, owner=False)
    clock.advance(700)

    def boom(decision: ReconcileDecision) -> None:
        raise RuntimeError("callback failed")

    with pytest.raises(RuntimeError):
        ledger.reconcile(on_decision=boom)
    assert ledger.get_task(task.id).status == "timed_out"
    assert ledger.doctor()["healthy"]


def test_framework_id_stored_only_as_canonical_uuid(ledger: Ledger) -> None:
    task = ledger.create_task(framework_id=CELERY_ID)
    assert task.framework_id == CELERY_ID
    assert ledger.get_task(task.id).framework_id == CELERY_ID
    assert ledger.get_task(task.id).to_dict(extras=True)["framework_id"] == CELERY_ID
    assert "framework_id" not in ledger.get_task(task.id).to_dict()
    assert ledger.create_task().framework_id is None
    for bad in ("my-custom-id", CELERY_ID.upper(), "thread-42", 42, ""):
        with pytest.raises(InvalidInput):
            ledger.create_task(framework_id=bad)  # type: ignore[arg-type]
    # An identical repeat is a no-op; another framework id is another task.
    assert ledger.create_task(task_id=task.id, framework_id=CELERY_ID) == ledger.get_task(task.id)
    with pytest.raises(StateConflict):
        ledger.create_task(task_id=task.id, framework_id=str(uuid.uuid4()))


def test_cli_get_shows_framework_id(db: str) -> None:
    with Ledger(db) as led:
        task = led.create_task(framework_id=CELERY_ID)
    out = json.loads(run_cli("--db", db, "get", task.id, "--extras").stdout)
    assert out["task"]["framework_id"] == CELERY_ID
    plain = json.loads(run_cli("--db", db, "get", task.id).stdout)
    assert "framework_id" not in plain["task"]
    for aggregate in (("status",), ("doctor",), ("reconcile", "--dry-run"), ("reconcile",)):
        result = run_cli("--db", db, *aggregate)
        _ids_absent(result.stdout + result.stderr, task.id, CELERY_ID)


@pytest.mark.sqlite_only(reason="tampers with the SQLite file (sqlite3)")
def test_doctor_counts_a_tampered_framework_id(db: str) -> None:
    with Ledger(db) as led:
        task = led.create_task(framework_id=CELERY_ID)
        assert led.doctor()["healthy"]
    raw_execute(db, ("UPDATE tsg_tasks SET framework_id = ? WHERE id = ?", ("user data", task.id)))
    with Ledger(db) as led:
        report = led.doctor()
        assert not report["healthy"] and report["invalid_id_count"] == 1
        _ids_absent(json.dumps(report), task.id, "user data")


@pytest.mark.sqlite_only(reason="the SQLite file's layout, read with sqlite3")
def test_v3_schema_has_a_nullable_framework_id(db: str) -> None:
    with Ledger(db) as led:
        led.create_task()
    conn = sqlite3.connect(db)
    try:
        cols = {row[1]: row for row in conn.execute("PRAGMA table_info(tsg_tasks)")}
    finally:
        conn.close()
    assert cols["framework_id"][2] == "TEXT" and cols["framework_id"][3] == 0
