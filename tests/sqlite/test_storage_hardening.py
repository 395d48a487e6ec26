"""What a hostile local user and a careless operator found in the storage rules, each a
regression test: symbolic links in the path are judged where they lead, a file that is not a
ledger is never chmodded, the owner lock directory is never followed through a link, and a
task command never creates a mistyped SQLite path (on either backend:
``tests/core/test_creating_commands.py``)."""

from __future__ import annotations

import os
import sqlite3
import stat
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from core_helpers import (
    NEVER_CREATE,
    Clock,
    assert_cli_error,
    assert_json_line,
    run_cli,
)
from task_state_guard import Ledger, StorageError, UnsafeLocation

pytestmark = pytest.mark.skipif(os.name != "posix", reason="POSIX storage contract")
TID = "6f1c1d4e-4a5b-4c6d-8e9f-0a1b2c3d4e5f"


def mode(path: Path | str) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def _refused(path: Path, reason: str) -> None:
    with pytest.raises(UnsafeLocation) as info:
        Ledger(str(path))
    assert info.value.reason == reason
    assert_cli_error(run_cli("--explain", "--db", str(path), "init"), "InvalidInput",
                     reason=reason)


# ----------------------------------------------------------------------------- symlinked paths


@pytest.mark.sqlite_only(reason="the SQLite file's path, links and modes")
def test_a_symlinked_directory_is_judged_where_it_leads(tmp_path: Path) -> None:
    """``--db w/lnk/t.sqlite`` with ``w/lnk -> ww/d`` and ``ww`` world-writable is refused like
    ``--db ww/d/t.sqlite``: whoever controls ``ww`` could swap ``d``."""
    ww = tmp_path / "ww"
    ww.mkdir()
    os.chmod(ww, 0o777)
    d = ww / "d"
    d.mkdir(mode=0o700)
    w = tmp_path / "w"
    w.mkdir(mode=0o700)
    (w / "lnk").symlink_to(d)
    (w / "rel").symlink_to("../ww/d")  # relative, with a parent step
    (w / "chain").symlink_to(w / "rel")  # a link to a link
    for path in (d, w / "lnk", w / "rel", w / "chain", w / "lnk" / "sub"):
        _refused(path / "t.sqlite", "ancestor_writable_by_others")
    assert os.listdir(d) == []


@pytest.mark.sqlite_only(reason="the SQLite file's path, links and modes")
def test_the_directory_holding_a_link_is_judged_too(tmp_path: Path) -> None:
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    os.chmod(open_dir, 0o777)
    (open_dir / "lnk").symlink_to(private)  # anyone can re-point this link
    _refused(open_dir / "lnk" / "t.sqlite", "ancestor_writable_by_others")
    assert os.listdir(private) == []


@pytest.mark.sqlite_only(reason="the SQLite file's path, links and modes")
def test_a_safe_symlinked_directory_opens_at_its_real_path(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    w = tmp_path / "w"
    w.mkdir(mode=0o700)
    (w / "lnk").symlink_to(real)
    with Ledger(str(w / "lnk" / "t.sqlite"), clock=Clock()) as led:
        task = led.create_task()
        assert led.path == str(real / "t.sqlite")
    assert sorted(os.listdir(real)) == ["t.sqlite"] and mode(real / "t.sqlite") == 0o600
    with Ledger(str(real / "t.sqlite"), read_only=True) as ro:
        assert ro.get_task(task.id).status == "queued"


@pytest.mark.sqlite_only(reason="the SQLite file's path, links and modes")
def test_a_path_that_later_leads_elsewhere_is_refused(tmp_path: Path) -> None:
    """Re-pointing a directory link under an open ledger: its next connection (another
    thread) finds the path leading to another file and refuses it."""
    first, second = tmp_path / "first", tmp_path / "second"
    for directory in (first, second):
        directory.mkdir(mode=0o700)
        Ledger(str(directory / "t.sqlite")).close()
    w = tmp_path / "w"
    w.mkdir(mode=0o700)
    (w / "lnk").symlink_to(first)
    with Ledger(str(w / "lnk" / "t.sqlite"), clock=Clock()) as led:
        led.create_task()
        os.unlink(w / "lnk")
        (w / "lnk").symlink_to(second)
        caught: list[BaseException] = []

        def other_thread() -> None:
            try:
                led.create_task()
            except BaseException as exc:
                caught.append(exc)

        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join()
        assert len(caught) == 1 and isinstance(caught[0], StorageError)
        assert caught[0].reason == "database_replaced"
    with Ledger(str(second / "t.sqlite"), read_only=True) as untouched:
        assert untouched.doctor()["task_count"] == 0


# ----------------------------------------------------------------------------- not a ledger


def _modes(directory: Path) -> dict[str, tuple[int, int, int]]:
    """Each entry's type and mode, and inode (by lstat only: opening a file of a database in
    use would drop its holder's locks, which POSIX ties to the process, not the descriptor)."""
    out = {}
    for name in os.listdir(directory):
        st = os.lstat(directory / name)
        out[name] = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_ino)
    return out


