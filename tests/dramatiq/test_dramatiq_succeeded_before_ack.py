"""Never lost when Dramatiq knows it succeeded: a worker process SIGKILLed after the Results
middleware stored the message's return value and before the ack (the adapter's close is written
at the ack) leaves the ledger with the attempt running under a dead process. The job must end
``succeeded`` (or, when an operator's reconcile declared it lost before any worker could consult
the Results backend, its verdict superseded): no ``TaskLostError`` stored, no ``on_lost`` call
(real ``dramatiq`` CLI, real brokers, Redis results backend).

The kill lands in that window deterministically: the test app's HoldAfterResults middleware
runs its after-hook right after Results stored the value, writes ``held-<tag>`` and holds the
worker thread; each test checks the stored value and the running attempt before it kills.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import dramatiq
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
    parent_of,
    wait_closed,
    wait_for,
)
from dramatiq.results.backends import RedisBackend
from task_state_guard import Ledger
from task_state_guard_dramatiq import attempt_task_id, logical_task_id
from verdict_checks import hook_calls, lost_jobs, tsg

GRACE = 2.0
HEARTBEAT_TIMEOUT = 1.0  # the Redis broker's: a silent worker process counts as dead after it
LOST_AFTER = HEARTBEAT_TIMEOUT + GRACE  # the lost attempt's redelivery bound (window + grace)
NO_REDELIVERY = {"TSG_TEST_REDIS_HEARTBEAT_MS": str(int(HEARTBEAT_TIMEOUT * 1000)),
                 "TSG_TEST_REDIS_MAINTENANCE": "0"}
COMMON = {"TSG_TEST_RESULTS": "1", "TSG_TEST_ON_LOST": "1", "TSG_HEARTBEAT_SECONDS": "0.5"}
AMQP_HEARTBEAT = 5


def _results(env: BrokerEnv) -> RedisBackend:
    return RedisBackend(url=REDIS_URL, namespace=env.namespace + "-results")


def _stored(env: BrokerEnv, message_id: str) -> Any:
    """The value the Results backend holds for a ``stored_hold`` message (raises
    ``ResultFailure`` for a stored exception, ``ResultMissing`` for none)."""
    message: dramatiq.Message[Any] = dramatiq.Message(
        queue_name=env.queue, actor_name="stored_hold", args=(), kwargs={}, options={},
        message_id=message_id)
    return _results(env).get_result(message)


def _kill_in_the_window(env: BrokerEnv, ledger: Ledger, extra: dict[str, str]) -> tuple[str, str]:
    """One worker process runs a ``stored_hold`` message; once Results stored its value and
    while the ledger still has the attempt running, SIGKILL the process (the CLI stops)."""
    first = CliWorker(env, extra_env={**COMMON, **extra, "TSG_ACTIVE_GRACE_SECONDS": "600"},
                      processes=1).start()
    producer = Producer(env)
    try:
        tag = uuid.uuid4().hex
        mid = producer.send("stored_hold", tag)
        held = env.scratch / f"held-{tag}"
        wait_for(held.exists, 30, "the message's hold after Results stored its value")
        # In the window: the value is stored, and the ledger has not closed anything yet.
        assert _stored(env, mid) == "done"
        attempt = ledger.get_task(attempt_task_id(mid, 0))
        assert (attempt.status, attempt.has_owner) == ("running", True)
        parent = parent_of(ledger, mid)
        assert parent is not None and parent.status == "running"
        os.kill(int(held.read_text()), signal.SIGKILL)
        assert first.wait_exit(30) != 0
    finally:
        producer.close()
        first.stop()
    attempt = ledger.get_task(attempt_task_id(mid, 0))
    assert attempt.status == "running"  # nobody closed it: the process died before the ack
    return tag, mid


def _nothing_lost(env: BrokerEnv, db: str, mid: str, log: str) -> None:
    """No TaskLostError, no on_lost call, nothing counted lost, no ledger error."""
    assert _stored(env, mid) == "done"  # the value, never a TaskLostError
    assert hook_calls(env.scratch) == {}
    assert lost_jobs(db) == 0
    assert "task-state-guard: ledger error" not in log, log
    assert "refused" not in log, log
    assert mid not in log and logical_task_id(mid) not in log


_SAMPLE = re.compile(
    r'^tsg_adapter_framework_successes_total\{adapter="dramatiq",where="(\w+)"\} (\S+)$', re.M)


def _framework_successes(db: str, metrics_dir: str) -> dict[str, float]:
    """The worker processes' summed counts, as ``tsg metrics --metrics-dir`` shows them."""
    scrape = subprocess.run(
        [sys.executable, "-m", "task_state_guard", "--db", db, "metrics", "--metrics-dir",
         metrics_dir], capture_output=True, text=True, timeout=120, check=False)
    assert scrape.returncode == 0, scrape.stdout + scrape.stderr
    return {where: float(value) for where, value in _SAMPLE.findall(scrape.stdout)}


