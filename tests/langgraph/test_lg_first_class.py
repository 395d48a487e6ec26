"""The guarded graph where a compiled graph is used: every stream mode (sync and async),
astream_events, batch/abatch, with_config, and a subgraph through the supported pattern."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.config import get_stream_writer
from langgraph.graph import START, StateGraph
from lg_helpers import State, assert_healthy, shape, tree
from task_state_guard_langgraph import guard

MODES = ["values", "updates", "checkpoints", "tasks", "debug", "messages", "custom"]
OK = ("succeeded", "worker_completed", ())
RECORDED = ("LangGraph", "succeeded", "completed", (("a", *OK), ("b", *OK)))


class Boom(Exception):
    pass


def _builder() -> StateGraph[Any]:
    def a(state: State) -> dict[str, Any]:
        get_stream_writer()({"custom": "a"})
        if state.get("answer") == "boom":
            raise Boom()
        return {"log": ["a"]}

    def b(state: State) -> dict[str, Any]:
        return {"log": ["b"]}

    builder = StateGraph(State)
    builder.add_node("a", a)
    builder.add_node("b", b)
    builder.add_edge(START, "a")
    builder.add_edge("a", "b")
    return builder


def _strip(chunk: Any) -> Any:
    # Checkpoint/debug/task payloads carry ids, timestamps and config that differ per run.
    if isinstance(chunk, tuple):
        return tuple(_strip(c) for c in chunk)
    if isinstance(chunk, dict):
        if "type" in chunk and "payload" in chunk:  # debug
            return chunk["type"]
        return {k: _strip(v) for k, v in chunk.items()
                if k not in ("id", "config", "parent_config", "metadata", "next", "tasks",
                             "timestamp", "step", "created_at")}
    return chunk


@pytest.mark.parametrize("mode", [*MODES, MODES])
def test_stream_every_mode(db: str, apps: list[Any], mode: Any) -> None:
    graph = _builder().compile(checkpointer=InMemorySaver())
    app = guard(graph, db=db, strict=True)
    apps.append(app)
    plain = list(graph.stream({"log": []}, {"configurable": {"thread_id": "p"}},
                              stream_mode=mode))
    got = list(app.stream({"log": []}, {"configurable": {"thread_id": "g"}},
                          invocation_id="g", stream_mode=mode))
    assert [_strip(c) for c in got] == [_strip(c) for c in plain]
    assert shape(tree(app.ledger, app.logical_task_id("g"))) == RECORDED
    assert_healthy(app.ledger)


@pytest.mark.parametrize("mode", [*MODES, MODES])
def test_astream_every_mode(db: str, apps: list[Any], mode: Any) -> None:
    graph = _builder().compile(checkpointer=InMemorySaver())
    app = guard(graph, db=db, strict=True)
    apps.append(app)

    async def main() -> tuple[list[Any], list[Any]]:
        plain = [c async for c in graph.astream(
            {"log": []}, {"configurable": {"thread_id": "p"}}, stream_mode=mode)]
        got = [c async for c in app.astream(
            {"log": []}, {"configurable": {"thread_id": "g"}}, invocation_id="g",
            stream_mode=mode)]
        return plain, got

    plain, got = asyncio.run(main())
    assert [_strip(c) for c in got] == [_strip(c) for c in plain]
    assert shape(tree(app.ledger, app.logical_task_id("g"))) == RECORDED


def test_astream_events(db: str, apps: list[Any]) -> None:
    graph = _builder().compile()
    app = guard(graph, db=db, strict=True)
    apps.append(app)

    async def main() -> tuple[list[Any], list[Any]]:
        plain = [(e["event"], e["name"]) async for e in graph.astream_events({"log": []})]
        got = [(e["event"], e["name"])
               async for e in app.astream_events({"log": []}, invocation_id="ev")]
        return plain, got

    plain, got = asyncio.run(main())
    assert got == plain
    assert ("on_chain_start", "a") in got
    assert shape(tree(app.ledger, app.logical_task_id("ev"))) == RECORDED


def test_batch_and_abatch(db: str, apps: list[Any]) -> None:
    app = guard(_builder().compile(), db=db, strict=True)
    apps.append(app)
    inputs = [{"log": []}, {"log": [], "answer": "boom"}, {"log": []}]
    out = app.batch(inputs, invocation_ids=["b0", "b1", "b2"], return_exceptions=True)
    assert out[0]["log"] == out[2]["log"] == ["a", "b"]
    assert isinstance(out[1], Boom)
    with pytest.raises(Boom):
        app.batch(inputs, invocation_ids=["c0", "c1", "c2"])
    aout = asyncio.run(app.abatch(inputs, {"max_concurrency": 2},
                                  invocation_ids=["d0", "d1", "d2"], return_exceptions=True))
    assert isinstance(aout[1], Boom) and aout[0]["log"] == ["a", "b"]
    failed = ("LangGraph", "failed", "worker_failed", (("a", "failed", "worker_failed", ()),))
    for prefix in ("b", "d"):
        assert shape(tree(app.ledger, app.logical_task_id(f"{prefix}0"))) == RECORDED
        assert shape(tree(app.ledger, app.logical_task_id(f"{prefix}1"))) == failed
        assert shape(tree(app.ledger, app.logical_task_id(f"{prefix}2"))) == RECORDED
    with pytest.raises(ValueError, match="one invocation id per input"):
        app.batch(inputs, invocation_ids=["x"])
    assert_healthy(app.ledger)


def test_with_config(db: str, apps: list[Any]) -> None:
    saver = InMemorySaver()
    app = guard(_builder().compile(checkpointer=saver), db=db, strict=True)
    apps.append(app)
    bound = app.with_config({"configurable": {"thread_id": "bound"}}, tags=["t1"])
    assert bound.invoke({"log": []}, invocation_id="w1")["log"] == ["a", "b"]
    # The bound thread got the checkpoints; the call was recorded.
    assert app.get_state({"configurable": {"thread_id": "bound"}}).values["log"] == ["a", "b"]
    assert shape(tree(app.ledger, app.logical_task_id("w1"))) == RECORDED
    out = asyncio.run(bound.ainvoke({"log": []}, invocation_id="w2"))
    assert out["log"] == ["a", "b", "a", "b"]  # same bound thread
    assert shape(tree(app.ledger, app.logical_task_id("w2"))) == RECORDED
    assert app.last_invocation_id != "w1"  # the bound copy keeps its own per-thread state


def test_subgraph_pattern(db: str, apps: list[Any]) -> None:
    # Supported pattern: the guarded graph's compiled graph (``app.graph``) is the subgraph;
    # the outer guarded graph records its nodes under the attempt of the node that runs it.
    inner = guard(_builder().compile(), db=db, strict=True)
    apps.append(inner)
    outer_builder = StateGraph(State)
    outer_builder.add_node("inner", inner.graph)
    outer_builder.add_edge(START, "inner")
    outer = guard(outer_builder.compile(), db=db, strict=True)
    apps.append(outer)
    assert outer.invoke({"log": []}, invocation_id="o1")["log"] == ["a", "b"]
    assert shape(tree(outer.ledger, outer.logical_task_id("o1"))) == (
        "LangGraph", "succeeded", "completed",
        (("inner", "succeeded", "worker_completed", (("a", *OK), ("b", *OK))),),
    )


def test_bound_handler_records_every_call(db: str) -> None:
    # For hosts that only accept a compiled graph: the handler bound with with_config records
    # each invocation (sync and async), keyed by the root callback run id.
    from langchain_core.tracers.context import collect_runs
    from task_state_guard import Ledger
    from task_state_guard_langgraph import (
        AsyncGuardCallbackHandler,
        GuardCallbackHandler,
        logical_task_id,
    )

    compiled = _builder().compile()
    with Ledger(db) as ledger:
        sync_graph = compiled.with_config(
            callbacks=[GuardCallbackHandler(ledger, graph=compiled, heartbeat_seconds=0)]
        )
        async_graph = compiled.with_config(
            callbacks=[AsyncGuardCallbackHandler(ledger, graph=compiled, heartbeat_seconds=0)]
        )
        with collect_runs() as runs:
            sync_graph.invoke({"log": []})
            asyncio.run(async_graph.ainvoke({"log": []}))
        roots = [r for r in runs.traced_runs if r.parent_run_id is None]
        assert len(roots) == 2
        for root in roots:
            assert shape(tree(ledger, logical_task_id(str(root.id)))) == RECORDED
        assert_healthy(ledger)


def test_the_readme_names_what_is_wrapped_and_what_is_not() -> None:
    """The package README lists the wrapped entry points and the compiled graph's others, which
    pass through unrecorded; both lists match the class."""
    from pathlib import Path

    from task_state_guard_langgraph import GuardedGraph

    readme = (Path(__file__).resolve().parents[2] / "packages" / "adapter-langgraph"
              / "README.md").read_text()
    wrapped = ("invoke", "ainvoke", "stream", "astream", "astream_events", "batch", "abatch",
               "with_config")
    passed_through = ("stream_events", "astream_log", "batch_as_completed",
                      "abatch_as_completed", "transform", "atransform")
    for name in wrapped:
        assert any(name in vars(b) for b in GuardedGraph.__mro__)
        assert f"`{name}`" in readme
    compiled = _builder().compile()
    for name in passed_through:
        assert hasattr(compiled, name) and not any(name in vars(b) for b in GuardedGraph.__mro__)
        assert f"`{name}`" in readme
    assert "are not wrapped; call them on `app.graph`" not in readme
