"""Fixtures of the Celery adapter tests (helpers live in celery_harness.py).

``scenario`` and ``any_broker`` run their test once per ledger backend (``[sqlite]``,
``[postgresql]``): the scenario's workers and the test share that ledger."""

from __future__ import annotations

import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))

from celery_harness import BROKER, REDIS_DB, Scenario, ledger_on

RABBIT_BROKER = "amqp://guest:guest@127.0.0.1:5672//"


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
def scenario(tmp_path: Path, backend: str) -> Iterator[Scenario]:
    with ledger_on(backend, tmp_path) as db:
        sc = Scenario(tmp_path, db=db)
        try:
            yield sc
        finally:
            sc.close()


@pytest.fixture(params=["redis", "rabbitmq"])
def any_broker(request: pytest.FixtureRequest, tmp_path: Path, backend: str) -> Iterator[Scenario]:
    """A scenario on Redis, then the same on RabbitMQ (py-amqp), where the broker itself
    redelivers unacknowledged messages the moment a consumer's connection dies."""
    broker = BROKER
    if request.param == "rabbitmq":
        try:  # required (CI starts it): a missing broker fails, never skips
            socket.create_connection(("127.0.0.1", 5672), timeout=2).close()
        except OSError as exc:
            pytest.fail(f"RabbitMQ is required at 127.0.0.1:5672 for tests/celery: {exc!r}")
        broker = RABBIT_BROKER
    with ledger_on(backend, tmp_path) as db:
        sc = Scenario(tmp_path, db=db, broker=broker)
        try:
            yield sc
        finally:
            sc.close()
