"""A small support agent as a LangGraph graph: plain Python, no model, no network.

    classify -> lookup ----------------------> respond
             -> approve (interrupt) -> refund -> respond

``classify`` routes with keyword rules, ``lookup`` answers from a tiny knowledge base,
``approve`` asks a human with ``interrupt()``, ``refund`` is the side effect (it can be
made to crash its own process with SIGKILL to demonstrate recovery).
"""

from __future__ import annotations

import os
import signal
import sqlite3
from typing import Any, Literal, TypedDict

from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import RetryPolicy, interrupt

KNOWLEDGE = {
    "hours": "We are open 9:00-17:00, Monday to Friday.",
    "shipping": "Orders ship within two working days.",
}

#: When this file exists, ``refund`` SIGKILLs its own process (the crash demo).
CRASH_FLAG_ENV = "AGENT_CRASH_FLAG"


class AgentState(TypedDict, total=False):
    request: str
    intent: str
    approved: bool
    reply: str


def classify(state: AgentState) -> dict[str, Any]:
    text = state["request"].lower()
    return {"intent": "refund" if "refund" in text else "question"}


def route(state: AgentState) -> Literal["lookup", "approve"]:
    return "approve" if state["intent"] == "refund" else "lookup"


def lookup(state: AgentState) -> dict[str, Any]:
    text = state["request"].lower()
    for topic, answer in KNOWLEDGE.items():
        if topic in text:
            return {"reply": answer}
    return {"reply": "A colleague will get back to you."}


def approve(state: AgentState) -> dict[str, Any]:
    decision = interrupt({"question": "Approve this refund?"})
    return {"approved": bool(decision)}


def refund(state: AgentState) -> dict[str, Any]:
    flag = os.environ.get(CRASH_FLAG_ENV)
    if flag and os.path.exists(flag):
        os.remove(flag)  # crash once: the recovered run goes through
        os.kill(os.getpid(), signal.SIGKILL)
    if not state.get("approved"):
        return {"reply": "Your refund was declined."}
    return {"reply": "Your refund is on its way."}


def respond(state: AgentState) -> dict[str, Any]:
    return {"reply": state["reply"].strip()}


def build(checkpoints: str) -> Any:
    """Compile the agent with a SqliteSaver on ``checkpoints``."""
    builder = StateGraph(AgentState)
    builder.add_node("classify", classify)
    builder.add_node("lookup", lookup)
    builder.add_node("approve", approve)
    builder.add_node("refund", refund, retry_policy=RetryPolicy(max_attempts=3))
    builder.add_node("respond", respond)
    builder.add_edge(START, "classify")
    builder.add_conditional_edges("classify", route, ["lookup", "approve"])
    builder.add_edge("lookup", "respond")
    builder.add_edge("approve", "refund")
    builder.add_edge("refund", "respond")
    builder.add_edge("respond", END)
    conn = sqlite3.connect(checkpoints, check_same_thread=False)
    return builder.compile(checkpointer=SqliteSaver(conn), name="support_agent")
