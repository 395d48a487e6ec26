"""Ledgers written by earlier builds open, migrate and stay whole.

Each file in ``tests/fixtures/layouts/`` was written by the core of an earlier commit of this
repository (``scripts/layout_fixtures.py``: a queued task, a running one with a failed child, a
closed and delivered one), so it keeps the exact text of the statements that build used: a
migration that matches the text it rewrites is tested against what real files hold, not
against the layout as this release renders it. (Builds before the layouts were rendered from
``rules`` broke the checks' lines after ``IN``; the v7 to v8 step once missed those and refused
such files.) The current layout's file is here too: a build that renders it differently from
the build that first wrote it must still recognise that file as it is. 0.1.0's own file has its
own test (``test_upgrade_010.py``).
"""

from __future__ import annotations

import gzip
import hashlib
import os
import sqlite3
import uuid
from pathlib import Path

import pytest
from core_helpers import assert_json_line, run_cli
from task_state_guard import Ledger, StorageError

pytestmark = pytest.mark.sqlite_only(reason="SQLite files earlier builds wrote")

LAYOUTS = Path(__file__).parents[1] / "fixtures" / "layouts"
MIGRATED = sorted(p for p in LAYOUTS.glob("v*.sqlite.gz") if "snapshot" not in p.name)
SNAPSHOTS = sorted(LAYOUTS.glob("*snapshot*.sqlite.gz"))


def unpack(fixture: Path, tmp_path: Path) -> str:
    directory = tmp_path / "ledger"
    directory.mkdir(mode=0o700)
    db = directory / "tasks.sqlite"
    db.write_bytes(gzip.decompress(fixture.read_bytes()))
    os.chmod(db, 0o600)
    return str(db)


def test_every_layout_an_earlier_build_wrote_is_here() -> None:
    names = {p.name.split("-")[0] for p in MIGRATED}
    assert names == {"v2", "v3", "v4", "v5", "v6", "v7", "v8"}
    assert SNAPSHOTS


def stored_tasks(db: str) -> dict[str, tuple[str, str, str | None]]:
    """Each task's state, delivery state and parent as the earlier build stored them (these
    columns have kept their names in every layout)."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        rows = conn.execute("SELECT id, status, delivery_status, parent_id FROM tsg_tasks")
        return {row[0]: (row[1], row[2], row[3]) for row in rows}
    finally:
        conn.close()


@pytest.mark.parametrize("fixture", MIGRATED, ids=lambda p: p.name.split(".")[0])
def test_a_file_an_earlier_build_wrote_migrates_whole(fixture: Path, tmp_path: Path) -> None:
    db = unpack(fixture, tmp_path)
    before = stored_tasks(db)
    assert sorted(state[:2] for state in before.values()) == [
        ("failed", "pending"),  # the child owes its delivery (created with the default)
        ("queued", "pending"),
        ("running", "pending"),
        ("succeeded", "delivered"),
    ]
    # The read commands read it in place, as it is.
    digest = hashlib.sha256(Path(db).read_bytes()).hexdigest()
    assert assert_json_line(run_cli("--db", db, "doctor"))["healthy"] is True
    assert hashlib.sha256(Path(db).read_bytes()).hexdigest() == digest
    with Ledger(db, read_only=True) as ro:  # an earlier layout recorded no thread
        assert ro.find_task_ids(None, thread_id="t-1") == []
        assert ro.list_tasks(thread_id="t-1").tasks == []
    ledger = Ledger(db)
    try:
        assert ledger.schema_version == Ledger.SCHEMA_VERSION
        assert ledger.doctor()["healthy"] is True
        # The thread column came along empty: no thread for any task stored before.
        assert all(ledger.find_task_ids(None, thread_id=t) == [] for t in ("t-1", "None"))
        run = str(uuid.uuid4())
        ledger.begin_attempt(run, name="graph", delivery_required=True, framework="langgraph",
                             logical_owner=True, attempt=False, thread_id="t-1")
        assert ledger.find_task_ids(None, thread_id="t-1") == [run]
        for task_id, (status, delivery, parent) in before.items():
            task = ledger.get_task(task_id)
            assert (task.status.value, task.delivery_status.value) == (status, delivery)
            assert task.parent_id == parent
            assert ledger.events_of(task_id)  # each chain came along
        # The migrated file takes new work as any other.
        task = ledger.create_task(delivery_required=True)
        ledger.start_task(task.id)
        ledger.close_task(task.id, "succeeded")
        ledger.set_delivery(task.id, "delivered")
        assert ledger.doctor()["healthy"] is True
    finally:
        ledger.close()
    after = stored_tasks(db)  # the migration was committed with the new tasks
    assert len(after) == 6 and {k: after[k] for k in before} == before
    # The file stores, character for character, what a file this release creates stores.
    assert stored_schema(db) == stored_schema(fresh_ledger(tmp_path))


def stored_schema(db: str) -> dict[tuple[str, str], str]:
    """Each object's (type, name) and the text the file stores for it."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        rows = conn.execute("SELECT type, name, sql FROM sqlite_master WHERE sql IS NOT NULL")
        return {(kind, name): sql for kind, name, sql in rows}
    finally:
        conn.close()


def fresh_ledger(tmp_path: Path) -> str:
    directory = tmp_path / "fresh"
    directory.mkdir(mode=0o700)
    db = str(directory / "tasks.sqlite")
    Ledger(db).close()
    return db


@pytest.mark.parametrize("fixture", SNAPSHOTS, ids=lambda p: p.name.split(".")[0])
def test_a_development_snapshot_is_refused_unchanged(fixture: Path, tmp_path: Path) -> None:
    db = unpack(fixture, tmp_path)
    before = hashlib.sha256(Path(db).read_bytes()).hexdigest()
    with pytest.raises(StorageError) as caught:
        Ledger(db)
    assert caught.value.reason == "foreign_schema"
    assert hashlib.sha256(Path(db).read_bytes()).hexdigest() == before


def test_layout_8_changes_only_the_form_of_the_checks_and_conditions() -> None:
    """The v7 to v8 step replaces stored definitions in place: what it replaces are the three
    tables and three triggers that tested a list, and each table keeps its columns (name, type,
    NOT NULL, default, key) in the same order, so every stored row keeps its meaning."""
    from task_state_guard.sqlite import schema

    changed = schema._changed_by(schema.V8, schema.V7)
    assert sorted(changed) == [
        ("table", "tsg_events"), ("table", "tsg_tasks"), ("table", "tsg_totals"),
        ("trigger", "tsg_event_closed"), ("trigger", "tsg_total_closed"),
        ("trigger", "tsg_verdict_owed"),
    ]
    built = {fmt: schema._built(fmt) for fmt in (schema.V7, schema.V8)}
    try:
        for kind, name in changed:
            if kind == "table":
                v7, v8 = (built[fmt].execute(f"PRAGMA table_xinfo({name})").fetchall()
                          for fmt in (schema.V7, schema.V8))
                assert v7 == v8 and v7
    finally:
        for conn in built.values():
            conn.close()
