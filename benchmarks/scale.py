"""Scale run: reconcile, dry-run, doctor, status and prune on 100k and 1M task ledgers.

A bulk loader writes exactly the rows and events the API would write (doctor must call the
result healthy before anything is measured). Per block of 20 tasks: 2 running tasks whose
heartbeat is stale (10 %), 1 running task whose owner process is dead (5 %), 1 queued task,
8 closed root tasks each with one closed internal child (2 of those roots still wait for their
delivery past the grace). Every operation runs in a fresh subprocess so that its own wall time
and peak RSS are measured. Prints one JSON object.

    python benchmarks/scale.py                 # 100,000 and 1,000,000 tasks
    python benchmarks/scale.py --sizes 20000   # quick look
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

HERE = os.path.dirname(os.path.abspath(__file__))
CORE_SRC = os.path.join(os.path.dirname(HERE), "packages", "core", "src")
try:
    from task_state_guard import Ledger
except ImportError:
    sys.path.insert(0, CORE_SRC)
    from task_state_guard import Ledger

from task_state_guard import owners  # noqa: E402

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
    now: float, block: int, blocks: int, live: str, dead: str
) -> list[tuple[object, ...]]:
    """The 20 task rows of one block, in INSERT_COLUMNS order, as the API leaves them."""
    t0 = now - 30 * DAY + block * (29 * DAY / max(blocks, 1))
    name = NAMES[block % len(NAMES)]
    rows: list[tuple[object, ...]] = []
    # 2 stale running (live owner, heartbeat long ago), 1 running with a dead owner.
    for _ in range(2):
        rows.append((str(uuid.uuid4()), None, name, "running", None, 1, "pending", None,
                     t0, t0 + 1, t0 + 2, None, None, t0 + 1, live))
    rows.append((str(uuid.uuid4()), None, name, "running", None, 1, "pending", None,
                 now - 30, now - 20, now - 10, None, None, now - 20, dead))
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
    trigger writes that one)."""
    events: list[tuple[object, ...]] = []
    if row[9] is not None:
        events.append((2, "started", "running", "started", row[9]))
    if row[11] is not None:
        events.append((3, "closed", row[3], row[4], row[11]))
    if row[6] != "pending":
        events.append((4, "delivery", row[6], row[7], row[12]))
    return events


def build(db: str, size: int) -> float:
    """Bulk-load ``size`` tasks; return the clock value used as "now"."""
    now = time.time()
    ledger = Ledger(db)
    live = owners.own_token(db)
    dead = _dead_owner_token(db)
    conn = ledger._conn()
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


_OPERATION = r"""
import json, sys, time
sys.path.insert(0, sys.argv[4])
from task_state_guard import Ledger, ReconcilePolicy
db, op, now = sys.argv[1], sys.argv[2], float(sys.argv[3])
read_only = op in ("dry_run", "dry_run_closed", "doctor", "status")
start = time.perf_counter()
cpu_start = time.process_time()
ledger = Ledger(db, read_only=read_only, clock=lambda: now + 1)
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


def measure(db: str, op: str, now: float) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-c", _OPERATION, db, op, str(now), CORE_SRC],
        capture_output=True, text=True, check=True,
    )
    data: dict[str, object] = json.loads(out.stdout)
    return data


def run_size(base: str, size: int) -> dict[str, object]:
    db = os.path.join(base, f"ledger-{size}", "tasks.sqlite")
    started = time.perf_counter()
    now = build(db, size)
    load_seconds = time.perf_counter() - started
    results: dict[str, object] = {"tasks": size, "load_seconds": round(load_seconds, 1)}
    holder = Ledger(db)  # keeps WAL/SHM present: the "live ledger" case
    holder.heartbeat_many([])
    holder._conn().execute("SELECT 1").fetchall()
    results["doctor_before"] = measure(db, "doctor", now)
    results["reconcile_dry_run_live"] = measure(db, "dry_run", now)
    results["status"] = measure(db, "status", now)
    results["reconcile_apply"] = measure(db, "apply", now)
    results["doctor"] = measure(db, "doctor", now)
    holder.close()
    results["db_file_mb"] = round(os.path.getsize(db) / 2**20, 1)
    results["reconcile_dry_run_closed_snapshot"] = measure(db, "dry_run_closed", now)
    results["prune"] = measure(db, "prune", now)
    results["doctor_after_prune"] = measure(db, "doctor", now)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    args = parser.parse_args()
    report: dict[str, object] = {"benchmark": "scale"}
    with tempfile.TemporaryDirectory(prefix="tsg-scale-") as base:
        runs = [run_size(base, size) for size in args.sizes]
    report["runs"] = runs
    if len(runs) >= 2:
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
