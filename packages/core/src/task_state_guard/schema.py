"""Schema DDL, exact fingerprints and the guarded v1 -> v2 migration."""

from __future__ import annotations

import sqlite3
from functools import cache

from .model import DELIVERY_CODES, TASK_CODES, StorageError

SCHEMA_VERSION = 2
APPLICATION = "task-state-guard"

_TASK_COLUMNS_V1 = """
    seq INTEGER PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    parent_id TEXT REFERENCES tsg_tasks(id),
    status TEXT NOT NULL CHECK (status IN
        ('queued','running','succeeded','failed','timed_out','cancelled')),
    code TEXT,
    delivery_required INTEGER NOT NULL CHECK (delivery_required IN (0, 1)),
    delivery_status TEXT NOT NULL CHECK (delivery_status IN
        ('pending','delivered','failed','not_applicable')),
    delivery_code TEXT,
    payload_hash TEXT,
    timeout_seconds REAL,
    deadline_at REAL,
    created_at REAL NOT NULL,
    started_at REAL,
    heartbeat_at REAL,
    closed_at REAL,
    delivery_closed_at REAL,
    updated_at REAL NOT NULL"""

_COMMON = [
    "CREATE TABLE tsg_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID",
    # Events are clustered by task: one B-tree page per transition, read in chain order.
    # No foreign key (it costs every transition a lookup); doctor counts orphan events.
    """CREATE TABLE tsg_events (
    task_seq INTEGER NOT NULL,
    step INTEGER NOT NULL CHECK (step IN (1, 2, 3, 4)),
    kind TEXT NOT NULL CHECK (kind IN ('created','started','closed','delivery')),
    state TEXT NOT NULL,
    code TEXT,
    at REAL NOT NULL,
    PRIMARY KEY (task_seq, step)
) WITHOUT ROWID""",
    # Open work: every task whose delivery is still pending (active or awaiting delivery).
    # start/close never touch this index; only creation and the delivery close do.
    "CREATE INDEX tsg_tasks_open ON tsg_tasks(seq) WHERE delivery_closed_at IS NULL",
    "CREATE INDEX tsg_tasks_parent ON tsg_tasks(parent_id) WHERE parent_id IS NOT NULL",
]

DDL_V1 = [f"CREATE TABLE tsg_tasks ({_TASK_COLUMNS_V1}\n)", *_COMMON]


def _event_trigger(name: str, when: str, step: int, kind: str, state: str, code: str,
                   at: str, event: str = "UPDATE OF status") -> str:
    return (
        f"CREATE TRIGGER {name} AFTER {event} ON tsg_tasks{when} BEGIN "
        "INSERT INTO tsg_events(task_seq, step, kind, state, code, at) "
        f"VALUES (NEW.seq, {step}, '{kind}', {state}, {code}, {at}); END"
    )


# Every state change writes its event in the same statement, enforced by the database.
_TRIGGERS = [
    _event_trigger("tsg_event_created", "", 1, "created", "'queued'", "'created'",
                   "NEW.created_at", event="INSERT"),
    _event_trigger("tsg_event_started",
                   " WHEN OLD.status = 'queued' AND NEW.status = 'running'",
                   2, "started", "'running'", "'started'", "NEW.started_at"),
    _event_trigger("tsg_event_closed",
                   " WHEN OLD.status IN ('queued','running') AND NEW.status IN "
                   "('succeeded','failed','timed_out','cancelled')",
                   3, "closed", "NEW.status", "NEW.code", "NEW.closed_at"),
    _event_trigger("tsg_event_delivery",
                   " WHEN OLD.delivery_status = 'pending' AND NEW.delivery_status != 'pending'",
                   4, "delivery", "NEW.delivery_status", "NEW.delivery_code",
                   "NEW.delivery_closed_at", event="UPDATE OF delivery_status"),
]

