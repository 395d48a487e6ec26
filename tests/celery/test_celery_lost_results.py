"""Reconcile's verdicts reach Celery's result backend and the ``on_lost`` hook.

Real ``celery worker`` processes, SIGKILLed mid-task, on Redis and on RabbitMQ, with the Redis
result backend and with an SQL result backend (SQLAlchemy on PostgreSQL). Each row asserts what
a user sees (``AsyncResult.state``, ``AsyncResult.get()``), what the hook received, and that
doctor stays healthy.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import states  # type: ignore[import-untyped]
from celery.exceptions import TaskRevokedError, WorkerLostError  # type: ignore[import-untyped]
from celery_harness import BROKER, Scenario, ledger_on, require_service, wait_for
from task_state_guard_celery import TaskLostError

SQL_BACKEND = "db+postgresql+psycopg://postgres@127.0.0.1:5432/test"
RABBIT_BROKER = "amqp://guest:guest@127.0.0.1:5672//"


@pytest.fixture(
    params=[("redis", "redis"), ("rabbitmq", "redis"), ("redis", "sql"), ("rabbitmq", "sql")],
    ids=["redis-broker-redis-backend", "rabbitmq-broker-redis-backend",
         "redis-broker-sql-backend", "rabbitmq-broker-sql-backend"],
)
def lost_scenario(
    request: pytest.FixtureRequest, tmp_path: Path, backend: str
) -> Iterator[Scenario]:
    broker_kind, backend_kind = request.param
    broker = BROKER
    if broker_kind == "rabbitmq":
        require_service(5672, "RabbitMQ")
        broker = RABBIT_BROKER
    results = None
    if backend_kind == "sql":
        require_service(5432, "PostgreSQL")
        results = SQL_BACKEND
    with ledger_on(backend, tmp_path) as db:
        sc = Scenario(tmp_path, db=db, broker=broker, backend=results, track_started=True)
        try:
            yield sc
        finally:
            sc.close()


@pytest.fixture
def tracked(tmp_path: Path, backend: str) -> Iterator[Scenario]:
    with ledger_on(backend, tmp_path) as db:
        sc = Scenario(tmp_path, db=db, track_started=True)
        try:
            yield sc
        finally:
            sc.close()


def _started(scenario: Scenario, result: Any, marker: str) -> None:
    scenario.marker(marker)
    wait_for(lambda: result.state == states.STARTED, 30, what="STARTED in the backend")
    scenario.wait_attempts(result.id, lambda a: any(str(t.status) == "running" for t in a))


def _assert_no_ids(text: str, *ids: str) -> None:
    for task_id in ids:
        assert task_id not in text, task_id


def test_worker_sigkill_then_restart_fails_the_started_result(lost_scenario: Scenario) -> None:
    """STARTED -> FAILURE with TaskLostError(owner_lost) after the restart's boot reconcile;
    the hook gets the Celery task id, the name and the code."""
    scenario = lost_scenario
    worker = scenario.start_worker(TSGT_ON_LOST=1)
    result = scenario.send("tsgt.sleep", 120, "lost")
    expected = "DatabaseBackend" if scenario.backend else "RedisBackend"
    assert type(result.backend).__name__ == expected
    _started(scenario, result, "lost")
    worker.sigkill()
    assert result.state == states.STARTED  # nothing told the backend: the user's complaint

    restarted = scenario.start_worker(TSGT_ON_LOST=1)
    assert result.state == states.FAILURE
    with pytest.raises(WorkerLostError) as caught:
        result.get(timeout=10)
    assert type(caught.value).__name__ == "TaskLostError"
    assert isinstance(caught.value, TaskLostError)
    assert caught.value.args[1] == "owner_lost" and caught.value.code == "owner_lost"
    assert "owner_lost" in str(caught.value.args[0])

    parent = scenario.parent(result.id)
    assert (str(parent.status), parent.terminal_code) == ("timed_out", "owner_lost")
    assert parent.framework_id == result.id  # the ledger maps back to the Celery id
    calls = scenario.lost_hook_calls()
    assert list(calls) == [result.id]
    assert calls[result.id] == {
        "framework_id": result.id,
        "task_id": parent.id,
        "name": "tsgt.sleep",
        "code": "owner_lost",
        "pid": restarted.pid,  # the boot reconcile runs in the worker's main process
    }
    log = restarted.log()
    assert '"tasks_timed_out":2' in log, log
    assert "task-state-guard: ledger error" not in log, log
    # Aggregate output (the logged reconcile report) never names a task.
    report_lines = [line for line in log.splitlines() if "task-state-guard: reconcile (" in line]
    assert report_lines
    _assert_no_ids("\n".join(report_lines), result.id, parent.id)
    # The worker keeps serving.
    after = scenario.send("tsgt.ok")
    assert after.get(timeout=20) == "ok"
    assert after.state == states.SUCCESS
    scenario.assert_healthy()


@pytest.mark.parametrize("settled", [states.SUCCESS, states.REVOKED, states.FAILURE])
def test_settled_results_are_never_overwritten(tracked: Scenario, settled: str) -> None:
    """A task the backend already reports settled keeps that state. ``REVOKED``/``FAILURE``:
    the ledger still closes it lost and the hook still fires. ``SUCCESS``: the next worker's
    reconcile reads it first and closes the task ``succeeded``; no hook call (Celery saw it
    succeed: never lost)."""
    scenario = tracked
    worker = scenario.start_worker(TSGT_ON_LOST=1)
    result = scenario.send("tsgt.sleep", 120, "settled")
    _started(scenario, result, "settled")
    worker.sigkill()
    backend = scenario.client.backend
    if settled == states.SUCCESS:
        backend.store_result(result.id, "stored elsewhere", states.SUCCESS)
    elif settled == states.REVOKED:
        backend.store_result(result.id, TaskRevokedError("revoked"), states.REVOKED)
    else:
        backend.store_result(result.id, ValueError("its own failure"), states.FAILURE)
    scenario.start_worker(TSGT_ON_LOST=1)
    assert result.state == settled
    if settled == states.SUCCESS:
        assert result.get(timeout=10) == "stored elsewhere"
        assert scenario.outcome(result.id)[0] == ("succeeded", "worker_completed")
        assert scenario.lost_hook_calls() == {}
    else:
        if settled == states.FAILURE:
            assert isinstance(result.result, ValueError)
        assert scenario.outcome(result.id)[0] == ("timed_out", "owner_lost")
        assert scenario.lost_hook_calls()[result.id]["code"] == "owner_lost"
    scenario.assert_healthy()


def test_opt_out_leaves_the_backend_alone_but_fires_the_hook(tracked: Scenario) -> None:
    scenario = tracked
    worker = scenario.start_worker(TSGT_ON_LOST=1, TSG_FAIL_LOST_RESULTS="false")
    result = scenario.send("tsgt.sleep", 120, "optout")
    _started(scenario, result, "optout")
    worker.sigkill()
    scenario.start_worker(TSGT_ON_LOST=1, TSG_FAIL_LOST_RESULTS="false")
    assert scenario.outcome(result.id)[0] == ("timed_out", "owner_lost")
    assert result.state == states.STARTED
    assert scenario.lost_hook_calls()[result.id]["code"] == "owner_lost"
    scenario.assert_healthy()


def test_periodic_reconcile_in_a_fleet_that_never_restarts(tracked: Scenario) -> None:
    """Worker A dies; worker B, running all along, closes A's task with its periodic reconcile
    (reconcile_interval_seconds) and fails the result; nobody restarts anything."""
    scenario = tracked
    victim = scenario.start_worker()
    result = scenario.send("tsgt.sleep", 120, "fleet")
    _started(scenario, result, "fleet")
    survivor = scenario.start_worker(TSGT_ON_LOST=1, TSG_RECONCILE_INTERVAL_SECONDS=0.5)
    assert '"tasks_timed_out":0' in survivor.log()  # A is alive at B's boot: nothing closed
    assert result.state == states.STARTED
    victim.sigkill()
    wait_for(lambda: result.state == states.FAILURE, 60, what="FAILURE from the periodic pass")
    with pytest.raises(TaskLostError):
        result.get(timeout=10)
    assert scenario.outcome(result.id)[0] == ("timed_out", "owner_lost")
    call = wait_for(lambda: scenario.lost_hook_calls().get(result.id), 10, what="the hook")
    assert call["pid"] == survivor.pid and call["code"] == "owner_lost"
    assert survivor.proc.poll() is None
    # the pass logs its report once it returns, after the verdict it published was seen above
    wait_for(lambda: "task-state-guard: reconcile (periodic_reconcile)" in survivor.log(), 10,
             what="the periodic pass's log line")
    scenario.assert_healthy()


def test_custom_task_id_is_never_stored(tracked: Scenario) -> None:
    """A Celery id that is not a canonical UUID may carry user data: it is not stored, so the
    lost task cannot be addressed in the result backend; the verdict still reaches the hook,
    with the ledger id and the name."""
    scenario = tracked
    custom = f"user-42-invoice-{uuid.uuid4().hex[:6]}"
    worker = scenario.start_worker(TSGT_ON_LOST=1)
    result = scenario.send("tsgt.sleep", 120, "custom", task_id=custom)
    _started(scenario, result, "custom")
    parent = scenario.parent(custom)
    assert parent.framework_id is None
    worker.sigkill()
    scenario.start_worker(TSGT_ON_LOST=1)
    assert scenario.outcome(custom)[0] == ("timed_out", "owner_lost")
    assert result.state == states.STARTED
    calls = scenario.lost_hook_calls()
    assert list(calls) == [parent.id]
    assert {k: v for k, v in calls[parent.id].items() if k != "pid"} == {
        "framework_id": None, "task_id": parent.id, "name": "tsgt.sleep", "code": "owner_lost"}
    _assert_no_ids(json.dumps(scenario.ledger.status()), custom, parent.id)
    scenario.assert_healthy()
