"""A LangGraph server on PostgreSQL under concurrent requests: latency guarded against plain.

Two real uvicorn servers run side by side (the FastAPI shape and the graph of
``examples/fastapi_langgraph``: ``plan -> gather -> answer``, no model, no network), each with an
``AsyncPostgresSaver`` on a pool of ``--pool`` connections in a scratch schema of database
``test``; the guarded one wraps the graph with ``task_state_guard_langgraph.guard`` and a
PostgreSQL ledger in another scratch schema. Rounds alternate between the servers; in each,
``--requests`` ``POST /questions`` (a fresh thread each) are sent with ``--concurrency``
in flight at once (httpx, asyncio), and the latency of every request is recorded.

Prints one JSON object: per round p50 / p95 latency and requests/s of each server, the ratio
p50 guarded / plain (the issue's target: at most 1.25), the server process's CPU and its
PostgreSQL backends' CPU per request (found by ``application_name``), and their medians over
the rounds. Not a test: nothing is asserted. Schemas are dropped afterwards.

    .venv/bin/python benchmarks/langgraph_server.py [--rounds 5] [--requests 200]
        [--concurrency 20] [--pool 10] [--pg URL]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import _bench  # noqa: E402

MODULE = Path(__file__).stem


def make_app() -> Any:
    """The server (role ``serve``): settings from the environment."""
    from contextlib import asynccontextmanager

    from fastapi import FastAPI
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
    from psycopg.rows import dict_row
    from psycopg_pool import AsyncConnectionPool

    guarded = os.environ.get("TSG_BENCH_GUARD") == "1"

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> Any:
        pool = AsyncConnectionPool(
            os.environ["TSG_BENCH_CHECKPOINTS"], min_size=int(os.environ["TSG_BENCH_POOL"]),
            max_size=int(os.environ["TSG_BENCH_POOL"]), open=False,
            kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row},
        )
        await pool.open(wait=True)
        saver = AsyncPostgresSaver(pool)  # type: ignore[arg-type]
        await saver.setup()
        sys.path.insert(0, str(HERE.parent / "examples" / "fastapi_langgraph"))
        from graph import build  # the example's graph: plan -> gather -> answer

        graph: Any = build(saver)
        if guarded:
            from task_state_guard_langgraph import guard

            graph = guard(graph, db=os.environ["TSG_DB"])
        app.state.graph = graph
        try:
            yield
        finally:
            if guarded:
                graph.close()
            await pool.close()

    app = FastAPI(lifespan=lifespan)

    @app.post("/questions")
    async def ask(body: dict[str, str]) -> dict[str, Any]:
        config = {"configurable": {"thread_id": body["thread_id"]}}
        out = await app.state.graph.ainvoke({"question": body["question"]}, config)
        return {"answer": out["answer"]}

    @app.get("/healthz")
    async def healthz() -> dict[str, Any]:
        return {"ok": True}

    return app


if os.environ.get("TSG_BENCH_ROLE") == "serve":  # imported by uvicorn
    app = make_app()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Server:
    """One uvicorn process (its own session, so its CPU can be read from /proc)."""

    def __init__(self, name: str, guarded: bool, pg: str, pool: int, root: Path) -> None:
        self.name = name
        self.port = _free_port()
        self.checkpoints = _bench.pg_url(pg, prefix="tsgbcp")
        self.ledger = _bench.pg_url(pg, prefix="tsgbl") if guarded else None
        base, schema = _bench.split_url(self.checkpoints)
        import psycopg

        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f'CREATE SCHEMA "{schema}"')
        sep = "&" if "?" in base else "?"
        env = _bench.python_env({
            "TSG_BENCH_ROLE": "serve", "TSG_BENCH_GUARD": "1" if guarded else "0",
            "TSG_BENCH_POOL": str(pool),
            "TSG_BENCH_CHECKPOINTS": f"{base}{sep}options=-csearch_path%3D{schema}",
            "PGAPPNAME": _bench.app_name(),
        })
        if self.ledger:
            env["TSG_DB"] = self.ledger
        self.server_cpu = _bench.ServerCpu(pg, env["PGAPPNAME"])
        self.log = root / f"{name}.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "uvicorn", f"{MODULE}:app", "--host", "127.0.0.1",
                 "--port", str(self.port), "--log-level", "warning", "--no-access-log"],
                cwd=str(HERE), env=env, stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def wait_ready(self, timeout: float = 90) -> None:
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit("server exited:\n" + self.log.read_text(errors="replace"))
            try:
                if httpx.get(self.url("/healthz"), timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise SystemExit("server not ready:\n" + self.log.read_text(errors="replace"))

    def stop(self) -> None:
        _bench.stop_session(self.proc)
        self.server_cpu.close()
        for url in (self.checkpoints, self.ledger):
            if url:
                _bench.drop_pg_schema(url)


async def _load(server: Server, requests: int, concurrency: int) -> tuple[list[float], float]:
    """Send ``requests`` questions, ``concurrency`` at once: (latencies in ms, wall seconds)."""
    import httpx

    gate = asyncio.Semaphore(concurrency)
    latencies: list[float] = []

    async def one(client: httpx.AsyncClient) -> None:
        async with gate:
            start = time.perf_counter()
            reply = await client.post(server.url("/questions"), json={
                "thread_id": uuid.uuid4().hex, "question": "What is sqlite and celery?"})
            latencies.append((time.perf_counter() - start) * 1000)
            if reply.status_code != 200:
                raise SystemExit(f"{server.name}: HTTP {reply.status_code}: {reply.text[:300]}")

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        start = time.perf_counter()
        await asyncio.gather(*(one(client) for _ in range(requests)))
        return latencies, time.perf_counter() - start


def _threads(pid: int) -> int:
    """The number of threads of process ``pid`` (0 when it is gone)."""
    try:
        return len(os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return 0


class Peaks:
    """The most PostgreSQL connections (the server's ``application_name``) and threads the
    server process held at once, sampled every 20 ms while a round runs."""

    def __init__(self, server: Server) -> None:
        self.connections = 0
        self.threads = 0
        self._server = server
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while True:
            self.connections = max(self.connections, len(self._server.server_cpu.pids()))
            self.threads = max(self.threads, _threads(self._server.proc.pid))
            if self._stop.wait(0.02):
                return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def measure(server: Server, requests: int, concurrency: int) -> dict[str, float]:
    server.server_cpu.start()
    cpu0 = _bench.session_cpu_seconds(server.proc.pid) or 0.0
    peaks = Peaks(server)
    try:
        latencies, wall = asyncio.run(_load(server, requests, concurrency))
    finally:
        peaks.stop()
    cpu = ((_bench.session_cpu_seconds(server.proc.pid) or 0.0) - cpu0) * 1000 / requests
    backends = server.server_cpu.seconds() * 1000 / requests
    ordered = sorted(latencies)
    return {"p50_ms": round(statistics.median(ordered), 1),
            "p95_ms": round(ordered[int(0.95 * (len(ordered) - 1))], 1),
            "requests_per_s": round(requests / wall, 1),
            "server_cpu_ms_per_request": round(cpu, 3),
            "backend_cpu_ms_per_request": round(backends, 3),
            "peak_pg_connections": peaks.connections, "peak_threads": peaks.threads}


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=200, help="requests per round")
    parser.add_argument("--concurrency", type=int, default=20)
    parser.add_argument("--pool", type=int, default=10, help="checkpointer pool size")
    parser.add_argument("--pg", default=_bench.PG_BASE)
    args = parser.parse_args()
    load_start = _bench.loadavg()
    with tempfile.TemporaryDirectory(prefix="tsg-lg-server-") as tmp:
        servers = {name: Server(name, name == "guarded", args.pg, args.pool, Path(tmp))
                   for name in ("plain", "guarded")}
        try:
            for server in servers.values():
                server.wait_ready()
            for server in servers.values():  # warm-up: pools, prepared plans, caches
                asyncio.run(_load(server, max(20, args.requests // 5), args.concurrency))
            rounds: list[dict[str, Any]] = []
            for i in range(args.rounds):
                order = ["plain", "guarded"] if i % 2 == 0 else ["guarded", "plain"]
                got = {name: measure(servers[name], args.requests, args.concurrency)
                       for name in order}
                g, p = got["guarded"], got["plain"]
                rounds.append({
                    "plain": p, "guarded": g,
                    "p50_ratio_guarded_over_plain": round(g["p50_ms"] / p["p50_ms"], 3),
                    "throughput_ratio": round(g["requests_per_s"] / p["requests_per_s"], 3),
                    "extra_pg_connections": g["peak_pg_connections"] - p["peak_pg_connections"],
                    "extra_threads": g["peak_threads"] - p["peak_threads"],
                    "ledger_cpu_ms_per_request": round(
                        g["server_cpu_ms_per_request"] + g["backend_cpu_ms_per_request"]
                        - p["server_cpu_ms_per_request"] - p["backend_cpu_ms_per_request"], 3),
                    # plain CPU / guarded CPU (server process + its backends): the throughput
                    # ratio of a CPU-bound host, the figure to compare on a loaded machine
                    "cpu_ratio": round(
                        (p["server_cpu_ms_per_request"] + p["backend_cpu_ms_per_request"])
                        / (g["server_cpu_ms_per_request"] + g["backend_cpu_ms_per_request"]), 3),
                })
        finally:
            for server in servers.values():
                server.stop()
    summary = {
        f"median_{side}_{key}": _bench.median(r[side][key] for r in rounds)
        for side in ("plain", "guarded") for key in rounds[0]["plain"]
    }
    for key in ("p50_ratio_guarded_over_plain", "throughput_ratio", "ledger_cpu_ms_per_request",
                "cpu_ratio", "extra_pg_connections", "extra_threads"):
        summary[f"median_{key}"] = _bench.median(r[key] for r in rounds)
    print(json.dumps({
        "benchmark": "langgraph_server", "requests_per_round": args.requests,
        "concurrency": args.concurrency, "checkpointer": "AsyncPostgresSaver",
        "checkpointer_pool": args.pool, "nodes": 3, "rounds": args.rounds,
        "target_p50_ratio": 1.25, "per_round": rounds, **summary,
        "loadavg_1m_at_start": load_start, **_bench.stamp(),
    }, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
