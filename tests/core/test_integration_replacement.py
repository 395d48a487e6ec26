"""The shared operations of a replaced job (``task_state_guard.integration.replacement``): a
delivery that works for replaced jobs begins with its stage attempts in one transaction; a
replacement that fails ends the replaced job and skips what of it is still queued; a quiet end
closes the replaced job only once none of its work is queued or running.

Runs on both backends through the public API: jobs are recorded as an adapter records them, the
ledger's states are asserted."""

from __future__ import annotations

import logging
import threading
import time
import uuid

import pytest
from core_helpers import Clock
from task_state_guard import InvalidInput, Ledger, TaskNotFound
from task_state_guard.integration import AdapterRuntime, AttemptSpec, codes, resolve_settings
from task_state_guard.integration.replacement import (
    begin_with_stages,
    job_open,
    replaced_endings,
    settle_if_idle,
)


def new_id() -> str:
    return str(uuid.uuid4())


def fallback(key: str, attempt: str) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"stage:{key}:{attempt}"))


@pytest.fixture
def rt(ledger: Ledger) -> AdapterRuntime:
    settings = resolve_settings(db_required=False, heartbeat_seconds=0)
    return AdapterRuntime(settings, logger=logging.getLogger("test.replacement"), ledger=ledger,
                          framework="celery")


def job(rt: AdapterRuntime, *, start: bool = True) -> str:
    logical = new_id()
    rt.open_logical(logical, delivery_required=False, name="app.job", start=start)
    return logical


def state(ledger: Ledger, task_id: str) -> tuple[str, str | None]:
    found = ledger.get_task(task_id)
    return found.status, found.terminal_code


def begin(rt: AdapterRuntime, logical: str) -> str:
    return rt.begin_attempt(AttemptSpec(logical, "app.stage"), delivery_required=False)


def test_a_stage_delivery_claims_its_placeholders_and_holds_them(
    ledger: Ledger, rt: AdapterRuntime
) -> None:
    replaced_a, replaced_b, own = job(rt), job(rt), job(rt, start=False)
    queued = new_id()  # published as the delivery claims it: same name, same timeout
    rt.queue_attempt(queued, replaced_a, name="app.stage", timeout_seconds=30.0)
    taken = new_id()  # another delivery of the same message has this one
    rt.queue_attempt(taken, replaced_b, name="app.stage", timeout_seconds=30.0)
    rt.claim_attempt(AttemptSpec(replaced_b, "app.stage", candidates=[(taken, False)]))
    missing = new_id()  # its publish was not recorded: claimed as it is created

    attempt, stages = begin_with_stages(
        rt, lambda: begin(rt, own), own,
        {"a": (replaced_a, queued), "b": (replaced_b, taken), "c": (replaced_a, missing)},
        fallback_id=fallback, name="app.stage", timeout_seconds=30.0,
    )
    assert stages == {"a": queued, "b": fallback("b", attempt), "c": missing}
    assert state(ledger, own)[0] == codes.RUNNING
    assert state(ledger, attempt)[0] == codes.RUNNING
    for key, stage in stages.items():
        found = ledger.get_task(stage)
        assert found.status == codes.RUNNING
        assert found.parent_id == (replaced_b if key == "b" else replaced_a)
        assert found.timeout_seconds == 30.0
        assert rt.held(stage)
    assert rt.held(attempt) and rt.held(own)


def test_a_failed_stage_claim_writes_nothing_and_releases_the_delivery(
    ledger: Ledger, rt: AdapterRuntime
) -> None:
    replaced, own = job(rt), job(rt, start=False)
    gone = new_id()  # a replaced job the ledger does not have: its claim fails
    with pytest.raises(TaskNotFound):
        begin_with_stages(
            rt, lambda: begin(rt, own), own,
            {"a": (replaced, new_id()), "b": (gone, new_id())},
            fallback_id=fallback, name="app.stage",
        )
    # One transaction: the delivery's attempt and the first stage's claim were rolled back.
    assert ledger.get_task(own).status == codes.QUEUED
    assert ledger.children_of(own) == []
    assert ledger.children_of(replaced) == []
    assert rt.stats()["heartbeating"] == 0


def test_a_failed_replacement_ends_open_replaced_jobs_and_skips_their_queued_work(
    ledger: Ledger, rt: AdapterRuntime
) -> None:
    replaced, ended = job(rt), job(rt)
    running = rt.claim_attempt(AttemptSpec(replaced, "app.stage"))
    queued = new_id()
    rt.queue_attempt(queued, replaced, name="app.stage")
    rt.close_logical(ended, codes.SUCCEEDED, codes.WORKER_COMPLETED)
    assert job_open(rt, replaced) and not job_open(rt, ended) and not job_open(rt, new_id())

    endings = replaced_endings(rt, [replaced, ended, new_id()],
                               (codes.FAILED, codes.WORKER_FAILED))
    assert endings.closings == [
        (queued, codes.CANCELLED, codes.SKIPPED, True),
        (replaced, codes.FAILED, codes.WORKER_FAILED, False),
    ]
    assert endings.if_queued == {queued}
    assert rt.close_tasks([(running, codes.FAILED, codes.WORKER_FAILED, True),
                           *endings.closings], if_queued=endings.if_queued) == 3
    assert state(ledger, queued) == (codes.CANCELLED, codes.SKIPPED)
    assert state(ledger, replaced) == (codes.FAILED, codes.WORKER_FAILED)
    assert state(ledger, ended) == (codes.SUCCEEDED, codes.WORKER_COMPLETED)
    assert not job_open(rt, replaced)


