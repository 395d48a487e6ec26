"""Overhead of the TaskStateGuard LangGraph adapter on a 10-node graph of no-op nodes.

Runs plain ``graph.invoke``, plain with a do-nothing callback handler (the cost of LangChain's
callback machinery alone), guarded ``app.invoke`` (every node attempt recorded) and guarded
with ``record_nodes=False`` (invocations only) in rotating order, in rounds, in one
process, and prints one JSON object: median invocations per second of each and the ratios to
plain (the target is >= 0.8), plus the median CPU time per invocation of each. Not a test:
nothing is asserted.

    .venv/bin/python benchmarks/langgraph_overhead.py [--rounds 10] [--per-round 50]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, TypedDict

from langgraph.callbacks import GraphCallbackHandler
from langgraph.graph import START, StateGraph
from task_state_guard_langgraph import guard

NODES = 10


class State(TypedDict, total=False):
    n: int


def build() -> Any:
    def noop(state: State) -> dict[str, Any]:
        return {}

    builder = StateGraph(State)
    previous = START
    for i in range(NODES):
        name = f"node_{i}"
        builder.add_node(name, noop)
        builder.add_edge(previous, name)
        previous = name
    return builder.compile()


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
    with tempfile.TemporaryDirectory() as tmp:
        full = guard(graph, db=str(Path(tmp) / "full.sqlite"), strict=True)
        light = guard(graph, db=str(Path(tmp) / "light.sqlite"), strict=True, record_nodes=False)
        noop = NoopHandler()
        calls = {
            "plain": lambda: graph.invoke({"n": 0}),
            # The callback machinery alone: a handler that records nothing.
            "plain_noop_callback": lambda: graph.invoke({"n": 0}, {"callbacks": [noop]}),
            "guarded": lambda: full.invoke({"n": 0}),
            "guarded_invocations_only": lambda: light.invoke({"n": 0}),
        }
        try:
            for call in calls.values():
                rate(call, args.warmup)
            rates: dict[str, list[float]] = {label: [] for label in calls}
            cpu_ms: dict[str, list[float]] = {label: [] for label in calls}
            labels = list(calls)
            for i in range(args.rounds):
                # Rotate which side goes first so drift affects all equally.
                shift = i % len(labels)
                for label in labels[shift:] + labels[:shift]:
                    per_s, ms = rate(calls[label], args.per_round)
                    rates[label].append(per_s)
                    cpu_ms[label].append(ms)
            errors = sum(full.stats()["errors"].values()) + sum(light.stats()["errors"].values())
        finally:
            full.close()
            light.close()
    med = {label: statistics.median(values) for label, values in rates.items()}
    cpu = {label: statistics.median(values) for label, values in cpu_ms.items()}
    print(
        json.dumps(
            {
                "benchmark": "langgraph_overhead",
                "nodes": NODES,
                "rounds": args.rounds,
                "invocations_per_round": args.per_round,
                "plain_invocations_per_s": round(med["plain"], 1),
                "guarded_invocations_per_s": round(med["guarded"], 1),
                "ratio": round(med["guarded"] / med["plain"], 3),
                "guarded_invocations_only_per_s": round(med["guarded_invocations_only"], 1),
                "ratio_invocations_only": round(med["guarded_invocations_only"] / med["plain"], 3),
                "plain_noop_callback_invocations_per_s": round(med["plain_noop_callback"], 1),
                "ratio_noop_callback": round(med["plain_noop_callback"] / med["plain"], 3),
                "target_ratio": 0.8,
                # CPU time of this process per invocation: less sensitive to other tenants
                # of a shared machine than the wall-clock rates (ratio = plain / guarded).
                "cpu_ms_per_invocation": {label: round(v, 3) for label, v in cpu.items()},
                "cpu_ratio": round(cpu["plain"] / cpu["guarded"], 3),
                "cpu_ratio_invocations_only": round(
                    cpu["plain"] / cpu["guarded_invocations_only"], 3
                ),
                "cpu_ratio_noop_callback": round(cpu["plain"] / cpu["plain_noop_callback"], 3),
                # Invocation: create+start, close. Each node attempt: create+start,
                # close+delivery (Ledger.atomic() groups what happens at the same moment).
                "ledger_transactions_per_invocation": {
                    "guarded": 2 + 2 * NODES,
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
