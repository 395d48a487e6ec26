"""Lost tasks are reported once, whoever reconciled: real ``celery worker`` processes on Redis
and on RabbitMQ, SQLite and PostgreSQL ledgers, SIGKILL, and an operator's ``tsg reconcile``
from the CLI (a process with no adapter at all).

The reconcile that closes a lost task records its verdict in the ledger; a worker publishes it
when it starts (before it consumes) or, when it runs already, on its periodic interval:
``FAILURE`` with ``TaskLostError`` in the result backend and ``on_lost`` exactly once.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ledger_backends
import pytest
from celery import states  # type: ignore[import-untyped]
from celery_harness import BROKER, Scenario, require_service, wait_for
from task_state_guard_celery import TaskLostError
from verdict_checks import tsg

RABBIT_BROKER = "amqp://guest:guest@127.0.0.1:5672//"
INTERVAL = 1.0  # the surviving worker's periodic reconcile (and publish)


@pytest.fixture(
    params=[("redis", "sqlite"), ("rabbitmq", "postgresql")],
    ids=["redis-broker-sqlite-ledger", "rabbitmq-broker-postgresql-ledger"],
)
def lost(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Scenario]:
    broker_kind, ledger_kind = request.param
    broker = BROKER
    if broker_kind == "rabbitmq":
        require_service(5672, "RabbitMQ")
        broker = RABBIT_BROKER
    with ledger_backends.ledger_target(ledger_kind, tmp_path) as db:
        if ledger_kind == "sqlite":
            Path(db).parent.mkdir(mode=0o700)
        sc = Scenario(tmp_path, db=db, broker=broker, track_started=True)
        try:
            yield sc
        finally:
            sc.close()




def _running_task(scenario: Scenario, marker: str) -> Any:
    result = scenario.send("tsgt.sleep", 120, marker)
    scenario.marker(marker)
    wait_for(lambda: result.state == states.STARTED, 30, what="STARTED in the backend")
    scenario.wait_attempts(result.id, lambda a: any(str(t.status) == "running" for t in a))
    return result


def _failed_lost(result: Any) -> None:
    assert result.state == states.FAILURE
    with pytest.raises(TaskLostError) as caught:
        result.get(timeout=10)
    assert caught.value.code == "owner_lost"


def _verdicts(scenario: Scenario) -> dict[str, int]:
    owed = tsg(scenario.db, "status")["status"]["verdicts"]
    return {"pending": owed["pending"]["celery"], "published": owed["published"]["celery"]}


def test_an_operator_reconcile_is_published_by_the_next_worker_at_boot(lost: Scenario) -> None:
    scenario = lost
    victim = scenario.start_worker(TSGT_ON_LOST=1)
    result = _running_task(scenario, "boot")
    victim.sigkill()

    report = tsg(scenario.db, "reconcile")["reconcile"]  # default graces: the owner is dead
    assert report["tasks_timed_out"] == 2  # the logical task and its attempt, closed here
    assert str(scenario.parent(result.id).status) == "timed_out"
    assert result.state == states.STARTED  # nobody has told the backend yet
    assert _verdicts(scenario) == {"pending": 1, "published": 0}

    restarted = scenario.start_worker(TSGT_ON_LOST=1)  # publishes before it consumes
    _failed_lost(result)
    calls = scenario.lost_hook_calls()
    assert list(calls) == [result.id]
    assert calls[result.id]["pid"] == restarted.pid and calls[result.id]["code"] == "owner_lost"
    assert '"tasks_timed_out":0' in restarted.log()  # its own pass found nothing left to close
    assert _verdicts(scenario) == {"pending": 0, "published": 1}
    assert result.id not in json.dumps(tsg(scenario.db, "status"))

    scenario.start_worker(TSGT_ON_LOST=1)  # another worker later: nothing is published twice
    assert list(scenario.lost_hook_calls()) == [result.id]
    scenario.assert_healthy()


def test_a_running_worker_publishes_within_its_periodic_interval(lost: Scenario) -> None:
    """Nobody restarts: the surviving worker publishes what a reconcile closed (the operator's
    CLI pass, or its own next pass, whichever came first) within its periodic interval."""
    scenario = lost
    victim = scenario.start_worker(TSGT_ON_LOST=1)
    result = _running_task(scenario, "periodic")
    survivor = scenario.start_worker(TSGT_ON_LOST=1, TSG_RECONCILE_INTERVAL_SECONDS=INTERVAL)
    assert result.state == states.STARTED  # the victim is alive at the survivor's boot
    victim.sigkill()

    tsg(scenario.db, "reconcile")
    closed = time.monotonic()
    wait_for(lambda: result.state == states.FAILURE, 30, what="FAILURE from the survivor")
    published_after = time.monotonic() - closed
    _failed_lost(result)
    call = wait_for(lambda: scenario.lost_hook_calls().get(result.id), 10, what="the hook")
    assert call["pid"] == survivor.pid
    assert _verdicts(scenario) == {"pending": 0, "published": 1}
    time.sleep(3 * INTERVAL)  # more periodic passes: none publishes it again
    assert list(scenario.lost_hook_calls()) == [result.id]
    assert survivor.proc.poll() is None
    assert "task-state-guard: ledger error" not in survivor.log()
    print(json.dumps({"published_after_seconds": round(published_after, 2)}))
    scenario.assert_healthy()
