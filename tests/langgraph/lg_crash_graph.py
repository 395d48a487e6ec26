"""Graph shared by the SIGKILL test and its child process (not a test module)."""

from __future__ import annotations

import asyncio
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import START, StateGraph
from lg_helpers import State


def builder(marker: str | None, *, use_async: bool = False) -> StateGraph:
    """prepare -> slow -> finish; ``slow`` blocks (after writing ``marker``) when given one."""

    def prepare(state: State) -> dict[str, Any]:
        return {"log": ["prepare"]}

    def slow(state: State) -> dict[str, Any]:
        if marker is not None:
            Path(marker).write_text("in slow")
            time.sleep(120)  # SIGKILLed here
        return {"log": ["slow"]}

    async def aslow(state: State) -> dict[str, Any]:
        if marker is not None:
            Path(marker).write_text("in slow")
            await asyncio.sleep(120)  # SIGKILLed here
        return {"log": ["slow"]}

    def finish(state: State) -> dict[str, Any]:
        return {"log": ["finish"]}

    graph = StateGraph(State)
    graph.add_node("prepare", prepare)
    graph.add_node("slow", aslow if use_async else slow)
    graph.add_node("finish", finish)
    graph.add_edge(START, "prepare")
    graph.add_edge("prepare", "slow")
    graph.add_edge("slow", "finish")
    return graph


def build(checkpoints: str, marker: str | None) -> Any:
    """The sync graph compiled with a SqliteSaver on ``checkpoints``."""
    conn = sqlite3.connect(checkpoints, check_same_thread=False)
    return builder(marker).compile(checkpointer=SqliteSaver(conn), name="crashy")


async def _run_async(db: str, checkpoints: str, marker: str, thread: str, inv: str) -> None:
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
    from task_state_guard_langgraph import guard

    async with AsyncSqliteSaver.from_conn_string(checkpoints) as saver:
        graph = builder(marker, use_async=True).compile(checkpointer=saver, name="crashy")
        app = guard(graph, db=db, strict=True)
        await app.ainvoke(
            {"log": []},
            {"configurable": {"thread_id": thread}},
            invocation_id=inv,
            durability="sync",
        )


if __name__ == "__main__":
    from task_state_guard_langgraph import guard

    db, checkpoints, marker, thread_id, invocation_id = sys.argv[1:6]
    if sys.argv[6:] == ["async"]:
        asyncio.run(_run_async(db, checkpoints, marker, thread_id, invocation_id))
    app = guard(build(checkpoints, marker), db=db, strict=True)
    app.invoke(
        {"log": []},
        {"configurable": {"thread_id": thread_id}},
        invocation_id=invocation_id,
        durability="sync",
    )
    raise SystemExit("unreachable: the node blocks until SIGKILL")
