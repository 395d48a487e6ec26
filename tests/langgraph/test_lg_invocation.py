"""Invocation completes; delivery; name labels; privacy; no run_id in checkpoints."""

from __future__ import annotations

import sqlite3
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import ledger_backends
import pytest
from langgraph.graph import END, START, StateGraph
from lg_helpers import State, assert_healthy, shape, tree
from task_state_guard import Ledger, Task
from task_state_guard_langgraph import METADATA_KEY, NAMESPACE, guard

SECRET = "s3cr3t-prompt-value-7f1e"


def _linear(name: str | None = None) -> StateGraph:
    def plan(state: State) -> dict[str, Any]:
        return {"log": ["plan"]}

    def act(state: State) -> dict[str, Any]:
        return {"log": ["act"], "answer": SECRET + "-answer"}

    builder = StateGraph(State)
    builder.add_node("plan", plan)
    builder.add_node("act", act)
    builder.add_edge(START, "plan")
    builder.add_edge("plan", "act")
    builder.add_edge("act", END)
    return builder


def test_invocation_completes(db: str, saver: Any, apps: list[Any]) -> None:
    app = guard(_linear().compile(checkpointer=saver), db=db, strict=True)
    apps.append(app)
    out = app.invoke(
        {"log": [SECRET]}, {"configurable": {"thread_id": "t1"}}, invocation_id="req-1"
    )
    assert out["log"] == [SECRET, "plan", "act"]
    assert app.last_outcome == "succeeded"
    task_id = app.logical_task_id("req-1")
    assert task_id == str(uuid.uuid5(NAMESPACE, "req-1"))
    root = tree(app.ledger, task_id)
    assert root["delivery_required"] is True
    assert root["delivery"] == "pending"
    assert shape(root) == (
        "LangGraph",
        "succeeded",
        "completed",
        (
            ("plan", "succeeded", "worker_completed", ()),
            ("act", "succeeded", "worker_completed", ()),
        ),
    )
    for child in root["children"]:
        assert child["delivery_required"] is False
        assert child["delivery"] == "not_applicable"
    assert_healthy(app.ledger)

    delivered = app.mark_delivered("req-1")
    assert delivered is not None and delivered.delivery_status == "delivered"
    task = app.ledger.get_task(task_id)
    assert (str(task.delivery_status), task.delivery_code) == (
        "delivered",
        "transport_acknowledged",
    )
    assert app.mark_delivered("req-1") == delivered  # idempotent
    assert app.stats()["errors"] == {}
    assert_healthy(app.ledger)


def test_mark_delivery_failed_and_generated_id(db: str, saver: Any, apps: list[Any]) -> None:
    app = guard(_linear().compile(checkpointer=saver), db=db, strict=True)
    apps.append(app)
    app.invoke({"log": []}, {"configurable": {"thread_id": "t2"}})
    generated = app.last_invocation_id
    assert generated
    assert app.mark_delivery_failed(generated) is not None
    task = app.ledger.get_task(app.logical_task_id(generated))
    assert (str(task.status), str(task.delivery_status), task.delivery_code) == (
        "succeeded",
        "failed",
        "transport_failed",
    )
    assert_healthy(app.ledger)


def test_unknown_invocation_delivery_raises_like_the_core(
    db: str, saver: Any, apps: list[Any]
) -> None:
    import pytest
    from task_state_guard import TaskNotFound

    app = guard(_linear().compile(checkpointer=saver), db=db)
    apps.append(app)
    with pytest.raises(TaskNotFound):
        app.mark_delivered("never-ran")
    assert app.stats()["errors"] == {}


def test_names_are_sanitized_labels(db: str, saver: Any, apps: list[Any]) -> None:
    def step(state: State) -> dict[str, Any]:
        return {"log": ["x"]}

    builder = StateGraph(State)
    builder.add_node("résumé step!", step)
    builder.add_edge(START, "résumé step!")
    graph = builder.compile(checkpointer=saver, name="my agent (v2)")
    app = guard(graph, db=db, strict=True)
    apps.append(app)
    app.invoke({"log": []}, {"configurable": {"thread_id": "t3"}}, invocation_id="n1")
    root = tree(app.ledger, app.logical_task_id("n1"))
    assert root["name"] == "my_agent__v2_"
    assert [c["name"] for c in root["children"]] == ["r_sum__step_"]
    assert_healthy(app.ledger)


