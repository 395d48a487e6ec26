"""Two hosts, one PostgreSQL ledger: a whole host dies, the other host's periodic reconcile
closes its lost attempts at once, and the redelivered messages succeed there.

Each host is one process group holding a real ``celery worker`` (prefork, 2 children) and a
real ``dramatiq`` CLI (2 processes), both on RabbitMQ, which redelivers an unacknowledged
message the moment its consumer's connection dies. Every worker reconciles every 0.5 s
(``reconcile_interval_seconds``) with the default 600 s active grace: only the dead owner's
released PostgreSQL session lock can explain a close within the test's minute.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

from _dramatiq_helpers import (
    BrokerEnv,
    Producer,
    attempts_of,
    outcomes,
    wait_closed,
)
from celery_harness import Scenario, wait_for
from core_helpers import run_cli
from fleet_hosts import Host
from task_state_guard import Ledger
from task_state_guard_dramatiq import attempt_task_id

RABBIT_BROKER = "amqp://guest:guest@127.0.0.1:5672//"
INTERVAL = "0.5"
DRAMATIQ_ENV = {
    "TSG_ACTIVE_GRACE_SECONDS": "600",
    "TSG_HEARTBEAT_SECONDS": "0.5",
    "TSG_RECONCILE_INTERVAL_SECONDS": INTERVAL,
}


def _running(ledger: Ledger, task_id: str) -> bool:
    return str(ledger.get_task(task_id).status) == "running"


def test_a_dead_host_is_closed_by_the_other_hosts_periodic_reconcile(
    tmp_path: Path, pg_ledger: str, brokers: None
) -> None:
    (tmp_path / "celery").mkdir()
    celery = Scenario(tmp_path / "celery", db=pg_ledger, broker=RABBIT_BROKER)
    dram = BrokerEnv.new("rabbitmq", tmp_path / "dramatiq")
    dram.db = pg_ledger  # type: ignore[assignment]
    producer = Producer(dram)
    ledger = Ledger(pg_ledger)
    hosts: list[Host] = []
    try:
        host_a = Host(celery, dram, INTERVAL, DRAMATIQ_ENV)
        hosts.append(host_a)
        result = celery.send("tsgt.sleep_late", 120, "fleet", 0.1)
        tag = uuid.uuid4().hex
        mid = producer.send("crash_once", tag, 120.0)
        celery_pid = celery.marker("fleet", 30)
        dram_pid_file = dram.scratch / f"pid-{tag}-1"
        wait_for(dram_pid_file.exists, 30, what="the Dramatiq message to start on host A")
        assert host_a.members(celery_pid) and host_a.members(int(dram_pid_file.read_text()))
        celery.wait_attempts(result.id, lambda a: any(str(t.status) == "running" for t in a))
        lost_dramatiq = attempt_task_id(mid, 0)
        wait_for(lambda: _running(ledger, lost_dramatiq), 30, what="the Dramatiq attempt")
        lost_celery = celery.attempts(result.id)[0].id

        host_b = Host(celery, dram, INTERVAL, DRAMATIQ_ENV)
        hosts.append(host_b)
        # Host A is alive while B boots: B's boot reconciles keep A's work.
        assert '"tasks_timed_out":0' in host_b.celery.log()
        time.sleep(1.5)  # several periodic passes on both hosts: nothing of A's is closed
        assert _running(ledger, lost_celery) and _running(ledger, lost_dramatiq)
        assert host_b.periodic_closes() == 0

        killed_at = time.time()
        host_a.kill()

        assert result.get(timeout=90) == "second"
        celery.wait_parent(result.id, "succeeded", 60)
        # The redelivered attempt can finish before B's next periodic pass (every 0.5 s)
        # closes the lost one: the close is asynchronous, so wait for it, then check it.
        expected = (
            ("succeeded", "worker_completed"),
            [("timed_out", "owner_lost"), ("succeeded", "worker_completed")],
        )
        wait_for(lambda: celery.outcome(result.id) == expected, 30,
                 what="the lost Celery attempt closed owner_lost")
        assert celery.outcome(result.id) == expected
        parent = wait_closed(ledger, mid, timeout=90)
        assert (parent.status, parent.terminal_code) == ("succeeded", "worker_completed")
        lost_then_done = [("timed_out", "owner_lost"), ("succeeded", "worker_completed")]
        wait_for(lambda: outcomes(attempts_of(ledger, mid)) == lost_then_done, 30,
                 what="the lost Dramatiq attempt closed owner_lost")
        attempts = attempts_of(ledger, mid)
        assert outcomes(attempts) == lost_then_done
        assert attempts[0].id == lost_dramatiq

        # The redelivered copies ran on host B.
        assert host_b.members(celery.marker("fleet.again", 30))
        assert (dram.scratch / f"pid-{tag}-2").exists()
        assert host_b.members(int((dram.scratch / f"pid-{tag}-2").read_text()))
        # Host B's periodic passes closed both lost attempts, long before any grace.
        wait_for(lambda: host_b.periodic_closes() == 2, 20, what="B's periodic closes")
        for task_id in (lost_celery, lost_dramatiq):
            lost = ledger.get_task(task_id)
            assert lost.ended_at is not None and lost.ended_at - killed_at < 60
        for worker_log in (host_b.celery.log(), host_b.dramatiq.log()):
            assert "task-state-guard: ledger error" not in worker_log, worker_log

        report = ledger.doctor()
        assert report["healthy"] is True, report
        status = ledger.status()
        assert status["running_owner_dead"] == 0
        cli = run_cli("--db", pg_ledger, "doctor")
        assert cli.code == 0 and cli.json["healthy"] is True
    finally:
        for host in reversed(hosts):
            host.dramatiq.stop(10)
            host.celery.stop()
        ledger.close()
        producer.close()
        celery.close()
        dram.cleanup()

