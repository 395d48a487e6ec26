#!/usr/bin/env python3
"""Load soak: P processes x T threads mixing transitions, heartbeats and reconciles on one ledger.

Every worker thread runs full lifecycles on its own tasks (create -> start(owner) -> heartbeats
-> close -> delivery), races the others to claim tasks from a shared queued pool (start_task is
an atomic claim: losers get the expected StateConflict), and now and then reconciles (dry-run or
apply, with graces long enough that nothing legitimate is timed out) or heartbeats in bulk.

Afterwards the parent checks: no error other than the expected claim conflicts, no LedgerBusy
reached a caller, doctor healthy, and the ledger's final counts equal what the workers recorded.
It prints one JSON line with transitions/s and latency percentiles. ``--db`` names the ledger
(a PostgreSQL URL, say: a schema of its own, since the counts are checked against a fresh
ledger); the default is a fresh SQLite file in a private temporary directory.

    python scripts/load_soak.py --seconds 600
    python scripts/load_soak.py --seconds 600 --db 'postgresql://host/db?schema=tsg_load'
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

CLOSE_STATES = ("succeeded", "failed", "cancelled")
RESERVOIR = 20_000


class _Stats:
    def __init__(self, seed: int) -> None:
        self.lock = threading.Lock()
        self.counts: dict[str, int] = {}
        self.errors: dict[str, int] = {}
        self.latencies: list[float] = []
        self.seen = 0
        self.rng = random.Random(seed)

    def count(self, key: str, n: int = 1) -> None:
        with self.lock:
            self.counts[key] = self.counts.get(key, 0) + n

    def error(self, key: str) -> None:
        with self.lock:
            self.errors[key] = self.errors.get(key, 0) + 1

    def latency(self, seconds: float) -> None:
        with self.lock:
            self.seen += 1
            if len(self.latencies) < RESERVOIR:
                self.latencies.append(seconds)
            else:
                slot = self.rng.randrange(self.seen)
                if slot < RESERVOIR:
                    self.latencies[slot] = seconds


def _close_claimed(ledger: Any, tid: str, stats: _Stats, timed: Any) -> None:
    """Close a task this thread claimed. Other threads heartbeat shared tasks concurrently; a
    StateConflict while the task is still running is spurious (nobody else may close it): it is
    counted as ``spurious_state_conflicts`` (a former core issue, see RELIABILITY.md; the CI test
    requires none) and retried."""
    from task_state_guard import StateConflict

    for _ in range(20):
        try:
            timed("claim_close", lambda: ledger.close_task(tid, "succeeded",
                                                           code="worker_completed"))
            return
        except StateConflict:
            if ledger.get_task(tid).status != "running":
                raise
            stats.count("spurious_state_conflicts")
    raise RuntimeError("close kept conflicting")


def _thread(ledger: Any, shared: list[str], stats: _Stats, seed: int, deadline: float) -> None:
    from task_state_guard import LedgerError, ReconcilePolicy, StateConflict

    rng = random.Random(seed)
    policy = ReconcilePolicy(active_grace_seconds=10**6, delivery_grace_seconds=10**6)

    def timed(label: str, fn: Any) -> Any:
        began = time.perf_counter()
        result = fn()
        stats.latency(time.perf_counter() - began)
        stats.count(label)
        return result

    while time.time() < deadline:
        roll = rng.random()
        stage = "lifecycle" if roll < 0.55 else "claim" if roll < 0.85 else (
            "heartbeat_many" if roll < 0.95 else "reconcile")
        try:
            if roll < 0.55:  # own lifecycle
                required = rng.random() < 0.7
                task = timed("create", lambda r=required: ledger.create_task(
                    delivery_required=r, name="load.own"))
                timed("start", lambda t=task: ledger.start_task(t.id, owner=True))
                for _ in range(rng.randint(0, 3)):
                    ledger.heartbeat(task.id)
                    stats.count("heartbeat")
                state = rng.choice(CLOSE_STATES)
                timed("close_" + state, lambda t=task, s=state: ledger.close_task(t.id, s))
                if required:
                    outcome = rng.choice(["delivered", "failed"])
                    code = ("transport_acknowledged" if outcome == "delivered"
                            else "transport_failed")
                else:
                    outcome, code = "not_applicable", "internal_task"
                timed("delivery_" + outcome,
                      lambda t=task, o=outcome, c=code: ledger.set_delivery(t.id, o, code=c))
            elif roll < 0.85:  # race for a shared task
                tid = rng.choice(shared)
                try:
                    timed("claim", lambda t=tid: ledger.start_task(t, owner=False))
                except StateConflict:
                    stats.count("claim_conflict")
                    continue
                _close_claimed(ledger, tid, stats, timed)
                timed("claim_delivery", lambda t=tid: ledger.set_delivery(
                    t, "not_applicable", code="internal_task"))
            elif roll < 0.95:
                ids = [rng.choice(shared) for _ in range(8)]
                stats.count("heartbeat_many_refreshed", ledger.heartbeat_many(ids))
            else:
                dry = rng.random() < 0.5
                report = ledger.reconcile(policy, dry_run=dry)
                stats.count("reconcile")
                if dry:  # closes nothing; see "dry_run_reported_lost" in run_load
                    stats.count("dry_run_timed_out", report["tasks_timed_out"])
                    continue
                stats.count("reconcile_timed_out", report["tasks_timed_out"])
                stats.count("reconcile_deliveries_closed",
                            report["deliveries_failed"] + report["deliveries_not_applicable"])
        except LedgerError as exc:
            stats.error(f"{type(exc).__name__}:{stage}")
        except Exception as exc:
            stats.error(f"NonLedger:{type(exc).__name__}:{stage}")


def worker_main(db: str, shared_file: str, threads: int, start_at: float, deadline: float,
                seed: int) -> None:
    from task_state_guard import Ledger

    with open(shared_file) as handle:
        shared = json.load(handle)
    ledger = Ledger(db)
    stats = _Stats(seed)
    while time.time() < start_at:
        time.sleep(0.005)
    pool = [threading.Thread(target=_thread, args=(ledger, shared, stats, seed * 100 + i,
                                                   deadline)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    ledger.close()
    json.dump({"counts": stats.counts, "errors": stats.errors, "latencies": stats.latencies,
               "ops_seen": stats.seen}, sys.stdout)


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run_load(seconds: float, *, processes: int = 8, threads: int = 4, shared_tasks: int = 3000,
             seed: int = 0, db: str | None = None) -> dict[str, Any]:
    """Run the load for ``seconds``; return the JSON-ready summary. ``db``: a fresh ledger
    (default: a new SQLite file in a private temporary directory)."""
    from task_state_guard import Ledger

    base = tempfile.mkdtemp(prefix="tsg-load-")
    os.chmod(base, 0o700)
    db = db or os.path.join(base, "l", "tasks.sqlite")
    try:
        with Ledger(db) as ledger:
            shared = [ledger.create_task(delivery_required=False, name="load.shared").id
                      for _ in range(shared_tasks)]
        shared_file = os.path.join(base, "shared.json")
        with open(shared_file, "w") as handle:
            json.dump(shared, handle)
        start_at = time.time() + 2.0
        deadline = start_at + seconds
        procs = [
            subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "--worker", db, shared_file,
                 str(threads), repr(start_at), repr(deadline), str(seed * 1000 + i)],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1"))
            for i in range(processes)
        ]
        results, stderr_bytes, exits = [], 0, []
        for proc in procs:
            out, err = proc.communicate(timeout=seconds + 300)
            exits.append(proc.returncode)
            stderr_bytes += len(err)
            if out:
                results.append(json.loads(out))
        counts: dict[str, int] = {}
        errors: dict[str, int] = {}
        latencies: list[float] = []
        for r in results:
            for k, v in r["counts"].items():
                counts[k] = counts.get(k, 0) + v
            for k, v in r["errors"].items():
                errors[k] = errors.get(k, 0) + v
            latencies.extend(r["latencies"])
        with Ledger(db) as ledger:
            doctor = ledger.doctor()
            status = ledger.status()
        c = counts.get
        claims = c("claim", 0)
        expected_tasks = {
            "queued": shared_tasks - claims, "running": 0,
            "succeeded": c("close_succeeded", 0) + c("claim_close", 0),
            "failed": c("close_failed", 0), "cancelled": c("close_cancelled", 0), "timed_out": 0,
        }
        expected_deliveries = {
            "pending": shared_tasks - claims,
            "delivered": c("delivery_delivered", 0), "failed": c("delivery_failed", 0),
            "not_applicable": c("delivery_not_applicable", 0) + c("claim_delivery", 0),
        }
        expected_events = (shared_tasks - claims) + 4 * claims + 4 * c("create", 0)
        transitions = sum(v for k, v in counts.items() if k.startswith(
            ("create", "start", "close_", "delivery_", "claim", "claim_close", "claim_delivery"))
            and k != "claim_conflict")
        failures = []
        if errors:
            failures.append("errors: " + json.dumps(errors, sort_keys=True))
        if any(code != 0 for code in exits) or stderr_bytes or len(results) != processes:
            failures.append("a worker process failed")
        if not doctor["healthy"]:
            failures.append("doctor unhealthy")
        if status["tasks"] != expected_tasks:
            failures.append("task counts differ from what workers recorded")
        if status["deliveries"] != expected_deliveries:
            failures.append("delivery counts differ from what workers recorded")
        if doctor["event_count"] != expected_events:
            failures.append("event count differs from what workers recorded")
        if c("reconcile_timed_out", 0) or c("reconcile_deliveries_closed", 0):
            failures.append("reconcile closed live work")
        return {
            "seconds": seconds,
            "processes": processes,
            "threads_per_process": threads,
            "transitions": transitions,
            "transitions_per_second": round(transitions / seconds, 1),
            "claim_conflicts": c("claim_conflict", 0),
            "spurious_state_conflicts": c("spurious_state_conflicts", 0),
            "heartbeats": c("heartbeat", 0) + c("heartbeat_many_refreshed", 0),
            "reconciles": c("reconcile", 0),
            # A dry run reads a snapshot, then probes the owners of its running tasks: one
            # whose owner closed it and exited in between (at the end of the run) is reported
            # lost, a stale preview as any read can be; only an applied pass closes work.
            "dry_run_reported_lost": c("dry_run_timed_out", 0),
            "latency_ms": {
                "p50": round(_percentile(latencies, 0.50) * 1000, 2),
                "p99": round(_percentile(latencies, 0.99) * 1000, 2),
                "max": round(max(latencies, default=0.0) * 1000, 2),
            },
            "ledger_busy_errors": sum(v for k, v in errors.items()
                                      if k.startswith("LedgerBusy")),
            "errors": errors,
            "doctor_healthy": doctor["healthy"],
            "final_tasks": doctor["task_count"],
            "failures": failures,
        }
    finally:
        shutil.rmtree(base, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--worker":
        worker_main(argv[1], argv[2], int(argv[3]), float(argv[4]), float(argv[5]),
                    int(argv[6]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--db", default=None,
                        help="a fresh ledger (path or PostgreSQL URL); default: a temporary file")
    args = parser.parse_args(argv)
    summary = run_load(args.seconds, processes=args.processes, threads=args.threads,
                       seed=args.seed, db=args.db)
    print(json.dumps(summary, sort_keys=True))
    return 0 if not summary["failures"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
