"""Scale run: every read command, reconcile, doctor, status and prune on large ledgers.

A bulk loader writes exactly the rows and events the API would write (doctor must call the
result healthy before anything is measured). Per block of 20 tasks: 2 running tasks whose
heartbeat is stale (10 %), 1 running task whose owner process is dead (5 %), 1 queued task,
8 closed root tasks each with one closed internal child (2 of those roots still wait for their
delivery past the grace). Every operation runs in a fresh subprocess so that its own wall time,
CPU time and peak RSS (the child's VmHWM) are measured. Prints one JSON object.

``reads``: each read command of the CLI (``status``, ``doctor``, ``tasks``, ``get``,
``children``, ``metrics``, ``reconcile --dry-run``) as ``tsg`` runs it, on the cleanly closed
ledger (no WAL: read in place with transient sidecars; the dry-run loads the verified in-memory
snapshot, creating nothing) and on the live one (a writer holds it open), with whether anything
was left behind. A dry-run of a closed ledger larger than the snapshot limit (1 GiB) fails
closed by design: recorded as its exit code 2 and ``reason`` ``snapshot_too_large``.

    python benchmarks/scale.py                         # 100,000 and 1,000,000 tasks
    python benchmarks/scale.py --sizes 20000           # quick look
    python benchmarks/scale.py --sizes 5000000 --reads-only
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
CORE_SRC = os.path.join(os.path.dirname(HERE), "packages", "core", "src")
try:
    from task_state_guard import Ledger
except ImportError:
    sys.path.insert(0, CORE_SRC)
    from task_state_guard import Ledger

try:
    from task_state_guard.sqlite import owners
except ImportError:  # a tree from before the SQLite backend's own package
    from task_state_guard import owners  # type: ignore[no-redef]

DAY = 86400.0
NAMES = ("app.tasks.fetch", "app.tasks.render", "agent.plan", "agent.tool_call")


def _dead_owner_token(db: str) -> str:
    """Create a lock file that nobody holds: exactly what a SIGKILLed owner leaves behind."""
    directory = owners.owners_dir(db)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    token = uuid.uuid4().hex
    with open(os.path.join(directory, token + owners.LOCK_SUFFIX), "wb"):
        pass
    os.chmod(os.path.join(directory, token + owners.LOCK_SUFFIX), 0o600)
    return token


INSERT_COLUMNS = (
    "id, parent_id, name, status, terminal_code, delivery_required, delivery_status, "
    "delivery_code, created_at, started_at, heartbeat_at, ended_at, delivery_updated_at, "
    "updated_at, owner, version"
)


def block_rows(
    now: float, block: int, blocks: int, live: str, dead: str, lost: int = 3
) -> list[tuple[object, ...]]:
    """The 20 task rows of one block, in INSERT_COLUMNS order, as the API leaves them.

    ``lost`` (0 to 3): how many of the block's 3 running tasks are lost (3: 2 with a stale
    heartbeat, 1 with a dead owner; 2: one of each; 1: a stale one); the others run fresh
    (live owner, heartbeat 10 s before ``now``)."""
    t0 = now - 30 * DAY + block * (29 * DAY / max(blocks, 1))
    name = NAMES[block % len(NAMES)]
    rows: list[tuple[object, ...]] = []
    # 2 stale running (live owner, heartbeat long ago), 1 running with a dead owner.
    for stale in (lost >= 1, lost >= 3):
        rows.append((str(uuid.uuid4()), None, name, "running", None, 1, "pending", None,
                     t0, t0 + 1, t0 + 2, None, None, t0 + 1, live) if stale else
                    (str(uuid.uuid4()), None, name, "running", None, 1, "pending", None,
                     now - 30, now - 20, now - 10, None, None, now - 20, live))
    rows.append((str(uuid.uuid4()), None, name, "running", None, 1, "pending", None,
                 now - 30, now - 20, now - 10, None, None, now - 20, dead if lost >= 2 else live))
    rows.append((str(uuid.uuid4()), None, name, "queued", None, 1, "pending", None,
                 t0, None, None, None, None, t0, None))
    for index in range(8):
        pending = index < 2
        root = str(uuid.uuid4())
        rows.append((root, None, name, "succeeded", "worker_completed", 1,
                     "pending" if pending else "delivered",
                     None if pending else "transport_acknowledged",
                     t0, t0 + 1, None, t0 + 5, None if pending else t0 + 6,
                     t0 + 5 if pending else t0 + 6, live))
        rows.append((str(uuid.uuid4()), root, name, "succeeded", "completed", 0,
                     "not_applicable", "internal_task",
                     t0 + 1, t0 + 2, None, t0 + 4, t0 + 4.5, t0 + 4.5, live))
    stored_rows = []
    for row in rows:
        # Columns as the API leaves them: the delivery change time is the creation time
        # until the delivery closes; updated_at is the last state change or heartbeat;
        # version counts the state and delivery changes.
        created, started, beat, ended, delivered = row[8:13]
        stored_rows.append((
            *row[:12],
            created if delivered is None else delivered,
            max(t for t in (created, started, beat, ended) if t is not None),  # type: ignore[type-var]
            row[14],
            (started is not None) + (ended is not None) + (delivered is not None),
        ))
    return stored_rows


def later_events(row: tuple[object, ...]) -> list[tuple[object, ...]]:
    """(step, kind, state, code, at) of a stored row's events after ``created`` (the insert
    trigger writes that one, and from SQLite layout 7 on the started event of a row inserted
    running too)."""
    events: list[tuple[object, ...]] = []
    if row[9] is not None and (row[3] != "running" or not INSERT_WRITES_STARTED):
        events.append((2, "started", "running", "started", row[9]))
    if row[11] is not None:
        events.append((3, "closed", row[3], row[4], row[11]))
    if row[6] != "pending":
        events.append((4, "delivery", row[6], row[7], row[12]))
    return events


#: Whether the ledger's insert trigger writes the started event of a row inserted running
#: (SQLite layout 7 on; set by the builders from the file they load, which may be older when
#: an earlier tree's packages run this script).
INSERT_WRITES_STARTED = False


def _insert_writes_started(conn: sqlite3.Connection) -> bool:
    return conn.execute("SELECT count(*) FROM sqlite_master WHERE type = 'trigger' "
                        "AND name = 'tsg_event_started_inserted'").fetchone()[0] == 1


def build(db: str, size: int) -> float:
    """Bulk-load ``size`` tasks; return the clock value used as "now"."""
    global INSERT_WRITES_STARTED
    now = time.time()
    ledger = Ledger(db)
    live = owners.own_token(db)
    dead = _dead_owner_token(db)
    conn = ledger._db.writer()  # type: ignore[attr-defined]
    INSERT_WRITES_STARTED = _insert_writes_started(conn)
    conn.execute("PRAGMA cache_size=-65536")
    insert = f"INSERT INTO tsg_tasks({INSERT_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)"
    event = "INSERT INTO tsg_events(task_seq, step, kind, state, code, at) VALUES (?,?,?,?,?,?)"
    blocks = size // 20
    conn.execute("BEGIN IMMEDIATE")
    for block in range(blocks):
        for stored in block_rows(now, block, blocks, live, dead):
            seq = conn.execute(insert, stored).lastrowid  # the trigger writes the created event
            conn.executemany(event, [(seq, *e) for e in later_events(stored)])
        if block % 5000 == 4999:
            conn.execute("COMMIT")
            conn.execute("BEGIN IMMEDIATE")
    conn.execute("COMMIT")
    ledger.close()
    return now


_UUID = (
    "lower(substr(h, 1, 8) || '-' || substr(h, 9, 4) || '-4' || substr(h, 14, 3) || '-8' "
    "|| substr(h, 18, 3) || '-' || substr(h, 21, 12))"
)


def build_sql(db: str, size: int) -> float:
    """The same rows and events as :func:`build`, generated inside SQLite (for 5M+ tasks).

    Per block of 20: the 2 stale running, 1 dead-owner running and 1 queued task and 8 closed
    roots (2 still pending delivery) are inserted first, their 8 internal children after them
    (so the children's seq numbers follow all roots'); events as the API writes them.
    """
    now = time.time()
    ledger = Ledger(db)
    live = owners.own_token(db)
    dead = _dead_owner_token(db)
    conn = ledger._db.writer()  # type: ignore[attr-defined]
    running_written = _insert_writes_started(conn)
    conn.execute("PRAGMA cache_size=-1048576")
    blocks = size // 20
    span = 29 * DAY / max(blocks, 1)
    conn.execute("BEGIN IMMEDIATE")
    # k: 0-1 stale running, 2 dead-owner running, 3 queued, 4-11 closed roots (4-5 pending)
    conn.execute(
        "WITH RECURSIVE n(x) AS (SELECT 0 UNION ALL SELECT x + 1 FROM n WHERE x < ? - 1), "
        "r AS (SELECT x / 12 AS b, x % 12 AS k, ? - 30 * 86400 + (x / 12) * ? AS t0, "
        "hex(randomblob(16)) AS h FROM n) "
        "INSERT INTO tsg_tasks(id, name, status, terminal_code, delivery_required, "
        "delivery_status, delivery_code, created_at, started_at, heartbeat_at, ended_at, "
        "delivery_updated_at, updated_at, owner, version) "
        f"SELECT {_UUID}, CASE b % 4 WHEN 0 THEN 'app.tasks.fetch' WHEN 1 THEN "
        "'app.tasks.render' WHEN 2 THEN 'agent.plan' ELSE 'agent.tool_call' END, "
        "CASE WHEN k < 3 THEN 'running' WHEN k = 3 THEN 'queued' ELSE 'succeeded' END, "
        "CASE WHEN k > 3 THEN 'worker_completed' END, 1, "
        "CASE WHEN k < 6 THEN 'pending' ELSE 'delivered' END, "
        "CASE WHEN k >= 6 THEN 'transport_acknowledged' END, "
        "CASE WHEN k = 2 THEN ? - 30 ELSE t0 END, "
        "CASE WHEN k = 2 THEN ? - 20 WHEN k = 3 THEN NULL ELSE t0 + 1 END, "
        "CASE WHEN k = 2 THEN ? - 10 WHEN k < 2 THEN t0 + 2 END, "
        "CASE WHEN k > 3 THEN t0 + 5 END, "
        "CASE WHEN k = 2 THEN ? - 30 WHEN k >= 6 THEN t0 + 6 ELSE t0 END, "
        "CASE WHEN k = 2 THEN ? - 10 WHEN k < 2 THEN t0 + 2 WHEN k = 3 THEN t0 "
        "WHEN k < 6 THEN t0 + 5 ELSE t0 + 6 END, "
        "CASE WHEN k = 2 THEN ? WHEN k = 3 THEN NULL ELSE ? END, "
        "CASE WHEN k < 3 THEN 1 WHEN k = 3 THEN 0 WHEN k < 6 THEN 2 ELSE 3 END FROM r",
        (blocks * 12, now, span, now, now, now, now, now, dead, live),
    )
    roots = conn.execute("SELECT max(seq) FROM tsg_tasks").fetchone()[0]
    conn.execute(
        "WITH c AS (SELECT seq, id, name, created_at AS t0, hex(randomblob(16)) AS h "
        "FROM tsg_tasks WHERE status = 'succeeded' AND parent_id IS NULL ORDER BY seq) "
        "INSERT INTO tsg_tasks(id, parent_id, name, status, terminal_code, delivery_required, "
        "delivery_status, delivery_code, created_at, started_at, ended_at, "
        "delivery_updated_at, updated_at, owner, version) "
        f"SELECT {_UUID}, id, name, 'succeeded', 'completed', 0, 'not_applicable', "
        "'internal_task', t0 + 1, t0 + 2, t0 + 4, t0 + 4.5, t0 + 4.5, ?, 3 FROM c",
        (live,),
    )
    conn.execute(
        "INSERT INTO tsg_events(task_seq, step, kind, state, code, at) "
        "SELECT seq, 2, 'started', 'running', 'started', started_at FROM tsg_tasks "
        "WHERE started_at IS NOT NULL"
        + (" AND status != 'running'" if running_written else "")
    )
    conn.execute(
        "INSERT INTO tsg_events(task_seq, step, kind, state, code, at) "
        "SELECT seq, 3, 'closed', status, terminal_code, ended_at FROM tsg_tasks "
        "WHERE ended_at IS NOT NULL"
    )
    conn.execute(
        "INSERT INTO tsg_events(task_seq, step, kind, state, code, at) "
        "SELECT seq, 4, 'delivery', delivery_status, delivery_code, delivery_updated_at "
        "FROM tsg_tasks WHERE delivery_status != 'pending'"
    )
    conn.execute("COMMIT")
    assert roots == blocks * 12
    ledger.close()
    return now


_OPERATION = r"""
import json, sys, time
sys.path.insert(0, sys.argv[4])
from task_state_guard import Ledger, ReconcilePolicy, StorageError
db, op, now = sys.argv[1], sys.argv[2], float(sys.argv[3])
read_only = op in ("dry_run", "dry_run_closed", "doctor", "status")
start = time.perf_counter()
cpu_start = time.process_time()
try:
    ledger = Ledger(db, read_only=read_only, transient_sidecars=not op.startswith("dry_run"),
                    clock=lambda: now + 1)
