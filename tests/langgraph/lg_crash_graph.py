"""Graph shared by the SIGKILL test and its child process (not a test module)."""

from __future__ import annotations

import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import START, StateGraph
from lg_helpers import State


def build(checkpoints: str, marker: str | None) -> Any:
    """prepare -> slow -> finish; ``slow`` blocks (after writing ``marker``) when given one."""

    def prepare(state: State) -> dict[str, Any]:
        return {"log": ["prepare"]}

    def slow(state: State) -> dict[str, Any]:
        if marker is not None:
            Path(marker).write_text("in slow")
            time.sleep(120)  # SIGKILLed here
        return {"log": ["slow"]}

    def finish(state: State) -> dict[str, Any]:
        return {"log": ["finish"]}

    builder = StateGraph(State)
    builder.add_node("prepare", prepare)
    builder.add_node("slow", slow)
    builder.add_node("finish", finish)
    builder.add_edge(START, "prepare")
    builder.add_edge("prepare", "slow")
    builder.add_edge("slow", "finish")
    conn = sqlite3.connect(checkpoints, check_same_thread=False)
    return builder.compile(checkpointer=SqliteSaver(conn), name="crashy")


if __name__ == "__main__":
    from task_state_guard_langgraph import guard

    db, checkpoints, marker, thread_id, invocation_id = sys.argv[1:6]
    app = guard(build(checkpoints, marker), db=db, strict=True)
    app.invoke(
        {"log": []},
        {"configurable": {"thread_id": thread_id}},
        invocation_id=invocation_id,
        durability="sync",
    )
    raise SystemExit("unreachable: the node blocks until SIGKILL")
