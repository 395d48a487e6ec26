"""Async graphs: ainvoke, astream, cancellation."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.graph import START, StateGraph
from langgraph.types import Command, RetryPolicy, interrupt
from lg_helpers import State, assert_healthy, shape, tree
from task_state_guard_langgraph import guard


class Flaky(Exception):
    pass


def _builder(started: asyncio.Event | None = None, release: asyncio.Event | None = None) -> Any:
    calls = {"n": 0}

    async def fetch(state: State) -> dict[str, Any]:
        await asyncio.sleep(0)
        return {"log": ["fetch"]}

    async def flaky(state: State) -> dict[str, Any]:
        calls["n"] += 1
        if calls["n"] <= 2:
            raise Flaky()
        return {"log": ["flaky"]}

    async def wait(state: State) -> dict[str, Any]:
        if started is not None and release is not None:
            started.set()
            await release.wait()
        return {"log": ["wait"]}

    builder = StateGraph(State)
    builder.add_node("fetch", fetch)
    builder.add_node(
        "flaky",
        flaky,
        retry_policy=RetryPolicy(max_attempts=3, initial_interval=0.01, jitter=False),
    )
    builder.add_node("wait", wait)
    builder.add_edge(START, "fetch")
    builder.add_edge("fetch", "flaky")
    builder.add_edge("flaky", "wait")
    return builder


EXPECTED = (
    "LangGraph",
    "succeeded",
    "completed",
    (
        ("fetch", "succeeded", "worker_completed", ()),
        ("flaky", "failed", "retry_scheduled", ()),
        ("flaky", "failed", "retry_scheduled", ()),
        ("flaky", "succeeded", "worker_completed", ()),
        ("wait", "succeeded", "worker_completed", ()),
    ),
)


def _sorted_shape(root: dict[str, Any]) -> tuple[Any, ...]:
    name, status, code, children = shape(root)
    order = {"fetch": 0, "flaky": 1, "wait": 2}
    return (
        name,
        status,
        code,
        tuple(sorted(children, key=lambda c: (order[c[0]], c[1] == "succeeded"))),
    )


def test_ainvoke_and_astream(db: str, work: Path, apps: list[Any]) -> None:
    async def main() -> None:
        async with AsyncSqliteSaver.from_conn_string(str(work / "acp.sqlite")) as saver:
            app = guard(_builder().compile(checkpointer=saver), db=db, strict=True)
            apps.append(app)
            out = await app.ainvoke(
                {"log": []}, {"configurable": {"thread_id": "a1"}}, invocation_id="a1"
            )
            assert out["log"] == ["fetch", "flaky", "wait"]
            assert _sorted_shape(tree(app.ledger, app.logical_task_id("a1"))) == EXPECTED

            app2 = guard(_builder().compile(checkpointer=saver), db=db, strict=True)
            apps.append(app2)
            chunks = [
                c
                async for c in app2.astream(
                    {"log": []}, {"configurable": {"thread_id": "a2"}}, invocation_id="a2"
                )
            ]
            assert [next(iter(c)) for c in chunks] == ["fetch", "flaky", "wait"]
            assert _sorted_shape(tree(app2.ledger, app2.logical_task_id("a2"))) == EXPECTED

    asyncio.run(main())
    assert_healthy(apps[0].ledger)


def test_async_interrupt_and_resume(db: str, work: Path, apps: list[Any]) -> None:
    async def ask(state: State) -> dict[str, Any]:
        return {"answer": str(interrupt("ok?"))}

    builder = StateGraph(State)
    builder.add_node("ask", ask)
    builder.add_edge(START, "ask")

    async def main() -> None:
        async with AsyncSqliteSaver.from_conn_string(str(work / "acp.sqlite")) as saver:
            app = guard(builder.compile(checkpointer=saver), db=db, strict=True)
            apps.append(app)
            cfg = {"configurable": {"thread_id": "ai"}}
            await app.ainvoke({"log": []}, cfg, invocation_id="ai-1")
            assert app.last_outcome == "interrupted"
            out = await app.ainvoke(Command(resume="yes"), cfg, invocation_id="ai-2")
            assert out["answer"] == "yes"

    asyncio.run(main())
    app = apps[0]
    first = tree(app.ledger, app.logical_task_id("ai-1"))
    assert shape(first)[:4] == (
        "LangGraph",
        "succeeded",
        "completed",
        (
            ("ask", "cancelled", "interrupted", ()),
            (
                "LangGraph",
                "succeeded",
                "completed",
                (("ask", "succeeded", "worker_completed", ()),),
            ),
        ),
    )
    assert_healthy(app.ledger)


@pytest.mark.parametrize("mode", ["ainvoke", "astream"])
def test_cancelled_async_run_ends_cancelled(
    db: str, work: Path, apps: list[Any], mode: str
) -> None:
    async def main() -> None:
        started, release = asyncio.Event(), asyncio.Event()
        async with AsyncSqliteSaver.from_conn_string(str(work / "acp.sqlite")) as saver:
            app = guard(_builder(started, release).compile(checkpointer=saver), db=db, strict=True)
            apps.append(app)
            cfg = {"configurable": {"thread_id": "c-" + mode}}

            async def run() -> None:
                if mode == "ainvoke":
                    await app.ainvoke({"log": []}, cfg, invocation_id="c1")
                else:
                    async for _ in app.astream({"log": []}, cfg, invocation_id="c1"):
                        pass

            task = asyncio.create_task(run())
            await asyncio.wait_for(started.wait(), 10)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert app.last_outcome in (None, "cancelled")

    asyncio.run(main())
    app = apps[0]
    root = tree(app.ledger, app.logical_task_id("c1"))
    assert (root["status"], root["code"]) == ("cancelled", "caller_cancelled")
    wait = [c for c in root["children"] if c["name"] == "wait"]
    assert [(c["status"], c["code"]) for c in wait] == [("cancelled", "caller_cancelled")]
    # Nothing is left running.
    assert all(c["status"] != "running" for c in root["children"])
    assert_healthy(app.ledger)
