"""Ledger.atomic(): several transitions in one transaction, all or nothing."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from task_state_guard import Ledger, StateConflict


@pytest.fixture()
def ledger(db: str) -> Iterator[Ledger]:
    with Ledger(db) as led:
        yield led


def test_atomic_commits_every_transition_together(ledger: Ledger) -> None:
    parent = ledger.create_task()
    with ledger.atomic():
        ledger.start_task(parent.id)
        child = ledger.create_task(parent_id=parent.id, delivery_required=False)
        ledger.start_task(child.id)
    assert ledger.get_task(parent.id).status == "running"
    assert ledger.get_task(child.id).status == "running"
    report = ledger.doctor()
    assert report["healthy"] and report["event_count"] == 4


def test_atomic_rolls_back_everything_on_error(ledger: Ledger) -> None:
    task = ledger.create_task()
    before = ledger.doctor()["event_count"]
    with pytest.raises(RuntimeError), ledger.atomic():
        ledger.start_task(task.id)
        ledger.create_task()
        raise RuntimeError("boom")
    assert ledger.get_task(task.id).status == "queued"
    assert ledger.doctor()["event_count"] == before
    assert ledger.doctor()["task_count"] == 1


def test_a_refused_transition_inside_atomic_changes_nothing_itself(ledger: Ledger) -> None:
    task = ledger.create_task()
    with ledger.atomic():
        ledger.close_task(task.id, "cancelled", code="caller_cancelled")
        with pytest.raises(StateConflict):
            ledger.close_task(task.id, "succeeded")
        with ledger.atomic():  # nested: joins the outer transaction
            ledger.set_delivery(task.id, "failed", code="transport_failed")
    got = ledger.get_task(task.id)
    assert (got.status, got.delivery_status) == ("cancelled", "failed")
    assert ledger.doctor()["healthy"]


def test_other_threads_wait_for_an_atomic_block(ledger: Ledger) -> None:
    task = ledger.create_task()
    entered, release = threading.Event(), threading.Event()
    seen: list[str] = []

    def other() -> None:
        entered.wait()
        seen.append(ledger.close_task(task.id, "cancelled").status)

    thread = threading.Thread(target=other)
    thread.start()
    with ledger.atomic():
        ledger.start_task(task.id)
        entered.set()
        release.wait(0.3)
        assert seen == []  # the other thread cannot write inside our transaction
    thread.join(10)
    assert seen == ["cancelled"]
    assert ledger.doctor()["healthy"]
