"""SIGKILL mid-node, then guard(...) in a new process and recover()."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.graph import START, StateGraph
from langgraph.types import interrupt
from lg_crash_graph import build, builder
from lg_helpers import State, assert_healthy, shape, tree
from task_state_guard import Ledger
from task_state_guard_langgraph import Recovery, guard, recovery_invocation_id

HERE = Path(__file__).parent


def _kill_mid_node(work: Path, db: str, thread_id: str, invocation_id: str, *extra: str) -> None:
    marker = work / "marker"
    child = subprocess.Popen(
        [
            sys.executable,
            str(HERE / "lg_crash_graph.py"),
            db,
            str(work / "checkpoints.sqlite"),
            str(marker),
            thread_id,
            invocation_id,
            *extra,
        ],
        cwd=str(HERE),
    )
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert child.poll() is None, "child exited early"
            assert time.monotonic() < deadline, "child never reached the slow node"
            time.sleep(0.02)
        with Ledger(db) as ledger:  # the child is inside `slow`: both records are running
            inv = ledger.get_task(guard_id(invocation_id))
            assert str(inv.status) == "running"
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.wait(30)
    assert child.returncode == -signal.SIGKILL


def guard_id(invocation_id: str) -> str:
    from task_state_guard_langgraph import logical_task_id

    return logical_task_id(invocation_id)


def test_sigkill_mid_node_then_recover(work: Path, db: str, apps: list[Any]) -> None:
    _kill_mid_node(work, db, "crash-thread", "crash-1")

    # A new process (this one) starts the guard: reconcile closes the dead owner's tasks at once,
    # with the default 600 s active grace.
    app = guard(build(str(work / "checkpoints.sqlite"), None), db=db, strict=True)
    apps.append(app)
    # The node attempts were history still buffered in the dead process (no heartbeat came):
    # only the invocation was recorded, and is lost.
    assert app.last_reconcile is not None
    assert app.last_reconcile["tasks_timed_out"] == 1
    lost = tree(app.ledger, app.logical_task_id("crash-1"))
    assert shape(lost) == ("crashy", "timed_out", "owner_lost", ())
    assert_healthy(app.ledger)

    # Two processes' guards recover at once: exactly one resumes the thread.
    other = guard(build(str(work / "checkpoints.sqlite"), None), db=db, strict=True)
    apps.append(other)
    found: list[list[Recovery]] = []
    barrier = threading.Barrier(2)

    def recover(target: Any) -> None:
        barrier.wait(10)
        found.append(target.recover(durability="sync"))

    threads = [threading.Thread(target=recover, args=(a,)) for a in (app, other)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    results = [r for batch in found for r in batch]
    new_id = recovery_invocation_id("crash-1")
    assert results == [Recovery("crash-thread", new_id, "crash-1", "succeeded", None)]
    state = app.get_state({"configurable": {"thread_id": "crash-thread"}})
    assert state.values["log"] == ["prepare", "slow", "finish"]
    assert not state.next
    lost = tree(app.ledger, app.logical_task_id("crash-1"))
    # Recovery wrote the lost run's node attempts from its checkpoints: the node that had
    # finished, and the node that was running, lost with its run.
    # (the node attempts apart from the recovery run, whichever was written first)
    nodes = tuple(shape(c) for c in lost["children"] if not c["delivery_required"])
    assert nodes == (
        ("prepare", "succeeded", "worker_completed", ()),
        ("slow", "timed_out", "owner_lost", ()),
    )
    recovered = [c for c in lost["children"] if c["delivery_required"]]
    assert [c["id"] for c in recovered] == [app.logical_task_id(new_id)]
    # Only the unfinished node re-ran (a new attempt), then the rest of the graph.
    assert shape(recovered[0]) == (
        "crashy",
        "succeeded",
        "completed",
        (
            ("slow", "succeeded", "worker_completed", ()),
            ("finish", "succeeded", "worker_completed", ()),
        ),
    )
    assert recovered[0]["delivery"] == "pending"
    assert app.mark_delivered(new_id)
    # Idempotent: nothing left to recover.
    assert app.recover() == []
    assert_healthy(app.ledger)


def test_recover_leaves_other_threads_alone(
    work: Path, db: str, saver: Any, apps: list[Any]
) -> None:
    release = threading.Event()
    entered = threading.Event()

    def step(state: State) -> dict[str, Any]:
        if state.get("answer") == "block":
            entered.set()
            release.wait(30)
        if state.get("answer") == "fail":
            raise ValueError("failed thread")
        if state.get("answer") == "ask":
            interrupt("?")
        return {"log": ["step"]}

    builder = StateGraph(State)
    builder.add_node("step", step)
    builder.add_edge(START, "step")
    app = guard(builder.compile(checkpointer=saver), db=db, strict=True)
    apps.append(app)
    app.invoke({"answer": "done"}, {"configurable": {"thread_id": "done"}})
    app.invoke({"answer": "ask"}, {"configurable": {"thread_id": "ask"}})
    with contextlib.suppress(ValueError):
        app.invoke({"answer": "fail"}, {"configurable": {"thread_id": "fail"}})
    # A thread that is being run right now by a live process (this one).
    runner = threading.Thread(
        target=app.invoke, args=({"answer": "block"}, {"configurable": {"thread_id": "live"}})
    )
    runner.start()
    try:
        assert entered.wait(10)
        other = guard(builder.compile(checkpointer=saver), db=db, strict=True)
        apps.append(other)
        assert other.recover() == []
        assert other.last_reconcile is not None
        assert other.last_reconcile["tasks_timed_out"] == 0
    finally:
        release.set()
        runner.join(10)
    assert_healthy(app.ledger)


def test_sigkill_mid_async_node_then_arecover(work: Path, db: str, apps: list[Any]) -> None:
    _kill_mid_node(work, db, "async-thread", "crash-a", "async")

    async def main() -> list[Recovery]:
        async with AsyncSqliteSaver.from_conn_string(str(work / "checkpoints.sqlite")) as saver:
            graph = builder(None, use_async=True).compile(checkpointer=saver, name="crashy")
            app = guard(graph, db=db, strict=True)
            apps.append(app)
            lost = tree(app.ledger, app.logical_task_id("crash-a"))
            assert shape(lost) == ("crashy", "timed_out", "owner_lost", ())
            found = await app.arecover(durability="sync")
            lost = tree(app.ledger, app.logical_task_id("crash-a"))
            assert shape(lost)[3][:2] == (
                ("prepare", "succeeded", "worker_completed", ()),
                ("slow", "timed_out", "owner_lost", ()),
            )
            return found

    results = asyncio.run(main())
    new_id = recovery_invocation_id("crash-a")
    assert results == [Recovery("async-thread", new_id, "crash-a", "succeeded", None)]
    app = apps[0]
    recovered = tree(app.ledger, app.logical_task_id(new_id))
    assert recovered["id"] in [
        c["id"] for c in tree(app.ledger, app.logical_task_id("crash-a"))["children"]
    ]
    assert shape(recovered) == (
        "crashy",
        "succeeded",
        "completed",
        (
            ("slow", "succeeded", "worker_completed", ()),
            ("finish", "succeeded", "worker_completed", ()),
        ),
    )
    assert_healthy(app.ledger)
