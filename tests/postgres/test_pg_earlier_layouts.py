"""PostgreSQL ledgers written by earlier builds migrate to the current layout whole.

Each ``pg-v<N>-<commit>.sql.gz`` in ``tests/fixtures/layouts/`` is a ``pg_dump`` of the
schema the PostgreSQL package of that commit wrote (``scripts/layout_fixtures.py
--postgresql``: a queued task, a running one with a failed child, a closed and delivered one),
so the functions, triggers and rows are what that build left, not what this release's
migration list says it created. Restored into a fresh schema, each is opened by this release,
which migrates it; every task reads back as stored, doctor is healthy, and new work is
recorded. (The other tests of this directory build earlier layouts from today's migration
list, which would not notice an edited earlier step.)
"""

from __future__ import annotations

import gzip
import uuid
from pathlib import Path

import psycopg
import pytest
from pg_helpers import schema_of, sql
from task_state_guard import Ledger, StorageError
from task_state_guard_postgres import SCHEMA_VERSION
from task_state_guard_postgres.ddl import MIGRATIONS

LAYOUTS = Path(__file__).resolve().parents[1] / "fixtures" / "layouts"
DUMPS = sorted(LAYOUTS.glob("pg-v*.sql.gz"))
DUMPED_SCHEMA = "tsg_layout_fixture"  # the schema name inside every dump


def test_every_earlier_layout_has_a_dump() -> None:
    versions = {int(p.name.split("-")[1][1:]) for p in DUMPS}
    assert versions == set(range(min(MIGRATIONS), SCHEMA_VERSION))


def restore(dump: Path, url: str) -> None:
    """The dumped schema, renamed to the URL's, in one transaction."""
    text = gzip.decompress(dump.read_bytes()).decode()
    assert text.count(DUMPED_SCHEMA) > 10
    with psycopg.connect(url.split("?", 1)[0]) as conn:  # commits on leaving
        conn.execute(text.replace(DUMPED_SCHEMA, schema_of(url)))  # type: ignore[arg-type]


@pytest.mark.parametrize("dump", DUMPS, ids=lambda p: p.name.split(".")[0])
def test_a_schema_an_earlier_build_wrote_migrates_whole(dump: Path, pg_url: str) -> None:
    restore(dump, pg_url)
    version = int(dump.name.split("-")[1][1:])
    assert sql(pg_url, "SELECT max(version) FROM tsg_migrations") == [(version,)]
    before = dict(
        (row[0], row[1:])
        for row in sql(pg_url, "SELECT id, status, delivery_status, parent_id FROM tsg_tasks")
    )
    assert sorted(state[:2] for state in before.values()) == [
        ("failed", "pending"),
        ("queued", "pending"),
        ("running", "pending"),
        ("succeeded", "delivered"),
    ]
    with Ledger(pg_url, read_only=True) as ro:  # an earlier layout recorded no thread
        assert ro.find_task_ids(None, thread_id="t-1") == []
    with Ledger(pg_url) as ledger:
        assert ledger.schema_version == SCHEMA_VERSION
        assert ledger.doctor()["healthy"] is True
        # The parent link is checked by the trigger from layout 10 on, not by a foreign key.
        assert sql(pg_url, "SELECT count(*) FROM pg_constraint WHERE contype = 'f' "
                           "AND conrelid = 'tsg_tasks'::regclass") == [(0,)]
        # The thread column came along empty; a new run's thread is stored and found.
        assert sql(pg_url, "SELECT count(*) FROM tsg_tasks WHERE thread_id IS NOT NULL") == [(0,)]
        run = str(uuid.uuid4())
        ledger.begin_attempt(run, name="graph", delivery_required=True, framework="langgraph",
                             logical_owner=True, attempt=False, thread_id="t-1")
        assert ledger.find_task_ids(None, thread_id="t-1") == [run]
        for task_id, (status, delivery, parent) in before.items():
            task = ledger.get_task(task_id)
            assert (task.status.value, task.delivery_status.value, task.parent_id) == (
                status, delivery, parent
            )
            assert ledger.events_of(task_id)
        task = ledger.create_task(delivery_required=True)
        ledger.start_task(task.id)
        ledger.close_task(task.id, "succeeded")
        ledger.set_delivery(task.id, "delivered")
        assert ledger.doctor()["healthy"] is True
        assert ledger.status()["tasks"]["succeeded"] == 2
    assert sql(pg_url, "SELECT max(version) FROM tsg_migrations") == [(SCHEMA_VERSION,)]


