"""The PostgreSQL ledger's current layout at fleet scale: reads, reconcile and prune on N tasks.

Builds N tasks (default 10,000,000) in a scratch schema of ``--pg``'s database with
``_pg_fixture.build`` (``scale.py``'s task mix, loaded with ``COPY``, then ``VACUUM
(ANALYZE)``), checks that ``tsg doctor`` calls it healthy (timed: the first measurement), then
times, each in a fresh client process (wall, client CPU, client peak RSS = VmHWM, and the
server CPU of that client's PostgreSQL backends, read from ``/proc`` by ``PGAPPNAME``):

- ``tsg status``, ``tsg metrics``, ``Ledger.overview`` (what the web view's overview page
  reads) and the overview page itself, first load, through ``tsg serve`` (server process CPU
  and peak RSS), ``tsg reconcile --dry-run``;
- ``tsg reconcile`` applied: with ``--lost-share 0.10`` (default) a tenth of the tasks are
  lost running tasks (half with a stale heartbeat, half with a dead owner): 1,000,000 at 10M;
  the roots still waiting for their delivery past the grace (2 of every 20 tasks) have it
  failed by the same pass;
- ``tsg prune`` with the cut-off that takes ``--prune-share`` of N (default 0.10) closed trees
  (a delivered root and its child each): 1,000,000 trees at 10M;
- ``tsg doctor`` again after both.

While the apply and the prune run, a background writer process (its own ledger, one guarded
job at a time through the public API: ``begin_attempt`` then ``end_attempt``, as an adapter
writes them, each followed by a ``heartbeat`` of one long-running job it began first: open
work every reconcile pass reads and keeps) records the latency of every write; its worst
stall (the longest single write) during each operation is reported beside the writer's own
baseline before it started. For
every measured operation the PostgreSQL backends of its client are sampled every 0.2 s in
``pg_stat_activity``: the statements active longest and their wait events show where the
time goes (``active_statements``). PostgreSQL's own sizes of the ledger's tables and indexes
(``pg_total_relation_size``, ...) and the bytes per task are read after the build, the apply
and the prune. Finally ``transitions.py --db`` measures 8 processes' transitions against raw
single-row commits on the same server (its own scratch schemas).

Times at 10M are judged against ``TARGETS``; a run at another size reports the same rows
with ``per_10m_if_linear`` (the figure times 10M/N: an extrapolation, not a measurement).
Prints one JSON object. The scratch schema is dropped at the end (``--keep``: left in place,
its URL in the JSON, for ``EXPLAIN ANALYZE`` by hand; drop it with ``DROP SCHEMA ... CASCADE``).

    .venv/bin/python benchmarks/pg_scale.py [--size 10000000] [--pg URL] [--lost-share 0.10]
        [--prune-share 0.10] [--skip serve transitions doctor_after] [--keep]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import _bench  # noqa: E402
import _pg_fixture  # noqa: E402
from scale import _CLI, CORE_SRC, DAY  # noqa: E402

#: The targets at 10,000,000 tasks.
TARGETS: dict[str, Any] = {
    "tasks": 10_000_000,
    "status_seconds": 5,
    "doctor_seconds": 60,
    "overview_seconds": 2,
    "reconcile_apply_1m_lost_seconds": 60,
    "prune_1m_trees_seconds": 60,
    "apply_client_peak_rss_mb": 100,
    "other_writers_max_stall_seconds": 1,
    "transitions_8_processes_over_raw_commits": 0.75,
}
SAMPLE_SECONDS = 0.2
WRITER_BASELINE_SECONDS = 3.0

# One guarded job at a time through the public API until the stop file appears; prints every
# write as (wall clock at its start, latency, which write).
_WRITER = r"""
import json, os, sys, time, uuid
sys.path.insert(0, sys.argv[4])
from task_state_guard import Ledger
url, stop, ready = sys.argv[1:4]
samples = []
with Ledger(url) as led:
    # a long-running job, heartbeated after every short one: open work every pass reads
    long_id = str(uuid.uuid4())
    long = led.begin_attempt(long_id, name="bench.writer", delivery_required=True,
                             framework_id=long_id, framework="celery", timeout_seconds=3600.0)
    def job(record):
        logical = str(uuid.uuid4())
        at, t0 = time.time(), time.perf_counter()
        attempt = led.begin_attempt(logical, name="bench.writer", delivery_required=True,
                                    framework_id=logical, framework="celery",
                                    timeout_seconds=300.0)
        at1, t1 = time.time(), time.perf_counter()
        led.end_attempt([(attempt, "succeeded", "worker_completed"),
                         (logical, "succeeded", "worker_completed")],
                        marks={logical: ("delivered", "transport_acknowledged")})
        at2, t2 = time.time(), time.perf_counter()
        led.heartbeat(long)
        t3 = time.perf_counter()
        if record:
            samples.append((round(at, 4), round(t1 - t0, 5), 0))
            samples.append((round(at1, 4), round(t2 - t1, 5), 1))
            samples.append((round(at2, 4), round(t3 - t2, 5), 2))
    for _ in range(20):
        job(False)
    open(ready, "w").close()
    while not os.path.exists(stop):
        job(True)
    led.end_attempt([(long, "succeeded", "worker_completed"),
                     (long_id, "succeeded", "worker_completed")],
                    marks={long_id: ("delivered", "transport_acknowledged")})
