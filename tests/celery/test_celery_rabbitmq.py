"""The same scenario rows on RabbitMQ (py-amqp transport): success, failure, and SIGKILL of a
pool child and of the whole worker, where RabbitMQ itself redelivers unacknowledged messages
(flagged ``redelivered``) the moment the consumer's connection dies."""

from __future__ import annotations

import os
import signal
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from celery_harness import Scenario

RABBIT_BROKER = "amqp://guest:guest@127.0.0.1:5672//"


@pytest.fixture
def rabbit(tmp_path: Path) -> Iterator[Scenario]:
    try:  # RabbitMQ is required (CI starts it): a missing broker fails, never skips
        socket.create_connection(("127.0.0.1", 5672), timeout=2).close()
    except OSError as exc:
        pytest.fail(f"RabbitMQ is required at 127.0.0.1:5672 for tests/celery: {exc!r}")
    sc = Scenario(tmp_path, broker=RABBIT_BROKER)
    try:
        yield sc
    finally:
        sc.close()


def _running(attempts: list) -> bool:
    return any(str(a.status) == "running" for a in attempts)


def test_success_and_failure_on_rabbitmq(rabbit: Scenario) -> None:
    worker = rabbit.start_worker()
    assert "Connected to amqp://guest:**@127.0.0.1:5672//" in worker.log(), worker.log()
    ok = rabbit.send("tsgt.ok")
    failing = rabbit.send("tsgt.fail")
    assert ok.get(timeout=20) == "ok"
    with pytest.raises(Exception):  # noqa: B017 - the task's own error, re-raised by get()
        failing.get(timeout=20)
    rabbit.wait_parent(ok.id, "succeeded")
    rabbit.wait_parent(failing.id, "failed")
    assert rabbit.outcome(ok.id) == (
        ("succeeded", "worker_completed"), [("succeeded", "worker_completed")]
    )
    assert rabbit.outcome(failing.id) == (
        ("failed", "worker_failed"), [("failed", "worker_failed")]
    )
    rabbit.assert_healthy()


def test_child_sigkill_acks_late_on_rabbitmq(rabbit: Scenario) -> None:
    """The main process rejects the lost message with requeue; RabbitMQ redelivers it at once
    and the second attempt runs under the same parent."""
    rabbit.start_worker()
    result = rabbit.send("tsgt.sleep_late", 30, "late", 0.2)
    child = rabbit.marker("late")
    rabbit.wait_attempts(result.id, _running)
    os.kill(child, signal.SIGKILL)
    assert result.get(timeout=30) == "second"
    rabbit.wait_parent(result.id, "succeeded")
    assert rabbit.outcome(result.id) == (
        ("succeeded", "worker_completed"),
        [("failed", "worker_lost"), ("succeeded", "worker_completed")],
    )
    rabbit.assert_healthy()


def test_whole_worker_sigkill_acks_late_on_rabbitmq(rabbit: Scenario) -> None:
    """The dead worker's connection drops, RabbitMQ requeues the unacknowledged message; the
    restarted worker's boot reconcile closes the lost attempt owner_lost before it consumes,
    and the redelivered message succeeds as a new attempt of the same parent."""
    worker = rabbit.start_worker()
    result = rabbit.send("tsgt.sleep_late", 60, "wholelate", 0.1)
    rabbit.marker("wholelate")
    rabbit.wait_attempts(result.id, _running)
    worker.sigkill()
    restarted = rabbit.start_worker()
    assert '"tasks_timed_out":1' in restarted.log(), restarted.log()
    assert rabbit.outcome(result.id)[1][0] == ("timed_out", "owner_lost")
    assert result.get(timeout=30) == "second"
    log = restarted.log()
    assert log.index("reconcile on boot") < log.index(f"tsgt.sleep_late[{result.id}] received")
    rabbit.wait_parent(result.id, "succeeded")
    assert rabbit.outcome(result.id) == (
        ("succeeded", "worker_completed"),
        [("timed_out", "owner_lost"), ("succeeded", "worker_completed")],
    )
    rabbit.assert_healthy()


def test_whole_worker_sigkill_default_acks_on_rabbitmq(rabbit: Scenario) -> None:
    """Default (early) acks: the message is gone with the worker; the boot reconcile closes
    the lost attempt and its parent owner_lost."""
    worker = rabbit.start_worker()
    result = rabbit.send("tsgt.sleep", 60, "wholeearly")
    rabbit.marker("wholeearly")
    rabbit.wait_attempts(result.id, _running)
    worker.sigkill()
    restarted = rabbit.start_worker()
    assert '"tasks_timed_out":2' in restarted.log(), restarted.log()
    assert rabbit.outcome(result.id) == (
        ("timed_out", "owner_lost"), [("timed_out", "owner_lost")]
    )
    rabbit.assert_healthy()
