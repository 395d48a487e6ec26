"""Storage safety on POSIX, schema fingerprint and the v1/v2 -> v3 migrations, read-only
construction, and the busy-ledger error."""

from __future__ import annotations

import os
import re
import shutil
import sqlite3
import stat
import threading
from pathlib import Path

import pytest
from core_helpers import (
    T0,
    Clock,
    as_v6,
    as_v7,
    assert_cli_error,
    guarded_job,
    insert_event,
    raw_execute,
    run_cli,
    sidecars,
    snapshot_entries,
    snapshot_tree,
)
from task_state_guard import (
    InvalidInput,
    Ledger,
    LedgerBusy,
    LedgerError,
    ReconcilePolicy,
    StorageError,
    UnsafeLocation,
)
from task_state_guard.sqlite import schema

pytestmark = pytest.mark.skipif(os.name != "posix", reason="POSIX storage contract")


def mode(path: str) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def make_ledger(db: str, clock: Clock | None = None) -> list[str]:
    with Ledger(db, clock=clock or Clock()) as led:
        ids = [led.create_task().id for _ in range(2)]
        led.start_task(ids[0], owner=False)
    return ids


# ----------------------------------------------------------------------------- modes


def _check_new_ledger_modes(tmp_path, db: str, created: list[str]) -> None:
    old = os.umask(0o022)
    try:
        led = Ledger(db, clock=Clock())
        task = led.create_task()
        led.start_task(task.id)
        for d in created:
            assert mode(str(tmp_path / d)) == 0o700
        assert mode(db) == 0o600
        present = [db + s for s in ("-wal", "-shm") if os.path.exists(db + s)]
        assert present, "a live WAL ledger has its sidecars"
        for path in present:
            assert mode(path) == 0o600
        led.close()
    finally:
        os.umask(old)


def test_new_directory_is_0700_and_files_0600(tmp_path) -> None:
    _check_new_ledger_modes(tmp_path, str(tmp_path / "a" / "tasks.sqlite"), ["a"])


def test_new_nested_directories_are_0700(tmp_path) -> None:
    _check_new_ledger_modes(
        tmp_path, str(tmp_path / "a" / "b" / "c" / "tasks.sqlite"), ["a", "a/b", "a/b/c"]
    )


def test_existing_loose_modes_are_tightened(tmp_path) -> None:
    db = str(tmp_path / "d" / "tasks.sqlite")
    make_ledger(db)
    holder = sqlite3.connect(db)  # keep -wal and -shm alive
    holder.execute("SELECT count(*) FROM tsg_tasks").fetchone()
    holder.execute("CREATE TEMP TABLE x(a)")
    try:
        for path in (db, db + "-wal", db + "-shm"):
            assert os.path.exists(path)
            os.chmod(path, 0o644)
        with Ledger(db, clock=Clock()) as led:
            led.create_task()
            for path in (db, db + "-wal", db + "-shm"):
                assert mode(path) == 0o600
    finally:
        holder.close()


def test_read_only_never_tightens_or_creates(tmp_path) -> None:
    db = str(tmp_path / "d" / "tasks.sqlite")
    make_ledger(db)
    os.chmod(db, 0o644)
    with pytest.raises(UnsafeLocation):
        Ledger(db, read_only=True)
    assert mode(db) == 0o644
    missing_dir = str(tmp_path / "nowhere" / "tasks.sqlite")
    with pytest.raises(InvalidInput):
        Ledger(missing_dir, read_only=True)
    assert not os.path.exists(tmp_path / "nowhere")
    missing_file = str(tmp_path / "d" / "other.sqlite")
    with pytest.raises(InvalidInput):
        Ledger(missing_file, read_only=True)
    assert not os.path.exists(missing_file)


# ----------------------------------------------------------------------------- aliases


def _untouched(path: str) -> tuple[int, int, bytes]:
    st = os.stat(path)
    with open(path, "rb") as handle:
        return st.st_mode, st.st_mtime_ns, handle.read()


# A database or sidecar that is a link alias is a StorageError (a StateConflict), as in 0.1.0,
# and its target is left exactly as it was (bytes, mode, time).


def test_symlinked_database_rejected(tmp_path) -> None:
    real = str(tmp_path / "d" / "real.sqlite")
    make_ledger(real)
    os.chmod(real, 0o640)
    before = _untouched(real)
    link = str(tmp_path / "d" / "link.sqlite")
    os.symlink(real, link)
    for ro in (False, True):
        with pytest.raises(StorageError) as info:
            Ledger(link, read_only=ro)
        assert info.value.reason == "file_is_symlink"
    assert_cli_error(run_cli("--db", link, "doctor"), "StateConflict")
    assert_cli_error(run_cli("--db", link, "init"), "StateConflict")
    assert _untouched(real) == before