def test_no_state_values_reach_the_ledger_and_no_run_id_in_checkpoints(
    db: str, saver: Any, work: Path, apps: list[Any]
) -> None:
    app = guard(_linear().compile(checkpointer=saver), db=db, strict=True)
    apps.append(app)
    config = {"configurable": {"thread_id": "t4"}, "metadata": {"caller": "test"}}
    app.invoke({"log": [SECRET]}, config, invocation_id="p1")
    app.close()
    apps.clear()
    assert SECRET.encode() not in ledger_backends.stored_bytes(db)
    # The checkpointer holds the state, but never a run_id; our id is under METADATA_KEY.
    conn = sqlite3.connect(str(work / "checkpoints.sqlite"))
    try:
        rows = conn.execute("SELECT metadata FROM checkpoints").fetchall()
    finally:
        conn.close()
    assert rows
    for (metadata,) in rows:
        text = metadata.decode() if isinstance(metadata, bytes) else str(metadata)
        assert '"run_id"' not in text
        assert f'"{METADATA_KEY}": "p1"' in text or f'"{METADATA_KEY}":"p1"' in text
    # The caller's config is not mutated.
    assert config == {"configurable": {"thread_id": "t4"}, "metadata": {"caller": "test"}}


def test_reused_invocation_id_runs_the_graph_and_counts_a_conflict(
    db: str, saver: Any, apps: list[Any]
) -> None:
    app = guard(_linear().compile(checkpointer=saver), db=db)
    apps.append(app)
    cfg = {"configurable": {"thread_id": "t5"}}
    app.invoke({"log": []}, cfg, invocation_id="dup")
    out = app.invoke({"log": []}, cfg, invocation_id="dup")
    assert out["log"][-2:] == ["plan", "act"]
    assert app.stats()["errors"] == {"open:StateConflict": 1}
    root = tree(app.ledger, app.logical_task_id("dup"))
    assert len(root["children"]) == 2  # the second run was not recorded over the first
    assert_healthy(app.ledger)


def test_record_nodes_false_records_invocations_only(
    db: str, saver: Any, apps: list[Any], monkeypatch: Any
) -> None:
    monkeypatch.setenv("TSG_DB", db)  # configuration from the environment
    app = guard(_linear().compile(checkpointer=saver), strict=True, record_nodes=False)
    apps.append(app)
    app.invoke({"log": []}, {"configurable": {"thread_id": "r"}}, invocation_id="light")
    root = tree(app.ledger, app.logical_task_id("light"))
    assert shape(root) == ("LangGraph", "succeeded", "completed", ())
    assert_healthy(app.ledger)


def test_concurrent_invocations_from_threads(db: str, saver: Any, apps: list[Any]) -> None:
    app = guard(_linear().compile(checkpointer=saver), db=db, strict=True)
    apps.append(app)

    def run(i: int) -> str | None:
        app.invoke({"log": []}, {"configurable": {"thread_id": f"c{i}"}}, invocation_id=f"c{i}")
        return app.last_invocation_id

    with ThreadPoolExecutor(max_workers=4) as pool:
        seen = list(pool.map(run, range(8)))
    assert seen == [f"c{i}" for i in range(8)]  # last_invocation_id is per thread
    for i in range(8):
        assert shape(tree(app.ledger, app.logical_task_id(f"c{i}")))[:3] == (
            "LangGraph",
            "succeeded",
            "completed",
        )
    assert app.stats()["errors"] == {}
    assert_healthy(app.ledger)


