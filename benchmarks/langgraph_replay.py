"""The ledger writes of one 3-node LangGraph request, replayed against a PostgreSQL ledger in
one process (no graph, no event loop): round trips, client CPU and server CPU per request.

Two variants, alternating round by round in the same process and ledger:

* ``locked``: the writes as the LangGraph adapter made them before the invocation's start and
  the node boundaries became one statement each: the invocation's create and start in a group
  (``BEGIN``, a row lock and a statement each, ``COMMIT``), the first node's *begin attempt*,
  each later boundary as *end attempt* and *begin attempt* in a group, the close.
* ``one_statement``: what the adapter writes now: the invocation's start as
  ``begin_attempt(attempt=False)``, the first node's *begin attempt*, each later boundary as
  ``end_and_begin_attempt``, the close (*end attempt*).

Both write the same tasks and events (checked at the end of each run). Client CPU is this
process's (``time.process_time``); server CPU that of the backends serving it
(``/proc/<pid>/stat``, the server runs on this machine); round trips are the driver's calls
(a ``BEGIN`` and a ``COMMIT`` count one each). Before measuring, ``--fill`` requests are
written and the tables analyzed, and the ledger reopened: the server's generic plans, made on
an empty schema, would scan tables that grow round by round.

    python benchmarks/langgraph_replay.py [--requests 300] [--rounds 5] [--db postgresql://...]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _bench

NODES = ("plan", "act", "check")


def _new() -> str:
    return str(uuid.uuid4())


def locked(led: Any) -> str:
    """One request, the writes as the adapter made them before."""
    inv = _new()
    with led.atomic():
        led.create_task(task_id=inv, delivery_required=True, name="LangGraph",
                        framework_id=inv, framework="langgraph")
        led.start_task(inv, owner=True)
    prev = led.begin_attempt(inv, name=NODES[0], open_logical=False, attempt_id=_new())
    for node in NODES[1:]:
        with led.atomic():
            led.end_attempt([(prev, "succeeded", "worker_completed")])
            prev = led.begin_attempt(inv, name=node, open_logical=False, attempt_id=_new())
    led.end_attempt([(prev, "succeeded", "worker_completed"), (inv, "succeeded", "completed")])
    return inv


def one_statement(led: Any) -> str:
    """One request, the writes as the adapter makes them now."""
    inv = _new()
    led.begin_attempt(inv, delivery_required=True, name="LangGraph", framework_id=inv,
                      framework="langgraph", logical_owner=True, attempt=False)
    prev = led.begin_attempt(inv, name=NODES[0], open_logical=False, attempt_id=_new())
    for node in NODES[1:]:
        _, begun = led.end_and_begin_attempt(
            [(prev, "succeeded", "worker_completed")], inv, name=node, attempt_id=_new())
        assert begun is not None
        prev = begun
    led.end_attempt([(prev, "succeeded", "worker_completed"), (inv, "succeeded", "completed")])
    return inv


VARIANTS: dict[str, Callable[[Any], str]] = {"locked": locked, "one_statement": one_statement}


def _shape(led: Any, inv: str) -> Any:
    def one(t: Any) -> Any:
        events = [(e.kind, e.state, e.code) for e in led.events_of(t.id)]
        return (t.name, t.status, t.terminal_code, t.delivery_status, t.delivery_code,
                t.version, t.has_owner, t.framework_id is not None, events)
    return (one(led.get_task(inv)), [one(c) for c in led.children_of(inv)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300, help="requests per variant a round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--db", default=_bench.PG_BASE, help="a postgresql:// database URL")
    parser.add_argument("--fill", type=int, default=2000,
                        help="requests written (and the tables analyzed) before measuring")
    args = parser.parse_args()
    name = _bench.app_name()
    os.environ["PGAPPNAME"] = name
    from task_state_guard import Ledger
    from task_state_guard_postgres import driver

    calls: list[str] = []
    for method in ("execute", "run", "run_many", "fetch_named", "stream"):
        original = getattr(driver.Conn, method)

        def counted(self: Any, sql: str, *a: Any, _original: Any = original) -> Any:
            calls.append(sql)
            return _original(self, sql, *a)

        setattr(driver.Conn, method, counted)
    url = _bench.pg_url(args.db)
    load_start = _bench.loadavg()
    per_round: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
    try:
        with Ledger(url) as led:
            for _ in range(args.fill):
                one_statement(led)
        base, schema = _bench.split_url(url)
        import psycopg

        with psycopg.connect(base, autocommit=True) as conn:
            for table in ("tsg_tasks", "tsg_events", "tsg_totals", "tsg_verdicts"):
                conn.execute(f'ANALYZE "{schema}".{table}')
        # A fresh connection: the server's generic plans are made for tables of that size
        # (made on an empty schema they would scan the growing tables).
        with Ledger(url) as led:
            server = _bench.ServerCpu(args.db, name)
            shapes = {v: _shape(led, fn(led)) for v, fn in VARIANTS.items()}  # warm both
            assert shapes["locked"] == shapes["one_statement"], shapes
            for _ in range(args.rounds):
                for variant, fn in VARIANTS.items():
                    calls.clear()
                    server.start()
                    cpu, wall = time.process_time(), time.perf_counter()
                    for _ in range(args.requests):
                        fn(led)
                    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
                    srv = server.seconds()
                    n = args.requests
                    per_round[variant].append({
                        "round_trips": round(len(calls) / n, 2),
                        "client_cpu_ms": round(cpu * 1000 / n, 3),
                        "server_cpu_ms": round(srv * 1000 / n, 3),
                        "wall_ms": round(wall * 1000 / n, 3),
                    })
    finally:
        _bench.drop_pg_schema(url)
    medians = {v: {k: _bench.median(r[k] for r in rounds) for k in rounds[0]}
               for v, rounds in per_round.items()}
    print(json.dumps({
        "benchmark": "langgraph_replay", "fill_requests": args.fill, "nodes": len(NODES),
        "requests": args.requests,
        "rounds": args.rounds, "cpus": os.cpu_count(), "loadavg_1m_at_start": load_start,
        "loadavg_1m_at_end": _bench.loadavg(), "medians": medians, "per_round": per_round,
        "python": ".".join(map(str, sys.version_info[:3])), "unix_time": int(time.time()),
    }, sort_keys=True))


if __name__ == "__main__":
    main()
