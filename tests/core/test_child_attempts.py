"""Child attempts (``integration.child_attempts``): begun under a running task, with the closes
of the attempts that ended since the last write, and ended with their job, on each backend."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from task_state_guard import Ledger, LedgerBusy, StateConflict, TaskNotFound
from task_state_guard.integration import AdapterRuntime, resolve_settings
from task_state_guard.integration.child_attempts import begin_child, end_tasks, end_with_history

OK = ("succeeded", "worker_completed")


class Spy(Ledger):
    """A ledger that records which of its writes were called (public API only), and can make
    the next ``end_and_begin_attempt`` fail before it writes anything."""

    def __init__(self, target: str) -> None:
        super().__init__(target)
        self.calls: list[str] = []
        self.fail_boundary = False

    def begin_attempt(self, logical_id: Any, **kwargs: Any) -> str:
        self.calls.append("begin_attempt")
        return super().begin_attempt(logical_id, **kwargs)

    def end_and_begin_attempt(self, closes: Any, logical_id: Any, **kwargs: Any) -> Any:
        self.calls.append("end_and_begin_attempt")
        if self.fail_boundary:
            self.fail_boundary = False
            raise LedgerBusy("locked by another process")
        return super().end_and_begin_attempt(closes, logical_id, **kwargs)

    def end_attempt(self, closes: Any, **kwargs: Any) -> Any:
        self.calls.append("end_attempt")
        return super().end_attempt(closes, **kwargs)

    def create_task(self, **kwargs: Any) -> Any:
        self.calls.append("create_task")
        return super().create_task(**kwargs)

    def start_task(self, task_id: Any, **kwargs: Any) -> Any:
        self.calls.append("start_task")
        return super().start_task(task_id, **kwargs)

    def atomic(self) -> Any:
        self.calls.append("atomic")
        return super().atomic()


@pytest.fixture
def spy(db: str) -> Iterator[Spy]:
    with Spy(db) as led:
        yield led


@pytest.fixture
def rt(spy: Spy) -> Iterator[AdapterRuntime]:
    settings = resolve_settings(db_required=False, heartbeat_seconds=0)
    runtime = AdapterRuntime(settings, logger=logging.getLogger("test.child_attempts"),
                             ledger=spy, framework="langgraph", adapter="test")
    yield runtime
    runtime.close()


def new_id() -> str:
    return str(uuid.uuid4())


def job(rt: AdapterRuntime, spy: Spy) -> str:
    """A running job (the parent of the children), held like an adapter holds it."""
    task = new_id()
    rt.begin_task(task, parent_id=None, name="graph")
    rt.hold(task)
    spy.calls.clear()
    return task


def state(spy: Spy, task_id: str) -> tuple[str, str | None]:
    task = spy.get_task(task_id)
    return str(task.status), task.terminal_code


def test_a_child_begins_under_its_running_parent_owned_and_held(
    rt: AdapterRuntime, spy: Spy
) -> None:
    parent = job(rt, spy)
    child = new_id()
    assert begin_child(rt, parent, child, name="plan") == child
    assert spy.calls == ["begin_attempt"]
    task = spy.get_task(child)
    assert (str(task.status), task.parent_id, task.name, task.has_owner) == (
        "running", parent, "plan", True)
    assert not task.delivery_required
    assert rt.held(child)


def test_the_attempts_that_ended_close_in_the_write_that_begins_the_next(
    rt: AdapterRuntime, spy: Spy
) -> None:
    parent = job(rt, spy)
    first, second, inner = new_id(), new_id(), new_id()
    begin_child(rt, parent, first, name="plan")
    begin_child(rt, first, inner, name="sub")  # a subgraph's node, under the node running it
    spy.calls.clear()
    ended = [(inner, *OK, True), (first, *OK, True)]  # innermost first
    assert begin_child(rt, parent, second, name="act", ended=ended) == second
    assert spy.calls == ["end_and_begin_attempt"]  # one write
    for task_id in (inner, first):
        task = spy.get_task(task_id)
        assert (str(task.status), task.terminal_code) == OK
        assert (str(task.delivery_status), task.delivery_code) == (
            "not_applicable", "internal_task")
        assert not rt.held(task_id)
    assert state(spy, second) == ("running", None)
    assert rt.held(second) and rt.held(parent)
    assert rt.stats()["errors"] == {} and rt.stats()["conflicts"] == {}


def test_a_refused_start_raises_why_and_the_closes_still_commit(
    rt: AdapterRuntime, spy: Spy
) -> None:
    parent = job(rt, spy)
    first, taken = new_id(), new_id()
    begin_child(rt, parent, first, name="plan")
    begin_child(rt, parent, taken, name="other")
    with pytest.raises(StateConflict):  # exists and is no longer queued
        begin_child(rt, parent, taken, name="again", ended=[(first, *OK, True)])
    assert state(spy, first) == OK
    assert not rt.held(first)
    with pytest.raises(StateConflict):  # nothing ended: the start alone
        begin_child(rt, parent, taken, name="again")
    assert state(spy, taken) == ("running", None)


def test_a_missing_parent_raises_task_not_found_and_the_closes_still_commit(
    rt: AdapterRuntime, spy: Spy
) -> None:
    parent = job(rt, spy)
    first, orphan = new_id(), new_id()
    begin_child(rt, parent, first, name="plan")
    with pytest.raises(TaskNotFound):
        begin_child(rt, new_id(), orphan, name="act", ended=[(first, *OK, True)])
    assert state(spy, first) == OK
    assert not rt.held(orphan)
    with pytest.raises(TaskNotFound):
        spy.get_task(orphan)


def test_a_failed_shared_write_writes_the_closes_then_the_start_on_their_own(
    rt: AdapterRuntime, spy: Spy
) -> None:
    parent = job(rt, spy)
    first, second = new_id(), new_id()
    begin_child(rt, parent, first, name="plan")
    spy.calls.clear()
    spy.fail_boundary = True
    assert begin_child(rt, parent, second, name="act", ended=[(first, *OK, True)]) == second
    assert spy.calls == ["end_and_begin_attempt", "end_attempt", "begin_attempt"]
    assert state(spy, first) == OK
    assert state(spy, second) == ("running", None)
    assert rt.held(second) and not rt.held(first)
    assert rt.stats()["errors"] == {}


def test_a_refused_close_is_counted_and_the_start_goes_on(rt: AdapterRuntime, spy: Spy) -> None:
    parent = job(rt, spy)
    first, second = new_id(), new_id()
    begin_child(rt, parent, first, name="plan")
    spy.close_task_settled(first, "timed_out", code="restart_stale")  # closed by someone else
    begin_child(rt, parent, second, name="act", ended=[(first, *OK, True)])
    assert state(spy, first) == ("timed_out", "restart_stale")  # never rewritten
    assert state(spy, second) == ("running", None)
    assert rt.stats()["conflicts"] == {"attempt_close": 1}


def test_an_unowned_child_begins_with_its_closes_in_one_transaction(
    rt: AdapterRuntime, spy: Spy
) -> None:
    parent = job(rt, spy)
    first, second = new_id(), new_id()
    assert begin_child(rt, parent, first, name="plan", owner=False) == first
    assert spy.calls == ["atomic", "create_task", "start_task"]
    spy.calls.clear()
    begin_child(rt, parent, second, name="act", ended=[(first, *OK, True)], owner=False)
    # One transaction: the closes and the start (its own group nested) inside one atomic().
    assert spy.calls == ["atomic", "end_attempt", "atomic", "create_task", "start_task"]
    task = spy.get_task(second)
    assert (str(task.status), task.parent_id, task.has_owner) == ("running", parent, False)
    assert state(spy, first) == OK
    assert rt.held(second) and not rt.held(first)
    with pytest.raises(StateConflict):
        begin_child(rt, parent, second, name="act", ended=[(new_id(), *OK, True)], owner=False)


def test_end_tasks_releases_and_closes_a_job_with_its_leftovers_in_one_write(
    rt: AdapterRuntime, spy: Spy
) -> None:
    parent = job(rt, spy)
    done, left = new_id(), new_id()
    begin_child(rt, parent, done, name="plan")
    begin_child(rt, parent, left, name="act", ended=[(done, *OK, True)])
    spy.calls.clear()
    closings = [(left, "cancelled", "caller_cancelled", True),
                (parent, "succeeded", "completed", False)]
    assert end_tasks(rt, closings) == 2
    assert spy.calls == ["end_attempt"]
    assert state(spy, left) == ("cancelled", "caller_cancelled")
    assert state(spy, parent) == ("succeeded", "completed")
    assert rt.stats()["heartbeating"] == 0
    assert end_tasks(rt, []) == 0
    assert end_tasks(rt, closings) == 2  # the same closes again: idempotent
    other = [(left, "failed", "worker_failed", True), (parent, "failed", "worker_failed", False)]
    assert end_tasks(rt, other) == 0  # terminal records are never rewritten: counted
    assert state(spy, parent) == ("succeeded", "completed")
    assert rt.stats()["conflicts"] == {"attempt_close": 1, "logical_close": 1}


def totals(spy: Spy) -> dict[str, Any]:
    """The outcome totals of attempts and of internal deliveries."""
    status = spy.status()
    return {"closed": status["outcomes_total"]["attempt"],
            "delivered": status["delivery_outcomes_total"]["internal"]}


def test_history_is_recorded_closed_with_its_events_and_totals_in_one_write(
    rt: AdapterRuntime, spy: Spy
) -> None:
    parent = job(rt, spy)
    plan, inner, act = new_id(), new_id(), new_id()
    before = totals(spy)
    # Steps that started and ended since the last write: a parent before its children.
    queue = [(plan, parent, "plan", None), (inner, plan, "sub", None), (act, parent, "act", 30.0)]
    closings = [(inner, *OK, True), (plan, "failed", "retry_scheduled", True),
                (act, "cancelled", "caller_cancelled", True),
                (parent, "succeeded", "completed", False)]
    assert end_with_history(rt, queue, closings) == 4
    assert spy.calls == ["end_attempt"]  # one write on both backends, no group around it
    expected = {inner: (OK, plan), plan: (("failed", "retry_scheduled"), parent),
                act: (("cancelled", "caller_cancelled"), parent)}
    for task_id, (outcome, parent_id) in expected.items():
        task = spy.get_task(task_id)
        assert (str(task.status), task.terminal_code) == outcome
        assert task.parent_id == parent_id and task.started_at is None
        assert (str(task.delivery_status), task.delivery_code) == (
            "not_applicable", "internal_task")
        assert task.ended_at == task.delivery_updated_at
        assert task.created_at is not None and task.created_at <= task.ended_at
        events = spy.events_of(task_id)
        assert [(e.kind, e.state, e.code) for e in events] == [
            ("created", "queued", "created"), ("closed", *outcome),
            ("delivery", "not_applicable", "internal_task")]
        assert [e.at for e in events] == [task.created_at, task.ended_at, task.ended_at]
    assert spy.get_task(spy.get_task(act).id).timeout_seconds == 30.0
    assert state(spy, parent) == ("succeeded", "completed")
    after = totals(spy)
    assert after["closed"]["succeeded"]["worker_completed"] == (
        before["closed"]["succeeded"]["worker_completed"] + 1)
    assert after["closed"]["failed"]["retry_scheduled"] == (
        before["closed"]["failed"]["retry_scheduled"] + 1)
    assert after["closed"]["cancelled"]["caller_cancelled"] == (
        before["closed"]["cancelled"]["caller_cancelled"] + 1)
    assert after["delivered"]["not_applicable"]["internal_task"] == (
        before["delivered"]["not_applicable"]["internal_task"] + 3)
    assert spy.doctor()["healthy"]
    assert rt.stats()["errors"] == {} and rt.stats()["conflicts"] == {}
    # The same history again (a retried write): nothing is recorded twice.
    counts = [len(spy.events_of(t)) for t in (plan, inner, act, parent)]
    end_with_history(rt, queue, closings)
    assert [len(spy.events_of(t)) for t in (plan, inner, act, parent)] == counts
    assert totals(spy) == after
    assert [t.id for t in spy.children_of(parent)] == [plan, act]
    assert spy.doctor()["healthy"]


def test_history_beside_steps_written_earlier_and_under_a_missing_parent(
    rt: AdapterRuntime, spy: Spy
) -> None:
    parent = job(rt, spy)
    running, done, orphan = new_id(), new_id(), new_id()
    begin_child(rt, parent, running, name="plan")  # written running earlier (a flush)
    queue = [(done, parent, "act", None), (orphan, new_id(), "lost", None)]
    closings = [(done, *OK, True), (orphan, *OK, True), (running, *OK, True),
                (parent, "succeeded", "completed", False)]
    rt.release(running)
    assert end_with_history(rt, queue, closings) == 3
    for task_id in (done, running):
        assert state(spy, task_id) == OK
    assert spy.get_task(running).started_at is not None
    assert spy.get_task(done).started_at is None
    with pytest.raises(TaskNotFound):
        spy.get_task(orphan)
    assert state(spy, parent) == ("succeeded", "completed")
    assert sum(rt.stats()["errors"].values()) >= 1  # the orphan: counted, never raised
    assert spy.doctor()["healthy"]
