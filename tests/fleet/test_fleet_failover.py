"""A real PostgreSQL restart seen by owner liveness.

A restart (like a failover) ends every session at once, so every owner's advisory lock is
released while the owners themselves live on. Reconciles must not close live work
``owner_lost`` in that window; each owner locks its same token again on its next write; an
owner that died while the server was down is closed ``owner_lost`` once the URL's
``owner_reconnect_seconds`` have passed since the restart, and not before.

These tests restart the shared test server (``pg_ctlcluster 15 main``, or the command in
``TSG_TEST_PG_CTL``): every other session on it is ended too.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import psycopg
import pytest
from celery_harness import wait_for
from task_state_guard import Ledger, LedgerError, ReconcilePolicy
from task_state_guard_postgres.ddl import lock_key
from task_state_guard_postgres.owners import INCARNATION_SQL, OWNER_KIND

ADMIN = os.environ.get("TSG_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
PG_CTL = shlex.split(os.environ.get("TSG_TEST_PG_CTL", "pg_ctlcluster 15 main"))
# Every session on the server ends: nothing else may run beside these (scripts/dev.py test).
pytestmark = pytest.mark.service_wide

POLICY = ReconcilePolicy(active_grace_seconds=600, delivery_grace_seconds=600)

OWNER = textwrap.dedent(
    """
    import json, sys, time
    from task_state_guard import Heartbeater, Ledger, LedgerError
    led = Ledger(sys.argv[1])
    task = led.create_task(name="fleet.failover")
    led.start_task(task.id)  # owned by this process
    beats = Heartbeater(led, interval_seconds=0.2)
    beats.add(task.id)
    beats.start()
    print(json.dumps(task.id), flush=True)
    sys.stdin.readline()  # "finish"
    beats.stop()
    err = ""
    for attempt in range(100):  # the server may still be coming back
        try:
            done = led.close_task(task.id, "succeeded", code="worker_completed")
            break
        except LedgerError as exc:
            err = type(exc).__name__
            time.sleep(0.1)
    else:
        raise SystemExit("could not close: " + err)
    print(json.dumps([str(done.status), done.terminal_code]), flush=True)
    """
)


def _ctl(action: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([*PG_CTL, action], stdout=subprocess.DEVNULL)


def _ready() -> bool:
    try:
        with psycopg.connect(ADMIN, connect_timeout=2) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error:
        return False
    return True


def _age() -> float:
    """Seconds since the server's current incarnation began (by the server's clock)."""
    with psycopg.connect(ADMIN, autocommit=True) as conn:
        row = conn.execute(INCARNATION_SQL).fetchone()
    assert row is not None
    return float(row[1])


def _lock_holders(url: str) -> int:
    """Sessions holding the ledger's one owner token's advisory lock."""
    schema = parse_qs(urlsplit(url).query)["schema"][0]
    with psycopg.connect(ADMIN, autocommit=True) as conn:
        conn.execute(f'SET search_path TO "{schema}"')
        (token,) = conn.execute("SELECT owner FROM tsg_tasks").fetchone() or (None,)
        key = lock_key(OWNER_KIND, schema, str(token)) & 0xFFFFFFFFFFFFFFFF
        row = conn.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted "
            "AND mode = 'ExclusiveLock' AND classid::bigint = %s AND objid::bigint = %s",
            (key >> 32, key & 0xFFFFFFFF),
        ).fetchone()
    return int(row[0]) if row else 0


def _try(call: Callable[[], Any]) -> Any:
    """``call()``, or None while the server is down or coming back."""
    try:
        return call()
    except LedgerError:
        return None


def _start_owner(tmp_path: Path, url: str) -> tuple[subprocess.Popen[str], str]:
    script = tmp_path / "owner.py"
    script.write_text(OWNER)
    owner = subprocess.Popen(
        [sys.executable, str(script), url], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )
    assert owner.stdout is not None
    line = owner.stdout.readline()
    assert line, owner.stderr.read() if owner.stderr else ""
    return owner, json.loads(line)


def test_a_server_restart_never_closes_live_work(tmp_path: Path, pg_ledger: str) -> None:
    owner, task_id = _start_owner(tmp_path, pg_ledger)
    try:
        assert owner.stdout is not None and owner.stdin is not None
        strict_url = pg_ledger + "&owner_reconnect_seconds=0"  # a free lock is proof of death
        with Ledger(pg_ledger) as ledger, Ledger(strict_url) as strict:
            assert ledger.reconcile(POLICY)["tasks_timed_out"] == 0  # the owner holds its lock
            assert _lock_holders(pg_ledger) == 1

            restart = _ctl("restart")
            judged = 0
            deadline = time.monotonic() + 120
            while restart.poll() is None or not _ready():  # reconciles during the restart
                assert time.monotonic() < deadline, "the server did not come back"
                report = _try(lambda: ledger.reconcile(POLICY))
                if report is not None:
                    judged += 1
                    assert report["tasks_timed_out"] == 0, report
                time.sleep(0.05)
            assert restart.wait() == 0
            # Back up: until the owner has locked its token again, the free lock of an earlier
            # incarnation proves nothing (the default bound is 60 s).
            while _lock_holders(pg_ledger) == 0:
                assert time.monotonic() < deadline, "the owner never locked its token again"
                report = _try(lambda: ledger.reconcile(POLICY))
                if report is not None:
                    judged += 1
                    assert report["tasks_timed_out"] == 0, report
                    assert str(ledger.get_task(task_id).status) == "running"
                time.sleep(0.05)
            assert judged >= 1
            # The lock is held again: even with no reconnect bound at all it is alive. A pass
            # skips a row a worker's transaction holds at that moment (a heartbeat every 0.2 s
            # here) and judges it the next time: wait for one that examined it.
            strict_reports: list[dict[str, int]] = []

            def examined() -> bool:
                strict_reports.append(strict.reconcile(POLICY))
                return strict_reports[-1]["active_examined"] == 1

            wait_for(examined, 30, what="a strict reconcile that examined the task")
            assert all(r["tasks_timed_out"] == 0 for r in strict_reports), strict_reports
            assert strict_reports[-1]["fresh_active_retained"] == 1
            # Its heartbeats reach the ledger again.
            before = ledger.get_task(task_id).updated_at
            wait_for(lambda: ledger.get_task(task_id).updated_at > before, 30,
                     what="a heartbeat after the restart")

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


def test_owner_killed_while_the_server_is_down_is_lost_after_the_bound(
    tmp_path: Path, pg_ledger: str
) -> None:
    bound = 5.0
    url = f"{pg_ledger}&owner_reconnect_seconds={bound:g}"
    owner, task_id = _start_owner(tmp_path, url)
    try:
        with Ledger(url) as ledger:
            assert ledger.reconcile(POLICY)["tasks_timed_out"] == 0
            assert _ctl("stop").wait(120) == 0
            os.kill(owner.pid, signal.SIGKILL)  # dies while its server is down
            owner.wait(10)
            assert _ctl("start").wait(120) == 0
            deadline = time.monotonic() + 120
            within = 0
            while True:
                assert time.monotonic() < deadline, "the lost owner's task was never closed"
                report = _try(lambda: ledger.reconcile(POLICY))
                if report is None:
                    time.sleep(0.05)
                    continue
                age = _age()  # read after the pass: at least the age its probe saw
                if report["tasks_timed_out"]:
                    assert age > bound  # never within the bound
                    break
                if age <= bound:
                    within += 1
                time.sleep(0.1)
            print(json.dumps({"reconciles_within_bound": within}))
            task = ledger.get_task(task_id)
            assert (task.status, task.terminal_code) == ("timed_out", "owner_lost")
            assert ledger.reconcile(POLICY)["tasks_timed_out"] == 0  # never closed twice
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait(10)
