"""Which ledger backends the conformance suite runs against, and a fresh ledger on each.

A test that asks for the ``backend`` fixture (directly or through ``ledger_target`` or a
directory's ``db`` fixture) runs once per selected backend: ``sqlite`` gets a path in the
test's private directory, ``postgresql`` a URL naming a schema of its own in database ``test``
on 127.0.0.1:5432 (trust auth), dropped after the test. PostgreSQL is required wherever it is
selected: an unreachable server fails the test, never skips it.

Selection: ``pytest --backend sqlite|postgresql|all`` (default ``all``), or the environment
variable ``TSG_TEST_LEDGER_BACKEND`` with the same values when no option is given.
"""

from __future__ import annotations

import hashlib
import os
import re
import sqlite3
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg

BACKENDS = ("sqlite", "postgresql")
ENV_VAR = "TSG_TEST_LEDGER_BACKEND"
PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/test"
SCHEMA_PREFIX = "tsgt_"
_SCHEMA = re.compile(r"[?&]schema=(" + SCHEMA_PREFIX + r"[a-z0-9_]+)")


def selected(choice: str | None) -> tuple[str, ...]:
    """The backends a run selects (an unknown value is a usage error)."""
    value = (choice or os.environ.get(ENV_VAR) or "all").strip().lower()
    if value == "all":
        return BACKENDS
    if value not in BACKENDS:
        raise ValueError(f"--backend must be one of sqlite, postgresql, all (got {value!r})")
    return (value,)


def pg_url(schema: str) -> str:
    """The ledger URL of ``schema`` in the test database."""
    return f"{PG_ADMIN}?schema={schema}"


def new_schema() -> str:
    """``tsgt_<creation time in hex seconds>_<random>``: the leftover cleanup judges a schema's
    age by its name, never by the ledger's own record (tests run ledgers on simulated clocks
    far in the past, and another test session's cleanup must never drop a live one)."""
    return f"{SCHEMA_PREFIX}{int(time.time()):x}_{uuid.uuid4().hex[:12]}"


_STAMPED = re.compile(SCHEMA_PREFIX + r"([0-9a-f]{8,12})_[a-z0-9_]+")


