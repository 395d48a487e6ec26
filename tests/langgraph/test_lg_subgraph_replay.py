"""A run SIGKILLed inside a subgraph, or after one: recovery writes the attempts inside it
from the subgraph's checkpoints, nested under the attempt of the node that runs it as the live
run nests them. Real child processes (``lg_subgraph_graph.py``), on SQLite and on PostgreSQL
(ledger and checkpointer); recovery runs in this process."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from lg_crash_graph import asaver_at, saver_at
from lg_helpers import assert_healthy, shape, tree
from lg_procs import Stores, sigkill, start_child, wait_marker
from lg_subgraph_graph import builder
from task_state_guard import Ledger, TaskNotFound
from task_state_guard_langgraph import (
    GuardedGraph,
    Recovery,
    guard,
    logical_task_id,
    recovery_invocation_id,
)

OK = ("succeeded", "worker_completed", ())
LOST = ("timed_out", "owner_lost")
SCRIPT = "lg_subgraph_graph.py"
#: The lost run as recovery leaves it: the node that ran the subgraph lost, under it the
#: inner node that finished and the one that was running, lost with the run; then the
#: recovery run, which resumed the subgraph at the inner node that was running.
RECOVERED = (
    "outer", *LOST, (
        ("prepare", *OK),
        ("research", *LOST, (("gather", *OK), ("digest", *LOST, ()))),
        ("outer", "succeeded", "completed", (
            ("research", "succeeded", "worker_completed", (("digest", *OK),)),
            ("finish", *OK),
        )),
    ),
)
#: The same with ``digest`` inside ``deep``, a subgraph inside ``research``.
RECOVERED_NESTED = (
    "outer", *LOST, (
        ("prepare", *OK),
        ("research", *LOST, (("gather", *OK), ("deep", *LOST, (("digest", *LOST, ()),)))),
        ("outer", "succeeded", "completed", (
            ("research", "succeeded", "worker_completed", (
                ("deep", "succeeded", "worker_completed", (("digest", *OK),)),
            )),
            ("finish", *OK),
        )),
    ),
)
#: A run killed in the node after the subgraph's: the subgraph's node and the attempts inside
#: it finished (none of them committed by the live run), the node after it lost.
RECOVERED_LATE = (
    "outer", *LOST, (
        ("prepare", *OK),
        ("research", "succeeded", "worker_completed", (("gather", *OK), ("digest", *OK))),
        ("finish_slow", *LOST, ()),
        ("outer", "succeeded", "completed", (("finish_slow", *OK),)),
    ),
)


def _kill_blocked(stores: Stores, thread: str, inv: str, mode: str = "") -> None:
    child, marker = start_child(stores, thread, inv, mode, script=SCRIPT)
    try:
        wait_marker(child, marker)
        with Ledger(stores.db) as ledger:
            assert str(ledger.get_task(logical_task_id(inv)).status) == "running"
    finally:
        sigkill(child)


def _check_recovered(app: GuardedGraph, thread: str, inv: str, expected: Any = RECOVERED) -> None:
    assert shape(tree(app.ledger, logical_task_id(inv))) == expected
    state = app.get_state({"configurable": {"thread_id": thread}})
    assert not state.next
    assert state.values["log"] == ["prepare", "finish"]
    if expected != RECOVERED_NESTED:  # (a nested subgraph's output repeats its input's notes)
        assert state.values["notes"] == ["gather", "digest"]
    assert app.mark_delivered(recovery_invocation_id(inv))
    assert app.stats()["errors"] == {}
    assert_healthy(app.ledger)


@pytest.mark.parametrize("mode", ["sync", "async", "nested"])
def test_a_node_lost_inside_a_subgraph_is_written_under_its_outer_node(
    stores: Stores, mode: str
) -> None:
    inv = f"sub-{mode}"
    _kill_blocked(stores, "t-sub", inv, "" if mode == "sync" else mode)
    expected = [Recovery("t-sub", recovery_invocation_id(inv), inv, "succeeded", None)]

    if mode != "async":
        nested = mode == "nested"
        recovered = RECOVERED_NESTED if nested else RECOVERED
        with saver_at(stores.checkpoints) as saver:
            graph = builder(None, nested=nested).compile(checkpointer=saver, name="outer")
            app = guard(graph, db=stores.db, strict=True)
            try:
                # Nothing of the node history was committed (no heartbeat came).
                assert shape(tree(app.ledger, logical_task_id(inv))) == ("outer", *LOST, ())
                assert app.recover(durability="sync") == expected
                _check_recovered(app, "t-sub", inv, recovered)
                assert app.recover() == []  # nothing written twice by a second pass
                assert shape(tree(app.ledger, logical_task_id(inv))) == recovered
            finally:
                app.close()
        return

    async def main() -> None:
        async with asaver_at(stores.checkpoints) as saver:
            graph = builder(None, use_async=True).compile(checkpointer=saver, name="outer")
            app = guard(graph, db=stores.db, strict=True)
            try:
                assert shape(tree(app.ledger, logical_task_id(inv))) == ("outer", *LOST, ())
                assert await app.arecover(durability="sync") == expected
                assert shape(tree(app.ledger, logical_task_id(inv))) == RECOVERED
                state = await app.aget_state({"configurable": {"thread_id": "t-sub"}})
                assert state.values["notes"] == ["gather", "digest"]
                assert app.mark_delivered(recovery_invocation_id(inv))
                assert await app.arecover() == []
                assert shape(tree(app.ledger, logical_task_id(inv))) == RECOVERED
                assert app.stats()["errors"] == {}
                assert_healthy(app.ledger)
            finally:
                app.close()

    asyncio.run(main())


def _running_inner(db: str, inv: str) -> str | None:
    """The id of ``digest``'s attempt once a heartbeat committed it running (under
    ``research``'s)."""
    try:
        with Ledger(db) as ledger:
            run = tree(ledger, logical_task_id(inv))
    except TaskNotFound:
        return None
    for outer in run["children"]:
        for inner in outer["children"]:
            if (outer["name"], inner["name"], inner["status"]) == ("research", "digest", "running"):
                return str(inner["id"])
    return None