def test_dangling_symlink_database_rejected(tmp_path) -> None:
    d = tmp_path / "d"
    d.mkdir(mode=0o700)
    link = str(d / "link.sqlite")
    os.symlink(str(d / "target.sqlite"), link)
    with pytest.raises(StorageError):
        Ledger(link)
    assert not os.path.exists(d / "target.sqlite")


def test_hard_linked_database_rejected(tmp_path) -> None:
    db = str(tmp_path / "d" / "tasks.sqlite")
    make_ledger(db)
    os.chmod(db, 0o640)
    before = _untouched(db)
    os.link(db, str(tmp_path / "d" / "alias.sqlite"))
    for ro in (False, True):
        with pytest.raises(StorageError) as info:
            Ledger(db, read_only=ro)
        assert info.value.reason == "file_hard_linked"
    assert_cli_error(run_cli("--db", db, "get", "00000000-0000-4000-8000-000000000000"),
                     "StateConflict")
    assert_cli_error(run_cli("--db", db, "init"), "StateConflict")
    assert _untouched(db) == before


@pytest.mark.parametrize("suffix", ["-wal", "-shm", "-journal"])
def test_symlinked_sidecar_rejected(tmp_path, suffix: str) -> None:
    db = str(tmp_path / "d" / "tasks.sqlite")
    make_ledger(db)
    target = str(tmp_path / "elsewhere")
    with open(target, "wb"):
        pass
    os.chmod(target, 0o644)
    before = _untouched(target)
    os.symlink(target, db + suffix)
    for ro in (False, True):
        with pytest.raises(StorageError) as info:
            Ledger(db, read_only=ro)
        assert info.value.reason == "file_is_symlink"
    assert_cli_error(run_cli("--db", db, "init"), "StateConflict")
    assert _untouched(target) == before


@pytest.mark.parametrize("suffix", ["-wal", "-shm", "-journal"])
def test_hard_linked_sidecar_rejected(tmp_path, suffix: str) -> None:
    db = str(tmp_path / "d" / "tasks.sqlite")
    make_ledger(db)
    other = str(tmp_path / "d" / "other")
    with open(other, "wb"):
        pass
    os.chmod(other, 0o640)
    before = _untouched(other)
    os.link(other, db + suffix)
    for ro in (False, True):
        with pytest.raises(StorageError) as info:
            Ledger(db, read_only=ro)
        assert info.value.reason == "file_hard_linked"
    assert_cli_error(run_cli("--db", db, "init"), "StateConflict")
    assert _untouched(other) == before


def test_non_regular_database_rejected(tmp_path) -> None:
    d = tmp_path / "d"
    d.mkdir(mode=0o700)
    fifo = str(d / "fifo.sqlite")
    os.mkfifo(fifo, 0o600)
    as_dir = str(d / "dir.sqlite")
    os.mkdir(as_dir, 0o700)
    for path in (fifo, as_dir):
        for ro in (False, True):
            with pytest.raises(StorageError):
                Ledger(path, read_only=ro)
        assert_cli_error(run_cli("--db", path, "init"), "StateConflict")


def test_world_writable_non_sticky_ancestor_rejected(tmp_path) -> None:
    open_dir = tmp_path / "shared"
    open_dir.mkdir()
    os.chmod(open_dir, 0o777)
    db = str(open_dir / "private" / "tasks.sqlite")
    with pytest.raises(UnsafeLocation):
        Ledger(db)
    assert not os.path.exists(open_dir / "private")
    os.chmod(open_dir, 0o775)  # group-writable: also unsafe
    with pytest.raises(UnsafeLocation):
        Ledger(db)
    os.chmod(open_dir, 0o1777)  # sticky, like /tmp: accepted
    with Ledger(db, clock=Clock()) as led:
        led.create_task()
    os.chmod(open_dir, 0o777)
    with pytest.raises(UnsafeLocation):
        Ledger(db)
    with pytest.raises(UnsafeLocation):
        Ledger(db, read_only=True)


def test_world_writable_leaf_rejected(tmp_path) -> None:
    leaf = tmp_path / "leaf"
    leaf.mkdir()
    os.chmod(leaf, 0o777)
    with pytest.raises(UnsafeLocation):
        Ledger(str(leaf / "tasks.sqlite"))
    assert not os.path.exists(leaf / "tasks.sqlite")


