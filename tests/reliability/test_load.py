"""Load: 8 processes x 4 threads on one ledger for a bounded time (scripts/load_soak.py; the long
run is ``--seconds 600``), plus deterministic reproductions of the races that load exposes; on
each ledger backend (``[sqlite]``: a file, ``[postgresql]``: a schema of its own)."""

from __future__ import annotations

import contextlib
import json
import os

import pytest
from task_state_guard import Ledger, LedgerError

from .conftest import load_script

CI_SECONDS = float(os.environ.get("TSG_LOAD_SECONDS", "20"))


def test_eight_processes_four_threads_one_ledger(ledger_target: str) -> None:
    soak = load_script("load_soak")
    summary = soak.run_load(CI_SECONDS, processes=8, threads=4, seed=3, db=ledger_target)
    print(json.dumps(summary, sort_keys=True))
    assert summary["ledger_busy_errors"] == 0, summary
    assert summary["errors"] == {}, summary
    assert summary["failures"] == [], summary
    assert summary["doctor_healthy"]
    assert summary["claim_conflicts"] > 0  # the workers really raced for shared tasks
    assert summary["reconciles"] > 0 and summary["heartbeats"] > 0
    assert summary["transitions"] > 1000
    # A close of a claimed task never conflicts with other threads' heartbeats (the clock is read
    # under the write lock: test_transition_after_a_concurrent_heartbeat).
    assert summary["spurious_state_conflicts"] == 0


def _heartbeat_lands_between_clock_read_and_write(db: str, action: str) -> object:
    """Regression (found by the load run, fixed in the core). Ledger A reads its clock (t=100);
    before A writes, ledger B (another connection, as
    another process would) heartbeats the same running task at t=101. A's transition was issued
    after B's committed, so it must apply (or, if the core serializes the clock read with the
    write, B simply waits). Only injected clocks are used: no core internals are touched.

    A clock read after that first one is later than B's heartbeat (t=102), as real time would
    be: the SQLite backend reads the clock once, under its write lock (B waits, then gives up);
    PostgreSQL sends the transition as one statement with the first reading, its guard refuses
    after B's heartbeat, and the locked path reads the clock again."""
    armed = [False]
    readings = [0]
    other: list[Ledger] = []

    def clock_a() -> float:
        if armed[0]:
            armed[0] = False
            readings[0] += 1
            # If B cannot get in while A holds the lock, that is the correct design.
            with contextlib.suppress(LedgerError):
                other[0].heartbeat_many([tid])
            return 100.0
        return 102.0 if readings[0] else 100.0

    a = Ledger(db, clock=clock_a)
    other.append(Ledger(db, clock=lambda: 101.0, busy_timeout_ms=200))
    tid = a.create_task().id
    a.start_task(tid, owner=False)
    armed[0] = True
    try:
        if action == "close":
            return a.close_task(tid, "succeeded").status
        return a.heartbeat(tid).status
    finally:
        assert a.doctor()["healthy"]
        a.close()
        other[0].close()


@pytest.mark.parametrize("action", ["close", "heartbeat"])
def test_transition_after_a_concurrent_heartbeat(ledger_target: str, action: str) -> None:
    expected = "succeeded" if action == "close" else "running"
    assert _heartbeat_lands_between_clock_read_and_write(ledger_target, action) == expected
