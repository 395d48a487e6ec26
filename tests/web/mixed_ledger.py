"""The ledger the browser tests load: real Celery, Dramatiq and LangGraph work, with a Celery
worker SIGKILLed mid-job (built by the adapters' own test harnesses)."""

from __future__ import annotations

import dataclasses
import socket
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass(frozen=True)
class MixedLedger:
    """The ledger's path and the jobs the frameworks ran into it (framework ids, as the
    operator holds them)."""

    db: str
    celery_ok: str
    celery_lost: str
    dramatiq_ok: str
    langgraph_ok: str
    celery_lost_ledger_id: str


def require_redis() -> None:
    """Fail (never skip) when Redis is not at 127.0.0.1:6379."""
    try:
        socket.create_connection(("127.0.0.1", 6379), timeout=2).close()
    except OSError as exc:
        pytest.fail(f"Redis is required at 127.0.0.1:6379: {exc!r}")


def dramatiq_job(db: Path, tmp: Path) -> str:
    """Run one Dramatiq message to success on a real worker; its message id."""
    from _dramatiq_helpers import BrokerEnv, CliWorker, Producer, wait_closed
    from task_state_guard import Ledger

    env = dataclasses.replace(BrokerEnv.new("redis", tmp), db=db)
    worker = CliWorker(env, processes=1, threads=1).start()
    producer = Producer(env)
    try:
        message_id = producer.send("ok")
        with Ledger(str(db)) as ledger:
            wait_closed(ledger, message_id)
        return message_id
    finally:
        producer.close()
        worker.stop()
        env.cleanup()


def langgraph_job(db: Path) -> str:
    """Run one guarded LangGraph invocation; its invocation id."""
    from typing import TypedDict

    from langgraph.graph import START, StateGraph
    from task_state_guard_langgraph import guard

    class State(TypedDict):
        steps: int

    def plan(state: State) -> dict[str, int]:
        return {"steps": state["steps"] + 1}

    builder = StateGraph(State)
    builder.add_node("plan", plan)
    builder.add_edge(START, "plan")
    graph = guard(builder.compile(name="agent_planner"), db=str(db))
    invocation = f"web-{uuid.uuid4().hex[:12]}"
    try:
        graph.invoke({"steps": 0}, invocation_id=invocation)
    finally:
        graph.uninstall()
    return invocation


