"""Async runs on a SQLite ledger write their start and end on the event loop when the ledger's
write lock is free, and on writer threads when it is not: a ledger locked by another connection
never holds up the loop, and every run is still recorded, start before end, once the lock is
released; a cancelled run is still closed ``cancelled/caller_cancelled``.

Each test holds the ledger's write lock from a connection of its own (``BEGIN IMMEDIATE``) and
releases it from a task of the event loop itself, after that task saw the loop turn many times
while the runs waited: a run that waited for the lock on the loop would leave nothing to release
it, and its write would fail at the busy timeout (the graphs are strict: the run would raise)."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.graph import START, StateGraph
from lg_helpers import State, assert_healthy, shape, tree
from task_state_guard import Ledger
from task_state_guard_langgraph import guard

pytestmark = pytest.mark.sqlite_only(
    reason="another connection holds the SQLite file's write lock")

#: How long a blocked write on a writer thread may wait for the lock (the lock is held far
#: shorter: until the loop has turned TURNS times).
BUSY_TIMEOUT_MS = 30000
#: Turns of the event loop seen while the runs wait for the lock, before it is released.
TURNS = 200
OK = ("succeeded", "worker_completed", ())


class WriteLock:
    """The ledger's write lock, held by a connection of the test's own (opened once the
    ledger exists)."""

    def __init__(self, db: str) -> None:
        self._db = db
        self._conn: sqlite3.Connection | None = None

    def take(self) -> None:
        if self._conn is None:
            self._conn = sqlite3.connect(self._db, isolation_level=None,
                                         timeout=BUSY_TIMEOUT_MS / 1000)
        self._conn.execute("BEGIN IMMEDIATE")

    def release(self) -> None:
        assert self._conn is not None
        self._conn.execute("COMMIT")

    def close(self) -> None:
        if self._conn is not None:
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
            self._conn.close()


@pytest.fixture
def lock(db: str) -> Iterator[WriteLock]:
    held = WriteLock(db)
    try:
        yield held
    finally:
        held.close()


def _status(db: str, task_id: str) -> str | None:
    """The committed status of ``task_id``, read by another connection (a WAL reader is never
    blocked by the writer)."""
    conn = sqlite3.connect(db)
    try:
        row = conn.execute("SELECT status FROM tsg_tasks WHERE id = ?", (task_id,)).fetchone()
    finally:
        conn.close()
    return None if row is None else str(row[0])


def _graph(
    db: str, saver: Any, gate: dict[str, asyncio.Event] | None = None
) -> tuple[Any, dict[str, bool]]:
    """A guarded first -> second, and whether each invocation was a committed running record
    when its ``first`` ran; with ``gate``, ``first`` sets ``gate["in"]`` and waits for
    ``gate["go"]``."""
    running: dict[str, bool] = {}

    async def first(state: State, config: RunnableConfig) -> dict[str, Any]:
        rid = str(config["metadata"]["tsg_invocation_id"])
        running[rid] = _status(db, app.logical_task_id(rid)) == "running"
        if gate is not None:
            gate["in"].set()
            await gate["go"].wait()
        return {"log": ["first"]}

    async def second(state: State) -> dict[str, Any]:
        return {"log": ["second"]}

    builder = StateGraph(State)
    builder.add_node("first", first)
    builder.add_node("second", second)
    builder.add_edge(START, "first")
    builder.add_edge("first", "second")
    app = guard(builder.compile(checkpointer=saver), db=db, strict=True,
                busy_timeout_ms=BUSY_TIMEOUT_MS)
    return app, running


async def _turns(count: int, pending: list[asyncio.Task[Any]]) -> None:
    """Let the loop turn ``count`` times, each time checking the runs still wait."""
    for _ in range(count):
        await asyncio.sleep(0)
        assert not any(task.done() for task in pending), "a run did not wait for the lock"


def _recorded(ledger: Ledger, app: Any, rid: str) -> tuple[Any, ...]:
    return shape(tree(ledger, app.logical_task_id(rid)))


def _start_before_end(ledger: Ledger, task_id: str) -> None:
    task = ledger.get_task(task_id)
    assert task.started_at is not None and task.ended_at is not None
    assert task.started_at <= task.ended_at
    kinds = [e.kind for e in ledger.events_of(task_id)]
    assert kinds.index("created") <= kinds.index("started") < kinds.index("closed"), kinds


def test_runs_started_while_the_ledger_is_locked_complete_once_it_is_released(
    db: str, work: Path, apps: list[Any], lock: WriteLock
) -> None:
    async def main() -> tuple[Any, dict[str, bool]]:
        async with AsyncSqliteSaver.from_conn_string(str(work / "acp.sqlite")) as saver:
            app, running = _graph(db, saver)
            apps.append(app)
            # The ledger is open and written from the loop before the lock is taken.
            await app.ainvoke({"log": []}, {"configurable": {"thread_id": "w"}},
                              invocation_id="warm")
            lock.take()

            async def streamed(rid: str) -> list[Any]:
                cfg = {"configurable": {"thread_id": rid}}
                return [c async for c in app.astream({"log": []}, cfg, invocation_id=rid)]

            runs = [
                asyncio.create_task(app.ainvoke({"log": []}, {"configurable": {"thread_id": r}},
                                                invocation_id=r))
                for r in ("l-1", "l-2")
            ] + [asyncio.create_task(streamed("l-3"))]
            await _turns(TURNS, runs)
            # Still nothing of them in the ledger: their starts wait for the lock.
            assert [_status(db, app.logical_task_id(r)) for r in ("l-1", "l-2", "l-3")] == [
                None, None, None]
            lock.release()
            done = await asyncio.gather(*runs)
            assert [d["log"] for d in done[:2]] == [["first", "second"]] * 2
            assert [next(iter(c)) for c in done[2]] == ["first", "second"]
            assert app.stats()["errors"] == {}
            return app, running

    app, running = asyncio.run(main())
    ledger = app.ledger
    for rid in ("warm", "l-1", "l-2", "l-3"):
        assert running[rid] is True, rid
        assert _recorded(ledger, app, rid) == (
            "LangGraph", "succeeded", "completed", (("first", *OK), ("second", *OK))), rid
        _start_before_end(ledger, app.logical_task_id(rid))
    assert_healthy(ledger)


def test_a_run_that_ends_while_the_ledger_is_locked_is_closed_once_it_is_released(
    db: str, work: Path, apps: list[Any], lock: WriteLock
) -> None:
    async def main() -> Any:
        gate = {"in": asyncio.Event(), "go": asyncio.Event()}
        async with AsyncSqliteSaver.from_conn_string(str(work / "acp.sqlite")) as saver:
            app, _ = _graph(db, saver, gate)
            apps.append(app)
            run = asyncio.create_task(app.ainvoke(
                {"log": []}, {"configurable": {"thread_id": "e"}}, invocation_id="e-1"))
            await asyncio.wait_for(gate["in"].wait(), 30)
            # Started (written on the loop: the ledger was free), now locked until its end.
            assert _status(db, app.logical_task_id("e-1")) == "running"
            lock.take()
            gate["go"].set()
            await _turns(TURNS, [run])
            assert _status(db, app.logical_task_id("e-1")) == "running"
            lock.release()
            assert (await run)["log"] == ["first", "second"]
            assert app.stats()["errors"] == {}
            return app

    app = asyncio.run(main())
    ledger = app.ledger
    assert _recorded(ledger, app, "e-1") == (
        "LangGraph", "succeeded", "completed", (("first", *OK), ("second", *OK)))
    _start_before_end(ledger, app.logical_task_id("e-1"))
    assert_healthy(ledger)


@pytest.mark.parametrize("locked", [False, True], ids=["free", "locked"])
def test_a_cancelled_run_is_closed_cancelled_whether_the_ledger_is_locked_or_not(
    db: str, work: Path, apps: list[Any], lock: WriteLock, locked: bool
) -> None:
    async def main() -> Any:
        gate = {"in": asyncio.Event(), "go": asyncio.Event()}
        async with AsyncSqliteSaver.from_conn_string(str(work / "acp.sqlite")) as saver:
            app, _ = _graph(db, saver, gate)
            apps.append(app)
            run = asyncio.create_task(app.ainvoke(
                {"log": []}, {"configurable": {"thread_id": "c"}}, invocation_id="c-1"))
            await asyncio.wait_for(gate["in"].wait(), 30)
            if locked:
                lock.take()
            run.cancel()
            if locked:
                # The close waits for the lock on a writer thread; the caller that waits for
                # it is cancelled once more (a server's cancel scope does so), and the loop
                # turns on.
                for _ in range(TURNS):
                    await asyncio.sleep(0)
                    if not run.done():
                        run.cancel()
                assert _status(db, app.logical_task_id("c-1")) == "running"
                lock.release()
            with pytest.raises(asyncio.CancelledError):
                await run
            task_id = app.logical_task_id("c-1")
            for _ in range(30000):  # the close lands once the writer thread has the lock
                if _status(db, task_id) != "running":
                    break
                await asyncio.sleep(0.001)
            assert app.stats()["errors"] == {}
            return app

    app = asyncio.run(main())
    ledger = app.ledger
    assert _recorded(ledger, app, "c-1") == (
        "LangGraph", "cancelled", "caller_cancelled",
        (("first", "cancelled", "caller_cancelled", ()),))
    _start_before_end(ledger, app.logical_task_id("c-1"))
    assert_healthy(ledger)