print(json.dumps(samples))
"""

# Ledger.overview (the web view's overview read) in a fresh process.
_OVERVIEW = r"""
import json, os, sys, time
sys.path.insert(0, sys.argv[3])
start = time.perf_counter()
cpu_start = time.process_time()
from task_state_guard import Ledger
with Ledger(sys.argv[1], read_only=True) as led:
    report, history = led.overview(active_grace_seconds=float(sys.argv[2]))
elapsed = time.perf_counter() - start
cpu = time.process_time() - cpu_start
rss = next(int(line.split()[1]) for line in open("/proc/self/status")
           if line.startswith("VmHWM")) / 1024
closes = {k: sum(v) for k, v in history.counts.items()}
print(json.dumps({"tasks": report["tasks"], "history_closes": closes}))
sys.stdout.flush()
os.write(2, json.dumps({"seconds": round(elapsed, 3), "cpu_seconds": round(cpu, 3),
                        "peak_rss_mb": round(rss, 1), "exit": 0}).encode())
"""


# ----------------------------------------------------------------------------- the server side


class Sampler:
    """Samples the PostgreSQL backends of one ``application_name`` every
    :data:`SAMPLE_SECONDS`: their CPU (the last reading of each backend) and, while active, the
    statement and wait event."""

    def __init__(self, base: str, name: str) -> None:
        import psycopg

        self.name = name
        self._conn = psycopg.connect(_bench.split_url(base)[0], autocommit=True)
        self._cpu: dict[int, float] = {}
        self._active: dict[str, dict[str, Any]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._conn.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            rows = self._conn.execute(
                "SELECT pid, state, coalesce(wait_event_type || ':' || wait_event, 'cpu'), "
                "query FROM pg_stat_activity "
                "WHERE application_name = %s", (self.name,)).fetchall()
            for pid, state, wait, text in rows:
                query = _shape(text or "")
                cpu = _bench.pid_cpu_seconds([int(pid)])
                if cpu:
                    self._cpu[int(pid)] = cpu
                if state == "active":
                    entry = self._active.setdefault(query, {"samples": 0, "waits": {}})
                    entry["samples"] += 1
                    entry["waits"][wait] = entry["waits"].get(wait, 0) + 1
            self._stop.wait(SAMPLE_SECONDS)

    def report(self, top: int = 6) -> dict[str, Any]:
        ranked = sorted(self._active.items(), key=lambda kv: -kv[1]["samples"])[:top]
        return {
            "server_cpu_seconds": round(sum(self._cpu.values()), 2),
            "active_statements": [
                {"seconds": round(v["samples"] * SAMPLE_SECONDS, 1), "waits": v["waits"],
                 "query": q} for q, v in ranked],
        }


def _shape(query: str) -> str:
    """A statement's text with its literals (numbers, arrays of ids) folded, so that the
    batches of one pass count as one statement."""
    query = re.sub(r"\s+", " ", query)
    query = re.sub(r"'\{[^}']*\}?'?", "'{...}'", query)
    return re.sub(r"\b\d+(\.\d+)?\b", "N", query)[:400]


#: The server settings a 10M-task ledger's times depend on, recorded with every report.
SERVER_SETTINGS = (
    "server_version", "shared_buffers", "effective_cache_size", "work_mem",
    "maintenance_work_mem", "max_wal_size", "checkpoint_timeout", "random_page_cost",
    "effective_io_concurrency", "max_parallel_workers_per_gather", "synchronous_commit",
    "wal_compression",
)


def server_settings(url: str) -> dict[str, str]:
    """The server's :data:`SERVER_SETTINGS` as it shows them (``SHOW``: units included)."""
    import psycopg

    base, _schema = _bench.split_url(url)
    with psycopg.connect(base, autocommit=True) as conn:
        return {name: str(conn.execute(f"SHOW {name}").fetchone()[0])
                for name in SERVER_SETTINGS}


