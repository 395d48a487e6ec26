"""Transition throughput: the ledger API against raw sqlite3 commits, side by side in one run.

Prints one JSON object:
- ``ledger_transitions_per_s``: create, start and close through the API, each its own committed
  transaction (an event row written with every state change);
- ``raw_sqlite_commits_per_s``: single-row INSERT + COMMIT through ``sqlite3`` with the same
  journal mode (WAL) and synchronous setting (NORMAL);
- ``ratio`` of the two (rounds alternate to share machine noise);
- ``multiprocess``: total transitions/s and errors with N processes writing one ledger.

    python benchmarks/transitions.py [--seconds 3] [--processes 4]
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


def multiprocess(path: str, processes: int, seconds: float) -> dict[str, object]:
    Ledger(path).close()
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(path, seconds, queue)) for _ in range(processes)]
    for proc in procs:
        proc.start()
    results = [queue.get(timeout=seconds + 120) for _ in procs]
    for proc in procs:
        proc.join()
    total = sum(r[0] for r in results)
    elapsed = max(r[2] for r in results)
    return {
        "processes": processes,
        "transitions": total,
        "transitions_per_s": round(total / elapsed, 1),
        "errors": sum(r[1] for r in results),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=2.0, help="per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--processes", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tsg-bench-") as base:
        ledger_path = os.path.join(base, "ledger", "tasks.sqlite")
        raw_path = os.path.join(base, "raw.sqlite")
        ledger_ops = ledger_time = raw_ops = raw_time = ledger_cpu = raw_cpu = 0.0
        for _ in range(args.rounds):
            ops, took, cpu = ledger_round(ledger_path, args.seconds)
            ledger_ops, ledger_time = ledger_ops + ops, ledger_time + took
            ledger_cpu += cpu
            ops, took, cpu = raw_round(raw_path, args.seconds)
            raw_ops, raw_time, raw_cpu = raw_ops + ops, raw_time + took, raw_cpu + cpu
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
        "target_ratio": 0.5,
        "journal_mode": "wal",
        "synchronous": "normal",
        "multiprocess": multi,
    }, sort_keys=True))


if __name__ == "__main__":
    main()
