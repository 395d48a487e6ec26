"""A FastAPI service answering questions with a LangGraph graph recorded in the ledger.

    TSG_DB=/data/tsg/tasks.sqlite CHECKPOINTS=/data/lg/checkpoints.sqlite \
        uvicorn service:app --host 0.0.0.0 --port 8000

At start-up (``lifespan``) the graph is guarded: the guard reconciles the ledger (the tasks of
a killed process become ``timed_out/owner_lost``) and ``start_recovery()`` resumes, in the
background, the threads those runs (or a drain) left unfinished: the server answers at once.
A resumed run's answer is owed to whoever asked the lost run: the service keeps it with the
thread (``GET /threads/<id>`` shows it with the invocation to acknowledge) until the client
acknowledges it (``POST /invocations/<id>/delivered``).

On SIGTERM (``drain_on_signals``, installed in ``lifespan`` in front of uvicorn's own handler)
every question in flight stops at its next step boundary and answers 503 with its thread: the
next start resumes it, and its answer waits with the thread like any resumed run's. Run uvicorn
with a ``--timeout-graceful-shutdown`` longer than your slowest node.
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
from langgraph.errors import GraphDrained
from pydantic import BaseModel
from task_state_guard import StateConflict, TaskNotFound
from task_state_guard_langgraph import (
    GuardedGraph,
    LostTask,
    Recovery,
    RecoveryReport,
    RecoveryRunner,
    drain_on_signals,
    guard,
)

log = logging.getLogger("research")


class Question(BaseModel):
    thread_id: str
    question: str


#: thread id -> invocation id of a resumed run whose answer the client has not acknowledged.
owed: dict[str, str] = {}


def on_lost(lost: LostTask) -> None:
    log.warning("run lost (%s): resuming thread %s", lost.code, lost.thread_id)


def on_recovered(recovery: Recovery) -> None:
    """A resumed run ended: its answer waits with the thread for the client to fetch."""
    owed[recovery.thread_id] = recovery.invocation_id
    log.info("resumed run %s: thread %s", recovery.outcome, recovery.thread_id)


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    checkpoints = Path(os.environ.get("CHECKPOINTS", "/data/lg/checkpoints.sqlite"))
    checkpoints.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    async with AsyncSqliteSaver.from_conn_string(str(checkpoints)) as saver:
        # db: TSG_DB from the environment. Creating the guard reconciles the ledger.
        graph = guard(build(saver), on_lost=on_lost, on_recovered=on_recovered)
        app.state.graph = graph
        # Recovery runs beside serving (and again every TSG_RECONCILE_INTERVAL_SECONDS).
        app.state.recovery = graph.start_recovery()
        # SIGTERM drains the questions in flight (uvicorn runs this shutdown only after them).
        restore_signals = drain_on_signals(graph)
        try:
            yield
        finally:
            restore_signals()
            # Resumed runs still going drain at their next step (the next start resumes them).
            await graph.aclose(timeout=20)


app = FastAPI(lifespan=lifespan)


def _graph() -> GuardedGraph:
    graph: GuardedGraph = app.state.graph
    return graph


@app.post("/questions")
async def ask(body: Question) -> dict[str, Any]:
    invocation_id = f"req-{uuid.uuid4().hex}"
    config = {"configurable": {"thread_id": body.thread_id}}
    try:
        out = await _graph().ainvoke(
            {"question": body.question}, config, invocation_id=invocation_id
        )
    except GraphDrained:
        # The server is stopping: the next start resumes the thread; fetch its answer there.
        raise HTTPException(status_code=503, detail={"thread_id": body.thread_id}) from None
    return {"invocation_id": invocation_id, "answer": out["answer"]}


@app.post("/invocations/{invocation_id}/delivered")
async def delivered(invocation_id: str) -> dict[str, Any]:
    """The client confirms it showed the answer: the invocation's delivery is closed."""
    try:
        task = await _graph().amark_delivered(invocation_id)
    except (TaskNotFound, StateConflict) as exc:
        raise HTTPException(status_code=409, detail=type(exc).__name__) from None
    for thread_id, owed_id in list(owed.items()):
        if owed_id == invocation_id:
            del owed[thread_id]
    return {"delivery": None if task is None else task.delivery_status.value}


@app.get("/threads/{thread_id}")
async def thread(thread_id: str) -> dict[str, Any]:
    """The thread's answer; ``owed``: the resumed run whose answer this is, to acknowledge."""
    state = await _graph().graph.aget_state({"configurable": {"thread_id": thread_id}})
    return {"answer": state.values.get("answer"), "next": list(state.next),
            "owed": owed.get(thread_id)}


@app.get("/recovery")
async def recovery() -> dict[str, Any]:
    """Background recovery: whether a pass runs now, and what the last finished one did."""
    runner: RecoveryRunner = app.state.recovery
    report = runner.report or RecoveryReport()  # none before the first pass ends
    return {
        "running": runner.running,
        "passes": runner.passes,
        "lost": report.lost,
        "resumed": report.resumed,
        "cancelled": report.cancelled,
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
