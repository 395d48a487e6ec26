"""The adapters' periodic reconcile logs quietly: a pass that changed nothing logs its report at
DEBUG, one that closed something at INFO with its counts; the boot pass always at INFO."""

from __future__ import annotations

import json
import logging
import time

import pytest
from task_state_guard import Ledger
from task_state_guard.integration import AdapterRuntime, resolve_settings

LOGGER = "tsg-periodic-test"
PREFIX = "task-state-guard: reconcile (periodic_reconcile) "


def _passes(caplog: pytest.LogCaptureFixture) -> list[tuple[int, dict[str, object]]]:
    return [(r.levelno, json.loads(r.getMessage()[len(PREFIX):]))
            for r in caplog.records if r.name == LOGGER and r.getMessage().startswith(PREFIX)]


def _wait(predicate: object, what: str) -> None:
    deadline = time.monotonic() + 30
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_periodic_passes_log_debug_when_unchanged_and_info_with_counts(
    db: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    settings = resolve_settings(db=db, reconcile_interval_seconds=0.2,
                                active_grace_seconds=60)
    runtime = AdapterRuntime(settings, logger=logging.getLogger(LOGGER))
    try:
        boot = runtime.boot_reconcile()
        assert boot is not None and not boot["tasks_timed_out"]
        booted = [r for r in caplog.records if "reconcile (boot_reconcile)" in r.getMessage()]
        assert [r.levelno for r in booted] == [logging.INFO]
        assert runtime.start_periodic_reconcile()
        _wait(lambda: len(_passes(caplog)) >= 2, "two periodic passes")
        quiet = _passes(caplog)
        assert quiet and all(level == logging.DEBUG for level, _ in quiet)
        assert all(not report["tasks_timed_out"] for _, report in quiet)

        with Ledger(db) as ledger:  # work whose deadline has passed: the next pass
            task = ledger.create_task(timeout_seconds=0)  # closes it
            ledger.start_task(task.id, owner=False)
        _wait(lambda: any(level == logging.INFO for level, _ in _passes(caplog)), "a change")
        changed = [report for level, report in _passes(caplog) if level == logging.INFO]
        assert len(changed) == 1 and changed[0]["tasks_timed_out"] == 1
        _wait(lambda: _passes(caplog)[-1][0] == logging.DEBUG, "a quiet pass after it")
    finally:
        runtime.stop_periodic_reconcile()
        runtime.close()
