"""Property test: random transition sequences (with clock jumps, regressions and reconcile
passes) behave exactly like a small reference model of the contract, dry-run always equals
apply at the same clock, and doctor stays healthy."""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core_helpers import T0, Clock, check_report, without_counts_flags
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ledger_backends import ledger_target
from task_state_guard import (
    InvalidInput,
    Ledger,
    LedgerError,
    ReconcilePolicy,
    StateConflict,
)

TERMINAL = ("succeeded", "failed", "timed_out", "cancelled")
DELIVERY = ("delivered", "failed", "not_applicable")
TASK_CODES = {
    "succeeded": {"completed", "worker_completed"},
    "failed": {"worker_failed", "retry_scheduled", "worker_lost"},
    "timed_out": {"deadline_exceeded", "restart_stale", "time_limit_exceeded", "owner_lost"},
    "cancelled": {"caller_cancelled", "revoked", "interrupted", "skipped"},
}
DELIVERY_CODES = {
    "delivered": {"transport_acknowledged"},
    "failed": {"delivery_grace_expired", "transport_failed"},
    "not_applicable": {"internal_task"},
}
CODES = [None, "completed", "worker_failed", "owner_lost", "revoked", "transport_acknowledged",
         "transport_failed", "internal_task", "created", "bogus"]


@dataclass
class M:
    """The reference model of one task."""

    id: str
    parent: str | None
    required: bool
    timeout: float | None
    created: float
    status: str = "queued"
    terminal_code: str | None = None
    delivery: str = "pending"
    dcode: str | None = None
    started: float | None = None
    heartbeat: float | None = None
    closed: float | None = None
    dclosed: float | None = None
    updated: float = 0.0  # last task-state change or heartbeat (not delivery)
    version: int = 0  # state and delivery changes
    children: list[str] = field(default_factory=list)

    def latest(self) -> float:
        times = (self.created, self.started, self.heartbeat, self.closed, self.dclosed,
                 self.updated)
        return max(t for t in times if t is not None)

    def events(self) -> int:
        return 1 + (self.started is not None) + (self.closed is not None) + (
            self.dclosed is not None)


ops = st.one_of(
    st.tuples(st.just("create"), st.integers(0, 7), st.booleans(),
              st.sampled_from([None, 30.0, 100.0]), st.booleans()),
    st.tuples(st.just("start"), st.integers(0, 7), st.booleans()),
    st.tuples(st.just("heartbeat"), st.integers(0, 7)),
    st.tuples(st.just("close"), st.integers(0, 7), st.sampled_from(TERMINAL),
              st.sampled_from(CODES)),
    st.tuples(st.just("delivery"), st.integers(0, 7), st.sampled_from(DELIVERY),
              st.sampled_from(CODES)),
    st.tuples(st.just("tick"), st.sampled_from([-200.0, -1.0, 0.0, 0.5, 30.0, 100.0, 600.0])),
    st.tuples(st.just("tick"), st.sampled_from([30.0, 100.0, 600.0])),
    st.tuples(st.just("reconcile"), st.sampled_from([0.0, 30.0, 100.0, 600.0]),
              st.sampled_from([0.0, 30.0, 100.0, 600.0])),
    st.tuples(st.just("reconcile"), st.sampled_from([30.0, 100.0]), st.sampled_from([30.0, 100.0])),
)


def expected_reconcile(model: dict[str, M], order: list[str], now: float,
                       policy: ReconcilePolicy) -> dict[str, int]:
    """Apply the contract's reconcile rules to the model; return the expected counts."""
    counts = dict.fromkeys(("active_examined", "tasks_timed_out", "fresh_active_retained",
                            "pending_delivery_examined", "deliveries_failed",
                            "deliveries_not_applicable", "pending_delivery_retained"), 0)
    timed_out: set[str] = set()
    kept_active: set[str] = set()
    for tid in reversed(order):  # children (created later) are decided first
        m = model[tid]
        if m.status not in ("queued", "running"):
            continue
        counts["active_examined"] += 1
        code = None
        if m.status == "running":
            latest = max(t for t in (m.created, m.started, m.heartbeat) if t is not None)
            deadline = None if m.timeout is None else m.started + m.timeout  # type: ignore[operator]
            if latest > now:
                code = None
            elif deadline is not None and deadline <= now:
                code = "deadline_exceeded"
            elif max(t for t in (m.started, m.heartbeat) if t is not None) <= (
                now - policy.active_grace_seconds
            ) and not any(c in kept_active for c in m.children):
                code = "restart_stale"
        if code is None:
            counts["fresh_active_retained"] += 1
            kept_active.add(tid)
        else:
            counts["tasks_timed_out"] += 1
            timed_out.add(tid)
            m.status, m.terminal_code, m.closed, m.updated = "timed_out", code, now, now
            m.version += 1
    for tid in order:
        m = model[tid]
        if m.status in TERMINAL and m.delivery == "pending":
            counts["pending_delivery_examined"] += 1
            assert m.closed is not None
            # a delivery nobody is owed closes with the task this pass times out
            owed_later = m.required or tid not in timed_out
            if owed_later and m.closed > now - policy.delivery_grace_seconds:
                counts["pending_delivery_retained"] += 1
            elif m.required:
                counts["deliveries_failed"] += 1
                m.delivery, m.dcode, m.dclosed = "failed", "delivery_grace_expired", now
                m.version += 1
            else:
                counts["deliveries_not_applicable"] += 1
                m.delivery, m.dcode, m.dclosed = "not_applicable", "internal_task", now
                m.version += 1
    return counts


