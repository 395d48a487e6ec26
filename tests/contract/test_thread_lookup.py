"""A LangGraph thread's runs are found by the thread id an invocation was recorded with, on
both backends: ``Ledger.find_task_ids``/``list_tasks`` with ``thread_id``, ``tsg tasks
--thread`` and ``tsg get --langgraph THREAD``; the lost-run verdict of a run carries its
thread. A thread id that cannot be stored is refused and changes nothing."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import pytest
from task_state_guard import InvalidInput, Ledger, TaskNotFound
from task_state_guard.integration import job_task_id

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "core"))
from core_helpers import assert_cli_error, assert_json_line, run_cli

# A thread id as applications write them: a business key with a space, a slash, non-ASCII.
THREAD = "conversation 7/Zoë"


def _run(ledger: Ledger, thread: str | None, parent: str | None = None) -> str:
    """An invocation as the LangGraph adapter records it (created running, owing a delivery)."""
    run = str(uuid.uuid4())
    ledger.begin_attempt(run, name="agent", delivery_required=True, framework="langgraph",
                         logical_owner=True, attempt=False, parent_id=parent, thread_id=thread)
    return run


def test_a_threads_runs_are_found_by_its_id(db: str) -> None:
    with Ledger(db) as ledger:
        first = _run(ledger, THREAD)
        _run(ledger, "another thread")
        _run(ledger, None)
        second = _run(ledger, THREAD, parent=first)  # a continuation of the thread
        ledger.close_task(first, "succeeded", code="completed")
        assert ledger.find_task_ids(None, thread_id=THREAD) == [first, second]
        assert ledger.find_task_ids("running", thread_id=THREAD) == [second]
        assert ledger.find_task_ids(None, thread_id="no such thread") == []
        listed = ledger.list_tasks(thread_id=THREAD).tasks  # any state
        assert [item.task.id for item in listed] == [first, second]
    ids = assert_json_line(run_cli("--db", db, "tasks", "--thread", THREAD))
    assert ids == {"ok": True, "task_ids": [first, second]}
    rows = assert_json_line(run_cli("--db", db, "tasks", "--thread", THREAD, "--details"))
    assert [row["id"] for row in rows["tasks"]] == [first, second]
    # `get --langgraph` names an invocation, else a thread: its latest run and all of them.
    got = assert_json_line(run_cli("--db", db, "get", "--langgraph", THREAD))
    assert got["task"]["id"] == second and got["thread_runs"] == [first, second]
    by_ledger_id = assert_json_line(run_cli("--db", db, "get", second))
    assert got["task"] == by_ledger_id["task"]


def test_an_invocation_id_wins_over_a_thread_of_the_same_name(db: str) -> None:
    with Ledger(db) as ledger:
        _run(ledger, "shared")
        named = job_task_id("langgraph", "shared")
        ledger.begin_attempt(named, name="agent", delivery_required=True, framework="langgraph",
                             logical_owner=True, attempt=False)
    got = assert_json_line(run_cli("--db", db, "get", "--langgraph", "shared"))
    assert got["task"]["id"] == named and "thread_runs" not in got
    missing = run_cli("--db", db, "get", "--langgraph", "nobody")
    assert_cli_error(missing, "TaskNotFound")


def test_a_lost_runs_verdict_carries_its_thread(db: str) -> None:
    with Ledger(db) as ledger:
        run = _run(ledger, THREAD)
        plain = _run(ledger, None)
        for task_id in (run, plain):
            ledger.close_task(task_id, "timed_out", code="owner_lost")
        threads = {v.task_id: v.thread_id for v in ledger.claim_verdicts("langgraph")}
        assert threads == {run: THREAD, plain: None}


@pytest.mark.parametrize("bad", ["", "x" * 257, "line\nbreak", "tab\there"])
def test_a_thread_id_that_cannot_be_stored_is_refused(db: str, bad: str) -> None:
    with Ledger(db) as ledger:
        with pytest.raises(InvalidInput):
            _run(ledger, bad)
        with pytest.raises(InvalidInput):
            ledger.find_task_ids(None, thread_id=bad)
        with pytest.raises(InvalidInput):  # neither a state nor a thread
            ledger.find_task_ids(None)
        assert ledger.list_tasks(status="running").tasks == []  # nothing was recorded
        with pytest.raises(TaskNotFound):
            ledger.get_task(job_task_id("langgraph", "x"))
    if bad:
        assert_cli_error(run_cli("--db", db, "tasks", "--thread", bad), "InvalidInput")
