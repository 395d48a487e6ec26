"""Walk through the Dramatiq adapter with a real ``dramatiq`` worker (2 processes x 2 threads).

Needs Redis on 127.0.0.1:6379 (DB 14, a private key namespace that is deleted at the end).
From the repository root:

    .venv/bin/python examples/dramatiq_app/run.py                 # temporary ledger
    .venv/bin/python examples/dramatiq_app/run.py --dir /tmp/dq   # keep the ledger
    .venv/bin/tsg --db /tmp/dq/tasks.sqlite status --format text
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", help="keep the ledger (and worker log) in this directory")
    args = parser.parse_args()
    workdir = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="tsg-dramatiq-"))
    workdir.mkdir(parents=True, exist_ok=True)
    db = workdir / "tasks.sqlite"
    os.environ.update(
        {
            "TSG_DB": str(db),
            "TSG_HEARTBEAT_SECONDS": "1",
            "DEMO_OUTBOX": str(workdir),
            "DEMO_NAMESPACE": f"tsg-dramatiq-demo-{uuid.uuid4().hex[:8]}",
            "DEMO_REDIS_HEARTBEAT_MS": "3000",
            "DEMO_REDIS_MAINTENANCE": "1000000",
        }
    )
    sys.path.insert(0, str(HERE))
    import app  # the producer side: same broker and actors, nothing is processed here
    from task_state_guard import Ledger
    from task_state_guard_dramatiq import logical_task_id

    ledger = Ledger(str(db))
    worker = Worker(workdir)
    try:
        worker.start()
        print("== 1. three jobs: a delivered answer, a retried fetch, a dead-lettered job")
        jobs = {
            "answer": app.answer.send("ada", "how are my tasks recorded?").message_id,
            "fetch_feed": app.fetch_feed.send("news").message_id,
            "doomed": app.doomed.send().message_id,
        }
        for mid in jobs.values():
            wait_closed(ledger, logical_task_id(mid))
            show(ledger, logical_task_id(mid))

        print("\n== 2. SIGKILL the worker process running a long job, restart the CLI at once")
        report = app.nightly_report.send(30.0).message_id
        pid_file = workdir / "report.pid"
        until(pid_file.exists, 30)
        victim = int(pid_file.read_text())
        os.kill(victim, signal.SIGKILL)
        print(f"   killed worker process {victim}; the CLI exits, we start it again")
        worker.wait_exit()
        worker.start()  # its boot reconcile closes the lost attempt: timed_out/owner_lost
        wait_closed(ledger, logical_task_id(report), timeout=60)
        show(ledger, logical_task_id(report))

        print("\n== 3. ledger health and status (counts only)")
        doctor = ledger.doctor()
        print("   doctor:", {k: doctor[k] for k in ("healthy", "task_count", "event_count")})
        print("   status:", ledger.status()["tasks"])
    finally:
        worker.stop()
        ledger.close()
        app.broker.client.delete(*app.broker.client.keys(f"{app.NAMESPACE}*") or ["-"])
        app.broker.close()
        if not args.dir:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


class Worker:
    """The real ``dramatiq`` CLI running ``app``."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = workdir / "worker.log"

    def start(self) -> None:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "dramatiq",
                    "app",
                    "-p",
                    "2",
                    "-t",
                    "2",
                    "--path",
                    str(HERE),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        before = self.log.read_text(errors="replace").count("ready for action")
        until(
            lambda: self.log.read_text(errors="replace").count("ready for action") >= before + 2, 30
        )

    def wait_exit(self) -> None:
        assert self.proc is not None
        self.proc.wait(30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)


def until(predicate: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit("timed out; see worker.log (run with --dir to keep it)")
        time.sleep(0.1)


def wait_closed(ledger: Any, task_id: str, timeout: float = 30) -> None:
    def closed() -> bool:
        try:
            return bool(ledger.get_task(task_id).is_terminal)
        except Exception:
            return False

    until(closed, timeout)


def show(ledger: Any, task_id: str) -> None:
    parent = ledger.get_task(task_id)
    print(
        f"   {parent.name}: {parent.status}/{parent.terminal_code}  "
        f"delivery {parent.delivery_status}/{parent.delivery_code}"
    )
    for child in sorted(ledger.children_of(task_id), key=lambda t: t.created_at):
        print(f"     attempt {child.id[:8]}  {child.status}/{child.terminal_code}")


if __name__ == "__main__":
    raise SystemExit(main())
