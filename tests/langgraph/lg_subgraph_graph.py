"""A graph whose node runs a subgraph, for the SIGKILL tests (not a test module).

``prepare -> research -> finish``; ``research`` is a compiled subgraph, ``gather -> digest``,
sharing the graph's checkpointer (``nested``: ``gather -> deep``, ``deep`` a subgraph of its
own running ``digest``). ``digest`` writes ``MARKER`` and blocks until the process is
SIGKILLed when given one (``late``: the last node, ``finish_slow``, does instead, after the
subgraph finished).

As a script: ``lg_subgraph_graph.py DB CHECKPOINTS MARKER THREAD INVOCATION [MODE]`` runs one
invocation (``invoke``; MODE ``async``: ``ainvoke`` on the async saver; ``nested``: the
nested graph), killed in ``digest`` (MODE ``late`` / ``async-late``: in ``finish_slow``).
"""

from __future__ import annotations

import asyncio
import operator
import sys
import time
from pathlib import Path
from typing import Annotated, Any, TypedDict

from langgraph.graph import START, StateGraph
from lg_crash_graph import asaver_at, saver_at

#: The blocked inner node waits at most this long for its SIGKILL.
BLOCK_SECONDS = 120


class Outer(TypedDict, total=False):
    log: Annotated[list[str], operator.add]
    notes: list[str]


class Research(TypedDict, total=False):
    notes: Annotated[list[str], operator.add]


def builder(marker: str | None, *, use_async: bool = False, nested: bool = False,
            late: bool = False) -> StateGraph:
    """The outer graph; its ``research`` node is the subgraph (``digest`` blocks on
    ``marker``; ``late``: ``finish_slow``, the node after ``research``, does)."""
    slow_marker, marker = (marker, None) if late else (None, marker)

    def gather(state: Research) -> dict[str, Any]:
        return {"notes": ["gather"]}

    def finish_slow(state: Outer) -> dict[str, Any]:
        if slow_marker is not None:
            Path(slow_marker).write_text("in finish_slow")
            time.sleep(BLOCK_SECONDS)  # SIGKILLed here
        return {"log": ["finish"]}

    async def afinish_slow(state: Outer) -> dict[str, Any]:
        if slow_marker is not None:
            Path(slow_marker).write_text("in finish_slow")
            await asyncio.sleep(BLOCK_SECONDS)  # SIGKILLed here
        return {"log": ["finish"]}

    def digest(state: Research) -> dict[str, Any]:
        if marker is not None:
            Path(marker).write_text("in digest")
            time.sleep(BLOCK_SECONDS)  # SIGKILLed here
        return {"notes": ["digest"]}

    async def adigest(state: Research) -> dict[str, Any]:
        if marker is not None:
            Path(marker).write_text("in digest")
            await asyncio.sleep(BLOCK_SECONDS)  # SIGKILLed here
        return {"notes": ["digest"]}

    run_digest = adigest if use_async else digest
    sub = StateGraph(Research)
    sub.add_node("gather", gather)
    sub.add_edge(START, "gather")
    if nested:
        deep = StateGraph(Research)
        deep.add_node("digest", run_digest)
        deep.add_edge(START, "digest")
        sub.add_node("deep", deep.compile(name="deep"))
        sub.add_edge("gather", "deep")
    else:
        sub.add_node("digest", run_digest)
        sub.add_edge("gather", "digest")

    graph = StateGraph(Outer)
    graph.add_node("prepare", lambda state: {"log": ["prepare"]})
    graph.add_node("research", sub.compile(name="research"))
    last = "finish_slow" if late else "finish"
    if late:
        graph.add_node(last, afinish_slow if use_async else finish_slow)
    else:
        graph.add_node(last, lambda state: {"log": ["finish"]})
    graph.add_edge(START, "prepare")
    graph.add_edge("prepare", "research")
    graph.add_edge("research", last)
    return graph


async def _run_async(db: str, checkpoints: str, marker: str, thread: str, inv: str,
                     late: bool) -> None:
    from task_state_guard_langgraph import guard

    async with asaver_at(checkpoints) as saver:
        graph = builder(marker, use_async=True, late=late).compile(
            checkpointer=saver, name="outer")
        app = guard(graph, db=db, strict=True)
        await app.ainvoke({"log": []}, {"configurable": {"thread_id": thread}},
                          invocation_id=inv, durability="sync")


def main(db: str, checkpoints: str, marker: str, thread: str, inv: str, mode: str) -> None:
    from task_state_guard_langgraph import guard

    if mode in ("async", "async-late"):
        asyncio.run(_run_async(db, checkpoints, marker, thread, inv, mode == "async-late"))
    else:
        with saver_at(checkpoints) as saver:
            graph = builder(marker, nested=mode == "nested", late=mode == "late")
            app = guard(graph.compile(checkpointer=saver, name="outer"), db=db, strict=True)
            app.invoke({"log": []}, {"configurable": {"thread_id": thread}},
                       invocation_id=inv, durability="sync")
    raise SystemExit("unreachable: the slow node blocks until SIGKILL")


if __name__ == "__main__":
    main(*sys.argv[1:6], sys.argv[6] if len(sys.argv) > 6 else "")
