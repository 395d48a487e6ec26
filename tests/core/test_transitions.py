"""Issue 2 item 3-4: the two state machines, the reason-code registry, error precedence,
clock regression and the event chain, through the public Python API."""

from __future__ import annotations

import uuid

import pytest
from core_helpers import event_count
from task_state_guard import (
    DeliveryStatus,
    InvalidInput,
    Ledger,
    LedgerError,
    StateConflict,
    StorageError,
    TaskNotFound,
    TaskStatus,
    payload_fingerprint,
)

TERMINAL = ["succeeded", "failed", "timed_out", "cancelled"]
TASK_CODES = {
    "succeeded": ["completed", "worker_completed"],
    "failed": ["worker_failed", "retry_scheduled", "worker_lost"],
    "timed_out": ["deadline_exceeded", "restart_stale", "time_limit_exceeded", "owner_lost"],
    "cancelled": ["caller_cancelled", "revoked", "interrupted", "skipped", "rejected", "ignored"],
}
DELIVERY_CODES = {
    "delivered": ["transport_acknowledged"],
    "failed": ["delivery_grace_expired", "transport_failed"],
    "not_applicable": ["internal_task"],
}
ALL_TASK_CODES = sorted({c for codes in TASK_CODES.values() for c in codes})
ALL_DELIVERY_CODES = sorted({c for codes in DELIVERY_CODES.values() for c in codes})
ALL_CODES = sorted(set(ALL_TASK_CODES) | set(ALL_DELIVERY_CODES) | {"created", "started"})


def test_public_error_hierarchy() -> None:
    for cls in (InvalidInput, TaskNotFound, StateConflict, StorageError):
        assert issubclass(cls, LedgerError)


def test_create_start_close_deliver_lifecycle(ledger: Ledger, clock) -> None:
    task = ledger.create_task(timeout_seconds=900)
    assert task.status == "queued" and task.delivery_status == "pending"
    assert uuid.UUID(task.id) and str(uuid.UUID(task.id)) == task.id
    assert task.created_at == clock.t and task.is_terminal is False
    clock.advance(1)
    running = ledger.start_task(task.id)
    assert running.status == "running" and running.started_at == clock.t
    assert running.deadline_at == clock.t + 900 and running.has_owner
    clock.advance(1)
    closed = ledger.close_task(task.id, "succeeded", code="worker_completed")
    assert closed.status == "succeeded" and closed.terminal_code == "worker_completed"
    assert closed.ended_at == clock.t and closed.is_terminal
    clock.advance(1)
    done = ledger.set_delivery(task.id, "delivered", code="transport_acknowledged")
    assert done.delivery_status == "delivered" and done.delivery_code == "transport_acknowledged"
    assert done.delivery_updated_at == clock.t
    assert ledger.get_task(task.id) == done
    assert ledger.doctor()["healthy"] is True


def test_enums_are_accepted_as_states(ledger: Ledger) -> None:
    task = ledger.create_task()
    ledger.close_task(task.id, TaskStatus.CANCELLED, code="caller_cancelled")
    assert ledger.set_delivery(task.id, DeliveryStatus.FAILED).delivery_status == "failed"


@pytest.mark.parametrize("first", TERMINAL)
@pytest.mark.parametrize("start", [False, True])
def test_terminal_states_are_immutable(ledger: Ledger, clock, first: str, start: bool) -> None:
    task = ledger.create_task()
    if start:
        ledger.start_task(task.id, owner=False)
    ledger.close_task(task.id, first)
    before = ledger.get_task(task.id)
    events = event_count(ledger)
    clock.advance(10)
    for other in TERMINAL:
        if other != first:
            with pytest.raises(StateConflict):
                ledger.close_task(task.id, other)
    with pytest.raises(StateConflict):
        ledger.start_task(task.id)
    with pytest.raises(StateConflict):
        ledger.heartbeat(task.id)
    assert ledger.get_task(task.id) == before
    assert event_count(ledger) == events


@pytest.mark.parametrize("state", TERMINAL)
def test_identical_repeat_is_idempotent_and_keeps_original_code(
    ledger: Ledger, clock, state: str
) -> None:
    codes = TASK_CODES[state]
    task = ledger.create_task()
    first = ledger.close_task(task.id, state, code=codes[0])
    events = event_count(ledger)
    clock.advance(5)
    again = ledger.close_task(task.id, state, code=codes[-1])
    assert again == first and again.terminal_code == codes[0] and again.ended_at == first.ended_at
    assert ledger.close_task(task.id, state).terminal_code == codes[0]
    assert ledger.get_task(task.id) == first
    assert event_count(ledger) == events


