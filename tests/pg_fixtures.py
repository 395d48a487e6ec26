"""PostgreSQL ledgers for tests: a fresh schema per test, dropped afterwards.

Loaded for the whole suite by ``tests/conftest.py`` (``pytest_plugins``), so any test
directory can ask for ``pg_url`` (a URL whose ``schema=`` is new and empty) or call
``fresh_pg_url()``. Leftover schemas of killed runs (``tsgt_<creation time>_*``, older than
an hour by their name) are dropped once per session. The server is ``TSG_TEST_PG`` (default:
the CI machine's trust-auth PostgreSQL 15 on 127.0.0.1:5432, database ``test``); a server
that cannot be reached fails the test, never skips it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import ledger_backends
import pytest

PG_BASE = os.environ.get("TSG_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
PREFIX = ledger_backends.SCHEMA_PREFIX
_STALE_SECONDS = 3600.0


def new_pg_url(base: str = PG_BASE) -> str:
    """A URL naming a schema nobody has used (created on the first writable open)."""
    sep = "&" if "?" in base else "?"
    return f"{base}{sep}schema={ledger_backends.new_schema()}"


def drop_pg_url(url: str) -> None:
    """Drop the URL's schema (and everything in it)."""
    from task_state_guard_postgres import drop_schema

    drop_schema(url)


@contextmanager
def fresh_pg_url(base: str = PG_BASE) -> Iterator[str]:
    """Yield a fresh schema's URL; drop the schema afterwards."""
    url = new_pg_url(base)
    try:
        yield url
    finally:
        drop_pg_url(url)


@pytest.fixture(scope="session")
def pg_stale_cleanup() -> None:
    """Drop the ledger schemas that killed runs left behind (once per session)."""
    ledger_backends.drop_stale_schemas(PG_BASE, older_than_seconds=_STALE_SECONDS)


@pytest.fixture
def pg_url(pg_stale_cleanup: None) -> Iterator[str]:
    """A fresh PostgreSQL ledger URL (own schema), dropped after the test."""
    with fresh_pg_url() as url:
        yield url
