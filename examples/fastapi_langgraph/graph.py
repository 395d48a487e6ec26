"""A small research assistant graph: plain Python, no model, no network.

    plan -> gather -> answer

``gather`` stands for slow tool calls: it waits ``GATHER_SECONDS`` (environment, default 0).
"""

from __future__ import annotations

import asyncio
import os
from typing import Annotated, Any, TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Checkpointer

SOURCES = {
    "sqlite": "SQLite keeps a database in one file; WAL mode lets readers run beside a writer.",
    "celery": "Celery runs tasks in worker processes that take messages from a broker.",
}


def _append(left: list[str], right: list[str]) -> list[str]:
    return [*left, *right]


class ResearchState(TypedDict, total=False):
    question: str
    notes: Annotated[list[str], _append]
    answer: str


def plan(state: ResearchState) -> dict[str, Any]:
    words = [w.strip("?.,!").lower() for w in state["question"].split()]
    return {"notes": [f"topic:{w}" for w in words if w in SOURCES]}


async def gather(state: ResearchState) -> dict[str, Any]:
    await asyncio.sleep(float(os.environ.get("GATHER_SECONDS", "0")))  # the tools' latency
    topics = [n.split(":", 1)[1] for n in state.get("notes", []) if n.startswith("topic:")]
    return {"notes": [SOURCES[t] for t in topics]}


def answer(state: ResearchState) -> dict[str, Any]:
    facts = [n for n in state.get("notes", []) if not n.startswith("topic:")]
    return {"answer": " ".join(facts) if facts else "I found nothing on that."}


def build(checkpointer: Checkpointer) -> CompiledStateGraph[Any, Any, Any, Any]:
    builder = StateGraph(ResearchState)
    builder.add_node("plan", plan)
    builder.add_node("gather", gather)
    builder.add_node("answer", answer)
    builder.add_edge(START, "plan")
    builder.add_edge("plan", "gather")
    builder.add_edge("gather", "answer")
    builder.add_edge("answer", END)
    return builder.compile(checkpointer=checkpointer, name="research")
