"""Fixtures for the core tests: an injected clock and a private ledger path."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from core_helpers import Clock
from task_state_guard import Ledger


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def db(tmp_path: Path) -> str:
    return str(tmp_path / "ledger" / "tasks.sqlite")


@pytest.fixture
def ledger(db: str, clock: Clock) -> Iterator[Ledger]:
    with Ledger(db, clock=clock) as led:
        yield led
