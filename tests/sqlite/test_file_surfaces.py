"""What a hostile local user found next in the ledger's file surfaces, each a regression test
through the CLI and the API: another user's symbolic link in a sticky shared directory is never
followed (database and textfile paths), an existing file that is not a ledger (empty, or an
SQLite file without tables) is never taken over, a trigger hidden under a name like SQLite's
own is an unknown object, and a replaced textfile never inherits another user's mode.

The tests run as root (the CI's containers do) where they need another user's link or file:
``os.lchown`` gives it to uid 65534."""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import re
import sqlite3
import stat
from pathlib import Path

import pytest
from core_helpers import Clock, assert_cli_error, assert_json_line, run_cli
from task_state_guard import Ledger, StorageError, UnsafeLocation

pytestmark = [
    pytest.mark.skipif(os.name != "posix", reason="POSIX files and owners"),
    pytest.mark.sqlite_only(reason="the SQLite file's path, links and modes"),
]
OTHER_UID = 65534
needs_root = pytest.mark.skipif(
    os.name == "posix" and os.geteuid() != 0, reason="giving a link to another user needs root"
)


def _state(path: Path) -> tuple[int, int, int, str]:
    """Mode, owner, inode and SHA-256 of a file (by lstat: no descriptor of ours lingers)."""
    st = os.lstat(path)
    return st.st_mode, st.st_uid, st.st_ino, hashlib.sha256(path.read_bytes()).hexdigest()


def _entries(directory: Path) -> list[str]:
    return sorted(os.listdir(directory))


def _victim(tmp_path: Path) -> Path:
    """Another service's ledger: one running task past its deadline."""
    db = tmp_path / "svc" / "tasks.sqlite"
    clock = Clock()
    with Ledger(str(db), clock=clock) as led:
        led.start_task(led.create_task(timeout_seconds=1).id, owner=False)
    return db


def _sticky(tmp_path: Path) -> Path:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)  # as /tmp: sticky, world-writable, root's
    return shared


# ----------------------------------------------------------------------------- sticky links


@needs_root
def test_another_users_link_in_a_sticky_directory_is_never_followed(tmp_path: Path) -> None:
    """``/tmp/lnk -> /var/lib/svc`` planted by another user: root's ``init`` and ``reconcile``
    on ``/tmp/lnk/tasks.sqlite`` would have timed out that service's running task."""
    db = _victim(tmp_path)
    shared = _sticky(tmp_path)
    link = shared / "lnk"
    link.symlink_to(db.parent)
    os.lchown(link, OTHER_UID, OTHER_UID)
    before, entries = _state(db), _entries(db.parent)
    path = str(link / "tasks.sqlite")
    for args in (["init"], ["reconcile"], ["create"], ["status"], ["reconcile", "--dry-run"]):
        assert_cli_error(
            run_cli("--explain", "--db", path, *args),
            "InvalidInput",
            reason="symlink_in_sticky_directory",
        )
    for read_only in (False, True):
        with pytest.raises(UnsafeLocation) as info:
            Ledger(path, read_only=read_only)
        assert info.value.reason == "symlink_in_sticky_directory"
    assert _state(db) == before and _entries(db.parent) == entries
    with Ledger(str(db), read_only=True) as ro:
        assert ro.status()["tasks"]["running"] == 1


@needs_root
def test_a_link_of_this_user_or_outside_a_sticky_directory_is_followed(tmp_path: Path) -> None:
    """The kernel's rule, no stricter: this user's own link in the sticky directory, and
    another user's link in a directory only this user can write, still lead to the ledger."""
    db = _victim(tmp_path)
    shared = _sticky(tmp_path)
    (shared / "mine").symlink_to(db.parent)
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    (private / "theirs").symlink_to(db.parent)
    os.lchown(private / "theirs", OTHER_UID, OTHER_UID)
    for link in (shared / "mine", private / "theirs"):
        report = assert_json_line(run_cli("--db", str(link / "tasks.sqlite"), "status"))
        assert report["status"]["tasks"]["running"] == 1


@needs_root
def test_a_textfile_is_never_written_through_another_users_sticky_link(tmp_path: Path) -> None:
    db = _victim(tmp_path)
    collector = tmp_path / "collector"
    collector.mkdir()
    shared = _sticky(tmp_path)
    link = shared / "out"
    link.symlink_to(collector)
    os.lchown(link, OTHER_UID, OTHER_UID)
    result = run_cli("--explain", "--db", str(db), "metrics", "--textfile", str(link / "tsg.prom"))
    assert_cli_error(result, "InvalidInput", reason="symlink_in_sticky_directory")
    assert _entries(collector) == []
    os.lchown(link, 0, 0)  # root's own link: followed
    assert_json_line(run_cli("--db", str(db), "metrics", "--textfile", str(link / "tsg.prom")))
    assert _entries(collector) == ["tsg.prom"]


# ----------------------------------------------------------------------------- not a ledger