@pytest.mark.parametrize("restart", ["at-once", "after-the-window"])
def test_the_next_worker_closes_it_succeeded(redis_env: BrokerEnv, restart: str) -> None:
    """The restarted worker's boot reconcile asks the Results backend before it applies: the
    lost attempt and the message's logical task close ``succeeded/worker_completed`` (at once:
    the attempt alone is due, the job is kept for its redelivery window; after the window: both
    are due)."""
    env, db = redis_env, str(redis_env.db)
    ledger = Ledger(db)
    second: CliWorker | None = None
    try:
        tag, mid = _kill_in_the_window(env, ledger, NO_REDELIVERY)
        if restart == "after-the-window":
            time.sleep(LOST_AFTER + 0.5)
        metrics_dir = str(env.scratch.parent / "metrics")
        second = CliWorker(env, extra_env={
            **COMMON, **NO_REDELIVERY, "TSG_ACTIVE_GRACE_SECONDS": str(GRACE),
            "TSG_METRICS_DIR": metrics_dir}).start()  # each process boots with a reconcile

        parent = ledger.get_task(logical_task_id(mid))
        assert (parent.status, parent.terminal_code) == ("succeeded", "worker_completed")
        assert outcomes(attempts_of(ledger, mid)) == [("succeeded", "worker_completed")]
        assert (env.scratch / f"run-{tag}").read_text() == "1"  # never ran again
        assert tsg(db, "status")["status"]["verdicts"]["pending"]["dramatiq"] == 0
        assert tsg(db, "status")["status"]["verdicts"]["published"]["dramatiq"] == 0
        assert _framework_successes(db, metrics_dir) == {"reconcile": 1, "verdict": 0}
        log = second.log()
        assert "1 job(s) closed succeeded instead of lost" in log
        _nothing_lost(env, db, mid, log)
        assert_healthy(ledger)
    finally:
        if second is not None:
            second.stop()
        ledger.close()