def sizes(url: str) -> dict[str, Any]:
    """PostgreSQL's sizes of the ledger's tables (heap, indexes, TOAST) and of each index, the
    live and dead rows, and the bytes per task."""
    import psycopg

    base, schema = _bench.split_url(url)
    with psycopg.connect(base, autocommit=True) as conn:
        tables = conn.execute(
            "SELECT c.relname, pg_total_relation_size(c.oid), pg_relation_size(c.oid), "
            "pg_indexes_size(c.oid), coalesce(s.n_live_tup, 0), coalesce(s.n_dead_tup, 0) "
            "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid "
            "WHERE n.nspname = %s AND c.relkind = 'r' ORDER BY 2 DESC", (schema,)).fetchall()
        indexes = conn.execute(
            "SELECT i.relname, t.relname, pg_relation_size(i.oid) FROM pg_index x "
            "JOIN pg_class i ON i.oid = x.indexrelid JOIN pg_class t ON t.oid = x.indrelid "
            "JOIN pg_namespace n ON n.oid = t.relnamespace WHERE n.nspname = %s ORDER BY 3 DESC",
            (schema,)).fetchall()
        tasks = conn.execute(f'SELECT count(*) FROM "{schema}".tsg_tasks').fetchone()[0]
        events = conn.execute(f'SELECT count(*) FROM "{schema}".tsg_events').fetchone()[0]
    mb = 2**20
    total = sum(int(t[1]) for t in tables)
    return {
        "tasks": int(tasks), "events": int(events),
        "total_mb": round(total / mb, 1),
        "bytes_per_task": round(total / max(int(tasks), 1), 1),
        "mb_per_million_tasks": round(total / max(int(tasks), 1) * 1e6 / mb, 1),
        "tables": {name: {"total_mb": round(tot / mb, 1), "heap_mb": round(heap / mb, 1),
                          "indexes_mb": round(idx / mb, 1),
                          "toast_mb": round((tot - heap - idx) / mb, 1),
                          "live_rows": int(live), "dead_rows": int(dead)}
                   for name, tot, heap, idx, live, dead in tables},
        "indexes_mb": {name: round(size / mb, 1) for name, _table, size in indexes},
    }


# ----------------------------------------------------------------------------- client processes


