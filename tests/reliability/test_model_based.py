"""Model-based testing: the Ledger against a plain reference model of the specification.

A hypothesis ``RuleBasedStateMachine`` drives a real ledger (injected clock that only moves
forward) and ``RefModel`` - a few dicts implementing the two state machines, the reason-code
registry, idempotent/conflicting transitions, reconcile (deadline, parent freshness, owner
liveness, active grace, delivery grace) and prune - side by side. After every step the two
must agree on every task field, on status counts, and the ledger's doctor must be healthy.
Every reconcile runs as dry-run then apply at the same clock and both reports must equal the
model's.

Owner liveness is real, never faked: tasks started with ``owner=True`` in this process have a
live owner; "other process" owners are started by a forked helper process that really calls
``start_task(owner=True)`` and keeps its owner lock; the rule ``kill_helper`` SIGKILLs it, which
makes every task it started provably dead (the kernel drops its flock; on PostgreSQL the server
ends the helper's session, which releases its advisory owner lock, a moment after the kill).

The machine runs on each ledger backend (``test_ledger_matches_the_model[sqlite]`` and
``[postgresql]``), on a fresh ledger per example: a new file, or a new schema of its own (created
on the ledger's first open, dropped after the example). A PostgreSQL example costs several times
a SQLite one (a round trip per call, the schema's DDL): it runs ``TSG_MODEL_EXAMPLES_PG``
examples (default 20) against SQLite's ``TSG_MODEL_EXAMPLES`` (default 60), both of 40 steps.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import time
import uuid
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any

import hypothesis.strategies as st
import ledger_backends
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from task_state_guard import (
    InvalidInput,
    Ledger,
    LedgerError,
    ReconcilePolicy,
    StateConflict,
    TaskNotFound,
)

from .conftest import private_dir

TERMINAL = ("succeeded", "failed", "timed_out", "cancelled")
TASK_CODES = {
    "succeeded": {"completed", "worker_completed"},
    "failed": {"worker_failed", "retry_scheduled", "worker_lost"},
    "timed_out": {"deadline_exceeded", "restart_stale", "time_limit_exceeded", "owner_lost"},
    "cancelled": {"caller_cancelled", "revoked", "interrupted", "skipped", "rejected", "ignored"},
}
DELIVERY_CODES = {
    "delivered": {"transport_acknowledged"},
    "failed": {"delivery_grace_expired", "transport_failed"},
    "not_applicable": {"internal_task"},
}
ALL_TASK_CODES = [*sorted(set().union(*TASK_CODES.values())), "bogus_code", "created"]
ALL_DELIVERY_CODES = [*sorted(set().union(*DELIVERY_CODES.values())), "bogus_code", "started"]
GRACES = st.sampled_from([0.0, 5.0, 60.0, 600.0])


# ----------------------------------------------------------------------------- reference model
@dataclass
class MTask:
    id: str
    parent_id: str | None
    delivery_required: bool
    timeout_seconds: float | None
    created_at: float
    status: str = "queued"
    terminal_code: str | None = None
    delivery_status: str = "pending"
    delivery_code: str | None = None
    started_at: float | None = None
    heartbeat_at: float | None = None
    ended_at: float | None = None
    delivery_closed_at: float | None = None  # delivery_updated_at is created_at until then
    deadline_at: float | None = None
    updated_at: float = 0.0  # last task-state change or heartbeat
    version: int = 0  # state and delivery changes; heartbeats and repeats do not count
    owner: tuple[str, int] | None = None  # ("self", 0) or ("helper", generation)

    @property
    def delivery_updated_at(self) -> float:
        return self.created_at if self.delivery_closed_at is None else self.delivery_closed_at

    @property
    def last_change(self) -> float:
        return max(self.updated_at, self.delivery_updated_at)

    def events(self) -> int:
        return (1 + (self.started_at is not None) + (self.status in TERMINAL)
                + (self.delivery_status != "pending"))


class RefModel:
    """The specification's state machines, written plainly."""

    def __init__(self) -> None:
        self.tasks: dict[str, MTask] = {}
        self.order: list[str] = []  # creation order (= the ledger's seq order)
        self.dead_helpers: set[int] = set()
        #: Outcome totals: every close and delivery close ever made (prune lowers none).
        self.totals: Counter[tuple[str, str, str, str]] = Counter()

    def count_close(self, t: MTask) -> None:
        # a job (a root, or a child owing its own delivery) or an attempt (a child owing none)
        kind = "task" if t.parent_id is None or t.delivery_required else "attempt"
        self.totals[("closed", kind, t.status, t.terminal_code or "")] += 1

    def count_delivery(self, t: MTask) -> None:
        kind = "owed" if t.delivery_required else "internal"
        self.totals[("delivery", kind, t.delivery_status, t.delivery_code or "")] += 1

    def owner_dead(self, task: MTask) -> bool:
        return task.owner is not None and task.owner[0] == "helper" and (
            task.owner[1] in self.dead_helpers)

    def get(self, tid: str) -> MTask:
        if tid not in self.tasks:
            raise TaskNotFound
        return self.tasks[tid]

    def create(self, now: float, tid: str, parent: str | None, required: bool,
               timeout: float | None, explicit: bool) -> MTask:
        if explicit and tid in self.tasks:
            t = self.tasks[tid]
            if (t.parent_id, t.delivery_required, t.timeout_seconds) != (parent, required, timeout):
                raise StateConflict
            return t
        if parent is not None and parent not in self.tasks:
            raise TaskNotFound
        t = MTask(tid, parent, required, timeout, now, updated_at=now)
        self.tasks[tid] = t
        self.order.append(tid)
        return t

    def start(self, now: float, tid: str, owner: tuple[str, int] | None) -> MTask:
        t = self.get(tid)
        if t.status != "queued":
            raise StateConflict
        t.status, t.started_at, t.updated_at, t.owner = "running", now, now, owner
        t.version += 1
        t.deadline_at = None if t.timeout_seconds is None else now + t.timeout_seconds
        return t

    def heartbeat(self, now: float, tid: str) -> MTask:
        t = self.get(tid)
        if t.status != "running":
            raise StateConflict
        t.heartbeat_at = t.updated_at = now
        return t

    def heartbeat_many(self, now: float, ids: list[str]) -> int:
        count = 0
        for tid in ids:
            t = self.tasks.get(tid)
            if t is not None and t.status == "running":
                t.heartbeat_at = t.updated_at = now
                count += 1
        return count

    def close(self, now: float, tid: str, state: str, code: str | None) -> MTask:
        t = self.get(tid)
        valid = code is None or code in TASK_CODES[state]
        if t.status in TERMINAL:
            if t.status != state:
                raise StateConflict
            return t  # the same close again, whatever its code (0.1.0): the stored task
        if not valid:
            raise InvalidInput
        t.status, t.terminal_code, t.ended_at, t.updated_at = state, code, now, now
        t.version += 1
        self.count_close(t)
        return t

    def deliver(self, now: float, tid: str, state: str, code: str | None) -> MTask:
        t = self.get(tid)
        valid = code is None or code in DELIVERY_CODES[state]
        if t.status not in TERMINAL:
            raise StateConflict
        if t.delivery_status != "pending":
            if t.delivery_status != state:
                raise StateConflict
            if not valid:
                raise InvalidInput
            return t
        if t.delivery_required == (state == "not_applicable"):
            raise StateConflict
        if not valid:
            raise InvalidInput
        t.delivery_status, t.delivery_code = state, code
        t.delivery_closed_at = now
        t.version += 1
        self.count_delivery(t)
        return t

    def reconcile(self, now: float, active_grace: float, delivery_grace: float,
                  apply: bool) -> dict[str, Any]:
        tasks = {k: replace(v) for k, v in self.tasks.items()} if not apply else self.tasks
        counts = dict.fromkeys(
            ("active_examined", "tasks_timed_out", "fresh_active_retained",
             "pending_delivery_examined", "deliveries_failed", "deliveries_not_applicable",
             "pending_delivery_retained"), 0)
        timed_out: set[str] = set()
        children: dict[str, list[str]] = {}
        for tid in self.order:
            p = tasks[tid].parent_id
            if p is not None:
                children.setdefault(p, []).append(tid)
        # Newest first: a child is always decided before its parent ("this same pass").
        for tid in reversed(self.order):
            t = tasks[tid]
            if t.status not in ("queued", "running"):
                continue
            counts["active_examined"] += 1
            code = None
            if t.status == "running":
                assert t.started_at is not None
                last = t.started_at if t.heartbeat_at is None else max(t.started_at,
                                                                        t.heartbeat_at)
                dead = self.owner_dead(t)
                stale = last <= now - active_grace
                if t.deadline_at is not None and t.deadline_at <= now:
                    code = "deadline_exceeded"
                elif dead or stale:
                    fresh_child = any(
                        tasks[c].status == "queued"
                        or (tasks[c].status == "running" and c not in timed_out)
                        for c in children.get(tid, ()))
                    if not fresh_child:
                        code = "owner_lost" if dead else "restart_stale"
            if code is None:
                counts["fresh_active_retained"] += 1
                continue
            counts["tasks_timed_out"] += 1
            timed_out.add(tid)
            t.status, t.terminal_code, t.ended_at, t.updated_at = "timed_out", code, now, now
            t.version += 1
            if apply:
                self.count_close(t)
        for tid in self.order:
            t = tasks[tid]
            if t.status not in TERMINAL or t.delivery_status != "pending":
                continue
            counts["pending_delivery_examined"] += 1
            assert t.ended_at is not None
            owed_later = t.delivery_required or tid not in timed_out
            if owed_later and t.ended_at > now - delivery_grace:
                counts["pending_delivery_retained"] += 1
                continue
            if t.delivery_required:
                counts["deliveries_failed"] += 1
                t.delivery_status, t.delivery_code = "failed", "delivery_grace_expired"
            else:
                counts["deliveries_not_applicable"] += 1
                t.delivery_status, t.delivery_code = "not_applicable", "internal_task"
            t.delivery_closed_at = now
            t.version += 1
            if apply:
                self.count_delivery(t)
        return {**counts, "dry_run": not apply, "applied": apply}

    def prune(self, now: float, age: float, apply: bool) -> dict[str, Any]:
        cutoff = now - age
        out = {"trees_deleted": 0, "tasks_deleted": 0, "events_deleted": 0, "trees_retained": 0}
        doomed: list[str] = []
        for tid in self.order:
            root = self.tasks[tid]
            if (root.parent_id is not None or root.delivery_status == "pending"
                    or root.last_change > cutoff):
                continue
            tree, frontier = [], [tid]
            while frontier:
                cur = frontier.pop()
                tree.append(cur)
                frontier.extend(c for c in self.order if self.tasks[c].parent_id == cur)
            if all(self.tasks[c].status in TERMINAL and self.tasks[c].delivery_status != "pending"
                   and self.tasks[c].last_change <= cutoff for c in tree):
                out["trees_deleted"] += 1
                out["tasks_deleted"] += len(tree)
                out["events_deleted"] += sum(self.tasks[c].events() for c in tree)
                doomed.extend(tree)
            else:
                out["trees_retained"] += 1
        if apply:
            for tid in doomed:
                del self.tasks[tid]
            self.order = [t for t in self.order if t in self.tasks]
        return {"dry_run": not apply, "applied": apply, **out}