@pytest.mark.parametrize("edit", [
    "DROP TRIGGER tsg_event_created ON tsg_tasks",
    "ALTER TABLE tsg_tasks DISABLE TRIGGER tsg_event_changed",
], ids=["trigger_dropped", "trigger_disabled"])
def test_an_earlier_schema_whose_row_trigger_was_edited_is_refused_unmigrated(
    edit: str, pg_url: str
) -> None:
    """A row trigger dropped or disabled by hand (its changes since then lack their events) is
    judged before the migration recreates the insert trigger gated (which would hide the
    edit): refused as tampered, left at its version."""
    dump = DUMPS[-1]
    restore(dump, pg_url)
    sql(pg_url, edit)
    version = int(dump.name.split("-")[1][1:])
    with pytest.raises(StorageError) as err:
        Ledger(pg_url)
    assert err.value.reason == "foreign_schema"
    assert sql(pg_url, "SELECT max(version) FROM tsg_migrations") == [(version,)]


# How the earlier release's statements change a state: plain statements, whose events, totals
# and verdicts the row trigger writes (its sessions never set the trigger's gate).
_EARLIER_CREATE = (
    "INSERT INTO tsg_tasks(id, status, delivery_required, delivery_status, created_at, "
    "delivery_updated_at, updated_at, framework) "
    "VALUES (%(id)s, 'queued', 1, 'pending', 1.0, 1.0, 1.0, 'celery')")
_EARLIER_START = ("UPDATE tsg_tasks SET status = 'running', started_at = 2.0, updated_at = 2.0, "
                  "version = version + 1 WHERE id = %(id)s AND status = 'queued'")
_EARLIER_LOSE = (
    "UPDATE tsg_tasks SET status = 'timed_out', terminal_code = 'owner_lost', ended_at = 3.0, "
    "updated_at = 3.0, version = version + 1 WHERE id = %(id)s AND status = 'running'")


def _owner_lost_total(ledger: Ledger) -> int:
    total = ledger.status()["outcomes_total"]["task"].get("timed_out", {}).get("owner_lost", 0)
    return int(total)


def test_an_earlier_release_keeps_writing_during_a_rolling_upgrade(pg_url: str) -> None:
    """A fleet upgrades worker by worker: a process of the earlier release opened the ledger at
    its layout, and keeps writing with its own statements after this release migrated the
    schema. The row trigger stays, gated per session: it still writes that process's events,
    totals and verdicts, and steps aside for this release's statements, which write their own
    (exactly one event each)."""
    restore(DUMPS[-1], pg_url)
    earlier = psycopg.connect(pg_url.split("?", 1)[0], autocommit=True)
    try:
        earlier.execute(f'SET search_path TO "{schema_of(pg_url)}"')
        before, during = str(uuid.uuid4()), str(uuid.uuid4())
        earlier.execute(_EARLIER_CREATE, {"id": before})
        earlier.execute(_EARLIER_START, {"id": before})
        with Ledger(pg_url) as ledger:  # this release's first open migrates
            assert ledger.schema_version == SCHEMA_VERSION
            lost = _owner_lost_total(ledger)
            # the earlier process goes on: a task across the migration, and one after it
            earlier.execute(_EARLIER_LOSE, {"id": before})
            for statement in (_EARLIER_CREATE, _EARLIER_START, _EARLIER_LOSE):
                earlier.execute(statement, {"id": during})
            for task_id in (before, during):
                assert [(e.kind, e.state, e.code) for e in ledger.events_of(task_id)] == [
                    ("created", "queued", "created"), ("started", "running", "started"),
                    ("closed", "timed_out", "owner_lost")]
            assert _owner_lost_total(ledger) == lost + 2
            owed = sql(pg_url, "SELECT count(*) FROM tsg_verdicts v JOIN tsg_tasks t "
                               "ON t.seq = v.task_seq WHERE t.id = ANY(%s)", ([before, during],))
            assert owed == [(2,)]
            # this release's writes beside it: one event per change, one total per close
            task = ledger.create_task()
            ledger.start_task(task.id)
            ledger.close_task(task.id, "timed_out", code="owner_lost")
            assert [(e.kind, e.state) for e in ledger.events_of(task.id)] == [
                ("created", "queued"), ("started", "running"), ("closed", "timed_out")]
            assert _owner_lost_total(ledger) == lost + 3
            assert ledger.doctor()["healthy"] is True
    finally:
        earlier.close()