def test_repeat_without_code_keeps_no_code(ledger: Ledger, clock) -> None:
    task = ledger.create_task()
    ledger.close_task(task.id, "failed")
    clock.advance(1)
    assert ledger.close_task(task.id, "failed", code="worker_failed").terminal_code is None


@pytest.mark.parametrize("state", ["delivered", "failed"])
def test_delivery_repeat_idempotent_and_conflict(ledger: Ledger, clock, state: str) -> None:
    task = ledger.create_task()
    ledger.close_task(task.id, "succeeded")
    first = ledger.set_delivery(task.id, state, code=DELIVERY_CODES[state][0])
    events = event_count(ledger)
    clock.advance(3)
    again = ledger.set_delivery(task.id, state, code=DELIVERY_CODES[state][-1])
    assert again == first and again.delivery_code == DELIVERY_CODES[state][0]
    other = "failed" if state == "delivered" else "delivered"
    with pytest.raises(StateConflict):
        ledger.set_delivery(task.id, other)
    with pytest.raises(StateConflict):
        ledger.set_delivery(task.id, "not_applicable")
    assert ledger.get_task(task.id) == first
    assert event_count(ledger) == events


@pytest.mark.parametrize("state", ["delivered", "failed", "not_applicable"])
@pytest.mark.parametrize("start", [False, True])
def test_delivery_only_after_terminal(ledger: Ledger, state: str, start: bool) -> None:
    task = ledger.create_task(delivery_required=state != "not_applicable")
    if start:
        ledger.start_task(task.id, owner=False)
    with pytest.raises(StateConflict):
        ledger.set_delivery(task.id, state)
    assert ledger.get_task(task.id).delivery_status == "pending"


@pytest.mark.parametrize("terminal", TERMINAL)
def test_delivering_task_never_not_applicable(ledger: Ledger, terminal: str) -> None:
    task = ledger.create_task(delivery_required=True)
    ledger.close_task(task.id, terminal)
    with pytest.raises(StateConflict):
        ledger.set_delivery(task.id, "not_applicable")
    with pytest.raises(StateConflict):
        ledger.set_delivery(task.id, "not_applicable", code="internal_task")
    assert ledger.get_task(task.id).delivery_status == "pending"
    assert ledger.set_delivery(task.id, "failed").delivery_status == "failed"


@pytest.mark.parametrize("state", ["delivered", "failed"])
def test_internal_task_only_not_applicable(ledger: Ledger, state: str) -> None:
    task = ledger.create_task(delivery_required=False)
    ledger.close_task(task.id, "succeeded")
    with pytest.raises(StateConflict):
        ledger.set_delivery(task.id, state)
    assert ledger.get_task(task.id).delivery_status == "pending"
    done = ledger.set_delivery(task.id, "not_applicable", code="internal_task")
    assert done.delivery_status == "not_applicable" and done.delivery_code == "internal_task"


# ----------------------------------------------------------------------------- registry


@pytest.mark.parametrize("state", TERMINAL)
@pytest.mark.parametrize("code", ALL_CODES)
def test_task_code_registry_bound_to_state(ledger: Ledger, state: str, code: str) -> None:
    task = ledger.create_task()
    if code in TASK_CODES[state]:
        assert ledger.close_task(task.id, state, code=code).terminal_code == code
        assert ledger.doctor()["healthy"] is True
    else:
        with pytest.raises(InvalidInput):
            ledger.close_task(task.id, state, code=code)
        assert ledger.get_task(task.id).status == "queued"


@pytest.mark.parametrize("state", sorted(DELIVERY_CODES))
@pytest.mark.parametrize("code", ALL_CODES)
def test_delivery_code_registry_bound_to_state(ledger: Ledger, state: str, code: str) -> None:
    task = ledger.create_task(delivery_required=state != "not_applicable")
    ledger.close_task(task.id, "succeeded")
    if code in DELIVERY_CODES[state]:
        assert ledger.set_delivery(task.id, state, code=code).delivery_code == code
    else:
        with pytest.raises(InvalidInput):
            ledger.set_delivery(task.id, state, code=code)
        assert ledger.get_task(task.id).delivery_status == "pending"


@pytest.mark.parametrize("code", ["", "Completed", "completed ", "free text", "x" * 500, "ok"])
def test_free_text_codes_rejected(ledger: Ledger, code: str) -> None:
    task = ledger.create_task()
    with pytest.raises(InvalidInput):
        ledger.close_task(task.id, "succeeded", code=code)


