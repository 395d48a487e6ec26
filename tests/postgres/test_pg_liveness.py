"""Owner liveness across processes: a session-level advisory lock per owning process."""

from __future__ import annotations

import os
import secrets
import signal
import time
from pathlib import Path

import psycopg
import pytest
from pg_fixtures import PG_BASE
from pg_helpers import Workers, schema_of, sql
from task_state_guard import InvalidInput, Ledger, ReconcilePolicy
from task_state_guard.model import Liveness
from task_state_guard_postgres import drop_schema
from task_state_guard_postgres.database import open_database
from task_state_guard_postgres.ddl import lock_key
from task_state_guard_postgres.owners import INCARNATION_SQL, OWNER_KIND, epoch_hex
from task_state_guard_postgres.url import parse

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


# ----------------------------------------------------------------- incarnations and the bound
def _incarnation(url: str) -> tuple[int, float]:
    """The server's current incarnation (epoch seconds) and its age in seconds."""
    ((seconds, age),) = sql(url, INCARNATION_SQL)
    return int(seconds), float(age)


def _probe(url: str, token: str) -> Liveness:
    db = open_database(url, clock=time.time, busy_timeout_ms=1000, read_only=False)
    try:
        return db.probe_owner(token)
    finally:
        db.close()


def test_token_names_the_incarnation_it_was_made_in(pg_url: str) -> None:
    with Ledger(pg_url) as ledger:
        task = ledger.start_task(ledger.create_task().id)
        assert task.has_owner
        ((token,),) = sql(pg_url, "SELECT owner FROM tsg_tasks")
        assert len(token) == 32 and set(token) <= set("0123456789abcdef")
        assert token[:8] == epoch_hex(_incarnation(pg_url)[0])
        assert _probe(pg_url, token) is Liveness.ALIVE  # held by this process
        ledger.close_task(task.id, "succeeded")


def test_free_lock_of_this_incarnation_is_dead_at_once(pg_url: str) -> None:
    current, _age = _incarnation(pg_url)
    token = epoch_hex(current) + secrets.token_hex(12)  # nobody ever locked it
    url = pg_url + "&owner_reconnect_seconds=86400"  # the bound plays no part here
    assert _probe(url, token) is Liveness.DEAD


def test_free_lock_of_an_earlier_incarnation_waits_for_the_bound(pg_url: str) -> None:
    current, age = _incarnation(pg_url)
    token = epoch_hex(current - 1000) + secrets.token_hex(12)  # before the last (re)start
    assert _probe(pg_url + "&owner_reconnect_seconds=0", token) is Liveness.DEAD
    long_bound = _probe(pg_url + "&owner_reconnect_seconds=86400", token)
    assert long_bound is (Liveness.UNKNOWN if age < 86000 else Liveness.DEAD)
    # Within the bound the core applies its age rules: fresh work is kept, not owner_lost.
    url = pg_url + "&owner_reconnect_seconds=86400"
    with Ledger(url) as ledger:
        task = ledger.start_task(ledger.create_task().id, owner=False)
        sql(url, "UPDATE tsg_tasks SET owner = %s", (token,))
        report = ledger.reconcile(GRACE)
        if long_bound is Liveness.UNKNOWN:
            assert report["tasks_timed_out"] == 0 and report["fresh_active_retained"] == 1
            assert ledger.get_task(task.id).status == "running"
    with Ledger(pg_url + "&owner_reconnect_seconds=0") as ledger:
        assert ledger.reconcile(GRACE)["tasks_timed_out"] == (
            1 if long_bound is Liveness.UNKNOWN else 0
        )
        assert ledger.get_task(task.id).terminal_code == "owner_lost"


def test_held_lock_of_an_earlier_incarnation_is_alive(pg_url: str) -> None:
    current, _age = _incarnation(pg_url)
    token = epoch_hex(current - 1000) + secrets.token_hex(12)
    _probe(pg_url, "0" * 32)  # creates the schema
    key = lock_key(OWNER_KIND, schema_of(pg_url), token)
    with psycopg.connect(PG_BASE, autocommit=True) as holder:  # an owner that locked again
        holder.execute("SELECT pg_advisory_lock(%s)", (key,))
        assert _probe(pg_url + "&owner_reconnect_seconds=0", token) is Liveness.ALIVE
        assert _holders(pg_url, token)
    # Closing a connection does not wait for the server to end its session (and release the
    # lock): wait until the lock is gone, as a later reconcile would find it.
    deadline = time.monotonic() + 30
    while _holders(pg_url, token) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _probe(pg_url + "&owner_reconnect_seconds=0", token) is Liveness.DEAD


def test_malformed_token_is_unknown(pg_url: str) -> None:
    for token in ("", "x" * 32, "ABCDEF00" * 4, "0" * 31, "0" * 33, "é" * 32):
        assert _probe(pg_url + "&owner_reconnect_seconds=0", token) is Liveness.UNKNOWN


