"""Every transition, on each backend, writes exactly the events the domain rules say.

The rules (``task_state_guard.rules``) are stated once; SQLite's triggers, PostgreSQL's event
function and its reconcile pass statements are rendered from them. Here each transition the
public API offers runs for real, and each task's recorded chain (``events_of``) must equal
:func:`rules.expected_events` of the task as it is stored: a backend whose triggers or pass
statements drift from the rules fails here.
"""

from __future__ import annotations

from typing import Any

import pytest
from core_helpers import Clock
from task_state_guard import Ledger, rules
from task_state_guard.model import DELIVERY_CODES, TASK_CODES


def _chain(ledger: Ledger, task_id: str) -> list[tuple[str, Any, Any, Any]]:
    return [(e.kind, e.state, e.code, e.at) for e in ledger.events_of(task_id)]


def _check(ledger: Ledger, task_ids: list[str]) -> int:
    """Compare every task's chain with the rules; return how many events were compared."""
    compared = 0
    for tid in task_ids:
        task = ledger.get_task(tid)
        expected = rules.expected_events(task.to_dict())
        assert _chain(ledger, tid) == expected, task.to_dict()
        compared += len(expected)
    return compared


def test_every_close_and_delivery_writes_the_ruled_events(ledger: Ledger, clock: Clock) -> None:
    ids: list[str] = []
    # created only; cancelled while queued (no start)
    ids.append(ledger.create_task().id)
    queued = ledger.create_task(delivery_required=False).id
    clock.advance(1)
    ledger.close_task(queued, "cancelled", code="revoked")
    ids.append(queued)
    # every terminal state with every code (and none), from running, then every delivery
    deliveries = [(state, code) for state in ("delivered", "failed")
                  for code in (None, *sorted(DELIVERY_CODES[state]))]
    n = 0
    for state, codes in TASK_CODES.items():
        for code in (None, *sorted(codes)):
            tid = ledger.create_task(timeout_seconds=100).id
            clock.advance(1)
            ledger.start_task(tid, owner=False)
            clock.advance(1)
            ledger.heartbeat(tid)  # writes no event
            clock.advance(1)
            ledger.close_task(tid, state, code=code)
            clock.advance(1)
            delivery, dcode = deliveries[n % len(deliveries)]
            n += 1
            ledger.set_delivery(tid, delivery, code=dcode)
            ids.append(tid)
    # an attempt under a logical task, closed with its delivery settled in one statement
    parent = ledger.create_task().id
    attempt = ledger.create_task(parent_id=parent, delivery_required=False).id
    clock.advance(1)
    ledger.start_task(attempt, owner=False)
    clock.advance(1)
    ledger.close_task_settled(attempt, "succeeded", code="worker_completed")
    ledger.set_delivery(attempt, "not_applicable", code="internal_task")  # a repeat: no event
    ids += [parent, attempt]
    # a group of transitions in one transaction
    with ledger.atomic():
        grouped = ledger.create_task(delivery_required=False).id
        ledger.start_task(grouped, owner=False)
        ledger.close_task_settled(grouped, "failed", code="worker_failed")
    ids.append(grouped)
    assert _check(ledger, ids) == 1 + 2 + 4 * (len(ids) - 5) + 1 + 4 + 4


@pytest.mark.parametrize("dry_run_first", [True, False])
def test_reconcile_passes_write_the_ruled_events(
    ledger: Ledger, clock: Clock, dry_run_first: bool
) -> None:
    ids: list[str] = []
    late = ledger.create_task(timeout_seconds=5).id  # past its deadline
    ledger.start_task(late, owner=False)
    stale = ledger.create_task().id  # no sign of life past the active grace
    ledger.start_task(stale, owner=False)
    parent = ledger.create_task().id  # a logical task whose only attempt goes stale too
    ledger.start_task(parent, owner=False)
    attempt = ledger.create_task(parent_id=parent, delivery_required=False).id
    ledger.start_task(attempt, owner=False)
    owed = ledger.create_task().id  # closed, its delivery never confirmed
    ledger.start_task(owed, owner=False)
    ledger.close_task(owed, "succeeded", code="completed")
    internal = ledger.create_task(delivery_required=False).id  # closed, delivery left open
    ledger.close_task(internal, "cancelled", code="skipped")
    ids += [late, stale, parent, attempt, owed, internal]
    clock.advance(1000)
    if dry_run_first:
        ledger.reconcile(active_grace_seconds=60, delivery_grace_seconds=60, dry_run=True)
        assert _check(ledger, ids) == 2 + 2 + 2 + 2 + 3 + 2  # a dry run writes nothing
    report = ledger.reconcile(active_grace_seconds=60, delivery_grace_seconds=60)
    assert report["tasks_timed_out"] == 4
    assert report["deliveries_failed"] == 1  # the owed one; the others' grace starts now
    assert report["deliveries_not_applicable"] == 2  # the attempt's, the internal task's
    assert ledger.get_task(late).terminal_code == "deadline_exceeded"
    assert ledger.get_task(stale).terminal_code == "restart_stale"
    assert _check(ledger, ids) == 3 + 3 + 3 + 4 + 4 + 3
    clock.advance(1000)
    report = ledger.reconcile(active_grace_seconds=60, delivery_grace_seconds=60)
    assert report["deliveries_failed"] == 3  # late, stale and parent, past their grace
    assert _check(ledger, ids) == 4 * 6 - 1  # the internal task never started


def test_rows_inserted_past_a_transition_write_the_ruled_events(
    ledger: Ledger, clock: Clock
) -> None:
    """*Begin attempt* inserts a new logical task and its attempt already running (the rules'
    ``inserted`` condition); each holds the chain of a create and a start at the same instant,
    as a task recorded earlier and started by the same begin does."""
    assert any(rule.inserted is not None for rule in rules.EVENT_RULES)
    fresh = "0000000e-0000-4000-8000-000000000001"
    attempt = ledger.begin_attempt(fresh, delivery_required=True, timeout_seconds=5.0)
    recorded = ledger.create_task(delivery_required=True).id  # inserted queued
    clock.advance(1)
    later = ledger.begin_attempt(recorded, candidates=[(attempt, True)])  # started, not made
    ids = [fresh, attempt, recorded, later]
    assert _check(ledger, ids) == 2 * len(ids)
    for tid in (fresh, attempt):
        chain = _chain(ledger, tid)
        assert [e[0] for e in chain] == ["created", "started"] and chain[0][3] == chain[1][3]
    assert ledger.get_task(fresh).version == ledger.get_task(recorded).version == 1
