"""A message lost with its SIGKILLed worker: the restarted CLI's boot reconcile stores a
failure in the Results backend (``get_result()`` raises instead of timing out) and fires the
``on_lost`` hook (real ``dramatiq`` CLI, Redis broker, Redis results backend).

Dramatiq redelivers a dead worker's messages on any broker, so a message is lost only when its
redelivery is suppressed: here the Redis broker runs without maintenance (``maintenance_chance``
0), which never requeues them. The adapter derives that: its redelivery window is then the
broker's heartbeat timeout (1 s here), and the logical task is lost once that window plus the
active grace has passed after the attempt's last heartbeat.
"""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from typing import Any

import dramatiq
import pytest
from _dramatiq_helpers import BrokerEnv, CliWorker, Producer, assert_healthy, wait_for
from dramatiq.results import ResultFailure, ResultMissing, ResultTimeout
from dramatiq.results.backends import RedisBackend
from task_state_guard import Ledger
from task_state_guard_dramatiq import logical_task_id

GRACE = 2.0
HEARTBEAT_TIMEOUT = 1.0  # the Redis broker's: a silent worker process counts as dead after it
LOST_AFTER = HEARTBEAT_TIMEOUT + GRACE  # the attempt's redelivery bound (window + grace)
NO_REDELIVERY = {"TSG_TEST_REDIS_HEARTBEAT_MS": str(int(HEARTBEAT_TIMEOUT * 1000)),
                 "TSG_TEST_REDIS_MAINTENANCE": "0"}


def _message(env: BrokerEnv, message_id: str) -> dramatiq.Message[Any]:
    return dramatiq.Message(
        queue_name=env.queue, actor_name="stored_sleeper", args=(), kwargs={}, options={},
        message_id=message_id,
    )


@pytest.mark.parametrize("stored_first", [False, True], ids=["open", "failure-already-stored"])
def test_lost_message_fails_its_result(redis_env: BrokerEnv, stored_first: bool) -> None:
    env = redis_env
    common = {
        "TSG_TEST_RESULTS": "1",
        "TSG_TEST_ON_LOST": "1",
        "TSG_HEARTBEAT_SECONDS": "0.5",
        **NO_REDELIVERY,
    }
    first = CliWorker(env, extra_env={**common, "TSG_ACTIVE_GRACE_SECONDS": "600"}).start()
    producer = Producer(env)
    backend = RedisBackend(url=env.url, namespace=env.namespace + "-results")
    ledger = Ledger(str(env.db))
    second: CliWorker | None = None
    try:
        tag = uuid.uuid4().hex
        mid = producer.send("stored_sleeper", tag, 120.0)
        message = _message(env, mid)
        pid_path = env.scratch / f"pid-{tag}"
        wait_for(pid_path.exists, 20, "the message to start")
        os.kill(int(pid_path.read_text()), signal.SIGKILL)
        assert first.wait_exit(30) != 0
        # The user's complaint: nothing tells the results backend.
        with pytest.raises(ResultTimeout):
            backend.get_result(message, block=True, timeout=500)
        if stored_first:  # a failure, never overwritten (a stored value is a success: the
            # message is then never lost, see test_dramatiq_succeeded_before_ack.py)
            backend.store_exception(message, ValueError("failed elsewhere"), 60_000)
        # The logical task outlives the worker (the broker could redeliver it): it is lost once
        # its lost attempt's redelivery bound has passed.
        time.sleep(LOST_AFTER + 0.5)
        second = CliWorker(env, extra_env={**common, "TSG_ACTIVE_GRACE_SECONDS": str(GRACE)})
        second.start()

        parent = ledger.get_task(logical_task_id(mid))
        assert (parent.status, parent.terminal_code) == ("timed_out", "restart_stale")
        assert parent.framework_id == mid
        if stored_first:
            with pytest.raises(ResultFailure) as stored:
                backend.get_result(message)
            assert stored.value.orig_exc_type == "ValueError"  # never overwritten
        else:
            with pytest.raises(ResultFailure) as caught:
                backend.get_result(message, block=True, timeout=10_000)
            assert caught.value.orig_exc_type == "TaskLostError"
            assert "restart_stale" in caught.value.orig_exc_msg
        hook = env.scratch / f"lost-{mid}"
        wait_for(hook.exists, 10, "the on_lost hook")
        call = json.loads(hook.read_text())
        assert {k: v for k, v in call.items() if k != "pid"} == {
            "framework_id": mid,
            "task_id": parent.id,
            "name": "stored_sleeper",
            "code": "restart_stale",
        }
        assert call["pid"] in second.worker_pids()
        log = second.log()
        assert "task-state-guard: ledger error" not in log, log
        for line in log.splitlines():
            if "task-state-guard: reconcile (" in line:
                assert mid not in line and parent.id not in line
        assert_healthy(ledger)
    finally:
        ledger.close()
        producer.close()
        if second is not None:
            second.stop()
        first.stop()


