"""Graph shared by the SIGKILL tests and their child processes (not a test module).

As a script: ``lg_crash_graph.py DB CHECKPOINTS MARKER THREAD INVOCATION [MODE]``. ``DB`` is
the ledger (a path or a ``postgresql://`` URL), ``CHECKPOINTS`` a SQLite file or a
``postgresql://`` URL (``PostgresSaver``). The ``slow`` node writes ``MARKER`` and blocks
until the test SIGKILLs the process; modes:

- (none) / ``async``: one run (``invoke`` / ``ainvoke``), killed in ``slow``;
- ``recover``: a recovery pass, its resumed run killed in ``slow`` (a crash during recovery);
- ``edit`` / ``raw-edit``: a run paused before ``slow`` (``interrupt_before``), its state
  edited through the guarded graph / the raw graph, then ``invoke(None)`` killed in ``slow``;
- ``exit``: a finished run, then a run with ``durability="exit"`` killed in ``slow``;
  ``exit-new``: the same run on a new thread;
- ``drain``: ``slow`` waits for ``MARKER.release``; SIGTERM requests a drain (the graceful
  shutdown of a LangGraph 1.2 worker), so the run stops at the next step boundary;
- ``many``: five runs at once in threads (threads ``THREAD-0..4``, invocations
  ``INVOCATION-0..4``, markers ``MARKER-0..4``), all killed in ``slow``; the fifth with
  ``durability="exit"`` (nothing of it saved: a lost run no thread leads to).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sqlite3
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.errors import GraphDrained
from langgraph.graph import START, StateGraph
from langgraph.runtime import RunControl
from lg_helpers import State


def builder(marker: str | None, *, use_async: bool = False, release: bool = False) -> StateGraph:
    """prepare -> slow -> finish; ``slow`` blocks (after writing ``marker``) when given one:
    until killed, or with ``release`` until ``marker.release`` exists."""

    def block() -> None:
        assert marker is not None
        Path(marker).write_text("in slow")
        gate = Path(marker + ".release")
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (release and gate.exists()):
            time.sleep(0.05)  # SIGKILLed here, or released

    def prepare(state: State) -> dict[str, Any]:
        return {"log": ["prepare"]}

    def slow(state: State) -> dict[str, Any]:
        if marker is not None:
            block()
        return {"log": ["slow"]}

    async def aslow(state: State) -> dict[str, Any]:
        if marker is not None:
            Path(marker).write_text("in slow")
            gate = Path(marker + ".release")
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and not (release and gate.exists()):
                await asyncio.sleep(0.05)  # SIGKILLed or cancelled here, or released
        return {"log": ["slow"]}

    def finish(state: State) -> dict[str, Any]:
        return {"log": ["finish"]}

    graph = StateGraph(State)
    graph.add_node("prepare", prepare)
    graph.add_node("slow", aslow if use_async else slow)
    graph.add_node("finish", finish)
    graph.add_edge(START, "prepare")
    graph.add_edge("prepare", "slow")
    graph.add_edge("slow", "finish")
    return graph


def build(checkpoints: str, marker: str | None) -> Any:
    """The sync graph compiled with a SqliteSaver on ``checkpoints``."""
    conn = sqlite3.connect(checkpoints, check_same_thread=False)
    return builder(marker).compile(checkpointer=SqliteSaver(conn), name="crashy")


@contextlib.contextmanager
def saver_at(checkpoints: str) -> Iterator[Any]:
    """A sync saver: ``PostgresSaver`` for a URL, else ``SqliteSaver`` on the file."""
    if checkpoints.startswith("postgresql://"):
        from langgraph.checkpoint.postgres import PostgresSaver

        with PostgresSaver.from_conn_string(checkpoints) as saver:
            yield saver  # its tables: set up once by the test (concurrent setups race)
        return
    conn = sqlite3.connect(checkpoints, check_same_thread=False)
    try:
        yield SqliteSaver(conn)
    finally:
        conn.close()


@contextlib.asynccontextmanager
async def asaver_at(checkpoints: str) -> AsyncIterator[Any]:
    """An async saver: ``AsyncPostgresSaver`` for a URL, else ``AsyncSqliteSaver``."""
    if checkpoints.startswith("postgresql://"):
        from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

        async with AsyncPostgresSaver.from_conn_string(checkpoints) as saver:
            yield saver
        return
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    async with AsyncSqliteSaver.from_conn_string(checkpoints) as saver:
        yield saver


async def _run_async(db: str, checkpoints: str, marker: str, thread: str, inv: str) -> None:
    from task_state_guard_langgraph import guard

    async with asaver_at(checkpoints) as saver:
        graph = builder(marker, use_async=True).compile(checkpointer=saver, name="crashy")
        app = guard(graph, db=db, strict=True)
        await app.ainvoke(
            {"log": []},
            {"configurable": {"thread_id": thread}},
            invocation_id=inv,
            durability="sync",
        )


def main(db: str, checkpoints: str, marker: str, thread_id: str, inv: str, mode: str) -> None:
    from task_state_guard_langgraph import guard

    if mode == "async":
        asyncio.run(_run_async(db, checkpoints, marker, thread_id, inv))
        raise SystemExit("unreachable: the node blocks until SIGKILL")
    cfg = {"configurable": {"thread_id": thread_id}}
    with saver_at(checkpoints) as saver:
        def app_for(slow_marker: str | None, release: bool = False) -> Any:
            graph = builder(slow_marker, release=release).compile(
                checkpointer=saver, name="crashy"
            )
            return guard(graph, db=db, strict=True)

        app = app_for(marker, release=mode == "drain")
        if mode == "recover":
            app.recover(durability="sync")
        elif mode in ("edit", "raw-edit"):
            app.invoke({"log": []}, cfg, invocation_id=inv + "-first",
                       interrupt_before=["slow"])
            target = app if mode == "edit" else app.graph
            target.update_state(cfg, {"log": ["edited"]})
            app.invoke(None, cfg, invocation_id=inv, durability="sync")
        elif mode in ("exit", "exit-new"):
            if mode == "exit":
                app_for(None).invoke({"log": []}, cfg, invocation_id=inv + "-first")
            app.invoke({"log": []}, cfg, invocation_id=inv, durability="exit")
        elif mode == "many":
            apps = [app_for(f"{marker}-{i}") for i in range(5)]
            runs = [
                threading.Thread(target=a.invoke, args=(
                    {"log": []}, {"configurable": {"thread_id": f"{thread_id}-{i}"}}),
                    kwargs={"invocation_id": f"{inv}-{i}",
                            "durability": "exit" if i == 4 else "sync"})
                for i, a in enumerate(apps)
            ]
            for run in runs:
                run.start()
            for run in runs:
                run.join()
        elif mode == "drain":
            control = RunControl()
            signal.signal(signal.SIGTERM, lambda *_: control.request_drain("shutdown"))
            try:
                app.invoke({"log": []}, cfg, invocation_id=inv, durability="sync",
                           control=control)
            except GraphDrained:
                app.close()
                print("drained", flush=True)
                return
            raise SystemExit("the run was not drained")
        else:
            app.invoke({"log": []}, cfg, invocation_id=inv, durability="sync")
    raise SystemExit("unreachable: the node blocks until SIGKILL")


if __name__ == "__main__":
    main(*sys.argv[1:6], sys.argv[6] if len(sys.argv) > 6 else "")
