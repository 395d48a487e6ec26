"""Fixtures of the Dramatiq adapter suite: real Redis and RabbitMQ on 127.0.0.1 (never skipped).

A test that takes ``redis_env`` or ``rabbit_env`` runs once per ledger backend (``[sqlite]``,
``[postgresql]``): its workers get the ledger through ``TSG_DB``, a SQLite path or a
PostgreSQL URL naming a schema of the test's own."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pika  # type: ignore[import-untyped]
import pytest
import redis
from _dramatiq_helpers import RABBIT_URL, REDIS_URL, BrokerEnv


@pytest.fixture(scope="session")
def redis_available() -> None:
    try:
        client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2)
        client.ping()
        client.close()
    except Exception as exc:  # a missing broker is a failure, not a skip
        pytest.fail(f"Redis is required at 127.0.0.1:6379 for the Dramatiq suite: {exc!r}")


@pytest.fixture(scope="session")
def rabbit_available() -> None:
    try:
        params = pika.URLParameters(RABBIT_URL)
        params.socket_timeout = 3
        pika.BlockingConnection(params).close()
    except Exception as exc:
        pytest.fail(f"RabbitMQ is required at 127.0.0.1:5672 for the Dramatiq suite: {exc!r}")


@pytest.fixture
def redis_env(tmp_path: Path, ledger_target: str, redis_available: None) -> Iterator[BrokerEnv]:
    env = BrokerEnv.new("redis", tmp_path, ledger_target)
    yield env
    env.cleanup()


@pytest.fixture
def rabbit_env(tmp_path: Path, ledger_target: str, rabbit_available: None) -> Iterator[BrokerEnv]:
    env = BrokerEnv.new("rabbitmq", tmp_path, ledger_target)
    yield env
    env.cleanup()
