"""Reconcile: nine keys, invariants, inclusive boundaries, queued work, dry-run == apply at the
same clock, parent freshness, one corrupt row, and the snapshot-before-clock rule."""

from __future__ import annotations

import math
import sqlite3
from typing import Any

import pytest
from core_helpers import T0, Clock, check_report, raw_execute, without_counts_flags
from task_state_guard import (
    InvalidInput,
    Ledger,
    ReconcilePolicy,
    StorageError,
    reconcile_restart,
)

GRACE = ReconcilePolicy(active_grace_seconds=600, delivery_grace_seconds=600)


def preview_then_apply(ledger: Ledger, policy: ReconcilePolicy = GRACE) -> dict:
    """Dry-run and apply at the same clock; they must agree on every count."""
    preview = reconcile_restart(ledger, policy, dry_run=True)
    check_report(preview, dry_run=True)
    applied = reconcile_restart(ledger, policy)
    check_report(applied, dry_run=False)
    assert without_counts_flags(preview) == without_counts_flags(applied)
    return applied


def test_empty_ledger_report(ledger: Ledger) -> None:
    report = ledger.reconcile()
    check_report(report, dry_run=False)
    assert without_counts_flags(report) == dict.fromkeys(
        without_counts_flags(report), 0
    )
    check_report(ledger.reconcile(dry_run=True), dry_run=True)


def test_default_policy_is_600_600(ledger: Ledger, clock: Clock) -> None:
    task = ledger.create_task()
    ledger.start_task(task.id, owner=False)
    clock.advance(599)
    assert ledger.reconcile()["tasks_timed_out"] == 0
    clock.advance(1)
    assert ledger.reconcile()["tasks_timed_out"] == 1
    assert ReconcilePolicy() == ReconcilePolicy(600.0, 600.0)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"active_grace_seconds": -1},
        {"delivery_grace_seconds": float("nan")},
        {"active_grace_seconds": float("inf")},
        {"active_grace_seconds": "600"},
        {"delivery_grace_seconds": None},
    ],
)
def test_policy_validation(kwargs: dict) -> None:
    with pytest.raises(InvalidInput):
        ReconcilePolicy(**kwargs)


def test_reconcile_argument_validation(ledger: Ledger) -> None:
    with pytest.raises(InvalidInput):
        reconcile_restart(ledger, {"active_grace_seconds": 1}, dry_run=True)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput):
        reconcile_restart(ledger, GRACE, dry_run="yes")  # type: ignore[arg-type]


@pytest.mark.parametrize("heartbeat", [False, True])
def test_active_grace_boundary_is_inclusive(ledger: Ledger, clock: Clock, heartbeat: bool) -> None:
    task = ledger.create_task()
    ledger.start_task(task.id, owner=False)
    if heartbeat:
        clock.advance(250)
        ledger.heartbeat(task.id)
    last = clock.t
    clock.set(last + 599.5)
    report = preview_then_apply(ledger)
    assert report["tasks_timed_out"] == 0 and report["fresh_active_retained"] == 1
    assert ledger.get_task(task.id).status == "running"
    clock.set(last + 600)  # exactly at the grace
    report = preview_then_apply(ledger)
    assert report["tasks_timed_out"] == 1 and report["active_examined"] == 1
    closed = ledger.get_task(task.id)
    assert closed.status == "timed_out" and closed.terminal_code == "restart_stale"
    assert closed.ended_at == clock.t and closed.delivery_status == "pending"
    assert ledger.doctor()["healthy"] is True


def test_deadline_boundary_is_inclusive(ledger: Ledger, clock: Clock) -> None:
    task = ledger.create_task(timeout_seconds=120)
    started = ledger.start_task(task.id, owner=False)
    assert started.deadline_at == T0 + 120
    policy = ReconcilePolicy(active_grace_seconds=10**6, delivery_grace_seconds=600)
    clock.set(T0 + 119.5)
    ledger.heartbeat(task.id)
    assert preview_then_apply(ledger, policy)["tasks_timed_out"] == 0
    clock.set(T0 + 120)
    report = preview_then_apply(ledger, policy)
    assert report["tasks_timed_out"] == 1
    closed = ledger.get_task(task.id)
    assert closed.status == "timed_out" and closed.terminal_code == "deadline_exceeded"