@pytest.mark.sqlite_only(reason="the SQLite file's path, links and modes")
def test_a_file_that_is_not_a_ledger_keeps_its_mode(tmp_path: Path) -> None:
    m = tmp_path / "m"
    m.mkdir(mode=0o700)
    conf = m / "conf.txt"
    conf.write_text("key = value\n" * 50)
    os.chmod(conf, 0o644)
    # a foreign SQLite application's database, in use (its -wal and -shm exist)
    app = m / "app.db"
    holder = sqlite3.connect(app, isolation_level=None)
    holder.execute("PRAGMA journal_mode=WAL")
    holder.execute("CREATE TABLE notes(body TEXT)")
    holder.execute("INSERT INTO notes VALUES ('keep')")
    try:
        for name in ("app.db", "app.db-wal", "app.db-shm"):
            os.chmod(m / name, 0o644)
        before = _modes(m)
        for path, reason in ((conf, "not_a_ledger"), (app, "foreign_schema")):
            for command in ("init", "create", "reconcile"):
                assert_cli_error(run_cli("--explain", "--db", str(path), command),
                                 "StateConflict", reason=reason)
            with pytest.raises(StorageError) as info:
                Ledger(str(path))
            assert info.value.reason == reason
        assert _modes(m) == before
        assert mode(conf) == mode(app) == mode(m / "app.db-wal") == 0o644
        assert conf.read_text() == "key = value\n" * 50
    finally:
        holder.close()


@pytest.mark.sqlite_only(reason="the SQLite file's path, links and modes")
def test_a_ledger_is_tightened_once_recognised(tmp_path: Path) -> None:
    db = tmp_path / "d" / "t.sqlite"
    Ledger(str(db)).close()
    os.chmod(db, 0o644)
    assert_json_line(run_cli("--db", str(db), "init"))
    assert mode(db) == 0o600


# ----------------------------------------------------------------------------- owner directory


_START_AND_EXIT = """
import sys
from task_state_guard import Ledger
with Ledger(sys.argv[1]) as led:
    task = led.create_task()
    led.start_task(task.id)
    print(task.id)
"""


@pytest.mark.sqlite_only(reason="the SQLite file's path, links and modes")
def test_reconcile_never_follows_a_symlinked_owner_directory(tmp_path: Path) -> None:
    """A dead owner's lock file behind a symlinked ``<db>-owners``: reconcile neither takes it
    as proof (the task waits for its grace) nor deletes anything there."""
    db = str(tmp_path / "l" / "tasks.sqlite")
    done = subprocess.run([sys.executable, "-c", _START_AND_EXIT, db], capture_output=True,
                          text=True, check=True, timeout=60)
    tid = done.stdout.strip()
    elsewhere = tmp_path / "elsewhere"
    os.rename(db + "-owners", elsewhere)
    stale_tmp = elsewhere / (uuid.uuid4().hex + ".tmp")
    stale_tmp.write_bytes(b"")
    os.utime(stale_tmp, (time.time() - 3600, time.time() - 3600))
    os.symlink(elsewhere, db + "-owners")
    before = sorted(os.listdir(elsewhere))
    assert len(before) == 2
    report = assert_json_line(run_cli("--db", db, "reconcile"))["reconcile"]
    assert report["tasks_timed_out"] == 0 and report["fresh_active_retained"] == 1
    assert sorted(os.listdir(elsewhere)) == before
    status = assert_json_line(run_cli("--db", db, "status"))["status"]
    assert status["running_owner_dead"] == 0
    with Ledger(db, read_only=True) as led:
        assert led.get_task(tid).status == "running"
    # the real directory back in place: the dead owner is proven and its lock file removed
    os.unlink(db + "-owners")
    os.rename(elsewhere, db + "-owners")
    report = assert_json_line(run_cli("--db", db, "reconcile"))["reconcile"]
    assert report["tasks_timed_out"] == 1
    assert os.listdir(db + "-owners") == []


# ----------------------------------------------------------------------------- creating


@pytest.mark.sqlite_only(reason="the SQLite file's path, links and modes")
@pytest.mark.parametrize("args", NEVER_CREATE, ids=lambda a: a[0])
def test_a_mistyped_db_is_never_created_by_a_task_command(tmp_path: Path, args: list[str]) -> None:
    typo_dir = tmp_path / "typo" / "tasks.sqlite"
    assert_cli_error(run_cli("--explain", "--db", str(typo_dir), *args), "InvalidInput",
                     reason="directory_missing")
    assert not typo_dir.parent.exists()
    present = tmp_path / "present"
    present.mkdir(mode=0o700)
    assert_cli_error(run_cli("--explain", "--db", str(present / "tasks.sqlite"), *args),
                     "InvalidInput", reason="database_missing")
    assert os.listdir(present) == []
