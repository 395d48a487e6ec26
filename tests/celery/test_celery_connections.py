"""A Celery worker on a PostgreSQL ledger: with the threads pool its main process keeps one
statement connection per pool thread (``--concurrency``); with any other pool one (a prefork
child runs one job at a time); a URL's ``connections=`` wins."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import task_state_guard_celery as tsgc
from celery import Celery  # type: ignore[import-untyped]
from celery._state import (  # type: ignore[import-untyped]
    _set_task_join_will_block,
    task_join_will_block,
)
from ledger_backends import ledger_target
from pg_sessions import count_sessions, session_name, settled
from task_state_guard import Ledger

CONCURRENCY = 4


@pytest.fixture
def pg_target(tmp_path: Path) -> Iterator[str]:
    with ledger_target("postgresql", tmp_path) as url:
        yield url


@pytest.fixture(autouse=True)
def _joins_stay_allowed() -> Iterator[None]:
    """A WorkController made in this process marks it a pool process (prefork: a result's
    ``get()`` would block the pool), as Celery's own ``start_worker`` does and undoes: undo
    it, or every later test of the session that waits for a result is refused."""
    before = task_join_will_block()
    try:
        yield
    finally:
        _set_task_join_will_block(before)


def _hold_transactions(ledger: Ledger, count: int) -> None:
    """``count`` threads each hold a transaction (so a connection) open at once, then end."""
    inside, leave = threading.Barrier(count + 1), threading.Event()

    def hold() -> None:
        with ledger.atomic():
            ledger.create_task()
            inside.wait(60)
            leave.wait(60)

    threads = [threading.Thread(target=hold) for _ in range(count)]
    for thread in threads:
        thread.start()
    try:
        inside.wait(60)
    finally:
        leave.set()
        for thread in threads:
            thread.join(60)


@pytest.mark.parametrize(
    ("pool", "query", "kept"),
    [("threads", "", CONCURRENCY), ("prefork", "", 1), ("threads", "&connections=2", 2)],
)
def test_the_worker_boot_sizes_the_statement_connections(
    pg_target: str, pool: str, query: str, kept: int
) -> None:
    name = session_name()
    app = Celery(
        f"conn-{pool}", broker="memory://", backend="cache+memory://", set_as_current=False
    )
    guard = tsgc.install(app, db=f"{pg_target}{query}&application_name={name}")
    worker = app.WorkController(pool_cls=pool, concurrency=CONCURRENCY, hostname=f"{name}@h")
    step = tsgc.ReconcileOnBoot(worker)
    try:
        step.start(worker)  # opens the main process's ledger, sized for its pool
        _hold_transactions(guard.ledger, CONCURRENCY)
        assert settled(name, kept) == kept  # kept for the next jobs; the extras closed
        assert count_sessions(name) == kept
    finally:
        step.stop(worker)
        tsgc.uninstall(app)
