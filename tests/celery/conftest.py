"""Fixtures of the Celery adapter tests (helpers live in celery_harness.py)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))

from celery_harness import REDIS_DB, Scenario


@pytest.fixture(scope="session", autouse=True)
def _redis_required() -> None:
    """Redis is required: a missing broker is a failure, never a skip."""
    client = redis.Redis(host="127.0.0.1", port=6379, db=REDIS_DB, socket_connect_timeout=2)
    try:
        assert client.ping()
    except redis.exceptions.ConnectionError as exc:
        pytest.fail(f"Redis is required at 127.0.0.1:6379 for tests/celery: {exc}")
    finally:
        client.close()


@pytest.fixture
def scenario(tmp_path: Path) -> Iterator[Scenario]:
    sc = Scenario(tmp_path)
    try:
        yield sc
    finally:
        sc.close()