def test_database_replaced_after_open_rejected(tmp_path) -> None:
    db = str(tmp_path / "d" / "tasks.sqlite")
    copy = str(tmp_path / "d" / "copy.sqlite")
    led = Ledger(db, clock=Clock())
    task = led.create_task()
    led.close()
    shutil.copy2(db, copy)
    led = Ledger(db, clock=Clock())
    led.get_task(task.id)
    os.replace(copy, db)
    with pytest.raises(StorageError):
        led.create_task()
    with pytest.raises(StorageError):
        led.get_task(task.id)
    errors: list[BaseException] = []

    def other_thread() -> None:
        try:
            led.get_task(task.id)
        except BaseException as exc:
            errors.append(exc)

    th = threading.Thread(target=other_thread)
    th.start()
    th.join()
    assert len(errors) == 1 and isinstance(errors[0], StorageError)
    led.close()


def test_database_removed_after_open_rejected(tmp_path) -> None:
    db = str(tmp_path / "d" / "tasks.sqlite")
    led = Ledger(db, clock=Clock())
    led.create_task()
    os.unlink(db)
    with pytest.raises(StorageError):
        led.create_task()
    led.close()


def test_guarded_job_writes_refused_once_the_file_is_replaced_or_removed(tmp_path) -> None:
    """A guarded job's two writes check the file before each transaction, as every write."""
    db = str(tmp_path / "d" / "tasks.sqlite")
    copy = str(tmp_path / "d" / "copy.sqlite")
    led = Ledger(db, clock=Clock())
    logical = led.create_task().id
    attempt = led.begin_attempt(logical, open_logical=False)
    led.end_attempt([(attempt, "succeeded", None)])
    shutil.copy2(db, copy)
    os.replace(copy, db)
    replaced = Path(db).read_bytes()
    with pytest.raises(StorageError):
        led.begin_attempt(logical, open_logical=False)
    with pytest.raises(StorageError):
        led.end_attempt([(logical, "succeeded", None)])
    assert Path(db).read_bytes() == replaced  # the file now there was not written
    os.unlink(db)
    with pytest.raises(StorageError):
        led.begin_attempt(logical, open_logical=False)
    assert not os.path.exists(db)
    led.close()


# ----------------------------------------------------------------------------- schema


def test_foreign_schema_rejected(tmp_path) -> None:
    d = tmp_path / "d"
    d.mkdir(mode=0o700)
    db = str(d / "foreign.sqlite")
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.close()
    raw_execute(db, "CREATE TABLE notes(body TEXT)")
    os.chmod(db, 0o600)
    before = snapshot_tree(str(d))
    for ro in (False, True):
        with pytest.raises(StorageError):
            Ledger(db, read_only=ro)
    assert_cli_error(run_cli("--db", db, "init"), "StateConflict")
    assert_cli_error(run_cli("--db", db, "reconcile", "--dry-run"), "StateConflict")
    conn = sqlite3.connect(db)
    assert conn.execute("SELECT name FROM sqlite_master").fetchall() == [("notes",)]
    conn.close()
    after = snapshot_tree(str(d))
    assert set(after) == set(before)


def test_tampered_schema_rejected_by_api(tmp_path) -> None:
    db = str(tmp_path / "d" / "tasks.sqlite")
    make_ledger(db)
    raw_execute(db, "CREATE INDEX extra ON tsg_tasks(terminal_code)")
    with pytest.raises(StorageError):
        Ledger(db)
    raw_execute(
        db, "DROP INDEX extra", "UPDATE tsg_meta SET value = '4' WHERE key = 'schema_version'"
    )
    with pytest.raises(StorageError):
        Ledger(db)


@pytest.mark.parametrize(
    "content", [b"hello, this is not a database\n" * 200, b"\x00" * 8192, b"SQLite format 3"]
)
def test_non_sqlite_file_rejected(tmp_path, content: bytes) -> None:
    d = tmp_path / "d"
    d.mkdir(mode=0o700)
    db = str(d / "tasks.sqlite")
    with open(db, "wb") as handle:
        handle.write(content)
    os.chmod(db, 0o600)
    for ro in (False, True):
        with pytest.raises(StorageError):
            Ledger(db, read_only=ro)
    with open(db, "rb") as handle:
        assert handle.read() == content
    for args in (["init"], ["doctor"], ["reconcile", "--dry-run"], ["status"]):
        assert_cli_error(run_cli("--db", db, *args), "StateConflict")


