"""A guarded graph on a PostgreSQL ledger holds at most two more PostgreSQL sessions than the
same graph unguarded, however many runs are in flight: 20 concurrent async runs on an
``AsyncPostgresSaver`` (its pool in the same process, the same ``application_name``), and 20
threads invoking a sync graph at once. Sessions are counted by ``pg_stat_activity``."""

from __future__ import annotations

import asyncio
import threading
from typing import Any, TypedDict

import pytest
from langgraph.graph import END, START, StateGraph
from lg_procs import checkpoint_database
from pg_sessions import PeakSessions, session_name
from task_state_guard import Ledger
from task_state_guard_langgraph import guard, logical_task_id

CONCURRENT = 20
WAVES = 2
POOL = 5


class Question(TypedDict, total=False):
    question: str
    notes: str
    answer: str


def _build(together: Any, checkpointer: Any = None) -> Any:
    """``plan -> gather -> answer``; ``gather`` waits until every run in flight reached it."""

    def plan(state: Question) -> dict[str, Any]:
        return {"notes": state["question"].lower()}

    def answer(state: Question) -> dict[str, Any]:
        return {"answer": state["notes"].upper()}

    builder = StateGraph(Question)
    builder.add_node("plan", plan)
    builder.add_node("gather", together)
    builder.add_node("answer", answer)
    builder.add_edge(START, "plan")
    builder.add_edge("plan", "gather")
    builder.add_edge("gather", "answer")
    builder.add_edge("answer", END)
    return builder.compile(checkpointer=checkpointer)


async def _peak_async(checkpoints: str, name: str, db: str | None) -> tuple[int, list[str]]:
    """The most sessions of ``name`` seen while ``WAVES`` waves of ``CONCURRENT`` runs ran
    on a pooled ``AsyncPostgresSaver``, guarded with ledger ``db`` when given; the ids of the
    invocations."""
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
    from psycopg.rows import dict_row
    from psycopg_pool import AsyncConnectionPool

    pool = AsyncConnectionPool(
        f"{checkpoints}?application_name={name}",
        min_size=POOL,
        max_size=POOL,
        open=False,
        kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row},
    )
    await pool.open(wait=True)
    arrived = {"n": 0}
    everyone = asyncio.Event()

    async def gather(state: Question) -> dict[str, Any]:
        arrived["n"] += 1
        if arrived["n"] % CONCURRENT == 0:
            everyone.set()
        await asyncio.wait_for(everyone.wait(), 60)
        await asyncio.sleep(0.01)
        return {"notes": state["notes"] + " gathered"}

    graph = _build(gather, AsyncPostgresSaver(pool))  # type: ignore[arg-type]
    app = guard(graph, db=db, strict=True) if db else graph
    ids: list[str] = []
    try:
        with PeakSessions(name) as seen:
            for wave in range(WAVES):
                everyone.clear()
                runs = []
                for i in range(CONCURRENT):
                    config = {"configurable": {"thread_id": f"t-{wave}-{i}"}}
                    if db:
                        ids.append(f"conn-{wave}-{i}")
                        runs.append(
                            app.ainvoke({"question": "Why?"}, config, invocation_id=ids[-1])
                        )
                    else:
                        runs.append(app.ainvoke({"question": "Why?"}, config))
                outs = await asyncio.gather(*runs)
                assert [o["answer"] for o in outs] == ["WHY? GATHERED"] * CONCURRENT
        assert seen.samples > 10
        if db:
            assert app.stats()["errors"] == {}
        return seen.peak, ids
    finally:
        if db:
            app.close()
        await pool.close()


@pytest.mark.postgresql_only
def test_concurrent_async_runs_add_at_most_two_sessions(backend: str, pg_url: str) -> None:
    name = session_name()
    with checkpoint_database() as checkpoints:
        plain, _ = asyncio.run(_peak_async(checkpoints, name, None))
        guarded, ids = asyncio.run(
            _peak_async(checkpoints, name, f"{pg_url}&application_name={name}")
        )
    assert plain == POOL
    assert guarded <= plain + 2, (plain, guarded)
    with Ledger(pg_url) as ledger:
        assert {str(ledger.get_task(logical_task_id(i)).status) for i in ids} == {"succeeded"}
        assert len(ids) == CONCURRENT * WAVES


@pytest.mark.postgresql_only
def test_concurrent_sync_runs_on_threads_add_at_most_two_sessions(
    backend: str, pg_url: str
) -> None:
    name = session_name()
    barrier = threading.Barrier(CONCURRENT)

    def gather(state: Question) -> dict[str, Any]:
        barrier.wait(60)  # every run in flight at once
        return {"notes": state["notes"] + " gathered"}

    app = guard(_build(gather), db=f"{pg_url}&application_name={name}", strict=True)
    errors: list[BaseException] = []

    def run(rid: str) -> None:
        try:
            out = app.invoke({"question": "Why?"}, invocation_id=rid)
            assert out["answer"] == "WHY? GATHERED"
        except BaseException as exc:  # reported below
            errors.append(exc)

    try:
        with PeakSessions(name) as seen:
            for wave in range(WAVES):
                threads = [
                    threading.Thread(target=run, args=(f"sync-{wave}-{i}",))
                    for i in range(CONCURRENT)
                ]
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join(120)
        assert errors == []
        assert app.stats()["errors"] == {}
    finally:
        app.close()
    assert seen.samples > 10
    assert 1 <= seen.peak <= 2  # unguarded, this graph holds no PostgreSQL session at all
    with Ledger(pg_url) as ledger:
        assert {
            str(ledger.get_task(logical_task_id(f"sync-{w}-{i}")).status)
            for w in range(WAVES)
            for i in range(CONCURRENT)
        } == {"succeeded"}
