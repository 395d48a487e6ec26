"""Overhead of task-state-guard-celery on a real prefork worker (concurrency 2, Redis).

    python benchmarks/celery_overhead.py [--tasks 2000] [--sleep-tasks 300] [--rounds 3]
        [--db PATH-OR-POSTGRESQL-URL]   # the adapter worker's ledger (default: fresh SQLite)

Three real ``celery worker`` processes run side by side on their own queues: one with
``task_state_guard_celery.install(app)``, one bare (no result backend, results ignored) and
one with Celery's own state tracking (a Redis result backend and ``task_track_started``: a
STARTED and a SUCCESS record per task). Rounds alternate between them in one invocation.
In each round the worker's consumer is paused, N messages are published, the consumer is
resumed and the clock runs until every task has finished (each task body increments one
Redis counter so completion is observable; the same body runs in every variant). Prints one
JSON object with tasks/s for each variant and the ratios with the adapter over bare and over
tracking, for a no-op task and for a 10 ms task.

Each round also reads the CPU time (user + system, from /proc on Linux) the worker's
processes spent in it: ``cpu_ms_per_task`` per variant and ``cpu_ratio_*`` (the other
variant's CPU per task over the adapter's: the throughput ratio of a CPU-bound host). Redis's
own CPU is not included (the tracking variant's result writes cost Redis CPU as well).

Needs Redis at 127.0.0.1:6379 (uses DB 6 and private queue names). Not a test: no
assertion, no fixed-time threshold.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import redis as redis_lib

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import _bench  # noqa: E402
from _bench import session_cpu_seconds  # noqa: E402

REDIS_URL = "redis://127.0.0.1:6379/6"
RESULT_URL = "redis://127.0.0.1:6379/7"

app: Any = None
_redis: Any = None

if os.environ.get("TSG_BENCH_QUEUE"):
    from celery import Celery  # type: ignore[import-untyped]

    app = Celery("bench", broker=REDIS_URL, set_as_current=False)
    app.conf.update(
        task_default_queue=os.environ["TSG_BENCH_QUEUE"],
        task_ignore_result=True,
        worker_prefetch_multiplier=4,
        broker_connection_retry_on_startup=True,
    )
    if os.environ.get("TSG_BENCH_TRACK") == "1":  # Celery's own state tracking
        app.conf.update(
            result_backend=RESULT_URL,
            task_ignore_result=False,
            task_track_started=True,
            result_expires=600,
        )
    if os.environ.get("TSG_BENCH_ADAPTER") == "1":
        import task_state_guard_celery

        task_state_guard_celery.install(app)

    def _counter() -> Any:
        global _redis
        if _redis is None or _redis[0] != os.getpid():
            _redis = (os.getpid(), redis_lib.Redis.from_url(REDIS_URL))
        return _redis[1]

    @app.task(name="bench.noop")
    def noop(key: str) -> None:
        _counter().incr(key)

    @app.task(name="bench.sleep10ms")
    def sleep10ms(key: str) -> None:
        time.sleep(0.01)
        _counter().incr(key)


class _Worker:
    def __init__(
        self, root: Path, name: str, adapter: bool, track: bool = False, db: str | None = None
    ) -> None:
        self.queue = f"tsg-bench-{name}-{uuid.uuid4().hex[:8]}"
        self.node = f"{name}-{uuid.uuid4().hex[:6]}@bench"
        ledger_dir = root / f"ledger-{name}"
        ledger_dir.mkdir(mode=0o700)
        env = dict(os.environ)
        self.server: _bench.ServerCpu | None = None
        if adapter and _bench.is_postgres(db):
            env["PGAPPNAME"] = _bench.app_name()  # finds the worker's PostgreSQL backends
            self.server = _bench.ServerCpu(str(db), env["PGAPPNAME"])
        env.update(
            {
                "TSG_BENCH_QUEUE": self.queue,
                "TSG_BENCH_ADAPTER": "1" if adapter else "0",
                "TSG_BENCH_TRACK": "1" if track else "0",
                "TSG_DB": db or str(ledger_dir / "tasks.sqlite"),
                "PYTHONPATH": os.pathsep.join(
                    [str(HERE)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
                ),
            }
        )
        self.log = root / f"{name}.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [
                    sys.executable, "-m", "celery", "-A", "celery_overhead", "worker",
                    "-P", "prefork", "-c", "2", "-Q", self.queue, "-n", self.node,
                    "--without-gossip", "--without-mingle", "--without-heartbeat",
                    "-l", "WARNING",
                ],
                env=env, cwd=str(root), stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )

    def stop(self) -> None:
        if self.server is not None:
            self.server.close()
        _bench.stop_session(self.proc)


def _client(queue: str) -> Any:
    from celery import Celery  # type: ignore[import-untyped]

    client = Celery("bench-client", broker=REDIS_URL, set_as_current=False)
    client.conf.task_default_queue = queue
    return client


def _wait_ready(client: Any, worker: _Worker, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if worker.proc.poll() is not None:
            raise SystemExit("worker exited:\n" + worker.log.read_text(errors="replace"))
        replies = client.control.ping(destination=[worker.node], timeout=0.5)
        if replies:
            return
    raise SystemExit("worker not ready:\n" + worker.log.read_text(errors="replace"))


def _round(
    client: Any, worker: _Worker, task: str, n: int, r: Any
) -> tuple[float, float | None, float | None]:
    """One round: (tasks per second, worker CPU milliseconds per task or None, the CPU
    milliseconds per task of the worker's PostgreSQL backends or None)."""
    key = f"tsg-bench-count-{uuid.uuid4().hex}"
    client.control.cancel_consumer(worker.queue, destination=[worker.node], reply=True)
    ids = [client.send_task(task, args=[key], queue=worker.queue).id for _ in range(n)]
    if worker.server is not None:
        worker.server.start()
    cpu_start = session_cpu_seconds(worker.proc.pid)
    start = time.perf_counter()
    client.control.add_consumer(worker.queue, destination=[worker.node], reply=True)
    deadline = time.monotonic() + 600
    while int(r.get(key) or 0) < n:
        if time.monotonic() > deadline:
            raise SystemExit(f"round did not finish: {r.get(key)}/{n}")
        time.sleep(0.002)
    elapsed = time.perf_counter() - start
    cpu_end = session_cpu_seconds(worker.proc.pid)
    server = None if worker.server is None else worker.server.seconds() * 1000 / n
    r.delete(key)
    results = redis_lib.Redis.from_url(RESULT_URL)  # the tracking worker's records, if any
    for i in range(0, len(ids), 500):
        results.delete(*[f"celery-task-meta-{tid}" for tid in ids[i : i + 500]])
    results.close()
    cpu = None if cpu_start is None or cpu_end is None else (cpu_end - cpu_start) * 1000 / n
    return n / elapsed, cpu, server


def _pair(got: dict[str, tuple[float, float | None, float | None]]) -> dict[str, float]:
    """One round's figures: ratios with the adapter over bare and over tracking (wall and
    CPU) and the ledger's CPU per task (the worker's extra CPU plus its backends' CPU)."""
    w_rate, w_cpu, w_server = got["with_adapter"]
    b_rate, b_cpu, _ = got["without_adapter"]
    t_rate, t_cpu, _ = got["celery_tracking"]
    out = {"ratio_with_over_without": round(w_rate / b_rate, 3),
           "ratio_with_over_tracking": round(w_rate / t_rate, 3)}
    if w_cpu is not None and b_cpu is not None and t_cpu is not None:
        total = w_cpu + (w_server or 0.0)
        out.update({"ledger_cpu_ms": round(total - b_cpu, 3),
                    "cpu_ratio_without_over_with": round(b_cpu / total, 3),
                    "cpu_ratio_tracking_over_with": round(t_cpu / total, 3)})
    if w_server is not None:
        out["ledger_server_cpu_ms"] = round(w_server, 3)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=2000, help="no-op tasks per round")
    parser.add_argument("--sleep-tasks", type=int, default=300, help="10 ms tasks per round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per variant and task")
    parser.add_argument("--db", default=None,
                        help="the adapter worker's ledger (a path or a postgresql:// URL); "
                        "default: a fresh SQLite file in a temporary directory")
    args = parser.parse_args()
    load_start = _bench.loadavg()

    r = redis_lib.Redis.from_url(REDIS_URL)
    r.ping()
    root = Path(tempfile.mkdtemp(prefix="tsg-celery-bench-"))
    workers = {"with_adapter": _Worker(root, "with", True, db=args.db),
               "without_adapter": _Worker(root, "without", False),
               "celery_tracking": _Worker(root, "tracking", False, track=True)}
    clients = {name: _client(w.queue) for name, w in workers.items()}
    try:
        for name, worker in workers.items():
            _wait_ready(clients[name], worker)
        results: dict[str, Any] = {}
        for task, n in (("bench.noop", args.tasks), ("bench.sleep10ms", args.sleep_tasks)):
            rates: dict[str, list[float]] = {name: [] for name in workers}
            cpus: dict[str, list[float]] = {name: [] for name in workers}
            per_round: list[dict[str, float]] = []
            # warm-up, not measured
            for name, worker in workers.items():
                _round(clients[name], worker, task, max(50, n // 10), r)
            order = list(workers)
            for i in range(args.rounds):
                got: dict[str, tuple[float, float | None, float | None]] = {}
                for name in order if i % 2 == 0 else reversed(order):
                    got[name] = _round(clients[name], workers[name], task, n, r)
                    rate, cpu, _server = got[name]
                    rates[name].append(rate)
                    if cpu is not None:
                        cpus[name].append(cpu)
                per_round.append(_pair(got))
            med = {name: statistics.median(vs) for name, vs in rates.items()}
            entry: dict[str, Any] = {
                "tasks_per_round": n,
                "with_adapter_tasks_per_s": round(med["with_adapter"], 1),
                "without_adapter_tasks_per_s": round(med["without_adapter"], 1),
                "celery_tracking_tasks_per_s": round(med["celery_tracking"], 1),
                "ratio_with_over_without": round(med["with_adapter"] / med["without_adapter"], 3),
                "ratio_with_over_tracking": round(
                    med["with_adapter"] / med["celery_tracking"], 3
                ),
                "rounds": {k: [round(v, 1) for v in vs] for k, vs in rates.items()},
                "per_round": per_round,
            }
            for key in ("ledger_cpu_ms", "ledger_server_cpu_ms", "cpu_ratio_tracking_over_with",
                        "cpu_ratio_without_over_with"):
                entry[f"{key}_median_of_rounds"] = _bench.median(r.get(key) for r in per_round)
            if all(cpus.values()):
                cpu = {name: statistics.median(vs) for name, vs in cpus.items()}
                entry.update(
                    {
                        "cpu_ms_per_task": {k: round(v, 3) for k, v in cpu.items()},
                        "cpu_ratio_without_over_with": round(
                            cpu["without_adapter"] / cpu["with_adapter"], 3
                        ),
                        "cpu_ratio_tracking_over_with": round(
                            cpu["celery_tracking"] / cpu["with_adapter"], 3
                        ),
                        "ledger_cpu_ms_per_task": round(
                            cpu["with_adapter"] - cpu["without_adapter"], 3
                        ),
                    }
                )
            results[task] = entry
        out = {
            "benchmark": "celery_overhead",
            "pool": "prefork",
            "concurrency": 2,
            "broker": "redis",
            "ledger_backend": "postgresql"
            if (args.db or "").startswith(("postgresql:", "postgres:")) else "sqlite",
            "rounds": args.rounds,
            "statistic": "median tasks/s (and worker CPU per task) over alternating rounds",
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "loadavg_1m": round(os.getloadavg()[0], 2),
            "loadavg_1m_at_start": load_start,
            "results": results,
            "target_ratio": 0.85,
        }
        print(json.dumps(out, sort_keys=True))
        return 0
    finally:
        for worker in workers.values():
            worker.stop()
        for worker in workers.values():
            r.delete(worker.queue, f"_kombu.binding.{worker.queue}")
        for client in clients.values():
            client.close()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