@pytest.mark.parametrize("required", [True, False])
def test_delivery_grace_boundary_is_inclusive(ledger: Ledger, clock: Clock, required: bool) -> None:
    task = ledger.create_task(delivery_required=required)
    ledger.close_task(task.id, "succeeded", code="completed")
    clock.set(T0 + 599.5)
    report = preview_then_apply(ledger)
    assert report["pending_delivery_examined"] == 1
    assert report["pending_delivery_retained"] == 1
    clock.set(T0 + 600)
    report = preview_then_apply(ledger)
    assert report["pending_delivery_examined"] == 1
    closed = ledger.get_task(task.id)
    if required:
        assert report["deliveries_failed"] == 1 and report["deliveries_not_applicable"] == 0
        assert (closed.delivery_status, closed.delivery_code) == (
            "failed", "delivery_grace_expired")
    else:
        assert report["deliveries_not_applicable"] == 1 and report["deliveries_failed"] == 0
        assert (closed.delivery_status, closed.delivery_code) == (
            "not_applicable", "internal_task")
    assert closed.delivery_updated_at == clock.t
    clock.advance(10**6)
    again = preview_then_apply(ledger)
    assert again["pending_delivery_examined"] == 0
    assert ledger.doctor()["healthy"] is True


@pytest.mark.parametrize("delivery_grace", [0, 600])
def test_timed_out_task_delivery_in_same_pass(ledger: Ledger, clock: Clock, delivery_grace) -> None:
    delivering = ledger.create_task()
    internal = ledger.create_task(delivery_required=False)
    for t in (delivering, internal):
        ledger.start_task(t.id, owner=False)
    clock.advance(10_000)
    policy = ReconcilePolicy(active_grace_seconds=600, delivery_grace_seconds=delivery_grace)
    report = preview_then_apply(ledger, policy)
    assert report["tasks_timed_out"] == 2 and report["pending_delivery_examined"] == 2
    if delivery_grace == 0:
        assert report["deliveries_failed"] == 1 and report["deliveries_not_applicable"] == 1
        assert ledger.get_task(delivering.id).delivery_status == "failed"
        assert ledger.get_task(internal.id).delivery_status == "not_applicable"
    else:
        # The delivery somebody is owed waits for its grace; the one nobody is owed closes with
        # the task (an attempt or an internal task has no delivery anyone could confirm).
        assert report["pending_delivery_retained"] == 1
        assert report["deliveries_not_applicable"] == 1 and report["deliveries_failed"] == 0
        assert ledger.get_task(delivering.id).delivery_status == "pending"
        closed = ledger.get_task(internal.id)
        assert (closed.delivery_status, closed.delivery_code) == ("not_applicable",
                                                                  "internal_task")
        assert ledger.status()["deliveries_awaiting"] == {"owed": 1, "internal": 0}
    assert ledger.doctor()["healthy"] is True


def test_an_attempt_timed_out_by_reconcile_owes_nothing_at_once(
    ledger: Ledger, clock: Clock
) -> None:
    """A crashed worker's attempt: timed out and its delivery settled in the same pass, while the
    parent that owes a delivery keeps its grace (`tsg status` shows no internal delivery
    awaiting after the crash)."""
    parent = ledger.create_task()
    ledger.start_task(parent.id, owner=False)
    attempt = ledger.create_task(parent_id=parent.id, delivery_required=False)
    ledger.start_task(attempt.id, owner=False)
    clock.advance(10_000)
    decisions: list[Any] = []
    policy = ReconcilePolicy(active_grace_seconds=600, delivery_grace_seconds=600)
    report = ledger.reconcile(policy, on_decision=decisions.append)
    assert (report["tasks_timed_out"], report["deliveries_not_applicable"],
            report["pending_delivery_retained"]) == (2, 1, 1)
    assert [(d.kind, d.task_id, d.status) for d in decisions] == [
        ("task", attempt.id, "timed_out"), ("delivery", attempt.id, "not_applicable"),
        ("task", parent.id, "timed_out")]
    assert [e.kind for e in ledger.events_of(attempt.id)] == [
        "created", "started", "closed", "delivery"]
    assert ledger.status()["deliveries_awaiting"] == {"owed": 1, "internal": 0}
    again = ledger.reconcile(policy)
    assert again["deliveries_not_applicable"] == 0 and again["pending_delivery_examined"] == 1
    assert ledger.doctor()["healthy"] is True


