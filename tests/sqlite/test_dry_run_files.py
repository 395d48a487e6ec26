"""Dry-run: same decisions as apply at the same clock, and no change to any byte, mode, mtime or
directory entry -- for a cleanly closed ledger (no sidecars: two matching reads loaded as a
verified private in-memory snapshot), for a live ledger with a writer connection open, and for a
closed ledger larger than 64 MiB (within the default snapshot limit; a smaller limit fails
closed). The read commands on a closed ledger leave every entry as it was (their transient
sidecars are gone again)."""

from __future__ import annotations

import os
import random
import sqlite3
import time
import uuid

import pytest
from core_helpers import (
    EVENT_STEP,
    T0,
    Clock,
    assert_json_line,
    check_report,
    events_written_by_triggers,
    run_cli,
    sidecars,
    snapshot_tree,
    table_columns,
    without_counts_flags,
)
from task_state_guard import InvalidInput, Ledger, ReconcilePolicy, StorageError

POLICY = ReconcilePolicy(active_grace_seconds=600, delivery_grace_seconds=600)
EXPECTED = {
    "active_examined": 4,
    "tasks_timed_out": 2,
    "fresh_active_retained": 2,
    # the two tasks timed out in this pass become pending deliveries closed "now": retained
    "pending_delivery_examined": 5,
    "deliveries_failed": 1,
    "deliveries_not_applicable": 1,
    "pending_delivery_retained": 3,
}


def populate(led: Ledger, clock: Clock) -> None:
    """A scenario with every reconcile outcome; evaluated at clock.t + 1000."""
    base = clock.t
    led.create_task()  # queued: kept
    stale = led.create_task()
    led.start_task(stale.id, owner=False)  # stale at +1000: timed out
    overdue = led.create_task(timeout_seconds=60)
    led.start_task(overdue.id, owner=False)  # deadline passed: timed out
    fresh = led.create_task()
    led.start_task(fresh.id, owner=False)
    delivering = led.create_task()
    internal = led.create_task(parent_id=delivering.id, delivery_required=False)
    led.close_task(internal.id, "succeeded", code="worker_completed")
    led.close_task(delivering.id, "succeeded", code="worker_completed")
    clock.set(base + 900)
    led.heartbeat(fresh.id)  # fresh at +1000
    recent = led.create_task()
    led.close_task(recent.id, "failed", code="worker_failed")  # delivery retained
    clock.set(base + 1000)


def files_of(directory: str) -> dict:
    return snapshot_tree(directory)


def test_closed_ledger_dry_run_changes_nothing_and_matches_apply(tmp_path) -> None:
    directory = str(tmp_path / "d")
    db = os.path.join(directory, "tasks.sqlite")
    clock = Clock()
    with Ledger(db, clock=clock) as led:
        populate(led, clock)
    assert sidecars(db) == [], "a cleanly closed ledger leaves no sidecars"
    before = files_of(directory)
    time.sleep(0.01)
    previews = []
    for _ in range(2):
        with Ledger(db, clock=clock, read_only=True, transient_sidecars=False) as ro:
            assert ro.storage_info()["read_snapshot"] is True
            report = ro.reconcile(POLICY, dry_run=True)
            check_report(report, dry_run=True)
            previews.append(report)
            assert ro.doctor()["healthy"] is True
            assert ro.status()["tasks"]["running"] == 3
    assert previews[0] == previews[1]
    assert without_counts_flags(previews[0]) == EXPECTED
    # the CLI dry-run (wall clock, far beyond every threshold of this synthetic past)
    result = run_cli("--db", db, "reconcile", "--dry-run", "--active-grace-seconds", "600",
                     "--delivery-grace-seconds", "600")
    payload = assert_json_line(result)
    assert result.code == 0 and payload["reconcile"]["dry_run"] is True
    assert payload["reconcile"]["applied"] is False
    assert run_cli("--db", db, "prune", "--older-than", "0", "--dry-run").code == 0
    assert files_of(directory) == before
    for args in (["doctor"], ["status"], ["tasks", "--status", "running"], ["metrics"]):
        assert run_cli("--db", db, *args).code == 0
    # the read commands' transient sidecars come and go: only the directory's mtime moved
    after = files_of(directory)
    assert {k: v for k, v in after.items() if k != "."} == {
        k: v for k, v in before.items() if k != "."}
    with Ledger(db, clock=clock) as led:
        applied = led.reconcile(POLICY)
        check_report(applied, dry_run=False)
        assert without_counts_flags(applied) == without_counts_flags(previews[0])
        assert led.doctor()["healthy"] is True


