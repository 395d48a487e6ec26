"""A long node (3x the active grace) with periodic reconcile elsewhere stays running."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from langgraph.graph import START, StateGraph
from lg_helpers import State, assert_healthy, shape, tree
from task_state_guard import Ledger
from task_state_guard_langgraph import guard, heartbeat

GRACE = 1.0  # heartbeats every 0.1 s: ten missed beats before anything is stale
LONG = 3 * GRACE


_RECONCILER = """
import json, sys
from task_state_guard import Ledger, ReconcilePolicy
db, grace = sys.argv[1], float(sys.argv[2])
policy = ReconcilePolicy(active_grace_seconds=grace, delivery_grace_seconds=3600)
with Ledger(db) as ledger:
    print("ready", flush=True)
    while sys.stdin.readline():  # one reconcile pass per line; EOF stops
        print(json.dumps(ledger.reconcile(policy)), flush=True)
"""


@contextmanager
def reconciling_elsewhere(db: str) -> Iterator[list[dict[str, Any]]]:
    """Another process reconciles the same ledger every 0.1 s with a short active grace."""
    reports: list[dict[str, Any]] = []
    proc = subprocess.Popen(
        [sys.executable, "-c", _RECONCILER, db, str(GRACE)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdin is not None and proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    stop = threading.Event()

    def drive() -> None:
        assert proc.stdin is not None and proc.stdout is not None
        while not stop.is_set():
            proc.stdin.write("go\n")
            proc.stdin.flush()
            reports.append(json.loads(proc.stdout.readline()))
            stop.wait(0.1)

    thread = threading.Thread(target=drive, daemon=True)
    thread.start()
    try:
        yield reports
    finally:
        stop.set()
        thread.join(10)
        proc.stdin.close()
        assert proc.wait(10) == 0


def _graph(body: Any) -> Any:
    builder = StateGraph(State)
    builder.add_node("long", body)
    builder.add_edge(START, "long")
    return builder


def test_long_node_stays_running_with_background_heartbeats(
    db: str, saver: Any, apps: list[Any]
) -> None:
    seen: list[str] = []

    def long(state: State) -> dict[str, Any]:
        end = time.monotonic() + LONG
        with Ledger(db) as reader:
            while time.monotonic() < end:
                time.sleep(0.15)
                inv = reader.get_task(app.logical_task_id("long-1"))
                seen.append(str(inv.status))
        return {"log": ["long"]}

    app = guard(
        _graph(long).compile(checkpointer=saver),
        db=db,
        strict=True,
        heartbeat_seconds=0.1,
        active_grace_seconds=GRACE,
    )
    apps.append(app)
    with reconciling_elsewhere(db) as reports:
        app.invoke({"log": []}, {"configurable": {"thread_id": "hb"}}, invocation_id="long-1")
    assert len(reports) >= 10
    assert sum(r["tasks_timed_out"] for r in reports) == 0
    assert set(seen) == {"running"}
    assert shape(tree(app.ledger, app.logical_task_id("long-1"))) == (
        "LangGraph",
        "succeeded",
        "completed",
        (("long", "succeeded", "worker_completed", ()),),
    )
    assert_healthy(app.ledger)


def test_heartbeat_helper_keeps_a_long_node_fresh(db: str, saver: Any, apps: list[Any]) -> None:
    beats: list[bool] = []

    def long(state: State) -> dict[str, Any]:
        end = time.monotonic() + LONG
        while time.monotonic() < end:
            time.sleep(0.1)
            beats.append(heartbeat())
        return {"log": ["long"]}

    # No background heartbeater: only the node's own heartbeat() calls keep it fresh.
    app = guard(
        _graph(long).compile(checkpointer=saver),
        db=db,
        strict=True,
        heartbeat_seconds=0,
        active_grace_seconds=GRACE,
    )
    apps.append(app)
    with reconciling_elsewhere(db) as reports:
        app.invoke({"log": []}, {"configurable": {"thread_id": "hh"}}, invocation_id="long-2")
    assert beats and all(beats)
    assert sum(r["tasks_timed_out"] for r in reports) == 0
    root = tree(app.ledger, app.logical_task_id("long-2"))
    assert (root["status"], root["children"][0]["status"]) == ("succeeded", "succeeded")
    assert heartbeat() is False  # outside a graph: no-op
    assert_healthy(app.ledger)


def test_without_heartbeats_a_late_completion_is_a_rejected_conflict(
    db: str, saver: Any, apps: list[Any]
) -> None:
    def long(state: State) -> dict[str, Any]:
        time.sleep(LONG)
        return {"log": ["long"]}

    app = guard(
        _graph(long).compile(checkpointer=saver),
        db=db,
        heartbeat_seconds=0,
        active_grace_seconds=GRACE,
    )
    apps.append(app)
    with reconciling_elsewhere(db):
        out = app.invoke({"log": []}, {"configurable": {"thread_id": "nh"}}, invocation_id="nh")
    assert out["log"] == ["long"]  # the graph itself is unaffected
    # The stale invocation was timed out elsewhere; the late completion does not rewrite it.
    # Its node attempt was history still buffered: recorded as it ended, under it.
    assert shape(tree(app.ledger, app.logical_task_id("nh"))) == (
        "LangGraph",
        "timed_out",
        "restart_stale",
        (("long", "succeeded", "worker_completed", ()),),
    )
    assert app.stats()["conflicts"] == {"logical_close": 1}
    assert app.stats()["errors"] == {}
    assert_healthy(app.ledger)


def test_open_tasks_are_beaten_and_forgotten_after_close_and_fork(db: str) -> None:
    from task_state_guard.integration import AdapterRuntime, resolve_settings
    from task_state_guard_langgraph._recorder import Recorder

    task = "6f0c3b8e-4a57-5d7e-9a51-000000000001"
    with Ledger(db) as ledger:
        settings = resolve_settings(db_required=False, strict=True, heartbeat_seconds=0.05)
        runtime = AdapterRuntime(settings, logger=logging.getLogger("t"), ledger=ledger)
        rec = Recorder(runtime)
        try:
            assert rec.open(task, parent_id=None, name="inv")
            deadline = time.monotonic() + 10
            while ledger.get_task(task).heartbeat_at is None:  # the heartbeat thread beat it
                assert time.monotonic() < deadline
                time.sleep(0.02)
            pid = os.fork()
            if pid == 0:  # a forked child does not beat its parent's tasks
                os._exit(0 if runtime.stats()["heartbeating"] == 0 else 1)
            _, status = os.waitpid(pid, 0)
            assert os.waitstatus_to_exitcode(status) == 0
            assert runtime.held(task) and runtime.stats()["heartbeating"] == 1
            rec.close_many(((task, "succeeded", "completed", False),))
            assert runtime.stats()["heartbeating"] == 0
            assert str(ledger.get_task(task).status) == "succeeded"
        finally:
            runtime.close()
        assert_healthy(ledger)
