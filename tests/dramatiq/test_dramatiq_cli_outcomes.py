"""Issue rows against one real ``dramatiq`` CLI (2 processes x 2 threads) on Redis.

One worker per ledger backend serves the whole module (its boot is the slow part): the
``[sqlite]`` rows run against a SQLite file, the ``[postgresql]`` rows against a PostgreSQL
ledger of their own; every test uses its own messages, and every test ends with a healthy
``doctor``.
"""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import ledger_backends
import pytest
import redis
from _dramatiq_helpers import (
    BackgroundReconciler,
    BrokerEnv,
    CliWorker,
    Producer,
    assert_healthy,
    attempts_of,
    outcomes,
    parent_of,
    wait_closed,
)
from task_state_guard import Ledger, ReconcilePolicy
from task_state_guard_dramatiq import TaskStateGuardMiddleware, logical_task_id

WORKER_GRACE = 2.0  # the worker's own active grace (boot reconcile)
BACKOFF_MS = 2000  # Retries backoff of flaky actors: 1.0-2.0 s, longer than SHORT_GRACE
SHORT_GRACE = 0.9  # the reconcile grace "elsewhere": below the 1.0 s backoff, 4.5x the heartbeat


class Shared:
    def __init__(self, env: BrokerEnv, worker: CliWorker) -> None:
        self.env = env
        self.worker = worker
        self.producer = Producer(env)
        self.ledger = Ledger(env.db)

    def send(self, actor: str, *args: object, **options: object) -> str:
        return self.producer.send(actor, *args, **options)


@pytest.fixture
def shared(
    per_backend: Any, backend: str, tmp_path_factory: pytest.TempPathFactory,
    redis_available: None,
) -> Shared:
    def make(backend: str) -> Iterator[Shared]:
        tmp = tmp_path_factory.mktemp("dramatiq_shared")
        with ledger_backends.ledger_target(backend, tmp) as db:
            yield from _shared(BrokerEnv.new("redis", tmp, db))

    return per_backend.get(backend, contextmanager(make))  # type: ignore[no-any-return]


def _shared(env: BrokerEnv) -> Iterator[Shared]:
    worker = CliWorker(
        env,
        extra_env={
            "TSG_ACTIVE_GRACE_SECONDS": str(WORKER_GRACE),
            "TSG_HEARTBEAT_SECONDS": "0.2",
            "TSG_TEST_BACKOFF_MS": str(BACKOFF_MS),
        },
    ).start()
    state = Shared(env, worker)
    try:
        yield state
    finally:
        worker.stop()
        state.producer.close()
        log = worker.log()
        state.ledger.close()
        env.cleanup()
        # No ledger error was logged by any hook during the whole module.
        assert "task-state-guard: ledger error" not in log, log
        assert "Unexpected failure" not in log, log


@pytest.fixture(autouse=True)
def _healthy_after(shared: Shared) -> Iterator[None]:
    yield
    assert_healthy(shared.ledger)


def test_boot_reconciles_in_every_worker_process(shared: Shared) -> None:
    log = shared.worker.log()
    assert log.count("task-state-guard: reconcile (before_worker_boot)") == 2, log