@pytest.mark.parametrize("code", [1, 1.5, b"completed", ["completed"], True])
def test_non_string_code_is_bad_input(ledger: Ledger, code: object) -> None:
    task = ledger.create_task()
    with pytest.raises(InvalidInput):
        ledger.close_task(task.id, "succeeded", code=code)  # type: ignore[arg-type]
    # bad input comes before an unknown id
    with pytest.raises(InvalidInput):
        ledger.close_task(str(uuid.uuid4()), "succeeded", code=code)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- precedence


def test_error_precedence_close(ledger: Ledger) -> None:
    unknown = str(uuid.uuid4())
    done = ledger.create_task()
    ledger.close_task(done.id, "failed", code="worker_failed")
    # bad input first: malformed id or unknown state beats everything else
    with pytest.raises(InvalidInput):
        ledger.close_task("not-a-uuid", "bogus", code="bogus")
    with pytest.raises(InvalidInput):
        ledger.close_task(unknown, "bogus", code="bogus")
    with pytest.raises(InvalidInput):
        ledger.close_task(done.id, "running")
    with pytest.raises(InvalidInput):
        ledger.close_task(done.id, "queued")
    # then the unknown id
    with pytest.raises(TaskNotFound):
        ledger.close_task(unknown, "succeeded", code="bogus")
    with pytest.raises(TaskNotFound):
        ledger.close_task(unknown, "succeeded", code="transport_acknowledged")
    # then the state conflict
    with pytest.raises(StateConflict):
        ledger.close_task(done.id, "succeeded", code="bogus")
    with pytest.raises(StateConflict):
        ledger.close_task(done.id, "succeeded", code="worker_failed")
    # a repeat of the same close is idempotent whatever its code (0.1.0): the stored task
    for code in ("bogus", "worker_completed", "transport_acknowledged", None):
        again = ledger.close_task(done.id, "failed", code=code)
        assert again == ledger.get_task(done.id) and again.terminal_code == "worker_failed"
    # and the bad code last, on an open task
    fresh = ledger.create_task()
    with pytest.raises(InvalidInput):
        ledger.close_task(fresh.id, "succeeded", code="worker_failed")
    assert ledger.get_task(fresh.id).status == "queued"


def test_error_precedence_delivery(ledger: Ledger) -> None:
    unknown = str(uuid.uuid4())
    queued = ledger.create_task()
    internal = ledger.create_task(delivery_required=False)
    ledger.close_task(internal.id, "succeeded")
    with pytest.raises(InvalidInput):
        ledger.set_delivery("nope", "bogus")
    with pytest.raises(InvalidInput):
        ledger.set_delivery(unknown, "pending")
    with pytest.raises(InvalidInput):
        ledger.set_delivery(unknown, "bogus", code="bogus")
    with pytest.raises(TaskNotFound):
        ledger.set_delivery(unknown, "delivered", code="bogus")
    with pytest.raises(StateConflict):
        ledger.set_delivery(queued.id, "delivered", code="bogus")
    with pytest.raises(StateConflict):
        ledger.set_delivery(internal.id, "delivered", code="bogus")
    with pytest.raises(InvalidInput):
        ledger.set_delivery(internal.id, "not_applicable", code="transport_failed")
    assert ledger.get_task(internal.id).delivery_status == "pending"


def test_error_precedence_start_heartbeat_reads(ledger: Ledger) -> None:
    unknown = str(uuid.uuid4())
    for call in (ledger.start_task, ledger.heartbeat, ledger.get_task, ledger.children_of):
        with pytest.raises(InvalidInput):
            call("X" * 36)
        with pytest.raises(InvalidInput):
            call(unknown[:-1])
        with pytest.raises(TaskNotFound):
            call(unknown)
    queued = ledger.create_task()
    with pytest.raises(StateConflict):
        ledger.heartbeat(queued.id)
    ledger.start_task(queued.id)
    with pytest.raises(StateConflict):
        ledger.start_task(queued.id)


def test_uuid_objects_accepted(ledger: Ledger) -> None:
    tid = uuid.uuid4()
    task = ledger.create_task(task_id=tid)
    assert task.id == str(tid)
    assert ledger.get_task(tid).id == str(tid)


# ----------------------------------------------------------------------------- clock


