"""Node attempts are history: committed with the invocation's end, every heartbeat, or a
``heartbeat()`` call; a run lost with its process gets them from its checkpoints."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from langgraph.graph import START, StateGraph
from lg_crash_graph import build
from lg_helpers import State, assert_healthy, shape, tree
from task_state_guard import Ledger
from task_state_guard_langgraph import guard, heartbeat, logical_task_id, recovery_invocation_id

HERE = Path(__file__).parent
OK = ("succeeded", "worker_completed", ())
#: A generous bound on "within one heartbeat" (the heartbeat here is 0.2 s).
BOUND = 30.0


def _attempts(db: str, invocation_id: str) -> list[tuple[str, str, bool]]:
    """The node attempts of the invocation as another connection sees them (committed only)."""
    with Ledger(db) as other:
        children = other.children_of(logical_task_id(invocation_id))
    return [(str(t.name), str(t.status), t.has_owner) for t in children]


def _two_nodes(slow: Any) -> Any:
    builder = StateGraph(State)
    builder.add_node("first", lambda state: {"log": ["first"]})
    builder.add_node("slow", slow)
    builder.add_edge(START, "first")
    builder.add_edge("first", "slow")
    return builder


def test_a_running_node_is_in_the_ledger_within_one_heartbeat(
    db: str, saver: Any, apps: list[Any]
) -> None:
    seen: list[Any] = []

    def slow(state: State) -> dict[str, Any]:
        deadline = time.monotonic() + BOUND
        while time.monotonic() < deadline:
            now = _attempts(db, "live")
            if ("slow", "running", True) in now:
                seen.append(now)
                break
            time.sleep(0.05)
        return {"log": ["slow"]}

    app = guard(
        _two_nodes(slow).compile(checkpointer=saver), db=db, strict=True, heartbeat_seconds=0.2
    )
    apps.append(app)
    app.invoke({"log": []}, {"configurable": {"thread_id": "live"}}, invocation_id="live")
    # While it ran: the finished node closed, the running one owned by this process.
    assert seen == [[("first", "succeeded", False), ("slow", "running", True)]]
    assert shape(tree(app.ledger, logical_task_id("live"))) == (
        "LangGraph",
        "succeeded",
        "completed",
        (("first", *OK), ("slow", *OK)),
    )
    assert app.stats()["errors"] == {} and app.stats()["conflicts"] == {}
    assert_healthy(app.ledger)


def test_heartbeat_helper_commits_the_node_history(db: str, saver: Any, apps: list[Any]) -> None:
    seen: list[Any] = []

    def slow(state: State) -> dict[str, Any]:
        seen.append(_attempts(db, "helper"))  # no background heartbeat: nothing yet
        assert heartbeat()
        seen.append(_attempts(db, "helper"))
        return {"log": ["slow"]}

    app = guard(
        _two_nodes(slow).compile(checkpointer=saver), db=db, strict=True, heartbeat_seconds=0
    )
    apps.append(app)
    app.invoke({"log": []}, {"configurable": {"thread_id": "h"}}, invocation_id="helper")
    assert seen == [[], [("first", "succeeded", False), ("slow", "running", True)]]
    assert shape(tree(app.ledger, logical_task_id("helper")))[3] == (
        ("first", *OK),
        ("slow", *OK),
    )
    assert_healthy(app.ledger)


def _events(ledger: Ledger, task_id: str) -> list[tuple[str, str]]:
    return [(e.kind, e.state) for e in ledger.events_of(task_id)]


def test_history_flushed_then_ended_is_written_once_with_its_events(
    db: str, saver: Any, apps: list[Any]
) -> None:
    """A subgraph's nodes, a ``heartbeat()`` flush inside the graph (first run) or none
    (second run) and the end: every node attempt once, each with its whole event chain, the
    outcome totals counting each once."""
    flush = [True]

    def digest(state: State) -> dict[str, Any]:
        if flush[0]:
            assert heartbeat()  # plan and gather closed, research and digest running
        return {"log": ["digest"]}

    inner = StateGraph(State)
    inner.add_node("gather", lambda state: {"log": ["gather"]})
    inner.add_node("digest", digest)
    inner.add_edge(START, "gather")
    inner.add_edge("gather", "digest")
    outer = StateGraph(State)
    outer.add_node("plan", lambda state: {"log": ["plan"]})
    outer.add_node("research", inner.compile())
    outer.add_node("finish", lambda state: {"log": ["finish"]})
    outer.add_edge(START, "plan")
    outer.add_edge("plan", "research")
    outer.add_edge("research", "finish")
    app = guard(outer.compile(checkpointer=saver), db=db, strict=True, heartbeat_seconds=0)
    apps.append(app)
    before = app.ledger.status()["outcomes_total"]["attempt"]["succeeded"]["worker_completed"]
    for run in ("flushed", "plain"):
        app.invoke({"log": []}, {"configurable": {"thread_id": run}}, invocation_id=run)
        root = logical_task_id(run)
        assert shape(tree(app.ledger, root)) == ("LangGraph", "succeeded", "completed", (
            ("plan", *OK), ("research", "succeeded", "worker_completed", (
                ("gather", *OK), ("digest", *OK))), ("finish", *OK)))
        closed = [("created", "queued"), ("closed", "succeeded"), ("delivery", "not_applicable")]
        started = [closed[0], ("started", "running"), *closed[1:]]
        # Flushed while running: started then closed; written once closed: no start.
        expected = {"plan": closed, "research": started, "gather": closed, "digest": started,
                    "finish": closed}
        if run == "plain":  # all of it written at the end, closed
            expected = dict.fromkeys(expected, closed)
        nodes = tree(app.ledger, root)["children"]
        found = {n["name"]: _events(app.ledger, n["id"]) for n in nodes}
        found.update({n["name"]: _events(app.ledger, n["id"]) for n in nodes[1]["children"]})
        assert found == expected
        flush[0] = False
    after = app.ledger.status()["outcomes_total"]["attempt"]["succeeded"]["worker_completed"]
    assert after - before == 10
    assert app.stats()["errors"] == {} and app.stats()["conflicts"] == {}
    assert_healthy(app.ledger)


def test_a_flushed_running_node_is_lost_once_after_sigkill(
    work: Path, db: str, apps: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed after a heartbeat committed the running node: reconcile closes it with the run
    and recovery, replaying the checkpoints, writes nothing twice (the same attempt ids)."""
    monkeypatch.setenv("TSG_HEARTBEAT_SECONDS", "0.2")
    marker = work / "marker"
    child = subprocess.Popen(
        [
            sys.executable,
            str(HERE / "lg_crash_graph.py"),
            db,
            str(work / "checkpoints.sqlite"),
            str(marker),
            "flushed-thread",
            "flushed-1",
        ],
        cwd=str(HERE),
    )
    try:
        deadline = time.monotonic() + 60
        while not marker.exists() or ("slow", "running", True) not in _safe(db, "flushed-1"):
            assert child.poll() is None, "child exited early"
            assert time.monotonic() < deadline, "the running node was never committed"
            time.sleep(0.05)
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.wait(30)
    monkeypatch.delenv("TSG_HEARTBEAT_SECONDS")

    app = guard(build(str(work / "checkpoints.sqlite"), None), db=db, strict=True)
    apps.append(app)
    assert app.last_reconcile is not None and app.last_reconcile["tasks_timed_out"] == 2
    lost = ("timed_out", "owner_lost", ())
    assert shape(tree(app.ledger, logical_task_id("flushed-1")))[3] == (
        ("prepare", *OK),
        ("slow", *lost),
    )
    report = app.recover(durability="sync")
    assert report.resumed == ["flushed-thread"]
    run = shape(tree(app.ledger, logical_task_id("flushed-1")))
    assert run[:3] == ("crashy", *lost[:2])
    assert run[3] == (
        ("prepare", *OK),
        ("slow", *lost),
        ("crashy", "succeeded", "completed", (("slow", *OK), ("finish", *OK))),
    )
    assert app.mark_delivered(recovery_invocation_id("flushed-1"))
    assert app.stats()["errors"] == {}
    assert_healthy(app.ledger)


def _safe(db: str, invocation_id: str) -> list[tuple[str, str, bool]]:
    try:
        return _attempts(db, invocation_id)
    except Exception:  # the invocation is not recorded yet
        return []
