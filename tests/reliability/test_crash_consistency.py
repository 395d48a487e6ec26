"""Crash consistency: SIGKILL a multi-threaded ledger writer 50 times, audit after each kill.

The harness lives in scripts/crash_soak.py (the long run is ``--kills 1000``).
"""

from __future__ import annotations

import json

from .conftest import load_script


def test_fifty_sigkills_lose_nothing_and_leave_no_partial_transition() -> None:
    soak = load_script("crash_soak")
    summary = soak.run_soak(50, seed=7, threads=4, min_delay=0.15, max_delay=0.8)
    print(json.dumps(summary, sort_keys=True))
    assert summary["failures"] == 0, summary["failure_samples"]
    assert summary["kills_survived"] == 50
    # The kills must have landed on real work, not on idle processes.
    assert summary["transitions_logged"] > 500
    assert summary["transition_checks"] > summary["transitions_logged"] / 2


def test_checker_detects_a_lost_transition(tmp_path) -> None:
    """The audit is not vacuous: a logged transition that the ledger lacks is reported."""
    from task_state_guard import Ledger

    soak = load_script("crash_soak")
    db = tmp_path / "l" / "tasks.sqlite"
    log = tmp_path / "log"
    with Ledger(db) as ledger:
        task = ledger.create_task()
        ledger.start_task(task.id, owner=False)
        closed = ledger.close_task(task.id, "succeeded", code="completed")
    record = soak._task_record("close", closed)
    ghost = dict(record, id="00000000-0000-4000-8000-000000000000")
    with open(log, "w") as handle:
        handle.write(json.dumps(record) + "\n" + json.dumps(ghost) + "\n")
        handle.write(json.dumps(dict(record, s="failed", c="worker_failed")) + "\n")
    checker = soak.Checker(str(db), str(log))
    checker.check()
    assert "a logged task is missing" in checker.failures
    assert "two different terminal states were returned for one task" in checker.failures
