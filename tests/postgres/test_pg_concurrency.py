"""Many reconcilers and workers at once: no double close, no deadlock, no lost update."""

from __future__ import annotations

import os
import signal
import threading
import time

from pg_helpers import Workers, sql
from task_state_guard import Ledger, ReconcilePolicy

TASKS = 240
RECONCILERS = 4


def _event_counts(url: str) -> dict[str, int]:
    rows = sql(url, "SELECT kind, count(*) FROM tsg_events GROUP BY kind")
    return {kind: int(count) for kind, count in rows}


def test_concurrent_reconcilers_close_each_lost_task_once(pg_url: str, workers: Workers) -> None:
    holder = workers.start("hold", pg_url, TASKS)
    ids = workers.line(holder, timeout=120)
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    start = time.time() + 3.0  # every reconciler connected and waiting at one start line
    procs = [workers.start("reconcile", pg_url, start) for _ in range(RECONCILERS)]
    reports = [workers.finish(p) for p in procs]
    assert sum(r["tasks_timed_out"] for r in reports) == TASKS
    assert all(r["applied"] for r in reports)
    with Ledger(pg_url) as ledger:
        assert all(ledger.get_task(t).terminal_code == "owner_lost" for t in ids)
        assert ledger.doctor()["healthy"] is True
    counts = _event_counts(pg_url)
    assert counts["closed"] == TASKS  # one close event per task: nothing closed twice


def test_workers_racing_reconcilers_never_lose_an_update(pg_url: str, workers: Workers) -> None:
    with Ledger(pg_url) as ledger:
        ids = []
        for _ in range(TASKS):
            task = ledger.create_task(timeout_seconds=0)  # past its deadline once started
            ledger.start_task(task.id, owner=False)
            ids.append(task.id)
    start = time.time() + 3.0
    # Two workers close every task (in opposite orders) while reconcilers time them out.
    closers = [
        workers.start("close", pg_url, start, ",".join(ids)),
        workers.start("close", pg_url, start, ",".join(reversed(ids))),
    ]
    reconcilers = [workers.start("reconcile", pg_url, start) for _ in range(RECONCILERS)]
    closes = [workers.finish(p) for p in closers]
    reports = [workers.finish(p) for p in reconcilers]
    won = len(set(closes[0]["won"]) | set(closes[1]["won"]))
    timed_out = sum(r["tasks_timed_out"] for r in reports)
    assert won + timed_out == TASKS  # every task closed exactly once, by one side
    assert sum(len(c["won"]) + c["refused"] for c in closes) == 2 * TASKS
    with Ledger(pg_url) as ledger:
        states = [ledger.get_task(t).status for t in ids]
        assert states.count("succeeded") == won
        assert states.count("timed_out") == timed_out
        assert ledger.doctor()["healthy"] is True
    assert _event_counts(pg_url)["closed"] == TASKS


def test_a_pass_never_deadlocks_with_a_workers_transaction(pg_url: str) -> None:
    """A worker holds a parent's row and then wants its child's while a pass runs (the pass
    reads children before parents): the pass skips the held row instead of waiting for it."""
    with Ledger(pg_url) as setup:
        parent = setup.create_task()
        setup.start_task(parent.id, owner=False)
        child = setup.create_task(parent_id=parent.id, delivery_required=False)
        setup.start_task(child.id, owner=False)
    holding = threading.Event()
    errors: list[BaseException] = []
    report: dict[str, object] = {}

    def worker() -> None:
        try:
            with Ledger(pg_url) as ledger, ledger.atomic():
                ledger.heartbeat(parent.id)  # holds the parent's row
                holding.set()
                time.sleep(1.0)  # the pass has taken the child's row by now
                ledger.heartbeat(child.id)
        except BaseException as exc:
            errors.append(exc)

    def reconciler() -> None:
        try:
            assert holding.wait(10)
            time.sleep(0.2)
            with Ledger(pg_url) as ledger:
                report.update(ledger.reconcile(ReconcilePolicy(3600, 3600)))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker), threading.Thread(target=reconciler)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == []
    assert report["tasks_timed_out"] == 0 and report["applied"] is True
    with Ledger(pg_url) as ledger:
        assert ledger.get_task(child.id).heartbeat_at is not None


def test_a_worker_never_waits_for_a_pass_over_a_row_it_keeps(pg_url: str) -> None:
    """A pass holds only the rows it closes: a worker's heartbeat of a fresh task the pass has
    already read and kept goes through while the pass is still running (the pass holding the
    rows it read would make it wait for the pass's commit)."""
    with Ledger(pg_url) as setup:
        stale = []
        for _ in range(2100):  # two batches: the second is read after the first's progress
            task = setup.create_task(timeout_seconds=0, delivery_required=False)
            setup.start_task(task.id, owner=False)
            stale.append(task.id)
        fresh = setup.create_task()
        setup.start_task(fresh.id, owner=False)  # the newest: in the pass's first batch
    beat = threading.Event()
    seen: list[tuple[int, int]] = []
    errors: list[BaseException] = []

    def heartbeat() -> None:
        try:
            with Ledger(pg_url) as ledger:
                ledger.heartbeat(fresh.id)
            beat.set()
        except BaseException as exc:
            errors.append(exc)

    def progress(done: int, total: int) -> None:
        seen.append((done, total))
        if len(seen) == 2:  # the first batch is read, judged and written, not committed
            thread = threading.Thread(target=heartbeat)
            thread.start()
            seen.append((int(beat.wait(20)), -1))

    with Ledger(pg_url) as ledger:
        report = ledger.reconcile(ReconcilePolicy(3600, 3600), progress=progress)
    assert errors == []
    assert seen[2] == (1, -1), seen  # the heartbeat finished before the pass went on
    assert report["tasks_timed_out"] == 2100 and report["fresh_active_retained"] == 1
    with Ledger(pg_url) as ledger:
        assert ledger.get_task(fresh.id).status == "running"
        assert all(ledger.get_task(t).terminal_code == "deadline_exceeded" for t in stale[:5])
        assert ledger.doctor()["healthy"] is True
