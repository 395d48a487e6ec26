"""A Dramatiq worker on a PostgreSQL ledger keeps one statement connection per worker thread
(the adapter sizes the process's budget to ``worker_threads`` plus the consumer thread, whose
ack hooks write), unless the URL sets
``connections=``."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import dramatiq
import pytest
from dramatiq.brokers.stub import StubBroker
from ledger_backends import ledger_target
from pg_sessions import count_sessions, session_name, settled
from task_state_guard_dramatiq import install
from test_dramatiq_programmatic import start_worker

THREADS = 4


@pytest.fixture
def pg_target(tmp_path: Path) -> Iterator[str]:
    with ledger_target("postgresql", tmp_path) as url:
        yield url


def _sessions_of_a_busy_worker(url: str, name: str, kept: int) -> tuple[int, int]:
    """Run a ``THREADS``-thread worker whose actors each hold a ledger transaction open at
    once: the sessions of ``name`` meanwhile, and once the worker is idle again (waiting up to
    10 s for them to settle at ``kept``)."""
    broker = StubBroker(fail_fast_default=False)
    guard = install(broker, db=url, strict=True, busy_timeout_ms=60000)
    dramatiq.set_broker(broker)
    inside, leave = threading.Barrier(THREADS + 1), threading.Event()

    @dramatiq.actor(broker=broker, max_retries=0)
    def hold() -> None:
        with guard.ledger.atomic():  # this thread's statement connection, held
            guard.ledger.create_task()
            inside.wait(60)
            leave.wait(60)

    worker = dramatiq.Worker(broker, worker_threads=THREADS, worker_timeout=50)
    start_worker(worker)
    try:
        for _ in range(THREADS):
            hold.send()
        inside.wait(60)
        during = count_sessions(name)
        leave.set()
        broker.join(hold.queue_name)
        worker.join()
        after = settled(name, kept)
    finally:
        leave.set()
        worker.stop()
        broker.close()
        guard.close()
    return during, after


def test_a_worker_keeps_a_statement_connection_per_thread(pg_target: str) -> None:
    name = session_name()
    url = f"{pg_target}&application_name={name}"
    during, after = _sessions_of_a_busy_worker(url, name, THREADS + 1)
    # Four held transactions, and the owner lock's session (the worker's running messages).
    assert during == THREADS + 1
    assert after == THREADS + 1  # all kept for the next messages


def test_the_urls_connections_win_over_the_worker_threads(pg_target: str) -> None:
    name = session_name()
    url = f"{pg_target}&connections=1&application_name={name}"
    during, after = _sessions_of_a_busy_worker(url, name, 2)
    # Three actors waited past the stall for the one kept connection and opened extras...
    assert during == THREADS + 1
    assert after == 2  # ...closed when done: the URL's one connection and the owner lock