def test_live_ledger_dry_run_keeps_database_wal_and_entries(tmp_path) -> None:
    directory = str(tmp_path / "d")
    db = os.path.join(directory, "tasks.sqlite")
    clock = Clock()
    writer = Ledger(db, clock=clock)
    try:
        populate(writer, clock)
        owned = writer.create_task()
        writer.start_task(owned.id)  # an owner lock file beside the database
        assert os.path.exists(db + "-wal") and os.path.exists(db + "-shm")
        before = files_of(directory)
        time.sleep(0.01)
        own = writer.reconcile(POLICY, dry_run=True)  # the writer's own preview
        with Ledger(db, clock=clock, read_only=True) as ro:
            assert ro.storage_info()["read_snapshot"] is False
            preview = ro.reconcile(POLICY, dry_run=True)
        result = run_cli("--db", db, "reconcile", "--dry-run")
        assert result.code == 0 and assert_json_line(result)["reconcile"]["dry_run"] is True
        after = files_of(directory)
        assert set(after) == set(before)  # no directory entry created or removed
        for name in before:
            if name.endswith("-shm"):
                # Documented limit: inside a process that holds the ledger open, SQLite shares one
                # wal-index (-shm) between its connections, so an in-process preview may move
                # its read marks (locking state, never content); the CLI preview from another
                # process keeps every byte (next test).
                assert after[name][:2] == before[name][:2] and after[name][4] == before[name][4]
                continue
            assert after[name] == before[name], name
        assert own == preview
        expected = dict(EXPECTED)
        expected["active_examined"] += 1
        expected["fresh_active_retained"] += 1
        assert without_counts_flags(preview) == expected
        applied = writer.reconcile(POLICY)
        assert without_counts_flags(applied) == without_counts_flags(preview)
    finally:
        writer.close()


def test_live_ledger_cli_dry_run_keeps_every_byte(tmp_path) -> None:
    """The CLI preview opens the live ledger read-only from another process: the database,
    -wal and -shm keep their bytes, modes and mtimes, and no entry appears or vanishes."""
    directory = str(tmp_path / "d")
    db = os.path.join(directory, "tasks.sqlite")
    clock = Clock(time.time() - 5000)
    writer = Ledger(db, clock=clock)
    try:
        populate(writer, clock)
        owned = writer.create_task()
        writer.start_task(owned.id)
        before = files_of(directory)
        assert {"tasks.sqlite-wal", "tasks.sqlite-shm"} <= set(before)
        time.sleep(0.01)
        previews = []
        for _ in range(2):
            result = run_cli("--db", db, "reconcile", "--dry-run")
            previews.append(assert_json_line(result))
            assert result.code == 0
        assert previews[0] == previews[1]
        # 5000 s in the past: the two stale tasks, the overdue one, and the owned task whose
        # owner (this process) is alive but which has no heartbeat for the grace
        assert previews[0]["reconcile"]["tasks_timed_out"] == 4
        for args in (["doctor"], ["status"], ["get", owned.id], ["metrics"],
                     ["prune", "--older-than", "0", "--dry-run"]):
            assert run_cli("--db", db, *args).code == 0
        assert files_of(directory) == before
    finally:
        writer.close()


# ----------------------------------------------------------------------------- > 64 MiB


BULK_NAME = "bulk.loader:" + "n" * 180
BULK_COUNT = 120_000


def _bulk_closed_tasks(db: str, count: int, at: float) -> None:
    """Append ``count`` succeeded+delivered tasks with the statements the API issues for
    create -> close(succeeded, completed) -> delivery(delivered) at time ``at``: an INSERT
    and two UPDATEs, plus the three events (written by the database itself when it has
    event triggers, else inserted here exactly as the API inserts them)."""
    rng = random.Random(20261129)
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        conn.create_function(
            "det_uuid", 0, lambda: str(uuid.UUID(int=rng.getrandbits(128), version=4))
        )
        conn.create_function("det_hash", 0, lambda: f"{rng.getrandbits(256):064x}")
        conn.execute("BEGIN IMMEDIATE")
        first = conn.execute("SELECT coalesce(max(seq), 0) + 1 FROM tsg_tasks").fetchone()[0]
        conn.execute(
            "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < ?) "
            "INSERT INTO tsg_tasks(seq, id, name, status, delivery_required, delivery_status, "
            "payload_hash, created_at, delivery_updated_at, updated_at) "
            "SELECT ? + i, det_uuid(), ?, 'queued', 1, 'pending', det_hash(), ?, ?, ? FROM n",
            (count, first, BULK_NAME, at, at, at),
        )
        conn.execute(
            "UPDATE tsg_tasks SET status = 'succeeded', terminal_code = 'completed', "
            "ended_at = ?, updated_at = ?, version = version + 1 WHERE seq >= ?",
            (at, at, first),
        )
        conn.execute(
            "UPDATE tsg_tasks SET delivery_status = 'delivered', "
            "delivery_code = 'transport_acknowledged', delivery_updated_at = ?, "
            "version = version + 1 WHERE seq >= ?",
            (at, first),
        )
        if not events_written_by_triggers(conn):
            columns = table_columns(conn, "tsg_events")
            step = ", step" if "step" in columns else ""
            for kind, state, code in (
                ("created", "queued", "created"),
                ("closed", "succeeded", "completed"),
                ("delivery", "delivered", "transport_acknowledged"),
            ):
                value = f", {EVENT_STEP[kind]}" if step else ""
                conn.execute(
                    f"INSERT INTO tsg_events(task_seq, kind, state, code, at{step}) "
                    f"SELECT seq, ?, ?, ?, ?{value} FROM tsg_tasks WHERE seq >= ? ORDER BY seq",
                    (kind, state, code, at, first),
                )
        conn.execute("COMMIT")
    finally:
        conn.close()


