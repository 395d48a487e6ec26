"""The lever study: one guarded job's write set replayed in raw SQL, variant by variant.

A guarded job, first delivery succeeding, writes a logical task and one attempt under it (both
created, started and closed, each close closing the delivery nobody owes) with 8 events and
the totals' increments. This script replays that write set without the project's Python path,
on a ledger created by today's code (``Ledger(path)`` / ``Ledger(url)``: today's tables,
triggers and indexes), so the figures transfer; each variant changes only what it names:

SQLite (WAL, ``synchronous=NORMAL``, the ledger's pragmas), one process and ``--processes``
processes (default 4) writing one file pre-filled with ``--fill`` tasks (default 100,000):

- ``today``: today's 6 statements, begin and end as 2 transactions (Celery's shape);
- ``today_3tx``: the same with the two closes in 2 transactions (Dramatiq's shape today);
- ``running_insert``: rows inserted already running (an INSERT trigger writes created and
  started): 4 statements;
- ``int_parent``: the attempt names its parent by an integer ``parent_seq`` (indexed) instead
  of the text uuid ``parent_id`` (its index dropped);
- ``merged_index``: one partial index for open and prunable work instead of two;
- ``all_levers``: the three above together, 2 transactions;
- ``all_levers_mmap`` / ``today_mmap``: with ``PRAGMA mmap_size`` = 256 MiB;
- ``all_levers_group4``: all levers, the begins (and the ends) of 4 jobs in one transaction
  (a per-process group commit for threads, as 4 concurrent threads would get it).
- ``rowid_events``: ``running_insert`` with the events in a rowid table keyed by
  ``seq * 4 + step - 1`` instead of a ``WITHOUT ROWID`` table keyed by ``(task_seq, step)``.

PostgreSQL (the shared server, fsync as configured), 1 client and ``--clients`` clients
(default 8), each its own process:

- ``today_grouped``: what the code sends today: 2 transactions, each transition preceded by
  its row lock (``SELECT ... FOR NO KEY UPDATE``): 12 statements and 4 transaction commands;
- ``six_autocommit``: the 6 statements, each its own autocommit transaction;
- ``pipeline``: ``today_grouped`` in psycopg pipeline mode (one round trip per transaction);
- ``two_cte``: one data-modifying CTE per write with today's triggers (the CTE writes the
  started events itself);
- ``two_cte_insert_trigger``: the same with an INSERT trigger that writes created + started;
- ``two_functions``: one call of a server-side plpgsql function per write;
- ``raw_floor``: two single-row autocommit INSERTs into a bare table per job.

Per variant and round: CPU per job (client; on PostgreSQL also the backends' CPU from
``/proc``, found by ``application_name``) and jobs/s; rounds alternate the variants (order
rotated each round) and the JSON gives the medians. Nothing is asserted.

    .venv/bin/python benchmarks/lever_study.py [--rounds 5] [--seconds 2] [--fill 100000]
        [--backends sqlite postgresql] [--processes 4] [--clients 8] [--pg URL]
        [--variants today running_insert rowid_events ...]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import sqlite3
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _bench

# ----------------------------------------------------------------------------- today's SQL

_INSERT = (
    "INSERT INTO tsg_tasks(id, parent_id, name, status, delivery_required, delivery_status, "
    "payload_hash, timeout_seconds, created_at, delivery_updated_at, updated_at, framework_id) "
    "SELECT ?2, ?3, ?4, 'queued', ?5, 'pending', NULL, NULL, ?1, ?1, ?1, ?6 "
    "WHERE ?3 IS NULL OR EXISTS (SELECT 1 FROM tsg_tasks WHERE id = ?3 AND created_at <= ?1) "
    "ON CONFLICT(id) DO NOTHING RETURNING seq"
)
_START = (
    "UPDATE tsg_tasks SET status = 'running', started_at = ?1, deadline_at = ?1 + "
    "timeout_seconds, owner = ?3, updated_at = ?1, version = version + 1 "
    "WHERE id = ?2 AND status = 'queued' AND ?1 >= updated_at RETURNING seq"
)
_CLOSE = (
    "UPDATE tsg_tasks SET status = 'succeeded', terminal_code = 'worker_completed', "
    "ended_at = ?1, updated_at = ?1, "
    "delivery_status = CASE delivery_required WHEN 0 THEN 'not_applicable' "
    "ELSE delivery_status END, "
    "delivery_code = CASE delivery_required WHEN 0 THEN 'internal_task' ELSE delivery_code END, "
    "delivery_updated_at = CASE delivery_required WHEN 0 THEN ?1 ELSE delivery_updated_at END, "
    "version = version + 2 - delivery_required "
    "WHERE id = ?2 AND status IN ('queued','running') AND delivery_status = 'pending' "
    "AND ?1 >= updated_at AND ?1 >= delivery_updated_at AND ?1 >= coalesce(heartbeat_at, 0) "
    "RETURNING seq"
)
# Rows inserted already running (the INSERT trigger of the variant writes both events).
_INSERT_RUNNING = (
    "INSERT INTO tsg_tasks(id, {parent}, name, status, delivery_required, delivery_status, "
    "created_at, started_at, delivery_updated_at, updated_at, owner, version, framework_id) "
    "SELECT ?2, ?3, ?4, 'running', ?5, 'pending', ?1, ?1, ?1, ?1, ?7, 1, ?6 "
    "WHERE ?3 IS NULL OR EXISTS (SELECT 1 FROM tsg_tasks WHERE {key} = ?3 AND created_at <= ?1) "
    "ON CONFLICT(id) DO NOTHING RETURNING seq"
)

OWNER = "f" * 32
NAME = "bench.noop"


def _pg(sql: str) -> str:
    """The study's SQLite text for psycopg (benchmark-local; the project keeps two dialects)."""
    return re.sub(r"\?(\d+)", r"%(p\1)s", sql)


