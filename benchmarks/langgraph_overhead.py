"""Overhead of the TaskStateGuard LangGraph adapter on a 10-node graph.

Two families of modes, all run in rotating order, in rounds, in one process:

* without a checkpointer, no-op nodes: plain ``graph.invoke``, plain with a do-nothing callback
  handler (the cost of LangChain's callback machinery alone), guarded ``app.invoke`` (every node
  attempt recorded) and guarded with ``record_nodes=False`` (invocations only);
* against the baseline users actually run (a guarded graph needs a checkpointer for
  ``recover()``): the same graph compiled with a ``SqliteSaver`` on disk, plain and guarded,
  with no-op nodes and with nodes that each do 1 ms of work (``time.sleep(0.001)``);
* async: a 3-node no-op graph on an ``AsyncSqliteSaver``, ``ainvoke`` one request after the
  other on one event loop, plain and guarded (``ratio_async_saver_3_nodes``).

Prints one JSON object: the median invocations per second of each mode, every ratio to its
baseline (guarded / plain: higher is better, 1.0 = free) and the median CPU milliseconds per
invocation (all threads of the process) beside the wall-clock figures. Not a test: nothing is
asserted.

    .venv/bin/python benchmarks/langgraph_overhead.py [--rounds 10] [--per-round 50]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import platform
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, TypedDict

from langgraph.callbacks import GraphCallbackHandler
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import START, StateGraph
from task_state_guard_langgraph import guard

NODES = 10
WORK_SECONDS = 0.001


class State(TypedDict, total=False):
    n: int


def build(checkpointer: Any = None, work: float = 0.0) -> Any:
    def noop(state: State) -> dict[str, Any]:
        return {}

    def busy(state: State) -> dict[str, Any]:
        time.sleep(work)
        return {}

    builder = StateGraph(State)
    previous = START
    for i in range(NODES):
        name = f"node_{i}"
        builder.add_node(name, busy if work else noop)
        builder.add_edge(previous, name)
        previous = name
    return builder.compile(checkpointer=checkpointer)


def build_nodes(count: int, checkpointer: Any) -> Any:
    builder = StateGraph(State)
    previous = START
    for i in range(count):
        builder.add_node(f"node_{i}", lambda state: {})
        builder.add_edge(previous, f"node_{i}")
        previous = f"node_{i}"
    return builder.compile(checkpointer=checkpointer)


class AsyncSaverGraphs:
    """A plain and a guarded 3-node graph on ``AsyncSqliteSaver``s, driven on one loop."""

    def __init__(self, root: Path) -> None:
        from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

        self.loop = asyncio.new_event_loop()

        async def open_saver(name: str) -> Any:
            import aiosqlite

            return AsyncSqliteSaver(await aiosqlite.connect(str(root / name)))

        self.savers = [self.loop.run_until_complete(open_saver(n))
                       for n in ("plain-async-cp.sqlite", "guarded-async-cp.sqlite")]
        self.plain = build_nodes(3, self.savers[0])
        self.guarded = guard(build_nodes(3, self.savers[1]), db=str(root / "ga.sqlite"),
                             strict=True)

    def call(self, app: Any, threads: Any) -> Any:
        def one() -> None:
            cfg = {"configurable": {"thread_id": f"a{next(threads)}"}}
            self.loop.run_until_complete(app.ainvoke({"n": 0}, cfg))

        return one

    def close(self) -> None:
        self.loop.run_until_complete(self.guarded.aclose())
        for saver in self.savers:
            self.loop.run_until_complete(saver.conn.close())
        self.loop.close()


def saver(path: Path) -> SqliteSaver:
    return SqliteSaver(sqlite3.connect(str(path), check_same_thread=False))
class NoopHandler(GraphCallbackHandler):
    """A callback handler that does nothing (inline, like the adapter's)."""

    run_inline = True


def rate(fn: Any, count: int) -> tuple[float, float]:
    """Invocations per wall-clock second, and CPU milliseconds (all threads) per invocation."""
    cpu = time.process_time()
    start = time.perf_counter()
    for _ in range(count):
        fn()
    wall = time.perf_counter() - start
    return count / wall, (time.process_time() - cpu) * 1000.0 / count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--per-round", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=20)
    args = parser.parse_args()

    graph = build()
    threads = itertools.count()

    def on_thread(app: Any) -> Any:
        # Every invocation starts a fresh checkpointer thread, on both sides alike.
        return lambda: app.invoke({"n": 0}, {"configurable": {"thread_id": f"t{next(threads)}"}})

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        full = guard(graph, db=str(root / "full.sqlite"), strict=True)
        light = guard(graph, db=str(root / "light.sqlite"), strict=True, record_nodes=False)
        plain_saver = build(saver(root / "plain-cp.sqlite"))
        guarded_saver = guard(
            build(saver(root / "guarded-cp.sqlite")), db=str(root / "gs.sqlite"), strict=True
        )
        plain_work = build(saver(root / "plain-work-cp.sqlite"), WORK_SECONDS)
        guarded_work = guard(
            build(saver(root / "guarded-work-cp.sqlite"), WORK_SECONDS),
            db=str(root / "gw.sqlite"),
            strict=True,
        )
        graphs = AsyncSaverGraphs(root)
        guards = (full, light, guarded_saver, guarded_work)
        noop = NoopHandler()
        calls = {
            "plain": lambda: graph.invoke({"n": 0}),
            # The callback machinery alone: a handler that records nothing.
            "plain_noop_callback": lambda: graph.invoke({"n": 0}, {"callbacks": [noop]}),
            "guarded": lambda: full.invoke({"n": 0}),
            "guarded_invocations_only": lambda: light.invoke({"n": 0}),
            "plain_saver": on_thread(plain_saver),
            "guarded_saver": on_thread(guarded_saver),
            "plain_saver_1ms": on_thread(plain_work),
            "guarded_saver_1ms": on_thread(guarded_work),
            "plain_async_saver_3": graphs.call(graphs.plain, threads),
            "guarded_async_saver_3": graphs.call(graphs.guarded, threads),
        }
        try:
            for call in calls.values():
                rate(call, args.warmup)
            rates: dict[str, list[float]] = {label: [] for label in calls}
            cpu_ms: dict[str, list[float]] = {label: [] for label in calls}
            labels = list(calls)
            for i in range(args.rounds):
                # Rotate which mode goes first so drift affects all equally.
                shift = i % len(labels)
                for label in labels[shift:] + labels[:shift]:
                    per_s, ms = rate(calls[label], args.per_round)
                    rates[label].append(per_s)
                    cpu_ms[label].append(ms)
            errors = sum(sum(g.stats()["errors"].values()) for g in (*guards, graphs.guarded))
        finally:
            for g in guards:
                g.close()
            graphs.close()
    med = {label: statistics.median(values) for label, values in rates.items()}
    cpu = {label: statistics.median(values) for label, values in cpu_ms.items()}
    pairs = {
        "ratio": ("guarded", "plain"),
        "ratio_invocations_only": ("guarded_invocations_only", "plain"),
        "ratio_noop_callback": ("plain_noop_callback", "plain"),
        "ratio_saver_noop_nodes": ("guarded_saver", "plain_saver"),
        "ratio_saver_1ms_nodes": ("guarded_saver_1ms", "plain_saver_1ms"),
        "ratio_async_saver_3_nodes": ("guarded_async_saver_3", "plain_async_saver_3"),
    }
    ratios = {name: round(med[a] / med[b], 3) for name, (a, b) in pairs.items()}
    # CPU ratio = baseline CPU / guarded CPU (higher is better, like the wall ratios).
    cpu_ratios = {f"cpu_{name}": round(cpu[b] / cpu[a], 3) for name, (a, b) in pairs.items()}
    wall_ms = {label: round(1000.0 / v, 3) for label, v in med.items()}
    print(
        json.dumps(
            {
                "benchmark": "langgraph_overhead",
                "nodes": NODES,
                "node_work_ms": WORK_SECONDS * 1000,
                "rounds": args.rounds,
                "invocations_per_round": args.per_round,
                "invocations_per_s": {label: round(v, 1) for label, v in med.items()},
                "wall_ms_per_invocation": wall_ms,
                # CPU time of this process per invocation: less sensitive to other tenants
                # of a shared machine than the wall-clock rates.
                "cpu_ms_per_invocation": {label: round(v, 3) for label, v in cpu.items()},
                **ratios,
                **cpu_ratios,
                "extra_wall_ms_saver_noop_nodes": round(
                    wall_ms["guarded_saver"] - wall_ms["plain_saver"], 3
                ),
                "extra_wall_ms_saver_1ms_nodes": round(
                    wall_ms["guarded_saver_1ms"] - wall_ms["plain_saver_1ms"], 3
                ),
                "targets": {
                    "ratio": 0.8,
                    "ratio_saver_noop_nodes": 0.95,
                    "ratio_saver_1ms_nodes": 0.97,
                    # guarded / plain latency <= 1.10x, as a rate ratio.
                    "ratio_async_saver_3_nodes": round(1 / 1.10, 3),
                },
                # Invocation: start, close. Node attempts are history, committed with the
                # close (one transaction) unless a heartbeat came first.
                "ledger_transactions_per_invocation": {
                    "guarded": 2,
                    "guarded_invocations_only": 2,
                },
                "ledger_errors": errors,
                "python": platform.python_version(),
            },
            sort_keys=True,
        )
    )


if __name__ == "__main__":
    main()