def test_success_and_delivery(shared: Shared) -> None:
    ledger = shared.ledger
    internal = shared.send("ok")
    marked = shared.send("deliver")
    unmarked = shared.send("deliver")
    inside = shared.send("deliver_inside")
    for mid in (internal, marked, unmarked, inside):
        parent = wait_closed(ledger, mid)
        assert (parent.status, parent.terminal_code) == ("succeeded", "worker_completed")
        expected = {inside: "delivered", internal: "not_applicable"}.get(mid, "pending")
        assert parent.delivery_status == expected  # a task that owes nobody closes it at once
        attempts = attempts_of(ledger, mid)
        assert outcomes(attempts) == [("succeeded", "worker_completed")]
        assert attempts[0].delivery_required is False
        assert attempts[0].delivery_status == "not_applicable"  # closed with the attempt
        assert attempts[0].has_owner is True
        assert parent.has_owner is False
    assert parent_of(ledger, internal).delivery_required is False  # type: ignore[union-attr]
    assert parent_of(ledger, marked).delivery_required is True  # type: ignore[union-attr]
    assert parent_of(ledger, internal).name == "ok"  # type: ignore[union-attr]
    assert parent_of(ledger, marked).name == "deliver"  # type: ignore[union-attr]

    # A web handler (another process) marks the delivery once its transport acknowledged.
    guard = TaskStateGuardMiddleware(db=shared.env.db)
    task = guard.mark_delivered(marked)
    assert task is not None
    assert (task.delivery_status, task.delivery_code) == ("delivered", "transport_acknowledged")
    assert guard.logical_task_id(marked) == logical_task_id(marked) == task.id

    # Broker acks are not deliveries: an unmarked delivery stays pending until the grace.
    time.sleep(0.6)
    ledger.reconcile(ReconcilePolicy(active_grace_seconds=600, delivery_grace_seconds=0.5))
    internal_parent = parent_of(ledger, internal)
    unmarked_parent = parent_of(ledger, unmarked)
    assert internal_parent is not None and unmarked_parent is not None
    assert (internal_parent.delivery_status, internal_parent.delivery_code) == (
        "not_applicable",
        "internal_task",
    )
    assert (unmarked_parent.delivery_status, unmarked_parent.delivery_code) == (
        "failed",
        "delivery_grace_expired",
    )
    for attempt in attempts_of(ledger, marked):
        assert attempt.delivery_status == "not_applicable"


def test_retry_then_success_parent_never_timed_out(shared: Shared) -> None:
    ledger = shared.ledger
    seen_waiting = 0
    with BackgroundReconciler(shared.env.db, active_grace=SHORT_GRACE) as reconciler:
        mid = shared.send("flaky", 2)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            parent = parent_of(ledger, mid)
            if parent is not None and parent.status != "running":
                break
            attempts = attempts_of(ledger, mid)
            if parent is not None and [a.status for a in attempts][-1:] == ["queued"]:
                seen_waiting += 1
            time.sleep(0.05)
    parent = wait_closed(ledger, mid, timeout=1)
    assert reconciler.runs >= 5
    assert seen_waiting > 0, "never observed the parent waiting on a queued attempt"
    # The backoff (>= 1 s) was longer than the reconcile grace (0.9 s), yet:
    assert (parent.status, parent.terminal_code) == ("succeeded", "worker_completed")
    assert outcomes(attempts_of(ledger, mid)) == [
        ("failed", "retry_scheduled"),
        ("failed", "retry_scheduled"),
        ("succeeded", "worker_completed"),
    ]


def test_retries_exhausted_dead_lettered(shared: Shared) -> None:
    ledger = shared.ledger
    mid = shared.send("always_fail")
    parent = wait_closed(ledger, mid)
    assert (parent.status, parent.terminal_code) == ("failed", "worker_failed")
    assert outcomes(attempts_of(ledger, mid)) == [
        ("failed", "retry_scheduled"),
        ("failed", "retry_scheduled"),
        ("failed", "worker_failed"),
    ]
    client = redis.Redis.from_url(shared.env.url)
    dead = client.hvals(f"{shared.env.namespace}:{shared.env.queue}.XQ.msgs")
    client.close()
    assert any(mid.encode() in item for item in dead)  # Dramatiq dead-lettered it


def test_throws_and_retry_when_fail_without_retry(shared: Shared) -> None:
    ledger = shared.ledger
    for actor in ("throws_match", "retry_when_no"):
        mid = shared.send(actor)
        parent = wait_closed(ledger, mid)
        assert (parent.status, parent.terminal_code) == ("failed", "worker_failed"), actor
        assert outcomes(attempts_of(ledger, mid)) == [("failed", "worker_failed")], actor


