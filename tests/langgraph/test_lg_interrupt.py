"""interrupt() then Command(resume=...)."""

from __future__ import annotations

from typing import Any

import pytest
from langgraph.errors import GraphDrained
from langgraph.graph import START, StateGraph
from langgraph.runtime import RunControl
from langgraph.types import Command, interrupt
from lg_helpers import State, assert_healthy, shape, tree
from task_state_guard_langgraph import guard


def _approval_graph(runs: list[str]) -> StateGraph:
    def draft(state: State) -> dict[str, Any]:
        runs.append("draft")
        return {"log": ["draft"]}

    def approve(state: State) -> dict[str, Any]:
        runs.append("approve")
        answer = interrupt("approve the draft?")
        return {"answer": str(answer)}

    def send(state: State) -> dict[str, Any]:
        runs.append("send")
        return {"log": ["sent"]}

    builder = StateGraph(State)
    builder.add_node("draft", draft)
    builder.add_node("approve", approve)
    builder.add_node("send", send)
    builder.add_edge(START, "draft")
    builder.add_edge("draft", "approve")
    builder.add_edge("approve", "send")
    return builder


def test_interrupt_then_resume(db: str, saver: Any, apps: list[Any]) -> None:
    runs: list[str] = []
    app = guard(_approval_graph(runs).compile(checkpointer=saver), db=db, strict=True)
    apps.append(app)
    cfg = {"configurable": {"thread_id": "h1"}}
    out = app.invoke({"log": []}, cfg, invocation_id="ask-1")
    assert out["__interrupt__"][0].value == "approve the draft?"
    assert app.last_outcome == "interrupted"
    first = tree(app.ledger, app.logical_task_id("ask-1"))
    # The invocation ends without failure; its pending delivery is the question to the human.
    assert (first["status"], first["code"], first["delivery"]) == (
        "succeeded",
        "completed",
        "pending",
    )
    assert shape(first) == (
        "LangGraph",
        "succeeded",
        "completed",
        (
            ("draft", "succeeded", "worker_completed", ()),
            ("approve", "cancelled", "interrupted", ()),
        ),
    )
    assert_healthy(app.ledger)
    assert app.mark_delivered("ask-1")  # the question reached the human

    out = app.invoke(Command(resume="yes"), cfg, invocation_id="answer-1")
    assert out["answer"] == "yes"
    assert runs == ["draft", "approve", "approve", "send"]
    assert app.last_outcome == "succeeded"
    # The resume is a new invocation, recorded as a child of the interrupted one.
    first = tree(app.ledger, app.logical_task_id("ask-1"))
    resumed = [c for c in first["children"] if c["delivery_required"]]
    assert len(resumed) == 1
    assert resumed[0]["id"] == app.logical_task_id("answer-1")
    assert shape(resumed[0]) == (
        "LangGraph",
        "succeeded",
        "completed",
        (
            ("approve", "succeeded", "worker_completed", ()),
            ("send", "succeeded", "worker_completed", ()),
        ),
    )
    # The interrupted attempt and its re-execution are distinct records.
    approve_ids = [
        c["id"] for c in first["children"] + resumed[0]["children"] if c["name"] == "approve"
    ]
    assert len(set(approve_ids)) == 2
    assert_healthy(app.ledger)


def test_interrupt_inside_subgraph(db: str, saver: Any, apps: list[Any]) -> None:
    def ask(state: State) -> dict[str, Any]:
        return {"answer": str(interrupt("which?"))}

    sub = StateGraph(State)
    sub.add_node("ask", ask)
    sub.add_edge(START, "ask")
    builder = StateGraph(State)
    builder.add_node("review", sub.compile())
    builder.add_edge(START, "review")
    app = guard(builder.compile(checkpointer=saver), db=db, strict=True)
    apps.append(app)
    cfg = {"configurable": {"thread_id": "h2"}}
    app.invoke({"log": []}, cfg, invocation_id="q")
    first = tree(app.ledger, app.logical_task_id("q"))
    assert shape(first) == (
        "LangGraph",
        "succeeded",
        "completed",
        (("review", "cancelled", "interrupted", (("ask", "cancelled", "interrupted", ()),)),),
    )
    out = app.invoke(Command(resume="B"), cfg, invocation_id="a")
    assert out["answer"] == "B"
    second = tree(app.ledger, app.logical_task_id("a"))
    assert second["id"] in [c["id"] for c in tree(app.ledger, first["id"])["children"]]
    assert shape(second)[3] == (
        (
            "review",
            "succeeded",
            "worker_completed",
            (("ask", "succeeded", "worker_completed", ()),),
        ),
    )
    assert_healthy(app.ledger)


def test_drain_is_a_cancelled_invocation_and_resumes_linked(
    db: str, saver: Any, apps: list[Any]
) -> None:
    control = RunControl()

    def first(state: State) -> dict[str, Any]:
        control.request_drain("shutdown")  # e.g. from a SIGTERM handler
        return {"log": ["first"]}

    builder = StateGraph(State)
    builder.add_node("first", first)
    builder.add_node("second", lambda s: {"log": ["second"]})
    builder.add_edge(START, "first")
    builder.add_edge("first", "second")
    app = guard(builder.compile(checkpointer=saver), db=db, strict=True)
    apps.append(app)
    cfg = {"configurable": {"thread_id": "dr"}}
    with pytest.raises(GraphDrained):
        app.invoke({"log": []}, cfg, invocation_id="dr-1", control=control)
    drained = tree(app.ledger, app.logical_task_id("dr-1"))
    assert shape(drained) == (
        "LangGraph",
        "cancelled",
        "interrupted",
        (("first", "succeeded", "worker_completed", ()),),
    )
    out = app.invoke(None, cfg, invocation_id="dr-2")
    assert out["log"] == ["first", "second"]
    drained = tree(app.ledger, app.logical_task_id("dr-1"))
    assert [shape(c) for c in drained["children"] if c["delivery_required"]] == [
        ("LangGraph", "succeeded", "completed", (("second", "succeeded", "worker_completed", ()),))
    ]
    assert_healthy(app.ledger)


@pytest.mark.parametrize("edit_on", ["guarded", "raw"])
def test_a_resume_after_a_state_edit_keeps_its_parent(
    db: str, saver: Any, apps: list[Any], edit_on: str
) -> None:
    runs: list[str] = []
    app = guard(_approval_graph(runs).compile(checkpointer=saver), db=db, strict=True)
    apps.append(app)
    cfg = {"configurable": {"thread_id": f"edit-{edit_on}"}}
    app.invoke({"log": []}, cfg, invocation_id="ask")
    # Someone edits the waiting thread's state (the guarded graph's update_state, or the raw
    # graph's, which names no invocation), then the human answers.
    (app if edit_on == "guarded" else app.graph).update_state(cfg, {"log": ["edited"]})
    out = app.invoke(Command(resume="yes"), cfg, invocation_id="answer")
    assert out["log"] == ["draft", "edited", "sent"] and out["answer"] == "yes"
    resumed = app.ledger.get_task(app.logical_task_id("answer"))
    assert resumed.parent_id == app.logical_task_id("ask")
    asked = tree(app.ledger, app.logical_task_id("ask"))
    assert [shape(c)[:3] for c in asked["children"] if c["delivery_required"]] == [
        ("LangGraph", "succeeded", "completed")
    ]
    assert_healthy(app.ledger)