class _CountingLedger(Ledger):
    """Counts committed write transactions: each transition outside an ``atomic()`` block is
    one, each outermost ``atomic()`` block is one (public API only)."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.transactions = 0
        self.running_seen: list[str] = []
        self._depth = threading.local()

    def _inside(self) -> bool:
        return bool(getattr(self._depth, "n", 0))

    @contextmanager
    def atomic(self) -> Iterator[Ledger]:
        outer = not self._inside()
        self._depth.n = getattr(self._depth, "n", 0) + 1
        try:
            with super().atomic() as ledger:
                yield ledger
        finally:
            self._depth.n -= 1
        if outer:
            self.transactions += 1

    def _count(self) -> None:
        if not self._inside():
            self.transactions += 1

    def create_task(self, **kwargs: Any) -> Task:
        self._count()
        return super().create_task(**kwargs)

    def start_task(self, task_id: Any, **kwargs: Any) -> Task:
        self._count()
        return super().start_task(task_id, **kwargs)

    def begin_attempt(self, logical_id: Any, **kwargs: Any) -> str:
        self._count()
        return super().begin_attempt(logical_id, **kwargs)

    def end_attempt(self, closes: Any, **kwargs: Any) -> Any:
        self._count()
        return super().end_attempt(closes, **kwargs)

    def end_and_begin_attempt(self, closes: Any, logical_id: Any, **kwargs: Any) -> Any:
        self._count()
        return super().end_and_begin_attempt(closes, logical_id, **kwargs)

    def close_task(self, task_id: Any, status: str, *, code: str | None = None) -> Task:
        self._count()
        return super().close_task(task_id, status, code=code)

    def set_delivery(self, task_id: Any, status: str, *, code: str | None = None) -> Task:
        self._count()
        return super().set_delivery(task_id, status, code=code)


@pytest.mark.postgresql_only
def test_statements_per_invocation_on_postgresql(
    db: str, saver: Any, apps: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """On PostgreSQL the invocation's start is one statement (create and start) and its end
    one transaction: the node history (the attempts, queued in one statement) and every close
    (the attempts' and the invocation's, one statement); nothing between, whatever the number
    of nodes, and no row lock taken before."""
    from task_state_guard_postgres import driver

    builder = StateGraph(State)
    for node in ("plan", "act", "check"):
        builder.add_node(node, lambda state, node=node: {"log": [node]})
    builder.add_edge(START, "plan")
    builder.add_edge("plan", "act")
    builder.add_edge("act", "check")
    ledger = Ledger(db)
    app = guard(builder.compile(checkpointer=saver), ledger=ledger, strict=True,
                heartbeat_seconds=0)
    apps.append(app)
    app.invoke({"log": []}, {"configurable": {"thread_id": "warm"}}, invocation_id="warm")
    statements: list[str] = []
    for name in ("execute", "run", "run_many", "fetch_named", "stream"):
        original = getattr(driver.Conn, name)

        def counted(self: Any, sql: Any, *args: Any, _original: Any = original) -> Any:
            statements.append(getattr(sql, "text", sql))  # a prepared statement's text
            return _original(self, sql, *args)

        monkeypatch.setattr(driver.Conn, name, counted)
    out = app.invoke({"log": []}, {"configurable": {"thread_id": "st"}}, invocation_id="st")
    monkeypatch.undo()
    assert out["log"] == ["plan", "act", "check"]
    kinds = [s.split()[0].upper() for s in statements]
    assert kinds == ["WITH", "BEGIN", "WITH", "WITH", "COMMIT"], statements
    assert "INSERT INTO tsg_tasks" in statements[2] and "'queued'" in statements[2]
    assert "UPDATE tsg_tasks" in statements[3] and "INSERT INTO tsg_tasks" not in statements[3]
    ok = ("succeeded", "worker_completed", ())
    assert shape(tree(ledger, app.logical_task_id("st"))) == (
        "LangGraph", "succeeded", "completed",
        (("plan", *ok), ("act", *ok), ("check", *ok)),
    )
    assert_healthy(ledger)
    ledger.close()


def test_one_transaction_per_invocation_end(db: str, saver: Any, apps: list[Any]) -> None:
    seen: dict[str, Any] = {}

    def plan(state: State) -> dict[str, Any]:
        # While the node runs (no heartbeat), only the invocation is a committed record: the
        # node attempts are history, buffered until the invocation's end.
        with Ledger(db) as other:  # another connection sees only committed data
            running = [other.get_task(i) for i in other.find_task_ids("running")]
        seen["running"] = sorted((str(t.name), t.has_owner) for t in running)
        return {"log": ["plan"]}

    def act(state: State) -> dict[str, Any]:
        with Ledger(db) as other:
            ids = [i for st in ("running", "succeeded") for i in other.find_task_ids(st)]
            tasks = [other.get_task(i) for i in ids]
        seen["act"] = sorted((str(t.name), str(t.status)) for t in tasks)
        return {"log": ["act"]}

    builder = StateGraph(State)
    builder.add_node("plan", plan)
    builder.add_node("act", act)
    builder.add_edge(START, "plan")
    builder.add_edge("plan", "act")
    ledger = _CountingLedger(db)
    app = guard(
        builder.compile(checkpointer=saver), ledger=ledger, strict=True, heartbeat_seconds=0
    )
    apps.append(app)
    before = ledger.transactions
    app.invoke({"log": []}, {"configurable": {"thread_id": "tx"}}, invocation_id="tx")
    # Two transactions, whatever the number of nodes: the invocation's start; the node
    # history (both attempts, their closes and deliveries) with the invocation's close.
    assert ledger.transactions - before == 2
    assert seen["running"] == [("LangGraph", True)]
    assert seen["act"] == [("LangGraph", "running")]
    ok = ("succeeded", "worker_completed", ())
    assert shape(tree(ledger, app.logical_task_id("tx"))) == (
        "LangGraph",
        "succeeded",
        "completed",
        (("plan", *ok), ("act", *ok)),
    )
    for child in tree(ledger, app.logical_task_id("tx"))["children"]:
        assert (child["delivery"], child["delivery_code"]) == ("not_applicable", "internal_task")
    assert_healthy(ledger)
    ledger.close()