def _params(values: tuple[Any, ...]) -> dict[str, Any]:
    return {f"p{i}": v for i, v in enumerate(values, 1)}


# ----------------------------------------------------------------------------- SQLite


def _sqlite_conn(path: str, mmap: bool = False) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30,
                           cached_statements=128)
    for pragma in ("foreign_keys=ON", "synchronous=NORMAL", "cache_size=-32768",
                   "wal_autocheckpoint=4000", "busy_timeout=30000"):
        conn.execute(f"PRAGMA {pragma}")
    if mmap:
        conn.execute("PRAGMA mmap_size=268435456")
    return conn


_EVENT = "INSERT INTO tsg_events(task_seq, step, kind, state, code, at) VALUES "
_RUNNING_TRIGGER = (
    "CREATE TRIGGER tsg_event_created AFTER INSERT ON tsg_tasks BEGIN "
    f"{_EVENT}(NEW.seq, 1, 'created', 'queued', 'created', NEW.created_at); "
    "INSERT INTO tsg_events(task_seq, step, kind, state, code, at) "
    "SELECT NEW.seq, 2, 'started', 'running', 'started', NEW.started_at "
    "WHERE NEW.status = 'running'; END"
)


def sqlite_schema(path: str, levers: set[str]) -> None:
    """Today's ledger (created by today's code), then the variant's schema changes."""
    from task_state_guard import Ledger

    Ledger(path).close()
    conn = _sqlite_conn(path)
    conn.execute("BEGIN IMMEDIATE")
    # From SQLite layout 7 on, today's ledger has the started event of a row inserted running
    # written by a trigger of its own: every variant starts from the layout the study measured
    # (the 6-statement variants never insert a running row; the running variants' trigger
    # writes both events).
    conn.execute("DROP TRIGGER IF EXISTS tsg_event_started_inserted")
    if "running_insert" in levers:
        conn.execute("DROP TRIGGER tsg_event_created")
        conn.execute(_RUNNING_TRIGGER)
    parent = "parent_id"
    if "int_parent" in levers:
        parent = "parent_seq"
        conn.execute("ALTER TABLE tsg_tasks ADD COLUMN parent_seq INTEGER "
                     "REFERENCES tsg_tasks(seq)")
        conn.execute("DROP INDEX tsg_tasks_parent")
        conn.execute("CREATE INDEX tsg_tasks_parent_seq ON tsg_tasks(parent_seq) "
                     "WHERE parent_seq IS NOT NULL")
        for name, sql in conn.execute("SELECT name, sql FROM sqlite_master WHERE type = "
                                      "'trigger' AND sql LIKE '%parent_id%'").fetchall():
            conn.execute(f"DROP TRIGGER {name}")
            conn.execute(sql.replace("parent_id", "parent_seq"))
        conn.execute("DROP INDEX tsg_tasks_prunable")
        conn.execute("CREATE INDEX tsg_tasks_prunable ON tsg_tasks(delivery_updated_at) "
                     "WHERE parent_seq IS NULL AND delivery_status != 'pending'")
    if "rowid_events" in levers:
        # Events in a rowid table keyed by seq * 4 + step - 1 (the same uniqueness as the
        # (task_seq, step) key): an append to a rowid B-tree's last page splits off a new page
        # (balance_quick) instead of rebalancing three siblings as an index B-tree does.
        conn.execute("DROP TABLE tsg_events")
        conn.execute("CREATE TABLE tsg_events (id INTEGER PRIMARY KEY, task_seq INTEGER NOT "
                     "NULL, step INTEGER NOT NULL, kind TEXT NOT NULL, state TEXT NOT NULL, "
                     "code TEXT, at REAL NOT NULL)")
        for name, sql in conn.execute("SELECT name, sql FROM sqlite_master WHERE type = "
                                      "'trigger' AND sql LIKE '%tsg_events%'").fetchall():
            conn.execute(f"DROP TRIGGER {name}")
            sql = sql.replace("tsg_events(task_seq, step,", "tsg_events(id, task_seq, step,")
            conn.execute(re.sub(r"(VALUES \(|SELECT )NEW\.seq, (\d)",
                                lambda m: f"{m.group(1)}NEW.seq * 4 + {int(m.group(2)) - 1}, "
                                          f"NEW.seq, {m.group(2)}", sql))
    if "merged_index" in levers:
        conn.execute("DROP INDEX tsg_tasks_open")
        conn.execute("DROP INDEX tsg_tasks_prunable")
        conn.execute(f"CREATE INDEX tsg_tasks_work ON tsg_tasks(delivery_status, "
                     f"delivery_updated_at) WHERE delivery_status = 'pending' "
                     f"OR {parent} IS NULL")
    conn.execute("COMMIT")
    conn.close()


