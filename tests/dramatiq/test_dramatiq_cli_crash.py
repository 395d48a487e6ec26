"""Issue rows that need their own ``dramatiq`` CLI: SIGKILL (Redis, RabbitMQ), graceful
shutdown with ``notify_shutdown``, duplicate deliveries (RabbitMQ) and an unwritable ledger."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from _dramatiq_helpers import (
    BrokerEnv,
    CliWorker,
    Producer,
    assert_healthy,
    attempts_of,
    outcomes,
    wait_closed,
    wait_for,
)
from task_state_guard import Ledger
from task_state_guard_dramatiq import attempt_task_id


def _pid_file(env: BrokerEnv, tag: str, run: int) -> Path:
    return env.scratch / f"pid-{tag}-{run}"


def _sigkill_mid_message(env: BrokerEnv, *, redelivery_extra: dict[str, str]) -> None:
    """SIGKILL the worker process running a message, restart the CLI at once (grace 600 s)."""
    common = {
        "TSG_ACTIVE_GRACE_SECONDS": "600",
        "TSG_HEARTBEAT_SECONDS": "0.5",
        "TSG_TEST_REDIS_HEARTBEAT_MS": "2000",
    }
    first = CliWorker(env, extra_env=common).start()
    producer = Producer(env)
    ledger = Ledger(str(env.db))
    second: CliWorker | None = None
    try:
        tag = uuid.uuid4().hex
        mid = producer.send("crash_once", tag, 3.0)
        pid_path = _pid_file(env, tag, 1)
        wait_for(pid_path.exists, 20, "the first run to start")
        victim = int(pid_path.read_text())
        assert victim in first.worker_pids()
        lost_id = attempt_task_id(mid, 0)
        lost = ledger.get_task(lost_id)
        assert lost.status == "running" and lost.has_owner

        os.kill(victim, signal.SIGKILL)  # really SIGKILL the worker process
        assert first.wait_exit(30) != 0  # the CLI notices and stops its other process
        assert ledger.get_task(lost_id).status in {"running", "timed_out"}

        second = CliWorker(env, extra_env={**common, **redelivery_extra}).start(wait=False)
        parent = wait_closed(ledger, mid, timeout=60)
        second.wait_ready()

        assert (parent.status, parent.terminal_code) == ("succeeded", "worker_completed")
        attempts = attempts_of(ledger, mid)
        lost = ledger.get_task(lost_id)
        assert (lost.status, lost.terminal_code) == ("timed_out", "owner_lost")
        others = [a for a in attempts if a.id != lost_id]
        assert others and all(a.status == "succeeded" for a in others)
        assert len({a.id for a in attempts}) == len(attempts) == 1 + len(others)
        # The restarted CLI's boot reconcile closed the lost attempt before that CLI ran
        # anything (the grace is 600 s: only the dead owner explains it).
        for attempt in others:
            assert attempt.started_at is not None
            if attempt.started_at >= second.started_at:
                assert lost.ended_at is not None and lost.ended_at <= attempt.started_at
        log = second.log()
        assert '"tasks_timed_out":1' in log, log
        assert "task-state-guard: ledger error" not in log, log
        assert_healthy(ledger)
    finally:
        if second is not None:
            second.stop()
        first.stop()
        producer.close()
        ledger.close()


def test_sigkill_mid_message_redis(redis_env: BrokerEnv) -> None:
    # Redis only requeues a dead worker's unacked messages in "maintenance" after its
    # heartbeat timeout: 2 s here, and maintenance on every fetch of the new CLI.
    _sigkill_mid_message(redis_env, redelivery_extra={"TSG_TEST_REDIS_MAINTENANCE": "1000000"})


def test_sigkill_mid_message_rabbitmq(rabbit_env: BrokerEnv) -> None:
    # RabbitMQ requeues the unacked message as soon as the dead process's connection drops.
    _sigkill_mid_message(rabbit_env, redelivery_extra={})


def test_killed_between_body_and_ack_redis(redis_env: BrokerEnv) -> None:
    """The attempt's outcome is written at the ack: a process killed after the actor returned
    and before the ack leaves its attempt running, reconcile closes it ``owner_lost`` and the
    redelivered message runs again and settles the logical task."""
    common = {
        "TSG_ACTIVE_GRACE_SECONDS": "600",
        "TSG_HEARTBEAT_SECONDS": "0.5",
        "TSG_TEST_REDIS_HEARTBEAT_MS": "2000",
    }
    first = CliWorker(redis_env, extra_env=common).start()
    producer = Producer(redis_env)
    ledger = Ledger(str(redis_env.db))
    second: CliWorker | None = None
    try:
        tag = uuid.uuid4().hex
        mid = producer.send("die_before_ack", tag)
        wait_for((redis_env.scratch / f"killed-{tag}").exists, 20, "the kill before the ack")
        assert first.wait_exit(30) != 0  # the CLI notices and stops its other process
        assert (redis_env.scratch / f"run-{tag}").read_text() == "1"  # the body had returned
        lost_id = attempt_task_id(mid, 0)
        lost = ledger.get_task(lost_id)
        assert lost.status == "running" and lost.has_owner  # its outcome was never written

        second = CliWorker(
            redis_env, extra_env={**common, "TSG_TEST_REDIS_MAINTENANCE": "1000000"}
        ).start(wait=False)
        parent = wait_closed(ledger, mid, timeout=60)
        second.wait_ready()
        assert (parent.status, parent.terminal_code) == ("succeeded", "worker_completed")
        assert (redis_env.scratch / f"run-{tag}").read_text() == "2"  # redelivered, ran again
        lost = ledger.get_task(lost_id)
        assert (lost.status, lost.terminal_code) == ("timed_out", "owner_lost")
        attempts = attempts_of(ledger, mid)
        assert sorted(outcomes(attempts)) == [
            ("succeeded", "worker_completed"), ("timed_out", "owner_lost")]
        assert "task-state-guard: ledger error" not in second.log()
        assert_healthy(ledger)
    finally:
        if second is not None:
            second.stop()
        first.stop()
        producer.close()
        ledger.close()


def test_same_message_in_flight_twice_rabbitmq(rabbit_env: BrokerEnv) -> None:
    """Two deliveries of one message_id at once (as after a RabbitMQ consumer timeout)."""
    worker = CliWorker(rabbit_env, extra_env={"TSG_HEARTBEAT_SECONDS": "0.2"}).start()
    producer = Producer(rabbit_env)
    ledger = Ledger(str(rabbit_env.db))
    try:
        msg = producer.message("sleeper", 1.5)
        producer.broker.enqueue(msg)
        producer.broker.enqueue(msg)  # the same message_id, delivered twice

        def both_finished() -> bool:
            attempts = attempts_of(ledger, msg.message_id)
            return len(attempts) == 2 and all(a.status == "succeeded" for a in attempts)

        wait_for(both_finished, 30, "two finished attempts")
        a, b = attempts_of(ledger, msg.message_id)
        assert a.id != b.id
        assert a.started_at is not None and b.started_at is not None
        assert a.ended_at is not None and b.ended_at is not None
        assert a.started_at < b.ended_at and b.started_at < a.ended_at  # really concurrent
        parent = wait_closed(ledger, msg.message_id)
        assert (parent.status, parent.terminal_code) == ("succeeded", "worker_completed")
        assert "task-state-guard: ledger error" not in worker.log()
        assert_healthy(ledger)
    finally:
        worker.stop()
        producer.close()
        ledger.close()


def test_shutdown_interrupts_notified_actor(redis_env: BrokerEnv) -> None:
    extra = {"TSG_HEARTBEAT_SECONDS": "0.2"}
    first = CliWorker(redis_env, extra_env=extra).start()
    producer = Producer(redis_env)
    ledger = Ledger(str(redis_env.db))
    second: CliWorker | None = None
    try:
        tag = uuid.uuid4().hex
        mid = producer.send("notified", tag)
        wait_for((redis_env.scratch / f"started-{tag}").exists, 20, "the actor to start")
        assert first.stop() == 0  # graceful: SIGTERM, Shutdown raised into the actor
        first_attempt = ledger.get_task(attempt_task_id(mid, 0))
        assert (first_attempt.status, first_attempt.terminal_code) == ("cancelled", "interrupted")
        if ledger.get_task(first_attempt.parent_id).status == "running":  # type: ignore[arg-type]
            # Nobody picked the re-enqueued message up before the CLI exited: restart it.
            second = CliWorker(redis_env, extra_env=extra).start()
        parent = wait_closed(ledger, mid)
        assert (parent.status, parent.terminal_code) == ("succeeded", "worker_completed")
        attempts = attempts_of(ledger, mid)
        assert outcomes(attempts) == [
            ("cancelled", "interrupted"),
            ("succeeded", "worker_completed"),
        ]
        assert attempts[1].id == attempt_task_id(mid, 1)  # the queued attempt was claimed
        assert "task-state-guard: ledger error" not in first.log()
        assert_healthy(ledger)
    finally:
        if second is not None:
            second.stop()
        first.stop()
        producer.close()
        ledger.close()


@pytest.mark.sqlite_only(reason="a ledger path whose directory is a file")
def test_unwritable_ledger_never_breaks_messages(redis_env: BrokerEnv) -> None:
    blocker = redis_env.scratch / "not-a-directory"
    blocker.write_text("a file where the ledger's directory should be")
    bad_db = blocker / "tasks.sqlite"
    worker = CliWorker(redis_env, extra_env={"TSG_DB": str(bad_db)}).start()
    producer = Producer(redis_env)
    try:
        tags = [uuid.uuid4().hex for _ in range(6)]
        for tag in tags:
            producer.send("crash_once", tag, 0.0)
        producer.send("flaky", 1)  # 2 deliveries
        producer.send("always_fail")  # 3 deliveries

        def all_ran() -> bool:
            return all((redis_env.scratch / f"run-{tag}").exists() for tag in tags)

        wait_for(all_ran, 30, "every message to be processed without a ledger")
        time.sleep(1.0)  # let the retries run too
    finally:
        worker.stop()
        producer.close()
    log = worker.log()
    per_message = list(
        line
        for line in log.splitlines()
        if "task-state-guard: ledger error (before_process_message" in line
    )
    # Logged once per kind and process (2 processes), however many messages failed.
    assert 1 <= len(per_message) <= 2, log
    counted = sum(int(n) for n in re.findall(r"\('before_process_message:\w+', (\d+)\)", log))
    assert counted >= len(tags) + 2, log
    assert not bad_db.exists()


@pytest.mark.parametrize("processes", [2])
def test_concurrent_boot_reconcile_is_safe(redis_env: BrokerEnv, processes: int) -> None:
    """Two CLIs (4 processes) booting at once on one ledger all reconcile without errors."""
    extra = {"TSG_HEARTBEAT_SECONDS": "0.2"}
    workers = [CliWorker(redis_env, extra_env=extra, processes=processes) for _ in range(2)]
    for worker in workers:
        worker.start(wait=False)
    try:
        for worker in workers:
            worker.wait_ready()
        producer = Producer(redis_env)
        ledger = Ledger(str(redis_env.db))
        mids = [producer.send("ok") for _ in range(8)]
        for mid in mids:
            assert wait_closed(ledger, mid).status == "succeeded"
        producer.close()
        assert_healthy(ledger)
        ledger.close()
    finally:
        for worker in workers:
            worker.stop()
    for worker in workers:
        log = worker.log()
        assert log.count("task-state-guard: reconcile (before_worker_boot)") == processes, log
        assert "task-state-guard: ledger error" not in log, log


def _rabbit_setting(key: str, value: int | None = None) -> int:
    """Read (and optionally set) a broker-wide ``rabbit`` application setting."""
    if value is not None:
        subprocess.run(
            ["rabbitmqctl", "eval", f"application:set_env(rabbit, {key}, {value})."],
            check=True,
            capture_output=True,
            timeout=60,
        )
    out = subprocess.run(
        ["rabbitmqctl", "eval", f"application:get_env(rabbit, {key})."],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    found = re.search(r"\{ok,(\d+)\}", out)
    assert found, out
    return int(found.group(1))


@pytest.mark.service_wide  # the broker-wide timeout would cut other tests' consumers too
def test_consumer_timeout_runs_the_message_twice_rabbitmq(rabbit_env: BrokerEnv) -> None:
    """The real RabbitMQ consumer timeout: the broker closes the channel of a consumer that
    holds an unacked message too long and redelivers the message while it is still running.

    consumer_timeout is broker-wide on RabbitMQ 3.10, so it is lowered (2 s, checked every
    0.5 s) only until the duplicate is observed, then restored.
    """
    old_timeout = _rabbit_setting("consumer_timeout")
    old_tick = _rabbit_setting("channel_tick_interval")
    # A run killed inside this window leaves the lowered values behind on the shared broker:
    # never "restore" those, restore RabbitMQ's defaults (30 min, 60 s) instead.
    old_timeout = 1_800_000 if old_timeout == 2000 else old_timeout
    old_tick = 60_000 if old_tick == 500 else old_tick
    producer = Producer(rabbit_env)
    ledger = Ledger(str(rabbit_env.db))
    worker = CliWorker(rabbit_env, extra_env={"TSG_HEARTBEAT_SECONDS": "0.2"})
    try:
        _rabbit_setting("consumer_timeout", 2000)
        _rabbit_setting("channel_tick_interval", 500)
        worker.start()
        mid = producer.send("sleeper", 5.0)

        def two_running() -> bool:
            return sum(a.status == "running" for a in attempts_of(ledger, mid)) >= 2

        wait_for(two_running, 30, "a second delivery while the first still runs")
    finally:
        _rabbit_setting("consumer_timeout", old_timeout)
        _rabbit_setting("channel_tick_interval", old_tick)
    try:

        def all_finished() -> bool:
            attempts = attempts_of(ledger, mid)
            return len(attempts) >= 2 and all(a.status == "succeeded" for a in attempts)

        wait_for(all_finished, 40, "every delivery to finish")
        attempts = attempts_of(ledger, mid)
        assert len({a.id for a in attempts}) == len(attempts) >= 2
        first, second = attempts[0], attempts[1]
        assert first.ended_at is not None and second.started_at is not None
        assert second.started_at < first.ended_at  # in flight twice, at once
        parent = wait_closed(ledger, mid)
        assert (parent.status, parent.terminal_code) == ("succeeded", "worker_completed")
        log = worker.log()
        assert "PRECONDITION_FAILED" in log  # it really was the broker's consumer timeout
        assert "task-state-guard: ledger error" not in log
        assert_healthy(ledger)
    finally:
        worker.stop()
        producer.close()
        ledger.close()
