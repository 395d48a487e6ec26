"""Scenario rows: SIGKILL of a pool child, SIGKILL of the whole worker, duplicates."""

from __future__ import annotations

import os
import signal

import pytest
from celery_harness import Scenario


def _running(attempts: list) -> bool:
    return any(str(a.status) == "running" for a in attempts)


def test_child_sigkill_default_acks(scenario: Scenario) -> None:
    """Pool child SIGKILLed mid-task (default acks): attempt and parent failed/worker_lost."""
    scenario.start_worker()
    result = scenario.send("tsgt.sleep", 30, "child")
    child = scenario.marker("child")
    scenario.wait_attempts(result.id, _running)
    os.kill(child, signal.SIGKILL)
    scenario.wait_parent(result.id, "failed")
    assert scenario.outcome(result.id) == (
        ("failed", "worker_lost"),
        [("failed", "worker_lost")],
    )
    scenario.assert_healthy()


def test_child_sigkill_acks_late_reject_on_worker_lost(any_broker: Scenario) -> None:
    """acks_late + reject_on_worker_lost: the lost attempt is closed, the redelivered attempt
    runs under the same parent, which ends succeeded."""
    scenario = any_broker
    scenario.start_worker()
    result = scenario.send("tsgt.sleep_late", 30, "late", 0.2)
    child = scenario.marker("late")
    scenario.wait_attempts(result.id, _running)
    os.kill(child, signal.SIGKILL)
    assert result.get(timeout=30) == "second"
    scenario.wait_parent(result.id, "succeeded")
    parent, attempts = scenario.outcome(result.id)
    assert parent == ("succeeded", "worker_completed")
    assert attempts == [("failed", "worker_lost"), ("succeeded", "worker_completed")]
    assert not scenario.parent(result.id).has_owner  # acks_late: the broker owns the message
    scenario.assert_healthy()


def test_child_sigkill_retry_on_worker_lost(scenario: Scenario) -> None:
    """task_retry_on_worker_lost: the main process republishes; the lost attempt closes
    failed/retry_scheduled and the retry runs as a new attempt of the same parent."""
    scenario.start_worker()
    result = scenario.send("tsgt.sleep_retry_lost", 30, "rol")
    child = scenario.marker("rol")
    scenario.wait_attempts(result.id, _running)
    os.kill(child, signal.SIGKILL)
    assert result.get(timeout=30) == "retried"
    scenario.wait_parent(result.id, "succeeded")
    assert scenario.outcome(result.id) == (
        ("succeeded", "worker_completed"),
        [("failed", "retry_scheduled"), ("succeeded", "worker_completed")],
    )
    scenario.assert_healthy()


def test_whole_worker_sigkill_default_acks(any_broker: Scenario) -> None:
    """Whole worker SIGKILLed, restarted at once (grace 600 s): before the new worker takes a
    task, reconcile on boot has closed the lost attempt and its parent as owner_lost."""
    scenario = any_broker
    scenario.grace = 600.0
    worker = scenario.start_worker()
    result = scenario.send("tsgt.sleep", 60, "whole")
    scenario.marker("whole")
    scenario.wait_attempts(result.id, _running)
    worker.sigkill()
    # Nothing closed it yet: no signal fires when the whole worker dies.
    assert scenario.outcome(result.id)[0] == ("running", None)
    restarted = scenario.start_worker()
    log = restarted.log()
    assert '"tasks_timed_out":2' in log, log
    # The boot reconcile happened before the worker was ready to consume.
    assert log.index("task-state-guard: reconcile (") < log.index(" ready.")
    assert scenario.outcome(result.id) == (
        ("timed_out", "owner_lost"),
        [("timed_out", "owner_lost")],
    )
    after = scenario.send("tsgt.ok")
    assert after.get(timeout=20) == "ok"
    scenario.wait_parent(after.id, "succeeded")
    scenario.assert_healthy()


def test_whole_worker_sigkill_acks_late(any_broker: Scenario) -> None:
    """acks_late: the boot reconcile closes the lost attempt as owner_lost but keeps the
    parent open; the redelivered message succeeds as a new attempt of the same parent."""
    scenario = any_broker
    scenario.grace = 600.0
    worker = scenario.start_worker(TSGT_VISIBILITY=2)
    result = scenario.send("tsgt.sleep_late", 60, "wholelate", 0.1)
    scenario.marker("wholelate")
    scenario.wait_attempts(result.id, _running)
    worker.sigkill()
    restarted = scenario.start_worker(TSGT_VISIBILITY=2)
    log = restarted.log()
    assert '"tasks_timed_out":1' in log, log
    parent, attempts = scenario.outcome(result.id)
    assert parent in (("running", None), ("succeeded", "worker_completed"))
    assert attempts[0] == ("timed_out", "owner_lost")
    assert result.get(timeout=30) == "second"
    log = restarted.log()
    # Closed at boot, before this worker received the redelivered message.
    booted = log.index("task-state-guard: reconcile (")
    assert booted < log.index(f"tsgt.sleep_late[{result.id}] received")
    scenario.wait_parent(result.id, "succeeded")
    assert scenario.outcome(result.id) == (
        ("succeeded", "worker_completed"),
        [("timed_out", "owner_lost"), ("succeeded", "worker_completed")],
    )
    scenario.assert_healthy()


