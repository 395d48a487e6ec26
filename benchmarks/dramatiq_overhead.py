"""Overhead of the TaskStateGuard Dramatiq middleware on no-op actors through a real worker.

Each round starts the real ``dramatiq`` CLI (2 processes x 2 threads by default) on Redis
(127.0.0.1:6379, DB 12, a private key namespace deleted afterwards), with or without
``install(broker)``, waits until it is ready, enqueues ``--messages`` no-op messages and
measures the time until Redis has none left (every message acked). Rounds alternate
plain / guarded (order flipped every other pair) in one invocation, and one JSON object is
printed: the median messages per second of each mode and the ratio guarded / plain (the
issue's target is >= 0.85). Not a test: nothing is asserted.

On a shared, noisy machine the wall-clock rates swing with other load, so each round also
reads the CPU time (user + system, from /proc on Linux) that the worker's processes spent
between "ready" and "drained": ``*_cpu_ms_per_message`` and ``cpu_ratio`` (plain CPU per
message / guarded CPU per message, i.e. the throughput ratio of a CPU-bound run on an
otherwise idle machine). Redis's own CPU is not included.

    .venv/bin/python benchmarks/dramatiq_overhead.py [--rounds 3] [--messages 2000]
        [--db PATH-OR-POSTGRESQL-URL]   # the guarded worker's ledger (default: fresh SQLite)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import dramatiq

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _bench
from _bench import session_cpu_seconds

REDIS_URL = "redis://127.0.0.1:6379/12"
HERE = Path(__file__).resolve().parent
MODULE = Path(__file__).stem

if os.environ.get("TSG_BENCH_ROLE") == "worker":  # imported by the dramatiq CLI
    from dramatiq.brokers.redis import RedisBroker

    broker = RedisBroker(  # type: ignore[no-untyped-call]
        url=REDIS_URL, namespace=os.environ["TSG_BENCH_NAMESPACE"]
    )
    if os.environ.get("TSG_BENCH_GUARD") == "1":
        from task_state_guard_dramatiq import install

        install(broker)  # TSG_DB from the environment; default graces and heartbeats
    dramatiq.set_broker(broker)

    @dramatiq.actor(queue_name=os.environ["TSG_BENCH_QUEUE"], max_retries=0)
    def noop() -> None:
        """Does nothing: the measurement is the per-message overhead."""


class Worker:
    """The real ``dramatiq`` CLI (guarded or plain) on a private Redis namespace and queue,
    with a producer for it; :meth:`stop` ends it and deletes the namespace's keys."""

    def __init__(self, guarded: bool, workdir: Path, processes: int, threads: int, db: str,
                 env: dict[str, str] | None = None) -> None:
        from dramatiq.brokers.redis import RedisBroker

        suffix = uuid.uuid4().hex[:10]
        self.namespace, self.queue = f"tsg-bench-{suffix}", f"tsg_bench_{suffix}"
        self.processes = processes
        full = dict(os.environ)
        full.update({"TSG_BENCH_ROLE": "worker", "TSG_BENCH_GUARD": "1" if guarded else "0",
                     "TSG_BENCH_NAMESPACE": self.namespace, "TSG_BENCH_QUEUE": self.queue,
                     "TSG_DB": db, **(env or {})})
        self.log_path = workdir / f"worker-{suffix}.log"
        self.producer = RedisBroker(  # type: ignore[no-untyped-call]
            url=REDIS_URL, namespace=self.namespace, middleware=[]
        )
        self.producer.declare_queue(self.queue)
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "dramatiq", MODULE, "-p", str(processes),
                 "-t", str(threads), "--path", str(HERE)],
                env=full, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )

    def wait_ready(self) -> None:
        deadline = time.monotonic() + 60
        while self.log_path.read_text(errors="replace").count("ready for action") \
                < self.processes:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"worker failed to start:\n{self.log_path.read_text()}")
            time.sleep(0.05)

    def enqueue(self, count: int) -> None:
        for _ in range(count):
            self.producer.enqueue(dramatiq.Message(
                queue_name=self.queue, actor_name="noop", args=(), kwargs={}, options={}))

    def pending(self) -> int:
        """Messages not acked yet."""
        return int(self.producer.client.hlen(f"{self.namespace}:{self.queue}.msgs"))

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
        keys = list(self.producer.client.scan_iter(match=f"{self.namespace}*"))
        if keys:
            self.producer.client.delete(*keys)
        self.producer.close()