def _row_shape(db: str, seq: int) -> tuple[dict, list]:
    """A task row and its events without identity columns (seq, id, fingerprint)."""
    conn = sqlite3.connect(db)  # closes cleanly: no sidecars are left behind
    conn.row_factory = sqlite3.Row
    try:
        row = dict(conn.execute("SELECT * FROM tsg_tasks WHERE seq = ?", (seq,)).fetchone())
        events = [
            {k: v for k, v in dict(e).items() if k not in ("seq", "task_seq")}
            for e in conn.execute(
                "SELECT * FROM tsg_events WHERE task_seq = ? ORDER BY at, kind", (seq,)
            )
        ]
    finally:
        conn.close()
    for key in ("seq", "id", "payload_hash"):
        row.pop(key)
    return row, events


@pytest.fixture(scope="module")
def big_ledger(tmp_path_factory) -> str:
    directory = tmp_path_factory.mktemp("big") / "d"
    db = str(directory / "tasks.sqlite")
    clock = Clock()
    with Ledger(db, clock=clock) as led:
        populate(led, clock)
        # the loader mirrors the API: one API-written task of the same shape to compare with
        probe = led.create_task(name=BULK_NAME, payload_hash="ab" * 32)
        led.close_task(probe.id, "succeeded", code="completed")
        led.set_delivery(probe.id, "delivered", code="transport_acknowledged")
    _bulk_closed_tasks(db, BULK_COUNT, clock.t)
    assert sidecars(db) == []
    return db


def test_bulk_loader_writes_what_the_api_writes(big_ledger: str) -> None:
    probe_seq = 8  # the API-written task just before the bulk rows
    assert _row_shape(big_ledger, probe_seq) == _row_shape(big_ledger, probe_seq + 1)
    assert _row_shape(big_ledger, probe_seq) == _row_shape(big_ledger, probe_seq + BULK_COUNT)
    with Ledger(big_ledger, clock=Clock(T0 + 1000), read_only=True) as ro:
        report = ro.doctor()
    assert report["healthy"] is True, report
    assert sidecars(big_ledger) == []
    assert report["task_count"] == BULK_COUNT + 8
    assert report["event_count"] == BULK_COUNT * 3 + 13 + 3


def test_dry_run_on_closed_ledger_over_64_mib(big_ledger: str) -> None:
    size = os.path.getsize(big_ledger)
    assert size > 64 * 2**20
    directory = os.path.dirname(big_ledger)
    before = files_of(directory)
    with Ledger(big_ledger, clock=Clock(T0 + 1000), read_only=True,
                transient_sidecars=False) as ro:
        assert ro.storage_info()["read_snapshot"] is True
        report = ro.reconcile(POLICY, dry_run=True)
    check_report(report, dry_run=True)
    assert without_counts_flags(report) == EXPECTED
    result = run_cli("--db", big_ledger, "reconcile", "--dry-run", timeout=120)
    payload = assert_json_line(result)
    assert result.code == 0 and payload["reconcile"]["dry_run"] is True
    assert files_of(directory) == before


def test_snapshot_limit_below_file_size_fails_closed(big_ledger: str) -> None:
    size = os.path.getsize(big_ledger)
    directory = os.path.dirname(big_ledger)
    before = files_of(directory)
    for limit in (4096, size - 1, 64 * 2**20):
        with pytest.raises(StorageError) as caught:
            Ledger(big_ledger, clock=Clock(T0 + 1000), read_only=True,
                   snapshot_max_bytes=limit, transient_sidecars=False)
        assert caught.value.reason == "snapshot_too_large"
    with Ledger(big_ledger, clock=Clock(T0 + 1000), read_only=True,
                snapshot_max_bytes=size, transient_sidecars=False) as ro:
        assert ro.storage_info()["read_snapshot"] is True
        assert ro.reconcile(POLICY, dry_run=True)["tasks_timed_out"] == 2
    with pytest.raises(InvalidInput):
        Ledger(big_ledger, read_only=True, snapshot_max_bytes=4095)
    assert files_of(directory) == before