def test_clock_regression_rejected_for_every_transition(ledger: Ledger, clock) -> None:
    task = ledger.create_task()
    clock.advance(-1)
    with pytest.raises(StateConflict):
        ledger.start_task(task.id)
    clock.advance(1)
    ledger.start_task(task.id, owner=False)
    clock.advance(10)
    ledger.heartbeat(task.id)
    clock.advance(-5)
    with pytest.raises(StateConflict):
        ledger.heartbeat(task.id)
    with pytest.raises(StateConflict):
        ledger.close_task(task.id, "succeeded")
    assert ledger.heartbeat_many([task.id]) == 0
    clock.advance(5)
    ledger.close_task(task.id, "succeeded")
    clock.advance(-0.5)
    with pytest.raises(StateConflict):
        ledger.set_delivery(task.id, "delivered")
    # a clock regression is a state conflict, so it outranks a bad code
    with pytest.raises(StateConflict):
        ledger.set_delivery(task.id, "delivered", code="bogus")
    clock.advance(0.5)
    ledger.set_delivery(task.id, "delivered")
    assert ledger.doctor()["healthy"] is True


def test_clock_regression_for_queued_close_and_child_creation(ledger: Ledger, clock) -> None:
    parent = ledger.create_task()
    clock.advance(-1)
    with pytest.raises(StateConflict):
        ledger.close_task(parent.id, "cancelled")
    with pytest.raises(StateConflict):
        ledger.create_task(parent_id=parent.id)
    assert ledger.children_of(parent.id) == []
    clock.advance(1)
    child = ledger.create_task(parent_id=parent.id)
    assert [t.id for t in ledger.children_of(parent.id)] == [child.id]


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1.0, "now", None, True])
def test_clock_returning_garbage_is_rejected(db: str, bad: object) -> None:
    # refused by the first write (SQLite) or by the open, which reads the clock (PostgreSQL)
    with pytest.raises(LedgerError), Ledger(db, clock=lambda: bad) as led:  # type: ignore[arg-type,return-value]
        led.create_task()


# ----------------------------------------------------------------------------- events


def test_every_state_change_writes_one_event_heartbeats_none(ledger: Ledger, clock) -> None:
    assert event_count(ledger) == 0
    task = ledger.create_task()
    assert event_count(ledger) == 1
    clock.advance(1)
    ledger.start_task(task.id)
    assert event_count(ledger) == 2
    for _ in range(3):
        clock.advance(1)
        ledger.heartbeat(task.id)
        assert ledger.heartbeat_many([task.id]) == 1
    assert event_count(ledger) == 2
    clock.advance(1)
    ledger.close_task(task.id, "succeeded")
    assert event_count(ledger) == 3
    ledger.close_task(task.id, "succeeded")  # idempotent: no event
    assert event_count(ledger) == 3
    ledger.set_delivery(task.id, "delivered")
    assert event_count(ledger) == 4
    with pytest.raises(StateConflict):
        ledger.set_delivery(task.id, "failed")  # rejected: no event
    assert event_count(ledger) == 4
    report = ledger.doctor()
    assert report["healthy"] is True and report["task_count"] == 1


def test_heartbeat_updates_only_heartbeat(ledger: Ledger, clock) -> None:
    task = ledger.create_task()
    started = ledger.start_task(task.id, owner=False)
    clock.advance(7)
    beat = ledger.heartbeat(task.id)
    assert beat.heartbeat_at == clock.t
    assert beat.status == "running" and beat.started_at == started.started_at
    assert ledger.get_task(task.id).heartbeat_at == clock.t


def test_heartbeat_many_counts_only_running(ledger: Ledger, clock) -> None:
    running = [ledger.create_task() for _ in range(3)]
    for t in running:
        ledger.start_task(t.id, owner=False)
    queued = ledger.create_task()
    closed = ledger.create_task()
    ledger.close_task(closed.id, "cancelled")
    clock.advance(2)
    ids = [t.id for t in running] + [queued.id, closed.id, str(uuid.uuid4())]
    assert ledger.heartbeat_many(ids) == 3
    assert ledger.heartbeat_many([]) == 0
    assert all(ledger.get_task(t.id).heartbeat_at == clock.t for t in running)
    with pytest.raises(InvalidInput):
        ledger.heartbeat_many(["nope"])


# ----------------------------------------------------------------------------- create


def test_create_with_explicit_id_is_idempotent(ledger: Ledger, clock) -> None:
    tid = str(uuid.uuid4())
    parent = ledger.create_task()
    first = ledger.create_task(
        task_id=tid, parent_id=parent.id, timeout_seconds=30, delivery_required=False,
        name="app.tasks:add", payload_hash=payload_fingerprint(b"x"),
    )
    events = event_count(ledger)
    clock.advance(4)
    again = ledger.create_task(
        task_id=tid, parent_id=parent.id, timeout_seconds=30, delivery_required=False,
        name="app.tasks:add", payload_hash=payload_fingerprint(b"x"),
    )
    assert again == first and again.created_at == first.created_at
    assert event_count(ledger) == events
    for changed in (
        {"parent_id": None},
        {"timeout_seconds": 31},
        {"delivery_required": True},
        {"name": "other"},
        {"payload_hash": None},
    ):
        kwargs = {
            "task_id": tid, "parent_id": parent.id, "timeout_seconds": 30,
            "delivery_required": False, "name": "app.tasks:add",
            "payload_hash": payload_fingerprint(b"x"),
        }
        kwargs.update(changed)
        with pytest.raises(StateConflict):
            ledger.create_task(**kwargs)  # type: ignore[arg-type]
    assert ledger.get_task(tid) == first