@pytest.mark.parametrize("reconciled", ["within-the-window", "after-the-window"])
def test_an_operator_reconcile_while_the_worker_is_dead(
    redis_env: BrokerEnv, reconciled: str
) -> None:
    """``tsg reconcile`` cannot consult the Results backend. Within the redelivery window it
    closes the lost attempt ``owner_lost`` and keeps the job: the next worker closes the job
    succeeded. After the window it declares the job lost (a verdict is owed): the next worker
    supersedes the verdict instead of publishing it; the job stays ``timed_out`` (a terminal
    record is never rewritten)."""
    env, db = redis_env, str(redis_env.db)
    ledger = Ledger(db)
    second: CliWorker | None = None
    try:
        _tag, mid = _kill_in_the_window(env, ledger, NO_REDELIVERY)
        if reconciled == "after-the-window":
            time.sleep(LOST_AFTER + 0.5)
        report = tsg(db, "reconcile", "--active-grace-seconds", str(GRACE))["reconcile"]
        lost_attempt = ledger.get_task(attempt_task_id(mid, 0))
        assert (lost_attempt.status, lost_attempt.terminal_code) == ("timed_out", "owner_lost")
        verdicts = tsg(db, "status")["status"]["verdicts"]
        if reconciled == "after-the-window":
            assert report["tasks_timed_out"] == 2
            assert verdicts["pending"]["dramatiq"] == 1
        else:
            assert (report["tasks_timed_out"], report["fresh_active_retained"]) == (1, 1)
            assert verdicts["pending"]["dramatiq"] == 0
            time.sleep(LOST_AFTER + 0.5)  # the job is due when the worker starts
        metrics_dir = str(env.scratch.parent / "metrics")
        second = CliWorker(env, extra_env={
            **COMMON, **NO_REDELIVERY, "TSG_ACTIVE_GRACE_SECONDS": str(GRACE),
            "TSG_METRICS_DIR": metrics_dir}).start()

        # Both worker processes drained the verdicts at boot, before they were ready.
        assert hook_calls(env.scratch) == {}
        assert _stored(env, mid) == "done"  # never a TaskLostError
        parent = ledger.get_task(logical_task_id(mid))
        verdicts = tsg(db, "status")["status"]["verdicts"]
        log = second.log()
        if reconciled == "after-the-window":
            assert (parent.status, parent.terminal_code) == ("timed_out", "restart_stale")
            assert (verdicts["pending"]["dramatiq"], verdicts["published"]["dramatiq"]) == (0, 1)
            assert _framework_successes(db, metrics_dir) == {"reconcile": 0, "verdict": 1}
            assert "1 lost-job verdict(s) superseded" in log
            # The operator's pass counted the job lost; the worker added nothing to it.
            closed = tsg(db, "status")["status"]["outcomes_total"]["task"]["timed_out"]
            assert closed["restart_stale"] == 1
        else:
            assert (parent.status, parent.terminal_code) == ("succeeded", "worker_completed")
            assert (verdicts["pending"]["dramatiq"], verdicts["published"]["dramatiq"]) == (0, 0)
            assert _framework_successes(db, metrics_dir) == {"reconcile": 1, "verdict": 0}
            assert lost_jobs(db) == 0
        assert "task-state-guard: ledger error" not in log, log
        assert_healthy(ledger)
    finally:
        if second is not None:
            second.stop()
        ledger.close()


@pytest.fixture
def rabbit(rabbit_env: BrokerEnv) -> Iterator[BrokerEnv]:
    rabbit_env.url = f"{RABBIT_URL}?heartbeat={AMQP_HEARTBEAT}"
    yield rabbit_env
    client = redis.Redis.from_url(REDIS_URL)  # this test's results only
    try:
        keys = list(client.scan_iter(match=f"{rabbit_env.namespace}-results*", count=1000))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


def test_the_redelivered_copy_runs_under_the_succeeded_job(rabbit: BrokerEnv) -> None:
    """RabbitMQ requeues the unacknowledged message as soon as the dead process's connection
    is gone. The next worker's boot reconcile closes the job succeeded before it consumes; then
    the copy runs again (Dramatiq delivers at least once) as a second attempt of the closed
    job, whose close agrees with it: nothing refused, nothing lost."""
    env, db = rabbit, str(rabbit.db)
    ledger = Ledger(db)
    second: CliWorker | None = None
    try:
        tag, mid = _kill_in_the_window(env, ledger, {})
        second = CliWorker(env, extra_env={**COMMON, "TSG_ACTIVE_GRACE_SECONDS": "15"}).start()
        wait_for(lambda: (env.scratch / f"run-{tag}").read_text() == "2", 60, "the copy's run")

        def both_closed() -> bool:
            return [a.status for a in attempts_of(ledger, mid)] == ["succeeded", "succeeded"]

        wait_for(both_closed, 30, "the copy's attempt to close")
        parent = wait_closed(ledger, mid)
        assert (parent.status, parent.terminal_code) == ("succeeded", "worker_completed")
        assert outcomes(attempts_of(ledger, mid)) == [("succeeded", "worker_completed")] * 2
        assert ledger.get_task(attempt_task_id(mid, 0)).terminal_code == "worker_completed"
        assert tsg(db, "status")["status"]["verdicts"]["pending"]["dramatiq"] == 0
        _nothing_lost(env, db, mid, second.log())
        assert_healthy(ledger)
    finally:
        if second is not None:
            second.stop()
        ledger.close()
