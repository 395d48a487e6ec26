"""Scenario rows: revoke/expire, time limits, Reject/Ignore, long task with periodic
reconcile, late completion after a timeout.

Most rows share one prefork worker (started once for this module and ledger backend,
consuming one queue per test) to keep the suite fast; each test still has its own queue and
task ids.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from celery_harness import Scenario, ledger_on, wait_for
from task_state_guard import Ledger, ReconcilePolicy

ROWS = [
    "revoke_eta",
    "revoke_terminate",
    "expired",
    "soft",
    "hard",
    "reject",
    "reject_requeue",
    "reject_requeue_acked",
    "ignore",
    "long",
]


@contextmanager
def _shared_worker(
    tmp: Path, backend: str
) -> Iterator[tuple[Scenario, dict[str, str]]]:
    queues = {row: f"tsgt-{uuid.uuid4().hex[:10]}-{row}" for row in ROWS}
    with ledger_on(backend, tmp) as db:
        base = Scenario(tmp, db=db, queues=list(queues.values()))
        base.heartbeat = 0.3
        base.start_worker()
        try:
            yield base, queues
        finally:
            base.close()


@pytest.fixture
def shared(
    per_backend: Any, backend: str, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Scenario, dict[str, str]]:
    """The module's worker on the test's ledger backend (started on first use)."""
    return per_backend.get(  # type: ignore[no-any-return]
        backend, lambda b: _shared_worker(tmp_path_factory.mktemp("lifecycle"), b))


def use(shared: tuple[Scenario, dict[str, str]], row: str) -> Scenario:
    base, queues = shared
    sc = Scenario(base.tmp, db=base.db, queue=queues[row])
    sc.workers = []  # the worker belongs to the module fixture
    return sc


def _running(attempts: list) -> bool:
    return any(str(a.status) == "running" for a in attempts)


def _scenario(shared: tuple[Scenario, dict[str, str]], row: str) -> Scenario:
    return use(shared, row)


def test_revoke_before_execution(shared: tuple[Scenario, dict[str, str]]) -> None:
    """revoke() of a received task waiting for its ETA: parent cancelled/revoked."""
    sc = _scenario(shared, "revoke_eta")
    try:
        result = sc.send("tsgt.ok", countdown=3)
        wait_for(lambda: str(sc.parent(result.id).status) == "queued", what="queued parent")
        sc.client.control.revoke(result.id)
        sc.wait_parent(result.id, "cancelled", timeout=20)
        assert sc.outcome(result.id) == (("cancelled", "revoked"), [])
        sc.assert_healthy()
    finally:
        sc.close()


def test_revoke_terminate(shared: tuple[Scenario, dict[str, str]]) -> None:
    """revoke(terminate=True) of a running task: attempt and parent cancelled/revoked."""
    sc = _scenario(shared, "revoke_terminate")
    try:
        result = sc.send("tsgt.sleep", 30, "terminate")
        sc.marker("terminate")
        sc.wait_attempts(result.id, _running)
        sc.client.control.revoke(result.id, terminate=True)
        sc.wait_parent(result.id, "cancelled")
        assert sc.outcome(result.id) == (("cancelled", "revoked"), [("cancelled", "revoked")])
        sc.assert_healthy()
    finally:
        sc.close()


def test_expired(shared: tuple[Scenario, dict[str, str]]) -> None:
    """A message that expired before it was received: parent cancelled/revoked."""
    sc = _scenario(shared, "expired")
    try:
        past = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=30)
        result = sc.send("tsgt.ok", expires=past)
        sc.wait_parent(result.id, "cancelled")
        assert sc.outcome(result.id) == (("cancelled", "revoked"), [])
        sc.assert_healthy()
    finally:
        sc.close()


def test_soft_time_limit(shared: tuple[Scenario, dict[str, str]]) -> None:
    sc = _scenario(shared, "soft")
    try:
        result = sc.send("tsgt.soft_limited")
        sc.wait_parent(result.id, "timed_out")
        assert sc.outcome(result.id) == (
            ("timed_out", "time_limit_exceeded"),
            [("timed_out", "time_limit_exceeded")],
        )
        sc.assert_healthy()
    finally:
        sc.close()


def test_hard_time_limit_double_failure_is_idempotent(
    shared: tuple[Scenario, dict[str, str]],
) -> None:
    """Hard limit: Celery sends task_failure twice in the main process; one close."""
    sc = _scenario(shared, "hard")
    base = shared[0]
    before = base.workers[0].log()
    try:
        result = sc.send("tsgt.hard_limited")
        sc.wait_parent(result.id, "timed_out", timeout=20)
        assert sc.outcome(result.id) == (
            ("timed_out", "time_limit_exceeded"),
            [("timed_out", "time_limit_exceeded")],
        )
        # Both task_failure signals have been handled once the replacement child is up;
        # give the second one a moment, then check that nothing conflicted.
        time.sleep(0.5)
        new = base.workers[0].log()[len(before) :]
        assert " refused: " not in new and "ledger error" not in new, new
        sc.assert_healthy()
    finally:
        sc.close()


def test_reject(shared: tuple[Scenario, dict[str, str]]) -> None:
    """Reject(requeue=False): Celery stores FAILURE (and sends task_failure, in the worker's
    main process); the ledger closes the job failed/worker_failed when it happens."""
    sc = _scenario(shared, "reject")
    base = shared[0]
    before = base.workers[0].log()
    try:
        result = sc.send("tsgt.reject")
        sc.wait_parent(result.id, "failed")
        assert sc.outcome(result.id) == (("failed", "worker_failed"),
                                         [("failed", "worker_failed")])
        wait_for(lambda: result.state == "FAILURE", what="Celery's FAILURE")
        # The main process's task_failure closes the same way: nothing conflicted.
        time.sleep(0.5)
        new = base.workers[0].log()[len(before):]
        assert " refused: " not in new and "ledger error" not in new, new
        sc.assert_healthy()
    finally:
        sc.close()


def test_reject_requeue_of_an_acknowledged_message(
    shared: tuple[Scenario, dict[str, str]],
) -> None:
    """Reject(requeue=True) with early acks: the message is gone, nothing runs it again and
    Celery stores no outcome (the result stays PENDING); the ledger closes the job
    cancelled/rejected (a documented difference)."""
    sc = _scenario(shared, "reject_requeue_acked")
    try:
        result = sc.send("tsgt.reject_requeue_acked")
        sc.wait_parent(result.id, "cancelled")
        assert sc.outcome(result.id) == (("cancelled", "rejected"),
                                         [("cancelled", "rejected")])
        assert result.state == "PENDING"
        sc.assert_healthy()
    finally:
        sc.close()


def test_reject_requeue_continues_as_new_attempt(shared: tuple[Scenario, dict[str, str]]) -> None:
    sc = _scenario(shared, "reject_requeue")
    try:
        result = sc.send("tsgt.reject_once")
        assert result.get(timeout=20) == "accepted"
        sc.wait_parent(result.id, "succeeded")
        assert sc.outcome(result.id) == (
            ("succeeded", "worker_completed"),
            [("cancelled", "rejected"), ("succeeded", "worker_completed")],
        )
        sc.assert_healthy()
    finally:
        sc.close()


def test_ignore(shared: tuple[Scenario, dict[str, str]]) -> None:
    sc = _scenario(shared, "ignore")
    try:
        result = sc.send("tsgt.ignore")
        sc.wait_parent(result.id, "cancelled")
        assert sc.outcome(result.id) == (("cancelled", "ignored"), [("cancelled", "ignored")])
        sc.assert_healthy()
    finally:
        sc.close()


def test_long_task_with_periodic_reconcile(shared: tuple[Scenario, dict[str, str]]) -> None:
    """A task running 3x the active grace stays running (heartbeats), then succeeds."""
    sc = _scenario(shared, "long")
    grace = 1.5
    stop = threading.Event()
    reports: list[dict] = []

    def loop() -> None:
        with Ledger(sc.db) as ledger:
            policy = ReconcilePolicy(active_grace_seconds=grace, delivery_grace_seconds=600)
            while not stop.is_set():
                reports.append(ledger.reconcile(policy))
                time.sleep(0.2)

    thread = threading.Thread(target=loop, daemon=True)
    try:
        result = sc.send("tsgt.sleep", 3 * grace, "long")
        sc.marker("long")
        sc.wait_attempts(result.id, _running)
        thread.start()
        assert result.get(timeout=30) == "slept"
        sc.wait_parent(result.id, "succeeded")
        stop.set()
        thread.join(5)
        assert len(reports) >= 10
        assert sum(r["tasks_timed_out"] for r in reports) == 0
        assert sum(r["fresh_active_retained"] for r in reports) >= 10
        assert sc.outcome(result.id) == (
            ("succeeded", "worker_completed"),
            [("succeeded", "worker_completed")],
        )
        sc.assert_healthy()
    finally:
        stop.set()
        if thread.is_alive():
            thread.join(5)
        sc.close()


def test_late_completion_after_timeout_is_a_counted_conflict(scenario: Scenario) -> None:
    """An attempt past its deadline is timed out by reconcile; its late success is logged
    and counted as a rejected conflict and never rewrites the record."""
    worker = scenario.start_worker()
    result = scenario.send("tsgt.deadline", 2.5, "late")
    scenario.marker("late")
    attempts = scenario.wait_attempts(result.id, _running)
    attempt_id = attempts[0].id

    def timed_out() -> bool:
        scenario.reconcile()
        return str(scenario.ledger.get_task(attempt_id).status) == "timed_out"

    wait_for(timed_out, timeout=10, interval=0.1, what="deadline timeout")
    assert result.get(timeout=20) == "late"
    scenario.wait_parent(result.id, "succeeded")
    attempt = scenario.ledger.get_task(attempt_id)
    assert (str(attempt.status), attempt.terminal_code) == ("timed_out", "deadline_exceeded")
    # The pool child logs the refusal after its close transaction: the ledger may show the
    # outcome before the line reaches the worker's log.
    refused = "task-state-guard: attempt_close refused"
    wait_for(lambda: refused in worker.log(), timeout=20, what="the refusal in the log")
    log = worker.log()
    assert log.count(refused) == 1, log
    # The timed-out attempt still owed nobody a delivery: closed with the refused completion.
    assert (str(attempt.delivery_status), attempt.delivery_code) == (
        "not_applicable", "internal_task"
    )
    scenario.assert_healthy()