class SqliteJob:
    """One variant's job on one connection: ``begin`` and ``end`` of ``group`` jobs at once."""

    def __init__(self, conn: sqlite3.Connection, levers: set[str]) -> None:
        self.conn = conn
        self.running = "running_insert" in levers
        self.int_parent = "int_parent" in levers
        self.split_ends = "split_ends" in levers
        parent, key = ("parent_seq", "seq") if self.int_parent else ("parent_id", "id")
        self.insert_running = _INSERT_RUNNING.format(parent=parent, key=key)
        self.insert = _INSERT.replace("parent_id", parent).replace("WHERE id = ?3",
                                                                   f"WHERE {key} = ?3")

    def begin(self, count: int) -> list[tuple[str, str]]:
        conn = self.conn
        made = []
        now = time.time()
        conn.execute("BEGIN IMMEDIATE")
        for _ in range(count):
            parent, attempt = str(uuid.uuid4()), str(uuid.uuid4())
            if self.running:
                seq = conn.execute(self.insert_running,
                                   (now, parent, None, NAME, 0, "c", OWNER)).fetchone()[0]
                conn.execute(self.insert_running,
                             (now, attempt, seq if self.int_parent else parent, NAME, 0, None,
                              OWNER)).fetchone()
            else:
                seq = conn.execute(self.insert, (now, parent, None, NAME, 0, "c")).fetchone()[0]
                conn.execute(_START, (now, parent, OWNER)).fetchone()
                conn.execute(self.insert, (now, attempt, seq if self.int_parent else parent,
                                           NAME, 0, None)).fetchone()
                conn.execute(_START, (now, attempt, OWNER)).fetchone()
            made.append((parent, attempt))
        conn.execute("COMMIT")
        return made

    def end(self, made: list[tuple[str, str]]) -> None:
        conn = self.conn
        now = time.time()
        conn.execute("BEGIN IMMEDIATE")
        for parent, attempt in made:
            conn.execute(_CLOSE, (now, attempt)).fetchone()
            if self.split_ends:
                conn.execute("COMMIT")
                conn.execute("BEGIN IMMEDIATE")
            conn.execute(_CLOSE, (now, parent)).fetchone()
        conn.execute("COMMIT")