def build_v1(db: str, *, legacy_reason: bool = False, empty: bool = False) -> list[str]:
    """A schema-v1 ledger built from the published v1 DDL plus its meta rows, holding the
    rows and events the API writes (one closed delivering task, one running internal task)."""
    os.makedirs(os.path.dirname(db), mode=0o700, exist_ok=True)
    ids = [
        "11111111-1111-4111-8111-111111111111",
        "22222222-2222-4222-8222-222222222222",
    ]
    code = "because the worker said so" if legacy_reason else "worker_completed"
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("BEGIN")
        for statement in schema.DDL_V1:
            conn.execute(statement)
        conn.execute("INSERT INTO tsg_meta(key, value) VALUES ('application', 'task-state-guard')")
        conn.execute("INSERT INTO tsg_meta(key, value) VALUES ('schema_version', '1')")
        if not empty:
            conn.execute(
                "INSERT INTO tsg_tasks(seq, id, status, code, delivery_required, "
                "delivery_status, created_at, closed_at, updated_at) "
                "VALUES (1, ?, 'succeeded', ?, 1, 'pending', ?, ?, ?)",
                (ids[0], code, T0, T0 + 1, T0 + 1),
            )
            insert_event(conn, 1, "created", "queued", "created", T0)
            insert_event(conn, 1, "closed", "succeeded", code, T0 + 1)
            conn.execute(
                "INSERT INTO tsg_tasks(seq, id, status, delivery_required, delivery_status, "
                "created_at, started_at, updated_at) VALUES (2, ?, 'running', 0, 'pending', "
                "?, ?, ?)",
                (ids[1], T0, T0 + 2, T0 + 2),
            )
            insert_event(conn, 2, "created", "queued", "created", T0)
            insert_event(conn, 2, "started", "running", "started", T0 + 2)
        conn.execute("COMMIT")
    finally:
        conn.close()
    os.chmod(db, 0o600)
    return ids


def meta_version(db: str) -> str:
    conn = sqlite3.connect(db)  # a plain reader: closes cleanly, leaves no sidecars
    try:
        return conn.execute("SELECT value FROM tsg_meta WHERE key='schema_version'").fetchone()[0]
    finally:
        conn.close()


def build_v2(db: str) -> list[str]:
    """A schema-v2 ledger (the development layout before 0.2.0) written through its own
    triggers: a delivered task, a running task with a name, an owner token and a heartbeat."""
    os.makedirs(os.path.dirname(db), mode=0o700, exist_ok=True)
    ids = [
        "33333333-3333-4333-8333-333333333333",
        "44444444-4444-4444-8444-444444444444",
    ]
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("BEGIN")
        for statement in schema.DDL_V2:
            conn.execute(statement)
        conn.execute("INSERT INTO tsg_meta(key, value) VALUES ('application', 'task-state-guard')")
        conn.execute("INSERT INTO tsg_meta(key, value) VALUES ('schema_version', '2')")
        conn.execute(
            "INSERT INTO tsg_tasks(id, status, delivery_required, delivery_status, created_at, "
            "updated_at) VALUES (?, 'queued', 1, 'pending', ?, ?)", (ids[0], T0, T0))
        conn.execute(
            "UPDATE tsg_tasks SET status = 'succeeded', code = 'completed', closed_at = ?, "
            "updated_at = ? WHERE id = ?", (T0 + 1, T0 + 1, ids[0]))
        conn.execute(
            "UPDATE tsg_tasks SET delivery_status = 'delivered', "
            "delivery_code = 'transport_acknowledged', delivery_closed_at = ?, updated_at = ? "
            "WHERE id = ?", (T0 + 2, T0 + 2, ids[0]))
        conn.execute(
            "INSERT INTO tsg_tasks(id, name, status, delivery_required, delivery_status, "
            "timeout_seconds, created_at, updated_at) "
            "VALUES (?, 'app.job', 'queued', 0, 'pending', 60, ?, ?)", (ids[1], T0, T0))
        conn.execute(
            "UPDATE tsg_tasks SET status = 'running', started_at = ?, deadline_at = ?, "
            "owner = ?, updated_at = ? WHERE id = ?",
            (T0 + 3, T0 + 63, "ab" * 16, T0 + 3, ids[1]))
        conn.execute("UPDATE tsg_tasks SET heartbeat_at = ? WHERE id = ?", (T0 + 4, ids[1]))
        conn.execute("COMMIT")
    finally:
        conn.close()
    os.chmod(db, 0o600)
    return ids


def same_schema_as_fresh(db: str, tmp_path) -> bool:
    fresh = str(tmp_path / "fresh" / "tasks.sqlite")
    Ledger(fresh).close()
    a, b = sqlite3.connect(db), sqlite3.connect(fresh)
    try:
        q = "SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY name"
        return bool(a.execute(q).fetchall() == b.execute(q).fetchall())
    finally:
        a.close()
        b.close()


