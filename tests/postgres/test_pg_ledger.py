"""The PostgreSQL ledger's own guarantees: one statement per transition, row lock before
the clock on the locked path, read-only dry runs,
read-only ledgers, connection bounds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from pg_helpers import sql
from task_state_guard import (
    Heartbeater,
    Ledger,
    ReconcilePolicy,
    StateConflict,
    StorageError,
    TaskNotFound,
)
from task_state_guard_postgres import CLIENT_DEFAULTS, SERVER_KEEPALIVE, driver
from task_state_guard_postgres.url import parse


def _slow_clock() -> tuple[threading.Event, threading.Event, Callable[[], float]]:
    """A clock that, once armed, sleeps after its first reading (another writer lands then)."""
    read_clock, armed = threading.Event(), threading.Event()

    def slow_clock() -> float:
        now = time.time()
        if armed.is_set() and not read_clock.is_set():
            read_clock.set()
            time.sleep(0.5)  # a heartbeat elsewhere would land now, after this reading
        return now

    return read_clock, armed, slow_clock


def test_a_transition_in_a_group_reads_the_clock_only_once_it_holds_the_row(
    pg_url: str,
) -> None:
    read_clock, armed, slow_clock = _slow_clock()
    with Ledger(pg_url) as setup:
        task = setup.create_task()
        setup.start_task(task.id, owner=False)
    closer = Ledger(pg_url, clock=slow_clock)
    beater = Ledger(pg_url)
    outcome: dict[str, object] = {}

    def close() -> None:
        try:
            with closer.atomic():
                outcome["closed"] = closer.close_task(task.id, "succeeded").status
        except StateConflict as exc:
            outcome["closed"] = str(exc)

    thread = threading.Thread(target=close)
    armed.set()
    thread.start()
    assert read_clock.wait(10)
    with pytest.raises(StateConflict):  # waits for the closer's row lock, then finds it closed
        beater.heartbeat(task.id)
    thread.join(10)
    assert outcome["closed"] == "succeeded"
    closer.close()
    beater.close()


def test_a_clock_read_before_another_change_never_fails_a_transition(pg_url: str) -> None:
    # Outside a group a transition is one statement whose clock was read before any row lock:
    # a heartbeat landing after that reading makes the guard refuse, and the locked path then
    # re-reads the clock under the row lock and closes the task.
    read_clock, armed, slow_clock = _slow_clock()
    with Ledger(pg_url) as setup:
        task = setup.create_task()
        setup.start_task(task.id, owner=False)
    closer = Ledger(pg_url, clock=slow_clock)
    beater = Ledger(pg_url)
    outcome: dict[str, object] = {}

    def close() -> None:
        try:
            outcome["closed"] = closer.close_task(task.id, "succeeded").status
        except StateConflict as exc:
            outcome["closed"] = str(exc)

    thread = threading.Thread(target=close)
    armed.set()
    thread.start()
    assert read_clock.wait(10)
    beat = beater.heartbeat(task.id)  # nothing holds the row: lands after the closer's reading
    thread.join(10)
    assert outcome["closed"] == "succeeded"
    closed = beater.get_task(task.id)
    assert beat.heartbeat_at is not None and closed.ended_at is not None
    assert closed.ended_at >= beat.heartbeat_at
    assert [e.kind for e in beater.events_of(task.id)] == ["created", "started", "closed"]
    assert beater.doctor()["healthy"] is True
    closer.close()
    beater.close()


def test_a_transition_is_one_statement_and_refusals_still_explain(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    statements: list[str] = []
    for name in ("execute", "run", "run_many", "fetch_named"):
        original = getattr(driver.Conn, name)

        def counted(self: driver.Conn, sql: str, *args: Any, _original: Any = original) -> Any:
            statements.append(sql)
            return _original(self, sql, *args)

        monkeypatch.setattr(driver.Conn, name, counted)
    with Ledger(pg_url) as ledger:
        warm = ledger.create_task()
        ledger.start_task(warm.id)  # takes this process's owner token once
        for steps in range(3):
            statements.clear()
            task = ledger.create_task(delivery_required=bool(steps % 2))
            started = ledger.start_task(task.id)
            closed = ledger.close_task(task.id, "succeeded", code="completed")
            assert len(statements) == 3  # no BEGIN, no COMMIT, no look ahead
            assert started.has_owner and closed.status == "succeeded"
        internal = ledger.create_task(delivery_required=False)
        ledger.start_task(internal.id)
        statements.clear()
        settled = ledger.close_task_settled(internal.id, "failed", code="worker_failed")
        assert len(statements) == 1  # the close and its settled delivery: one statement
        assert (settled.status, settled.delivery_status) == ("failed", "not_applicable")
        statements.clear()
        with pytest.raises(StateConflict, match="already closed with another state"):
            ledger.close_task(task.id, "failed")
        assert len(statements) > 1  # the refusal took the locked path to explain
        with pytest.raises(TaskNotFound):
            ledger.start_task("00000000-0000-4000-8000-000000000000")
        with pytest.raises(StateConflict, match="only a queued task can start"):
            ledger.start_task(task.id)
        assert ledger.get_task(task.id).status == "succeeded"
        assert ledger.doctor()["healthy"] is True


def test_dry_run_writes_nothing(pg_url: str) -> None:
    with Ledger(pg_url, clock=lambda: 1000.0) as old:
        for _ in range(3):
            task = old.create_task(timeout_seconds=10)
            old.start_task(task.id, owner=False)
        done = old.create_task()
        old.close_task(done.id, "failed")
    snapshot = "SELECT xmin::text, * FROM tsg_tasks ORDER BY seq"
    before = sql(pg_url, snapshot), sql(pg_url, "SELECT xmin::text, * FROM tsg_events")
    with Ledger(pg_url, clock=lambda: 10_000.0) as later:
        dry = later.reconcile(ReconcilePolicy(60, 60), dry_run=True)
        # The three timed-out tasks' deliveries start their grace now; the old one is due.
        assert (dry["tasks_timed_out"], dry["deliveries_failed"]) == (3, 1)
        assert later.prune(0, dry_run=True)["trees_deleted"] == 0
    after = sql(pg_url, snapshot), sql(pg_url, "SELECT xmin::text, * FROM tsg_events")
    assert before == after
    with Ledger(pg_url, read_only=True) as reader:
        with pytest.raises(StorageError):
            reader.reconcile()
        with pytest.raises(StorageError):
            reader.create_task()
        assert reader.reconcile(dry_run=True)["applied"] is False
    with Ledger(pg_url, clock=lambda: 10_000.0) as later:
        applied = later.reconcile(ReconcilePolicy(60, 60))
        assert {k: v for k, v in applied.items() if k not in ("dry_run", "applied")} == {
            k: v for k, v in dry.items() if k not in ("dry_run", "applied")
        }


def test_error_precedence_and_idempotent_repeats(pg_url: str) -> None:
    with Ledger(pg_url) as ledger:
        missing = "00000000-0000-4000-8000-000000000000"
        with pytest.raises(TaskNotFound):
            ledger.close_task(missing, "succeeded", code="not_a_code")
        task = ledger.create_task(task_id=missing, name="a")
        assert ledger.create_task(task_id=missing, name="a") == task  # identical repeat
        with pytest.raises(StateConflict):
            ledger.create_task(task_id=missing, name="b")
        with pytest.raises(StateConflict):
            ledger.set_delivery(task.id, "delivered")  # not terminal yet
        closed = ledger.close_task(task.id, "cancelled")
        assert ledger.close_task(task.id, "cancelled") == closed
        with pytest.raises(StateConflict):
            ledger.close_task(task.id, "failed")
        assert sql(pg_url, "SELECT kind FROM tsg_events ORDER BY step") == [
            ("created",), ("closed",)
        ]


def test_connections_carry_bounded_keepalives(pg_url: str) -> None:
    conninfo = parse(pg_url).conninfo
    for key, value in CLIENT_DEFAULTS.items():
        assert f"{key}={value}" in conninfo
    assert "keepalives_idle=7" in parse(pg_url + "&keepalives_idle=7").conninfo
    with Ledger(pg_url) as ledger:
        conn = ledger._db.conn()
        for name, value in SERVER_KEEPALIVE.items():
            shown = conn.execute(f"SHOW {name}").fetchone()[0]
            assert shown in (value, f"{int(value) // 1000}s", f"{value}ms")


def test_heartbeats_count_only_running_tasks(pg_url: str) -> None:
    with Ledger(pg_url) as ledger:
        running = [ledger.create_task() for _ in range(3)]
        for task in running:
            ledger.start_task(task.id, owner=False)
        queued = ledger.create_task()
        assert ledger.heartbeat_many([t.id for t in running] + [queued.id]) == 3
        beater = Heartbeater(ledger, interval_seconds=0.05)
        first = ledger.get_task(running[0].id).heartbeat_at
        beater.add(running[0].id)
        beater.start()
        try:
            deadline = time.monotonic() + 10
            while ledger.get_task(running[0].id).heartbeat_at == first:
                assert time.monotonic() < deadline
                time.sleep(0.02)
        finally:
            beater.stop()


def test_tsg_db_selects_the_backend(pg_url: str) -> None:
    env = dict(os.environ, TSG_DB=pg_url)
    tsg = [sys.executable, "-m", "task_state_guard"]
    created = subprocess.run([*tsg, "create", "--name", "env.job"], env=env,
                             capture_output=True, text=True, timeout=60, check=True)
    tid = json.loads(created.stdout)["task"]["id"]
    shown = subprocess.run([*tsg, "get", tid], env=env, capture_output=True, text=True,
                           timeout=60, check=True)
    assert json.loads(shown.stdout)["task"]["status"] == "queued"
    assert sql(pg_url, "SELECT name FROM tsg_tasks") == [("env.job",)]


def test_a_group_whose_statement_failed_never_reports_a_commit(pg_url: str) -> None:
    with Ledger(pg_url) as setup:
        task = setup.create_task()
    holder = Ledger(pg_url)
    waiter = Ledger(pg_url, busy_timeout_ms=200)
    try:
        with holder.atomic():
            holder.start_task(task.id, owner=False)  # holds the row until the block ends
            other = None
            with pytest.raises(StorageError) as err, waiter.atomic():
                other = waiter.create_task()
                with pytest.raises(StorageError):  # LedgerBusy: the row is held
                    waiter.close_task(task.id, "cancelled")
                # the caller goes on; the group cannot commit, and says so
            assert "nothing was written" in str(err.value)
    finally:
        holder.close()
    assert other is not None
    with pytest.raises(TaskNotFound):
        waiter.get_task(other.id)
    waiter.close()