def test_owner_reconnect_seconds_is_validated_without_echo(pg_url: str) -> None:
    assert parse(pg_url).owner_reconnect_seconds == 60.0
    assert parse(pg_url + "&owner_reconnect_seconds=2.5").owner_reconnect_seconds == 2.5
    assert "owner_reconnect_seconds" not in parse(pg_url + "&owner_reconnect_seconds=3").conninfo
    for bad in ("-1", "nan", "inf", "86401", "", "3s", "1e9", "1e3", "+5", "%205", "1_0"):
        with pytest.raises(InvalidInput) as err:
            parse(f"{pg_url}&owner_reconnect_seconds={bad}")
        assert err.value.reason == "invalid_database_path"
        assert "86400" in str(err.value) and f"={bad}" not in str(err.value)
    with pytest.raises(InvalidInput):
        parse(pg_url + "&owner_reconnect_seconds=1&owner_reconnect_seconds=2")
    with pytest.raises(InvalidInput):
        Ledger(pg_url + "&owner_reconnect_seconds=-5")


def _holders(url: str, token: str) -> list[int]:
    key = lock_key(OWNER_KIND, schema_of(url), token) & 0xFFFFFFFFFFFFFFFF
    return [row[0] for row in sql(
        url, "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted "
        "AND mode = 'ExclusiveLock' AND classid::bigint = %s AND objid::bigint = %s",
        (key >> 32, key & 0xFFFFFFFF),
    )]


def test_terminated_lock_session_is_death_then_the_owner_locks_again(
    pg_url: str, workers: Workers, tmp_path: Path
) -> None:
    """Within one incarnation an administrator's pg_terminate_backend of an owner's lock
    session is indistinguishable from its death: its task is closed owner_lost, its later
    writes to it are refused, and its next write takes the same token's lock back."""
    go = tmp_path / "go"
    proc = workers.start("resume", pg_url, go)
    first = workers.line(proc)
    ((token,),) = sql(pg_url, "SELECT owner FROM tsg_tasks")
    (pid,) = _holders(pg_url, token)
    assert sql(pg_url, "SELECT pg_terminate_backend(%s)", (pid,)) == [(True,)]
    with Ledger(pg_url) as ledger:
        deadline = time.monotonic() + 10
        while ledger.status()["running_owner_dead"] < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ledger.reconcile(GRACE)["tasks_timed_out"] == 1
        assert ledger.get_task(first).terminal_code == "owner_lost"
        go.touch()
        seen = workers.line(proc)
        assert seen["errors"] == ["StateConflict", "StateConflict"]  # never a guessed success
        assert ledger.get_task(first).terminal_code == "owner_lost"
        (again,) = _holders(pg_url, token)  # the same token, locked again by a new session
        assert again != pid
        second = seen["second"]
        assert sql(pg_url, "SELECT owner FROM tsg_tasks WHERE id = %s", (second,)) == [(token,)]
        report = ledger.reconcile(GRACE)
        assert report["tasks_timed_out"] == 0 and report["fresh_active_retained"] == 1


_SUPERVISOR = """
import os, sys, time
from task_state_guard import Ledger

url = sys.argv[1]
with Ledger(url) as led:
    led.supervise_children()
read, write = os.pipe()
if os.fork() == 0:  # a pool child: starts its work and keeps running
    os.close(read)
    led = Ledger(url)
    task = led.create_task()
    led.start_task(task.id)
    os.write(write, task.id.encode())
    time.sleep(600)
os.close(write)
print(os.read(read, 64).decode(), flush=True)
sys.stdin.read()  # the supervisor itself writes nothing from here on
"""


def test_a_supervisor_that_writes_nothing_takes_its_lock_back(
    pg_url: str, tmp_path: Path
) -> None:
    """A supervising process (a pool's main process) lends its token to its children and
    writes nothing itself: after its lock session ended (a restart, an administrator), it
    takes the same token's lock back by itself, so the children's work is alive again."""
    import subprocess
    import sys

    url = pg_url + ("&" if "?" in pg_url else "?") + "owner_reconnect_seconds=4"
    script = tmp_path / "supervisor.py"
    script.write_text(_SUPERVISOR)
    proc = subprocess.Popen([sys.executable, str(script), url], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stdout is not None
        task_id = proc.stdout.readline().strip()
        ((token,),) = sql(url, "SELECT owner FROM tsg_tasks WHERE id = %s", (task_id,))
        (pid,) = _holders(url, token)  # the supervisor's session, not the child's
        assert sql(url, "SELECT pg_terminate_backend(%s)", (pid,)) == [(True,)]
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and len(_holders(url, token)) != 1:
            time.sleep(0.1)
        (again,) = _holders(url, token)
        assert again != pid
        with Ledger(url) as ledger:
            report = ledger.reconcile(GRACE)
            assert report["tasks_timed_out"] == 0 and report["fresh_active_retained"] == 1
            assert ledger.get_task(task_id).status == "running"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
