"""Parallel Send branches and subgraphs."""

from __future__ import annotations

import operator
from collections import Counter
from typing import Annotated, Any, TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.types import Send
from lg_helpers import State, assert_healthy, shape, tree
from task_state_guard_langgraph import guard


class FanState(TypedDict, total=False):
    items: list[int]
    results: Annotated[list[int], operator.add]


def test_send_branches_one_attempt_each(db: str, saver: Any, apps: list[Any]) -> None:
    def plan(state: FanState) -> dict[str, Any]:
        return {"items": [1, 2, 3, 4]}

    def fan_out(state: FanState) -> list[Send]:
        return [Send("square", {"items": [i]}) for i in state["items"]]

    def square(state: FanState) -> dict[str, Any]:
        return {"results": [state["items"][0] ** 2]}

    builder = StateGraph(FanState)
    builder.add_node("plan", plan)
    builder.add_node("square", square)
    builder.add_edge(START, "plan")
    builder.add_conditional_edges("plan", fan_out, ["square"])
    builder.add_edge("square", END)
    app = guard(builder.compile(checkpointer=saver), db=db, strict=True)
    apps.append(app)
    out = app.invoke({"results": []}, {"configurable": {"thread_id": "s1"}}, invocation_id="s1")
    assert sorted(out["results"]) == [1, 4, 9, 16]
    root = tree(app.ledger, app.logical_task_id("s1"))
    assert root["status"] == "succeeded"
    assert Counter((c["name"], c["status"]) for c in root["children"]) == Counter(
        {("plan", "succeeded"): 1, ("square", "succeeded"): 4}
    )
    assert all(not c["children"] for c in root["children"])
    assert_healthy(app.ledger)


def _subgraph() -> Any:
    def inner_a(state: State) -> dict[str, Any]:
        return {"log": ["inner_a"]}

    def inner_b(state: State) -> dict[str, Any]:
        return {"log": ["inner_b"]}

    sub = StateGraph(State)
    sub.add_node("inner_a", inner_a)
    sub.add_node("inner_b", inner_b)
    sub.add_edge(START, "inner_a")
    sub.add_edge("inner_a", "inner_b")
    return sub.compile(name="research")


def test_subgraph_attempts_nest_under_the_node_running_it(
    db: str, saver: Any, apps: list[Any]
) -> None:
    research = _subgraph()

    def call_inside(state: State) -> dict[str, Any]:
        # A subgraph invoked from inside a node function nests the same way.
        research.invoke({"log": []})
        return {"log": ["called"]}

    builder = StateGraph(State)
    builder.add_node("first", lambda s: {"log": ["first"]})
    builder.add_node("research", research)  # subgraph as a node
    builder.add_node("wrapper", call_inside)
    builder.add_edge(START, "first")
    builder.add_edge("first", "research")
    builder.add_edge("research", "wrapper")
    app = guard(builder.compile(checkpointer=saver), db=db, strict=True)
    apps.append(app)
    app.invoke({"log": []}, {"configurable": {"thread_id": "g1"}}, invocation_id="g1")
    root = tree(app.ledger, app.logical_task_id("g1"))
    ok = "succeeded", "worker_completed"
    inner = (("inner_a", *ok, ()), ("inner_b", *ok, ()))
    assert shape(root) == (
        "LangGraph",
        "succeeded",
        "completed",
        (("first", *ok, ()), ("research", *ok, inner), ("wrapper", *ok, inner)),
    )
    assert_healthy(app.ledger)