def run_measured(url: str, cmd: list[str], timeout: float | None = None) -> dict[str, Any]:
    """Run one client process (``cmd`` after the interpreter) with its own ``PGAPPNAME``,
    sampling its backends; its own figures (stderr JSON), its output's JSON (when it is JSON)
    and the server side's. Past ``timeout`` seconds the process is killed: its peak RSS and
    CPU so far and its last progress line (``tsg ...: done/total``) are reported instead."""
    name = _bench.app_name()
    env = _bench.python_env({"PGAPPNAME": name})
    with Sampler(url, name) as sampler:
        started = time.perf_counter()
        proc = subprocess.Popen([sys.executable, *cmd], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=env)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            return _killed(proc, time.perf_counter() - started) | sampler.report()
    try:
        data: dict[str, Any] = json.loads(err.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"error": f"exit {proc.returncode}", "stderr_tail": err[-2000:]}
    lines = out.strip().splitlines()
    try:
        data["result"] = json.loads(lines[-1]) if lines else None
    except ValueError:
        data["output_bytes"] = len(out)
    data.update(sampler.report())
    return data


def _killed(proc: subprocess.Popen[str], elapsed: float) -> dict[str, Any]:
    """Kill a client that ran past its time; what it had done by then."""
    with open(f"/proc/{proc.pid}/status") as handle:
        rss = next(int(line.split()[1]) for line in handle if line.startswith("VmHWM"))
    cpu = _bench.pid_cpu_seconds([proc.pid])
    proc.kill()
    _out, err = proc.communicate()
    found = re.findall(r": (\d+)/(\d+) ", err)
    done, total = (int(found[-1][0]), int(found[-1][1])) if found else (0, 0)
    report: dict[str, Any] = {"timed_out_after_seconds": round(elapsed, 1),
                              "cpu_seconds": round(cpu, 2), "peak_rss_mb": round(rss / 1024, 1),
                              "progress_done": done, "progress_total": total}
    if done:
        report["seconds_if_linear"] = round(elapsed * total / done, 1)
    return report


def cli(url: str, *args: str, timeout: float | None = None) -> dict[str, Any]:
    """``tsg --db URL ARGS`` in a fresh process (``scale.py``'s figures)."""
    return run_measured(url, ["-c", _CLI, CORE_SRC, "--db", url, *args], timeout)


def overview(url: str, grace: float) -> dict[str, Any]:
    return run_measured(url, ["-c", _OVERVIEW, url, str(grace), CORE_SRC])


