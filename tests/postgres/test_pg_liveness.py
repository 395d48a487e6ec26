"""Owner liveness across processes: a session-level advisory lock per owning process."""

from __future__ import annotations

import os
import signal
import time

from pg_helpers import Workers, schema_of, sql
from task_state_guard import Ledger, ReconcilePolicy
from task_state_guard_postgres import drop_schema
from task_state_guard_postgres.ddl import lock_key
from task_state_guard_postgres.owners import OWNER_KIND

GRACE = ReconcilePolicy(3600, 3600)  # nothing is stale by age: only liveness can close work


def test_sigkilled_owner_is_lost_live_owner_is_kept(pg_url: str, workers: Workers) -> None:
    doomed = workers.start("hold", pg_url, 3)
    alive = workers.start("hold", pg_url, 2)
    doomed_ids, alive_ids = workers.line(doomed), workers.line(alive)
    with Ledger(pg_url) as ledger:
        report = ledger.reconcile(GRACE)
        assert report["tasks_timed_out"] == 0
        assert report["fresh_active_retained"] == 5
        assert ledger.status()["running_owner_dead"] == 0

        os.kill(doomed.pid, signal.SIGKILL)
        doomed.wait()
        # The server ends a killed client's session at once; allow it a moment to notice.
        deadline = time.monotonic() + 10
        while ledger.status()["running_owner_dead"] < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ledger.status()["running_owner_dead"] == 3
        dry = ledger.reconcile(GRACE, dry_run=True)
        assert dry["tasks_timed_out"] == 3 and dry["applied"] is False
        assert all(ledger.get_task(t).status == "running" for t in doomed_ids)

        report = ledger.reconcile(GRACE)
        assert report["tasks_timed_out"] == 3
        assert report["fresh_active_retained"] == 2
        for tid in doomed_ids:
            task = ledger.get_task(tid)
            assert (task.status, task.terminal_code) == ("timed_out", "owner_lost")
        for tid in alive_ids:
            assert ledger.get_task(tid).status == "running"
        assert ledger.reconcile(GRACE)["tasks_timed_out"] == 0  # never closed twice
        assert ledger.doctor()["healthy"] is True


def test_owner_that_exits_without_closing_is_lost(pg_url: str, workers: Workers) -> None:
    proc = workers.start("hold", pg_url, 1)
    (tid,) = workers.line(proc)
    proc.terminate()  # SIGTERM: the interpreter dies, its connections with it
    proc.wait()
    with Ledger(pg_url) as ledger:
        deadline = time.monotonic() + 10
        while ledger.status()["running_owner_dead"] < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ledger.reconcile(GRACE)["tasks_timed_out"] == 1
        assert ledger.get_task(tid).terminal_code == "owner_lost"


def test_own_tasks_are_alive_and_probe_takes_no_lasting_lock(pg_url: str) -> None:
    with Ledger(pg_url) as ledger:
        task = ledger.create_task()
        ledger.start_task(task.id)
        for _ in range(3):  # repeated probes (shared, transaction-level) never block the owner
            assert ledger.reconcile(GRACE)["fresh_active_retained"] == 1
        assert ledger.status()["running_owner_dead"] == 0
        # The probe's shared lock ended with its transaction: no advisory lock is left
        # except the owner's own exclusive one.
        held = sql(pg_url, "SELECT mode, count(*) FROM pg_locks WHERE locktype = 'advisory' "
                           "AND pid <> pg_backend_pid() GROUP BY mode")
        assert ("ShareLock", 1) not in held
        ledger.close_task(task.id, "succeeded")


def test_forked_child_never_touches_the_parents_session(pg_url: str, workers: Workers) -> None:
    proc = workers.start("fork", pg_url)
    seen = workers.line(proc)
    assert seen["child_exit"] == 0
    with Ledger(pg_url) as ledger:
        deadline = time.monotonic() + 10
        while ledger.status()["running_owner_dead"] < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        report = ledger.reconcile(GRACE)
        assert report["tasks_timed_out"] == 1  # the exited child's task only
        assert ledger.get_task(seen["theirs"]).terminal_code == "owner_lost"
        # The parent's owner lock survived the child's exit: its task stays running.
        assert ledger.get_task(seen["mine"]).status == "running"
        assert proc.poll() is None
        assert ledger.reconcile(GRACE)["fresh_active_retained"] == 1


def test_one_owner_connection_per_process_for_many_ledgers(pg_url: str) -> None:
    urls = [pg_url, pg_url + "_b", pg_url + "_c"]  # three ledgers (schemas) in one database
    ledgers = [Ledger(url) for url in urls]
    try:
        for ledger in ledgers:
            ledger.start_task(ledger.create_task().id)
        holders = set()
        for url in urls:
            (token,) = sql(url, "SELECT owner FROM tsg_tasks")[0]
            key = lock_key(OWNER_KIND, schema_of(url), token) & 0xFFFFFFFFFFFFFFFF
            holders |= {row[0] for row in sql(
                url, "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted "
                "AND mode = 'ExclusiveLock' AND classid::bigint = %s AND objid::bigint = %s",
                (key >> 32, key & 0xFFFFFFFF),
            )}
        assert len(holders) == 1  # every token's lock on the one owner session
    finally:
        for ledger, url in zip(ledgers, urls, strict=True):
            ledger.close()
            if url != pg_url:
                drop_schema(url)