def step(led: Ledger, clock: Clock, model: dict[str, M], order: list[str], op: tuple) -> None:
    kind = op[0]
    now = clock.t
    if kind == "tick":
        clock.advance(op[1])
        return
    if kind == "reconcile":
        policy = ReconcilePolicy(active_grace_seconds=op[1], delivery_grace_seconds=op[2])
        preview = led.reconcile(policy, dry_run=True)
        applied = led.reconcile(policy)
        check_report(preview, dry_run=True)
        check_report(applied, dry_run=False)
        assert without_counts_flags(preview) == without_counts_flags(applied)
        assert without_counts_flags(applied) == expected_reconcile(model, order, now, policy)
        return
    if kind == "create":
        parent = order[op[1] % len(order)] if (order and op[4]) else None
        expect: type[LedgerError] | None = None
        if parent is not None and now < model[parent].created:
            expect = StateConflict
        try:
            task = led.create_task(parent_id=parent, delivery_required=op[2],
                                   timeout_seconds=op[3])
        except LedgerError as exc:
            assert expect is not None and type(exc) is expect, (op, exc)
            return
        assert expect is None, op
        model[task.id] = M(task.id, parent, op[2], op[3], now, updated=now)
        order.append(task.id)
        if parent is not None:
            model[parent].children.append(task.id)
        return
    if not order:
        return
    m = model[order[op[1] % len(order)]]
    expect = None
    if kind == "start":
        if m.status != "queued" or now < m.latest():
            expect = StateConflict
        call = lambda: led.start_task(m.id, owner=op[2])  # noqa: E731
    elif kind == "heartbeat":
        if m.status != "running" or now < m.latest():
            expect = StateConflict
        call = lambda: led.heartbeat(m.id)  # noqa: E731
    elif kind == "close":
        state, code = op[2], op[3]
        bad_code = code is not None and code not in TASK_CODES[state]
        if m.status in TERMINAL:  # the same close again is the stored task, whatever its code
            expect = StateConflict if m.status != state else None
        elif now < m.latest():
            expect = StateConflict
        elif bad_code:
            expect = InvalidInput
        call = lambda: led.close_task(m.id, state, code=code)  # noqa: E731
    else:
        state, code = op[2], op[3]
        bad_code = code is not None and code not in DELIVERY_CODES[state]
        if m.status not in TERMINAL:
            expect = StateConflict
        elif m.delivery != "pending":
            expect = StateConflict if m.delivery != state else (
                InvalidInput if bad_code else None)
        elif m.required == (state == "not_applicable") or now < m.latest():
            expect = StateConflict
        elif bad_code:
            expect = InvalidInput
        call = lambda: led.set_delivery(m.id, state, code=code)  # noqa: E731
    before = led.get_task(m.id)
    try:
        result = call()
    except LedgerError as exc:
        assert expect is not None and type(exc) is expect, (op, m, exc)
        assert led.get_task(m.id) == before
        return
    assert expect is None, (op, m, result)
    if kind == "start":
        m.status, m.started, m.updated = "running", now, now
        m.version += 1
    elif kind == "heartbeat":
        m.heartbeat = m.updated = now  # no version change
    elif kind == "close" and m.status not in TERMINAL:
        m.status, m.terminal_code, m.closed, m.updated = op[2], op[3], now, now
        m.version += 1
    elif kind == "delivery" and m.delivery == "pending":
        m.delivery, m.dcode, m.dclosed = op[2], op[3], now
        m.version += 1
    assert result == led.get_task(m.id)


def check_model(led: Ledger, model: dict[str, M]) -> None:
    for m in model.values():
        t = led.get_task(m.id)
        got = (t.status, t.terminal_code, t.delivery_status, t.delivery_code, t.started_at,
               t.heartbeat_at, t.ended_at, t.delivery_updated_at, t.updated_at, t.parent_id,
               t.version)
        want = (m.status, m.terminal_code, m.delivery, m.dcode, m.started, m.heartbeat, m.closed,
                m.created if m.dclosed is None else m.dclosed, m.updated, m.parent, m.version)
        assert got == want, (m, t)


#: Examples per backend: every example is a fresh ledger, which on PostgreSQL is a schema
#: created and dropped, so that half runs fewer (derandomized: the same first examples).
EXAMPLES = {"sqlite": 150, "postgresql": 50}


def test_random_sequences_follow_the_model_and_keep_doctor_healthy(backend: str) -> None:
    @settings(
        max_examples=EXAMPLES[backend],
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(st.lists(ops, min_size=1, max_size=40))
    def run(sequence: list[Any]) -> None:
        base = tempfile.mkdtemp(prefix="tsg-prop-")
        try:
            clock = Clock(T0)
            model: dict[str, M] = {}
            order: list[str] = []
            with ledger_target(backend, Path(base)) as target, Ledger(target, clock=clock) as led:
                for op in sequence:
                    step(led, clock, model, order, op)
                check_model(led, model)
                report = led.doctor()
                assert report["healthy"] is True, report
                assert report["task_count"] == len(model)
                assert report["event_count"] == sum(m.events() for m in model.values())
        finally:
            shutil.rmtree(base, ignore_errors=True)

    run()
