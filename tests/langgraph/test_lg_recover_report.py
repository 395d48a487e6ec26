"""recover() reports which threads it found lost and which it resumed, and fires on_lost
(a real child process SIGKILLed mid-node, then recovery in this process)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from lg_crash_graph import build, builder
from lg_helpers import assert_healthy
from task_state_guard.integration import LostTask
from task_state_guard_langgraph import (
    Recovery,
    RecoveryReport,
    guard,
    logical_task_id,
    recovery_invocation_id,
)
from test_lg_crash_recovery import _kill_mid_node


def test_recover_reports_lost_and_resumed_threads(work: Path, db: str, apps: list[Any]) -> None:
    _kill_mid_node(work, db, "report-thread", "report-1")
    calls: list[LostTask] = []
    app = guard(
        build(str(work / "checkpoints.sqlite"), None), db=db, strict=True, on_lost=calls.append
    )
    apps.append(app)
    # The boot reconcile closed the invocation (its node attempts were history buffered in the
    # dead process); the hook fires when recover() finds the thread.
    assert app.last_reconcile is not None and app.last_reconcile["tasks_timed_out"] == 1
    assert calls == []

    report = app.recover(durability="sync")

    assert isinstance(report, RecoveryReport)
    assert report.lost == ["report-thread"]
    assert report.resumed == ["report-thread"]
    new_id = recovery_invocation_id("report-1")
    assert list(report) == [Recovery("report-thread", new_id, "report-1", "succeeded", None)]
    assert calls == [
        LostTask("report-1", logical_task_id("report-1"), "crashy", "owner_lost", "report-thread")
    ]
    # Nothing is lost any more: an empty report, no further hook call.
    again = app.recover(durability="sync")
    assert again == [] and again.lost == [] and again.resumed == []
    assert len(calls) == 1
    # Each run is recorded with its thread id (an operator finds them by it); aggregates name
    # no id, and no thread.
    assert app.ledger.find_task_ids(None, thread_id="report-thread") == [
        logical_task_id("report-1"), logical_task_id(new_id)]
    for aggregate in (app.ledger.doctor(), app.ledger.status(), app.last_reconcile):
        text = json.dumps(aggregate)
        assert "report-thread" not in text and logical_task_id("report-1") not in text
    assert app.stats()["errors"] == {}
    assert_healthy(app.ledger)


def test_lost_thread_left_out_by_thread_ids_is_neither_reported_nor_resumed(
    work: Path, db: str, apps: list[Any]
) -> None:
    _kill_mid_node(work, db, "skipped-thread", "skipped-1")
    calls: list[LostTask] = []
    app = guard(
        build(str(work / "checkpoints.sqlite"), None), db=db, strict=True, on_lost=calls.append
    )
    apps.append(app)
    report = app.recover(thread_ids=["another-thread"], durability="sync")
    assert report == [] and report.lost == [] and calls == []
    report = app.recover(thread_ids=["skipped-thread"], durability="sync")
    assert report.lost == report.resumed == ["skipped-thread"]
    assert [c.thread_id for c in calls] == ["skipped-thread"]
    assert_healthy(app.ledger)


def test_arecover_reports_and_fires_the_hook(work: Path, db: str, apps: list[Any]) -> None:
    _kill_mid_node(work, db, "async-report", "report-a", "async")
    calls: list[LostTask] = []

    async def main() -> RecoveryReport:
        async with AsyncSqliteSaver.from_conn_string(str(work / "checkpoints.sqlite")) as saver:
            graph = builder(None, use_async=True).compile(checkpointer=saver, name="crashy")
            app = guard(graph, db=db, strict=True, on_lost=calls.append)
            apps.append(app)
            return await app.arecover(durability="sync")

    report = asyncio.run(main())
    assert report.lost == report.resumed == ["async-report"]
    assert calls == [
        LostTask("report-a", logical_task_id("report-a"), "crashy", "owner_lost", "async-report")
    ]
    assert_healthy(apps[0].ledger)