def run_round(
    guarded: bool, messages: int, workdir: Path, processes: int, threads: int, db: str
) -> tuple[float, float | None, float | None]:
    """One round: (messages per second, worker CPU milliseconds per message or None, the
    PostgreSQL server's CPU milliseconds per message for the worker's backends or None)."""
    env: dict[str, str] = {}
    server: _bench.ServerCpu | None = None
    if guarded and _bench.is_postgres(db):
        env["PGAPPNAME"] = _bench.app_name()
        server = _bench.ServerCpu(db, env["PGAPPNAME"])
    worker = Worker(guarded, workdir, processes, threads, db, env)
    try:
        worker.wait_ready()
        if server is not None:
            server.start()
        cpu_start = session_cpu_seconds(worker.proc.pid)
        start = time.perf_counter()
        worker.enqueue(messages)
        while worker.pending() > 0:
            time.sleep(0.002)
        elapsed = time.perf_counter() - start
        cpu_end = session_cpu_seconds(worker.proc.pid)
        server_ms = None if server is None else server.seconds() * 1000 / messages
    finally:
        if server is not None:
            server.close()
        worker.stop()
    text = worker.log_path.read_text(errors="replace")
    if "TaskStateGuard ledger error" in text or "Unexpected failure" in text:
        raise SystemExit(f"ledger errors during the benchmark:\n{text}")
    cpu_ms = (
        None
        if cpu_start is None or cpu_end is None
        else (cpu_end - cpu_start) * 1000 / messages
    )
    return messages / elapsed, cpu_ms, server_ms


def _pair(got: dict[str, tuple[float, float | None, float | None]]) -> dict[str, float]:
    """One round's guarded / plain figures: ratios, and the ledger's CPU per message (the
    worker's extra CPU plus, on PostgreSQL, its backends' CPU)."""
    (g_rate, g_cpu, g_server), (p_rate, p_cpu, _) = got["guarded"], got["plain"]
    out = {"guarded_per_s": round(g_rate, 1), "plain_per_s": round(p_rate, 1),
           "ratio": round(g_rate / p_rate, 3)}
    if g_cpu is not None and p_cpu is not None:
        ledger = g_cpu - p_cpu + (g_server or 0.0)
        out.update({"guarded_cpu_ms": round(g_cpu, 3), "plain_cpu_ms": round(p_cpu, 3),
                    "ledger_cpu_ms": round(ledger, 3),
                    "cpu_ratio": round(p_cpu / (g_cpu + (g_server or 0.0)), 3)})
    if g_server is not None:
        out["ledger_server_cpu_ms"] = round(g_server, 3)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds per mode")
    parser.add_argument("--messages", type=int, default=2000, help="messages per round")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--db", default=None,
                        help="the guarded worker's ledger (a path or a postgresql:// URL); "
                        "default: a fresh SQLite file in a temporary directory")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="tsg-dramatiq-bench-"))
    db = args.db or str(workdir / "ledger" / "tasks.sqlite")
    rates: dict[str, list[float]] = {"plain": [], "guarded": []}
    cpus: dict[str, list[float]] = {"plain": [], "guarded": []}
    per_round: list[dict[str, float]] = []
    load_start = _bench.loadavg()
    try:
        for i in range(args.rounds):
            order = [False, True] if i % 2 == 0 else [True, False]
            got: dict[str, tuple[float, float | None, float | None]] = {}
            for with_guard in order:
                mode = "guarded" if with_guard else "plain"
                got[mode] = run_round(
                    with_guard, args.messages, workdir, args.processes, args.threads, db
                )
                rate, cpu_ms, _server = got[mode]
                rates[mode].append(rate)
                if cpu_ms is not None:
                    cpus[mode].append(cpu_ms)
            per_round.append(_pair(got))
        from task_state_guard import Ledger

        ledger = Ledger(db)
        tasks = ledger.status()["tasks"]
        healthy = ledger.doctor()["healthy"]
        ledger.close()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    plain = statistics.median(rates["plain"])
    guarded = statistics.median(rates["guarded"])
    result: dict[str, Any] = {
        "benchmark": "dramatiq_overhead",
        "broker": "redis",
        "ledger_backend": "postgresql" if db.startswith(("postgresql:", "postgres:"))
        else "sqlite",
        "processes": args.processes,
        "threads": args.threads,
        "messages_per_round": args.messages,
        "rounds_per_mode": args.rounds,
        "plain_messages_per_s": round(plain, 1),
        "guarded_messages_per_s": round(guarded, 1),
        "ratio": round(guarded / plain, 3),
        "target_ratio": 0.85,
        "plain_rounds": [round(r, 1) for r in rates["plain"]],
        "guarded_rounds": [round(r, 1) for r in rates["guarded"]],
        "ledger_tasks": tasks,
        "ledger_healthy": healthy,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "loadavg_1m_at_start": load_start,
        "loadavg_1m_at_end": _bench.loadavg(),
        "per_round": per_round,
        "ledger_cpu_ms_per_message": _bench.median(r.get("ledger_cpu_ms") for r in per_round),
        "ledger_server_cpu_ms_per_message": _bench.median(
            r.get("ledger_server_cpu_ms") for r in per_round),
    }
    if cpus["plain"] and cpus["guarded"]:
        plain_cpu = statistics.median(cpus["plain"])
        guarded_cpu = statistics.median(cpus["guarded"])
        result.update(
            {
                "plain_cpu_ms_per_message": round(plain_cpu, 3),
                "guarded_cpu_ms_per_message": round(guarded_cpu, 3),
                "cpu_ratio": round(plain_cpu / guarded_cpu, 3),
                "plain_cpu_rounds": [round(c, 3) for c in cpus["plain"]],
                "guarded_cpu_rounds": [round(c, 3) for c in cpus["guarded"]],
            }
        )
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