def _no_tables(path: Path, *, wal: bool) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA application_id = 1414743879")
    conn.execute("PRAGMA user_version = 8")
    if wal:
        conn.execute("PRAGMA journal_mode=WAL")
    conn.close()


@pytest.mark.parametrize("kind", ["empty", "no_tables", "no_tables_wal"])
def test_an_existing_file_that_holds_no_ledger_is_never_taken_over(
    tmp_path: Path, kind: str
) -> None:
    """Only a path where nothing exists is created: an existing empty file, or an SQLite file
    with no tables (its application_id set), stays exactly as it was: bytes and mode."""
    directory = tmp_path / "d"
    directory.mkdir(mode=0o700)
    db = directory / "tasks.sqlite"
    if kind == "empty":
        db.write_bytes(b"")
    else:
        _no_tables(db, wal=kind == "no_tables_wal")
    os.chmod(db, 0o644)
    before, entries = _state(db), _entries(directory)
    for args in (["init"], ["create"], ["reconcile"]):
        assert_cli_error(
            run_cli("--explain", "--db", str(db), *args), "StateConflict", reason="not_a_ledger"
        )
    with pytest.raises(StorageError) as info:
        Ledger(str(db))
    assert info.value.reason == "not_a_ledger"
    assert _state(db) == before and _entries(directory) == entries
    assert stat.S_IMODE(before[0]) == 0o644


def _open_and_count(path: str) -> int:
    with Ledger(path) as led:
        led.create_task()
        return led.doctor()["task_count"]


def test_processes_creating_one_new_ledger_at_once_share_it(tmp_path: Path) -> None:
    """A new ledger appears whole (published by a link): processes that create the same
    path at once all open one ledger, none finds a half-made file and refuses it."""
    path = str(tmp_path / "race" / "tasks.sqlite")
    with multiprocessing.get_context("spawn").Pool(8) as pool:
        counts = pool.map(_open_and_count, [path] * 8)
    assert all(1 <= count <= 8 for count in counts)
    with Ledger(path, read_only=True) as ro:
        report = ro.doctor()
        assert report["healthy"] and report["task_count"] == 8
    assert _entries(tmp_path / "race") == ["tasks.sqlite", "tasks.sqlite-owners"] or _entries(
        tmp_path / "race"
    ) == ["tasks.sqlite"]


# ----------------------------------------------------------------------------- hidden objects

_FLIP = """CREATE TRIGGER "{name}" AFTER UPDATE OF status ON tsg_tasks
WHEN NEW.status = 'timed_out' BEGIN
  UPDATE tsg_tasks SET status = 'succeeded' WHERE id = NEW.id;
END"""


@pytest.mark.parametrize("name", ["SQLITEXtrigger", "sqlite-flip", "Sqlite0"])
def test_a_trigger_named_like_sqlites_own_is_an_unknown_object(tmp_path: Path, name: str) -> None:
    """``NOT LIKE 'sqlite_%'`` skipped any name starting ``sqlite`` and one more character,
    in any case: a trigger that turns ``timed_out`` into ``succeeded`` passed doctor and
    init."""
    db = _victim(tmp_path)
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute(_FLIP.format(name=name))
    conn.close()
    before = _state(db)
    for args in (["init"], ["reconcile"], ["status"]):
        assert_cli_error(
            run_cli("--explain", "--db", str(db), *args), "StateConflict", reason="foreign_schema"
        )
    result = run_cli("--db", str(db), "doctor")
    report = assert_json_line(result)
    assert result.code == 1 and report["healthy"] is False and report["schema_ok"] is False
    assert report["unexpected_schema_object_count"] == 1
    assert report["task_count"] == 1  # the rows of the layout it has are still checked
    text = run_cli("--db", str(db), "doctor", "--format", "text").stdout
    assert re.search(r"\n +unexpected schema objects +1\n", text)
    assert _state(db) == before


def test_sqlites_own_objects_still_pass(tmp_path: Path) -> None:
    """ANALYZE's statistics tables and the automatic indexes are SQLite's, not the file's."""
    db = _victim(tmp_path)
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("ANALYZE")
    names = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
    conn.close()
    assert "sqlite_stat1" in names
    assert_json_line(run_cli("--db", str(db), "init"))
    report = assert_json_line(run_cli("--db", str(db), "doctor"))
    assert report["healthy"] is True and report["unexpected_schema_object_count"] == 0


# ----------------------------------------------------------------------------- textfile mode


@needs_root
def test_a_replaced_textfile_never_keeps_another_users_mode(tmp_path: Path) -> None:
    db = _victim(tmp_path)
    out = tmp_path / "collector"
    out.mkdir()
    target = out / "tsg.prom"
    assert_json_line(run_cli("--db", str(db), "metrics", "--textfile", str(target)))
    os.chown(target, OTHER_UID, OTHER_UID)
    os.chmod(target, 0o4777)  # another user's file: setuid, world-writable
    assert_json_line(run_cli("--db", str(db), "metrics", "--textfile", str(target)))
    st = os.lstat(target)
    assert stat.S_IMODE(st.st_mode) == 0o644 and st.st_uid == os.geteuid()