def test_queued_never_times_out(ledger: Ledger, clock: Clock) -> None:
    tasks = [ledger.create_task(timeout_seconds=1) for _ in range(3)]
    zero = ReconcilePolicy(active_grace_seconds=0, delivery_grace_seconds=0)
    for jump in (1, 10**4, 10**9):
        clock.advance(jump)
        report = preview_then_apply(ledger, zero)
        assert report["tasks_timed_out"] == 0 and report["fresh_active_retained"] == 3
    assert all(ledger.get_task(t.id).status == "queued" for t in tasks)


def test_mixed_ledger_counts_and_idempotent_recheck(ledger: Ledger, clock: Clock) -> None:
    queued = ledger.create_task()
    overdue = ledger.create_task(timeout_seconds=120)
    ledger.start_task(overdue.id, owner=False)
    fresh = ledger.create_task()
    ledger.start_task(fresh.id, owner=False)
    delivering = ledger.create_task()
    child = ledger.create_task(parent_id=delivering.id, delivery_required=False)
    ledger.close_task(child.id, "succeeded", code="worker_completed")
    ledger.close_task(delivering.id, "succeeded", code="worker_completed")
    clock.advance(300)
    ledger.heartbeat(fresh.id)
    clock.advance(400)
    policy = ReconcilePolicy(active_grace_seconds=600, delivery_grace_seconds=500)
    first = preview_then_apply(ledger, policy)
    assert without_counts_flags(first) == {
        "active_examined": 3,
        "tasks_timed_out": 1,
        "fresh_active_retained": 2,
        "pending_delivery_examined": 3,
        "deliveries_failed": 1,
        "deliveries_not_applicable": 1,
        "pending_delivery_retained": 1,
    }
    second = preview_then_apply(ledger, policy)
    assert without_counts_flags(second) == {
        "active_examined": 2,
        "tasks_timed_out": 0,
        "fresh_active_retained": 2,
        "pending_delivery_examined": 1,
        "deliveries_failed": 0,
        "deliveries_not_applicable": 0,
        "pending_delivery_retained": 1,
    }
    assert ledger.get_task(queued.id).status == "queued"
    assert ledger.get_task(fresh.id).status == "running"
    assert ledger.get_task(overdue.id).terminal_code == "deadline_exceeded"
    assert ledger.doctor() == {**ledger.doctor(), "healthy": True, "task_count": 5}


def test_reconcile_writes_one_event_per_change(ledger: Ledger, clock: Clock) -> None:
    tasks = [ledger.create_task() for _ in range(4)]
    for t in tasks:
        ledger.start_task(t.id, owner=False)
    before = ledger.doctor()["event_count"]
    clock.advance(10_000)
    policy = ReconcilePolicy(active_grace_seconds=600, delivery_grace_seconds=0)
    ledger.reconcile(policy, dry_run=True)
    assert ledger.doctor()["event_count"] == before
    report = ledger.reconcile(policy)
    assert report["tasks_timed_out"] == 4 and report["deliveries_failed"] == 4
    assert ledger.doctor()["event_count"] == before + 8
    assert ledger.doctor()["healthy"] is True


