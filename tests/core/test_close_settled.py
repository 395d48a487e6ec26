"""Ledger.close_task_settled: a close that settles the delivery of a task owing none in the
same statement, through the public API; doctor stays healthy."""

from __future__ import annotations

import uuid

import pytest
from core_helpers import event_count
from task_state_guard import InvalidInput, Ledger, StateConflict, TaskNotFound


@pytest.mark.parametrize("start", [True, False])
@pytest.mark.parametrize(
    ("state", "code"),
    [("succeeded", None), ("failed", "worker_failed"), ("cancelled", "revoked")],
)
def test_internal_task_closes_with_its_delivery(
    ledger: Ledger, clock, start: bool, state: str, code: str | None
) -> None:
    task = ledger.create_task(delivery_required=False)
    if start:
        clock.advance(1)
        ledger.start_task(task.id, owner=False)
    before = event_count(ledger)
    clock.advance(1)
    closed = ledger.close_task_settled(task.id, state, code=code)
    assert (closed.status, closed.terminal_code) == (state, code)
    assert (closed.delivery_status, closed.delivery_code) == ("not_applicable", "internal_task")
    assert closed.ended_at == closed.delivery_updated_at == clock.t
    assert closed.version == int(start) + 2
    assert ledger.get_task(task.id) == closed
    assert event_count(ledger) == before + 2  # the close and the delivery
    report = ledger.doctor()
    assert report["healthy"] is True
    assert report["delivery_status_counts"]["not_applicable"] == 1


def test_delivering_task_keeps_its_delivery_pending(ledger: Ledger, clock) -> None:
    task = ledger.create_task()
    ledger.start_task(task.id, owner=False)
    clock.advance(1)
    closed = ledger.close_task_settled(task.id, "succeeded", code="completed")
    assert closed.status == "succeeded" and closed.delivery_status == "pending"
    assert closed.delivery_code is None and closed.version == 2
    assert event_count(ledger) == 3
    ledger.set_delivery(task.id, "delivered")
    assert ledger.doctor()["healthy"] is True


def test_identical_repeat_settles_a_pending_internal_delivery(ledger: Ledger, clock) -> None:
    task = ledger.create_task(delivery_required=False)
    ledger.close_task(task.id, "failed", code="worker_failed")  # delivery left pending
    clock.advance(1)
    settled = ledger.close_task_settled(task.id, "failed")
    assert settled.terminal_code == "worker_failed"  # the original close is kept
    assert settled.delivery_status == "not_applicable"
    assert settled.delivery_updated_at == clock.t
    clock.advance(1)
    again = ledger.close_task_settled(task.id, "failed", code="worker_failed")
    assert again == settled  # nothing rewritten
    assert event_count(ledger) == 3
    assert ledger.doctor()["healthy"] is True


def test_refusals_change_nothing(ledger: Ledger, clock) -> None:
    done = ledger.create_task(delivery_required=False)
    ledger.close_task(done.id, "timed_out", code="restart_stale")
    fresh = ledger.create_task(delivery_required=False)
    snapshot = (ledger.get_task(done.id), ledger.get_task(fresh.id), event_count(ledger))
    with pytest.raises(StateConflict):  # a terminal state is never rewritten
        ledger.close_task_settled(done.id, "succeeded")
    with pytest.raises(TaskNotFound):
        ledger.close_task_settled(str(uuid.uuid4()), "succeeded", code="bogus")
    with pytest.raises(StateConflict):  # conflict before a bad code
        ledger.close_task_settled(done.id, "succeeded", code="worker_failed")
    with pytest.raises(InvalidInput):
        ledger.close_task_settled(fresh.id, "succeeded", code="worker_failed")
    with pytest.raises(InvalidInput):
        ledger.close_task_settled(fresh.id, "running")
    with pytest.raises(InvalidInput):
        ledger.close_task_settled("not-a-uuid", "succeeded")
    clock.advance(-5)
    with pytest.raises(StateConflict):  # clock earlier than the stored times
        ledger.close_task_settled(fresh.id, "succeeded")
    assert (ledger.get_task(done.id), ledger.get_task(fresh.id), event_count(ledger)) == snapshot
    assert ledger.doctor()["healthy"] is True


def test_inside_atomic_rolls_back_with_the_block(ledger: Ledger, clock) -> None:
    task = ledger.create_task(delivery_required=False)
    before = event_count(ledger)
    with pytest.raises(RuntimeError), ledger.atomic():
        ledger.close_task_settled(task.id, "succeeded")
        raise RuntimeError("abort")
    after = ledger.get_task(task.id)
    assert after.status == "queued" and after.delivery_status == "pending"
    assert event_count(ledger) == before
