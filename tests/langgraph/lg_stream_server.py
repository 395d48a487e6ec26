"""A Starlette app streaming a guarded graph (run under uvicorn by test_lg_stream_disconnect.py).

``TSG_DB`` is the ledger, ``CHECKPOINTS`` the checkpointer (a SQLite file or a
``postgresql://`` URL), ``MARKER`` the file the ``slow`` node writes before it waits.
``GET /stream/{thread}`` streams the run's updates, one JSON line each (invocation id
``stream-<thread>``); ``GET /run/{thread}`` answers the run's output (``ainvoke``, invocation
id ``run-<thread>``), or 503 when the run was drained. With ``DRAIN=1`` the server drains its
runs on SIGTERM (``drain_on_signals``) and ``slow`` waits for ``MARKER.release``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import AsyncIterator
from typing import Any

from langgraph.errors import GraphDrained
from lg_crash_graph import asaver_at, builder
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route
from task_state_guard_langgraph import GuardedGraph, drain_on_signals, guard

state: dict[str, GuardedGraph] = {}
# Warnings and errors of the guard (and of any logger but uvicorn's own) are printed with their
# logger's name, so that a test can tell them apart.
logging.basicConfig(format="%(name)s %(levelname)s %(message)s", level=logging.WARNING)


async def stream(request: Request) -> StreamingResponse:
    thread = request.path_params["thread"]

    async def lines() -> AsyncIterator[str]:
        async for update in state["graph"].astream(
            {"log": []}, {"configurable": {"thread_id": thread}},
            invocation_id=f"stream-{thread}", stream_mode="updates", durability="sync",
        ):
            yield json.dumps(update, default=str) + "\n"

    return StreamingResponse(lines(), media_type="application/x-ndjson")


async def run(request: Request) -> JSONResponse:
    thread = request.path_params["thread"]
    try:
        out = await state["graph"].ainvoke(
            {"log": []}, {"configurable": {"thread_id": thread}}, invocation_id=f"run-{thread}",
            durability="sync",
        )
    except GraphDrained:  # the server is stopping: the next start resumes the thread
        return JSONResponse({"drained": thread}, status_code=503)
    return JSONResponse(out)


async def stats(request: Request) -> JSONResponse:
    return JSONResponse(state["graph"].stats())


@contextlib.asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    async with asaver_at(os.environ["CHECKPOINTS"]) as saver:
        drain = os.environ.get("DRAIN") == "1"
        graph: Any = builder(os.environ["MARKER"], use_async=True, release=drain).compile(
            checkpointer=saver, name="crashy")
        state["graph"] = guard(graph, db=os.environ["TSG_DB"], strict=True)
        restore = drain_on_signals(state["graph"]) if drain else (lambda: None)
        try:
            yield
        finally:
            restore()
            await state["graph"].aclose()


app = Starlette(
    routes=[Route("/stream/{thread}", stream), Route("/run/{thread}", run),
            Route("/stats", stats)],
    lifespan=lifespan,
)
