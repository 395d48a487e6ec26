"""A FastAPI service answering questions with a LangGraph graph recorded in the ledger.

    TSG_DB=/data/tsg/tasks.sqlite CHECKPOINTS=/data/lg/checkpoints.sqlite \
        uvicorn service:app --host 0.0.0.0 --port 8000

At start-up (``lifespan``) the graph is guarded: the guard reconciles the ledger (the tasks of
a killed process become ``timed_out/owner_lost``) and ``arecover()`` resumes the threads those
runs left unfinished, before the first request is served.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI, HTTPException
from graph import build
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from pydantic import BaseModel
from task_state_guard import StateConflict, TaskNotFound
from task_state_guard_langgraph import GuardedGraph, LostTask, RecoveryReport, guard

log = logging.getLogger("research")


class Question(BaseModel):
    thread_id: str
    question: str


def on_lost(lost: LostTask) -> None:
    log.warning("run lost (%s): resuming thread %s", lost.code, lost.thread_id)


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    checkpoints = Path(os.environ.get("CHECKPOINTS", "/data/lg/checkpoints.sqlite"))
    checkpoints.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    async with AsyncSqliteSaver.from_conn_string(str(checkpoints)) as saver:
        # db: TSG_DB from the environment. Creating the guard reconciles the ledger.
        graph = guard(build(saver), on_lost=on_lost)
        app.state.graph = graph
        app.state.recovery = await graph.arecover()
        try:
            yield
        finally:
            graph.close()


app = FastAPI(lifespan=lifespan)


def _graph() -> GuardedGraph:
    graph: GuardedGraph = app.state.graph
    return graph


@app.post("/questions")
async def ask(body: Question) -> dict[str, Any]:
    invocation_id = f"req-{uuid.uuid4().hex}"
    config = {"configurable": {"thread_id": body.thread_id}}
    out = await _graph().ainvoke(
        {"question": body.question}, config, invocation_id=invocation_id
    )
    return {"invocation_id": invocation_id, "answer": out["answer"]}


@app.post("/invocations/{invocation_id}/delivered")
async def delivered(invocation_id: str) -> dict[str, Any]:
    """The client confirms it showed the answer: the invocation's delivery is closed."""
    try:
        task = _graph().mark_delivered(invocation_id)
    except (TaskNotFound, StateConflict) as exc:
        raise HTTPException(status_code=409, detail=type(exc).__name__) from None
    return {"delivery": None if task is None else task.delivery_status.value}


@app.get("/threads/{thread_id}")
async def thread(thread_id: str) -> dict[str, Any]:
    state = await _graph().graph.aget_state({"configurable": {"thread_id": thread_id}})
    return {"answer": state.values.get("answer"), "next": list(state.next)}


@app.get("/recovery")
async def recovery() -> dict[str, Any]:
    """What the start-up recovery found and did."""
    report: RecoveryReport = app.state.recovery
    return {
        "lost": list(report.lost),
        "resumed": list(report.resumed),
        "runs": [
            {
                "thread_id": r.thread_id,
                "invocation_id": r.invocation_id,  # the resumed run (mark its delivery)
                "recovers": r.recovers,  # the lost run's invocation id
                "outcome": r.outcome,
            }
            for r in report
        ],
    }


@app.get("/healthz")
async def healthz() -> dict[str, Any]:
    return {"ok": True, "ledger_errors": sum(_graph().stats()["errors"].values())}