def test_time_limit_exceeded(shared: Shared) -> None:
    ledger = shared.ledger
    always = shared.send("too_slow")
    once = shared.send("slow_first")
    parent = wait_closed(ledger, always)
    assert (parent.status, parent.terminal_code) == ("failed", "worker_failed")
    assert outcomes(attempts_of(ledger, always)) == [
        ("timed_out", "time_limit_exceeded"),
        ("timed_out", "time_limit_exceeded"),
    ]
    parent = wait_closed(ledger, once)
    assert (parent.status, parent.terminal_code) == ("succeeded", "worker_completed")
    assert outcomes(attempts_of(ledger, once)) == [
        ("timed_out", "time_limit_exceeded"),
        ("succeeded", "worker_completed"),
    ]


def test_skip_message_and_age_limit(shared: Shared) -> None:
    ledger = shared.ledger
    skipped = shared.send("skip_me")
    parent = wait_closed(ledger, skipped)
    assert (parent.status, parent.terminal_code) == ("cancelled", "skipped")
    assert outcomes(attempts_of(ledger, skipped)) == [("cancelled", "skipped")]

    msg = shared.producer.message("aged", timestamp_ms=int(time.time() * 1000) - 60_000)
    shared.producer.broker.enqueue(msg)
    parent = wait_closed(ledger, msg.message_id)
    assert parent.status == "failed"  # AgeLimit fails the message: dead-lettered
    assert outcomes(attempts_of(ledger, msg.message_id)) == [("cancelled", "skipped")]


def test_async_actors(shared: Shared) -> None:
    ledger = shared.ledger
    good = shared.send("async_ok")
    tag = uuid.uuid4().hex
    flaky = shared.send("async_flaky", tag, 1)
    bad = shared.send("async_fail")
    parent = wait_closed(ledger, good)
    assert (parent.status, parent.terminal_code) == ("succeeded", "worker_completed")
    assert outcomes(attempts_of(ledger, good)) == [("succeeded", "worker_completed")]
    parent = wait_closed(ledger, flaky)
    assert (parent.status, parent.terminal_code) == ("succeeded", "worker_completed")
    assert outcomes(attempts_of(ledger, flaky)) == [
        ("failed", "retry_scheduled"),
        ("succeeded", "worker_completed"),
    ]
    parent = wait_closed(ledger, bad)
    assert (parent.status, parent.terminal_code) == ("failed", "worker_failed")
    assert outcomes(attempts_of(ledger, bad)) == [("failed", "worker_failed")]


def test_long_actor_survives_periodic_reconcile(shared: Shared) -> None:
    ledger = shared.ledger
    with BackgroundReconciler(shared.env.db, active_grace=WORKER_GRACE) as reconciler:
        mid = shared.send("sleeper", 3 * WORKER_GRACE)
        parent = wait_closed(ledger, mid, timeout=30)
    assert reconciler.runs >= 10
    assert sum(r["tasks_timed_out"] for r in reconciler.reports) == 0
    assert (parent.status, parent.terminal_code) == ("succeeded", "worker_completed")
    attempts = attempts_of(ledger, mid)
    assert outcomes(attempts) == [("succeeded", "worker_completed")]
    assert attempts[0].heartbeat_at is not None  # the worker's heartbeater kept it fresh


def test_nothing_private_reaches_the_ledger(shared: Shared) -> None:
    ledger = shared.ledger
    secret = "tsg-secret-" + uuid.uuid4().hex
    # Arguments and kwargs are message content; the actor fails with an exception text.
    msg = shared.producer.message("flaky", 1)
    msg = msg.copy(kwargs={}, args=(1,), options={"secret_option": secret})
    shared.producer.broker.enqueue(msg)
    with_arg = shared.send("crash_once", secret, 0.0)
    wait_closed(ledger, msg.message_id)
    wait_closed(ledger, with_arg)
    raw = ledger_backends.stored_bytes(shared.env.db)
    assert secret.encode() not in raw
    assert b"planned failure" not in raw  # the exception text
    host = socket.gethostname().encode()
    if len(host) >= 6:  # a 2-letter host name matches random binary bytes
        assert host not in raw
    for mid in (msg.message_id, with_arg):
        # A message id is a random UUID and carries nothing: it is kept with the logical task
        # (and nowhere else) so that a lost message can be traced back to it.
        assert ledger.get_task(logical_task_id(mid)).framework_id == mid
        assert all(child.framework_id is None for child in ledger.children_of(logical_task_id(mid)))
