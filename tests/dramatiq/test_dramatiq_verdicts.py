"""Dramatiq on RabbitMQ: an operator's ``tsg reconcile`` is published by the next worker, and
a message the broker will redeliver is never declared lost (real ``dramatiq`` CLI, SIGKILL,
the Results middleware on Redis).

RabbitMQ requeues a dead consumer's unacknowledged message as soon as its connection is gone,
so a SIGKILLed worker's message comes back: the adapter records with each attempt the broker's
redelivery window (two missed connection heartbeats; ``?heartbeat=5`` in the URL here), and a
reconcile closes the lost attempt at once but keeps the message's logical task for that window
plus the active grace. Only a message whose redelivery is suppressed (purged from its queue
here, as a broker that lost it would) is declared lost, once that has passed.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Iterator
from typing import Any

import dramatiq
import pika  # type: ignore[import-untyped]
import pytest
import redis
from _dramatiq_helpers import (
    RABBIT_URL,
    REDIS_URL,
    BrokerEnv,
    CliWorker,
    Producer,
    assert_healthy,
    attempts_of,
    outcomes,
    wait_closed,
    wait_for,
)
from dramatiq.results import ResultFailure
from dramatiq.results.backends import RedisBackend
from task_state_guard import Ledger
from task_state_guard_dramatiq import logical_task_id
from verdict_checks import hook_calls, lost_jobs, tsg

HEARTBEAT = 5  # the AMQP connection heartbeat: the broker drops a silent peer after two
GRACE = 2.0
LOST_AFTER = 2 * HEARTBEAT + GRACE  # a lost attempt's window plus the active grace
COMMON = {
    "TSG_TEST_RESULTS": "1",
    "TSG_TEST_ON_LOST": "1",
    "TSG_HEARTBEAT_SECONDS": "0.5",
    "TSG_ACTIVE_GRACE_SECONDS": str(GRACE),
}


@pytest.fixture
def rabbit(rabbit_env: BrokerEnv) -> Iterator[BrokerEnv]:
    rabbit_env.url = f"{RABBIT_URL}?heartbeat={HEARTBEAT}"
    yield rabbit_env
    client = redis.Redis.from_url(REDIS_URL)  # this test's results only
    try:
        keys = list(client.scan_iter(match=f"{rabbit_env.namespace}-results*", count=1000))
        if keys:
            client.delete(*keys)
    finally:
        client.close()




def _message(env: BrokerEnv, actor: str, message_id: str) -> dramatiq.Message[Any]:
    return dramatiq.Message(queue_name=env.queue, actor_name=actor, args=(), kwargs={},
                            options={}, message_id=message_id)


def _results(env: BrokerEnv) -> RedisBackend:
    return RedisBackend(url=REDIS_URL, namespace=env.namespace + "-results")


def _kill_mid_message(env: BrokerEnv, producer: Producer, actor: str) -> tuple[str, str]:
    """Start a CLI of one worker process (no other consumer could take the requeued message),
    send one long message, SIGKILL the process running it (the CLI stops)."""
    first = CliWorker(env, extra_env=COMMON, processes=1).start()
    tag = uuid.uuid4().hex
    mid = producer.send(actor, tag, 120.0)
    pid_file = env.scratch / (f"pid-{tag}" if actor == "stored_sleeper" else f"pid-{tag}-1")
    wait_for(pid_file.exists, 30, "the message to start")
    os.kill(int(pid_file.read_text()), signal.SIGKILL)
    assert first.wait_exit(30) != 0
    return tag, mid






def test_an_operator_reconcile_of_a_message_that_never_comes_back(rabbit: BrokerEnv) -> None:
    env, db = rabbit, str(rabbit.db)
    producer = Producer(env)
    ledger = Ledger(db)
    second: CliWorker | None = None
    try:
        _tag, mid = _kill_mid_message(env, producer, "stored_sleeper")
        purged = _purge(env)  # the broker requeued it; it is lost for good now
        assert purged == 1
        report = tsg(db, "reconcile", "--active-grace-seconds", str(GRACE))["reconcile"]
        assert report["tasks_timed_out"] == 1  # the attempt: its process is dead
        assert report["fresh_active_retained"] == 1  # the message: its redelivery may come
        assert tsg(db, "status")["status"]["verdicts"]["pending"]["dramatiq"] == 0
        time.sleep(LOST_AFTER + 0.5)
        report = tsg(db, "reconcile", "--active-grace-seconds", str(GRACE))["reconcile"]
        assert report["tasks_timed_out"] == 1  # now the message: its window is over
        parent = ledger.get_task(logical_task_id(mid))
        assert (parent.status, parent.terminal_code) == ("timed_out", "restart_stale")
        assert tsg(db, "status")["status"]["verdicts"]["pending"]["dramatiq"] == 1

        second = CliWorker(env, extra_env=COMMON).start()  # two processes: each publishes
        with pytest.raises(ResultFailure) as caught:
            _results(env).get_result(_message(env, "stored_sleeper", mid), block=True,
                                     timeout=10_000)
        assert caught.value.orig_exc_type == "TaskLostError"
        assert "restart_stale" in caught.value.orig_exc_msg
        call = wait_for(lambda: hook_calls(env.scratch).get(mid), 10, "the on_lost hook")
        assert call["pid"] in second.worker_pids() and call["code"] == "restart_stale"
        time.sleep(1)
        assert list(hook_calls(env.scratch)) == [mid]  # once, across both worker processes
        owed = tsg(db, "status")["status"]["verdicts"]
        assert (owed["pending"]["dramatiq"], owed["published"]["dramatiq"]) == (0, 1)
        assert "task-state-guard: ledger error" not in second.log()
        assert_healthy(ledger)
    finally:
        if second is not None:
            second.stop()
        producer.close()
        ledger.close()


def test_a_redelivered_message_is_never_declared_lost(rabbit: BrokerEnv) -> None:
    """Killed mid-message, an operator reconciles at once: the lost attempt closes, the message
    is kept; the next worker runs the redelivered copy; no failure, hook or lost count."""
    env, db = rabbit, str(rabbit.db)
    producer = Producer(env)
    ledger = Ledger(db)
    second: CliWorker | None = None
    try:
        tag, mid = _kill_mid_message(env, producer, "stored_crash_once")
        report = tsg(db, "reconcile", "--active-grace-seconds", str(GRACE))["reconcile"]
        assert (report["tasks_timed_out"], report["fresh_active_retained"]) == (1, 1)
        # The next worker's own boot pass judges with its grace (15 s here, so that however
        # slowly it boots, its pass cannot run before the redelivered copy is consumed).
        second = CliWorker(env, extra_env={**COMMON, "TSG_ACTIVE_GRACE_SECONDS": "15"}).start()
        result = _results(env).get_result(_message(env, "stored_crash_once", mid), block=True,
                                          timeout=60_000)
        assert result == "run 2"
        parent = wait_closed(ledger, mid)
        assert (parent.status, parent.terminal_code) == ("succeeded", "worker_completed")
        assert outcomes(attempts_of(ledger, mid)) == [
            ("timed_out", "owner_lost"), ("succeeded", "worker_completed")]
        tsg(db, "reconcile", "--active-grace-seconds", str(GRACE))  # nothing left to lose
        assert hook_calls(env.scratch) == {}
        assert lost_jobs(db) == 0
        assert tsg(db, "status")["status"]["verdicts"]["pending"]["dramatiq"] == 0
        assert (env.scratch / f"pid-{tag}-2").exists()
        assert_healthy(ledger)
    finally:
        if second is not None:
            second.stop()
        producer.close()
        ledger.close()


def _purge(env: BrokerEnv) -> int:
    """Drop what this test's queue holds (never another queue)."""
    conn = pika.BlockingConnection(pika.URLParameters(RABBIT_URL))
    try:
        channel = conn.channel()
        deadline = time.monotonic() + 10
        while True:  # the requeue follows the connection's close
            count = channel.queue_declare(env.queue, passive=True).method.message_count
            if count or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        return int(channel.queue_purge(env.queue).method.message_count)
    finally:
        conn.close()
