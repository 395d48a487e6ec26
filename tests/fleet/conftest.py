"""Fixtures of the fleet tests: one PostgreSQL ledger shared by several "hosts".

A host is one process group (killed together with SIGKILL, as a vanished machine would be);
the Celery and Dramatiq harnesses of tests/celery and tests/dramatiq start its workers.
PostgreSQL, Redis and RabbitMQ are required: a missing service fails, never skips.
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent.parent
for sub in ("core", "celery", "dramatiq", "langgraph"):
    if str(TESTS / sub) not in sys.path:
        sys.path.insert(0, str(TESTS / sub))

import ledger_backends  # noqa: E402


def _require(port: int, what: str) -> None:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except OSError as exc:
        pytest.fail(f"{what} is required at 127.0.0.1:{port} for tests/fleet: {exc!r}")


@pytest.fixture
def pg_ledger(tmp_path: Path) -> Iterator[str]:
    """A fresh PostgreSQL ledger URL (a schema of its own, dropped after the test)."""
    with ledger_backends.ledger_target("postgresql", tmp_path) as url:
        yield url


@pytest.fixture
def brokers() -> None:
    _require(6379, "Redis")  # Celery's result backend
    _require(5672, "RabbitMQ")  # both brokers: redelivers the moment a consumer's link dies