def test_empty_v1_migrates_to_v5(tmp_path) -> None:
    db = str(tmp_path / "d" / "tasks.sqlite")
    build_v1(db, empty=True)
    with Ledger(db, clock=Clock()) as led:
        assert led.schema_version == Ledger.SCHEMA_VERSION == 9
        assert led.doctor()["healthy"] is True
        led.create_task(name="x")
    assert meta_version(db) == "9"
    assert same_schema_as_fresh(db, tmp_path)


def test_v1_migrates_to_v5(tmp_path) -> None:
    db = str(tmp_path / "d" / "tasks.sqlite")
    ids = build_v1(db)
    clock = Clock(T0 + 10)
    with Ledger(db, clock=clock) as led:
        assert led.schema_version == 9
        done = led.get_task(ids[0])
        assert done.terminal_code == "worker_completed" and done.ended_at == T0 + 1
        assert done.version == 1 and done.delivery_updated_at == T0 and done.updated_at == T0 + 1
        running = led.get_task(ids[1])
        assert running.version == 1 and running.started_at == T0 + 2 and running.name is None
        assert running.framework_id is None and done.framework_id is None
        report = led.doctor()
        assert report["healthy"] is True and report["schema_version"] == 9
        assert report["task_count"] == 2 and report["event_count"] == 4
        fid = "0ac03e98-045d-499b-a3e1-22df12f98c64"
        task = led.create_task(name="after.migration", framework_id=fid)
        assert led.get_task(task.id).name == "after.migration"
        assert led.get_task(task.id).framework_id == fid
        assert led.set_delivery(ids[0], "delivered").version == 2
    assert meta_version(db) == "9"
    assert same_schema_as_fresh(db, tmp_path)
    # the CLI apply path migrates too
    db2 = str(tmp_path / "g" / "tasks.sqlite")
    build_v1(db2)
    result = run_cli("--db", db2, "reconcile")
    assert result.code == 0 and result.json["reconcile"]["tasks_timed_out"] == 1
    assert meta_version(db2) == "9"


def test_v2_migrates_to_v5(tmp_path) -> None:
    db = str(tmp_path / "d" / "tasks.sqlite")
    ids = build_v2(db)
    with Ledger(db, read_only=True) as ro:  # a read-only open leaves v2 as v2
        assert ro.schema_version == 2
        assert ro.doctor()["healthy"] is True
        before = [ro.get_task(i) for i in ids]
    assert meta_version(db) == "2"
    with Ledger(db, clock=Clock(T0 + 10)) as led:
        assert led.schema_version == 9
        after = [led.get_task(i) for i in ids]
        assert after == before
        delivered, running = after
        assert (delivered.status, delivered.terminal_code) == ("succeeded", "completed")
        assert delivered.delivery_updated_at == T0 + 2 and delivered.updated_at == T0 + 1
        assert delivered.version == 2
        assert running.name == "app.job" and running.has_owner and running.heartbeat_at == T0 + 4
        assert running.updated_at == T0 + 4 and running.version == 1
        assert delivered.framework_id is None and running.framework_id is None
        assert running.delivery_updated_at == running.created_at == T0
        report = led.doctor()
        assert report["healthy"] is True and report["event_count"] == 5
        assert led.close_task(ids[1], "succeeded").version == 2
    assert meta_version(db) == "9"
    assert same_schema_as_fresh(db, tmp_path)


def test_v6_reads_in_place_and_migrates_to_rows_inserted_running(tmp_path) -> None:
    """A v6 file (rows inserted queued, then started) is read as it is by a read-only open and
    migrated by the first writable open; a guarded job on it then stores what it stores on a
    fresh ledger."""
    db = str(tmp_path / "d" / "tasks.sqlite")
    with Ledger(db, clock=Clock(T0)) as led:
        old = led.create_task(name="before")
        led.start_task(old.id, owner=False)
    as_v6(db)
    with open(db, "rb") as handle:
        before = handle.read()
    with Ledger(db, read_only=True) as ro:
        assert ro.schema_version == 6
        assert ro.get_task(old.id).status == "running"
        assert [e.kind for e in ro.events_of(old.id)] == ["created", "started"]
        assert ro.status()["tasks"]["running"] == 1
        assert ro.doctor()["healthy"] is True
    with open(db, "rb") as handle:
        assert handle.read() == before
    assert meta_version(db) == "6"
    clock = Clock(T0 + 10)
    with Ledger(db, clock=clock) as led:
        assert led.schema_version == 9
        upgraded = guarded_job(led, clock)
        assert led.doctor()["healthy"] is True
        assert led.get_task(old.id).version == 1
    assert meta_version(db) == "9"
    assert same_schema_as_fresh(db, tmp_path)
    clock = Clock(T0 + 10)
    with Ledger(str(tmp_path / "other" / "tasks.sqlite"), clock=clock) as led:
        assert guarded_job(led, clock) == upgraded


