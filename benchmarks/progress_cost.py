"""What ``--progress`` costs: reconcile and prune with and without a progress callback.

Builds a ledger with ``scale.py``'s loader (the same mix of stale, dead-owner, queued and
closed work), then, each in a fresh subprocess: the one count query progress adds for reconcile
(open tasks) and for prune (closed roots past the cut-off); reconcile dry-runs with and without
a callback in alternating rounds (a dry run changes nothing, so the rounds compare like with
like) and their ratio; finally reconcile apply and prune with a callback, with the number of
calls. Prints one JSON object.

    python benchmarks/progress_cost.py                  # 1,000,000 tasks
    python benchmarks/progress_cost.py --size 100000 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import scale  # noqa: E402

_RUN = r"""
import json, sys, time
sys.path.insert(0, sys.argv[4])
from task_state_guard import Ledger, ReconcilePolicy
db, op, now = sys.argv[1], sys.argv[2], float(sys.argv[3])
calls = []
progress = (lambda done, total: calls.append((done, total))) if op.endswith("+progress") else None
policy = ReconcilePolicy(active_grace_seconds=600, delivery_grace_seconds=86400)
read_only = op.startswith(("count", "dry_run"))
ledger = Ledger(db, read_only=read_only, clock=lambda: now + 1)
start = time.perf_counter()
cpu = time.process_time()
if op == "count_open":
    with ledger._db.read() as conn:
        result = ledger._db.queries.count_open(conn)
elif op == "count_roots":
    with ledger._db.read() as conn:
        result = ledger._db.queries.count_prunable(conn, now + 1 - 7 * 86400)
elif op.startswith("dry_run"):
    result = ledger.reconcile(policy, dry_run=True, progress=progress)
elif op.startswith("apply"):
    result = ledger.reconcile(policy, progress=progress)
else:
    result = ledger.prune(7 * 86400, progress=progress)
elapsed = time.perf_counter() - start
cpu = time.process_time() - cpu
ledger.close()
print(json.dumps({"seconds": round(elapsed, 3), "cpu_seconds": round(cpu, 3), "result": result,
                  "progress_calls": len(calls), "last_call": calls[-1] if calls else None}))
"""


def run(db: str, op: str, now: float) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-c", _RUN, db, op, str(now), scale.CORE_SRC],
        capture_output=True, text=True, check=True,
    )
    data: dict[str, object] = json.loads(out.stdout)
    return data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    report: dict[str, object] = {"benchmark": "progress_cost", "tasks": args.size}
    with tempfile.TemporaryDirectory(prefix="tsg-progress-") as base:
        db = os.path.join(base, "ledger", "tasks.sqlite")
        now = scale.build(db, args.size)
        report["count_open"] = run(db, "count_open", now)
        report["count_roots"] = run(db, "count_roots", now)
        plain: list[float] = []
        loud: list[float] = []
        for _ in range(args.rounds):
            plain.append(float(run(db, "dry_run", now)["cpu_seconds"]))  # type: ignore[arg-type]
            loud.append(float(run(db, "dry_run+progress", now)["cpu_seconds"]))  # type: ignore[arg-type]
        report["dry_run_cpu_seconds"] = {"without": plain, "with_progress": loud,
                                         "ratio_of_medians": round(statistics.median(loud)
                                                                   / statistics.median(plain), 3)}
        report["apply_with_progress"] = run(db, "apply+progress", now)
        report["prune_with_progress"] = run(db, "prune+progress", now)
    print(json.dumps(report, sort_keys=True))


if __name__ == "__main__":
    main()
