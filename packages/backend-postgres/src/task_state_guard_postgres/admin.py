"""Dropping ledgers: one schema, or the leftovers of killed runs (tests, throw-away ledgers).

Only schemas that hold a ledger (a ``tsg_migrations`` table) are ever dropped by
:func:`drop_stale_schemas`; :func:`drop_schema` drops the URL's schema whatever it holds.
"""

from __future__ import annotations

import re
import time

from task_state_guard.model import InvalidInput

from . import driver
from .url import parse

_PREFIX = re.compile(r"[a-z_][a-z0-9_]{0,40}")


def drop_schema(url: str) -> bool:
    """Drop the URL's schema and everything in it; True if it existed."""
    target = parse(url)
    conn = driver.connect(target, busy_timeout_ms=30_000, read_only=False)
    try:
        found = conn.run(
            "SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = %(schema)s",
            {"schema": target.schema},
        ).fetchone()
        conn.execute(f'DROP SCHEMA IF EXISTS "{target.schema}" CASCADE')
        return found is not None
    finally:
        conn.close()


def drop_stale_schemas(url: str, prefix: str, *, older_than_seconds: float) -> int:
    """Drop every ledger schema named ``prefix*`` created more than ``older_than_seconds``
    ago (by its own clock record); return how many were dropped."""
    if not _PREFIX.fullmatch(prefix):
        raise InvalidInput("prefix must match [a-z_][a-z0-9_]{0,40}")
    cutoff = time.time() - float(older_than_seconds)
    conn = driver.connect(parse(url), busy_timeout_ms=30_000, read_only=False)
    dropped = 0
    try:
        names = [
            row[0] for row in conn.run(
                "SELECT n.nspname FROM pg_catalog.pg_namespace n "
                "JOIN pg_catalog.pg_tables t ON t.schemaname = n.nspname "
                "AND t.tablename = 'tsg_meta' WHERE starts_with(n.nspname, %(prefix)s)",
                {"prefix": prefix},
            ).fetchall()
        ]
        for name in names:
            row = conn.execute(
                f"SELECT value FROM \"{name}\".tsg_meta WHERE key = 'created_at'"
            ).fetchone()
            try:
                created = float(row[0]) if row is not None else 0.0
            except ValueError:
                created = 0.0
            if created < cutoff:
                conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
                dropped += 1
    finally:
        conn.close()
    return dropped


__all__ = ["drop_schema", "drop_stale_schemas"]
