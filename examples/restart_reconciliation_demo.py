"""The specification's synthetic restart demo, through the real CLI.

Creates a temporary ledger from fixed public sample states at the synthetic clock 946684800.0
(2000-01-01), then runs reconcile preview, apply, an idempotent recheck and doctor through the
real ``task-state-guard`` CLI with the wall clock, printing every command and its output. The
temporary directory is removed afterwards. Two runs print identical output.

    python3 examples/restart_reconciliation_demo.py [--allow-external-acl]

``--allow-external-acl`` (for Windows, as in the specification) acknowledges that the temporary
directory has a private ACL managed outside TaskStateGuard; it is passed to the ledger and to
every CLI call. On POSIX hosts the modes are checked either way.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
CORE_SRC = os.path.join(os.path.dirname(HERE), "packages", "core", "src")
try:
    import task_state_guard  # noqa: F401
except ImportError:  # running from a plain checkout
    sys.path.insert(0, CORE_SRC)

from task_state_guard import Ledger  # noqa: E402

SYNTHETIC_CLOCK = 946684800.0
PLACEHOLDER = "<temporary-demo>"


def build_scenario(db: str, allow_external_acl: bool = False) -> None:
    """A queued task, an overdue running task, and a delivering task with an internal child."""
    with Ledger(db, clock=lambda: SYNTHETIC_CLOCK,
                allow_external_acl=allow_external_acl) as ledger:
        ledger.create_task()  # A: stays queued
        b = ledger.create_task(timeout_seconds=120)  # B: started, its deadline long past
        ledger.start_task(b.id, owner=False)
        c = ledger.create_task()  # C: delivering
        d = ledger.create_task(parent_id=c.id, delivery_required=False)  # D: internal child
        ledger.close_task(d.id, "succeeded", code="worker_completed")
        ledger.close_task(c.id, "succeeded", code="worker_completed")


def run_cli(label: str, db: str, args: list[str], acl: list[str]) -> int:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (CORE_SRC, env.get("PYTHONPATH")) if p)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    command = [sys.executable, "-m", "task_state_guard", "--db", db, *acl, *args]
    shown = ["task-state-guard", "--db", os.path.join(PLACEHOLDER, "tasks.sqlite"), *acl, *args]
    result = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    print(f"[{label}] command: {' '.join(shown)}")
    print(f"[{label}] output: {result.stdout.strip()}")
    if result.stderr:
        print(f"[{label}] unexpected stderr output", file=sys.stderr)
        return 3
    return result.returncode


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if any(a != "--allow-external-acl" for a in args):
        print("usage: restart_reconciliation_demo.py [--allow-external-acl]", file=sys.stderr)
        return 2
    acl = ["--allow-external-acl"] if args else []
    base = tempfile.mkdtemp(prefix="tsg-demo-")
    try:
        db = os.path.join(base, "tasks.sqlite")
        build_scenario(db, allow_external_acl=bool(acl))
        graces = ["--active-grace-seconds", "600", "--delivery-grace-seconds", "86400"]
        codes = [
            run_cli("preview", db, ["reconcile", *graces, "--dry-run"], acl),
            run_cli("apply", db, ["reconcile", *graces], acl),
            run_cli("idempotent-recheck", db, ["reconcile", *graces], acl),
            run_cli("doctor", db, ["doctor"], acl),
        ]
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return max(codes)


if __name__ == "__main__":
    raise SystemExit(main())