def drop_stale_schemas(conninfo: str = PG_ADMIN, older_than_seconds: float = 3600.0) -> int:
    """Drop the test schemas (``tsgt_<time>_*``) created more than ``older_than_seconds`` ago,
    the leftovers of killed runs; return how many were dropped."""
    cutoff = time.time() - older_than_seconds
    try:
        conn = psycopg.connect(conninfo, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as exc:
        raise AssertionError(f"PostgreSQL is required for the test ledgers: {exc}") from exc
    dropped = 0
    try:
        conn.execute("SET lock_timeout = '5s'")
        names = [row[0] for row in conn.execute(
            "SELECT nspname FROM pg_namespace WHERE starts_with(nspname, %s)", (SCHEMA_PREFIX,)
        ).fetchall()]
        for name in names:
            match = _STAMPED.fullmatch(name)
            if match and int(match.group(1), 16) < cutoff:
                try:
                    conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
                    dropped += 1
                except psycopg.errors.LockNotAvailable:
                    pass  # still in use: a later session drops it
    finally:
        conn.close()
    return dropped


def _connect() -> psycopg.Connection[tuple[object, ...]]:
    try:
        return psycopg.connect(PG_ADMIN, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as exc:
        raise AssertionError(
            f"PostgreSQL is required at 127.0.0.1:5432 (database 'test') for the "
            f"postgresql ledger backend: {exc}"
        ) from exc


def require_postgresql() -> None:
    """Fail (never skip) when the test server cannot be reached."""
    _connect().close()


def drop_schema(url: str) -> None:
    """Drop the test schema named in ``url`` (only ``tsgt_*`` schemas, never anything else)."""
    match = _SCHEMA.search(url)
    if match is None:
        raise ValueError("not a test ledger URL")
    conn = _connect()
    try:
        conn.execute("SET lock_timeout = '20s'")
        conn.execute(f'DROP SCHEMA IF EXISTS "{match.group(1)}" CASCADE')
    finally:
        conn.close()


def pg_schema_exists(url: str) -> bool:
    """Whether the test schema named in ``url`` exists."""
    match = _SCHEMA.search(url)
    if match is None:
        raise ValueError("not a test ledger URL")
    conn = _connect()
    try:
        row = conn.execute(
            "SELECT count(*) FROM pg_namespace WHERE nspname = %s", (match.group(1),)
        ).fetchone()
    finally:
        conn.close()
    return bool(row and row[0])


def stored_state(target: str) -> dict[str, str]:
    """A digest of everything stored for the ledger at ``target``: for SQLite each file of its
    directory (the database and its sidecars, byte for byte), for PostgreSQL each table of its
    schema row by row with every row version's ``xmin`` and ``ctid`` (any write, even one that
    stores equal values, makes a new row version). Equal digests: nothing was written."""
    if not target.startswith(("postgresql://", "postgres://")):
        folder = Path(target).parent
        return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
                for p in sorted(folder.iterdir()) if p.is_file()}
    match = _SCHEMA.search(target)
    if match is None:
        raise ValueError("not a test ledger URL")
    schema = match.group(1)
    conn = _connect()
    try:
        tables = [row[0] for row in conn.execute(
            "SELECT relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relkind = 'r' ORDER BY relname", (schema,)
        ).fetchall()]
        digests = {}
        for table in tables:
            rows = conn.execute(
                f'SELECT xmin::text, ctid::text, t::text FROM "{schema}"."{table}" t '
                "ORDER BY ctid"
            ).fetchall()
            digests[table] = hashlib.sha256(repr(rows).encode()).hexdigest()
    finally:
        conn.close()
    return digests


def stored_bytes(target: str) -> bytes:
    """Everything stored for the ledger at ``target``, raw: for SQLite the database file and
    its sidecars byte for byte, for PostgreSQL every row of every table of its schema as
    text. A privacy check asserts that a secret is not among these bytes."""
    if not target.startswith(("postgresql://", "postgres://")):
        data = b""
        for suffix in ("", "-wal", "-shm", "-journal"):
            path = Path(target + suffix)
            if path.exists():
                data += path.read_bytes()
        return data
    match = _SCHEMA.search(target)
    if match is None:
        raise ValueError("not a test ledger URL")
    schema = match.group(1)
    conn = _connect()
    try:
        tables = [row[0] for row in conn.execute(
            "SELECT relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relkind = 'r' ORDER BY relname", (schema,)
        ).fetchall()]
        assert tables, f"no tables in schema {schema}"
        parts = []
        for table in tables:
            rows = conn.execute(f'SELECT t::text FROM "{schema}"."{table}" t').fetchall()
            parts += [f"{table}:{row[0]}" for row in rows]
    finally:
        conn.close()
    return "\n".join(parts).encode()


def write_raw(target: str, sql: str, params: tuple[object, ...] = ()) -> None:
    """Run one statement straight against the ledger's storage, bypassing the ledger (a test's
    tampering): ``?`` placeholders, table names unqualified. SQLite: the database file;
    PostgreSQL: the test schema named in ``target``."""
    if not target.startswith(("postgresql://", "postgres://")):
        lite = sqlite3.connect(target)
        try:
            lite.execute(sql, params)
            lite.commit()
        finally:
            lite.close()
        return
    match = _SCHEMA.search(target)
    if match is None:
        raise ValueError("not a test ledger URL")
    conn = _connect()
    try:
        conn.execute(f'SET search_path TO "{match.group(1)}"')
        conn.execute(sql.replace("?", "%s"), params)  # type: ignore[arg-type]
    finally:
        conn.close()


def write_transactions(target: str) -> tuple[object, int]:
    """How many transactions have written the ledger at ``target``, read from its storage
    (never through the ledger): ``(epoch, count)``; two counts compare only in one epoch.

    SQLite: the commit frames of the database's WAL (the epoch is the WAL header's checkpoint
    sequence and salts: a checkpoint that restarts the WAL starts a new epoch); every committed
    write transaction appends exactly one. PostgreSQL: the distinct transactions (``xmin``)
    among the event rows of the ledger's schema; every change of a task's state or delivery
    writes its event in the same statement, so each transaction that changed a state counts
    once, and one that changed none (a heartbeat) does not."""
    if not target.startswith(("postgresql://", "postgres://")):
        wal = Path(target + "-wal")
        data = wal.read_bytes() if wal.exists() else b""
        if len(data) < 32:
            return None, 0
        page_size, sequence, salts = (int.from_bytes(data[8:12], "big"),
                                      int.from_bytes(data[12:16], "big"), data[16:24])
        commits = 0
        for offset in range(32, len(data) - 24 - page_size + 1, 24 + page_size):
            header = data[offset:offset + 24]
            if header[8:16] != salts:  # a frame of an earlier epoch: the end of this one
                break
            commits += int.from_bytes(header[4:8], "big") != 0  # a commit frame
        return (sequence, salts), commits
    match = _SCHEMA.search(target)
    if match is None:
        raise ValueError("not a test ledger URL")
    conn = _connect()
    try:
        row = conn.execute(
            f'SELECT count(DISTINCT xmin::text) FROM "{match.group(1)}".tsg_events'
        ).fetchone()
    finally:
        conn.close()
    return "postgresql", int(row[0]) if row else 0


@contextmanager
def ledger_target(backend: str, directory: Path) -> Iterator[str]:
    """A fresh, empty ledger location on ``backend``: a path under ``directory`` (not created)
    or a URL with a schema of its own, dropped afterwards."""
    if backend == "sqlite":
        yield str(directory / "ledger" / "tasks.sqlite")
        return
    if backend != "postgresql":
        raise ValueError("unknown backend")
    require_postgresql()
    url = pg_url(new_schema())
    try:
        yield url
    finally:
        for attempt in range(3):  # a killed worker's session may still hold a lock for a moment
            try:
                drop_schema(url)
                break
            except Exception:
                if attempt == 2:
                    raise
                time.sleep(0.5)
