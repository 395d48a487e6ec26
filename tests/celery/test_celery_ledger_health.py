"""A guard that cannot guard says so at worker start: an unusable ledger (here a directory that
others may write to) is logged once at ERROR with its fixed reason, the worker runs its tasks
with nothing recorded, and ``require_ledger`` makes it refuse to start (real ``celery worker``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from celery_harness import Scenario

UNUSABLE = ("task-state-guard: the ledger cannot be used at worker start (UnsafeLocation, "
            "reason directory_writable_by_others)")


@pytest.fixture
def shared_dir(tmp_path: Path) -> Iterator[Scenario]:
    directory = tmp_path / "group-writable"
    directory.mkdir()
    os.chmod(directory, 0o770)  # tsg refuses it: others could swap the ledger
    sc = Scenario(tmp_path, db=str(directory / "tasks.sqlite"))
    try:
        yield sc
    finally:
        sc.close()


def test_an_unusable_ledger_is_logged_once_and_the_worker_runs_on(shared_dir: Scenario) -> None:
    scenario = shared_dir
    worker = scenario.start_worker()
    assert scenario.send("tsgt.ok").get(timeout=30) == "ok"
    log = worker.log()
    lines = [line for line in log.splitlines() if "the ledger cannot be used" in line]
    assert len(lines) == 1 and UNUSABLE in lines[0] and "ERROR" in lines[0], log
    assert "require_ledger" in lines[0]  # says how to refuse instead
    assert scenario.db not in log and "group-writable" not in log
    assert not os.path.exists(scenario.db)  # nothing was created


def test_require_ledger_refuses_to_start_the_worker(shared_dir: Scenario) -> None:
    scenario = shared_dir
    worker = scenario.start_worker(ready=False, TSG_REQUIRE_LEDGER=1)
    code = worker.proc.wait(60)
    log = worker.log()
    assert code != 0 and " ready." not in log, log
    assert UNUSABLE in log and "require_ledger is set: the worker does not start" in log
    assert scenario.db not in log