except StorageError as exc:  # a closed ledger over the snapshot limit: fails closed by design
    print(json.dumps({"exit": 2, "reason": exc.reason}))
    sys.exit(0)
policy = ReconcilePolicy(active_grace_seconds=600, delivery_grace_seconds=86400)
if op in ("dry_run", "dry_run_closed"):
    result = ledger.reconcile(policy, dry_run=True)
elif op == "apply":
    result = ledger.reconcile(policy)
elif op == "doctor":
    result = ledger.doctor()
elif op == "status":
    result = ledger.status()
else:
    result = ledger.prune(7 * 86400)
ledger.close()
elapsed = time.perf_counter() - start
cpu = time.process_time() - cpu_start
# VmHWM: this process's own peak RSS (ru_maxrss would include the pre-exec parent copy).
rss = next(int(line.split()[1]) for line in open("/proc/self/status")
           if line.startswith("VmHWM")) / 1024
print(json.dumps({"seconds": round(elapsed, 3), "cpu_seconds": round(cpu, 3),
                  "peak_rss_mb": round(rss, 1), "result": result}))
"""


# Runs the real CLI in a fresh interpreter and reports its own figures on stderr.
_CLI = r"""
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
start = time.perf_counter()
cpu_start = time.process_time()
from task_state_guard.cli.commands import main
code = main(sys.argv[2:])
elapsed = time.perf_counter() - start
cpu = time.process_time() - cpu_start
rss = next(int(line.split()[1]) for line in open("/proc/self/status")
           if line.startswith("VmHWM")) / 1024
