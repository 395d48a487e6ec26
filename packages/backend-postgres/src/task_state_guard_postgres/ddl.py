"""The ledger's tables in a PostgreSQL schema, and their guarded, transactional migrations.

The layout holds the core's data model (the same columns, states, checks, one event chain
per task, the outcome totals and the verdict outbox), in a schema of its own, versioned on its
own (:data:`SCHEMA_VERSION`). Every statement of this release that changes a state writes
the changed rows' events, totals and verdicts itself (:mod:`.writes`). The row trigger of the
earlier layouts, which wrote them for each changed row, stays, gated per session: it steps
aside for a session that sets :data:`PASS_EVENTS` (every connection of this release does, on
connect) and keeps writing them for any other, such as a process of an earlier release still
running during a rolling upgrade. The totals are rows of increments
(``total`` summed by readers), so concurrent closes never queue on one counter row; passes fold
them (:data:`COMPACT_TOTALS`). A new task's parent must exist: a row trigger checks it for every
session, as a foreign key would, without the key's check of every deleted row.
``tsg_migrations`` records each applied migration; a writable open applies the missing ones in
one transaction under a transaction-level advisory lock (so hosts booting together migrate
once), and any open refuses a schema newer than this release.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

from task_state_guard import reasons as r
from task_state_guard import rules
from task_state_guard.model import TASK_KIND_SQL, InvalidInput, StorageError

from .driver import PASS_EVENTS, Conn

#: The layout version this release writes (4: the core's data model; 5: reconcile passes
#: write their events set-based, see :data:`PASS_EVENTS`; 6: the verdict outbox; 7: the
#: totals' kind is the one a person calls the task; 8: the thread column; 9: the row trigger
#: steps aside for this release's sessions, whose statements write their own events, totals
#: and verdicts; 10: a new task's parent is checked by a trigger instead of a foreign key).
SCHEMA_VERSION = 10
APPLICATION = "task-state-guard"
NEWER_SCHEMA = "the ledger's schema is newer than this release"
FOREIGN_SCHEMA = "the database holds a foreign or tampered schema"
MISSING = "the ledger does not exist"


def lock_key(kind: str, schema: str, token: str = "") -> int:
    """A signed 64-bit advisory lock key for ``kind`` in ``schema`` (and an owner token)."""
    digest = hashlib.blake2b(
        f"{schema}\0{token}".encode(), digest_size=8, person=kind.encode()[:16]
    ).digest()
    return int.from_bytes(digest, "big", signed=True)


def _v3(s: str) -> list[str]:
    """Create the version 3 layout in schema ``s`` (already validated as an identifier)."""
    q = f'"{s}"'
    return [
        f"CREATE TABLE {q}.tsg_meta (key text PRIMARY KEY, value text NOT NULL)",
        f"CREATE TABLE {q}.tsg_tasks ({rules.task_table_columns('postgres', f'{q}.tsg_tasks')})",
        f"""CREATE TABLE {q}.tsg_events (
    task_seq bigint NOT NULL,
    step integer NOT NULL CHECK (step IN {rules.EVENT_STEPS_SQL}),
    kind text NOT NULL CHECK (kind IN {rules.EVENT_KINDS_SQL}),
    state text NOT NULL,
    code text,
    at double precision NOT NULL,
    PRIMARY KEY (task_seq, step))""",
        f"CREATE INDEX tsg_tasks_open ON {q}.tsg_tasks(seq) WHERE delivery_status = 'pending'",
        f"CREATE INDEX tsg_tasks_parent ON {q}.tsg_tasks(parent_id) "
        "WHERE parent_id IS NOT NULL",
        f"CREATE INDEX tsg_tasks_prunable ON {q}.tsg_tasks(delivery_updated_at) "
        "WHERE parent_id IS NULL AND delivery_status <> 'pending'",
        # Every state change writes its event in the same statement, enforced by the database.
        _event_function(q, replace=False, totals=False, verdicts=False),
        f"CREATE TRIGGER tsg_event_created AFTER INSERT ON {q}.tsg_tasks "
        f"FOR EACH ROW EXECUTE FUNCTION {q}.tsg_write_event()",
        f"CREATE TRIGGER tsg_event_changed AFTER UPDATE OF status, delivery_status "
        f"ON {q}.tsg_tasks FOR EACH ROW EXECUTE FUNCTION {q}.tsg_write_event()",
    ]


def _task_kind_v4(row: str) -> str:
    """Versions 4 to 6's kind of a close in the totals: a root or a child (``row``: the row's
    prefix)."""
    return f"CASE WHEN {row}parent_id IS NULL THEN 'task' ELSE 'attempt' END"


def _event_function(
    q: str, *, replace: bool, totals: bool, verdicts: bool, kinds: bool = False
) -> str:
    """The row trigger's function: a state change's event (and, from version 4, its outcome
    total; from version 6, the verdict a lost close owes its framework) in the same statement.
    ``replace``: ``CREATE OR REPLACE`` (a later version's body) instead of ``CREATE``.
    ``kinds`` (version 7): a close's total under ``model.TASK_KIND_SQL`` (the kind a person
    calls the task) instead of root or child."""
    task_kind = TASK_KIND_SQL.format(row="NEW.") if kinds else _task_kind_v4("NEW.")
    delivery_kind = rules.DELIVERY_KIND_SQL.format(row="NEW.")
    closed_total = (
        f"""
        INSERT INTO {q}.tsg_totals(event, kind, state, code, total)
        VALUES ('closed', {task_kind}, NEW.status, coalesce(NEW.terminal_code, ''), 1);"""
        if totals else ""
    )
    delivery_total = (
        f"""
        INSERT INTO {q}.tsg_totals(event, kind, state, code, total)
        VALUES ('delivery', {delivery_kind}, NEW.delivery_status,
                coalesce(NEW.delivery_code, ''), 1);"""
        if totals else ""
    )
    verdict = (
        f"""
        IF {rules.VERDICT_OWED} THEN
            INSERT INTO {q}.tsg_verdicts(task_seq, framework, state, recorded_at)
            VALUES (NEW.seq, NEW.framework, 'pending', NEW.ended_at)
            ON CONFLICT (task_seq) DO NOTHING;
        END IF;"""
        if verdicts else ""
    )
    extras = {"closed": closed_total + verdict, "delivery": delivery_total}
    body = []
    for rule in rules.EVENT_RULES:
        insert = rules.event_insert(rule, f"{q}.tsg_events")
        if rule.on_insert:
            body.append(f"""    IF TG_OP = 'INSERT' THEN
        {insert};
        RETURN NULL;
    END IF;""")
        else:
            body.append(f"""    IF {rule.when()} THEN
        {insert};{extras.get(rule.kind, "")}
    END IF;""")
    create = "CREATE OR REPLACE FUNCTION" if replace else "CREATE FUNCTION"
    newline = "\n"
    return f"""{create} {q}.tsg_write_event() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
{newline.join(body)}
    RETURN NULL;