def test_no_results_middleware_no_write(redis_env: BrokerEnv) -> None:
    """Without the Results middleware nothing is stored; the hook still fires."""
    env = redis_env
    common = {"TSG_TEST_ON_LOST": "1", "TSG_HEARTBEAT_SECONDS": "0.5", **NO_REDELIVERY}
    first = CliWorker(env, extra_env={**common, "TSG_ACTIVE_GRACE_SECONDS": "600"}).start()
    producer = Producer(env)
    backend = RedisBackend(url=env.url, namespace=env.namespace + "-results")
    ledger = Ledger(str(env.db))
    second: CliWorker | None = None
    try:
        tag = uuid.uuid4().hex
        mid = producer.send("crash_once", tag, 120.0)
        pid_path = env.scratch / f"pid-{tag}-1"
        wait_for(pid_path.exists, 20, "the message to start")
        os.kill(int(pid_path.read_text()), signal.SIGKILL)
        assert first.wait_exit(30) != 0
        time.sleep(LOST_AFTER + 0.5)
        second = CliWorker(env, extra_env={**common, "TSG_ACTIVE_GRACE_SECONDS": str(GRACE)})
        second.start()
        hook = env.scratch / f"lost-{mid}"
        wait_for(hook.exists, 10, "the on_lost hook")
        assert json.loads(hook.read_text())["name"] == "crash_once"
        crashed: dramatiq.Message[Any] = dramatiq.Message(
            queue_name=env.queue, actor_name="crash_once", args=(), kwargs={}, options={},
            message_id=mid,
        )
        with pytest.raises(ResultMissing):
            backend.get_result(crashed)
        assert_healthy(ledger)
    finally:
        ledger.close()
        producer.close()
        if second is not None:
            second.stop()
        first.stop()


def test_periodic_reconcile_of_a_surviving_worker(redis_env: BrokerEnv) -> None:
    """A fleet that never restarts: CLI A's process dies mid-message; CLI B, running all along
    with ``reconcile_interval_seconds``, closes the message as lost, fails its result and
    fires the hook."""
    env = redis_env
    common = {
        "TSG_TEST_RESULTS": "1",
        "TSG_TEST_ON_LOST": "1",
        "TSG_HEARTBEAT_SECONDS": "0.5",
        "TSG_ACTIVE_GRACE_SECONDS": str(GRACE),
        **NO_REDELIVERY,
    }
    victim = CliWorker(env, extra_env=common).start()
    producer = Producer(env)
    backend = RedisBackend(url=env.url, namespace=env.namespace + "-results")
    ledger = Ledger(str(env.db))
    survivor: CliWorker | None = None
    try:
        tag = uuid.uuid4().hex
        mid = producer.send("stored_sleeper", tag, 120.0)
        pid_path = env.scratch / f"pid-{tag}"
        wait_for(pid_path.exists, 20, "the message to start")
        survivor = CliWorker(
            env, extra_env={**common, "TSG_RECONCILE_INTERVAL_SECONDS": "0.5"}
        ).start()
        # B booted while A heartbeats the message: B's boot reconcile kept it.
        assert ledger.get_task(logical_task_id(mid)).status == "running"
        os.kill(int(pid_path.read_text()), signal.SIGKILL)
        assert victim.wait_exit(30) != 0

        with pytest.raises(ResultFailure) as caught:
            backend.get_result(_message(env, mid), block=True, timeout=60_000)
        assert caught.value.orig_exc_type == "TaskLostError"
        parent = ledger.get_task(logical_task_id(mid))
        assert (parent.status, parent.terminal_code) == ("timed_out", "restart_stale")
        hook = env.scratch / f"lost-{mid}"
        wait_for(hook.exists, 10, "the on_lost hook")
        assert json.loads(hook.read_text())["pid"] in survivor.worker_pids()
        assert survivor.proc is not None and survivor.proc.poll() is None
        assert "task-state-guard: reconcile (periodic_reconcile)" in survivor.log()
        assert_healthy(ledger)
    finally:
        ledger.close()
        producer.close()
        if survivor is not None:
            survivor.stop()
        victim.stop()