SQLITE_VARIANTS: dict[str, tuple[set[str], bool, int]] = {
    # name: (levers, mmap, jobs per transaction)
    "today": (set(), False, 1),
    "today_3tx": ({"split_ends"}, False, 1),
    "running_insert": ({"running_insert"}, False, 1),
    "int_parent": ({"int_parent"}, False, 1),
    "merged_index": ({"merged_index"}, False, 1),
    "all_levers": ({"running_insert", "int_parent", "merged_index"}, False, 1),
    "today_mmap": (set(), True, 1),
    "all_levers_mmap": ({"running_insert", "int_parent", "merged_index"}, True, 1),
    "all_levers_group4": ({"running_insert", "int_parent", "merged_index"}, False, 4),
    "rowid_events": ({"running_insert", "rowid_events"}, False, 1),
}


def _sqlite_fill(path: str, levers: set[str], tasks: int) -> None:
    conn = _sqlite_conn(path)
    job = SqliteJob(conn, levers - {"split_ends"})
    done = 0
    while done < tasks:
        made = job.begin(250)
        job.end(made)
        done += 500
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()


def sqlite_worker(path: str, variant: str, seconds: float, start_at: float, done: Any,
                  queue: Any) -> None:
    """Run the variant's jobs until ``seconds`` pass: (jobs, CPU seconds, wall seconds)."""
    levers, mmap, group = SQLITE_VARIANTS[variant]
    conn = _sqlite_conn(path, mmap)
    job = SqliteJob(conn, levers)
    job.end(job.begin(group))  # warm: statements prepared, pages read
    while time.time() < start_at:
        time.sleep(0.001)
    jobs = 0
    cpu = time.process_time()
    wall = time.perf_counter()
    deadline = wall + seconds
    while time.perf_counter() < deadline:
        job.end(job.begin(group))
        jobs += group
    result = (jobs, time.process_time() - cpu, time.perf_counter() - wall)
    conn.close()
    queue.put(result)


def _run_procs(target: Callable[..., None], args: tuple[Any, ...], procs: int, seconds: float,
               server: _bench.ServerCpu | None = None) -> dict[str, float]:
    """``procs`` forked processes of ``target(*args, start_at, done, queue)`` released at once;
    jobs/s, client CPU per job and (``server``) the backends' CPU per job."""
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    done = ctx.Event()
    start_at = time.time() + 1.0 + 0.1 * procs
    workers = [ctx.Process(target=target, args=(*args, start_at, done, queue))
               for _ in range(procs)]
    for w in workers:
        w.start()
    if server is not None:
        while time.time() < start_at - 0.2:  # every backend is up, warm-up done
            time.sleep(0.05)
        server.start()
    results = [queue.get(timeout=seconds + 300) for _ in workers]
    server_s = server.seconds() if server is not None else None
    done.set()
    for w in workers:
        w.join()
    jobs = sum(r[0] for r in results)
    client = sum(r[1] for r in results) * 1000 / jobs
    out = {"jobs_per_s": round(jobs / max(r[2] for r in results), 1),
           "client_cpu_ms_per_job": round(client, 4)}
    if server_s is not None:
        out.update(server_cpu_ms_per_job=round(server_s * 1000 / jobs, 4),
                   cpu_ms_per_job=round(client + server_s * 1000 / jobs, 4))
    return out


def study_sqlite(args: argparse.Namespace, root: str) -> dict[str, Any]:
    files: dict[str, str] = {}
    for name, (levers, _mmap, _group) in SQLITE_VARIANTS.items():
        if args.variants and name not in args.variants:
            continue
        path = os.path.join(root, name, "tasks.sqlite")
        sqlite_schema(path, levers)
        _sqlite_fill(path, levers, args.fill)
        files[name] = path
    rounds: dict[str, list[dict[str, float]]] = {name: [] for name in files}
    names = list(files)
    for i in range(args.rounds):
        shift = i % len(names)
        for name in names[shift:] + names[:shift]:
            entry = {f"one_{k}": v for k, v in _run_procs(
                sqlite_worker, (files[name], name, args.seconds), 1, args.seconds).items()}
            entry.update({f"multi_{k}": v for k, v in _run_procs(
                sqlite_worker, (files[name], name, args.seconds), args.processes,
                args.seconds).items()})
            rounds[name].append(entry)
    return _medians(rounds, {"processes": args.processes, "fill_tasks": args.fill})