_V2_ADDITIONS = [
    "ALTER TABLE tsg_tasks ADD COLUMN name TEXT",
    "ALTER TABLE tsg_tasks ADD COLUMN owner TEXT",
    """CREATE INDEX tsg_tasks_prunable ON tsg_tasks(updated_at)
    WHERE parent_id IS NULL AND delivery_closed_at IS NOT NULL""",
    *_TRIGGERS,
]

# v2 is v1 plus the additions, so a fresh v2 ledger and a migrated v1 ledger are identical.
DDL_V2 = [*DDL_V1, *_V2_ADDITIONS]

META_KEYS = frozenset({"application", "schema_version"})

Fingerprint = tuple[tuple[str, str, str, str], ...]


def read_fingerprint(conn: sqlite3.Connection, schema: str = "main") -> Fingerprint:
    """Return the ordered (type, name, table, sql) rows of the user schema."""
    rows = conn.execute(
        f"SELECT type, name, tbl_name, coalesce(sql, '') FROM {schema}.sqlite_master "
        "WHERE name NOT LIKE 'sqlite_%' ORDER BY type, name"
    ).fetchall()
    return tuple((str(a), str(b), str(c), " ".join(str(d).split())) for a, b, c, d in rows)


@cache
def expected_fingerprint(version: int) -> Fingerprint:
    """Fingerprint of a database built from the DDL of ``version``."""
    conn = sqlite3.connect(":memory:")
    try:
        for statement in DDL_V1 if version == 1 else DDL_V2:
            conn.execute(statement)
        return read_fingerprint(conn)
    finally:
        conn.close()


def detect_version(conn: sqlite3.Connection, schema: str = "main") -> int | None:
    """Return 0 for an empty database, 1 or 2 for an exact known schema, else None."""
    found = read_fingerprint(conn, schema)
    if not found:
        return 0
    for version in (2, 1):
        if found == expected_fingerprint(version):
            meta = dict(conn.execute(f"SELECT key, value FROM {schema}.tsg_meta").fetchall())
            if meta == {"application": APPLICATION, "schema_version": str(version)}:
                return version
            return None
    return None


def create(conn: sqlite3.Connection) -> None:
    """Create the current schema inside the caller's transaction."""
    for statement in DDL_V2:
        conn.execute(statement)
    conn.executemany(
        "INSERT INTO tsg_meta(key, value) VALUES (?, ?)",
        [("application", APPLICATION), ("schema_version", str(SCHEMA_VERSION))],
    )


def _legacy_codes_valid(conn: sqlite3.Connection) -> bool:
    for column, state_column, registry in (
        ("code", "status", TASK_CODES),
        ("delivery_code", "delivery_status", DELIVERY_CODES),
    ):
        rows = conn.execute(
            f"SELECT DISTINCT {state_column}, {column} FROM tsg_tasks WHERE {column} IS NOT NULL"
        )
        for state, code in rows:
            if code not in registry.get(state, frozenset()):
                return False
    for kind, state, code in conn.execute(
        "SELECT DISTINCT kind, state, code FROM tsg_events WHERE code IS NOT NULL"
    ):
        if kind in ("created", "started"):
            if code != kind:
                return False
            continue
        registry = DELIVERY_CODES if kind == "delivery" else TASK_CODES
        if code not in registry.get(state, frozenset()):
            return False
    return True


def migrate_v1(conn: sqlite3.Connection) -> None:
    """Upgrade an exact v1 schema in the caller's transaction; fail closed on legacy text."""
    if not _legacy_codes_valid(conn):
        raise StorageError("schema v1 holds reason text outside the registry; migrate explicitly")
    for statement in _V2_ADDITIONS:
        conn.execute(statement)
    conn.execute(
        "UPDATE tsg_meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION),)
    )


V1_COMPAT_VIEW = """CREATE TEMP VIEW tsg_tasks AS SELECT seq, id, parent_id, status, code,
    delivery_required, delivery_status, delivery_code, payload_hash, timeout_seconds,
    deadline_at, created_at, started_at, heartbeat_at, closed_at, delivery_closed_at,
    updated_at, NULL AS name, NULL AS owner FROM main.tsg_tasks"""
