"""recover() reads the checkpointer in proportion to its threads, never to its checkpoints, on
SqliteSaver, PostgresSaver (the PostgreSQL on 127.0.0.1:5432, one database per test) and the
in-memory saver; with no ``timed_out`` task in the ledger it does not read the saver at all."""

from __future__ import annotations

import functools
import sqlite3
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import START, StateGraph
from lg_helpers import State
from lg_procs import checkpoint_database
from task_state_guard import Ledger
from task_state_guard_langgraph import guard


@contextmanager
def _sqlite(work: Path, label: str) -> Iterator[Any]:
    conn = sqlite3.connect(str(work / f"cp-{label}.sqlite"), check_same_thread=False)
    try:
        yield SqliteSaver(conn)
    finally:
        conn.close()


@contextmanager
def _postgres(work: Path, label: str) -> Iterator[Any]:
    with checkpoint_database() as url, PostgresSaver.from_conn_string(url) as saver:
        yield saver


@contextmanager
def _memory(work: Path, label: str) -> Iterator[Any]:
    yield InMemorySaver()


SAVERS: dict[str, Callable[[Path, str], AbstractContextManager[Any]]] = {
    "sqlite": _sqlite,
    "postgres": _postgres,
    "memory": _memory,
}


def _count(saver: Any, calls: Counter[str]) -> None:
    """Count the saver's reads (instance attributes shadow the methods)."""
    for name in ("get_tuple", "get"):
        method = getattr(saver, name)

        @functools.wraps(method)
        def counted(*args: Any, _m: Any = method, _n: str = name, **kwargs: Any) -> Any:
            calls[_n] += 1
            return _m(*args, **kwargs)

        setattr(saver, name, counted)
    listing = saver.list

    def listed(*args: Any, **kwargs: Any) -> Iterator[Any]:
        calls["list"] += 1
        for item in listing(*args, **kwargs):
            calls["list_rows"] += 1
            yield item

    saver.list = listed


def _recover_reads(
    work: Path, kind: str, threads: int, runs: int, lost_marker: bool
) -> Counter[str]:
    builder = StateGraph(State)
    builder.add_node("a", lambda s: {"log": ["a"]})
    builder.add_node("b", lambda s: {"log": ["b"]})
    builder.add_edge(START, "a")
    builder.add_edge("a", "b")
    label = f"{threads}-{runs}-{lost_marker}"
    db = str(work / f"tasks-{label}.sqlite")
    with SAVERS[kind](work, label) as saver:
        app = guard(builder.compile(checkpointer=saver), db=db, strict=True)
        try:
            for t in range(threads):
                for _ in range(runs):
                    app.invoke({"log": []}, {"configurable": {"thread_id": f"th-{t}"}})
            if lost_marker:
                # Some unrelated task timed out: recover() has to look at the threads.
                with Ledger(db) as ledger:
                    task = ledger.create_task(name="other")
                    ledger.start_task(task.id)
                    ledger.close_task(task.id, "timed_out", code="deadline_exceeded")
            calls: Counter[str] = Counter()
            _count(saver, calls)
            if kind == "sqlite":
                # SQLite virtual-machine steps of the saver's connection: rows examined.
                def step() -> int:
                    calls["sqlite_vm_steps_x10"] += 1
                    return 0

                saver.conn.set_progress_handler(step, 10)
            assert app.recover() == []  # every thread finished: nothing to resume
            assert app.stats()["errors"] == {}
            return calls
        finally:
            app.close()


@pytest.mark.parametrize("kind", list(SAVERS))
def test_recover_reads_follow_threads_not_checkpoints(work: Path, kind: str) -> None:
    few = _recover_reads(work, kind, threads=3, runs=1, lost_marker=True)
    deep = _recover_reads(work, kind, threads=3, runs=10, lost_marker=True)
    wide = _recover_reads(work, kind, threads=6, runs=1, lost_marker=True)
    # One latest-checkpoint read per thread, whatever the number of checkpoints per thread;
    # never a walk over every checkpoint.
    steps = [c.pop("sqlite_vm_steps_x10", 0) for c in (few, deep, wide)]
    assert few == deep == Counter(get_tuple=3)
    assert wide == Counter(get_tuple=6)
    if kind == "sqlite":
        # Ten times the checkpoints cost SQLite no more rows: the skip scan probes the
        # primary-key index once per thread (the 10x deeper threads read about as much).
        assert steps[1] < steps[0] * 1.5
        assert steps[2] > steps[0]


@pytest.mark.parametrize("kind", list(SAVERS))
def test_recover_without_timed_out_tasks_reads_nothing(work: Path, kind: str) -> None:
    assert _recover_reads(work, kind, threads=3, runs=2, lost_marker=False) == Counter()
