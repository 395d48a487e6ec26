"""A damaged ledger is reported as damaged (never as an empty healthy one) and ``init`` refuses
it without changing it; a ledger written by a later release is ``schema_newer``, not
``foreign_schema`` (whose fix, "fix the path", would send the operator the wrong way)."""

from __future__ import annotations

import hashlib
import os
import sqlite3
import uuid
from pathlib import Path

import pytest
from core_helpers import Clock, assert_cli_error, assert_json_line, run_cli
from task_state_guard import Ledger, StorageError

pytestmark = [pytest.mark.skipif(os.name != "posix", reason="POSIX files"),
              pytest.mark.sqlite_only(reason="damaged and newer SQLite files")]


def _fingerprint(path: Path) -> tuple[int, str]:
    return os.stat(path).st_mode, hashlib.sha256(path.read_bytes()).hexdigest()


def _damaged_ledger(tmp_path: Path, tasks: int = 3000) -> Path:
    """A closed ledger of ``tasks`` tasks with 4 KiB overwritten in the middle of the file (a
    page of the tasks' rows: fixed ids and clock give the same file every run)."""
    db = tmp_path / "d" / "tasks.sqlite"
    with Ledger(str(db), clock=Clock()) as led, led.atomic():
        for number in range(tasks):
            task = led.create_task(task_id=uuid.uuid5(uuid.NAMESPACE_OID, str(number)),
                                   timeout_seconds=60)
            led.start_task(task.id, owner=False)
    size = db.stat().st_size
    with open(db, "r+b") as handle:
        handle.seek((size // 2) // 4096 * 4096)
        handle.write(b"\xa5" * 4096)
    return db


def test_doctor_reports_a_damaged_file_as_damaged(tmp_path: Path) -> None:
    db = _damaged_ledger(tmp_path)
    result = run_cli("--explain", "--db", str(db), "doctor")
    report = assert_json_line(result)
    assert result.code == 1 and report["ok"] is False and report["healthy"] is False
    assert report["quick_check"] == "failed" and report["integrity_error_count"] > 0
    assert report["schema_ok"] is False  # a damaged file's schema is not vouched for
    # a count is what was read, or None when the damage kept it from being read: never a
    # made-up zero
    assert report["task_count"] in (None, 3000)
    assert report["event_count"] in (None, 6000)
    # a check the damage kept from running says so, with its reason: never a 0 that reads as
    # "nothing found"
    skipped = report["checks_not_run"]
    assert skipped and set(skipped.values()) == {"unreadable"}
    assert "foreign_key_violation_count" in skipped and "invalid_state_count" in skipped
    flat = {**report, **report["warnings"]}
    assert all(flat[key] is None for key in skipped)
    assert all(key in skipped for key, value in flat.items() if value is None)
    text = run_cli("--db", str(db), "doctor", "--format", "text")
    assert text.code == 1 and text.stdout.startswith("DOCTOR: UNHEALTHY\n") and text.stderr == ""
    assert "foreign key violations     not run (unreadable)" in text.stdout


@pytest.mark.parametrize("args", [["init"], ["create"], ["reconcile"],
                                  ["prune", "--older-than", "0"]], ids=lambda a: a[0])
def test_a_writing_command_refuses_a_damaged_file_and_changes_nothing(
        tmp_path: Path, args: list[str]) -> None:
    """init, and the operator's and bulk writes (create, reconcile, prune), run SQLite's
    quick_check before writing anything: ``create`` and ``prune`` once wrote into such a file."""
    db = _damaged_ledger(tmp_path)
    os.chmod(db, 0o640)
    before, entries = _fingerprint(db), sorted(os.listdir(db.parent))
    assert_cli_error(run_cli("--explain", "--db", str(db), *args), "StateConflict",
                     reason="database_damaged")
    assert_cli_error(run_cli("--db", str(db), *args), "StateConflict")
    assert _fingerprint(db) == before and sorted(os.listdir(db.parent)) == entries


def _newer_ledger(tmp_path: Path) -> Path:
    """A ledger as a later release might leave it: a layout this release does not know, and
    metadata that says it is this application's, at a higher schema version."""
    db = tmp_path / "n" / "tasks.sqlite"
    with Ledger(str(db), clock=Clock()) as led:
        led.create_task()
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("BEGIN")
    conn.execute("ALTER TABLE tsg_tasks ADD COLUMN future_field TEXT")
    conn.execute("UPDATE tsg_meta SET value = '10' WHERE key = 'schema_version'")
    conn.execute("COMMIT")
    conn.close()
    return db


@pytest.mark.parametrize("args", [["init"], ["create"], ["reconcile"], ["reconcile", "--dry-run"],
                                  ["status"], ["doctor"]], ids=lambda a: "-".join(a))
def test_a_ledger_of_a_later_release_is_schema_newer(tmp_path: Path, args: list[str]) -> None:
    db = _newer_ledger(tmp_path)
    before = _fingerprint(db)
    assert_cli_error(run_cli("--explain", "--db", str(db), *args), "StateConflict",
                     reason="schema_newer")
    assert _fingerprint(db) == before


def test_the_api_names_a_later_release_too(tmp_path: Path) -> None:
    db = _newer_ledger(tmp_path)
    for read_only in (False, True):
        with pytest.raises(StorageError) as info:
            Ledger(str(db), read_only=read_only)
        assert info.value.reason == "schema_newer"
    # a known layout whose metadata claims another version is tampered, not newer
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("ALTER TABLE tsg_tasks DROP COLUMN future_field")
    conn.close()
    with pytest.raises(StorageError) as info:
        Ledger(str(db))
    assert info.value.reason == "foreign_schema"