def test_v7_reads_in_place_and_migrates_to_checks_without_lists(tmp_path) -> None:
    """A v7 file (checks and trigger conditions tested against lists of constants) is read as
    it is by a read-only open and rewritten in place by the first writable open: no row is
    copied, a connection opened before the upgrade sees the new definitions, the checks refuse
    what they refused, and a guarded job stores what it stores on a fresh ledger."""
    db = str(tmp_path / "d" / "tasks.sqlite")
    with Ledger(db, clock=Clock(T0)) as led:
        old = led.create_task(name="before")
        led.start_task(old.id, owner=False)
    as_v7(db)
    with open(db, "rb") as handle:
        before = handle.read()
    with Ledger(db, read_only=True) as ro:
        assert ro.schema_version == 7
        assert ro.get_task(old.id).status == "running"
        assert ro.doctor()["healthy"] is True
    with open(db, "rb") as handle:
        assert handle.read() == before
    early = sqlite3.connect(db, isolation_level=None)  # another process's older connection
    assert "IN ('queued','running','succeeded'" in early.execute(
        "SELECT sql FROM sqlite_master WHERE name = 'tsg_tasks'").fetchone()[0]
    rowids = early.execute("SELECT seq, rowid FROM tsg_tasks").fetchall()
    clock = Clock(T0 + 10)
    with Ledger(db, clock=clock) as led:
        assert led.schema_version == 9
        upgraded = guarded_job(led, clock)
        assert led.doctor()["healthy"] is True
        assert led.get_task(old.id).version == 1
    assert meta_version(db) == "9"
    assert same_schema_as_fresh(db, tmp_path)
    try:
        stored = " ".join(sql for (sql,) in early.execute(
            "SELECT sql FROM sqlite_master WHERE sql IS NOT NULL"))
        assert not re.search(r"IN \([^()]*,[^()]*,", stored)  # no list of three or more
        assert early.execute("SELECT seq, rowid FROM tsg_tasks WHERE seq = ?",
                             (rowids[0][0],)).fetchall() == rowids
        for bad in ("UPDATE tsg_tasks SET status = 'bogus'",
                    "UPDATE tsg_tasks SET delivery_status = 'bogus'",
                    "UPDATE tsg_tasks SET framework = 'bogus'",
                    "UPDATE tsg_events SET kind = 'bogus'",
                    "UPDATE tsg_events SET step = 9",
                    "UPDATE tsg_totals SET kind = 'bogus'"):
            with pytest.raises(sqlite3.IntegrityError):
                early.execute(bad)
        assert early.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    finally:
        early.close()
    clock = Clock(T0 + 10)
    with Ledger(str(tmp_path / "other" / "tasks.sqlite"), clock=clock) as led:
        assert guarded_job(led, clock) == upgraded


def test_a_sqlite_that_refuses_to_rewrite_its_schema_keeps_a_v7_file_working(
    tmp_path, monkeypatch
) -> None:
    """Where SQLite will not let a connection rewrite its stored schema (defensive mode, an
    authorizer), the upgrade to v8 is left out: the file stays an exact, healthy v7 that is
    written and read as it is, and the other upgrade steps still happen."""
    from task_state_guard.sqlite import connections

    plain = connections.connect_writable

    def defensive(path: str, busy_timeout_ms: int) -> sqlite3.Connection:
        conn = plain(path, busy_timeout_ms)

        def authorize(action: int, table: str | None, *_: object) -> int:
            if action == sqlite3.SQLITE_UPDATE and table == "sqlite_master":
                return sqlite3.SQLITE_DENY
            return sqlite3.SQLITE_OK

        conn.set_authorizer(authorize)
        return conn

    files = {}
    for build in (as_v7, as_v6):
        db = files[build] = str(tmp_path / build.__name__ / "tasks.sqlite")
        with Ledger(db, clock=Clock(T0)) as led:
            old = led.create_task(name="before", task_id="0000000b-0000-4000-8000-00000000000b")
        build(db)
    monkeypatch.setattr(connections, "connect_writable", defensive)
    for db in files.values():
        clock = Clock(T0 + 10)
        with Ledger(db, clock=clock) as led:
            assert led.schema_version == 7
            assert led.doctor()["healthy"] is True
            job = guarded_job(led, clock)
            assert led.get_task(old.id).status == "queued"
        assert meta_version(db) == "7"
        conn = sqlite3.connect(db)
        try:
            assert schema.detect_format(conn) == schema.V7
        finally:
            conn.close()
    monkeypatch.setattr(connections, "connect_writable", plain)
    with Ledger(db, clock=Clock(T0 + 20)) as led:  # an ordinary SQLite upgrades it later
        assert led.schema_version == 9 and led.doctor()["healthy"] is True
    clock = Clock(T0 + 10)
    with Ledger(str(tmp_path / "other" / "tasks.sqlite"), clock=clock) as led:
        assert guarded_job(led, clock) == job