def test_an_inner_attempt_a_heartbeat_committed_is_written_once(
    stores: Stores, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TSG_HEARTBEAT_SECONDS", "0.2")
    child, marker = start_child(stores, "t-flushed", "sub-flushed", script=SCRIPT)
    monkeypatch.delenv("TSG_HEARTBEAT_SECONDS")
    try:
        wait_marker(child, marker)
        deadline = time.monotonic() + 60
        while (digest := _running_inner(stores.db, "sub-flushed")) is None:
            assert child.poll() is None, "the child exited early"
            assert time.monotonic() < deadline, "the inner attempt was never committed"
            time.sleep(0.05)
    finally:
        sigkill(child)

    with saver_at(stores.checkpoints) as saver:
        app = guard(builder(None).compile(checkpointer=saver, name="outer"), db=stores.db,
                    strict=True)
        try:
            # The reconcile closed what the heartbeat had written running: the invocation,
            # the node running the subgraph and the inner node.
            assert app.last_reconcile is not None
            assert app.last_reconcile["tasks_timed_out"] == 3
            before = tree(app.ledger, logical_task_id("sub-flushed"))
            assert shape(before) == ("outer", *LOST, (
                ("prepare", *OK),
                ("research", *LOST, (("gather", *OK), ("digest", *LOST, ()))),
            ))
            report = app.recover(durability="sync")
            assert report == [Recovery("t-flushed", recovery_invocation_id("sub-flushed"),
                                       "sub-flushed", "succeeded", None)]
            after = tree(app.ledger, logical_task_id("sub-flushed"))
            # The same records: the replay found the ids the live run gave them.
            assert after["children"][:2] == before["children"]
            assert after["children"][1]["children"][1]["id"] == digest
            _check_recovered(app, "t-flushed", "sub-flushed")
        finally:
            app.close()



@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_subgraph_node_finished_before_the_crash_gets_its_inner_attempts(
    stores: Stores, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    inv = f"late-{mode}"
    # No heartbeat tick before the kill: the finished attempts die in the buffer.
    monkeypatch.setenv("TSG_HEARTBEAT_SECONDS", "300")
    _kill_blocked(stores, "t-late", inv, "late" if mode == "sync" else "async-late")
    monkeypatch.delenv("TSG_HEARTBEAT_SECONDS")
    expected = [Recovery("t-late", recovery_invocation_id(inv), inv, "succeeded", None)]

    if mode == "sync":
        with saver_at(stores.checkpoints) as saver:
            graph = builder(None, late=True).compile(checkpointer=saver, name="outer")
            app = guard(graph, db=stores.db, strict=True)
            try:
                assert shape(tree(app.ledger, logical_task_id(inv))) == ("outer", *LOST, ())
                assert app.recover(durability="sync") == expected
                _check_recovered(app, "t-late", inv, RECOVERED_LATE)
                assert app.recover() == []
                assert shape(tree(app.ledger, logical_task_id(inv))) == RECOVERED_LATE
            finally:
                app.close()
        return

    async def main() -> None:
        async with asaver_at(stores.checkpoints) as saver:
            graph = builder(None, use_async=True, late=True).compile(
                checkpointer=saver, name="outer")
            app = guard(graph, db=stores.db, strict=True)
            try:
                assert shape(tree(app.ledger, logical_task_id(inv))) == ("outer", *LOST, ())
                assert await app.arecover(durability="sync") == expected
                assert shape(tree(app.ledger, logical_task_id(inv))) == RECOVERED_LATE
                state = await app.aget_state({"configurable": {"thread_id": "t-late"}})
                assert state.values == {"log": ["prepare", "finish"],
                                        "notes": ["gather", "digest"]}
                assert app.mark_delivered(recovery_invocation_id(inv))
                assert await app.arecover() == []
                assert shape(tree(app.ledger, logical_task_id(inv))) == RECOVERED_LATE
                assert app.stats()["errors"] == {}
                assert_healthy(app.ledger)
            finally:
                app.close()

    asyncio.run(main())