# ----------------------------------------------------------------------------- owner helper
class OwnerHelper:
    """A forked process that starts tasks with owner=True at a given clock and stays alive."""

    def __init__(self, db: str, generation: int) -> None:
        self.generation = generation
        to_child_r, to_child_w = os.pipe()
        to_parent_r, to_parent_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the child
            code = 0
            try:
                os.close(to_child_w)
                os.close(to_parent_r)
                now = [0.0]
                ledger = Ledger(db, clock=lambda: now[0])
                with os.fdopen(to_child_r) as inp, os.fdopen(to_parent_w, "w") as out:
                    for line in inp:
                        tid, when = line.split()
                        now[0] = float(when)
                        try:
                            ledger.start_task(tid, owner=True)
                            out.write("ok\n")
                        except LedgerError as exc:
                            out.write(type(exc).__name__ + "\n")
                        out.flush()
            except BaseException:
                code = 1
            finally:
                os._exit(code)
        os.close(to_child_r)
        os.close(to_parent_w)
        self.pid = pid
        self.inp = os.fdopen(to_child_w, "w")
        self.out = os.fdopen(to_parent_r)

    def start(self, tid: str, now: float) -> str:
        self.inp.write(f"{tid} {now!r}\n")
        self.inp.flush()
        return self.out.readline().strip()

    def kill(self) -> None:
        os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)
        self.inp.close()
        self.out.close()


