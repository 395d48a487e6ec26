"""Under the default settings (no reconcile interval), a running Dramatiq worker publishes what an
operator's ``tsg reconcile`` found lost beside it, within its verdict interval: the real
``dramatiq`` CLI on Redis with the Results middleware, SIGKILL of a whole worker (the CLI and
its worker process), the real ``tsg`` CLI, a SQLite or PostgreSQL ledger. Nothing is restarted.

The message must be lost for good: the Redis broker runs without maintenance here
(``maintenance_chance`` 0, so a dead worker's messages are never requeued) and a heartbeat
timeout of 1 s, which is then the attempt's redelivery window; the message's logical task is
lost once that window plus the active grace has passed.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import dramatiq
import pytest
from _dramatiq_helpers import BrokerEnv, CliWorker, Producer, assert_healthy, wait_for
from dramatiq.results import ResultFailure, ResultMissing
from dramatiq.results.backends import RedisBackend
from task_state_guard import Ledger
from task_state_guard.integration.settings import DEFAULT_VERDICT_INTERVAL_SECONDS
from task_state_guard_dramatiq import logical_task_id
from verdict_checks import hook_calls, tsg

GRACE = 2.0
HEARTBEAT_TIMEOUT = 1.0  # the Redis broker's; without maintenance: the redelivery window
LOST_AFTER = HEARTBEAT_TIMEOUT + GRACE
COMMON = {
    "TSG_TEST_RESULTS": "1",
    "TSG_TEST_ON_LOST": "1",
    "TSG_HEARTBEAT_SECONDS": "0.5",
    "TSG_ACTIVE_GRACE_SECONDS": str(GRACE),
    "TSG_TEST_REDIS_HEARTBEAT_MS": str(int(HEARTBEAT_TIMEOUT * 1000)),
    "TSG_TEST_REDIS_MAINTENANCE": "0",
}
#: How long after the operator's reconcile the result and the hook may take: the default
#: verdict interval plus 5 s.
PUBLISH_WITHIN = DEFAULT_VERDICT_INTERVAL_SECONDS + 5


def _message(env: BrokerEnv, message_id: str) -> dramatiq.Message[Any]:
    return dramatiq.Message(queue_name=env.queue, actor_name="stored_sleeper", args=(),
                            kwargs={}, options={}, message_id=message_id)


def test_a_running_worker_publishes_an_operator_reconcile_under_defaults(
    redis_env: BrokerEnv,
) -> None:
    env, db = redis_env, str(redis_env.db)
    assert "TSG_RECONCILE_INTERVAL_SECONDS" not in env.app_environ(**COMMON)
    assert "TSG_VERDICT_INTERVAL_SECONDS" not in env.app_environ(**COMMON)
    producer = Producer(env)
    results = RedisBackend(url=env.url, namespace=env.namespace + "-results")
    ledger = Ledger(db)
    victim = survivor = None
    try:
        victim = CliWorker(env, extra_env=COMMON, processes=1).start()  # worker B
        tag = uuid.uuid4().hex
        mid = producer.send("stored_sleeper", tag, 120.0)
        pid_file = env.scratch / f"pid-{tag}"
        wait_for(pid_file.exists, 30, "the message to start")
        assert int(pid_file.read_text()) in victim.worker_pids()
        survivor = CliWorker(env, extra_env=COMMON).start()  # worker A: keeps running

        victim.kill_group()  # the whole worker B: the CLI and its worker process
        with pytest.raises(ResultMissing):  # nothing has told the results backend
            results.get_result(_message(env, mid))
        time.sleep(LOST_AFTER + 0.5)  # the attempt's redelivery window and the grace
        report = tsg(db, "reconcile", "--active-grace-seconds", str(GRACE))["reconcile"]
        deadline = time.monotonic() + PUBLISH_WITHIN
        assert report["tasks_timed_out"] == 2  # the message and its attempt
        parent = ledger.get_task(logical_task_id(mid))
        assert (parent.status, parent.terminal_code) == ("timed_out", "restart_stale")

        def stored_failure() -> ResultFailure | None:
            try:
                results.get_result(_message(env, mid))
            except ResultMissing:
                return None
            except ResultFailure as failure:
                return failure
            raise AssertionError("a result was stored for the lost message")

        failure = wait_for(stored_failure, max(0.1, deadline - time.monotonic()),
                           "TaskLostError stored by the running worker")
        assert failure.orig_exc_type == "TaskLostError"
        assert "restart_stale" in failure.orig_exc_msg
        call = wait_for(lambda: hook_calls(env.scratch).get(mid),
                        max(0.1, deadline - time.monotonic()), "on_lost in the running worker")
        assert call["pid"] in survivor.worker_pids() and call["code"] == "restart_stale"

        time.sleep(2)  # later drains (two worker processes) find nothing: once in all
        assert list(hook_calls(env.scratch)) == [mid]
        owed = tsg(db, "status")["status"]["verdicts"]
        assert (owed["pending"]["dramatiq"], owed["published"]["dramatiq"]) == (0, 1)
        assert survivor.proc is not None and survivor.proc.poll() is None
        assert "task-state-guard: ledger error" not in survivor.log()
        assert_healthy(ledger)
    finally:
        if survivor is not None:
            survivor.stop()
        if victim is not None and victim.proc is not None and victim.proc.poll() is None:
            victim.kill_group()
        producer.close()
        ledger.close()
