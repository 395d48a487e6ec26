"""Overhead of task-state-guard-celery on a real prefork worker (concurrency 2, Redis).

    python benchmarks/celery_overhead.py [--tasks 2000] [--sleep-tasks 300] [--rounds 3]

Two real ``celery worker`` processes run side by side on their own queues, one with
``task_state_guard_celery.install(app)`` and one without. Rounds alternate between them
(A B B A ...) in one invocation. In each round the worker's consumer is paused, N
messages are published, the consumer is resumed and the clock runs until every task has
finished (each task body increments one Redis counter so completion is observable; the
same body runs in both variants). Prints one JSON object with tasks/s for each variant and
the ratio with/without, for a no-op task and for a 10 ms task.

Needs Redis at 127.0.0.1:6379 (uses DB 6 and private queue names). Not a test: no
assertion, no fixed-time threshold.
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

import redis as redis_lib

HERE = Path(__file__).resolve().parent
REDIS_URL = "redis://127.0.0.1:6379/6"

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
    def __init__(self, root: Path, name: str, adapter: bool) -> None:
        self.queue = f"tsg-bench-{name}-{uuid.uuid4().hex[:8]}"
        self.node = f"{name}-{uuid.uuid4().hex[:6]}@bench"
        ledger_dir = root / f"ledger-{name}"
        ledger_dir.mkdir(mode=0o700)
        env = dict(os.environ)
        env.update(
            {
                "TSG_BENCH_QUEUE": self.queue,
                "TSG_BENCH_ADAPTER": "1" if adapter else "0",
                "TSG_DB": str(ledger_dir / "tasks.sqlite"),
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
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)


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


def _round(client: Any, worker: _Worker, task: str, n: int, r: Any) -> float:
    key = f"tsg-bench-count-{uuid.uuid4().hex}"
    client.control.cancel_consumer(worker.queue, destination=[worker.node], reply=True)
    for _ in range(n):
        client.send_task(task, args=[key], queue=worker.queue)
    start = time.perf_counter()
    client.control.add_consumer(worker.queue, destination=[worker.node], reply=True)
    deadline = time.monotonic() + 600
    while int(r.get(key) or 0) < n:
        if time.monotonic() > deadline:
            raise SystemExit(f"round did not finish: {r.get(key)}/{n}")
        time.sleep(0.002)
    elapsed = time.perf_counter() - start
    r.delete(key)
    return n / elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=2000, help="no-op tasks per round")
    parser.add_argument("--sleep-tasks", type=int, default=300, help="10 ms tasks per round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per variant and task")
    args = parser.parse_args()

    r = redis_lib.Redis.from_url(REDIS_URL)
    r.ping()
    root = Path(tempfile.mkdtemp(prefix="tsg-celery-bench-"))
    workers = {"with_adapter": _Worker(root, "with", True),
               "without_adapter": _Worker(root, "without", False)}
    clients = {name: _client(w.queue) for name, w in workers.items()}
    try:
        for name, worker in workers.items():
            _wait_ready(clients[name], worker)
        results: dict[str, Any] = {}
        for task, n in (("bench.noop", args.tasks), ("bench.sleep10ms", args.sleep_tasks)):
            rates: dict[str, list[float]] = {name: [] for name in workers}
            # warm-up, not measured
            for name, worker in workers.items():
                _round(clients[name], worker, task, max(50, n // 10), r)
            order = list(workers)
            for i in range(args.rounds):
                for name in order if i % 2 == 0 else reversed(order):
                    rates[name].append(_round(clients[name], workers[name], task, n, r))
            with_rate = statistics.median(rates["with_adapter"])
            without_rate = statistics.median(rates["without_adapter"])
            results[task] = {
                "tasks_per_round": n,
                "with_adapter_tasks_per_s": round(with_rate, 1),
                "without_adapter_tasks_per_s": round(without_rate, 1),
                "ratio_with_over_without": round(with_rate / without_rate, 3),
                "rounds": {k: [round(v, 1) for v in vs] for k, vs in rates.items()},
            }
        out = {
            "benchmark": "celery_overhead",
            "pool": "prefork",
            "concurrency": 2,
            "broker": "redis",
            "rounds": args.rounds,
            "statistic": "median tasks/s over alternating rounds",
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "loadavg_1m": round(os.getloadavg()[0], 2),
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
