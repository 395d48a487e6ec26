"""Scenario rows: success, failure, retries, delivery, pools, names, privacy."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import ledger_backends
import pytest
import task_state_guard_celery
from celery_harness import Scenario, wait_for
from task_state_guard import StateConflict


def test_success_then_mark_delivered(scenario: Scenario) -> None:
    """task succeeds: attempt and parent succeeded; delivery pending until mark_delivered."""
    scenario.start_worker()
    plain = scenario.send("tsgt.ok")
    delivering = scenario.send("tsgt.deliver")
    assert plain.get(timeout=20) == "ok"
    assert delivering.get(timeout=20) == "answer"
    for result in (plain, delivering):
        scenario.wait_parent(result.id, "succeeded")
        assert scenario.outcome(result.id) == (
            ("succeeded", "worker_completed"),
            [("succeeded", "worker_completed")],
        )
    parent = scenario.parent(delivering.id)
    assert parent.delivery_required and str(parent.delivery_status) == "pending"
    assert parent.name == "tsgt.deliver"
    assert all(a.name == "tsgt.deliver" for a in scenario.attempts(delivering.id))
    assert all(not a.delivery_required for a in scenario.attempts(delivering.id))
    # A broker ack or a stored result is not a delivery; a reconcile inside the grace
    # keeps it pending.
    scenario.reconcile()
    assert str(scenario.parent(delivering.id).delivery_status) == "pending"

    guard = task_state_guard_celery.install(scenario.client, db=scenario.db)
    try:
        updated = guard.mark_delivered(delivering.id)
        assert updated is not None and str(updated.delivery_status) == "delivered"
        assert updated.delivery_code == "transport_acknowledged"
    finally:
        guard.uninstall()

    # The non-delivering task and every attempt owe nobody a delivery: closed at once.
    parent = scenario.parent(plain.id)
    assert (str(parent.delivery_status), parent.delivery_code) == (
        "not_applicable",
        "internal_task",
    )
    for result in (plain, delivering):
        assert all(
            (str(a.delivery_status), a.delivery_code) == ("not_applicable", "internal_task")
            for a in scenario.attempts(result.id)
        )
    assert str(scenario.parent(delivering.id).delivery_status) == "delivered"
    scenario.assert_healthy()


def test_mark_delivery_failed(scenario: Scenario) -> None:
    scenario.start_worker(pool="solo", concurrency=1)
    result = scenario.send("tsgt.deliver")
    result.get(timeout=20)
    scenario.wait_parent(result.id, "succeeded")
    guard = task_state_guard_celery.install(scenario.client, db=scenario.db)
    try:
        updated = guard.mark_delivery_failed(result.id)
        assert updated is not None
        assert (str(updated.delivery_status), updated.delivery_code) == (
            "failed",
            "transport_failed",
        )
        # Delivered after failed is a conflict: raised like the core, never a rewrite.
        with pytest.raises(StateConflict):
            guard.mark_delivered(result.id)
    finally:
        guard.uninstall()
    assert str(scenario.parent(result.id).delivery_status) == "failed"
    scenario.assert_healthy()


def test_task_raises(any_broker: Scenario) -> None:
    """task raises: attempt and parent failed/worker_failed."""
    scenario = any_broker
    worker = scenario.start_worker()
    transport = scenario.broker.split("://")[0]
    assert f"Connected to {transport}://" in worker.log(), worker.log()
    result = scenario.send("tsgt.fail")
    with pytest.raises(ValueError):
        result.get(timeout=20)
    other = scenario.send("tsgt.sleep", 0.01, "argument-marker-xyz")
    assert other.get(timeout=20) == "slept"
    scenario.wait_parent(other.id, "succeeded")
    scenario.wait_parent(result.id, "failed")
    assert scenario.outcome(result.id) == (
        ("failed", "worker_failed"),
        [("failed", "worker_failed")],
    )
    scenario.assert_healthy()
    # No exception text, args or results reach the ledger.
    worker.stop()
    scenario.ledger.close()
    scenario._ledger = None
    dump = ledger_backends.stored_bytes(scenario.db)
    for private in ("secret", "ValueError", "argument-marker-xyz", "slept"):
        assert private.encode() not in dump
    host = socket.gethostname()
    if len(host) >= 6:  # a short host name matches random binary bytes
        assert host.encode() not in dump


def _watch_reconcile(
    scenario: Scenario, grace: float, stop: threading.Event
) -> tuple[threading.Thread, list[dict]]:
    """Reconcile every 0.2 s from another process's point of view (its own Ledger)."""
    reports: list[dict] = []

    def loop() -> None:
        from task_state_guard import Ledger, ReconcilePolicy

        with Ledger(scenario.db) as ledger:
            policy = ReconcilePolicy(active_grace_seconds=grace, delivery_grace_seconds=600)
            while not stop.is_set():
                reports.append(ledger.reconcile(policy))
                time.sleep(0.2)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    return thread, reports


def test_retries_twice_then_succeeds(scenario: Scenario) -> None:
    """Retries with a countdown longer than the active grace never time the parent out."""
    scenario.grace = 1.0
    scenario.heartbeat = 0.2
    scenario.start_worker()
    stop = threading.Event()
    thread, reports = _watch_reconcile(scenario, grace=1.0, stop=stop)
    try:
        result = scenario.send("tsgt.retry_twice", 1.6)
        assert result.get(timeout=30) == "done"
        scenario.wait_parent(result.id, "succeeded")
    finally:
        stop.set()
        thread.join(5)
    assert scenario.outcome(result.id) == (
        ("succeeded", "worker_completed"),
        [
            ("failed", "retry_scheduled"),
            ("failed", "retry_scheduled"),
            ("succeeded", "worker_completed"),
        ],
    )
    assert len(reports) > 5
    assert sum(r["tasks_timed_out"] for r in reports) == 0
    scenario.assert_healthy()


