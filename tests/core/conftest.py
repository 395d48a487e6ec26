"""Fixtures for the core tests: an injected clock and a private ledger on each backend.

``db`` is a SQLite path in the test's directory or a PostgreSQL URL with a schema of its own
(the root conftest's backend matrix). Tests of SQLite storage itself live in ``tests/sqlite``;
a test here that runs on SQLite alone carries ``sqlite_only`` with its reason."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from core_helpers import Clock
from task_state_guard import Ledger


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def db(ledger_target: str) -> str:
    return ledger_target


@pytest.fixture
def ledger(db: str, clock: Clock) -> Iterator[Ledger]:
    with Ledger(db, clock=clock) as led:
        yield led
