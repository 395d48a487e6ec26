"""Fixtures of the Dramatiq adapter suite: real Redis and RabbitMQ on 127.0.0.1 (never skipped)."""

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
def redis_env(tmp_path: Path, redis_available: None) -> Iterator[BrokerEnv]:
    env = BrokerEnv.new("redis", tmp_path)
    yield env
    env.cleanup()


@pytest.fixture
def rabbit_env(tmp_path: Path, rabbit_available: None) -> Iterator[BrokerEnv]:
    env = BrokerEnv.new("rabbitmq", tmp_path)
    yield env
    env.cleanup()