END
$fn$"""


def _v4(s: str) -> list[str]:
    """Version 4: the outcome totals, seeded from the tasks the ledger holds, kept by the
    event trigger from then on."""
    q = f'"{s}"'
    return [
        f"""CREATE TABLE {q}.tsg_totals (
    event text NOT NULL CHECK (event IN ('closed','delivery')),
    kind text NOT NULL CHECK (kind IN ('task','attempt','owed','internal')),
    state text NOT NULL,
    code text NOT NULL,
    total bigint NOT NULL CHECK (total >= 0))""",
        f"INSERT INTO {q}.tsg_totals(event, kind, state, code, total) "
        + rules.TOTALS_SELECT.format(tasks=f"{q}.tsg_tasks"),
        _event_function(q, replace=True, totals=True, verdicts=False),
    ]


#: The row trigger's gate (versions 5 on for a change, 9 on for an insert): it fires only in a
#: session that has not set :data:`PASS_EVENTS` to ``on``.
_GATE = f"WHEN (current_setting('{PASS_EVENTS}', true) IS DISTINCT FROM 'on')"


def _v5(s: str) -> list[str]:
    """Version 5: the row trigger steps aside for a reconcile pass's set-based statements
    (a trigger call per row cost a pass more than the rows' own updates); task pages keep a
    fifth free (pages written from now on), so that a start, heartbeat or time-out, which
    change no indexed column, can stay on its page without new index entries (HOT)."""
    q = f'"{s}"'
    return [
        f"ALTER TABLE {q}.tsg_tasks SET (fillfactor = 80)",
        f"DROP TRIGGER tsg_event_changed ON {q}.tsg_tasks",
        f"CREATE TRIGGER tsg_event_changed AFTER UPDATE OF status, delivery_status "
        f"ON {q}.tsg_tasks FOR EACH ROW {_GATE} EXECUTE FUNCTION {q}.tsg_write_event()",
    ]


def _v6(s: str) -> list[str]:
    """Version 6: the verdict outbox (the core's SQLite layout 5 adds the same): which adapter
    opened a logical task, an attempt's redelivery bound, and ``tsg_verdicts``, one row per
    logical task closed as lost, written by the row trigger (or a reconcile pass's own
    statement, :data:`queries.PASS_WRITES`) in the statement that closes it."""
    q = f'"{s}"'
    return [
        *rules.add_outbox_columns("postgres", f"{q}.tsg_tasks"),
        f"""CREATE TABLE {q}.tsg_verdicts (
    task_seq bigint PRIMARY KEY,
    framework text NOT NULL,
    state text NOT NULL CHECK (state IN ('pending','published')),
    recorded_at double precision NOT NULL,
    lease_until double precision,
    claim text,
    published_at double precision)""",
        f"CREATE INDEX tsg_verdicts_pending ON {q}.tsg_verdicts(framework, task_seq) "
        "WHERE state = 'pending'",
        _event_function(q, replace=True, totals=True, verdicts=True),
    ]


def _v7(s: str) -> list[str]:
    """Version 7 (the core's SQLite layout 6 does the same): a close is counted under the kind
    a person calls the task (``model.TASK_KIND_SQL``: a child that owes its own delivery, such
    as a LangGraph resume or recovery run, is a ``task``); the totals counted before keep
    their kind."""
    return [_v7_event_function(f'"{s}"')]


def _v8(s: str) -> list[str]:
    """Version 8 (the core's SQLite layout 9 does the same): the framework's thread of a
    logical task (a LangGraph thread id) and the index that finds a thread's tasks; NULL for
    every task recorded before."""
    return rules.add_thread_column("postgres", f'"{s}".tsg_tasks')


def _v7_event_function(q: str) -> str:
    """Version 7's event function (the last ``CREATE OR REPLACE`` of the row trigger's)."""
    return _event_function(q, replace=True, totals=True, verdicts=True, kinds=True)


def _v9(s: str) -> list[str]:
    """Version 9: every statement of this release that changes a state writes the changed
    rows' events, totals and verdicts itself (:mod:`.writes`: a data-modifying sub-statement
    beside the change), as reconcile passes already did, and the row trigger steps aside for
    it: the insert trigger gains the gate the change trigger has had since version 5, and this
    release sets :data:`PASS_EVENTS` for its whole session on connect. The per-row trigger call
    (about a sixth of a guarded job's server time) is gone for this release; a process of an
    earlier release, which does not set it, still has its changes' rows written by the trigger,
    so a fleet upgrades worker by worker. Nothing stored changes."""
    q = f'"{s}"'
    return [
        f"DROP TRIGGER tsg_event_created ON {q}.tsg_tasks",
        f"CREATE TRIGGER tsg_event_created AFTER INSERT ON {q}.tsg_tasks FOR EACH ROW "
        f"{_GATE} EXECUTE FUNCTION {q}.tsg_write_event()",
    ]


def _parent_function(q: str) -> str:
    """Version 10's parent check: the new row's parent exists, held against a prune (``FOR KEY
    SHARE``, as a foreign key's check holds it) until the inserting transaction ends; a parent
    deleted meanwhile raises ``foreign_key_violation``, as the key did."""
    return f"""CREATE FUNCTION {q}.tsg_parent_exists() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
    PERFORM 1 FROM {q}.tsg_tasks WHERE id = NEW.parent_id FOR KEY SHARE;
    IF NOT FOUND THEN
        RAISE foreign_key_violation USING MESSAGE = 'the task''s parent does not exist';
    END IF;
    RETURN NULL;
END
$fn$"""


def _v10(s: str) -> list[str]:
    """Version 10: the task table's foreign key (a task's parent) is replaced by a row trigger
    that makes the same check of a new row's parent. The key also checked every *deleted* row
    for children through the server's own per-row query (about 10 µs a row: a third of a
    prune at 10M tasks); a prune needs no such check, because it holds the rows it deletes and
    reads their children again after the hold, and a new child's check waits for that hold (its
    parent then deleted, it is refused). Nothing stored changes."""
    q = f'"{s}"'
    return [
        # The key's name is the server's choice (``tsg_tasks_parent_id_fkey`` on every
        # release so far): drop whichever foreign key the table has.
        f"""DO $do$ DECLARE key text; BEGIN
    FOR key IN SELECT conname FROM pg_catalog.pg_constraint
        WHERE conrelid = '{q}.tsg_tasks'::regclass AND contype = 'f' LOOP
        EXECUTE format('ALTER TABLE {q}.tsg_tasks DROP CONSTRAINT %I', key);
    END LOOP;
END $do$""",
        _parent_function(q),
        f"CREATE TRIGGER tsg_parent_exists AFTER INSERT OR UPDATE OF parent_id "
        f"ON {q}.tsg_tasks FOR EACH ROW WHEN (NEW.parent_id IS NOT NULL) "
        f"EXECUTE FUNCTION {q}.tsg_parent_exists()",
    ]


#: Migration number -> its statements (a function of the schema name), applied in order.
MIGRATIONS: dict[int, Callable[[str], list[str]]] = {
    3: _v3, 4: _v4, 5: _v5, 6: _v6, 7: _v7, 8: _v8, 9: _v9, 10: _v10}
#: The first version with the verdict outbox.
OUTBOX_VERSION = 6
#: The first version with the thread column.
THREAD_VERSION = 8
#: The first version whose row trigger steps aside for this release's sessions.
GATED_VERSION = 9

#: Folds the totals' increments into one row per (event, kind, state, code); rows committed
#: meanwhile are not touched (run by reconcile and prune passes, under their pass lock).
COMPACT_TOTALS = (
    "WITH gone AS (DELETE FROM tsg_totals RETURNING event, kind, state, code, total) "
    "INSERT INTO tsg_totals(event, kind, state, code, total) "
    "SELECT event, kind, state, code, sum(total) FROM gone GROUP BY 1, 2, 3, 4"
)


def stored_version(conn: Conn, schema: str) -> int | None:
    """The highest applied migration, or None when the schema has no migrations table."""
    found = conn.run(
        "SELECT 1 FROM pg_catalog.pg_tables WHERE schemaname = %(schema)s "
        "AND tablename = 'tsg_migrations'",
        {"schema": schema},
    ).fetchone()
    if found is None:
        return None
    row = conn.execute(f'SELECT max(version) FROM "{schema}".tsg_migrations').fetchone()
    return None if row is None or row[0] is None else int(row[0])


def _has_ledger_tables(conn: Conn, schema: str) -> bool:
    row = conn.run(
        "SELECT count(*) FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n "
        "ON n.oid = c.relnamespace WHERE n.nspname = %(schema)s "
        "AND c.relname LIKE 'tsg^_%%' ESCAPE '^'",
        {"schema": schema},
    ).fetchone()
    return bool(row and row[0])


# The exact layout of this release, which any open (and doctor) checks a current schema
# against: the columns (table, column, type, nullable), the indexes of the ledger's tables, the
# triggers on them and the bodies of its functions.
_COLUMNS = """SELECT table_name, column_name, data_type, is_nullable FROM information_schema.columns
    WHERE table_schema = %(schema)s AND table_name IN ('tsg_tasks', 'tsg_events', 'tsg_totals',
        'tsg_verdicts')
    ORDER BY table_name, ordinal_position"""
_EXPECTED_COLUMNS = [
    ("tsg_events", "task_seq", "bigint", "NO"),
    ("tsg_events", "step", "integer", "NO"),
    ("tsg_events", "kind", "text", "NO"),
    ("tsg_events", "state", "text", "NO"),
    ("tsg_events", "code", "text", "YES"),
    ("tsg_events", "at", "double precision", "NO"),
    *[("tsg_tasks", c.name, c.postgres_type, "YES" if c.nullable else "NO")
      for c in rules.TASK_COLUMNS],
    ("tsg_totals", "event", "text", "NO"),
    ("tsg_totals", "kind", "text", "NO"),
    ("tsg_totals", "state", "text", "NO"),
    ("tsg_totals", "code", "text", "NO"),
    ("tsg_totals", "total", "bigint", "NO"),
    ("tsg_verdicts", "task_seq", "bigint", "NO"),
    ("tsg_verdicts", "framework", "text", "NO"),
    ("tsg_verdicts", "state", "text", "NO"),
    *[("tsg_verdicts", column, "double precision", nullable) for column, nullable in (
        ("recorded_at", "NO"), ("lease_until", "YES"))],
    ("tsg_verdicts", "claim", "text", "YES"),
    ("tsg_verdicts", "published_at", "double precision", "YES"),
]
_LEDGER_TABLES = "('tsg_tasks', 'tsg_events', 'tsg_meta', 'tsg_totals', 'tsg_verdicts', " \
    "'tsg_migrations')"
_INDEXES = f"""SELECT i.relname FROM pg_catalog.pg_index x
    JOIN pg_catalog.pg_class i ON i.oid = x.indexrelid
    JOIN pg_catalog.pg_class t ON t.oid = x.indrelid
    JOIN pg_catalog.pg_namespace n ON n.oid = t.relnamespace
    WHERE n.nspname = %(schema)s AND t.relname IN {_LEDGER_TABLES} ORDER BY 1"""
_EXPECTED_INDEXES = [
    "tsg_events_pkey", "tsg_meta_pkey", "tsg_migrations_pkey", "tsg_tasks_id_key",
    "tsg_tasks_open", "tsg_tasks_parent", "tsg_tasks_pkey", "tsg_tasks_prunable",
    rules.THREAD_INDEX, "tsg_verdicts_pending", "tsg_verdicts_pkey",
]
# The triggers on the ledger's tables: each one's table, name, enabled mark, and whether it is
# gated (its definition as the server reads :data:`_GATE` back, ``gate``: :data:`_GATE_PATTERN`).
_TRIGGERS = f"""SELECT c.relname, g.tgname, g.tgenabled,
        pg_catalog.pg_get_triggerdef(g.oid) LIKE %(gate)s FROM pg_catalog.pg_trigger g
    JOIN pg_catalog.pg_class c ON c.oid = g.tgrelid
    JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname = %(schema)s AND c.relname IN {_LEDGER_TABLES} AND NOT g.tgisinternal
    ORDER BY 1, 2"""
#: The row trigger, enabled (every version keeps it; a trigger dropped or disabled by hand
#: would lose an earlier release's events silently).
_ROW_TRIGGERS = [("tsg_tasks", "tsg_event_changed", "O"), ("tsg_tasks", "tsg_event_created", "O")]
# Both gated (an ungated one would write a second event beside this release's statements); the
# parent check fires for every session.
_EXPECTED_TRIGGERS = [*((*trigger, True) for trigger in _ROW_TRIGGERS),
                      ("tsg_tasks", "tsg_parent_exists", "O", False)]
_GATE_PATTERN = (f"% WHEN ((current_setting('{PASS_EVENTS}'::text, true) IS DISTINCT FROM "
                 "'on'::text)) EXECUTE FUNCTION %")
_FUNCTIONS = """SELECT p.prosrc FROM pg_catalog.pg_proc p
    JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
    WHERE n.nspname = %(schema)s
        AND p.proname IN ('tsg_parent_exists', 'tsg_write_event') ORDER BY p.proname"""


def row_trigger_intact(conn: Conn, schema: str) -> bool:
    """True when an earlier version's schema still has its row trigger, enabled, and no other
    (checked before it is migrated: version 9 recreates the insert trigger, after which one
    dropped or disabled by hand, whose inserts since then lack their events, could no longer
    be told apart)."""
    triggers = conn.run(_TRIGGERS, {"schema": schema, "gate": _GATE_PATTERN}).fetchall()
    return [tuple(row[:3]) for row in triggers] == _ROW_TRIGGERS


def layout_ok(conn: Conn, schema: str) -> bool:
    """True when the schema's ledger tables are exactly this release's layout: their columns,
    indexes (by name), enabled triggers (no others; the event triggers gated) and the bodies of
    the event function and the parent check.
    A schema edited by hand (a trigger dropped, disabled or ungated, a column added or retyped,
    an index or a trigger added, the function replaced) is not."""
    args = {"schema": schema}
    if [tuple(row) for row in conn.run(_COLUMNS, args).fetchall()] != _EXPECTED_COLUMNS:
        return False
    if [row[0] for row in conn.run(_INDEXES, args).fetchall()] != _EXPECTED_INDEXES:
        return False
    triggers = conn.run(_TRIGGERS, {**args, "gate": _GATE_PATTERN}).fetchall()
    if [tuple(row) for row in triggers] != _EXPECTED_TRIGGERS:
        return False
    q = f'"{schema}"'
    bodies = [_parent_function(q), _v7_event_function(q)]  # by name: tsg_parent_exists first
    return [row[0] for row in conn.run(_FUNCTIONS, args).fetchall()] == [
        body.split("$fn$")[1] for body in bodies
    ]


def prepare(
    conn: Conn, schema: str, *, read_only: bool, check: bool, now: Callable[[], float],
    create: bool = True,
) -> int | None:
    """Check (and, when writable, create or migrate) the ledger's schema; return its version.

    ``create=False``: a schema without a ledger is ``database_missing`` (nothing is created);
    an existing ledger is still migrated.

    ``check=False`` (doctor) reports a foreign schema as version None instead of refusing it.
    ``now`` is read only when a migration is recorded: opening a ledger samples no clock (a
    read's clock is sampled once, inside its snapshot).
    """
    if read_only or not create:
        version = stored_version(conn, schema)
        if version is None:
            if _has_ledger_tables(conn, schema):
                if check:
                    raise StorageError(FOREIGN_SCHEMA, reason=r.FOREIGN_SCHEMA)
                return None
            # As a missing SQLite file: a usage error (nothing to read), never a conflict.
            raise InvalidInput(MISSING, reason=r.DATABASE_MISSING)
        if version > SCHEMA_VERSION:
            raise StorageError(NEWER_SCHEMA, reason=r.SCHEMA_NEWER)
        if version == SCHEMA_VERSION and check and not layout_ok(conn, schema):
            raise StorageError(FOREIGN_SCHEMA, reason=r.FOREIGN_SCHEMA)
        if read_only or version == SCHEMA_VERSION:
            return version
    conn.execute("BEGIN")
    try:
        conn.run("SELECT pg_advisory_xact_lock(%(key)s)", {"key": lock_key("tsg-migrate", schema)})
        exists = conn.run(
            "SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = %(schema)s", {"schema": schema}
        ).fetchone()
        if exists is None:
            conn.execute(f'CREATE SCHEMA "{schema}"')
        version = stored_version(conn, schema)
        if version is None and _has_ledger_tables(conn, schema):
            if check:
                raise StorageError(FOREIGN_SCHEMA, reason=r.FOREIGN_SCHEMA)
            conn.execute("ROLLBACK")
            return None
        if version is not None and version > SCHEMA_VERSION:
            raise StorageError(NEWER_SCHEMA, reason=r.SCHEMA_NEWER)
        if version is None:
            conn.execute(
                f'CREATE TABLE "{schema}".tsg_migrations '
                "(version integer PRIMARY KEY, applied_at double precision NOT NULL)"
            )
        pending = [n for n in sorted(MIGRATIONS) if version is None or n > version]
        if (version is not None and version < GATED_VERSION
                and not row_trigger_intact(conn, schema)):  # edited by hand before
            if check:
                raise StorageError(FOREIGN_SCHEMA, reason=r.FOREIGN_SCHEMA)
            conn.execute("ROLLBACK")
            return None
        at = now() if pending else 0.0
        for number in pending:
            for statement in MIGRATIONS[number](schema):
                conn.execute(statement)
            conn.run(
                f'INSERT INTO "{schema}".tsg_migrations(version, applied_at) '
                "VALUES (%(version)s, %(at)s)",
                {"version": number, "at": at},
            )
        if version is None:
            conn.run(
                f'INSERT INTO "{schema}".tsg_meta(key, value) VALUES '
                "('application', %(application)s), ('created_at', %(created)s)",
                {"application": APPLICATION, "created": repr(at)},
            )
        if check and not layout_ok(conn, schema):  # edited by hand, before or after migrating
            raise StorageError(FOREIGN_SCHEMA, reason=r.FOREIGN_SCHEMA)
        conn.execute("COMMIT")
    except BaseException:
        if conn.usable and conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return SCHEMA_VERSION


__all__ = [
    "COMPACT_TOTALS", "MIGRATIONS", "NEWER_SCHEMA", "PASS_EVENTS", "SCHEMA_VERSION", "layout_ok",
    "lock_key", "prepare", "stored_version",
]
