"""PostgreSQL failover seen by owner liveness: a server restart (or a failover to a standby)
ends every session at once, so every owner's session lock is released while the owners
themselves live on. A reconcile in that window must not close live work ``owner_lost``.

Simulated for one owner process: its sessions (it connects with an ``application_name`` of its
own) are terminated by the server, exactly what a restart does to each session, while the
process keeps running and heartbeating. Reconciles from another process during and after
the outage keep its task running; the owner then closes its own task.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import psycopg
from celery_harness import wait_for
from task_state_guard import Ledger, ReconcilePolicy

ADMIN = "postgresql://postgres@127.0.0.1:5432/test"
POLICY = ReconcilePolicy(active_grace_seconds=600, delivery_grace_seconds=600)

OWNER = textwrap.dedent(
    """
    import json, sys
    from task_state_guard import Heartbeater, Ledger, LedgerError
    led = Ledger(sys.argv[1])
    task = led.create_task(name="fleet.failover")
    led.start_task(task.id)  # owned by this process
    beats = Heartbeater(led, interval_seconds=0.2)
    beats.add(task.id)
    print(json.dumps(task.id), flush=True)
    sys.stdin.readline()  # "finish"
    beats.stop()
    for attempt in range(50):  # the connection may have to be re-opened after the outage
        try:
            done = led.close_task(task.id, "succeeded", code="worker_completed")
            break
        except LedgerError as exc:
            err = type(exc).__name__
            import time; time.sleep(0.1)
    else:
        raise SystemExit("could not close: " + err)
    print(json.dumps([str(done.status), done.terminal_code]), flush=True)
    """
)


def _terminate(application: str) -> int:
    """End every server session of the named client, as a server restart would."""
    with psycopg.connect(ADMIN, autocommit=True) as admin:
        rows = admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
            (application,),
        ).fetchall()
    return len(rows)


def test_sessions_lost_to_a_server_restart_never_close_live_work(
    tmp_path: Path, pg_ledger: str
) -> None:
    application = f"tsgt_failover_{uuid.uuid4().hex[:10]}"
    script = tmp_path / "owner.py"
    script.write_text(OWNER)
    owner = subprocess.Popen(
        [sys.executable, str(script), f"{pg_ledger}&application_name={application}"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert owner.stdout is not None and owner.stdin is not None
        line = owner.stdout.readline()
        assert line, owner.stderr.read() if owner.stderr else ""
        task_id = json.loads(line)
        with Ledger(pg_ledger) as ledger:
            assert ledger.reconcile(POLICY)["tasks_timed_out"] == 0  # the owner holds its lock

            assert _terminate(application) >= 1  # the lock's session is gone, the owner lives
            deadline = time.monotonic() + 3.0
            while time.monotonic() < deadline:  # reconciles during and after the outage
                report = ledger.reconcile(POLICY)
                assert report["tasks_timed_out"] == 0, report
                assert str(ledger.get_task(task_id).status) == "running"
                time.sleep(0.1)
            # The owner carries on: its heartbeats reach the ledger again.
            before = ledger.get_task(task_id).updated_at
            wait_for(lambda: ledger.get_task(task_id).updated_at > before, 10,
                     what="a heartbeat after the outage")

            owner.stdin.write("finish\n")
            owner.stdin.flush()
            assert json.loads(owner.stdout.readline()) == ["succeeded", "worker_completed"]
            assert owner.wait(30) == 0
            task = ledger.get_task(task_id)
            assert (task.status, task.terminal_code) == ("succeeded", "worker_completed")
            report = ledger.doctor()
            assert report["healthy"] is True, report
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait(10)