# ----------------------------------------------------------------------------- PostgreSQL

_PG_RUNNING_TRIGGER = """CREATE OR REPLACE FUNCTION {q}.tsg_write_created() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    INSERT INTO {q}.tsg_events(task_seq, step, kind, state, code, at)
    VALUES (NEW.seq, 1, 'created', 'queued', 'created', NEW.created_at);
    IF NEW.status = 'running' THEN
        INSERT INTO {q}.tsg_events(task_seq, step, kind, state, code, at)
        VALUES (NEW.seq, 2, 'started', 'running', 'started', NEW.started_at);
    END IF;
    RETURN NULL;
END
$fn$"""

_PG_BEGIN_CTE = (
    "WITH p AS (INSERT INTO tsg_tasks(id, name, status, delivery_required, delivery_status, "
    "created_at, started_at, delivery_updated_at, updated_at, owner, version, framework_id) "
    "VALUES (%(p2)s, %(p4)s, 'running', 0, 'pending', %(p1)s, %(p1)s, %(p1)s, %(p1)s, "
    "%(p5)s, 1, 'c') ON CONFLICT (id) DO NOTHING RETURNING seq), "
    "a AS (INSERT INTO tsg_tasks(id, parent_id, name, status, delivery_required, "
    "delivery_status, created_at, started_at, delivery_updated_at, updated_at, owner, version) "
    "SELECT %(p3)s, %(p2)s, %(p4)s, 'running', 0, 'pending', %(p1)s, %(p1)s, %(p1)s, %(p1)s, "
    "%(p5)s, 1 FROM p RETURNING seq){events} SELECT (SELECT seq FROM a)"
)
_PG_STARTED_EVENTS = (
    ", e AS (INSERT INTO tsg_events(task_seq, step, kind, state, code, at) "
    "SELECT seq, 2, 'started', 'running', 'started', %(p1)s FROM p "
    "UNION ALL SELECT seq, 2, 'started', 'running', 'started', %(p1)s FROM a)"
)
_PG_END_CTE = (
    "WITH a AS (" + _pg(_CLOSE).replace("%(p2)s", "%(p3)s") + "), "
    "p AS (" + _pg(_CLOSE) + ") SELECT (SELECT seq FROM a), (SELECT seq FROM p)"
)
_PG_FUNCTIONS = [
    """CREATE OR REPLACE FUNCTION {q}.tsg_begin_attempt(now double precision, parent text,
    attempt text, label text, owner_token text) RETURNS bigint LANGUAGE plpgsql AS $fn$
DECLARE p bigint; a bigint;
BEGIN
    INSERT INTO {q}.tsg_tasks(id, name, status, delivery_required, delivery_status, created_at,
        started_at, delivery_updated_at, updated_at, owner, version, framework_id)
    VALUES (parent, label, 'running', 0, 'pending', now, now, now, now, owner_token, 1, 'c')
    ON CONFLICT (id) DO NOTHING RETURNING seq INTO p;
    INSERT INTO {q}.tsg_tasks(id, parent_id, name, status, delivery_required, delivery_status,
        created_at, started_at, delivery_updated_at, updated_at, owner, version)
    VALUES (attempt, parent, label, 'running', 0, 'pending', now, now, now, now, owner_token, 1)
    RETURNING seq INTO a;
    RETURN a;
END $fn$""",
    """CREATE OR REPLACE FUNCTION {q}.tsg_end_attempt(now double precision, parent text,
    attempt text) RETURNS integer LANGUAGE plpgsql AS $fn$
DECLARE n integer;
BEGIN
    UPDATE {q}.tsg_tasks SET status = 'succeeded', terminal_code = 'worker_completed',
        ended_at = now, updated_at = now, delivery_status = CASE delivery_required WHEN 0
        THEN 'not_applicable' ELSE delivery_status END, delivery_code = CASE delivery_required
        WHEN 0 THEN 'internal_task' ELSE delivery_code END, delivery_updated_at = CASE
        delivery_required WHEN 0 THEN now ELSE delivery_updated_at END,
        version = version + 2 - delivery_required
    WHERE id IN (attempt, parent) AND status IN ('queued','running')
        AND delivery_status = 'pending' AND now >= updated_at AND now >= delivery_updated_at
        AND now >= coalesce(heartbeat_at, 0);
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END $fn$""",
]
_LOCK = "SELECT 1 FROM tsg_tasks WHERE id = %(p1)s FOR NO KEY UPDATE"