def test_a_stage_started_after_the_read_is_not_skipped_and_closes_with_how_it_ran(
    ledger: Ledger, rt: AdapterRuntime
) -> None:
    replaced = job(rt)
    stage, still_queued = new_id(), new_id()
    rt.queue_attempt(stage, replaced, name="app.stage")
    rt.queue_attempt(still_queued, replaced, name="app.stage")
    endings = replaced_endings(rt, [replaced], (codes.FAILED, codes.WORKER_FAILED))
    assert endings.if_queued == {stage, still_queued}

    # The stage's delivery starts between the read and the write.
    started = rt.claim_attempt(AttemptSpec(replaced, "app.stage", candidates=[(stage, False)]))
    assert started == stage
    assert rt.close_tasks(endings.closings, if_queued=endings.if_queued) == 2

    assert state(ledger, stage) == (codes.RUNNING, None)
    assert state(ledger, still_queued) == (codes.CANCELLED, codes.SKIPPED)
    assert state(ledger, replaced) == (codes.FAILED, codes.WORKER_FAILED)
    assert rt.stats()["conflicts"] == {}
    # Its delivery then records how it ran.
    assert rt.close_attempt(stage, codes.SUCCEEDED, codes.WORKER_COMPLETED)
    assert state(ledger, stage) == (codes.SUCCEEDED, codes.WORKER_COMPLETED)
    assert ledger.get_task(stage).delivery_status == "not_applicable"


def test_a_stage_started_by_a_transaction_the_write_waits_for_is_not_skipped(
    db: str, clock: Clock, ledger: Ledger, rt: AdapterRuntime
) -> None:
    """The start commits while the write waits for the row (PostgreSQL re-checks the row it
    waited for; SQLite's write waits for the lock): the queued-only close leaves it running."""
    replaced = job(rt)
    stage = new_id()
    rt.queue_attempt(stage, replaced, name="app.stage")
    endings = replaced_endings(rt, [replaced], (codes.FAILED, codes.WORKER_FAILED))
    holding, done = threading.Event(), threading.Event()

    def start_and_hold() -> None:
        with Ledger(db, clock=clock) as other, other.atomic():
            other.start_task(stage)
            holding.set()
            time.sleep(0.5)  # the close below runs meanwhile and waits
        done.set()

    starter = threading.Thread(target=start_and_hold)
    starter.start()
    assert holding.wait(10)
    closed = rt.close_tasks(endings.closings, if_queued=endings.if_queued)
    starter.join(10)
    assert done.is_set()
    assert closed == 1
    assert state(ledger, stage) == (codes.RUNNING, None)
    assert state(ledger, replaced) == (codes.FAILED, codes.WORKER_FAILED)


def test_a_queued_only_close_that_is_not_queued_changes_nothing_else(
    ledger: Ledger, rt: AdapterRuntime
) -> None:
    """Through the ledger: a task named in ``if_queued`` is closed only from queued; a closed
    one keeps its state, and neither is reported closed."""
    parent = job(rt)
    queued, running, closed = new_id(), new_id(), new_id()
    for task in (queued, running, closed):
        rt.queue_attempt(task, parent, name="app.stage")
    ledger.start_task(running)
    ledger.close_task(closed, codes.FAILED, code=codes.WORKER_FAILED)
    ended = ledger.end_attempt(
        [(t, codes.CANCELLED, codes.SKIPPED) for t in (queued, running, closed)],
        if_queued=[queued, running, closed],
    )
    assert ended.closed == {queued}
    assert state(ledger, running) == (codes.RUNNING, None)
    assert state(ledger, closed) == (codes.FAILED, codes.WORKER_FAILED)
    assert ledger.get_task(queued).delivery_status == "not_applicable"
    with pytest.raises(InvalidInput):
        ledger.end_attempt([(running, codes.CANCELLED, codes.SKIPPED)], if_queued=["nope"])
    assert state(ledger, running) == (codes.RUNNING, None)


def test_a_quiet_end_settles_a_replaced_job_only_when_nothing_of_it_is_active(
    ledger: Ledger, rt: AdapterRuntime
) -> None:
    replaced = job(rt)
    queued = new_id()
    rt.queue_attempt(queued, replaced, name="app.stage")
    ignored = (codes.CANCELLED, codes.IGNORED)

    assert not settle_if_idle(rt, replaced, ignored, where="test")  # work still queued
    running = rt.claim_attempt(AttemptSpec(replaced, "app.stage", candidates=[(queued, False)]))
    assert not settle_if_idle(rt, replaced, ignored, where="test")  # work still running
    assert ledger.get_task(replaced).status == codes.RUNNING

    rt.close_attempt(running, codes.CANCELLED, codes.IGNORED)
    assert settle_if_idle(rt, replaced, ignored, where="test")
    assert state(ledger, replaced) == ignored
    # Closed already: left alone, no conflict counted.
    assert not settle_if_idle(rt, replaced, (codes.FAILED, codes.WORKER_FAILED), where="test")
    assert state(ledger, replaced) == ignored
    assert rt.stats()["conflicts"] == {}
