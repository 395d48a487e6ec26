"""Schema versioning: created once, guarded and transactional migrations, newer refused."""

from __future__ import annotations

import time

import psycopg
import pytest
from pg_helpers import Workers, schema_of, sql
from task_state_guard import InvalidInput, Ledger, ReconcilePolicy, StorageError, TaskNotFound
from task_state_guard.cli.commands import main as tsg
from task_state_guard_postgres import SCHEMA_VERSION, drop_schema, drop_stale_schemas
from task_state_guard_postgres.ddl import MIGRATIONS

#: Every migration, as tsg_migrations lists them once a ledger is current.
EVERY_MIGRATION = [(n,) for n in sorted(MIGRATIONS)]


def test_first_open_creates_the_current_schema_once(pg_url: str) -> None:
    with Ledger(pg_url) as ledger:
        assert ledger.schema_version == SCHEMA_VERSION == 10
        ledger.create_task()
    with Ledger(pg_url) as again:  # a second open migrates nothing
        assert again.schema_version == SCHEMA_VERSION
        assert again.status()["tasks"]["queued"] == 1
    assert sql(pg_url, "SELECT version FROM tsg_migrations ORDER BY 1") == EVERY_MIGRATION


def test_hosts_opening_together_migrate_once(pg_url: str, workers: Workers) -> None:
    start = time.time() + 2.0
    procs = [workers.start("open", pg_url, start) for _ in range(4)]
    assert [workers.finish(p)["schema_version"] for p in procs] == [SCHEMA_VERSION] * 4
    assert sql(pg_url, "SELECT version FROM tsg_migrations ORDER BY 1") == EVERY_MIGRATION
    with Ledger(pg_url) as ledger:
        assert ledger.doctor()["healthy"] is True


def test_a_newer_schema_is_refused(pg_url: str) -> None:
    with Ledger(pg_url) as ledger:
        ledger.create_task()
    sql(pg_url, "INSERT INTO tsg_migrations(version, applied_at) VALUES (%s, 0)",
        (SCHEMA_VERSION + 1,))
    for read_only in (False, True):
        with pytest.raises(StorageError) as err:
            Ledger(pg_url, read_only=read_only)
        assert str(err.value) == "the ledger's schema is newer than this release"
    assert sql(pg_url, "SELECT count(*) FROM tsg_tasks") == [(1,)]  # nothing changed


def test_a_failed_migration_leaves_nothing(pg_url: str) -> None:
    schema = schema_of(pg_url)
    sql(pg_url, f'CREATE SCHEMA "{schema}"')
    # An object in the way of the migration's last statements: the whole migration fails.
    sql(pg_url, f'CREATE FUNCTION "{schema}".tsg_write_event() RETURNS trigger '
                "LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$")
    with pytest.raises(StorageError):
        Ledger(pg_url)
    tables = sql(pg_url, "SELECT tablename FROM pg_tables WHERE schemaname = %s", (schema,))
    assert tables == []  # no table, no migrations row: all of it or nothing
    sql(pg_url, f'DROP FUNCTION "{schema}".tsg_write_event()')
    with Ledger(pg_url) as ledger:  # and the next open migrates cleanly
        assert ledger.schema_version == SCHEMA_VERSION


