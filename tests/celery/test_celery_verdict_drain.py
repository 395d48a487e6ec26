"""Under the default settings (no reconcile interval), a running Celery worker publishes what an
operator's ``tsg reconcile`` found lost beside it, within its verdict interval: real ``celery
worker`` processes on Redis, SIGKILL of a whole worker (main process and pool children), the
real CLI, a SQLite or PostgreSQL ledger. Nothing is restarted.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import states  # type: ignore[import-untyped]
from celery_harness import Scenario, ledger_on, wait_for
from task_state_guard.integration.settings import DEFAULT_VERDICT_INTERVAL_SECONDS
from task_state_guard_celery import TaskLostError
from verdict_checks import tsg

#: How long after the operator's reconcile the result and the hook may take: the default
#: verdict interval plus 5 s.
PUBLISH_WITHIN = DEFAULT_VERDICT_INTERVAL_SECONDS + 5


@pytest.fixture
def started(tmp_path: Path, backend: str) -> Iterator[Scenario]:
    with ledger_on(backend, tmp_path) as db:
        sc = Scenario(tmp_path, db=db, track_started=True)
        try:
            yield sc
        finally:
            sc.close()


def _remaining(deadline: float) -> float:
    return max(0.1, deadline - time.monotonic())


def test_a_running_worker_publishes_an_operator_reconcile_under_defaults(
    started: Scenario,
) -> None:
    scenario = started
    env = scenario.env()
    assert "TSG_RECONCILE_INTERVAL_SECONDS" not in env  # the defaults: no periodic reconcile
    assert "TSG_VERDICT_INTERVAL_SECONDS" not in env  # and the default verdict interval
    victim = scenario.start_worker(TSGT_ON_LOST=1)  # worker B
    result = scenario.send("tsgt.sleep", 120, "drain")
    scenario.marker("drain")
    wait_for(lambda: result.state == states.STARTED, 30, what="STARTED in the backend")
    scenario.wait_attempts(result.id, lambda a: any(str(t.status) == "running" for t in a))
    survivor = scenario.start_worker(TSGT_ON_LOST=1)  # worker A: keeps running throughout
    assert result.state == states.STARTED  # A's boot found nothing lost: B is alive

    os.killpg(victim.pid, signal.SIGKILL)  # the whole worker B: main process and pool
    victim.proc.wait(10)
    report = tsg(scenario.db, "reconcile")["reconcile"]  # the operator, default graces
    deadline = time.monotonic() + PUBLISH_WITHIN
    assert report["tasks_timed_out"] == 2  # the logical task and its attempt
    owed = tsg(scenario.db, "status")["status"]["verdicts"]
    assert owed["pending"]["celery"] + owed["published"]["celery"] == 1

    wait_for(lambda: result.state == states.FAILURE, _remaining(deadline),
             what="FAILURE written by the running worker")
    with pytest.raises(TaskLostError) as caught:
        result.get(timeout=10)
    assert caught.value.code == "owner_lost"
    call: Any = wait_for(lambda: scenario.lost_hook_calls().get(result.id),
                         _remaining(deadline), what="on_lost in the running worker")
    assert call["pid"] == survivor.pid and call["code"] == "owner_lost"

    time.sleep(2)  # later drains find nothing left: the hook fired exactly once
    assert list(scenario.lost_hook_calls()) == [result.id]
    owed = tsg(scenario.db, "status")["status"]["verdicts"]
    assert (owed["pending"]["celery"], owed["published"]["celery"]) == (0, 1)
    assert survivor.proc.poll() is None
    assert "task-state-guard: ledger error" not in survivor.log()
    scenario.assert_healthy()
