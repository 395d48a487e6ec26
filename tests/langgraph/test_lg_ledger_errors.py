"""An unwritable ledger never breaks the graph: errors are logged once per kind and counted."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from langgraph.graph import START, StateGraph
from langgraph.types import Command, interrupt
from lg_helpers import State, assert_healthy
from task_state_guard import Ledger, LedgerError, StorageError
from task_state_guard_langgraph import guard


def _graph(saver: Any) -> Any:
    def one(state: State) -> dict[str, Any]:
        return {"log": ["one"]}

    def two(state: State) -> dict[str, Any]:
        return {"log": ["two"]}

    builder = StateGraph(State)
    builder.add_node("one", one)
    builder.add_node("two", two)
    builder.add_edge(START, "one")
    builder.add_edge("one", "two")
    return builder.compile(checkpointer=saver)


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "task_state_guard_langgraph" and r.levelno == logging.WARNING
    ]


def test_read_only_ledger(db: str, saver: Any, caplog: pytest.LogCaptureFixture) -> None:
    Ledger(db).close()  # an existing ledger ...
    ro = Ledger(db, read_only=True)  # ... that this process cannot write
    caplog.set_level(logging.WARNING, logger="task_state_guard_langgraph")
    app = guard(_graph(saver), ledger=ro)
    try:
        for i in range(3):
            out = app.invoke({"log": []}, {"configurable": {"thread_id": f"ro{i}"}})
            assert out["log"] == ["one", "two"]
        with pytest.raises(StorageError):  # the application's own write raises
            app.mark_delivered(app.last_invocation_id or "")
        errors = app.stats()["errors"]
        # Reconcile at start-up, then one failed open per invocation.
        assert errors == {"reconcile:StorageError": 1, "open:StorageError": 3}
        # Logged once per kind, however many times it happened.
        assert sorted(_warnings(caplog)) == sorted(
            f"task-state-guard: ledger error ({kind}, reason read_only_ledger); the graph runs on. "
            "Further errors of this kind are counted, not logged."
            for kind in errors
        )
    finally:
        app.close()
        ro.close()
    with Ledger(db) as ledger:
        assert sum(ledger.status()["tasks"].values()) == 0  # nothing half-written
        assert_healthy(ledger)


def test_ledger_path_that_cannot_be_opened(work: Path, saver: Any) -> None:
    blocker = work / "not-a-dir"
    blocker.write_text("")
    app = guard(_graph(saver), db=str(blocker / "tasks.sqlite"))
    try:
        assert app.ledger is None
        out = app.invoke({"log": []}, {"configurable": {"thread_id": "x"}}, invocation_id="x")
        assert out["log"] == ["one", "two"]
        out = app.invoke({"log": []}, {"configurable": {"thread_id": "y"}})
        assert out["log"] == ["one", "two"]
        # Each invocation tries to open the ledger (it may become usable), and runs anyway.
        assert app.stats()["errors"] == {"reconcile:StorageError": 1, "open:StorageError": 2}
        assert app.recover() == []
    finally:
        app.close()


def test_interrupts_still_work_without_a_ledger(work: Path, saver: Any) -> None:
    def ask(state: State) -> dict[str, Any]:
        return {"answer": str(interrupt("?"))}

    builder = StateGraph(State)
    builder.add_node("ask", ask)
    builder.add_edge(START, "ask")
    blocker = work / "file"
    blocker.write_text("")
    app = guard(builder.compile(checkpointer=saver), db=str(blocker / "db"))
    try:
        cfg = {"configurable": {"thread_id": "i"}}
        app.invoke({"log": []}, cfg)
        assert app.invoke(Command(resume="ok"), cfg)["answer"] == "ok"
    finally:
        app.close()


def test_strict_mode_raises(db: str, saver: Any) -> None:
    Ledger(db).close()
    ro = Ledger(db, read_only=True)
    try:
        with pytest.raises(LedgerError):
            guard(_graph(saver), ledger=ro, strict=True)
        app = guard(_graph(saver), ledger=ro, strict=True, reconcile_on_boot=False)
        with pytest.raises(LedgerError):
            app.invoke({"log": []}, {"configurable": {"thread_id": "s"}})
        app.close()
    finally:
        ro.close()
