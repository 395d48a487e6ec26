"""The ledger's write set and CPU per guarded job, without a framework around it.

Replays, in one process and through the same integration-layer calls the adapters make, the
ledger work of one job of each adapter:

- ``dramatiq``: before_process_message (the logical task created and started, the attempt
  queued and claimed, one transaction), after_process_message (the attempt closed with its
  delivery), after_ack (the logical task closed with its delivery);
- ``celery``: task_prerun (the parent and a fresh attempt created and started, owned by this
  process, one transaction) and task_success (attempt and parent closed, one transaction).

Per job it reports CPU (``time.process_time``), SQL statements (``BEGIN``/``COMMIT`` counted
apart), rows changed, event rows, commits and WAL pages written, and where the CPU goes by
cProfile category (SQLite calls, row validation and Task building, id checks, locks and the
rest of the Python path). ``--threads`` runs that many threads at once (as Dramatiq's worker
threads do). Prints one JSON object; nothing is asserted.

    .venv/bin/python benchmarks/job_cost.py [--jobs 2000] [--rounds 5] [--threads 1]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import statistics
import sys
import tempfile
import threading
import time
import uuid
from typing import Any

try:
    from task_state_guard.integration import AdapterRuntime, resolve_settings
except ImportError:  # plain checkout
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "packages", "core", "src"))
    from task_state_guard.integration import AdapterRuntime, resolve_settings

import logging

NS = uuid.UUID("6f1c9b8e-3d0a-4c53-9d7e-2b1f6a0c8e41")


def dramatiq_job(rt: AdapterRuntime, n: int) -> None:
    """The ledger calls of one Dramatiq message that succeeds on its first delivery."""
    parent = str(uuid.uuid5(NS, f"m{n}"))
    expected = str(uuid.uuid5(NS, f"a{n}"))
    led = rt.ledger
    with led.atomic():
        rt.open_logical(parent, delivery_required=False, name="bench.noop")
        attempt = rt.claim_attempt(parent, name="bench.noop", expected=((expected, True),))
    rt.hold(attempt, parent)
    rt.release(attempt, parent)
    with led.atomic():
        rt.close_tasks(((attempt, "succeeded", "worker_completed", True),))
    rt.close_tasks(((parent, "succeeded", "worker_completed", False),))


def celery_job(rt: AdapterRuntime, n: int) -> None:
    """The ledger calls of one Celery task that succeeds on its first delivery."""
    parent = str(uuid.uuid5(NS, f"c{n}"))
    fresh = str(uuid.uuid5(NS, f"t{n}"))
    led = rt.ledger
    with led.atomic():
        rt.open_logical(parent, delivery_required=False, name="bench.noop", owner=True)
        attempt = rt.claim_attempt(parent, name="bench.noop", expected=[], fresh_id=fresh)
    rt.hold(attempt, parent)
    with led.atomic():
        rt.close_tasks(
            (
                (attempt, "succeeded", "worker_completed", True),
                (parent, "succeeded", "worker_completed", False),
            )
        )
    rt.release(attempt, parent)


FLOWS = {"dramatiq": dramatiq_job, "celery": celery_job}


def _category(func: tuple[str, int, str]) -> str:
    filename, _line, name = func
    if "sqlite3.Connection" in name or "sqlite3.Cursor" in name:
        return "sqlite"
    if name in ("row_to_task", "row_is_valid", "_float", "__init__") and "ledger.py" in filename:
        return "rows_and_tasks"
    if filename.endswith("model.py"):
        return "validation"
    if "lock" in name or "acquire" in name or "release" in name:
        return "locks"
    return "python"


def profile(flow: str, jobs: int) -> dict[str, float]:
    """CPU share by category (cProfile's own time per function, summed)."""
    with tempfile.TemporaryDirectory(prefix="tsg-jobcost-") as base:
        rt = _runtime(os.path.join(base, "tasks.sqlite"))
        job = FLOWS[flow]
        job(rt, -1)
        prof = cProfile.Profile()
        prof.enable()
        for n in range(jobs):
            job(rt, n)
        prof.disable()
        rt.close()
    stats = pstats.Stats(prof)
    shares: dict[str, float] = {}
    for func, (_cc, _nc, tottime, _ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        key = _category(func)
        shares[key] = shares.get(key, 0.0) + tottime
    total = sum(shares.values()) or 1.0
    return {k: round(v / total, 3) for k, v in sorted(shares.items())}


def _runtime(path: str) -> AdapterRuntime:
    settings = resolve_settings(db=path, environ={})
    return AdapterRuntime(settings, logger=logging.getLogger("bench"))


def write_set(flow: str, jobs: int) -> dict[str, float]:
    """Statements, rows, events, commits and WAL pages per job."""
    with tempfile.TemporaryDirectory(prefix="tsg-jobcost-") as base:
        path = os.path.join(base, "tasks.sqlite")
        rt = _runtime(path)
        job = FLOWS[flow]
        job(rt, -1)
        conn = rt.ledger._db.writer()  # measurement only: trace the writer connection
        page = conn.execute("PRAGMA page_size").fetchone()[0]
        conn.execute("PRAGMA wal_autocheckpoint=0")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        events0 = conn.execute("SELECT count(*) FROM tsg_events").fetchone()[0]
        counts = {"statements": 0, "commits": 0, "begins": 0}

        last = [""]

        def trace(sql: str) -> None:
            # A trigger's program is traced with its statement's text again: count it once.
            if sql == last[0]:
                return
            last[0] = sql
            word = sql.lstrip().split(None, 1)[0].upper() if sql.strip() else ""
            if word == "COMMIT":
                counts["commits"] += 1
            elif word == "BEGIN":
                counts["begins"] += 1
            else:
                counts["statements"] += 1

        changes0 = conn.total_changes
        conn.set_trace_callback(trace)
        for n in range(jobs):
            job(rt, n)
        conn.set_trace_callback(None)
        changes = conn.total_changes - changes0
        events = conn.execute("SELECT count(*) FROM tsg_events").fetchone()[0] - events0
        wal_bytes = os.path.getsize(path + "-wal")
        rt.close()
    return {
        "statements": round(counts["statements"] / jobs, 2),
        "commits": round(counts["commits"] / jobs, 2),
        "rows_changed": round(changes / jobs, 2),  # task rows and event rows (trigger rows too)
        "events": round(events / jobs, 2),
        "wal_pages": round(max(0, wal_bytes - 32) / (page + 24) / jobs, 2),
    }


def cpu_round(flow: str, jobs: int, threads: int) -> float:
    """CPU milliseconds per job (whole process: every thread, SQLite included)."""
    with tempfile.TemporaryDirectory(prefix="tsg-jobcost-") as base:
        rt = _runtime(os.path.join(base, "tasks.sqlite"))
        job = FLOWS[flow]
        job(rt, -1)
        per = jobs // threads

        def run(offset: int) -> None:
            for n in range(offset, offset + per):
                job(rt, n)

        workers = [threading.Thread(target=run, args=(i * per,)) for i in range(threads)]
        start = time.process_time()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        cpu = time.process_time() - start
        rt.close()
    return cpu * 1000 / (per * threads)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    result: dict[str, Any] = {"benchmark": "job_cost", "threads": args.threads,
                              "jobs_per_round": args.jobs, "rounds": args.rounds}
    cpus: dict[str, list[float]] = {flow: [] for flow in FLOWS}
    for _ in range(args.rounds):
        for flow in FLOWS:  # alternate the flows round by round
            cpus[flow].append(cpu_round(flow, args.jobs, args.threads))
    for flow in FLOWS:
        result[flow] = {
            "cpu_ms_per_job": round(statistics.median(cpus[flow]), 3),
            "cpu_ms_rounds": [round(c, 3) for c in cpus[flow]],
            **write_set(flow, min(args.jobs, 300)),
            "cpu_share": profile(flow, min(args.jobs, 1000)),
        }
    result["loadavg_1m"] = round(os.getloadavg()[0], 2)
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