def test_create_with_unknown_parent(ledger: Ledger) -> None:
    with pytest.raises(TaskNotFound):
        ledger.create_task(parent_id=str(uuid.uuid4()))
    with pytest.raises(InvalidInput):
        ledger.create_task(parent_id="parent")
    assert ledger.doctor()["task_count"] == 0


@pytest.mark.parametrize(
    "name",
    ["a", "app.tasks:add", "_x", "<lambda>", "graph/node-1", "A" * 200, "Z9_.:-/<>"],
)
def test_valid_names(ledger: Ledger, name: str) -> None:
    task = ledger.create_task(name=name)
    assert task.name == name and ledger.get_task(task.id).to_dict(extras=True)["name"] == name


@pytest.mark.parametrize(
    "name", ["", "A" * 201, "has space", "-lead", ".lead", "new\nline", "é", "a;b", 5]
)
def test_invalid_names(ledger: Ledger, name: object) -> None:
    with pytest.raises(InvalidInput):
        ledger.create_task(name=name)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"timeout_seconds": -1},
        {"timeout_seconds": float("nan")},
        {"timeout_seconds": float("inf")},
        {"timeout_seconds": "10"},
        {"timeout_seconds": True},
        {"delivery_required": 1},
        {"payload_hash": "ABC"},
        {"payload_hash": "A" * 64},
        {"task_id": "not-a-uuid"},
        {"task_id": "{" + str(uuid.uuid4()) + "}"},
    ],
)
def test_create_rejects_bad_input(ledger: Ledger, kwargs: dict) -> None:
    with pytest.raises(InvalidInput):
        ledger.create_task(**kwargs)
    assert ledger.doctor()["task_count"] == 0


def test_payload_fingerprint_hidden_by_default(ledger: Ledger) -> None:
    digest = payload_fingerprint(b"secret payload")
    task = ledger.create_task(payload_hash=digest)
    assert task.has_payload_hash is True
    public = task.to_dict()
    assert "payload_hash" not in public and public["has_payload_hash"] is True
    assert digest not in repr(public)
    assert task.to_dict(include_payload_hash=True)["payload_hash"] == digest
    assert set(public) == {
        "id", "parent_id", "status", "delivery_status", "delivery_required", "has_payload_hash",
        "timeout_seconds", "created_at", "started_at", "updated_at", "ended_at", "deadline_at",
        "delivery_updated_at", "terminal_code", "delivery_code", "version",
    }
    assert set(task.to_dict(include_payload_hash=True)) == set(public) | {"payload_hash"}
    assert set(task.to_dict(extras=True)) == set(public) | {
        "name", "heartbeat_at", "has_owner", "framework_id"
    }


def test_children_of_lists_direct_children_oldest_first(ledger: Ledger, clock) -> None:
    root = ledger.create_task()
    kids = []
    for _ in range(3):
        clock.advance(1)
        kids.append(ledger.create_task(parent_id=root.id, delivery_required=False))
    ledger.create_task(parent_id=kids[0].id)  # grandchild: not a direct child
    assert [t.id for t in ledger.children_of(root.id)] == [k.id for k in kids]
    assert all(t.parent_id == root.id for t in ledger.children_of(root.id))


def test_find_task_ids(ledger: Ledger, clock) -> None:
    old = ledger.create_task()
    ledger.start_task(old.id, owner=False)
    clock.advance(100)
    new = ledger.create_task()
    ledger.start_task(new.id, owner=False)
    assert ledger.find_task_ids("running") == [old.id, new.id]
    assert ledger.find_task_ids("running", stale_seconds=50) == [old.id]
    assert ledger.find_task_ids("running", limit=1) == [old.id]
    assert ledger.find_task_ids("queued") == []
    with pytest.raises(InvalidInput):
        ledger.find_task_ids("bogus")


def test_closed_ledger_cannot_be_used(db: str, clock) -> None:
    led = Ledger(db, clock=clock)
    led.close()
    with pytest.raises(LedgerError):
        led.create_task()
