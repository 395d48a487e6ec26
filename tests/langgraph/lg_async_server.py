"""A Starlette app serving a guarded async graph (run by test_lg_async_server.py under uvicorn).

``TSG_DB`` names the ledger. ``GET /run/{rid}`` runs one invocation (id ``rid``) with
``ainvoke``, ``/stream/{rid}`` with ``astream`` and ``/events/{rid}`` with ``astream_events``;
each node checks, from a worker thread, that its invocation is already a committed running
record. A ticker task on the event loop records the longest gap between its 5 ms ticks since the
last ``GET /ticker?reset=1``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import time
from collections.abc import AsyncIterator
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, StateGraph
from lg_helpers import State
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from task_state_guard_langgraph import guard

DB = os.environ["TSG_DB"]
TICK = 0.005
gaps = {"max": 0.0, "ticks": 0}
seen_running: dict[str, bool] = {}


def _invocation_running(rid: str) -> bool:
    # Another connection sees committed data only (WAL readers are not blocked by a writer).
    conn = sqlite3.connect(DB)
    try:
        row = conn.execute(
            "SELECT status FROM tsg_tasks WHERE id = ?", (guarded.logical_task_id(rid),)
        ).fetchone()
    finally:
        conn.close()
    return row is not None and row[0] == "running"


async def first(state: State, config: RunnableConfig) -> dict[str, Any]:
    rid = str(config["metadata"]["tsg_invocation_id"])
    seen_running[rid] = await asyncio.to_thread(_invocation_running, rid)
    await asyncio.sleep(0.01)
    return {"log": ["first"]}


def second(state: State) -> dict[str, Any]:  # a sync node: LangGraph runs it in an executor
    time.sleep(0.005)
    return {"log": ["second"]}


builder = StateGraph(State)
builder.add_node("first", first)
builder.add_node("second", second)
builder.add_edge(START, "first")
builder.add_edge("first", "second")
guarded = guard(builder.compile(checkpointer=InMemorySaver()), db=DB)


def _config(rid: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": rid}}


async def run(request: Request) -> JSONResponse:
    rid = request.path_params["rid"]
    out = await guarded.ainvoke({"log": []}, _config(rid), invocation_id=rid)
    return JSONResponse({"log": out["log"], "running_before_first_node": seen_running[rid]})


async def stream(request: Request) -> JSONResponse:
    rid = request.path_params["rid"]
    chunks = [c async for c in guarded.astream({"log": []}, _config(rid), invocation_id=rid)]
    return JSONResponse({"chunks": len(chunks), "running_before_first_node": seen_running[rid]})


async def events(request: Request) -> JSONResponse:
    rid = request.path_params["rid"]
    names = [
        e["event"]
        async for e in guarded.astream_events({"log": []}, _config(rid), invocation_id=rid)
    ]
    return JSONResponse({"events": len(names), "running_before_first_node": seen_running[rid]})


async def ticker_stats(request: Request) -> JSONResponse:
    body = {"max_gap_ms": gaps["max"] * 1000.0, "ticks": gaps["ticks"]}
    if request.query_params.get("reset"):
        gaps["max"], gaps["ticks"] = 0.0, 0
    return JSONResponse(body)


async def stats(request: Request) -> JSONResponse:
    return JSONResponse(guarded.stats())


async def _tick() -> None:
    last = time.monotonic()
    while True:
        await asyncio.sleep(TICK)
        now = time.monotonic()
        gaps["max"] = max(gaps["max"], now - last - TICK)
        gaps["ticks"] += 1
        last = now


@contextlib.asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    task = asyncio.create_task(_tick())
    try:
        yield
    finally:
        task.cancel()
        guarded.close()


app = Starlette(
    routes=[
        Route("/run/{rid}", run),
        Route("/stream/{rid}", stream),
        Route("/events/{rid}", events),
        Route("/ticker", ticker_stats),
        Route("/stats", stats),
    ],
    lifespan=lifespan,
)