def test_a_foreign_schema_is_refused_and_doctor_says_so(
    pg_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    schema = schema_of(pg_url)
    sql(pg_url, f'CREATE SCHEMA "{schema}"')
    sql(pg_url, f'CREATE TABLE "{schema}".tsg_tasks (id text)')
    with pytest.raises(StorageError) as err:
        Ledger(pg_url)
    assert str(err.value) == "the database holds a foreign or tampered schema"
    assert tsg(["--db", pg_url, "doctor"]) == 1
    out = capsys.readouterr().out
    assert '"schema_ok":false' in out and '"healthy":false' in out


_NOOP = ("CREATE FUNCTION tsg_noop() RETURNS trigger LANGUAGE plpgsql "
         "AS $fn$ BEGIN RETURN NULL; END $fn$")


@pytest.mark.parametrize("tamper", [
    "ALTER TABLE tsg_tasks ADD COLUMN note text",
    "ALTER TABLE tsg_events ALTER COLUMN code TYPE varchar(40)",
    "CREATE INDEX extra ON tsg_tasks(created_at)",
    "DROP INDEX tsg_tasks_open",
    f"{_NOOP}; CREATE TRIGGER extra AFTER INSERT ON tsg_events FOR EACH ROW "
    "EXECUTE FUNCTION tsg_noop()",
    f"{_NOOP}; CREATE TRIGGER extra AFTER UPDATE ON tsg_tasks FOR EACH ROW "
    "EXECUTE FUNCTION tsg_noop(); ALTER TABLE tsg_tasks DISABLE TRIGGER extra",
    "DROP TRIGGER tsg_event_changed ON tsg_tasks",
    "ALTER TABLE tsg_tasks DISABLE TRIGGER tsg_event_created",
    # ungated, it would write a second event beside this release's own statements
    "DROP TRIGGER tsg_event_created ON tsg_tasks; CREATE TRIGGER tsg_event_created "
    "AFTER INSERT ON tsg_tasks FOR EACH ROW EXECUTE FUNCTION tsg_write_event()",
    "CREATE OR REPLACE FUNCTION tsg_write_event() RETURNS trigger LANGUAGE plpgsql "
    "AS $fn$ BEGIN RETURN NULL; END $fn$",
    # without the parent check, a child could be committed under a parent a prune deletes
    "DROP TRIGGER tsg_parent_exists ON tsg_tasks",
    "ALTER TABLE tsg_tasks DISABLE TRIGGER tsg_parent_exists",
    "CREATE OR REPLACE FUNCTION tsg_parent_exists() RETURNS trigger LANGUAGE plpgsql "
    "AS $fn$ BEGIN RETURN NULL; END $fn$",
], ids=["column_added", "column_retyped", "index_added", "index_dropped", "trigger_added",
        "disabled_trigger_added", "trigger_dropped", "trigger_disabled", "trigger_ungated",
        "function_replaced", "parent_check_dropped", "parent_check_disabled",
        "parent_check_replaced"])
def test_a_hand_edited_schema_is_refused_as_sqlite_refuses_an_edited_file(
    pg_url: str, tamper: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Any open refuses a current schema whose layout is not exactly this release's (a row
    trigger that no longer writes an earlier release's events would lose them silently, an
    ungated one would write this release's twice, one added by hand could change rows behind
    the statements' backs); doctor reports it, and nothing is written."""
    with Ledger(pg_url) as ledger:
        ledger.create_task(name="kept")
        assert ledger.doctor()["schema_ok"] is True
    sql(pg_url, tamper)
    rows = sql(pg_url, "SELECT count(*) FROM tsg_tasks")
    events = sql(pg_url, "SELECT count(*) FROM tsg_events")
    for read_only in (False, True):
        with pytest.raises(StorageError) as err:
            Ledger(pg_url, read_only=read_only)
        assert err.value.reason == "foreign_schema"
        assert str(err.value) == "the database holds a foreign or tampered schema"
    capsys.readouterr()
    assert tsg(["--db", pg_url, "create"]) != 0
    assert capsys.readouterr().out == '{"error":"StateConflict","ok":false}\n'
    assert tsg(["--db", pg_url, "doctor"]) == 1
    out = capsys.readouterr().out
    assert '"schema_ok":false' in out and '"healthy":false' in out
    assert sql(pg_url, "SELECT count(*) FROM tsg_tasks") == rows == [(1,)]
    assert sql(pg_url, "SELECT count(*) FROM tsg_events") == events


def test_an_edited_older_schema_is_refused_and_left_unmigrated(pg_url: str) -> None:
    """A schema edited at an earlier version: the migration runs, the check fails, and the
    whole transaction rolls back (the version and the rows stay as they were)."""
    with Ledger(pg_url) as ledger:
        ledger.create_task()
    # Back to version 7 (without the thread column, with the row trigger and the foreign
    # key), then edited.
    schema = schema_of(pg_url)
    sql(pg_url, "DELETE FROM tsg_migrations WHERE version >= 8")
    sql(pg_url, "DROP TRIGGER tsg_parent_exists ON tsg_tasks")
    sql(pg_url, "DROP FUNCTION tsg_parent_exists()")
    sql(pg_url, "ALTER TABLE tsg_tasks ADD FOREIGN KEY (parent_id) REFERENCES tsg_tasks(id)")
    sql(pg_url, "ALTER TABLE tsg_tasks DROP COLUMN thread_id")
    sql(pg_url, "DROP TRIGGER tsg_event_created ON tsg_tasks")  # ungated as version 7 had it
    sql(pg_url, MIGRATIONS[3](schema)[-2])
    sql(pg_url, "CREATE INDEX extra ON tsg_tasks(created_at)")
    with pytest.raises(StorageError) as err:
        Ledger(pg_url)
    assert err.value.reason == "foreign_schema"
    assert sql(pg_url, "SELECT max(version) FROM tsg_migrations") == [(7,)]
    # the migration to 9 rolled back too: the insert trigger is still ungated
    assert sql(pg_url, "SELECT t.tgname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
                       "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s "
                       "AND NOT t.tgisinternal AND pg_get_triggerdef(t.oid) LIKE %s ORDER BY 1",
               (schema, "%WHEN%")) == [("tsg_event_changed",)]
    columns = sql(pg_url, "SELECT column_name FROM information_schema.columns "
                          "WHERE table_schema = %s AND column_name = 'thread_id'",
                  (schema_of(pg_url),))
    assert columns == []  # the migration to 8 rolled back with the check
    assert foreign_keys(pg_url) == 1  # and the one to 10


def foreign_keys(url: str) -> int:
    """The foreign keys on the URL's task table."""
    rows = sql(url, "SELECT count(*) FROM pg_constraint WHERE contype = 'f' "
                    "AND conrelid = 'tsg_tasks'::regclass")
    return int(rows[0][0])


def test_a_new_task_s_parent_is_checked_by_the_trigger_for_every_session(pg_url: str) -> None:
    """Layout 10 has no foreign key: a row naming a parent that does not exist is refused
    with the key's error for any session (an earlier release's, whose statements do not check
    the parent themselves, or a hand-written insert), and nothing is written."""
    with Ledger(pg_url) as ledger:
        parent = ledger.create_task(name="parent")
        ledger.create_task(name="child", parent_id=parent.id)
    assert foreign_keys(pg_url) == 0
    insert = ("INSERT INTO tsg_tasks(id, parent_id, status, delivery_required, delivery_status, "
              "created_at, delivery_updated_at, updated_at) "
              "VALUES (%s, %s, 'queued', 0, 'pending', 1.0, 1.0, 1.0)")
    with pytest.raises(psycopg.errors.ForeignKeyViolation):
        sql(pg_url, insert, ("orphan", "no-such-task"))
    sql(pg_url, insert, ("second-child", parent.id))  # a parent that exists: accepted
    with pytest.raises(psycopg.errors.ForeignKeyViolation):
        sql(pg_url, "UPDATE tsg_tasks SET parent_id = 'no-such-task' WHERE id = 'second-child'")
    assert sql(pg_url, "SELECT count(*) FROM tsg_tasks WHERE id = 'orphan'") == [(0,)]
    assert sql(pg_url, "SELECT parent_id FROM tsg_tasks WHERE id = 'second-child'") == [
        (parent.id,)]
    with Ledger(pg_url) as ledger:
        assert ledger.doctor()["foreign_key_violation_count"] == 0
        with pytest.raises(TaskNotFound):
            ledger.create_task(name="child", parent_id="00000000-0000-4000-8000-00000000dead")


def test_a_read_only_open_of_a_missing_ledger_creates_nothing(pg_url: str) -> None:
    with pytest.raises(InvalidInput) as err:  # as a missing SQLite file
        Ledger(pg_url, read_only=True)
    assert str(err.value) == "the ledger does not exist"
    assert err.value.reason == "database_missing"
    schema = schema_of(pg_url)
    assert sql(pg_url, "SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)) == []


def test_stale_ledger_schemas_are_dropped_and_fresh_ones_kept(pg_url: str) -> None:
    prefix = schema_of(pg_url) + "_"
    old, new = pg_url + "_old", pg_url + "_new"  # schemas <schema>_old and <schema>_new
    try:
        for url in (old, new):
            Ledger(url).close()
        sql(old, "UPDATE tsg_meta SET value = '0.0' WHERE key = 'created_at'")
        assert drop_stale_schemas(pg_url, prefix, older_than_seconds=3600) == 1
        names = {row[0] for row in sql(
            pg_url, "SELECT nspname FROM pg_namespace WHERE starts_with(nspname, %s)", (prefix,)
        )}
        assert names == {schema_of(new)}
    finally:
        for url in (old, new):
            drop_schema(url)


def test_a_version_3_ledger_migrates_with_its_totals(pg_url: str) -> None:
    schema = schema_of(pg_url)
    sql(pg_url, f'CREATE SCHEMA "{schema}"')
    sql(pg_url, f'CREATE TABLE "{schema}".tsg_migrations '
                "(version integer PRIMARY KEY, applied_at double precision NOT NULL)")
    for statement in MIGRATIONS[3](schema):  # the layout an earlier release created
        sql(pg_url, statement)
    sql(pg_url, "INSERT INTO tsg_migrations VALUES (3, 0)")
    sql(pg_url, "INSERT INTO tsg_meta VALUES ('application', 'task-state-guard')")
    rows = [(f"00000000-0000-4000-8000-00000000000{i}", status, code)
            for i, (status, code) in enumerate(
                [("succeeded", "worker_completed"), ("failed", None), ("queued", None)])]
    for tid, status, code in rows:
        ended = None if status == "queued" else 2.0
        sql(pg_url, "INSERT INTO tsg_tasks(id, status, terminal_code, delivery_required, "
                    "delivery_status, created_at, ended_at, delivery_updated_at, updated_at) "
                    "VALUES (%s, %s, %s, 1, 'pending', 1.0, %s, 1.0, 2.0)",
            (tid, status, code, ended))
    with Ledger(pg_url) as ledger:
        assert ledger.schema_version == SCHEMA_VERSION
        seeded = ledger.status()["outcomes_total"]["task"]  # the two closed tasks it held
        assert seeded["succeeded"]["worker_completed"] == 1 and seeded["failed"][""] == 1
        assert seeded["cancelled"].get("", 0) == 0
        ledger.close_task(rows[2][0], "cancelled")  # counted by the close's own statement
        ledger.close_task(ledger.create_task().id, "cancelled")
        assert ledger.status()["outcomes_total"]["task"]["cancelled"][""] == 2
        assert ledger.doctor()["schema_ok"] is True
        ledger.reconcile()  # a pass folds the totals' increments into one row per outcome
        assert ledger.status()["outcomes_total"]["task"]["cancelled"][""] == 2
    assert sql(pg_url, "SELECT version FROM tsg_migrations ORDER BY 1") == EVERY_MIGRATION
    assert sql(pg_url, "SELECT total FROM tsg_totals WHERE state = 'cancelled'") == [(2,)]


def test_a_version_4_ledger_migrates_and_its_pass_writes_every_event(pg_url: str) -> None:
    schema = schema_of(pg_url)
    sql(pg_url, f'CREATE SCHEMA "{schema}"')
    sql(pg_url, f'CREATE TABLE "{schema}".tsg_migrations '
                "(version integer PRIMARY KEY, applied_at double precision NOT NULL)")
    for number in (3, 4):  # the layout the previous release created
        for statement in MIGRATIONS[number](schema):
            sql(pg_url, statement)
        sql(pg_url, "INSERT INTO tsg_migrations VALUES (%s, 0)", (number,))
    sql(pg_url, "INSERT INTO tsg_meta VALUES ('application', 'task-state-guard')")
    tid = "00000000-0000-4000-8000-000000000001"
    sql(pg_url, "INSERT INTO tsg_tasks(id, status, delivery_required, delivery_status, "
                "created_at, started_at, heartbeat_at, delivery_updated_at, updated_at) "
                "VALUES (%s, 'running', 1, 'pending', 1.0, 1.0, 1.0, 1.0, 1.0)", (tid,))
    sql(pg_url, "INSERT INTO tsg_events VALUES (1, 2, 'started', 'running', 'started', 1.0)")
    sql(pg_url, "UPDATE tsg_tasks SET version = 1")
    # the version 4 trigger, before the migration: events for every update
    assert sql(pg_url, "SELECT tgname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
                       "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s "
                       "AND pg_get_triggerdef(t.oid) LIKE %s",
               (schema, "%WHEN%")) == []
    with Ledger(pg_url, clock=lambda: 10_000.0) as ledger:
        assert ledger.schema_version == SCHEMA_VERSION
        assert ledger.doctor()["healthy"] is True
        report = ledger.reconcile(ReconcilePolicy(active_grace_seconds=60,
                                                  delivery_grace_seconds=0))
        assert report["tasks_timed_out"] == 1 and report["deliveries_failed"] == 1
        other = ledger.create_task()
        ledger.close_task(other.id, "cancelled")  # the close writes this one's events
        assert ledger.doctor()["healthy"] is True
        totals = ledger.status()
        assert totals["outcomes_total"]["task"]["timed_out"]["restart_stale"] == 1
        assert totals["outcomes_total"]["task"]["cancelled"][""] == 1
        assert totals["delivery_outcomes_total"]["owed"]["failed"]["delivery_grace_expired"] == 1
    assert sql(pg_url, "SELECT step, kind, state, code FROM tsg_events WHERE task_seq = 1 "
                       "ORDER BY step") == [
        (1, "created", "queued", "created"), (2, "started", "running", "started"),
        (3, "closed", "timed_out", "restart_stale"),
        (4, "delivery", "failed", "delivery_grace_expired")]
    assert sql(pg_url, "SELECT version FROM tsg_migrations ORDER BY 1") == EVERY_MIGRATION
    assert sql(pg_url, "SELECT c.reloptions FROM pg_class c JOIN pg_namespace n "
                       "ON n.oid = c.relnamespace WHERE n.nspname = %s "
                       "AND c.relname = 'tsg_tasks'", (schema,)) == [(["fillfactor=80"],)]


def test_a_version_5_ledger_migrates_and_owes_verdicts_from_then_on(pg_url: str) -> None:
    """The previous release's layout gains the verdict outbox in one transaction; a job opened
    before it has no framework label (nothing is backfilled), one opened after owes its
    framework a verdict when a reconcile pass (the set-based statement) or a plain close (its
    own statement) declares it lost."""
    import logging

    from task_state_guard.integration import AdapterRuntime, AttemptSpec, resolve_settings

    schema = schema_of(pg_url)
    sql(pg_url, f'CREATE SCHEMA "{schema}"')
    sql(pg_url, f'CREATE TABLE "{schema}".tsg_migrations '
                "(version integer PRIMARY KEY, applied_at double precision NOT NULL)")
    for number in (3, 4, 5):  # the layout the previous release created
        for statement in MIGRATIONS[number](schema):
            sql(pg_url, statement)
        sql(pg_url, "INSERT INTO tsg_migrations VALUES (%s, 0)", (number,))
    sql(pg_url, "INSERT INTO tsg_meta VALUES ('application', 'task-state-guard')")
    old = "00000000-0000-4000-8000-000000000001"
    sql(pg_url, "INSERT INTO tsg_tasks(id, status, delivery_required, delivery_status, "
                "created_at, started_at, delivery_updated_at, updated_at, version) "
                "VALUES (%s, 'running', 0, 'pending', 1.0, 1.0, 1.0, 1.0, 1)", (old,))
    sql(pg_url, "INSERT INTO tsg_events VALUES (1, 2, 'started', 'running', 'started', 1.0)")
    clock = [10_000.0]
    with Ledger(pg_url, clock=lambda: clock[0]) as ledger:
        assert ledger.schema_version == SCHEMA_VERSION
        assert ledger.doctor()["healthy"] is True
        settings = resolve_settings(db_required=False, heartbeat_seconds=0)
        rt = AdapterRuntime(settings, logger=logging.getLogger("test"), ledger=ledger,
                            framework="dramatiq")
        jobs = []
        for index in range(2):
            logical = f"00000000-0000-4000-8000-00000000001{index}"
            rt.open_logical(logical, delivery_required=False, name="job")
            jobs.append((logical, rt.claim_attempt(AttemptSpec(logical, "job"))))
        (closed, closed_attempt), (passed, _) = jobs
        rt.close_tasks([(closed_attempt, "timed_out", "owner_lost", True),
                        (closed, "timed_out", "owner_lost", False)])  # the end's statement
        clock[0] += 1000
        report = ledger.reconcile(ReconcilePolicy(active_grace_seconds=60))  # the pass
        assert report["tasks_timed_out"] == 3  # the old task, the other job and its attempt
        owed = {v.task_id: v.code for v in ledger.claim_verdicts("dramatiq")}
        assert owed == {closed: "owner_lost", passed: "restart_stale"}
        assert ledger.doctor()["healthy"] is True
    assert sql(pg_url, "SELECT version FROM tsg_migrations ORDER BY 1") == EVERY_MIGRATION
