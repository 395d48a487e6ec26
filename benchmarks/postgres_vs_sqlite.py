"""The PostgreSQL ledger beside the SQLite ledger, in one run, one JSON object.

- ``transitions``: create/start/close through the API (each its own committed transaction)
  from 1 process (rounds alternate between the backends) and from N processes (default 8),
  with errors counted (``transitions.py``'s own loops, run on each backend);
- ``adapters``: ``celery_overhead.py`` and ``dramatiq_overhead.py`` run once per backend
  (``--db``): each run measures its own bare baseline beside the guarded worker;
- ``scale``: reconcile apply, dry-run, doctor and status at ``--scale`` tasks (default
  1,000,000), each in a fresh client process (wall time, CPU and the client's peak RSS; the
  PostgreSQL server's memory is not the client's). The fixture is ``scale.py``'s: the same
  rows and events the API writes. SQLite: ``scale.build``. PostgreSQL's fast path:
  ``COPY`` of the same rows into the ledger's tables (the insert trigger still writes every
  ``created`` event; the later events are copied), one live owner (this process, holding its
  session lock as a real owner does) and one dead one (a token nobody locks); doctor must
  call it healthy before anything is measured.

The PostgreSQL ledger lives in a fresh schema of database ``test`` on 127.0.0.1:5432 (override
with ``--pg``), dropped afterwards.

    .venv/bin/python benchmarks/postgres_vs_sqlite.py [--seconds 3] [--processes 8]
        [--scale 1000000] [--skip transitions adapters scale]

Not a test: nothing is asserted; targets are printed beside the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import _pg_fixture  # noqa: E402
import scale  # noqa: E402
import transitions  # noqa: E402
from task_state_guard import Ledger  # noqa: E402

PG_BASE = "postgresql://postgres@127.0.0.1:5432/test"
TARGETS = {
    "transitions_8_processes_per_s": 5000,
    "reconcile_apply_seconds_1m": 10,
    "status_seconds_1m": 2,
    "client_peak_rss_mb": 100,
}


def _pg_url(base: str) -> str:
    return f"{base}?schema=tsgb_{uuid.uuid4().hex[:12]}"


def _drop(url: str) -> None:
    from task_state_guard_postgres import drop_schema

    drop_schema(url)


# ----------------------------------------------------------------------------- transitions


def bench_transitions(base: str, pg_base: str, seconds: float, rounds: int,
                      processes: int) -> dict[str, Any]:
    targets = {"sqlite": os.path.join(base, "one", "tasks.sqlite"), "postgresql": _pg_url(pg_base)}
    try:
        return _transitions(targets, base, pg_base, seconds, rounds, processes)
    finally:
        _drop(targets["postgresql"])


def _transitions(targets: dict[str, str], base: str, pg_base: str, seconds: float, rounds: int,
                 processes: int) -> dict[str, Any]:
    ops = dict.fromkeys(targets, 0.0)
    took = dict.fromkeys(targets, 0.0)
    cpu = dict.fromkeys(targets, 0.0)
    for i in range(rounds):
        order = list(targets) if i % 2 == 0 else list(reversed(targets))
        for name in order:
            done, elapsed, used = transitions.ledger_round(targets[name], seconds)
            ops[name] += done
            took[name] += elapsed
            cpu[name] += used
    out: dict[str, Any] = {}
    for name in targets:
        out[name] = {
            "one_process_transitions_per_s": round(ops[name] / took[name], 1),
            "one_process_cpu_us_per_transition": round(cpu[name] * 1e6 / ops[name], 1),
        }
    for name in targets:  # a fresh ledger each, so the 1-process rows do not weigh on it
        fresh = (os.path.join(base, "multi", "tasks.sqlite") if name == "sqlite"
                 else _pg_url(pg_base))
        try:
            out[name][f"{processes}_processes"] = transitions.multiprocess(
                fresh, processes, seconds * 2)
        finally:
            if name == "postgresql":
                _drop(fresh)
    return out


# ----------------------------------------------------------------------------- adapters


def _run_json(cmd: list[str]) -> dict[str, Any]:
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        return {"error": f"exit {proc.returncode}", "stderr_tail": proc.stderr[-2000:]}
    data: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return data


def bench_adapters(pg_url: str, args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, db in (("sqlite", None), ("postgresql", pg_url)):
        extra = ["--db", db] if db else []
        celery = _run_json([sys.executable, os.path.join(HERE, "celery_overhead.py"),
                            "--tasks", str(args.celery_tasks), "--sleep-tasks",
                            str(args.celery_sleep_tasks), "--rounds", str(args.adapter_rounds),
                            *extra])
        dramatiq = _run_json([sys.executable, os.path.join(HERE, "dramatiq_overhead.py"),
                              "--messages", str(args.dramatiq_messages), "--rounds",
                              str(args.adapter_rounds), *extra])
        out[name] = {"celery": _celery_summary(celery), "dramatiq": _dramatiq_summary(dramatiq)}
    return out


def _celery_summary(data: dict[str, Any]) -> dict[str, Any]:
    if "results" not in data:
        return data
    summary: dict[str, Any] = {"loadavg_1m": data.get("loadavg_1m")}
    for task, entry in data["results"].items():
        summary[task] = {k: entry.get(k) for k in (
            "with_adapter_tasks_per_s", "without_adapter_tasks_per_s",
            "ratio_with_over_without", "cpu_ratio_without_over_with",
            "ledger_cpu_ms_per_task")}
    return summary


def _dramatiq_summary(data: dict[str, Any]) -> dict[str, Any]:
    keys = ("guarded_messages_per_s", "plain_messages_per_s", "ratio", "cpu_ratio",
            "ledger_tasks", "ledger_healthy", "error", "stderr_tail")
    return {k: data[k] for k in keys if k in data}


# ----------------------------------------------------------------------------- scale


def pg_build(url: str, size: int) -> tuple[float, Ledger]:
    """Bulk-load ``size`` tasks into a PostgreSQL ledger with COPY (``_pg_fixture.build``);
    returns (now, holder): the holder ledger is this process's live owner (keep it open while
    measuring)."""
    return _pg_fixture.build(url, size)


def _measure_all(db: str, now: float) -> dict[str, Any]:
    results: dict[str, Any] = {}
    results["doctor_before"] = scale.measure(db, "doctor", now)
    results["reconcile_dry_run"] = scale.measure(db, "dry_run", now)
    results["status"] = scale.measure(db, "status", now)
    results["reconcile_apply"] = scale.measure(db, "apply", now)
    results["doctor"] = scale.measure(db, "doctor", now)
    results["status_after"] = scale.measure(db, "status", now)
    return results


def bench_scale(base: str, pg_base: str, size: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    path = os.path.join(base, f"scale-{size}", "tasks.sqlite")
    started = time.perf_counter()
    now = scale.build(path, size)
    load = time.perf_counter() - started
    holder = Ledger(path)  # keeps the WAL present: the live-ledger case, as scale.py
    holder.heartbeat_many([])
    try:
        out["sqlite"] = {"tasks": size, "load_seconds": round(load, 1), **_measure_all(path, now)}
    finally:
        holder.close()
    url = _pg_url(pg_base)
    try:
        started = time.perf_counter()
        now, pg_holder = pg_build(url, size)
        load = time.perf_counter() - started
        try:
            out["postgresql"] = {"tasks": size, "load_seconds": round(load, 1),
                                 "load_method": "COPY (insert trigger writes created events)",
                                 **_measure_all(url, now)}
        finally:
            pg_holder.close()
    finally:
        _drop(url)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="per transitions round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--scale", type=int, default=1_000_000)
    parser.add_argument("--celery-tasks", type=int, default=1000)
    parser.add_argument("--celery-sleep-tasks", type=int, default=200)
    parser.add_argument("--dramatiq-messages", type=int, default=1000)
    parser.add_argument("--adapter-rounds", type=int, default=3)
    parser.add_argument("--pg", default=PG_BASE, help="PostgreSQL database URL (no schema)")
    parser.add_argument("--skip", nargs="*", default=[],
                        choices=("transitions", "adapters", "scale"))
    args = parser.parse_args()
    report: dict[str, Any] = {
        "benchmark": "postgres_vs_sqlite",
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "targets": TARGETS,
    }
    with tempfile.TemporaryDirectory(prefix="tsg-pg-vs-sqlite-") as base:
        if "transitions" not in args.skip:
            report["transitions"] = bench_transitions(
                base, args.pg, args.seconds, args.rounds, args.processes)
        if "adapters" not in args.skip:
            url = _pg_url(args.pg)
            try:
                report["adapters"] = bench_adapters(url, args)
            finally:
                _drop(url)
        if "scale" not in args.skip:
            report["scale"] = bench_scale(base, args.pg, args.scale)
    report["loadavg_1m_at_end"] = round(os.getloadavg()[0], 2)
    print(json.dumps(report, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