def test_retries_exhausted_autoretry(scenario: Scenario) -> None:
    """autoretry_for with max_retries=2: three attempts, parent failed."""
    scenario.start_worker()
    result = scenario.send("tsgt.autoretry")
    with pytest.raises(KeyError):
        result.get(timeout=30)
    scenario.wait_parent(result.id, "failed")
    assert scenario.outcome(result.id) == (
        ("failed", "worker_failed"),
        [
            ("failed", "retry_scheduled"),
            ("failed", "retry_scheduled"),
            ("failed", "worker_failed"),
        ],
    )
    scenario.assert_healthy()


@pytest.mark.parametrize("pool", ["threads", "solo"])
def test_other_pools_success_failure_retry(scenario: Scenario, pool: str) -> None:
    """threads and solo pools: same outcomes as prefork for success, failure and retry."""
    scenario.start_worker(pool=pool, concurrency=1 if pool == "solo" else 2)
    ok = scenario.send("tsgt.ok")
    bad = scenario.send("tsgt.fail")
    retried = scenario.send("tsgt.retry_twice", 0.2)
    exhausted = scenario.send("tsgt.autoretry")
    assert ok.get(timeout=20) == "ok"
    with pytest.raises(ValueError):
        bad.get(timeout=20)
    assert retried.get(timeout=20) == "done"
    with pytest.raises(KeyError):
        exhausted.get(timeout=20)
    for result, status in ((ok, "succeeded"), (bad, "failed"), (retried, "succeeded"),
                           (exhausted, "failed")):
        scenario.wait_parent(result.id, status)
    assert scenario.outcome(ok.id) == (
        ("succeeded", "worker_completed"),
        [("succeeded", "worker_completed")],
    )
    assert scenario.outcome(bad.id) == (("failed", "worker_failed"), [("failed", "worker_failed")])
    assert scenario.outcome(retried.id) == (
        ("succeeded", "worker_completed"),
        [("failed", "retry_scheduled")] * 2 + [("succeeded", "worker_completed")],
    )
    assert scenario.outcome(exhausted.id) == (
        ("failed", "worker_failed"),
        [("failed", "retry_scheduled")] * 2 + [("failed", "worker_failed")],
    )
    scenario.assert_healthy()


def test_name_that_does_not_fit_is_relabelled(scenario: Scenario) -> None:
    """The label rule of every adapter: characters outside the label set become ``_``."""
    scenario.start_worker()
    result = scenario.send("tsgt bad name!")
    assert result.get(timeout=20) == "ok"
    parent = scenario.wait_parent(result.id, "succeeded")
    assert parent.name == "tsgt_bad_name_"
    assert [a.name for a in scenario.attempts(result.id)] == ["tsgt_bad_name_"]
    scenario.assert_healthy()


def test_wait_for_helper_fails_loudly() -> None:
    with pytest.raises(AssertionError):
        wait_for(lambda: False, timeout=0.1)


@pytest.mark.sqlite_only(reason="the ledger's directory mounted read-only")
def test_unwritable_ledger_tasks_still_run(scenario: Scenario) -> None:
    """Ledger in a read-only directory: tasks still run; each error kind is logged once."""
    ledger_dir = str(Path(scenario.db).parent)
    seeded = scenario.ledger.create_task(name="seed")  # an existing, healthy ledger
    scenario.ledger.close()
    scenario._ledger = None
    script = 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && exec "$@"'
    worker = scenario.start_worker(
        concurrency=1, wrap=["unshare", "--mount", "--propagation", "private", "sh", "-c",
                             script, ledger_dir]
    )
    results = [scenario.send("tsgt.ok") for _ in range(3)] + [scenario.send("tsgt.fail")]
    assert [r.get(timeout=20) for r in results[:3]] == ["ok"] * 3
    with pytest.raises(ValueError):
        results[3].get(timeout=20)
    log = worker.log()
    kinds = [line for line in log.splitlines() if "task-state-guard: ledger error (" in line]
    assert kinds, log
    logged = [line.split("ledger error (")[1].split(")")[0] for line in kinds]
    assert len(logged) == len(set(logged)), kinds  # once per kind (per process)
    assert "task_prerun" in [kind.split(":")[0] for kind in logged]
    worker.stop()
    # Nothing was written; the ledger is still healthy.
    assert scenario.ledger.status()["tasks"]["queued"] == 1
    assert scenario.ledger.get_task(seeded.id).name == "seed"
    scenario.assert_healthy()


@pytest.mark.parametrize("pool", ["prefork", "solo"])
def test_task_replace_continues_the_logical_task(scenario: Scenario, pool: str) -> None:
    """Task.replace(): the replaced attempt closes cancelled/ignored, the replacement runs as
    a new attempt of the same logical task (same Celery id), which ends succeeded, whichever
    of the replacement and the replaced task's own postrun comes first."""
    scenario.start_worker(pool=pool, concurrency=2 if pool == "prefork" else 1)
    results = [scenario.send("tsgt.replaced"), scenario.send("tsgt.replaced", 0.3)]
    for result in results:
        assert result.get(timeout=30) == "replacement"
    for result in results:
        scenario.wait_parent(result.id, "succeeded")
        parent, attempts = scenario.outcome(result.id)
        assert parent == ("succeeded", "worker_completed")
        assert sorted(attempts) == [("cancelled", "ignored"), ("succeeded", "worker_completed")]
        names = sorted(str(a.name) for a in scenario.attempts(result.id))
        assert names == ["tsgt.replaced", "tsgt.replacement"]
    scenario.assert_healthy()