def overview_page(url: str, grace: float) -> dict[str, Any]:
    """The overview page's first load through ``tsg serve`` (the server's own process: its
    CPU for the request, its backends' CPU, its peak RSS over the run)."""
    name = _bench.app_name()
    env = _bench.python_env({"PGAPPNAME": name})
    server = subprocess.Popen(
        [sys.executable, "-m", "task_state_guard", "--db", url, "serve", "--listen",
         "127.0.0.1:0", "--refresh", "0", "--no-token", "--active-grace-seconds", str(grace)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        start_new_session=True)
    try:
        assert server.stdout is not None
        listen = json.loads(server.stdout.readline())["listen"]
        cpu = _bench.pid_cpu_seconds([server.pid])
        with Sampler(url, name) as sampler:
            started = time.perf_counter()
            with urllib.request.urlopen(f"http://{listen}/", timeout=3600) as response:
                body = response.read()
                status = response.status
            elapsed = time.perf_counter() - started
            server_cpu = _bench.pid_cpu_seconds([server.pid]) - cpu
        with open(f"/proc/{server.pid}/status") as handle:
            rss = next(int(line.split()[1]) for line in handle if line.startswith("VmHWM"))
    finally:
        _bench.stop_session(server)
    return {"seconds": round(elapsed, 3), "server_process_cpu_seconds": round(server_cpu, 3),
            "server_peak_rss_mb": round(rss / 1024, 1), "status": status, "bytes": len(body),
            **sampler.report()}


def with_writer(url: str, scratch: str, measure: Any) -> dict[str, Any]:
    """Run ``measure()`` while a background writer writes guarded jobs one at a time; the
    measurement with the writer's latencies before (``baseline``) and during it."""
    stop = os.path.join(scratch, "writer.stop")
    ready = os.path.join(scratch, "writer.ready")
    for path in (stop, ready):
        if os.path.exists(path):
            os.unlink(path)
    writer = subprocess.Popen(
        [sys.executable, "-c", _WRITER, url, stop, ready, CORE_SRC], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, env=_bench.python_env({"PGAPPNAME": "tsg-writer"}))
    while not os.path.exists(ready):
        if writer.poll() is not None:
            raise RuntimeError("the writer ended: " + (writer.stderr.read() if writer.stderr
                                                      else ""))
        time.sleep(0.05)
    time.sleep(WRITER_BASELINE_SECONDS)
    begin = time.time()
    result = measure()
    end = time.time()
    open(stop, "w").close()
    out, err = writer.communicate(timeout=600)
    try:
        samples = json.loads(out)
    except ValueError:
        result["writer"] = {"error": f"exit {writer.returncode}", "stderr_tail": err[-2000:]}
        return result
    during = [s for s in samples if begin <= s[0] < end]
    # A write that began before the operation and was still waiting when it started counts too.
    during += [s for s in samples if s[0] < begin <= s[0] + s[1]]
    result["writer"] = {"baseline": _latencies([s for s in samples if s[0] + s[1] < begin]),
                        "during": _latencies(during)}
    return result


def _latencies(samples: list[list[float]]) -> dict[str, Any]:
    if not samples:
        return {"writes": 0}
    lat = sorted(s[1] for s in samples)
    worst = max(samples, key=lambda s: s[1])

    def pct(p: float) -> float:
        return round(lat[min(len(lat) - 1, math.ceil(p * len(lat)) - 1)] * 1000, 2)

    return {"writes": len(lat), "max_ms": round(lat[-1] * 1000, 1),
            "max_was": ("begin_attempt", "end_attempt", "heartbeat")[int(worst[2])],
            "p50_ms": pct(0.5), "p99_ms": pct(0.99), "p999_ms": pct(0.999),
            "over_1s": sum(1 for x in lat if x > 1.0), "over_100ms": sum(1 for x in lat if x > 0.1)}


# ----------------------------------------------------------------------------- the run


def prune_cutoff(now: float, size: int, trees: int) -> tuple[float, int]:
    """The ``delivery_updated_at`` cut-off below which ``trees`` delivered roots (6 a block, the
    oldest blocks first; roots closed by the apply are newer) fall, and how many blocks."""
    blocks = size // 20
    span = 29 * DAY / max(blocks, 1)
    n = max(1, min(blocks, round(trees / 6)))
    return now - 30 * DAY + (n - 0.5) * span + 6, n


def transitions(pg: str, processes: int, seconds: float, rounds: int) -> dict[str, Any]:
    data = _bench.run_json(
        [sys.executable, os.path.join(HERE, "transitions.py"), "--db", pg, "--processes",
         str(processes), "--seconds", str(seconds), "--rounds", str(rounds)],
        env=_bench.python_env(), timeout=3600)
    return data


def side_by_side(report: dict[str, Any], size: int) -> list[dict[str, Any]]:
    """Each target row: the measured figure, the target, whether it is met (at 10M only) and,
    at another size, the figure scaled linearly to 10M."""
    m = report["measured"]
    factor = TARGETS["tasks"] / size

    def row(name: str, value: Any, target: float, *, scales: bool = True,
            higher_is_better: bool = False) -> dict[str, Any]:
        entry: dict[str, Any] = {"row": name, "measured": value, "target": target}
        if isinstance(value, (int, float)):
            if size == TARGETS["tasks"]:
                entry["met"] = value >= target if higher_is_better else value <= target
            elif scales:
                entry["per_10m_if_linear"] = round(value * factor, 1)
        return entry

    def sec(key: str) -> Any:
        return m.get(key, {}).get("seconds")

    def timed_out(entry: dict[str, Any], key: str) -> dict[str, Any]:
        got = m.get(key, {})
        if "timed_out_after_seconds" in got:
            entry["measured"] = f"> {got['timed_out_after_seconds']} (stopped)"
            entry["met"] = False
            entry["done_of_total"] = f"{got['progress_done']}/{got['progress_total']}"
            entry["seconds_if_linear"] = got.get("seconds_if_linear")
        return entry

    def stalled(entry: dict[str, Any], failed: dict[str, str]) -> dict[str, Any]:
        if failed:
            entry["met"] = False
            entry["writer_failed"] = failed
        return entry

    apply_ = m.get("reconcile_apply", {})
    prune = m.get("prune", {})
    writers = {name: w["writer"] for name, w in (("apply", apply_), ("prune", prune))
               if "writer" in w}
    stalls = [w["during"].get("max_ms") for w in writers.values() if "during" in w]
    # A writer that stopped (its last error line, e.g. a lock wait past its busy timeout) was
    # stalled longer than any figure it could report: the row is not met, whatever the other
    # operation's writer measured.
    failed = {name: (w.get("stderr_tail") or w["error"]).strip().splitlines()[-1]
              for name, w in writers.items() if "error" in w}
    ratio = report.get("transitions", {}).get("median_ratio_8_processes")
    if ratio is None:
        ratio = report.get("transitions", {}).get(
            f"median_ratio_{report['options']['processes']}_processes")
    return [
        row("tsg status, s", sec("status"), TARGETS["status_seconds"]),
        row("tsg doctor, s", sec("doctor"), TARGETS["doctor_seconds"]),
        row("overview (Ledger.overview), s", sec("overview"), TARGETS["overview_seconds"]),
        row("overview page via tsg serve, first load, s", sec("overview_page"),
            TARGETS["overview_seconds"]),
        row(f"reconcile apply ({report['fixture']['lost_tasks']} lost), s", sec("reconcile_apply"),
            TARGETS["reconcile_apply_1m_lost_seconds"]),
        timed_out(row(f"prune ({report['fixture']['prune_trees']} trees), s", sec("prune"),
                      TARGETS["prune_1m_trees_seconds"]), "prune"),
        row("apply client peak RSS, MB", apply_.get("peak_rss_mb"),
            TARGETS["apply_client_peak_rss_mb"], scales=False),
        stalled(row("other writer's worst stall during apply and prune, s",
                    round(max(stalls) / 1000, 3) if stalls else None,
                    TARGETS["other_writers_max_stall_seconds"], scales=False), failed),
        row("8 processes: transitions / raw commits", ratio,
            TARGETS["transitions_8_processes_over_raw_commits"], scales=False,
            higher_is_better=True),
    ]


def run(args: argparse.Namespace, scratch: str) -> dict[str, Any]:
    url = _bench.pg_url(args.pg, prefix="tsgscale")
    size = args.size // 20 * 20
    lost = sum(_pg_fixture.lost_in_block(b, args.lost_share) for b in range(size // 20))
    report: dict[str, Any] = {
        "benchmark": "pg_scale", "targets": TARGETS, **_bench.stamp(),
        "options": {k: v for k, v in vars(args).items() if k != "pg"},
        "fixture": {"tasks": size, "lost_tasks": lost}, "measured": {},
        "server_settings": server_settings(url),
    }
    m = report["measured"]
    grace = str(args.active_grace_seconds)
    reconcile_args = ["--active-grace-seconds", grace,
                      "--delivery-grace-seconds", str(args.delivery_grace_seconds)]
    started = time.perf_counter()
    now, holder = _pg_fixture.build(url, size, lost_share=args.lost_share, vacuum=True,
                                    progress=args.progress)
    try:
        report["fixture"]["load_seconds"] = round(time.perf_counter() - started, 1)
        report["fixture"]["load_method"] = ("COPY (insert trigger writes created events), "
                                            "totals seeded, VACUUM (ANALYZE)")
        _log(args, f"built in {report['fixture']['load_seconds']} s")
        report["sizes_after_build"] = sizes(url)
        m["doctor"] = cli(url, "doctor")
        healthy = (m["doctor"].get("result") or {}).get("healthy") is True
        report["fixture"]["doctor_healthy"] = healthy
        if not healthy:
            report["error"] = "doctor did not call the fixture healthy: nothing measured"
            return report
        _log(args, f"doctor {m['doctor']['seconds']} s")
        m["status"] = cli(url, "status", "--active-grace-seconds", grace)
        m["metrics"] = cli(url, "metrics", "--active-grace-seconds", grace)
        m["overview"] = overview(url, args.active_grace_seconds)
        if "serve" not in args.skip:
            m["overview_page"] = overview_page(url, args.active_grace_seconds)
        m["reconcile_dry_run"] = cli(url, "reconcile", "--dry-run", *reconcile_args)
        _log(args, "reads done")
        m["reconcile_apply"] = with_writer(url, scratch, lambda: cli(url, "reconcile",
                                                                     *reconcile_args))
        report["sizes_after_apply"] = sizes(url)
        _log(args, f"apply {m['reconcile_apply'].get('seconds')} s")
        cutoff, blocks = prune_cutoff(now, size, round(size * args.prune_share))
        report["fixture"]["prune_trees"] = blocks * 6

        def prune() -> dict[str, Any]:
            extra = ["--progress"] if args.prune_timeout else []
            return cli(url, "prune", "--older-than", f"{time.time() - cutoff:.3f}", *extra,
                       timeout=args.prune_timeout)

        m["prune"] = with_writer(url, scratch, prune)
        report["sizes_after_prune"] = sizes(url)
        _log(args, f"prune {m['prune'].get('seconds')} s")
        if "doctor_after" not in args.skip:
            m["doctor_after"] = cli(url, "doctor")
        m["status_after"] = cli(url, "status", "--active-grace-seconds", grace)
    finally:
        holder.close()
        if args.keep:
            report["kept_schema_url"] = url
        else:
            _bench.drop_pg_schema(url)
    if "transitions" not in args.skip:
        report["transitions"] = transitions(args.pg, args.processes, args.transitions_seconds,
                                            args.transitions_rounds)
        _log(args, "transitions done")
    report["side_by_side"] = side_by_side(report, size)
    report["loadavg_1m_at_end"] = _bench.loadavg()
    return report


def _log(args: argparse.Namespace, message: str) -> None:
    if args.progress:
        print(f"[pg_scale] {message}", file=sys.stderr, flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=10_000_000)
    parser.add_argument("--pg", default=_bench.PG_BASE, help="PostgreSQL database URL (no schema)")
    parser.add_argument("--lost-share", type=float, default=0.10,
                        help="share of the tasks that are lost running tasks (at most 0.15)")
    parser.add_argument("--prune-share", type=float, default=0.10,
                        help="closed trees to prune, as a share of the tasks")
    parser.add_argument("--active-grace-seconds", type=float, default=21600.0,
                        help="reconcile's and status's active grace (6 h: the fixture's fresh "
                             "running tasks stay fresh however long the build takes)")
    parser.add_argument("--delivery-grace-seconds", type=float, default=86400.0)
    parser.add_argument("--prune-timeout", type=float, default=None,
                        help="stop the prune after this many seconds (it then runs with "
                             "--progress, and how far it got is reported)")
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--transitions-seconds", type=float, default=2.0)
    parser.add_argument("--transitions-rounds", type=int, default=3)
    parser.add_argument("--skip", nargs="*", default=[],
                        choices=("serve", "transitions", "doctor_after"))
    parser.add_argument("--keep", action="store_true", help="leave the scratch schema in place")
    parser.add_argument("--progress", action="store_true", help="progress lines on stderr")
    parser.add_argument("--out", help="also write the JSON to this file")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tsg-pg-scale-") as scratch:
        report = run(args, scratch)
    text = json.dumps(report, sort_keys=True)
    if args.out:
        with open(args.out, "w") as handle:
            handle.write(text + "\n")
    print(text)
    return 0 if "error" not in report else 1


if __name__ == "__main__":
    raise SystemExit(main())
