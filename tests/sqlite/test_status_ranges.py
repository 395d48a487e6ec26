"""SQLite counts status (and the overview's chart) range by range of seq: every task counts
once however sparse the seq numbers are (a long-pruned ledger), and past the group bound names
fold the same way for ``status`` and the overview."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from core_helpers import Clock
from task_state_guard import Ledger
from task_state_guard.ops import status as core_status


def _fill(ledger: Ledger, clock: Clock) -> None:
    """Six names: per name one queued, one running and two closed jobs (one with an attempt)."""
    for index in range(6):
        name = f"app.n{index}"
        ledger.create_task(name=name)
        running = ledger.create_task(name=name)
        ledger.start_task(running.id, owner=False)
        for state in ("succeeded", "failed"):
            root = ledger.create_task(name=name)
            ledger.start_task(root.id, owner=False)
            if state == "failed":
                attempt = ledger.create_task(parent_id=root.id, delivery_required=False,
                                             name=name)
                ledger.start_task(attempt.id, owner=False)
                ledger.close_task_settled(attempt.id, state, code="worker_failed")
            clock.advance(10)
            ledger.close_task_settled(root.id, state,
                                      code="worker_failed" if state == "failed" else None)


def test_every_task_counts_once_however_sparse_the_seq_numbers(tmp_path: Path) -> None:
    path = str(tmp_path / "ledger.db")
    clock = Clock()
    with Ledger(path, clock=clock) as ledger:
        _fill(ledger, clock)
    with sqlite3.connect(path) as conn:  # gaps of a trillion between the rows, as after prune
        conn.execute("UPDATE tsg_events SET task_seq = task_seq * 1000000000000")
        conn.execute("UPDATE tsg_tasks SET seq = seq * 1000000000000")
    clock.advance(60)
    with Ledger(path, clock=clock, read_only=True) as ledger:
        report, history = ledger.overview(window_seconds=3600, buckets=6)
        assert report == ledger.status()
        assert history == ledger.outcome_history(window_seconds=3600, buckets=6)
    assert report["tasks"] == {"queued": 6, "running": 6, "succeeded": 6, "failed": 12,
                               "timed_out": 0, "cancelled": 0}
    assert report["attempts_by_name"]["app.n5"]["failed"] == 1
    assert sum(map(sum, history.counts.values())) == 12  # roots only, attempts apart


def test_names_past_the_group_bound_fold_alike_in_status_and_the_overview(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = str(tmp_path / "ledger.db")
    clock = Clock()
    with Ledger(path, clock=clock) as ledger:
        _fill(ledger, clock)
    monkeypatch.setattr(core_status, "_MAX_GROUPS", 3)
    with Ledger(path, clock=clock, read_only=True) as ledger:
        report, _history = ledger.overview(window_seconds=3600, buckets=6)
        assert report == ledger.status()
    named = [name for name in report["by_name"] if name != core_status.INVALID_LABEL]
    assert 1 <= len(named) <= 3
    assert sum(per["queued"] for per in report["by_name"].values()) == 6
    assert sum(per["failed"] for per in report["by_name"].values()) == 6
    assert report["by_name"][core_status.INVALID_LABEL]["queued"] >= 3
