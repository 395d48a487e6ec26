"""stream(), early close, and the stand-alone callback handler."""

from __future__ import annotations

from typing import Any

import pytest
from langgraph.graph import START, StateGraph
from langgraph.types import RetryPolicy
from lg_helpers import State, assert_healthy, shape, tree
from task_state_guard import Ledger
from task_state_guard_langgraph import GuardCallbackHandler, guard, logical_task_id


def _three() -> StateGraph:
    builder = StateGraph(State)
    for name in ("one", "two", "three"):
        builder.add_node(name, lambda s, n=name: {"log": [n]})
    builder.add_edge(START, "one")
    builder.add_edge("one", "two")
    builder.add_edge("two", "three")
    return builder


def test_stream_records_like_invoke(db: str, saver: Any, apps: list[Any]) -> None:
    app = guard(_three().compile(checkpointer=saver), db=db, strict=True)
    apps.append(app)
    chunks = list(
        app.stream({"log": []}, {"configurable": {"thread_id": "st"}}, invocation_id="st")
    )
    assert [next(iter(c)) for c in chunks] == ["one", "two", "three"]
    ok = ("succeeded", "worker_completed", ())
    assert shape(tree(app.ledger, app.logical_task_id("st"))) == (
        "LangGraph",
        "succeeded",
        "completed",
        (("one", *ok), ("two", *ok), ("three", *ok)),
    )
    assert_healthy(app.ledger)


def test_stream_closed_early_is_cancelled(db: str, saver: Any, apps: list[Any]) -> None:
    app = guard(_three().compile(checkpointer=saver), db=db, strict=True)
    apps.append(app)
    it = app.stream({"log": []}, {"configurable": {"thread_id": "se"}}, invocation_id="se")
    first = next(it)
    assert "one" in first
    it.close()  # the consumer went away
    root = tree(app.ledger, app.logical_task_id("se"))
    assert (root["status"], root["code"]) == ("cancelled", "caller_cancelled")
    assert all(c["status"] != "running" for c in root["children"])
    assert app.last_outcome == "cancelled"
    assert_healthy(app.ledger)


def test_callback_handler_without_wrapper(db: str, saver: Any) -> None:
    calls = {"n": 0}

    class Flaky(Exception):
        pass

    def flaky(state: State) -> dict[str, Any]:
        calls["n"] += 1
        if calls["n"] == 1:
            raise Flaky()
        return {"log": ["flaky"]}

    builder = _three()
    builder.add_node("flaky", flaky, retry_policy=RetryPolicy(initial_interval=0.01, jitter=False))
    builder.add_edge("three", "flaky")
    graph = builder.compile(checkpointer=saver)
    with Ledger(db) as ledger:
        handler = GuardCallbackHandler(
            ledger, invocation_id="cb-1", graph=graph, strict=True, heartbeat_seconds=0
        )
        graph.invoke({"log": []}, {"configurable": {"thread_id": "cb"}, "callbacks": [handler]})
        root = tree(ledger, logical_task_id("cb-1"))
        ok = ("succeeded", "worker_completed", ())
        assert shape(root) == (
            "LangGraph",
            "succeeded",
            "completed",
            (
                ("one", *ok),
                ("two", *ok),
                ("three", *ok),
                ("flaky", "failed", "retry_scheduled", ()),
                ("flaky", *ok),
            ),
        )
        assert root["delivery_required"] is True
        assert handler.stats()["errors"] == {}
        assert_healthy(ledger)


def test_callback_handler_records_failure(db: str, saver: Any) -> None:
    def bad(state: State) -> dict[str, Any]:
        raise KeyError("x")

    builder = StateGraph(State)
    builder.add_node("bad", bad)
    builder.add_edge(START, "bad")
    graph = builder.compile(checkpointer=saver)
    with Ledger(db) as ledger:
        handler = GuardCallbackHandler(ledger, strict=True, heartbeat_seconds=0)
        with pytest.raises(KeyError):
            graph.invoke({"log": []}, {"configurable": {"thread_id": "cf"}, "callbacks": [handler]})
        roots = [t for t in (ledger.get_task(i) for i in ledger.find_task_ids("failed"))]
        top = [t for t in roots if t.parent_id is None]
        assert len(top) == 1
        assert shape(tree(ledger, top[0].id)) == (
            "LangGraph",
            "failed",
            "worker_failed",
            (("bad", "failed", "worker_failed", ()),),
        )
        assert_healthy(ledger)
