"""The ledger's write set and CPU per guarded job, in one process, through the frameworks' hooks.

One job of each adapter, first delivery succeeding, driven the way the framework drives the
adapter (so the same script measures today's code and any refactor of it):

- ``dramatiq``: a real ``StubBroker`` with its default middleware and
  ``task_state_guard_dramatiq.install(broker)``; per message the worker's hook sequence
  ``before_process_message``, the actor, ``after_process_message``, ``after_ack``;
- ``celery``: a real Celery app with ``task_state_guard_celery.install(app)``; per task
  ``Task.apply()`` (Celery's tracer: ``task_prerun``, the body, ``task_success``,
  ``task_postrun``).

Rounds alternate plain (no adapter) and guarded, each guarded round on a fresh ledger; the
ledger's CPU per job is guarded minus plain (``time.process_time``: every thread of this
process, SQLite or psycopg included) and, on PostgreSQL, the server CPU of this process's
backends (``/proc``, found by ``application_name``). Then one pass with :class:`_probe.Probe`
counts per job: statements, transactions and durable commits, rows changed (SQLite), events
and WAL pages (SQLite; ``wal_autocheckpoint`` held at 0). ``cpu_share``: cProfile's own time of
a guarded SQLite run by category (``--profile``). Prints one JSON object; nothing is asserted.

    .venv/bin/python benchmarks/job_cost.py [--jobs 1000] [--rounds 5]
        [--backends sqlite postgresql] [--flows celery dramatiq] [--pg URL] [--statements]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import sqlite3
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _bench
from _probe import Probe

Job = Callable[[], None]


class Harness:
    """One framework set up with (guarded) or without (plain) the adapter on ledger ``db``."""

    def __init__(self, flow: str, db: str | None) -> None:
        self.flow = flow
        self.db = db
        self._close: Callable[[], None] = lambda: None
        self.job: Job = (self._dramatiq if flow == "dramatiq" else self._celery)()

    def _dramatiq(self) -> Job:
        import dramatiq
        from dramatiq.broker import MessageProxy
        from dramatiq.brokers.stub import StubBroker

        broker = StubBroker()  # type: ignore[no-untyped-call]
        if self.db is not None:
            from task_state_guard_dramatiq import install

            middleware = install(broker, db=self.db)
            self._close = middleware.uninstall

        def noop() -> None:
            return None

        actor: Any = dramatiq.actor(noop, broker=broker, actor_name="bench.noop",
                                    queue_name="bench", max_retries=0)

        def job() -> None:
            message = MessageProxy(actor.message())
            broker.emit_before("process_message", message)
            result = actor.fn()
            broker.emit_after("process_message", message, result=result)
            broker.emit_after("ack", message)

        return job

    def _celery(self) -> Job:
        from celery import Celery  # type: ignore[import-untyped]

        app = Celery(f"jobcost-{uuid.uuid4().hex[:6]}", set_as_current=False)
        app.conf.update(task_ignore_result=True, task_store_eager_result=False)

        @app.task(name="bench.noop")  # type: ignore[untyped-decorator]
        def noop() -> None:
            return None

        if self.db is not None:
            import task_state_guard_celery

            task_state_guard_celery.install(app, db=self.db)
            self._close = lambda: task_state_guard_celery.uninstall(app)

        def job() -> None:
            noop.apply()

        return job

    def close(self) -> None:
        self._close()


class Ledgers:
    """Fresh ledgers of one backend (a file in a temporary directory, or a scratch schema)."""

    def __init__(self, backend: str, pg_base: str, root: str) -> None:
        self.backend = backend
        self.pg_base = pg_base
        self.root = root
        self.made: list[str] = []

    def new(self) -> str:
        if self.backend == "postgresql":
            url = _bench.pg_url(self.pg_base, prefix="tsgjc")
        else:
            url = os.path.join(self.root, uuid.uuid4().hex[:8], "tasks.sqlite")
        self.made.append(url)
        return url

    def drop(self, db: str) -> None:
        if self.backend == "postgresql":
            _bench.drop_pg_schema(db)

    def drop_all(self) -> None:
        for db in self.made:
            self.drop(db)


def timed_round(flow: str, db: str | None, jobs: int, warmup: int,
                server: _bench.ServerCpu | None) -> dict[str, float]:
    """CPU ms per job of one plain (db None) or guarded round: client, and server if any."""
    harness = Harness(flow, db)
    try:
        for _ in range(warmup):  # connections, schema, caches
            harness.job()
        if server is not None:
            server.start()
        cpu = time.process_time()
        wall = time.perf_counter()
        for _ in range(jobs):
            harness.job()
        cpu = time.process_time() - cpu
        wall = time.perf_counter() - wall
        out = {"client_cpu_ms": cpu * 1000 / jobs, "wall_ms": wall * 1000 / jobs}
        if server is not None:
            out["server_cpu_ms"] = server.seconds() * 1000 / jobs
        return out
    finally:
        harness.close()


def _count_table(backend: str, db: str, table: str) -> int | None:
    try:
        if backend == "postgresql":
            import psycopg

            base, schema = _bench.split_url(db)
            with psycopg.connect(base, autocommit=True, application_name="tsg-bench") as conn:
                return int(conn.execute(f'SELECT count(*) FROM "{schema}".{table}').fetchone()[0])
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            return int(conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0])
        finally:
            conn.close()
    except Exception:
        return None


def _pg_rows(db: str) -> int | None:
    """Rows inserted, updated and deleted in the ledger's schema (the server's counters)."""
    import psycopg

    base, schema = _bench.split_url(db)
    try:
        with psycopg.connect(base, autocommit=True, application_name="tsg-bench") as conn:
            conn.execute("SELECT pg_stat_clear_snapshot()")
            row = conn.execute(
                "SELECT coalesce(sum(n_tup_ins + n_tup_upd + n_tup_del), 0) "
                "FROM pg_stat_user_tables WHERE schemaname = %s", (schema,)).fetchone()
            return int(row[0])
    except Exception:
        return None


def write_set(flow: str, ledgers: Ledgers, jobs: int, statements: bool) -> dict[str, Any]:
    """Per job: statements, transactions, commits, rows, events (and WAL pages on SQLite)."""
    backend = ledgers.backend
    db = ledgers.new()
    probe = Probe(db if backend == "sqlite" else None)
    probe.install()
    rows0 = rows1 = None
    wal = 0
    try:
        setup = Harness(flow, db)  # creates the ledger; closing it flushes the server's
        for _ in range(3):  # table counters (a backend reports them when it ends)
            setup.job()
        setup.close()
        if backend == "postgresql":
            time.sleep(1.0)
            rows0 = _pg_rows(db)
        harness = Harness(flow, db)
        try:
            harness.job()  # opens this harness's connections (not counted below)
            if backend == "sqlite":  # start from an empty WAL (no reader is open now)
                conn = probe._saved["sqlite_connect"](db, isolation_level=None)
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                conn.close()
            events0 = _count_table(backend, db, "tsg_events")
            probe.reset()
            probe.capture = statements
            for _ in range(jobs):
                harness.job()
            counts = dict(probe.counts)
            rows = probe.rows() if backend == "sqlite" else None
            texts = dict(probe.statement_texts)
            if backend == "sqlite" and os.path.exists(db + "-wal"):
                wal = os.path.getsize(db + "-wal")  # before the last close removes it
        finally:
            harness.close()
    finally:
        probe.remove()
    out: dict[str, Any] = {k: round(v / jobs, 2) for k, v in counts.items()}
    events1 = _count_table(backend, db, "tsg_events")
    if events0 is not None and events1 is not None:
        out["events"] = round((events1 - events0) / jobs, 2)
    if backend == "sqlite":
        out["rows"] = round((rows or 0) / jobs, 2)
        page = sqlite3.connect(db).execute("PRAGMA page_size").fetchone()[0]
        out["wal_pages"] = round(max(0, wal - 32) / (page + 24) / jobs, 2)
    else:
        time.sleep(1.0)
        rows1 = _pg_rows(db)
        if rows0 is not None and rows1 is not None:  # the harness's first job included
            out["rows"] = round((rows1 - rows0) / (jobs + 1), 2)
    if statements:
        out["statement_texts"] = {t: round(n / jobs, 2) for t, n in texts.items()}
    ledgers.drop(db)
    return out


def _category(func: tuple[str, int, str]) -> str:
    filename, _line, name = func
    if "sqlite3.Connection" in name or "sqlite3.Cursor" in name:
        return "sqlite_calls"
    if "psycopg" in filename or "psycopg" in name:
        return "psycopg"
    for marker, label in (("task_state_guard_dramatiq", "adapter"),
                          ("task_state_guard_celery", "adapter"),
                          ("task_state_guard_postgres", "backend_postgres"),
                          ("task_state_guard/integration", "core_integration"),
                          ("task_state_guard", "core")):
        if marker in filename:
            return label
    if "/celery/" in filename or "/kombu/" in filename or "/dramatiq/" in filename:
        return "framework"
    if "lock" in name or "acquire" in name:
        return "locks"
    return "other_python"


def profile(flow: str, db: str, jobs: int) -> dict[str, float]:
    """Shares of cProfile's own time by category in a guarded round (framework included)."""
    harness = Harness(flow, db)
    try:
        for _ in range(20):
            harness.job()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(jobs):
            harness.job()
        prof.disable()
    finally:
        harness.close()
    stats = pstats.Stats(prof)
    shares: dict[str, float] = {}
    for func, (_cc, _nc, tottime, _ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        key = _category(func)
        shares[key] = shares.get(key, 0.0) + tottime
    total = sum(shares.values()) or 1.0
    return {k: round(v / total, 3) for k, v in sorted(shares.items())}


def measure_backend(backend: str, args: argparse.Namespace, root: str) -> dict[str, Any]:
    ledgers = Ledgers(backend, args.pg, root)
    server: _bench.ServerCpu | None = None
    if backend == "postgresql":
        name = _bench.app_name()
        os.environ["PGAPPNAME"] = name  # this process's ledger connections carry it
        server = _bench.ServerCpu(args.pg, name)
    per_round: dict[str, list[dict[str, float]]] = {flow: [] for flow in args.flows}
    try:
        for i in range(args.rounds):
            for flow in args.flows:
                modes = ("plain", "guarded") if i % 2 == 0 else ("guarded", "plain")
                got: dict[str, dict[str, float]] = {}
                for mode in modes:
                    db = ledgers.new() if mode == "guarded" else None
                    got[mode] = timed_round(flow, db, args.jobs, args.warmup,
                                            server if mode == "guarded" else None)
                    if db is not None:
                        ledgers.drop(db)
                entry = {
                    "plain_cpu_ms": got["plain"]["client_cpu_ms"],
                    "guarded_cpu_ms": got["guarded"]["client_cpu_ms"],
                    "ledger_client_cpu_ms": got["guarded"]["client_cpu_ms"]
                    - got["plain"]["client_cpu_ms"],
                }
                if "server_cpu_ms" in got["guarded"]:
                    entry["ledger_server_cpu_ms"] = got["guarded"]["server_cpu_ms"]
                    entry["ledger_cpu_ms"] = entry["ledger_client_cpu_ms"] + entry[
                        "ledger_server_cpu_ms"]
                else:
                    entry["ledger_cpu_ms"] = entry["ledger_client_cpu_ms"]
                per_round[flow].append({k: round(v, 4) for k, v in entry.items()})
        out: dict[str, Any] = {}
        for flow in args.flows:
            rounds = per_round[flow]
            summary: dict[str, Any] = {
                f"{key}_per_job": _bench.median(r[key] for r in rounds)
                for key in rounds[0]
            }
            summary["per_round"] = rounds
            summary.update(write_set(flow, ledgers, args.write_set_jobs, args.statements))
            if args.profile and backend == "sqlite":
                db = ledgers.new()
                summary["cpu_share_guarded"] = profile(flow, db, min(args.jobs, 1000))
            out[flow] = summary
        return out
    finally:
        if server is not None:
            server.close()
            os.environ.pop("PGAPPNAME", None)
        ledgers.drop_all()


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000, help="jobs per timed round")
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--write-set-jobs", type=int, default=200)
    parser.add_argument("--backends", nargs="+", default=["sqlite"],
                        choices=("sqlite", "postgresql"))
    parser.add_argument("--flows", nargs="+", default=["celery", "dramatiq"],
                        choices=("celery", "dramatiq"))
    parser.add_argument("--pg", default=_bench.PG_BASE, help="PostgreSQL database URL")
    parser.add_argument("--statements", action="store_true",
                        help="also list each statement's text and its count per job")
    parser.add_argument("--profile", action="store_true",
                        help="cProfile shares of a guarded SQLite round by category")
    args = parser.parse_args()
    result: dict[str, Any] = {"benchmark": "job_cost", "jobs_per_round": args.jobs,
                              "rounds": args.rounds, "loadavg_1m_at_start": _bench.loadavg()}
    with tempfile.TemporaryDirectory(prefix="tsg-jobcost-") as root:
        for backend in args.backends:
            result[backend] = measure_backend(backend, args, root)
    result.update(_bench.stamp())
    result["loadavg_1m_at_end"] = result.pop("loadavg_1m")
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
