"""The supervising process's shared operations (``task_state_guard.integration.supervisor``):
finding the attempt a delivery ran as from outside, and ending it only while it is open.

Runs on both backends through the public API: jobs are recorded as an adapter records them, the
ledger's states are asserted."""

from __future__ import annotations

import logging
import threading
import time
import uuid

import pytest
from core_helpers import Clock
from task_state_guard import Ledger
from task_state_guard.integration import AdapterRuntime, AttemptSpec, codes, resolve_settings
from task_state_guard.integration.supervisor import attempt_ran_as, end_if_open, first_open


def new_id() -> str:
    return str(uuid.uuid4())


@pytest.fixture
def rt(ledger: Ledger) -> AdapterRuntime:
    settings = resolve_settings(db_required=False, heartbeat_seconds=0)
    return AdapterRuntime(settings, logger=logging.getLogger("test.supervisor"), ledger=ledger,
                          framework="celery")


def job(rt: AdapterRuntime) -> str:
    logical = new_id()
    rt.open_logical(logical, delivery_required=False, name="app.job")
    return logical


def test_the_own_attempt_wins_then_the_first_running_placeholder(
    ledger: Ledger, rt: AdapterRuntime
) -> None:
    logical = job(rt)
    queued, running, own = new_id(), new_id(), new_id()
    rt.queue_attempt(queued, logical, name="app.job")
    rt.queue_attempt(running, logical, name="app.job")
    spec = AttemptSpec(logical, "app.job", candidates=[(running, False)])
    assert rt.claim_attempt(spec) == running

    # Not recorded by the process that ran it: the first running placeholder (a queued one is
    # not what the delivery ran as).
    assert attempt_ran_as(rt, own, [new_id(), queued, running]) == running
    assert attempt_ran_as(rt, None, [queued]) is None
    # Recorded, in any state: the delivery's own attempt.
    assert rt.claim_attempt(AttemptSpec(logical, "app.job", attempt_id=own)) == own
    rt.close_attempt(own, codes.SUCCEEDED, codes.WORKER_COMPLETED)
    assert attempt_ran_as(rt, own, [running]) == own
    assert first_open(rt, [own, queued, running]) == queued
    assert first_open(rt, [own, queued, running], (codes.RUNNING,)) == running
    assert ledger.get_task(own).status == codes.SUCCEEDED


def test_an_open_attempt_is_ended_and_an_ended_one_is_left_alone(
    ledger: Ledger, rt: AdapterRuntime
) -> None:
    logical = job(rt)
    running = rt.claim_attempt(AttemptSpec(logical, "app.job"))
    assert end_if_open(rt, running, (codes.FAILED, codes.WORKER_LOST), where="test")
    ended = ledger.get_task(running)
    assert (ended.status, ended.terminal_code) == (codes.FAILED, codes.WORKER_LOST)
    assert (ended.delivery_status, ended.delivery_code) == (
        codes.NOT_APPLICABLE, codes.INTERNAL_TASK)

    # Ended already (by the process that ran it, say): no rewrite, no conflict counted.
    assert not end_if_open(rt, running, (codes.CANCELLED, codes.REVOKED), where="test")
    assert not end_if_open(rt, None, (codes.CANCELLED, codes.REVOKED), where="test")
    assert not end_if_open(rt, new_id(), (codes.CANCELLED, codes.REVOKED), where="test")
    assert ledger.get_task(running).terminal_code == codes.WORKER_LOST
    assert rt.stats()["conflicts"] == {}
    assert rt.stats()["errors"] == {}
    assert ledger.get_task(logical).status == codes.RUNNING  # the job is the caller's to end


def test_only_an_attempt_in_the_given_states_is_ended(ledger: Ledger, rt: AdapterRuntime) -> None:
    logical = job(rt)
    queued = new_id()
    rt.queue_attempt(queued, logical, name="app.job")
    running = rt.claim_attempt(AttemptSpec(logical, "app.job"))

    # A queued retry is cancelled only while queued; a running attempt is not touched by it.
    assert not end_if_open(rt, running, (codes.CANCELLED, codes.REVOKED), where="test",
                           states=(codes.QUEUED,))
    assert end_if_open(rt, queued, (codes.CANCELLED, codes.REVOKED), where="test",
                       states=(codes.QUEUED,))
    # A lost delivery's attempt is ended only while running.
    assert not end_if_open(rt, queued, (codes.FAILED, codes.WORKER_LOST), where="test",
                           states=(codes.RUNNING,))
    assert ledger.get_task(running).status == codes.RUNNING
    cancelled = ledger.get_task(queued)
    assert (cancelled.status, cancelled.terminal_code) == (codes.CANCELLED, codes.REVOKED)


def test_a_queued_attempt_that_starts_while_it_is_cancelled_is_left_running(
    db: str, clock: Clock, ledger: Ledger, rt: AdapterRuntime
) -> None:
    """The read sees the attempt queued; its start commits while the close waits for the row
    (a transaction of another process): the queued-only close leaves it running."""
    logical = job(rt)
    queued = new_id()
    rt.queue_attempt(queued, logical, name="app.job")
    holding = threading.Event()

    def start_and_hold() -> None:
        with Ledger(db, clock=clock) as other, other.atomic():
            other.start_task(queued)
            holding.set()
            time.sleep(0.5)  # the read and the close below run meanwhile

    starter = threading.Thread(target=start_and_hold)
    starter.start()
    assert holding.wait(10)
    ended = end_if_open(rt, queued, (codes.CANCELLED, codes.REVOKED), where="test",
                        states=(codes.QUEUED,))
    starter.join(10)
    assert not ended
    assert ledger.get_task(queued).status == codes.RUNNING
    assert rt.stats()["conflicts"] == {}
    assert rt.stats()["errors"] == {}