PG_VARIANTS = ("today_grouped", "six_autocommit", "pipeline", "two_cte",
               "two_cte_insert_trigger", "two_functions", "raw_floor")


def pg_schema(url: str, variant: str) -> None:
    import psycopg
    from task_state_guard import Ledger

    Ledger(url).close()  # today's schema, triggers and indexes
    base, schema = _bench.split_url(url)
    q = f'"{schema}"'
    with psycopg.connect(base, autocommit=True) as conn:
        if variant in ("two_cte_insert_trigger", "two_functions"):
            conn.execute(_PG_RUNNING_TRIGGER.format(q=q))
            conn.execute(f"DROP TRIGGER tsg_event_created ON {q}.tsg_tasks")
            conn.execute(f"CREATE TRIGGER tsg_event_created AFTER INSERT ON {q}.tsg_tasks "
                         f"FOR EACH ROW EXECUTE FUNCTION {q}.tsg_write_created()")
        if variant == "two_functions":
            for fn in _PG_FUNCTIONS:
                conn.execute(fn.format(q=q))
        if variant == "raw_floor":
            conn.execute(f"CREATE TABLE {q}.raw_commits (id bigserial PRIMARY KEY, v text, "
                         "at double precision)")


def _pg_job(conn: Any, variant: str) -> Callable[[], None]:
    # Server-side binding: a parameter that may be NULL needs its type spelled out.
    insert = _pg(_INSERT).replace("%(p3)s IS NULL", "%(p3)s::text IS NULL").replace(
        "SELECT %(p2)s, %(p3)s", "SELECT %(p2)s, %(p3)s::text").replace(
        "%(p1)s, %(p6)s WHERE", "%(p1)s, %(p6)s::text WHERE")
    start, close = _pg(_START), _pg(_CLOSE)

    def ids() -> tuple[float, str, str]:
        return time.time(), str(uuid.uuid4()), str(uuid.uuid4())

    if variant in ("today_grouped", "pipeline"):
        def grouped() -> None:
            now, parent, attempt = ids()
            conn.execute("BEGIN")
            for sql, values, locked in (
                    (insert, (now, parent, None, NAME, 0, "c"), parent),
                    (start, (now, parent, OWNER), parent),
                    (insert, (now, attempt, parent, NAME, 0, None), attempt),
                    (start, (now, attempt, OWNER), attempt)):
                conn.execute(_LOCK, {"p1": locked})
                conn.execute(sql, _params(values))
            conn.execute("COMMIT")
            conn.execute("BEGIN")
            for task in (attempt, parent):
                conn.execute(_LOCK, {"p1": task})
                conn.execute(close, _params((now, task)))
            conn.execute("COMMIT")

        if variant == "today_grouped":
            return grouped

        def piped() -> None:
            with conn.pipeline():
                grouped()
        return piped
    if variant == "six_autocommit":
        def six() -> None:
            now, parent, attempt = ids()
            conn.execute(insert, _params((now, parent, None, NAME, 0, "c")))
            conn.execute(start, _params((now, parent, OWNER)))
            conn.execute(insert, _params((now, attempt, parent, NAME, 0, None)))
            conn.execute(start, _params((now, attempt, OWNER)))
            conn.execute(close, _params((now, attempt)))
            conn.execute(close, _params((now, parent)))
        return six
    if variant in ("two_cte", "two_cte_insert_trigger"):
        begin = _PG_BEGIN_CTE.format(
            events=_PG_STARTED_EVENTS if variant == "two_cte" else "")

        def two() -> None:
            now, parent, attempt = ids()
            conn.execute(begin, _params((now, parent, attempt, NAME, OWNER)))
            conn.execute(_PG_END_CTE, _params((now, parent, attempt)))
        return two
    if variant == "two_functions":
        def fns() -> None:
            now, parent, attempt = ids()
            conn.execute("SELECT tsg_begin_attempt(%s, %s, %s, %s, %s)",
                         (now, parent, attempt, NAME, OWNER))
            conn.execute("SELECT tsg_end_attempt(%s, %s, %s)", (now, parent, attempt))
        return fns

    def floor() -> None:
        conn.execute("INSERT INTO raw_commits (v, at) VALUES (%s, %s)", ("x", time.time()))
        conn.execute("INSERT INTO raw_commits (v, at) VALUES (%s, %s)", ("x", time.time()))
    return floor