sys.stdout.flush()
os.write(2, json.dumps({"seconds": round(elapsed, 3), "cpu_seconds": round(cpu, 3),
                        "peak_rss_mb": round(rss, 1), "exit": code}).encode())
os._exit(code)
"""


def read_commands(root_id: str) -> dict[str, list[str]]:
    """The read commands measured, by name (``tasks`` twice: a page and a whole state)."""
    return {
        "status": ["status"],
        "doctor": ["doctor"],
        "tasks_limit_1000": ["tasks", "--status", "running", "--limit", "1000"],
        "tasks_all_queued": ["tasks", "--status", "queued"],
        "get": ["get", root_id, "--extras"],
        "children": ["children", root_id],
        "metrics": ["metrics"],
        "reconcile_dry_run": ["reconcile", "--dry-run", "--active-grace-seconds", "600",
                              "--delivery-grace-seconds", "86400"],
    }


def _tree(directory: str) -> dict[str, tuple[int, int, int]]:
    out = {}
    for name in os.listdir(directory):
        st = os.lstat(os.path.join(directory, name))
        out[name] = (st.st_mode, st.st_size, st.st_mtime_ns)
    return out


def measure_cli(db: str, args: list[str]) -> dict[str, object]:
    """Run ``tsg --db DB ARGS`` in a fresh process; its time, CPU, peak RSS and exit code."""
    out = subprocess.run(
        [sys.executable, "-c", _CLI, CORE_SRC, "--db", db, *args],
        capture_output=True, text=True, check=False,
    )
    data: dict[str, object] = json.loads(out.stderr)
    if data["exit"] != 0:  # an expected refusal (a dry-run over the snapshot limit): its reason
        data["reason"] = json.loads(out.stdout.splitlines()[-1]).get("reason")
    return data


def measure_reads(db: str, root_id: str, *, closed: bool) -> dict[str, object]:
    """Every read command once; on a closed ledger also whether the directory is as before."""
    directory = os.path.dirname(db)
    results: dict[str, object] = {}
    for name, args in read_commands(root_id).items():
        before = _tree(directory)
        data = measure_cli(db, args)
        if closed:
            data["left_directory_unchanged"] = _tree(directory) == before
        results[name] = data
    return results


def _root_with_child(db: str) -> str:
    with Ledger(db, read_only=True) as ledger:
        conn = ledger._db.conn()  # type: ignore[attr-defined]
        row = conn.execute(
            "SELECT parent_id FROM tsg_tasks WHERE parent_id IS NOT NULL ORDER BY seq DESC LIMIT 1"
        ).fetchone()
    return str(row[0])


def measure(db: str, op: str, now: float) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-c", _OPERATION, db, op, str(now), CORE_SRC],
        capture_output=True, text=True, check=True,
    )
    data: dict[str, object] = json.loads(out.stdout)
    return data


def run_size(
    base: str, size: int, *, reads_only: bool = False, sql_build: bool = False
) -> dict[str, object]:
    db = os.path.join(base, f"ledger-{size}", "tasks.sqlite")
    started = time.perf_counter()
    now = (build_sql if sql_build else build)(db, size)
    load_seconds = time.perf_counter() - started
    results: dict[str, object] = {"tasks": size, "load_seconds": round(load_seconds, 1),
                                  "db_file_mb": round(os.path.getsize(db) / 2**20, 1),
                                  "builder": "sql" if sql_build else "python"}
    root_id = _root_with_child(db)
    results["reads_closed"] = measure_reads(db, root_id, closed=True)
    holder = Ledger(db)  # keeps WAL/SHM present: the "live ledger" case
    holder.heartbeat_many([])
    holder._db.conn().execute("SELECT 1").fetchall()  # type: ignore[attr-defined]
    results["reads_live"] = measure_reads(db, root_id, closed=False)
    if reads_only:
        holder.close()
        return results
    results["doctor_before"] = measure(db, "doctor", now)
    results["reconcile_dry_run_live"] = measure(db, "dry_run", now)
    results["status"] = measure(db, "status", now)
    results["reconcile_apply"] = measure(db, "apply", now)
    results["doctor"] = measure(db, "doctor", now)
    holder.close()
    results["db_file_mb"] = round(os.path.getsize(db) / 2**20, 1)
    results["reconcile_dry_run_closed"] = measure(db, "dry_run_closed", now)
    results["prune"] = measure(db, "prune", now)
    results["doctor_after_prune"] = measure(db, "doctor", now)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--reads-only", action="store_true",
                        help="only the read commands (closed and live), not apply or prune")
    parser.add_argument("--sql-build", action="store_true",
                        help="generate the ledger inside SQLite (same rows; fast for 5M+)")
    args = parser.parse_args()
    report: dict[str, object] = {"benchmark": "scale"}
    with tempfile.TemporaryDirectory(prefix="tsg-scale-") as base:
        runs = [run_size(base, size, reads_only=args.reads_only, sql_build=args.sql_build)
                for size in args.sizes]
    report["runs"] = runs
    if len(runs) >= 2 and not args.reads_only:
        small, large = runs[0], runs[-1]
        factor = large["tasks"] / small["tasks"]  # type: ignore[operator]
        report["size_factor"] = factor
        report["growth"] = {
            op: round(large[op]["seconds"] / max(small[op]["seconds"], 1e-3), 2)  # type: ignore[index]
            for op in ("reconcile_dry_run_live", "reconcile_apply", "doctor", "status", "prune")
        }
    print(json.dumps(report, sort_keys=True))


if __name__ == "__main__":
    main()