def test_two_attempts_of_one_task_id_at_once(scenario: Scenario) -> None:
    """Visibility timeout shorter than the task: two distinct attempt records, both closed."""
    scenario.start_worker(TSGT_VISIBILITY=1)
    result = scenario.send("tsgt.sleep_late", 4, "dup", 2)
    scenario.marker("dup")
    scenario.marker("dup.again", timeout=20)
    attempts = scenario.wait_attempts(
        result.id, lambda a: len(a) >= 2 and all(str(x.status) == "running" for x in a[:2])
    )
    assert len({a.id for a in attempts}) == len(attempts)  # never a shared record
    scenario.wait_parent(result.id, "succeeded")
    # Both long executions end; any further copy (the second execution can be restored
    # once more) finishes at once as its own attempt.
    attempts = scenario.wait_attempts(
        result.id, lambda a: bool(a) and all(x.is_terminal for x in a), timeout=30
    )
    assert len(attempts) >= 2
    assert {(str(a.status), a.terminal_code) for a in attempts} == {
        ("succeeded", "worker_completed")}
    assert len({a.id for a in attempts}) == len(attempts)
    scenario.assert_healthy()


@pytest.mark.parametrize("workers", [3])
def test_several_workers_boot_at_once(scenario: Scenario, workers: int) -> None:
    """Reconcile on boot tolerates several workers booting on one host at once."""
    first = scenario.start_worker()
    result = scenario.send("tsgt.sleep", 60, "multi")
    scenario.marker("multi")
    scenario.wait_attempts(result.id, _running)
    first.sigkill()
    started = [scenario.start_worker(ready=False) for _ in range(workers)]
    for worker in started:
        worker.wait_ready()
    total = 0
    for worker in started:
        log = worker.log()
        assert "task-state-guard: reconcile (" in log and "ledger error" not in log, log
        for count in range(0, 3):
            if f'"tasks_timed_out":{count}' in log:
                total += count
    assert total == 2  # each lost record closed exactly once across the three boots
    assert scenario.outcome(result.id) == (
        ("timed_out", "owner_lost"),
        [("timed_out", "owner_lost")],
    )
    scenario.assert_healthy()



@pytest.mark.parametrize("late", [False, True], ids=["default_acks", "acks_late"])
def test_cold_shutdown_cancels_the_running_task(scenario: Scenario, late: bool) -> None:
    """Cold shutdown (SIGQUIT) cancels the running task. Default acks: the main process
    reports it (task_retry without a reason); the message is gone, so the attempt and the
    logical task close cancelled/interrupted. acks_late: no signal reports it; the message
    goes back to the broker, the next worker's boot reconcile closes the dead child's attempt
    timed_out/owner_lost, the logical task stays open and the message runs again as a new
    attempt."""
    worker = scenario.start_worker()
    task, marker = ("tsgt.sleep_late", "coldlate") if late else ("tsgt.sleep", "cold")
    result = scenario.send(task, 60, marker) if not late else scenario.send(task, 60, marker, 0.1)
    scenario.marker(marker)
    scenario.wait_attempts(result.id, _running)
    os.kill(worker.pid, signal.SIGQUIT)
    worker.proc.wait(30)
    if not late:
        scenario.wait_parent(result.id, "cancelled")
        assert scenario.outcome(result.id) == (
            ("cancelled", "interrupted"),
            [("cancelled", "interrupted")],
        )
    else:
        assert scenario.outcome(result.id) == (("running", None), [("running", None)])
        restarted = scenario.start_worker()
        assert '"tasks_timed_out":1' in restarted.log(), restarted.log()
        assert result.get(timeout=30) == "second"
        scenario.wait_parent(result.id, "succeeded")
        assert scenario.outcome(result.id) == (
            ("succeeded", "worker_completed"),
            [("timed_out", "owner_lost"), ("succeeded", "worker_completed")],
        )
    scenario.assert_healthy()