def pg_worker(url: str, variant: str, seconds: float, app: str, start_at: float,
              done: Any, queue: Any) -> None:
    import psycopg

    base, schema = _bench.split_url(url)
    conn = psycopg.connect(base, autocommit=True, application_name=app,
                           options=f"-c search_path={schema}")
    job = _pg_job(conn, variant)
    for _ in range(10):  # warm: plans prepared (psycopg prepares after 5 executions)
        job()
    while time.time() < start_at:
        time.sleep(0.001)
    jobs = 0
    cpu = time.process_time()
    wall = time.perf_counter()
    deadline = wall + seconds
    while time.perf_counter() < deadline:
        job()
        jobs += 1
    queue.put((jobs, time.process_time() - cpu, time.perf_counter() - wall))
    done.wait(120)  # the backend stays until its CPU has been read
    conn.close()


def _pg_round(url: str, variant: str, procs: int, seconds: float, pg: str) -> dict[str, float]:
    app = _bench.app_name()
    server = _bench.ServerCpu(pg, app)
    try:
        return _run_procs(pg_worker, (url, variant, seconds, app), procs, seconds, server)
    finally:
        server.close()


def study_postgres(args: argparse.Namespace) -> dict[str, Any]:
    urls = {v: _bench.pg_url(args.pg, prefix="tsglv") for v in PG_VARIANTS}
    try:
        for variant, url in urls.items():
            pg_schema(url, variant)
        rounds: dict[str, list[dict[str, float]]] = {v: [] for v in urls}
        names = list(urls)
        for i in range(args.rounds):
            shift = i % len(names)
            for name in names[shift:] + names[:shift]:
                entry = {f"one_{k}": v for k, v in _pg_round(
                    urls[name], name, 1, args.seconds, args.pg).items()}
                entry.update({f"multi_{k}": v for k, v in _pg_round(
                    urls[name], name, args.clients, args.seconds, args.pg).items()})
                rounds[name].append(entry)
    finally:
        for url in urls.values():
            _bench.drop_pg_schema(url)
    return _medians(rounds, {"clients": args.clients})


def _medians(rounds: dict[str, list[dict[str, float]]], extra: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = dict(extra)
    for name, entries in rounds.items():
        out[name] = {"median": {k: _bench.median(e[k] for e in entries) for k in entries[0]},
                     "per_round": entries}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=2.0, help="per variant and round")
    parser.add_argument("--fill", type=int, default=100_000, help="SQLite file's tasks")
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--backends", nargs="+", default=["sqlite", "postgresql"],
                        choices=("sqlite", "postgresql"))
    parser.add_argument("--pg", default=_bench.PG_BASE)
    parser.add_argument("--variants", nargs="+", default=[], metavar="NAME",
                        help="SQLite variants to run (default: all)")
    args = parser.parse_args()
    report: dict[str, Any] = {"benchmark": "lever_study", "rounds": args.rounds,
                              "seconds_per_round": args.seconds,
                              "loadavg_1m_at_start": _bench.loadavg()}
    if "sqlite" in args.backends:
        with tempfile.TemporaryDirectory(prefix="tsg-levers-") as root:
            report["sqlite"] = study_sqlite(args, root)
    if "postgresql" in args.backends:
        report["postgresql"] = study_postgres(args)
    report["loadavg_1m_at_end"] = _bench.loadavg()
    report.update({k: v for k, v in _bench.stamp().items() if k != "loadavg_1m"})
    print(json.dumps(report, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
