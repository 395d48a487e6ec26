"""Node failures and RetryPolicy attempts."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from langgraph.graph import START, StateGraph
from langgraph.types import RetryPolicy
from lg_helpers import State, assert_healthy, tree
from task_state_guard_langgraph import guard


class Flaky(Exception):
    """Retried by RetryPolicy's default retry_on (not a ValueError/RuntimeError...)."""


def _graph(node: Any, retry: RetryPolicy | None = None) -> StateGraph:
    builder = StateGraph(State)
    builder.add_node("start", lambda s: {"log": ["start"]})
    builder.add_node("work", node, retry_policy=retry)
    builder.add_edge(START, "start")
    builder.add_edge("start", "work")
    return builder


def test_node_raises_without_retry(db: str, saver: Any, apps: list[Any]) -> None:
    def work(state: State) -> dict[str, Any]:
        raise ValueError("boom")

    app = guard(_graph(work).compile(checkpointer=saver), db=db, strict=True)
    apps.append(app)
    with pytest.raises(ValueError, match="boom"):
        app.invoke({"log": []}, {"configurable": {"thread_id": "f1"}}, invocation_id="f1")
    assert app.last_outcome == "failed"
    root = tree(app.ledger, app.logical_task_id("f1"))
    assert (root["status"], root["code"], root["delivery"]) == (
        "failed",
        "worker_failed",
        "pending",
    )
    got = sorted((c["name"], c["status"], c["code"]) for c in root["children"])
    assert got == [("start", "succeeded", "worker_completed"), ("work", "failed", "worker_failed")]
    assert_healthy(app.ledger)


def test_retry_policy_fails_twice_then_succeeds(db: str, saver: Any, apps: list[Any]) -> None:
    calls = {"n": 0}

    def work(state: State) -> dict[str, Any]:
        calls["n"] += 1
        if calls["n"] <= 2:
            raise Flaky("transient")
        return {"log": ["work"]}

    policy = RetryPolicy(max_attempts=3, initial_interval=0.01, jitter=False)
    app = guard(_graph(work, policy).compile(checkpointer=saver), db=db, strict=True)
    apps.append(app)
    out = app.invoke({"log": []}, {"configurable": {"thread_id": "r1"}}, invocation_id="r1")
    assert out["log"] == ["start", "work"]
    root = tree(app.ledger, app.logical_task_id("r1"))
    assert (root["status"], root["code"]) == ("succeeded", "completed")
    work_attempts = [c for c in root["children"] if c["name"] == "work"]
    assert len(work_attempts) == 3
    assert Counter((c["status"], c["code"]) for c in work_attempts) == Counter(
        {("failed", "retry_scheduled"): 2, ("succeeded", "worker_completed"): 1}
    )
    # Every attempt is its own internal child of the same parent.
    assert len({c["id"] for c in work_attempts}) == 3
    assert all(c["delivery"] == "not_applicable" for c in work_attempts)
    assert_healthy(app.ledger)


def test_retries_exhausted_fail_the_invocation(db: str, saver: Any, apps: list[Any]) -> None:
    def work(state: State) -> dict[str, Any]:
        raise Flaky("always")

    policy = RetryPolicy(max_attempts=3, initial_interval=0.01, jitter=False)
    app = guard(_graph(work, policy).compile(checkpointer=saver), db=db, strict=True)
    apps.append(app)
    with pytest.raises(Flaky):
        app.invoke({"log": []}, {"configurable": {"thread_id": "r2"}}, invocation_id="r2")
    root = tree(app.ledger, app.logical_task_id("r2"))
    assert (root["status"], root["code"]) == ("failed", "worker_failed")
    work_attempts = [c for c in root["children"] if c["name"] == "work"]
    assert Counter((c["status"], c["code"]) for c in work_attempts) == Counter(
        {("failed", "retry_scheduled"): 2, ("failed", "worker_failed"): 1}
    )
    assert_healthy(app.ledger)


def test_error_not_matching_retry_on_is_final(db: str, saver: Any, apps: list[Any]) -> None:
    def work(state: State) -> dict[str, Any]:
        raise RuntimeError("not retried by the default retry_on")

    policy = RetryPolicy(max_attempts=5, initial_interval=0.01)
    app = guard(_graph(work, policy).compile(checkpointer=saver), db=db, strict=True)
    apps.append(app)
    with pytest.raises(RuntimeError):
        app.invoke({"log": []}, {"configurable": {"thread_id": "r3"}}, invocation_id="r3")
    root = tree(app.ledger, app.logical_task_id("r3"))
    work_attempts = [(c["status"], c["code"]) for c in root["children"] if c["name"] == "work"]
    assert work_attempts == [("failed", "worker_failed")]
    assert_healthy(app.ledger)


def test_retry_inside_a_subgraph_node(db: str, saver: Any, apps: list[Any]) -> None:
    calls = {"n": 0}

    def inner(state: State) -> dict[str, Any]:
        calls["n"] += 1
        if calls["n"] == 1:
            raise Flaky()
        return {"log": ["inner"]}

    sub = StateGraph(State)
    sub.add_node("inner", inner, retry_policy=RetryPolicy(initial_interval=0.01, jitter=False))
    sub.add_edge(START, "inner")
    builder = StateGraph(State)
    builder.add_node("outer", sub.compile())
    builder.add_edge(START, "outer")
    app = guard(builder.compile(checkpointer=saver), db=db, strict=True)
    apps.append(app)
    app.invoke({"log": []}, {"configurable": {"thread_id": "sr"}}, invocation_id="sr")
    root = tree(app.ledger, app.logical_task_id("sr"))
    (outer,) = root["children"]
    assert (outer["name"], outer["status"]) == ("outer", "succeeded")
    assert Counter((c["name"], c["status"], c["code"]) for c in outer["children"]) == Counter(
        {("inner", "failed", "retry_scheduled"): 1, ("inner", "succeeded", "worker_completed"): 1}
    )
    assert_healthy(app.ledger)
