"""Ledger.begin_attempt / end_attempt: a guarded job's two writes give the same tasks, events,
totals and doctor report as the one-task transitions they stand for, on each backend."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from task_state_guard import InvalidInput, Ledger, StateConflict, StorageError, TaskNotFound, rules


def new_id() -> str:
    return str(uuid.uuid4())


def shape(led: Ledger, task_id: str) -> tuple[Any, ...]:
    """Everything observable of a task but its ids."""
    t = led.get_task(task_id)
    events = [(e.kind, e.state, e.code, e.at) for e in led.events_of(task_id)]
    return (
        t.status, t.terminal_code, t.delivery_status, t.delivery_code, t.delivery_required,
        t.name, t.timeout_seconds, t.created_at, t.started_at, t.deadline_at, t.ended_at,
        t.updated_at, t.delivery_updated_at, t.version, t.has_owner, t.framework_id is not None,
        events,
    )


def flat(value: Any, prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], int]:
    if isinstance(value, dict):
        out: dict[tuple[str, ...], int] = {}
        for key, inner in value.items():
            out.update(flat(inner, (*prefix, str(key))))
        return out
    return {prefix: int(value)}


def totals(led: Ledger) -> dict[tuple[str, ...], int]:
    status = led.status()
    return flat({"outcomes": status["outcomes_total"],
                 "deliveries": status["delivery_outcomes_total"]})


def stepwise_job(led: Ledger, *, delivery: bool, retry: bool = False) -> tuple[str, str]:
    """A job written one transition at a time, as the adapters wrote it before."""
    logical = new_id()
    led.create_task(task_id=logical, delivery_required=delivery, name="job",
                    framework_id=logical, framework="dramatiq")
    led.start_task(logical, owner=False)
    attempt = new_id()
    led.create_task(task_id=attempt, parent_id=logical, delivery_required=False, name="job",
                    timeout_seconds=30.0)
    led.start_task(attempt, owner=True, redelivery_seconds=5.0)
    return logical, attempt


def test_begin_and_end_write_what_the_transitions_write(ledger: Ledger, clock) -> None:
    a_logical, a_attempt = stepwise_job(ledger, delivery=True)
    b_logical = new_id()
    b_attempt = ledger.begin_attempt(
        b_logical, name="job", delivery_required=True, framework_id=b_logical,
        framework="dramatiq", timeout_seconds=30.0, redelivery_seconds=5.0,
    )
    assert ledger.get_task(b_attempt).parent_id == b_logical
    assert shape(ledger, a_logical) == shape(ledger, b_logical)
    assert shape(ledger, a_attempt) == shape(ledger, b_attempt)

    clock.advance(2)
    before = totals(ledger)
    ledger.close_task_settled(a_attempt, "succeeded", code="worker_completed")
    ledger.close_task_settled(a_logical, "succeeded", code="worker_completed")
    ledger.set_delivery(a_logical, "delivered", code="transport_acknowledged")
    once = totals(ledger)
    ended = ledger.end_attempt(
        [(b_attempt, "succeeded", "worker_completed"), (b_logical, "succeeded",
                                                         "worker_completed")],
        marks={b_logical: ("delivered", "transport_acknowledged")},
    )
    assert ended.closed == {b_attempt, b_logical} and ended.marked == {b_logical}
    assert not ended.queued
    assert shape(ledger, a_logical) == shape(ledger, b_logical)
    assert shape(ledger, a_attempt) == shape(ledger, b_attempt)
    twice = totals(ledger)
    # the second job added to the totals what the first one did
    assert {k: v - before.get(k, 0) for k, v in twice.items()} == {
        k: 2 * (once.get(k, 0) - before.get(k, 0)) for k in twice}
    assert any(once.get(k, 0) > before.get(k, 0) for k in once)
    assert ledger.doctor()["healthy"] is True


@pytest.mark.parametrize("timeout", [None, 30.0])
@pytest.mark.parametrize("redelivery", [None, 5.0])
@pytest.mark.parametrize("under_parent", [False, True])
def test_every_shape_of_the_two_writes_writes_what_the_transitions_write(
    ledger: Ledger, clock, timeout: float | None, redelivery: float | None, under_parent: bool
) -> None:
    """A logical task at the root or (alone) under a parent; an attempt with or without a
    timeout and a redelivery window, under a logical task begun in the same write or earlier;
    closes with and without a delivery mark: each the same tasks and events as the one-task
    transitions (each backend writes every shape with its own statement)."""
    parent = None
    if under_parent:
        parent = new_id()
        ledger.create_task(task_id=parent)
    a_logical, b_logical = new_id(), new_id()
    ledger.create_task(task_id=a_logical, parent_id=parent, delivery_required=True, name="job",
                       framework_id=a_logical, framework="dramatiq")
    ledger.start_task(a_logical, owner=False)
    a_attempt = new_id()
    ledger.create_task(task_id=a_attempt, parent_id=a_logical, delivery_required=False,
                       name="job", timeout_seconds=timeout)
    ledger.start_task(a_attempt, owner=True, redelivery_seconds=redelivery)
    opening = {"name": "job", "delivery_required": True, "framework_id": b_logical,
               "framework": "dramatiq"}
    if under_parent:  # the logical task alone under its parent, then the attempt under it
        ledger.begin_attempt(b_logical, parent_id=parent, attempt=False, **opening)
        opening = {"name": "job", "open_logical": False}
    b_attempt = ledger.begin_attempt(b_logical, timeout_seconds=timeout,
                                     redelivery_seconds=redelivery, **opening)
    assert shape(ledger, a_logical) == shape(ledger, b_logical)
    assert shape(ledger, a_attempt) == shape(ledger, b_attempt)
    assert ledger.get_task(b_logical).parent_id == parent
    clock.advance(1)
    a_second = new_id()
    ledger.create_task(task_id=a_second, parent_id=a_logical, delivery_required=False,
                       name="job", timeout_seconds=timeout)
    ledger.start_task(a_second, owner=True, redelivery_seconds=redelivery)
    b_second = ledger.begin_attempt(b_logical, name="job", timeout_seconds=timeout,
                                    redelivery_seconds=redelivery)
    assert shape(ledger, a_second) == shape(ledger, b_second)
    clock.advance(1)
    ledger.close_task_settled(a_attempt, "failed", code="worker_failed")
    ledger.close_task_settled(a_second, "succeeded", code="worker_completed")
    ledger.close_task_settled(a_logical, "succeeded", code="worker_completed")
    ledger.set_delivery(a_logical, "delivered", code="transport_acknowledged")
    ended = ledger.end_attempt(
        [(b_attempt, "failed", "worker_failed"), (b_second, "succeeded", "worker_completed"),
         (b_logical, "succeeded", "worker_completed")],
        marks={b_logical: ("delivered", "transport_acknowledged")})
    assert ended.closed == {b_attempt, b_second, b_logical} and ended.marked == {b_logical}
    for a, b in ((a_logical, b_logical), (a_attempt, b_attempt), (a_second, b_second)):
        assert shape(ledger, a) == shape(ledger, b)
    # A mark on a task that owes no delivery closes nothing (nor half of it).
    clock.advance(1)
    c_attempt = ledger.begin_attempt(b_logical, name="job", timeout_seconds=timeout)
    before = shape(ledger, c_attempt)
    ended = ledger.end_attempt([(c_attempt, "succeeded", "worker_completed")],
                               marks={c_attempt: ("delivered", "transport_acknowledged")})
    assert not ended.closed and shape(ledger, c_attempt) == before
    assert ledger.doctor()["healthy"] is True


def test_candidates_claim_the_first_startable_placeholder(ledger: Ledger, clock) -> None:
    logical = new_id()
    first = ledger.begin_attempt(logical, name="job")
    clock.advance(1)
    retry = new_id()
    ended = ledger.end_attempt([(first, "failed", "retry_scheduled")],
                               queue=[(retry, logical, "job", None)])
    assert ended.closed == {first} and ended.queued == {retry}
    assert ledger.get_task(retry).status == "queued"
    clock.advance(1)
    # The retry's delivery claims the queued attempt (a missing one listed first is skipped).
    claimed = ledger.begin_attempt(logical, name="job", candidates=[(new_id(), False),
                                                                    (retry, True)])
    assert claimed == retry and ledger.get_task(retry).status == "running"
    # A second delivery of the same message gets an attempt of its own.
    other = ledger.begin_attempt(logical, name="job", candidates=[(retry, True)])
    assert other != retry and ledger.get_task(other).status == "running"
    # A placeholder recorded with other attributes is not this delivery's.
    odd = new_id()
    ledger.create_task(task_id=odd, parent_id=logical, delivery_required=False, name="other")
    fresh = ledger.begin_attempt(logical, name="job", candidates=[(odd, True)])
    assert fresh != odd and ledger.get_task(odd).status == "queued"
    # create=True records a missing placeholder and starts it.
    made = new_id()
    assert ledger.begin_attempt(logical, name="job", candidates=[(made, True)]) == made
    assert [c.status for c in ledger.children_of(logical)].count("running") == 4
    assert ledger.get_task(logical).version == 1  # started once, by the first delivery
    assert ledger.doctor()["healthy"] is True


def test_begin_refusals(ledger: Ledger, clock) -> None:
    missing = new_id()
    with pytest.raises(TaskNotFound):
        ledger.begin_attempt(missing, open_logical=False)
    logical = new_id()
    taken = ledger.begin_attempt(logical)
    with pytest.raises(StateConflict):
        ledger.begin_attempt(logical, attempt_id=taken)
    with pytest.raises(InvalidInput):
        ledger.begin_attempt("not-a-uuid")
    with pytest.raises(InvalidInput):
        ledger.begin_attempt(new_id(), candidates=[("nope", True)])
    with pytest.raises(InvalidInput):
        ledger.begin_attempt(new_id(), timeout_seconds=-1)
    with pytest.raises(InvalidInput):
        ledger.begin_attempt(new_id(), candidates=[(new_id(), "yes")])  # type: ignore[list-item]
    assert ledger.status()["tasks"]["running"] == 2  # the refusals wrote nothing
    # A clock behind the logical task's creation: no attempt under it, in either write.
    clock.advance(-1)
    with pytest.raises(StateConflict):
        ledger.begin_attempt(logical, open_logical=False)
    assert ledger.end_and_begin_attempt([], logical)[1] is None
    assert len(ledger.children_of(logical)) == 1
    assert ledger.status()["tasks"]["running"] == 2
    clock.advance(1)
    # A logical task closed already is left as it is; its attempt still runs under it.
    clock.advance(1)
    ledger.close_task_settled(logical, "cancelled", code="revoked")
    late = ledger.begin_attempt(logical)
    assert ledger.get_task(logical).status == "cancelled"
    assert ledger.get_task(late).status == "running"


def test_begin_refuses_a_deadline_past_the_largest_timestamp(ledger: Ledger, clock) -> None:
    """Whether its logical task is new or recorded earlier, an attempt whose deadline would not
    be a finite timestamp is refused and the begin writes nothing."""
    clock.set(1e308)
    earlier = new_id()
    ledger.create_task(task_id=earlier)
    before = ledger.status()["tasks"]
    for logical in (new_id(), earlier):
        with pytest.raises(InvalidInput):
            ledger.begin_attempt(logical, timeout_seconds=1e308)
    assert ledger.status()["tasks"] == before
    assert ledger.get_task(earlier).status == "queued"
    assert ledger.children_of(earlier) == []
    taken = ledger.create_task().id  # an attempt id another task holds
    for logical in (new_id(), earlier):
        with pytest.raises(StateConflict):
            ledger.begin_attempt(logical, attempt_id=taken)
    assert ledger.status()["tasks"] == {**before, "queued": before["queued"] + 1}
    assert ledger.get_task(earlier).status == "queued"


def test_end_reports_what_it_refused(ledger: Ledger, clock) -> None:
    logical = new_id()
    attempt = ledger.begin_attempt(logical, delivery_required=False)
    clock.advance(1)
    ledger.close_task_settled(attempt, "timed_out", code="owner_lost")  # a reconcile's close
    events = [e.kind for e in ledger.events_of(attempt)]
    retry = new_id()
    ledger.create_task(task_id=retry, parent_id=logical, delivery_required=False, name="job")
    clock.advance(1)
    ended = ledger.end_attempt(
        [(attempt, "succeeded", "worker_completed"), (logical, "succeeded", None),
         (new_id(), "failed", None)],
        # a mark on a task that owes no delivery is refused with its close
        marks={logical: ("delivered", "transport_acknowledged")},
        queue=[(retry, logical, "job", None)],
    )
    assert ended.closed == ended.marked == ended.queued == frozenset()
    assert ledger.get_task(attempt).status == "timed_out"
    assert [e.kind for e in ledger.events_of(attempt)] == events
    assert ledger.get_task(logical).status == "running"
    # A code of another state is left to close_task_settled, which explains it.
    ended = ledger.end_attempt([(logical, "succeeded", "worker_failed")])
    assert ended.closed == frozenset()
    with pytest.raises(InvalidInput):
        ledger.close_task_settled(logical, "succeeded", code="worker_failed")
    with pytest.raises(InvalidInput):
        ledger.end_attempt([(logical, "running", None)])
    with pytest.raises(InvalidInput):
        ledger.end_attempt([("nope", "failed", None)])
    assert ledger.get_task(logical).status == "running"
    ended = ledger.end_attempt([(logical, "succeeded", "worker_completed")])
    assert ended.closed == {logical}
    assert ledger.get_task(logical).delivery_status == "not_applicable"
    assert ledger.doctor()["healthy"] is True


def test_read_only_ledger_refuses_both(db: str, ledger: Ledger) -> None:
    logical = new_id()
    attempt = ledger.begin_attempt(logical)
    with Ledger(db, read_only=True) as reader:
        with pytest.raises(StorageError):
            reader.begin_attempt(new_id())
        with pytest.raises(StorageError):
            reader.end_attempt([(attempt, "failed", None)])
    assert ledger.get_task(attempt).status == "running"


def test_begin_and_end_write_the_ruled_events(ledger: Ledger, clock) -> None:
    """Rows inserted already running carry the events the domain rules say, whoever writes
    the started event (a trigger, or the statement itself)."""
    ids: list[str] = []
    for delivery in (True, False):
        logical = new_id()
        queued = new_id()
        ledger.create_task(task_id=queued, parent_id=None, delivery_required=delivery)
        first = ledger.begin_attempt(logical, delivery_required=delivery, timeout_seconds=9.0)
        again = ledger.begin_attempt(queued, delivery_required=delivery)  # started, not made
        clock.advance(1)
        retry = new_id()
        ledger.end_attempt([(first, "failed", "retry_scheduled")],
                           queue=[(retry, logical, None, 9.0)])
        claimed = ledger.begin_attempt(logical, candidates=[(retry, True)],
                                       timeout_seconds=9.0)
        clock.advance(1)
        marks = {logical: ("delivered", "transport_acknowledged")} if delivery else None
        ledger.end_attempt([(claimed, "succeeded", None), (logical, "succeeded", None),
                            (again, "cancelled", "revoked")], marks=marks)
        ids += [logical, queued, first, again, retry, claimed]
    for tid in ids:
        task = ledger.get_task(tid)
        chain = [(e.kind, e.state, e.code, e.at) for e in ledger.events_of(tid)]
        assert chain == rules.expected_events(task.to_dict()), task.to_dict()
    assert ledger.doctor()["healthy"] is True


@pytest.mark.parametrize("name", ["NULL", "<lambda>", "a.b:c/d<e>-f_0"])
@pytest.mark.parametrize("timeout", [None, 2.5, 1e10])
def test_names_and_timeouts_round_trip_through_both_writes(
    ledger: Ledger, clock, name: str, timeout: float | None
) -> None:
    """Every value a write sends in a list (a retry queued with its name and timeout, the
    placeholder a redelivery claims) comes back as it was given, a name spelled ``NULL``
    included."""
    logical = new_id()
    first = ledger.begin_attempt(logical, name=name, timeout_seconds=timeout)
    clock.advance(1)
    retry = new_id()
    ended = ledger.end_attempt([(first, "failed", "retry_scheduled")],
                               queue=[(retry, logical, name, timeout)])
    assert ended.closed == {first} and ended.queued == {retry}
    queued = ledger.get_task(retry)
    assert (queued.name, queued.timeout_seconds, queued.status) == (name, timeout, "queued")
    clock.advance(1)
    claimed = ledger.begin_attempt(logical, name=name, timeout_seconds=timeout,
                                   candidates=[(retry, True)])
    assert claimed == retry and ledger.get_task(retry).status == "running"
    ended = ledger.end_attempt([(retry, "succeeded", "worker_completed"),
                                (logical, "succeeded", "worker_completed")])
    assert ended.closed == {retry, logical}
    assert ledger.get_task(logical).delivery_status == "not_applicable"
    assert ledger.doctor()["healthy"] is True


def test_a_task_opened_alone_is_what_create_and_start_write(ledger: Ledger, clock) -> None:
    """``begin_attempt(attempt=False)``: a delivering task with a parent link, created and
    started at once, is the task, events and totals ``create_task`` + ``start_task`` give,
    with the same refusals."""
    root = new_id()
    ledger.create_task(task_id=root, delivery_required=True, name="LangGraph")
    clock.advance(1)
    stepwise, single = new_id(), new_id()
    for parent in (root, None):
        before = totals(ledger)
        ledger.create_task(task_id=stepwise, parent_id=parent, delivery_required=True,
                           name="LangGraph", framework_id=stepwise, framework="langgraph")
        ledger.start_task(stepwise, owner=True)
        assert ledger.begin_attempt(
            single, parent_id=parent, delivery_required=True, name="LangGraph",
            framework_id=single, framework="langgraph", logical_owner=True, attempt=False,
        ) == single
        assert shape(ledger, stepwise) == shape(ledger, single)
        assert ledger.get_task(single).parent_id == parent
        assert ledger.children_of(single) == []
        assert totals(ledger) == before
        clock.advance(1)
        for tid in (stepwise, single):
            ledger.close_task(tid, "succeeded", code="completed")
            ledger.set_delivery(tid, "delivered", code="transport_acknowledged")
        assert shape(ledger, stepwise) == shape(ledger, single)
        stepwise, single = new_id(), new_id()

    def alone(tid: str, parent: str | None = None, name: str = "LangGraph") -> str:
        return ledger.begin_attempt(tid, parent_id=parent, delivery_required=True, name=name,
                                    logical_owner=True, attempt=False)

    # Refusals, as create_task + start_task refuse: no longer queued, other attributes,
    # a missing parent; an identical task still queued is started.
    done = new_id()
    alone(done)
    with pytest.raises(StateConflict):
        alone(done)
    queued = new_id()
    ledger.create_task(task_id=queued, delivery_required=True, name="LangGraph")
    clock.advance(1)
    with pytest.raises(StateConflict):
        alone(queued, name="other")
    assert ledger.get_task(queued).status == "queued"
    assert alone(queued) == queued
    assert ledger.get_task(queued).status == "running" and ledger.get_task(queued).has_owner
    with pytest.raises(TaskNotFound):
        alone(new_id(), parent=new_id())
    with pytest.raises(InvalidInput):
        ledger.begin_attempt(new_id(), parent_id=root)  # a parent link only without attempt
    with pytest.raises(InvalidInput):
        ledger.begin_attempt(new_id(), open_logical=False, attempt=False)
    assert ledger.doctor()["healthy"] is True


def test_end_and_begin_is_end_then_begin_in_one_write(ledger: Ledger, clock) -> None:
    """A boundary (``end_and_begin_attempt``) writes what ``end_attempt`` and then
    ``begin_attempt`` write; a refused begin leaves nothing and the end still commits."""
    pairs = []
    for _ in range(2):
        logical = new_id()
        ledger.begin_attempt(logical, delivery_required=True, logical_owner=True,
                             attempt=False)
        pairs.append((logical, ledger.begin_attempt(logical, name="plan",
                                                    open_logical=False)))
    clock.advance(1)
    (a_logical, a_first), (b_logical, b_first) = pairs
    a_next, b_next = new_id(), new_id()
    before = totals(ledger)
    ended = ledger.end_attempt([(a_first, "succeeded", "worker_completed")])
    assert ledger.begin_attempt(a_logical, name="act", open_logical=False,
                                attempt_id=a_next) == a_next
    once = totals(ledger)
    ended_b, begun = ledger.end_and_begin_attempt(
        [(b_first, "succeeded", "worker_completed")], b_logical, name="act",
        attempt_id=b_next)
    assert ended.closed == {a_first}
    assert begun == b_next and ended_b.closed == {b_first}
    assert not ended_b.marked and not ended_b.queued
    for a, b in ((a_logical, b_logical), (a_first, b_first), (a_next, b_next)):
        assert shape(ledger, a) == shape(ledger, b)
    assert {k: v - before.get(k, 0) for k, v in totals(ledger).items()} == {
        k: 2 * (once.get(k, 0) - before.get(k, 0)) for k in totals(ledger)}
    # A begin refused (its id taken): nothing begun, the end committed; a close refused is
    # reported as end_attempt reports it.
    clock.advance(1)
    ended_b, begun = ledger.end_and_begin_attempt(
        [(b_next, "failed", "worker_failed"), (b_first, "failed", None)], b_logical,
        name="again", attempt_id=a_next)
    assert begun is None and ended_b.closed == {b_next}
    assert ledger.get_task(b_next).status == "failed"
    assert [c.id for c in ledger.children_of(b_logical)] == [b_first, b_next]
    with pytest.raises(StateConflict):
        ledger.begin_attempt(b_logical, open_logical=False, attempt_id=a_next)
    # Under a missing logical task: the end commits, the begin is refused (begin_attempt
    # explains it: TaskNotFound).
    ended_b, begun = ledger.end_and_begin_attempt(
        [(a_next, "succeeded", None)], new_id(), name="x")
    assert begun is None and ended_b.closed == {a_next}
    # A retry queued by the end is the begin's to claim, as end_attempt then begin_attempt.
    clock.advance(1)
    retry = new_id()
    ended_b, begun = ledger.end_and_begin_attempt(
        [], b_logical, queue=[(retry, b_logical, "act", None)], name="act",
        candidates=[(new_id(), False), (retry, True)])
    assert ended_b.queued == {retry} and begun == retry
    assert ledger.get_task(retry).status == "running"
    for tid in [c.id for c in ledger.children_of(b_logical)] + [b_logical]:
        task = ledger.get_task(tid)
        chain = [(e.kind, e.state, e.code, e.at) for e in ledger.events_of(tid)]
        assert chain == rules.expected_events(task.to_dict()), task.to_dict()
    assert ledger.doctor()["healthy"] is True


@pytest.mark.sqlite_only(reason="events removed by hand from the SQLite file free their numbers")
def test_an_insert_whose_events_collide_is_refused_whole(db: str, ledger: Ledger, clock) -> None:
    """A file that kept the events of a task removed by hand gives its number to the next row:
    every insert of the two writes then fails (a rejected write) and writes nothing, instead of
    recording a task without its events."""
    import sqlite3

    logical = new_id()
    ledger.begin_attempt(logical, delivery_required=True, logical_owner=True, attempt=False)
    first = ledger.begin_attempt(logical, name="plan", open_logical=False)
    removed = ledger.begin_attempt(logical, name="plan", open_logical=False)
    with sqlite3.connect(db) as raw:  # the newest task's row removed, its events kept
        raw.execute("DELETE FROM tsg_tasks WHERE id = ?", (removed,))
    raw.close()
    clock.advance(1)
    before = ledger.status()["tasks"]
    writes = (
        lambda: ledger.begin_attempt(new_id()),  # a new logical task and its attempt
        lambda: ledger.begin_attempt(logical, open_logical=False),  # under a recorded one
        lambda: ledger.end_and_begin_attempt([(first, "succeeded", None)], logical),
        lambda: ledger.end_attempt([(first, "failed", "worker_failed")],
                                   queue=[(new_id(), logical, "plan", None)]),
    )
    for write in writes:
        with pytest.raises(StorageError) as refused:
            write()
        assert refused.value.reason == "write_rejected"
    assert ledger.status()["tasks"] == before
    assert [c.id for c in ledger.children_of(logical)] == [first]
    assert ledger.get_task(first).status == "running"
