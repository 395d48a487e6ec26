"""A pool child lost after Celery stored ``SUCCESS`` and before the adapter's close committed.

Celery (5.7+) then keeps ``SUCCESS`` and logs "succeeded before the worker was lost"; no signal
fires. The worker's main process reads the backend when a child is lost and closes such a job
``succeeded/worker_completed``: never ``owner_lost``, never counted lost, never ``on_lost``.
Real prefork workers on Redis, pool children SIGKILLed while the main process lives, both
ledger backends.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import time
from pathlib import Path
from typing import Any

from celery import states  # type: ignore[import-untyped]
from celery.exceptions import WorkerLostError  # type: ignore[import-untyped]
from celery_harness import Scenario, wait_for
from verdict_checks import lost_jobs, tsg

RACE = "succeeded before the worker was lost"


def _pool_children(pid: int) -> list[int]:
    """The live child processes of ``pid`` (a prefork worker's pool)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid ...: comm may hold spaces, so split after its last ')'
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[1]) == pid and fields[0] not in ("Z", "X"):
            found.append(int(entry.name))
    return found


def _error_of(result: Any) -> BaseException | None:
    error = result.result
    return error if isinstance(error, BaseException) else None


def test_child_killed_after_success_is_stored(scenario: Scenario) -> None:
    """Deterministic: the child is killed inside an application ``task_success`` receiver that
    runs before the adapter's. The job ends ``succeeded`` at once, the worker logged the race,
    and an operator's reconcile afterwards finds nothing lost."""
    worker = scenario.start_worker(TSGT_ON_LOST="1")
    result = scenario.send("tsgt.success_window")
    child = scenario.marker(f"stored-{result.id}")
    # In the window: Celery stored SUCCESS, the ledger still has the attempt running.
    assert result.state == states.SUCCESS
    parent, attempts = scenario.outcome(result.id)
    assert parent == ("running", None) and attempts == [("running", None)]
    os.kill(child, signal.SIGKILL)
    scenario.wait_parent(result.id, "succeeded")
    assert scenario.outcome(result.id) == (
        ("succeeded", "worker_completed"),
        [("succeeded", "worker_completed")],
    )
    wait_for(lambda: RACE in worker.log(), 10, what="Celery's log of the race")
    report = tsg(scenario.db, "reconcile")["reconcile"]
    assert report["tasks_timed_out"] == 0, report
    assert result.state == states.SUCCESS
    assert scenario.lost_hook_calls() == {}
    assert lost_jobs(scenario.db) == 0
    scenario.assert_healthy()


def test_random_child_kills_never_lose_a_success(scenario: Scenario) -> None:
    """Many short tasks whose application ``task_success`` receiver delays the adapter's close,
    pool children SIGKILLed at random while the main process lives, then an operator's
    ``tsg reconcile``: every job the backend says ``SUCCESS`` is ``succeeded`` and never reached
    ``on_lost``; every ``WorkerLostError`` job is ``failed/worker_lost``, as Celery reports."""
    worker = scenario.start_worker(
        TSGT_ON_LOST="1", TSGT_SUCCESS_DELAY="0.04", TSG_RECONCILE_INTERVAL_SECONDS="0.5",
    )
    results = [scenario.send("tsgt.short", 0.02) for _ in range(240)]
    rng = random.Random(7)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        if all(r.ready() for r in results):
            break
        time.sleep(rng.uniform(0.15, 0.45))
        children = _pool_children(worker.pid)
        if children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(rng.choice(children), signal.SIGKILL)
    assert all(r.ready() for r in results), "tasks still running after 240 s"
    races = worker.log().count(RACE)
    assert races >= 1, "no child was lost after storing SUCCESS: this run proves nothing"

    report = tsg(scenario.db, "reconcile")["reconcile"]
    # A child killed after storing SUCCESS while no job was left to send it is noticed by
    # Celery's pool maintenance, which runs every 5 s (``AsynPool.timers``): only then does the
    # main process close that job. Until then the reconcile above must keep it (its worker
    # lives); the assertions below say what is wrong if it never closes.
    for result in results:
        if result.state == states.SUCCESS:
            with contextlib.suppress(AssertionError):
                scenario.wait_parent(result.id, "succeeded", timeout=30.0)
    time.sleep(2.0)  # the worker's periodic pass publishes any verdict the reconcile recorded
    calls = scenario.lost_hook_calls()
    succeeded = failed = 0
    for result in results:
        try:
            parent, attempts = scenario.outcome(result.id)
        except Exception as exc:
            raise AssertionError((result.state, repr(result.result), worker.log()[-3000:])) from exc
        if result.state == states.SUCCESS:
            succeeded += 1
            seen = (result.id, parent, attempts, worker.log()[-4000:])  # the log says why
            assert parent == ("succeeded", "worker_completed"), seen
            assert ("succeeded", "worker_completed") in attempts, seen
            assert result.id not in calls
        else:
            failed += 1
            assert result.state == states.FAILURE, result.state
            assert isinstance(_error_of(result), WorkerLostError), _error_of(result)
            assert parent == ("failed", "worker_lost"), (parent, attempts)
    assert failed >= 1 and succeeded >= races
    assert report["tasks_timed_out"] == 0, report
    assert calls == {}
    assert lost_jobs(scenario.db) == 0
    scenario.assert_healthy()


