"""An ``acks_late`` task the broker will redeliver is never declared lost before its
redelivery window has passed (real ``celery worker`` processes on Redis, SIGKILL).

The workers run with a 15 s visibility timeout (kombu restores an unacknowledged message that
old, in a sweep every 1 s here: a 16 s window), a 10 s active grace and a 5 s periodic
reconcile. The killed worker's attempt is closed at once; its logical task is kept for the
window plus the active grace after the attempt's last sign of life, long enough for the
redelivered copy to run: no ``FAILURE``, no ``on_lost``, no lost count, ledger ``succeeded``.
With the redelivery suppressed (the message removed from kombu's unacknowledged index, as a
broker that lost it would), the same job is declared lost once that bound has passed.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ledger_backends
import pytest
import redis
from celery import states  # type: ignore[import-untyped]
from celery_harness import REDIS_DB, Scenario, wait_for
from task_state_guard_celery import TaskLostError
from verdict_checks import lost_jobs, tsg

VISIBILITY = 15
WINDOW = VISIBILITY + 1 * 1  # + unacked_restore_interval x unacked_restore_throttle (1 x 1)
GRACE = 10.0
WORKER = {"TSGT_VISIBILITY": VISIBILITY, "TSG_HEARTBEAT_SECONDS": 1, "TSGT_ON_LOST": 1}


@pytest.fixture
def late(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Scenario]:
    """A Redis scenario on the ledger backend the test names (one row per backend: each row
    waits out real broker windows)."""
    with ledger_backends.ledger_target(request.param, tmp_path) as db:
        if request.param == "sqlite":
            Path(db).parent.mkdir(mode=0o700)
        sc = Scenario(tmp_path, db=db, track_started=True)
        sc.grace = GRACE
        try:
            yield sc
        finally:
            sc.close()






def _killed_mid_task(scenario: Scenario, marker: str) -> tuple[Any, Any]:
    """A worker runs an acks_late task; a second one (5 s periodic reconcile) joins; the first
    is SIGKILLed whole (no Celery signal, the message stays unacknowledged)."""
    victim = scenario.start_worker(**WORKER)
    result = scenario.send("tsgt.sleep_late", 120, marker, 0.5)
    scenario.marker(marker)
    wait_for(lambda: result.state == states.STARTED, 30, what="STARTED in the backend")
    scenario.wait_attempts(result.id, lambda a: any(str(t.status) == "running" for t in a))
    survivor = scenario.start_worker(TSG_RECONCILE_INTERVAL_SECONDS=5, **WORKER)
    victim.sigkill()
    return result, survivor


@pytest.mark.parametrize("late", ["sqlite"], indirect=True)
def test_a_redelivered_task_is_never_declared_lost(late: Scenario) -> None:
    scenario = late
    result, _survivor = _killed_mid_task(scenario, "again")
    report = tsg(scenario.db, "reconcile", "--active-grace-seconds", str(GRACE))["reconcile"]
    assert report["tasks_timed_out"] == 1  # the attempt: its worker is dead
    assert report["fresh_active_retained"] == 1  # the task: the broker will hand it back

    def settled() -> bool:  # until it succeeds: never FAILURE, never a hook, never lost
        assert result.state != states.FAILURE
        assert scenario.lost_hook_calls() == {}
        return result.state == states.SUCCESS

    while not settled():
        assert lost_jobs(scenario.db) == 0
        time.sleep(0.5)
    assert result.get(timeout=10) == "second"
    scenario.wait_parent(result.id, "succeeded")
    assert scenario.outcome(result.id) == (
        ("succeeded", "worker_completed"),
        [("timed_out", "owner_lost"), ("succeeded", "worker_completed")],
    )
    tsg(scenario.db, "reconcile", "--active-grace-seconds", str(GRACE))
    assert scenario.lost_hook_calls() == {} and lost_jobs(scenario.db) == 0
    assert tsg(scenario.db, "status")["status"]["verdicts"]["pending"]["celery"] == 0
    scenario.assert_healthy()


@pytest.mark.parametrize("late", ["postgresql"], indirect=True)
def test_a_task_whose_redelivery_is_suppressed_is_lost_after_the_window(late: Scenario) -> None:
    scenario = late
    result, survivor = _killed_mid_task(scenario, "gone")
    assert _forget_unacked(result.id) == 1  # kombu will never restore it now
    wait_for(lambda: result.state == states.FAILURE, 120, what="FAILURE after the window")
    with pytest.raises(TaskLostError) as caught:
        result.get(timeout=10)
    assert caught.value.code == "restart_stale"
    parent = scenario.parent(result.id)
    (attempt,) = scenario.attempts(result.id)
    assert (str(attempt.status), attempt.terminal_code) == ("timed_out", "owner_lost")
    last_sign = attempt.heartbeat_at or attempt.started_at
    assert last_sign is not None and parent.ended_at is not None
    assert parent.ended_at >= last_sign + WINDOW + GRACE  # never declared lost before
    call = wait_for(lambda: scenario.lost_hook_calls().get(result.id), 10, what="the hook")
    assert call["pid"] == survivor.pid and call["code"] == "restart_stale"
    assert list(scenario.lost_hook_calls()) == [result.id]
    assert lost_jobs(scenario.db) == 1
    scenario.assert_healthy()


def _forget_unacked(celery_id: str) -> int:
    """Remove this task's message from kombu's unacknowledged index (only that one entry)."""
    client = redis.Redis(host="127.0.0.1", port=6379, db=REDIS_DB)
    try:
        removed = 0
        for tag, payload in client.hgetall("unacked").items():
            if celery_id.encode() in payload:
                removed += client.hdel("unacked", tag)
                client.zrem("unacked_index", tag)
        return removed
    finally:
        client.close()
