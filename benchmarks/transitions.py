"""Transition throughput: the ledger API against raw single-row commits, side by side in one run.

Prints one JSON object:
- ``ledger_transitions_per_s``: create, start and close through the API, each its own committed
  transaction (an event row written with every state change);
- ``raw_sqlite_commits_per_s``: single-row INSERT + COMMIT through ``sqlite3`` with the same
  journal mode (WAL) and synchronous setting (NORMAL);
- ``ratio`` of the two (rounds alternate to share machine noise);
- ``multiprocess``: total transitions/s and errors with N processes writing one ledger.

With ``--db postgresql://...`` the same on a PostgreSQL ledger (a scratch schema of that
database, dropped afterwards): the raw side is a single-row ``INSERT`` in autocommit (one
durable commit each, the server's own ``synchronous_commit``) through psycopg, and the
``multiprocess`` part runs N processes of each, alternating, in ``--rounds`` rounds, with the
ratio per round (``per_round``) and the median ratio.

    python benchmarks/transitions.py [--seconds 3] [--processes 4] [--db postgresql://...]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sqlite3
import sys
import tempfile
import time

try:
    from task_state_guard import Ledger, LedgerError
except ImportError:  # plain checkout
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "packages", "core", "src"))
    from task_state_guard import Ledger, LedgerError

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _bench


def ledger_round(path: str, seconds: float) -> tuple[int, float, float]:
    with Ledger(path) as ledger:
        done = 0
        cpu = time.process_time()
        start = time.perf_counter()
        deadline = start + seconds
        while time.perf_counter() < deadline:
            for _ in range(50):
                task = ledger.create_task(delivery_required=False)
                ledger.start_task(task.id)
                ledger.close_task(task.id, "succeeded", code="completed")
                done += 3
        return done, time.perf_counter() - start, time.process_time() - cpu


def raw_round(path: str, seconds: float) -> tuple[int, float, float]:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("CREATE TABLE IF NOT EXISTS t (id INTEGER PRIMARY KEY, v TEXT, at REAL)")
    done = 0
    cpu = time.process_time()
    start = time.perf_counter()
    deadline = start + seconds
    while time.perf_counter() < deadline:
        for _ in range(150):
            conn.execute("BEGIN")
            conn.execute("INSERT INTO t (v, at) VALUES (?, ?)", ("x", time.time()))
            conn.execute("COMMIT")
            done += 1
    elapsed = time.perf_counter() - start
    cpu = time.process_time() - cpu
    conn.close()
    return done, elapsed, cpu


def _worker(path: str, seconds: float, queue: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    errors = 0
    done = 0
    with Ledger(path, busy_timeout_ms=30_000) as ledger:
        start = time.perf_counter()
        deadline = start + seconds
        while time.perf_counter() < deadline:
            try:
                task = ledger.create_task(delivery_required=False)
                ledger.start_task(task.id)
                ledger.close_task(task.id, "succeeded", code="completed")
                done += 3
            except LedgerError:
                errors += 1
        queue.put((done, errors, time.perf_counter() - start))


def _spawn(target: object, target_args: tuple[object, ...], processes: int,
           seconds: float) -> list[tuple[int, int, float]]:
    """Run ``target(*target_args, queue)`` in N spawned processes; their (done, errors, wall)."""
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=target, args=(*target_args, queue))  # type: ignore[arg-type]
             for _ in range(processes)]
    for proc in procs:
        proc.start()
    results = [queue.get(timeout=seconds + 120) for _ in procs]
    for proc in procs:
        proc.join()
    return results


def multiprocess(path: str, processes: int, seconds: float) -> dict[str, object]:
    Ledger(path).close()
    results = _spawn(_worker, (path, seconds), processes, seconds)
    total = sum(r[0] for r in results)
    elapsed = max(r[2] for r in results)
    return {
        "processes": processes,
        "transitions": total,
        "transitions_per_s": round(total / elapsed, 1),
        "errors": sum(r[1] for r in results),
    }


def raw_pg_round(url: str, seconds: float) -> tuple[int, float, float]:
    """Single-row INSERTs in autocommit (each a durable commit) for ``seconds``."""
    import psycopg

    base, schema = _bench.split_url(url)
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'CREATE TABLE IF NOT EXISTS "{schema}".raw_commits '
                     "(id bigserial PRIMARY KEY, v text, at double precision)")
        insert = f'INSERT INTO "{schema}".raw_commits (v, at) VALUES (%s, %s)'
        done = 0
        cpu = time.process_time()
        start = time.perf_counter()
        deadline = start + seconds
        while time.perf_counter() < deadline:
            for _ in range(20):
                conn.execute(insert, ("x", time.time()))
                done += 1
        return done, time.perf_counter() - start, time.process_time() - cpu


def _raw_worker(url: str, seconds: float, queue: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    done, elapsed, _cpu = raw_pg_round(url, seconds)
    queue.put((done, 0, elapsed))


def raw_multiprocess(url: str, processes: int, seconds: float) -> dict[str, object]:
    """N processes of :func:`raw_pg_round` at once: total commits/s."""
    results = _spawn(_raw_worker, (url, seconds), processes, seconds)
    total = sum(r[0] for r in results)
    return {"processes": processes, "commits": total,
            "commits_per_s": round(total / max(r[2] for r in results), 1)}


def postgres(args: argparse.Namespace) -> dict[str, object]:
    """The PostgreSQL comparison: 1 process and N processes, ledger against raw commits."""
    url = args.db if "schema=" in args.db else _bench.pg_url(args.db, prefix="tsgbt")
    multi_url = _bench.pg_url(_bench.split_url(url)[0], prefix="tsgbt")
    raw_url = _bench.pg_url(_bench.split_url(url)[0], prefix="tsgbt")
    import psycopg

    with psycopg.connect(_bench.split_url(raw_url)[0], autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{_bench.split_url(raw_url)[1]}"')
    Ledger(multi_url).close()
    rounds: list[dict[str, float]] = []
    try:
        for i in range(args.rounds):
            one: dict[str, tuple[int, float, float]] = {}
            many: dict[str, dict[str, object]] = {}
            for side in ("ledger", "raw") if i % 2 == 0 else ("raw", "ledger"):
                if side == "ledger":
                    one[side] = ledger_round(url, args.seconds)
                    many[side] = multiprocess(multi_url, args.processes, args.seconds * 2)
                else:
                    one[side] = raw_pg_round(raw_url, args.seconds)
                    many[side] = raw_multiprocess(raw_url, args.processes, args.seconds * 2)
            led_rate = one["ledger"][0] / one["ledger"][1]
            raw_rate = one["raw"][0] / one["raw"][1]
            multi_led = float(many["ledger"]["transitions_per_s"])  # type: ignore[arg-type]
            multi_raw = float(many["raw"]["commits_per_s"])  # type: ignore[arg-type]
            rounds.append({
                "ledger_transitions_per_s": round(led_rate, 1),
                "raw_commits_per_s": round(raw_rate, 1),
                "ratio": round(led_rate / raw_rate, 3),
                "ledger_cpu_us_per_transition": round(one["ledger"][2] * 1e6 / one["ledger"][0], 1),
                "raw_cpu_us_per_commit": round(one["raw"][2] * 1e6 / one["raw"][0], 1),
                f"ledger_{args.processes}_processes_per_s": multi_led,
                f"raw_{args.processes}_processes_per_s": multi_raw,
                f"ratio_{args.processes}_processes": round(multi_led / multi_raw, 3),
                "errors": float(many["ledger"]["errors"]),  # type: ignore[arg-type]
            })
    finally:
        for target in (url, multi_url, raw_url):
            _bench.drop_pg_schema(target)
    keys = rounds[0].keys()
    return {"benchmark": "transitions", "backend": "postgresql", "processes": args.processes,
            "seconds_per_round": args.seconds, "rounds": len(rounds), "per_round": rounds,
            **{f"median_{k}": _bench.median(r[k] for r in rounds) for k in keys}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=2.0, help="per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--db", default=None, help="a postgresql:// URL: measure PostgreSQL")
    args = parser.parse_args()
    load_start = _bench.loadavg()
    if _bench.is_postgres(args.db):
        report = postgres(args)
        report.update(loadavg_1m_at_start=load_start, loadavg_1m_at_end=_bench.loadavg())
        print(json.dumps(report, sort_keys=True))
        return
    with tempfile.TemporaryDirectory(prefix="tsg-bench-") as base:
        ledger_path = os.path.join(base, "ledger", "tasks.sqlite")
        raw_path = os.path.join(base, "raw.sqlite")
        ledger_ops = ledger_time = raw_ops = raw_time = ledger_cpu = raw_cpu = 0.0
        per_round: list[dict[str, float]] = []
        for _ in range(args.rounds):
            ops, took, cpu = ledger_round(ledger_path, args.seconds)
            ledger_ops, ledger_time = ledger_ops + ops, ledger_time + took
            ledger_cpu += cpu
            entry = {"ledger_transitions_per_s": round(ops / took, 1),
                     "ledger_cpu_us_per_transition": round(cpu * 1e6 / ops, 1)}
            ops, took, cpu = raw_round(raw_path, args.seconds)
            raw_ops, raw_time, raw_cpu = raw_ops + ops, raw_time + took, raw_cpu + cpu
            entry.update(raw_commits_per_s=round(ops / took, 1),
                         raw_cpu_us_per_commit=round(cpu * 1e6 / ops, 1))
            entry["ratio"] = round(entry["ledger_transitions_per_s"]
                                   / entry["raw_commits_per_s"], 3)
            per_round.append(entry)
        ledger_rate = ledger_ops / ledger_time
        raw_rate = raw_ops / raw_time
        multi = multiprocess(os.path.join(base, "multi", "tasks.sqlite"), args.processes,
                             args.seconds * 2)
    print(json.dumps({
        "benchmark": "transitions",
        "ledger_transitions_per_s": round(ledger_rate, 1),
        "raw_sqlite_commits_per_s": round(raw_rate, 1),
        "ratio": round(ledger_rate / raw_rate, 3),
        "ledger_cpu_us_per_transition": round(ledger_cpu * 1e6 / ledger_ops, 1),
        "raw_cpu_us_per_commit": round(raw_cpu * 1e6 / raw_ops, 1),
        "loadavg_1m": round(os.getloadavg()[0], 2),
        "loadavg_1m_at_start": load_start,
        "per_round": per_round,
        "median_ledger_transitions_per_s": _bench.median(
            r["ledger_transitions_per_s"] for r in per_round),
        "median_ledger_cpu_us_per_transition": _bench.median(
            r["ledger_cpu_us_per_transition"] for r in per_round),
        "target_ratio": 0.5,
        "journal_mode": "wal",
        "synchronous": "normal",
        "multiprocess": multi,
    }, sort_keys=True))


if __name__ == "__main__":
    main()