def _whole_worker_killed_after_success(scenario: Scenario) -> tuple[Any, Any]:
    """The whole worker (main process and pool) SIGKILLed while a child sits after Celery
    stored SUCCESS and before the adapter's close: nobody saw the end."""
    worker = scenario.start_worker(TSGT_ON_LOST="1")
    result = scenario.send("tsgt.success_window")
    scenario.marker(f"stored-{result.id}")
    assert result.state == states.SUCCESS
    assert scenario.outcome(result.id) == (("running", None), [("running", None)])
    os.killpg(worker.pid, signal.SIGKILL)
    worker.proc.wait(10)
    return worker, result


def test_whole_worker_killed_after_success_next_worker_closes_it_succeeded(
    scenario: Scenario,
) -> None:
    """The next worker's boot reconcile reads the result backend before it applies: the job
    is closed ``succeeded``, not lost; no ``FAILURE``, no ``on_lost``, no lost count."""
    _worker, result = _whole_worker_killed_after_success(scenario)
    scenario.start_worker(TSGT_ON_LOST="1")  # ready: its boot reconcile has run
    assert scenario.outcome(result.id) == (
        ("succeeded", "worker_completed"), [("succeeded", "worker_completed")],
    )
    assert result.state == states.SUCCESS
    assert lost_jobs(scenario.db) == 0
    assert tsg(scenario.db, "reconcile")["reconcile"]["tasks_timed_out"] == 0
    assert scenario.lost_hook_calls() == {}
    scenario.assert_healthy()


def test_whole_worker_killed_after_success_operator_reconcile_first(scenario: Scenario) -> None:
    """An operator's ``tsg reconcile`` first (it cannot read the result backend): the ledger
    closes the job lost, as documented; the verdict it owes Celery is superseded when a worker
    publishes it: ``SUCCESS`` stays, ``on_lost`` is never called."""
    _worker, result = _whole_worker_killed_after_success(scenario)
    assert tsg(scenario.db, "reconcile")["reconcile"]["tasks_timed_out"] == 2
    assert scenario.outcome(result.id)[0] == ("timed_out", "owner_lost")
    assert _pending(scenario) == 1
    scenario.start_worker(TSGT_ON_LOST="1")  # its boot step drains the verdicts owed to Celery
    wait_for(
        lambda: _pending(scenario) == 0,
        20, what="the verdict drained",
    )
    assert result.state == states.SUCCESS and result.get(timeout=5) == "stored"
    assert scenario.lost_hook_calls() == {}
    scenario.assert_healthy()



def _pending(scenario: Scenario) -> int:
    return int(tsg(scenario.db, "status")["status"]["verdicts"]["pending"].get("celery", 0))