ERRORS = {"StateConflict": StateConflict, "TaskNotFound": TaskNotFound,
          "InvalidInput": InvalidInput}


class LedgerVsModel(RuleBasedStateMachine):
    #: The ledger backend of the examples (set by the test before it runs the machine).
    backend = "sqlite"

    def __init__(self) -> None:
        super().__init__()
        self.dir = private_dir()
        self.stack = contextlib.ExitStack()
        self.stack.callback(shutil.rmtree, self.dir, ignore_errors=True)
        target = self.stack.enter_context(ledger_backends.ledger_target(self.backend, self.dir))
        self.now = 1_000_000.0
        self.ledger = Ledger(target, clock=lambda: self.now)
        self.model = RefModel()
        self.helper: OwnerHelper | None = None
        self.generation = 0

    def teardown(self) -> None:
        with self.stack:  # the ledger's schema is dropped (or its directory removed) last
            if self.helper is not None:
                self.helper.kill()
            self.ledger.close()

    def await_owner_deaths(self) -> None:
        """Wait (at most 30 s) until the ledger sees every task of a killed helper's owner as
        dead. SQLite: at once (the kernel released the flock before ``waitpid`` returned).
        PostgreSQL: once the server has ended the helper's session, a moment after the kill;
        a probe before that rightly finds the owner's lock still held."""
        want = sum(self.model.owner_dead(t) for t in self.model.tasks.values()
                   if t.status == "running")
        deadline = time.monotonic() + 30.0
        while (self.ledger.status(active_grace_seconds=600.0)["running_owner_dead"] != want
               and time.monotonic() < deadline):
            time.sleep(0.01)

    # -- helpers
    def both(self, real: Any, model: Any) -> tuple[Any, Any]:
        """Run the same call on both; exceptions must match by class."""
        try:
            expected = model()
        except (StateConflict, TaskNotFound, InvalidInput) as exc:
            expected = exc
        try:
            got = real()
        except LedgerError as exc:
            got = exc
        if isinstance(expected, Exception):
            assert type(got) is type(expected), (got, expected)
        else:
            assert not isinstance(got, Exception), (got, expected)
        return got, expected

    def pick(self, data: st.DataObject) -> str:
        # Creation order, not the (random) ids: hypothesis must replay the same choices.
        return data.draw(st.sampled_from(list(self.model.order)))

    def compare(self, task: Any, m: MTask) -> None:
        got = (task.id, task.parent_id, task.status, task.terminal_code, task.delivery_required,
               task.delivery_status, task.delivery_code, task.timeout_seconds, task.deadline_at,
               task.created_at, task.started_at, task.heartbeat_at, task.ended_at,
               task.delivery_updated_at, task.updated_at, task.has_owner, task.version)
        want = (m.id, m.parent_id, m.status, m.terminal_code, m.delivery_required,
                m.delivery_status, m.delivery_code, m.timeout_seconds, m.deadline_at,
                m.created_at, m.started_at, m.heartbeat_at, m.ended_at, m.delivery_updated_at,
                m.updated_at, m.owner is not None, m.version)
        assert got == want

    # -- rules
    @rule(dt=st.sampled_from([0.0, 0.5, 1.0, 4.0, 5.0, 30.0, 59.0, 60.0, 300.0, 600.0, 601.0]))
    def advance_clock(self, dt: float) -> None:
        self.now += dt

    @rule(data=st.data(), has_parent=st.booleans(), required=st.booleans(),
          timeout=st.sampled_from([None, 1.0, 30.0, 600.0]), explicit=st.booleans())
    def create(self, data: st.DataObject, has_parent: bool, required: bool,
               timeout: float | None, explicit: bool) -> None:
        parent = self.pick(data) if has_parent and self.model.tasks else None
        tid = str(uuid.uuid4())
        got, want = self.both(
            lambda: self.ledger.create_task(task_id=tid if explicit else None, parent_id=parent,
                                            delivery_required=required, timeout_seconds=timeout),
            lambda: self.model.create(self.now, tid, parent, required, timeout, explicit),
        )
        if not explicit and not isinstance(got, Exception):
            # The ledger chose the id: re-key the model entry.
            m = self.model.tasks.pop(tid)
            m.id = got.id
            self.model.tasks[got.id] = m
            self.model.order[-1] = got.id
            want = m
        if not isinstance(got, Exception):
            self.compare(got, want)

    @precondition(lambda self: self.model.tasks)
    @rule(data=st.data(), same=st.booleans())
    def create_again(self, data: st.DataObject, same: bool) -> None:
        m = self.model.tasks[self.pick(data)]
        required = m.delivery_required if same else not m.delivery_required
        got, want = self.both(
            lambda: self.ledger.create_task(task_id=m.id, parent_id=m.parent_id,
                                            delivery_required=required,
                                            timeout_seconds=m.timeout_seconds),
            lambda: self.model.create(self.now, m.id, m.parent_id, required, m.timeout_seconds,
                                      True),
        )
        if not isinstance(got, Exception):
            self.compare(got, want)

    @precondition(lambda self: self.model.tasks)
    @rule(data=st.data(), owner=st.sampled_from(["none", "self", "helper"]))
    def start(self, data: st.DataObject, owner: str) -> None:
        tid = self.pick(data)
        if owner == "helper":
            if self.helper is None:
                self.generation += 1
                self.helper = OwnerHelper(self.ledger.path, self.generation)
            result = self.helper.start(tid, self.now)
            try:
                self.model.start(self.now, tid, ("helper", self.generation))
                assert result == "ok", result
            except (StateConflict, TaskNotFound) as exc:
                assert result == type(exc).__name__
            return
        token = None if owner == "none" else ("self", 0)
        got, want = self.both(
            lambda: self.ledger.start_task(tid, owner=token is not None),
            lambda: self.model.start(self.now, tid, token),
        )
        if not isinstance(got, Exception):
            self.compare(got, want)

    @precondition(lambda self: self.helper is not None)
    @rule()
    def kill_helper(self) -> None:
        assert self.helper is not None
        self.helper.kill()
        self.model.dead_helpers.add(self.helper.generation)
        self.helper = None
        self.await_owner_deaths()

    @precondition(lambda self: self.model.tasks)
    @rule(data=st.data())
    def heartbeat(self, data: st.DataObject) -> None:
        tid = self.pick(data)
        got, want = self.both(lambda: self.ledger.heartbeat(tid),
                              lambda: self.model.heartbeat(self.now, tid))
        if not isinstance(got, Exception):
            self.compare(got, want)

    @precondition(lambda self: self.model.tasks)
    @rule(data=st.data(), ghost=st.booleans())
    def heartbeat_many(self, data: st.DataObject, ghost: bool) -> None:
        ids = data.draw(st.lists(st.sampled_from(list(self.model.order)), unique=True,
                                 max_size=6))
        if ghost:
            ids.append(str(uuid.uuid4()))
        got, want = self.both(lambda: self.ledger.heartbeat_many(ids),
                              lambda: self.model.heartbeat_many(self.now, ids))
        assert got == want

    @precondition(lambda self: self.model.tasks)
    @rule(data=st.data(), state=st.sampled_from(TERMINAL),
          code=st.one_of(st.none(), st.sampled_from(ALL_TASK_CODES)))
    def close(self, data: st.DataObject, state: str, code: str | None) -> None:
        tid = self.pick(data)
        got, want = self.both(lambda: self.ledger.close_task(tid, state, code=code),
                              lambda: self.model.close(self.now, tid, state, code))
        if not isinstance(got, Exception):
            self.compare(got, want)

    @precondition(lambda self: self.model.tasks)
    @rule(data=st.data(), state=st.sampled_from(["delivered", "failed", "not_applicable"]),
          code=st.one_of(st.none(), st.sampled_from(ALL_DELIVERY_CODES)))
    def deliver(self, data: st.DataObject, state: str, code: str | None) -> None:
        tid = self.pick(data)
        got, want = self.both(lambda: self.ledger.set_delivery(tid, state, code=code),
                              lambda: self.model.deliver(self.now, tid, state, code))
        if not isinstance(got, Exception):
            self.compare(got, want)

    @rule(op=st.sampled_from(["start", "heartbeat", "close", "deliver", "get", "child"]))
    def unknown_task(self, op: str) -> None:
        ghost = str(uuid.uuid4())
        calls = {
            "start": lambda: self.ledger.start_task(ghost, owner=False),
            "heartbeat": lambda: self.ledger.heartbeat(ghost),
            "close": lambda: self.ledger.close_task(ghost, "failed"),
            "deliver": lambda: self.ledger.set_delivery(ghost, "delivered"),
            "get": lambda: self.ledger.get_task(ghost),
            "child": lambda: self.ledger.create_task(parent_id=ghost),
        }
        try:
            calls[op]()
        except TaskNotFound:
            return
        raise AssertionError("an unknown id must raise TaskNotFound")

    @rule(active=GRACES, delivery=GRACES)
    def reconcile(self, active: float, delivery: float) -> None:
        policy = ReconcilePolicy(active_grace_seconds=active, delivery_grace_seconds=delivery)
        expected_preview = self.model.reconcile(self.now, active, delivery, apply=False)
        preview = self.ledger.reconcile(policy, dry_run=True)
        assert preview == expected_preview
        expected = self.model.reconcile(self.now, active, delivery, apply=True)
        applied = self.ledger.reconcile(policy)
        assert applied == expected
        strip = ("dry_run", "applied")
        assert {k: v for k, v in preview.items() if k not in strip} == {
            k: v for k, v in applied.items() if k not in strip}

    @rule(age=st.sampled_from([0.0, 5.0, 600.0]), dry=st.booleans())
    def prune(self, age: float, dry: bool) -> None:
        expected = self.model.prune(self.now, age, apply=not dry)
        assert self.ledger.prune(age, dry_run=dry) == expected

    # -- invariants
    @invariant()
    def tasks_match(self) -> None:
        for tid, m in self.model.tasks.items():
            self.compare(self.ledger.get_task(tid), m)
            kids = [t.id for t in self.ledger.children_of(tid)]
            assert kids == [c for c in self.model.order if self.model.tasks[c].parent_id == tid]

    @invariant()
    def status_and_doctor(self) -> None:
        report = self.ledger.status(active_grace_seconds=600.0)
        tasks = list(self.model.tasks.values())
        for state in ("queued", "running", *TERMINAL):
            assert report["tasks"][state] == sum(t.status == state for t in tasks)
        for state in ("pending", "delivered", "failed", "not_applicable"):
            assert report["deliveries"][state] == sum(t.delivery_status == state for t in tasks)
        for kind, is_job in (("task", True), ("attempt", False)):
            for state in ("queued", "running", *TERMINAL):
                assert report["tasks_by_kind"][kind][state] == sum(
                    t.status == state
                    and (t.parent_id is None or t.delivery_required) == is_job for t in tasks)
        for kind, owed in (("owed", True), ("internal", False)):
            for state in ("pending", "delivered", "failed", "not_applicable"):
                assert report["deliveries_by_kind"][kind][state] == sum(
                    t.delivery_status == state and t.delivery_required == owed for t in tasks)
        totals = Counter({
            (event, kind, state, code): n
            for event, key in (("closed", "outcomes_total"),
                               ("delivery", "delivery_outcomes_total"))
            for kind, states in report[key].items()
            for state, codes in states.items() for code, n in codes.items() if n})
        assert totals == self.model.totals  # never lowered by prune
        running = [t for t in tasks if t.status == "running"]
        assert report["running_owner_dead"] == sum(self.model.owner_dead(t) for t in running)
        assert report["running_past_deadline"] == sum(
            t.deadline_at is not None and t.deadline_at <= self.now for t in running)
        assert report["running_heartbeat_stale"] == sum(
            max(x for x in (t.started_at, t.heartbeat_at) if x is not None) <= self.now - 600
            for t in running)
        doctor = self.ledger.doctor()
        assert doctor["healthy"], doctor
        assert doctor["task_count"] == len(tasks)
        assert doctor["event_count"] == sum(t.events() for t in tasks)


EXAMPLES = {"sqlite": int(os.environ.get("TSG_MODEL_EXAMPLES", "60")),
            "postgresql": int(os.environ.get("TSG_MODEL_EXAMPLES_PG", "20"))}


def test_ledger_matches_the_model(backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(LedgerVsModel, "backend", backend)
    run_state_machine_as_test(LedgerVsModel, settings=settings(
        max_examples=EXAMPLES[backend],
        stateful_step_count=40,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    ))
