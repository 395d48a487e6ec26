"""Fixtures for the LangGraph adapter tests (real graphs, real SqliteSaver, real ledger).

A test that takes ``db`` or ``stores`` runs once per ledger backend (``[sqlite]``: a file in
the test's private directory, ``[postgresql]``: a URL naming a schema of its own)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.sqlite import SqliteSaver
from lg_procs import Stores, checkpoint_database
from pg_fixtures import fresh_pg_url


@pytest.fixture
def work(tmp_path: Path) -> Path:
    """A private directory for the ledger and the checkpointer."""
    d = tmp_path / "lg"
    d.mkdir(mode=0o700)
    return d


@pytest.fixture
def db(backend: str, work: Path, ledger_target: str) -> str:
    """The test's ledger on its backend (the checkpointer stays SQLite: ``saver``)."""
    return str(work / "tasks.sqlite") if backend == "sqlite" else ledger_target


@pytest.fixture
def stores(backend: str, work: Path) -> Iterator[Stores]:
    """A ledger and a checkpointer for real processes: SQLite files, or a PostgreSQL ledger
    (a schema of its own) and a PostgreSQL checkpoint database."""
    if backend == "sqlite":
        yield Stores(str(work / "tasks.sqlite"), str(work / "checkpoints.sqlite"), work)
        return
    with fresh_pg_url() as url, checkpoint_database() as checkpoints:
        yield Stores(url, checkpoints, work)


@pytest.fixture
def saver(work: Path) -> Iterator[SqliteSaver]:
    conn = sqlite3.connect(str(work / "checkpoints.sqlite"), check_same_thread=False)
    try:
        yield SqliteSaver(conn)
    finally:
        conn.close()


@pytest.fixture
def apps() -> Iterator[list[Any]]:
    """Guarded graphs registered here are closed after the test (stops heartbeat threads)."""
    made: list[Any] = []
    yield made
    for app in made:
        app.close()
