"""Two hosts on one PostgreSQL ledger; the one running 4 jobs is SIGKILLed: every lost job's
verdict reaches its framework's result backend and ``on_lost`` exactly once across the
surviving host's workers, and the restarted host publishes nothing twice.

Each host is a process group with a real ``celery worker`` (Redis broker and result backend)
and a real ``dramatiq`` CLI (2 processes; Redis broker with maintenance off, so a dead worker's
messages are never requeued: really lost; Results on Redis), every worker reconciling and
publishing every 0.5 s. Two Celery tasks (acknowledged early: gone with their worker) and two
Dramatiq messages run on host A when it dies.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import dramatiq
import pytest
from _dramatiq_helpers import BrokerEnv, Producer, wait_for
from celery import states  # type: ignore[import-untyped]
from celery_harness import BROKER, Scenario
from core_helpers import run_cli
from dramatiq.results import ResultFailure
from dramatiq.results.backends import RedisBackend
from fleet_hosts import Host
from task_state_guard import Ledger
from task_state_guard_celery import TaskLostError
from verdict_checks import hook_calls

INTERVAL = "0.5"
DRAMATIQ_ENV = {
    "TSG_ACTIVE_GRACE_SECONDS": "2",
    "TSG_HEARTBEAT_SECONDS": "0.5",
    "TSG_RECONCILE_INTERVAL_SECONDS": INTERVAL,
    "TSG_TEST_REDIS_HEARTBEAT_MS": "1000",
    "TSG_TEST_REDIS_MAINTENANCE": "0",  # never requeued: the broker's window is its heartbeat
    "TSG_TEST_RESULTS": "1",
    "TSG_TEST_ON_LOST": "1",
}




def test_four_lost_jobs_are_published_once_across_the_fleet(
    tmp_path: Path, pg_ledger: str, brokers: None
) -> None:
    (tmp_path / "celery").mkdir()
    celery = Scenario(tmp_path / "celery", db=pg_ledger, broker=BROKER, track_started=True)
    dram = BrokerEnv.new("redis", tmp_path / "dramatiq")
    dram.db = pg_ledger  # type: ignore[assignment]
    producer = Producer(dram)
    results = RedisBackend(url=dram.url, namespace=dram.namespace + "-results")
    ledger = Ledger(pg_ledger)
    hosts: list[Host] = []
    try:
        host_a = Host(celery, dram, INTERVAL, DRAMATIQ_ENV, TSGT_ON_LOST=1)
        hosts.append(host_a)
        tasks = [celery.send("tsgt.sleep", 120, f"c{i}") for i in range(2)]
        tags = [uuid.uuid4().hex for _ in range(2)]
        messages = [producer.send("stored_sleeper", tag, 120.0) for tag in tags]
        for i, result in enumerate(tasks):
            assert host_a.members(celery.marker(f"c{i}", 30))
            wait_for(lambda r=result: r.state == states.STARTED, 30, what="STARTED")
        for tag in tags:
            pid_file = dram.scratch / f"pid-{tag}"
            wait_for(pid_file.exists, 30, what="the Dramatiq message to start on host A")
            assert host_a.members(int(pid_file.read_text()))

        host_b = Host(celery, dram, INTERVAL, DRAMATIQ_ENV, TSGT_ON_LOST=1)
        hosts.append(host_b)
        host_a.kill()

        for result in tasks:
            wait_for(lambda r=result: r.state == states.FAILURE, 60, what="Celery FAILURE")
            with pytest.raises(TaskLostError) as caught:
                result.get(timeout=10)
            assert caught.value.code == "owner_lost"
        for mid in messages:
            message: dramatiq.Message[Any] = dramatiq.Message(
                queue_name=dram.queue, actor_name="stored_sleeper", args=(), kwargs={},
                options={}, message_id=mid)
            with pytest.raises(ResultFailure) as failure:
                results.get_result(message, block=True, timeout=60_000)
            assert failure.value.orig_exc_type == "TaskLostError"

        def published() -> bool:
            owed = run_cli("--db", pg_ledger, "status").json["status"]["verdicts"]
            return bool(owed["published"]["celery"] == 2 and owed["published"]["dramatiq"] == 2
                        and sum(owed["pending"].values()) == 0)

        wait_for(published, 30, what="every verdict published")
        celery_hooks, dramatiq_hooks = hook_calls(celery.markers), hook_calls(dram.scratch)
        assert sorted(celery_hooks) == sorted(r.id for r in tasks)
        assert sorted(dramatiq_hooks) == sorted(messages)
        for call in [*celery_hooks.values(), *dramatiq_hooks.values()]:
            assert host_b.members(call["pid"])  # published by the surviving host
        assert len(celery_hooks) + len(dramatiq_hooks) == 4

        restarted = Host(celery, dram, INTERVAL, DRAMATIQ_ENV, TSGT_ON_LOST=1)  # host A again
        hosts.append(restarted)
        assert len(hook_calls(celery.markers)) + len(hook_calls(dram.scratch)) == 4  # nothing twice
        for log in (host_b.celery.log(), host_b.dramatiq.log(), restarted.celery.log()):
            assert "task-state-guard: ledger error" not in log, log
        report = ledger.doctor()
        assert report["healthy"] is True, report
        status = run_cli("--db", pg_ledger, "status").stdout
        for job in [*(r.id for r in tasks), *messages]:
            assert job not in status
    finally:
        for host in reversed(hosts):
            host.dramatiq.stop(10)
            host.celery.stop()
        ledger.close()
        producer.close()
        celery.close()
        dram.cleanup()
