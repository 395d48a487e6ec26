"""Async runs write the ledger in lanes, one per invocation: a write that waits for a lock held
by another transaction holds up its own invocation only, never an unrelated request (a real
PostgreSQL ledger; a row lock taken by another connection)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any, TypedDict

import psycopg
import pytest
from langgraph.graph import START, StateGraph
from lg_helpers import assert_healthy
from task_state_guard import Ledger
from task_state_guard_langgraph import guard, logical_task_id


class Gated(TypedDict):
    gate: str


def _hold_row(url: str, task_id: str, pid: list[int], locked: threading.Event,
              release: threading.Event) -> None:
    base, _, query = url.partition("?")
    schema = query.split("schema=", 1)[1].split("&", 1)[0]
    with psycopg.connect(base) as conn:
        pid.append(int(conn.execute("SELECT pg_backend_pid()").fetchone()[0]))  # type: ignore[index]
        conn.execute(f'SELECT 1 FROM "{schema}".tsg_tasks WHERE id = %s FOR UPDATE', (task_id,))
        locked.set()
        release.wait(60)


def _blocking(url: str, pid: int) -> int:
    with psycopg.connect(url.partition("?")[0]) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))", (pid,)
        ).fetchone()
    return int(row[0]) if row else 0


@pytest.mark.postgresql_only
def test_a_blocked_write_holds_up_its_own_invocation_only(backend: str, pg_url: str) -> None:
    gates: dict[str, asyncio.Event] = {}
    entered: dict[str, asyncio.Event] = {}

    async def wait(state: Gated) -> dict[str, Any]:
        entered[state["gate"]].set()
        await gates[state["gate"]].wait()
        return {}

    builder = StateGraph(Gated)
    builder.add_node("wait", wait)
    builder.add_edge(START, "wait")
    app = guard(builder.compile(), db=pg_url, strict=True, busy_timeout_ms=60000)
    locked, release = threading.Event(), threading.Event()
    pid: list[int] = []

    async def main() -> None:
        for name in ("a", "b"):
            gates[name], entered[name] = asyncio.Event(), asyncio.Event()
        first = asyncio.ensure_future(app.ainvoke({"gate": "a"}, invocation_id="lane-a"))
        await entered["a"].wait()
        holder = threading.Thread(target=_hold_row, args=(
            pg_url, logical_task_id("lane-a"), pid, locked, release))
        holder.start()
        try:
            assert await asyncio.to_thread(locked.wait, 30)
            gates["a"].set()  # run a ends: its close waits for the row lock
            while not await asyncio.to_thread(_blocking, pg_url, pid[0]):
                await asyncio.sleep(0.05)
            # An unrelated request runs and is recorded meanwhile.
            gates["b"].set()
            await asyncio.wait_for(
                app.ainvoke({"gate": "b"}, invocation_id="lane-b"), timeout=30)
            assert not first.done()
            with Ledger(pg_url) as ledger:
                assert str(ledger.get_task(logical_task_id("lane-b")).status) == "succeeded"
                assert str(ledger.get_task(logical_task_id("lane-a")).status) == "running"
        finally:
            release.set()
            await asyncio.to_thread(holder.join, 30)
        await first

    try:
        asyncio.run(main())
        with Ledger(pg_url) as ledger:
            assert str(ledger.get_task(logical_task_id("lane-a")).status) == "succeeded"
            assert_healthy(ledger)
        assert app.stats()["errors"] == {}
    finally:
        app.close()


def _hold_rows(url: str, task_ids: list[str], pid: list[int], locked: threading.Event,
               release: threading.Event) -> None:
    base, _, query = url.partition("?")
    schema = query.split("schema=", 1)[1].split("&", 1)[0]
    with psycopg.connect(base) as conn:
        pid.append(int(conn.execute("SELECT pg_backend_pid()").fetchone()[0]))  # type: ignore[index]
        conn.execute(f'SELECT 1 FROM "{schema}".tsg_tasks WHERE id = ANY(%s) FOR UPDATE',
                     (task_ids,))
        locked.set()
        release.wait(60)


@pytest.mark.postgresql_only
def test_many_blocked_runs_never_hold_up_an_unrelated_request(backend: str, pg_url: str) -> None:
    # More runs blocked at once than a small fixed pool of writer threads would hold: each
    # blocked run waits on a connection of its own, and an unrelated request still runs.
    blocked = [f"lane-{i}" for i in range(6)]
    gates = {name: asyncio.Event() for name in [*blocked, "free"]}
    entered = {name: asyncio.Event() for name in gates}

    async def wait(state: Gated) -> dict[str, Any]:
        entered[state["gate"]].set()
        await gates[state["gate"]].wait()
        return {}

    builder = StateGraph(Gated)
    builder.add_node("wait", wait)
    builder.add_edge(START, "wait")
    app = guard(builder.compile(), db=pg_url, strict=True, busy_timeout_ms=60000)
    locked, release = threading.Event(), threading.Event()
    pid: list[int] = []

    async def main() -> None:
        runs = [asyncio.ensure_future(app.ainvoke({"gate": name}, invocation_id=name))
                for name in blocked]
        for name in blocked:
            await entered[name].wait()
        holder = threading.Thread(target=_hold_rows, args=(
            pg_url, [logical_task_id(name) for name in blocked], pid, locked, release))
        holder.start()
        try:
            assert await asyncio.to_thread(locked.wait, 30)
            for name in blocked:
                gates[name].set()  # each run ends: its close waits for the row lock
            deadline = asyncio.get_running_loop().time() + 30
            while await asyncio.to_thread(_blocking, pg_url, pid[0]) < len(blocked):
                assert asyncio.get_running_loop().time() < deadline, "closes not all waiting"
                await asyncio.sleep(0.05)
            gates["free"].set()
            await asyncio.wait_for(app.ainvoke({"gate": "free"}, invocation_id="free"),
                                   timeout=30)
            assert not any(run.done() for run in runs)
            with Ledger(pg_url) as ledger:
                assert str(ledger.get_task(logical_task_id("free")).status) == "succeeded"
                for name in blocked:
                    assert str(ledger.get_task(logical_task_id(name)).status) == "running"
        finally:
            release.set()
            await asyncio.to_thread(holder.join, 30)
        await asyncio.gather(*runs)

    try:
        asyncio.run(main())
        with Ledger(pg_url) as ledger:
            for name in blocked:
                assert str(ledger.get_task(logical_task_id(name)).status) == "succeeded"
            assert_healthy(ledger)
        assert app.stats()["errors"] == {}
    finally:
        app.close()
