"""What a person calls a task is one rule everywhere: a root, or a child that owes its own
delivery (a LangGraph resume or recovery run), is a ``task``; a child that owes nobody a
delivery is an ``attempt``. Status, metrics and the outcome totals (written by the database in
the statement of each close: a plain close, and a reconcile pass, set-based on PostgreSQL) all
count so; an upgraded ledger keeps what it counted before."""

from __future__ import annotations

import pytest
from core_helpers import Clock, as_v5, raw_execute
from task_state_guard import Ledger, ReconcilePolicy


def _closed(report: dict, kind: str, state: str, code: str) -> int:
    return int(report["outcomes_total"][kind][state].get(code, 0))


def test_a_child_owing_its_own_delivery_is_a_task(ledger: Ledger, clock: Clock) -> None:
    invocation = ledger.create_task(name="agent")
    ledger.start_task(invocation.id, owner=False)
    ledger.close_task(invocation.id, "succeeded", code="completed")
    resume = ledger.create_task(parent_id=invocation.id, name="agent")  # owes its answer
    node = ledger.create_task(parent_id=resume.id, delivery_required=False, name="node")
    for task in (resume, node):
        ledger.start_task(task.id, owner=False)
    status = ledger.status()
    assert status["tasks_by_kind"]["task"]["running"] == 1  # the resume run
    assert status["tasks_by_kind"]["attempt"]["running"] == 1  # its node
    assert status["by_name"]["agent"]["running"] == 1 and "node" in status["attempts_by_name"]
    # a plain close of the node, a reconcile's close of the resume run
    ledger.close_task_settled(node.id, "succeeded", code="worker_completed")
    clock.advance(10_000)
    ledger.reconcile(ReconcilePolicy(active_grace_seconds=60, delivery_grace_seconds=600))
    status = ledger.status()
    assert _closed(status, "task", "timed_out", "restart_stale") == 1
    assert _closed(status, "attempt", "timed_out", "restart_stale") == 0
    assert _closed(status, "task", "succeeded", "completed") == 1
    assert _closed(status, "attempt", "succeeded", "worker_completed") == 1
    assert ledger.doctor()["healthy"] is True


@pytest.mark.sqlite_only(reason="a SQLite file taken back to an earlier layout")
def test_an_upgraded_ledger_keeps_its_counts_and_counts_on_by_the_rule(tmp_path) -> None:
    db = str(tmp_path / "d" / "tasks.sqlite")
    with Ledger(db) as ledger:
        root = ledger.create_task(name="agent")
        ledger.start_task(root.id, owner=False)
        ledger.close_task(root.id, "succeeded", code="completed")
        before = ledger.create_task(parent_id=root.id, name="agent")
        ledger.start_task(before.id, owner=False)
        after = ledger.create_task(parent_id=root.id, name="agent")
        ledger.start_task(after.id, owner=False)
    as_v5(db)  # the previous layout, whose trigger counted every child as an attempt
    raw_execute(db, "UPDATE tsg_tasks SET status = 'succeeded', terminal_code = 'completed', "
                    f"ended_at = updated_at, version = version + 1 WHERE id = '{before.id}'")
    with Ledger(db, read_only=True) as ro:
        assert ro.schema_version == 5
        assert _closed(ro.status(), "attempt", "succeeded", "completed") == 1
    with Ledger(db) as ledger:  # the writable open migrates; a counter never goes down
        assert ledger.schema_version == 9
        ledger.close_task(after.id, "succeeded", code="completed")
        status = ledger.status()
        assert _closed(status, "attempt", "succeeded", "completed") == 1  # counted before
        assert _closed(status, "task", "succeeded", "completed") == 2  # the root, then after
        assert status["tasks_by_kind"]["task"]["succeeded"] == 3
        assert ledger.doctor()["healthy"] is True


def test_the_readme_states_each_backends_layout_once_and_rightly() -> None:
    """The one schema story: the README's "Schema versions" states the layout each backend
    writes, equal to the code; no other document states a current version number."""
    import re
    from pathlib import Path

    from task_state_guard.sqlite import schema
    from task_state_guard_postgres import SCHEMA_VERSION as POSTGRES

    repo = Path(__file__).resolve().parents[2]
    readme = (repo / "README.md").read_text()
    assert f"**SQLite layout {schema.SCHEMA_VERSION}\nand PostgreSQL layout {POSTGRES}**" in readme
    docs = [repo / "README.md", *(repo / "docs").glob("*.md"),
            *(repo / "packages").glob("*/README.md")]
    stale = re.compile(r"(current schema is v?\d|SCHEMA_VERSION` is \d|SCHEMA_VERSION` is the "
                       r"schema version this release writes \(\d|schema is v\d)")
    for doc in docs:
        assert not stale.search(doc.read_text()), doc