def test_stored_times_ahead_of_clock_are_never_closed(ledger: Ledger, clock: Clock) -> None:
    task = ledger.create_task()
    ledger.start_task(task.id, owner=False)
    clock.advance(1000)
    ledger.heartbeat(task.id)
    clock.set(T0 - 10_000)  # the clock went backwards past every stored time
    zero = ReconcilePolicy(active_grace_seconds=0, delivery_grace_seconds=0)
    report = preview_then_apply(ledger, zero)
    assert report["tasks_timed_out"] == 0
    assert ledger.get_task(task.id).status == "running"
    assert ledger.doctor()["healthy"] is True


# ----------------------------------------------------------------------------- parent freshness


def test_running_parent_with_queued_child_never_times_out(ledger: Ledger, clock: Clock) -> None:
    parent = ledger.create_task()
    ledger.start_task(parent.id, owner=False)
    attempt = ledger.create_task(parent_id=parent.id, delivery_required=False)
    ledger.start_task(attempt.id, owner=False)
    ledger.close_task(attempt.id, "failed", code="retry_scheduled")
    retry = ledger.create_task(parent_id=parent.id, delivery_required=False)
    for jump in (600, 10**5, 10**9):
        clock.advance(jump)
        report = preview_then_apply(ledger)
        assert report["tasks_timed_out"] == 0
        assert report["fresh_active_retained"] == 2  # the parent and its queued retry
    assert ledger.get_task(parent.id).status == "running"
    assert ledger.get_task(retry.id).status == "queued"
    # once the retry is closed the parent becomes stale like any other task
    ledger.close_task(retry.id, "cancelled", code="revoked")
    report = preview_then_apply(ledger)
    assert report["tasks_timed_out"] == 1
    assert ledger.get_task(parent.id).terminal_code == "restart_stale"
    assert ledger.doctor()["healthy"] is True


def test_parent_kept_by_fresh_running_child(ledger: Ledger, clock: Clock) -> None:
    parent = ledger.create_task()
    ledger.start_task(parent.id, owner=False)
    child = ledger.create_task(parent_id=parent.id, delivery_required=False)
    ledger.start_task(child.id, owner=False)
    clock.advance(500)
    ledger.heartbeat(child.id)
    clock.advance(200)  # parent stale (700 s), child fresh (200 s)
    report = preview_then_apply(ledger)
    assert report["tasks_timed_out"] == 0 and report["fresh_active_retained"] == 2
    clock.advance(400)  # child stale too: both go in one pass
    report = preview_then_apply(ledger)
    assert report["tasks_timed_out"] == 2
    assert ledger.get_task(parent.id).terminal_code == "restart_stale"
    assert ledger.get_task(child.id).terminal_code == "restart_stale"


@pytest.mark.parametrize("between", [0, 2100])
def test_a_child_the_pass_closed_never_keeps_its_parent_fresh(
    ledger: Ledger, clock: Clock, between: int
) -> None:
    """The child is closed in the same batch as its parent (``between`` 0) or in an earlier
    batch (a pass reads 2,000 open tasks a batch, newest first); dry run and apply agree."""
    parent = ledger.create_task()
    ledger.start_task(parent.id, owner=False)
    with ledger.atomic():
        for _ in range(between):
            ledger.create_task()  # queued: examined, never timed out
    child = ledger.create_task(parent_id=parent.id, delivery_required=False)
    ledger.start_task(child.id, owner=False)
    clock.advance(700)
    report = preview_then_apply(ledger)
    assert report["tasks_timed_out"] == 2 and report["fresh_active_retained"] == between
    assert ledger.get_task(parent.id).terminal_code == "restart_stale"
    assert ledger.get_task(child.id).terminal_code == "restart_stale"


def test_parent_past_deadline_times_out_despite_queued_child(ledger: Ledger, clock: Clock) -> None:
    parent = ledger.create_task(timeout_seconds=60)
    ledger.start_task(parent.id, owner=False)
    ledger.create_task(parent_id=parent.id, delivery_required=False)
    clock.advance(60)
    report = preview_then_apply(ledger)
    assert report["tasks_timed_out"] == 1
    assert ledger.get_task(parent.id).terminal_code == "deadline_exceeded"