def test_v1_with_legacy_reason_text_fails_closed(tmp_path) -> None:
    db = str(tmp_path / "d" / "tasks.sqlite")
    build_v1(db, legacy_reason=True)
    with open(db, "rb") as handle:
        before = handle.read()
    with pytest.raises(StorageError):
        Ledger(db)
    assert meta_version(db) == "1"
    assert_cli_error(run_cli("--db", db, "init"), "StateConflict")
    assert meta_version(db) == "1"
    conn = sqlite3.connect(db)
    cols = [r[1] for r in conn.execute("PRAGMA table_info(tsg_tasks)")]
    conn.close()
    assert "name" not in cols and "owner" not in cols
    with open(db, "rb") as handle:
        assert handle.read() == before


def test_read_only_open_leaves_v1_as_v1(tmp_path) -> None:
    db = str(tmp_path / "d" / "tasks.sqlite")
    ids = build_v1(db)
    before = snapshot_entries(str(tmp_path / "d"))
    clock = Clock(T0 + 10_000)
    with Ledger(db, clock=clock, read_only=True) as ro:
        assert ro.schema_version == 1
        assert ro.get_task(ids[1]).status == "running"
        report = ro.reconcile(ReconcilePolicy(600, 600), dry_run=True)
        assert report["tasks_timed_out"] == 1 and report["deliveries_failed"] == 1
        assert ro.doctor()["healthy"] is True
        with pytest.raises(LedgerError):
            ro.create_task()
    result = run_cli("--db", db, "reconcile", "--dry-run")
    assert result.code == 0 and result.json["reconcile"]["tasks_timed_out"] == 1
    assert snapshot_entries(str(tmp_path / "d")) == before
    assert sidecars(db) == []
    assert meta_version(db) == "1"


# ----------------------------------------------------------------------------- read-only


def test_read_only_rejects_every_mutation(tmp_path) -> None:
    db = str(tmp_path / "d" / "tasks.sqlite")
    ids = make_ledger(db)
    with Ledger(db, clock=Clock(T0 + 5), read_only=True) as check:
        states = [check.get_task(i) for i in ids]
    before = snapshot_entries(str(tmp_path / "d"))
    with Ledger(db, clock=Clock(T0 + 5), read_only=True) as ro:
        assert ro.read_only is True
        calls = [
            lambda: ro.create_task(),
            lambda: ro.start_task(ids[1]),
            lambda: ro.start_task(ids[1], owner=False),
            lambda: ro.heartbeat(ids[0]),
            lambda: ro.heartbeat_many([ids[0]]),
            lambda: ro.close_task(ids[0], "succeeded"),
            lambda: ro.set_delivery(ids[0], "delivered"),
            lambda: ro.reconcile(),
            lambda: ro.prune(0),
        ]
        for call in calls:
            with pytest.raises(LedgerError):
                call()
        assert [ro.get_task(i) for i in ids] == states
        assert ro.storage_info()["read_only"] is True
    assert snapshot_entries(str(tmp_path / "d")) == before


def test_storage_info_has_no_path(tmp_path) -> None:
    db = str(tmp_path / "secret-dir-name" / "tasks.sqlite")
    with Ledger(db) as led:
        info = led.storage_info()
    assert info["permission_model"] == "posix_mode"
    assert info["journal_mode"] == "wal" and info["foreign_keys"] is True
    assert info["busy_timeout_ms"] == 5000
    assert info["read_only"] is False and info["local_filesystem_required"] is True
    assert "secret-dir-name" not in repr(info) and str(tmp_path) not in repr(info)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"busy_timeout_ms": -1},
        {"busy_timeout_ms": "5"},
        {"busy_timeout_ms": 1.5},
        {"read_only": "yes"},
        {"allow_external_acl": 1},
        {"clock": 5},
        {"snapshot_max_bytes": 0},
    ],
)
def test_constructor_validation(tmp_path, kwargs: dict) -> None:
    with pytest.raises(InvalidInput):
        Ledger(str(tmp_path / "d" / "t.sqlite"), **kwargs)
    assert not os.path.exists(tmp_path / "d" / "t.sqlite")


@pytest.mark.parametrize("path", ["", ":memory:", "file:x.sqlite?mode=memory", "a\x00b"])
def test_bad_paths(path: str) -> None:
    with pytest.raises(LedgerError):
        Ledger(path)


# ----------------------------------------------------------------------------- busy


def test_lock_wait_past_busy_timeout_is_ledger_busy(tmp_path) -> None:
    db = str(tmp_path / "d" / "tasks.sqlite")
    ids = make_ledger(db)
    led = Ledger(db, clock=Clock(T0 + 1), busy_timeout_ms=100)
    led.get_task(ids[0])
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(LedgerBusy) as info:
            led.create_task()
        assert isinstance(info.value, LedgerError) and info.value.reason == "database_busy"
        assert not isinstance(info.value, sqlite3.Error)
        with pytest.raises(LedgerBusy):
            led.close_task(ids[1], "cancelled")
        assert led.get_task(ids[1]).status == "queued"  # reads still work under WAL
        result = run_cli("--explain", "--db", db, "--busy-timeout-ms", "100", "create")
        assert_cli_error(result, "StateConflict", reason="database_busy")
        result = run_cli("--explain", "--db", db, "--busy-timeout-ms", "100", "close", ids[1],
                         "--status", "cancelled")
        assert_cli_error(result, "StateConflict", reason="database_busy")
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert led.close_task(ids[1], "cancelled").status == "cancelled"
    led.close()


# ----------------------------------------------------------------------------- more fail-closed


def test_read_only_fails_closed_on_journal_and_incomplete_wal_pair(tmp_path) -> None:
    directory = str(tmp_path / "d")
    db = os.path.join(directory, "tasks.sqlite")
    make_ledger(db)
    for present, reason in ((["-wal"], "wal_incomplete"), (["-shm"], "wal_incomplete"),
                            (["-journal"], "rollback_journal_present")):
        for suffix in present:
            fd = os.open(db + suffix, os.O_CREAT | os.O_WRONLY, 0o600)
            os.close(fd)
        before = snapshot_tree(directory)
        # (an incomplete pair is waited on for the busy timeout: a writer may be opening)
        with pytest.raises(StorageError) as info:
            Ledger(db, read_only=True, busy_timeout_ms=300)
        assert info.value.reason == reason
        result = run_cli("--explain", "--db", db, "--busy-timeout-ms", "300", "reconcile",
                         "--dry-run")
        assert_cli_error(result, "StateConflict", reason=reason)
        assert snapshot_tree(directory) == before
        for suffix in present:
            os.unlink(db + suffix)


def test_read_only_requires_wal_mode(tmp_path) -> None:
    directory = str(tmp_path / "d")
    db = os.path.join(directory, "tasks.sqlite")
    make_ledger(db)
    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA journal_mode=DELETE").fetchone()[0] == "delete"
    conn.close()
    before = snapshot_tree(directory)
    with pytest.raises(StorageError) as info:
        Ledger(db, read_only=True)
    assert info.value.reason == "wal_mode_required"
    assert_cli_error(run_cli("--explain", "--db", db, "reconcile", "--dry-run"),
                     "StateConflict", reason="wal_mode_required")
    assert snapshot_tree(directory) == before
    with Ledger(db, clock=Clock(T0 + 5)) as led:  # a writer switches it back to WAL
        led.create_task()
    with Ledger(db, read_only=True) as ro:
        assert ro.doctor()["healthy"] is True


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to create files of another user")
def test_paths_owned_by_another_user_rejected(tmp_path) -> None:
    other = 65534
    foreign_ancestor = tmp_path / "theirs"
    foreign_ancestor.mkdir(mode=0o755)
    os.chown(foreign_ancestor, other, other)
    with pytest.raises(UnsafeLocation) as info:
        Ledger(str(foreign_ancestor / "mine" / "tasks.sqlite"))
    assert info.value.reason == "ancestor_owned_by_other_user"
    leaf = tmp_path / "leaf"
    leaf.mkdir(mode=0o700)
    os.chown(leaf, other, other)
    with pytest.raises(UnsafeLocation) as info:
        Ledger(str(leaf / "tasks.sqlite"))
    assert info.value.reason == "directory_owned_by_other_user"
    db = str(tmp_path / "d" / "tasks.sqlite")
    make_ledger(db)
    os.chown(db, other, other)
    for ro in (False, True):
        with pytest.raises(UnsafeLocation) as info:
            Ledger(db, read_only=ro)
        assert info.value.reason == "file_owned_by_other_user"
    assert_cli_error(run_cli("--explain", "--db", db, "init"), "InvalidInput",
                     reason="file_owned_by_other_user")