# ----------------------------------------------------------------------------- corrupt row


def raw_row(db: str, task_id: str, column: str) -> object:
    """Read one stored value directly (a corrupt row may be refused by the API's reads)."""
    conn = sqlite3.connect(db)
    try:
        sql = f"SELECT {column} FROM tsg_tasks WHERE id = ?"
        return conn.execute(sql, (task_id,)).fetchone()[0]
    finally:
        conn.close()


@pytest.mark.sqlite_only(reason="a corrupt row written into the SQLite file by hand")
def test_one_corrupt_row_does_not_block_the_others(db: str, clock: Clock) -> None:
    with Ledger(db, clock=clock) as led:
        running = [led.create_task() for _ in range(5)]
        for t in running:
            led.start_task(t.id, owner=False)
        pending = [led.create_task() for _ in range(3)]
        for t in pending:
            led.close_task(t.id, "succeeded")
        corrupt = running[2].id
    raw_execute(db, ("UPDATE tsg_tasks SET heartbeat_at = ? WHERE id = ?", (math.inf, corrupt)))
    clock.advance(10_000)
    with Ledger(db, clock=clock) as led:
        assert led.doctor()["healthy"] is False
        report = preview_then_apply(led)
        assert report["tasks_timed_out"] == 4
        assert report["deliveries_failed"] == 3
        for t in running:
            if t.id != corrupt:
                assert led.get_task(t.id).status == "timed_out"
        assert raw_row(db, corrupt, "status") == "running"  # left alone for doctor
        doctor = led.doctor()
        assert doctor["healthy"] is False
        assert doctor["invalid_timestamp_count"] == 1
        assert corrupt not in repr(doctor)


@pytest.mark.sqlite_only(reason="a corrupt row written into the SQLite file by hand")
def test_corrupt_pending_delivery_row_does_not_block_the_others(db: str, clock: Clock) -> None:
    with Ledger(db, clock=clock) as led:
        pending = [led.create_task() for _ in range(4)]
        for t in pending:
            led.close_task(t.id, "failed", code="worker_failed")
    raw_execute(
        db, ("UPDATE tsg_tasks SET ended_at = ? WHERE id = ?", (-math.inf, pending[0].id))
    )
    clock.advance(10_000)
    with Ledger(db, clock=clock) as led:
        report = preview_then_apply(led)
        assert report["deliveries_failed"] == 3
        assert raw_row(db, pending[0].id, "delivery_status") == "pending"
        assert led.doctor()["invalid_timestamp_count"] >= 1


# ----------------------------------------------------------------------------- snapshot


def test_dry_run_snapshot_is_fixed_before_the_clock_is_sampled(db: str) -> None:
    """A heartbeat committed while the preview samples its clock must not be seen."""
    writer_clock = Clock()
    writer = Ledger(db, clock=writer_clock)
    task = writer.create_task()
    writer.start_task(task.id, owner=False)
    armed = [True]

    def preview_clock() -> float:
        if armed[0]:
            armed[0] = False
            writer_clock.set(T0 + 900)
            writer.heartbeat(task.id)  # commits while the preview's snapshot is open
        return T0 + 1000

    reader = Ledger(db, clock=preview_clock, read_only=True)
    try:
        report = reader.reconcile(GRACE, dry_run=True)
        assert report["tasks_timed_out"] == 1  # the snapshot predates the heartbeat
        assert writer.get_task(task.id).heartbeat_at == T0 + 900
        writer_clock.set(T0 + 1000)
        assert writer.reconcile(GRACE)["tasks_timed_out"] == 0
    finally:
        reader.close()
        writer.close()


def test_read_only_ledger_rejects_apply(db: str, clock: Clock) -> None:
    with Ledger(db, clock=clock) as led:
        led.create_task()
    with Ledger(db, clock=clock, read_only=True) as ro:
        with pytest.raises(StorageError):
            ro.reconcile(GRACE)
        check_report(ro.reconcile(GRACE, dry_run=True), dry_run=True)
