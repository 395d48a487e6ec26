"""The connection budget of a PostgreSQL ledger: one statement connection per process, whatever
its number of threads, plus the owner lock's; a write blocked by another session's lock gets a
connection of its own, given back when the block ends."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest
from pg_fixtures import PG_BASE
from pg_sessions import PeakSessions, count_sessions, session_name, settled
from task_state_guard import InvalidInput, Ledger

THREADS = 20
ROUNDS = 15


def _work(
    ledger: Ledger, start: threading.Barrier, owner: bool, errors: list[BaseException]
) -> None:
    try:
        start.wait(30)
        for _ in range(ROUNDS):
            task = ledger.create_task()
            ledger.start_task(task.id, owner=owner)
            ledger.heartbeat_many([task.id])
            with ledger.atomic():
                ledger.get_task(task.id)
                ledger.close_task(task.id, "succeeded")
            ledger.list_tasks(limit=5)
    except BaseException as exc:  # reported by the test
        errors.append(exc)


def _run_threads(ledger: Ledger, owner: bool) -> None:
    start = threading.Barrier(THREADS)
    errors: list[BaseException] = []
    threads = [
        threading.Thread(target=_work, args=(ledger, start, owner, errors)) for _ in range(THREADS)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert errors == []


def test_twenty_threads_share_one_statement_connection(pg_url: str) -> None:
    name = session_name()
    with Ledger(f"{pg_url}&application_name={name}") as ledger, PeakSessions(name) as seen:
        _run_threads(ledger, owner=False)
        assert settled(name, 1) == 1
        _run_threads(ledger, owner=True)  # the owner's lock session comes on top
        assert settled(name, 2) == 2
        assert ledger.status()["tasks"]["succeeded"] == 2 * THREADS * ROUNDS
    assert seen.samples > 10
    assert 1 <= seen.peak <= 2
    # Closing the ledger closed its statement connection; the owner's lock session lives as
    # long as the process (its tasks stay owned).
    assert settled(name, 1) == 1


def _hold_row(url: str, task_id: str, locked: threading.Event, release: threading.Event) -> None:
    schema = url.split("schema=", 1)[1].split("&", 1)[0]
    with psycopg.connect(PG_BASE) as conn:
        conn.execute(f'SELECT 1 FROM "{schema}".tsg_tasks WHERE id = %s FOR UPDATE', (task_id,))
        locked.set()
        release.wait(60)


def test_a_blocked_write_holds_up_its_own_thread_only(pg_url: str) -> None:
    name = session_name()
    with Ledger(f"{pg_url}&application_name={name}", busy_timeout_ms=60000) as ledger:
        task = ledger.create_task()
        ledger.start_task(task.id, owner=False)
        locked, release = threading.Event(), threading.Event()
        holder = threading.Thread(target=_hold_row, args=(pg_url, task.id, locked, release))
        holder.start()
        closed: list[str] = []
        try:
            assert locked.wait(30)
            closer = threading.Thread(
                target=lambda: closed.append(str(ledger.close_task(task.id, "succeeded").status))
            )
            closer.start()
            deadline = time.monotonic() + 30
            while not _waiting_for_a_lock(name):  # the close holds the kept connection, waiting
                assert time.monotonic() < deadline
                time.sleep(0.02)
            with ledger.atomic():  # waits past the stall, then runs on an extra connection
                other = ledger.create_task()
                assert count_sessions(name) == 2  # the kept one (blocked) and this extra one
            assert str(ledger.get_task(other.id).status) == "queued"
            assert closed == []
            assert settled(name, 1) == 1  # each extra closed when its write was done
        finally:
            release.set()
            holder.join(30)
        closer.join(30)
        assert closed == ["succeeded"]
        assert settled(name, 1) == 1  # back to the budget once the block ended
        ledger.create_task()
        assert count_sessions(name) == 1


def _waiting_for_a_lock(name: str) -> bool:
    with psycopg.connect(PG_BASE, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s"
            " AND wait_event_type = 'Lock'",
            (name,),
        ).fetchone()
    return bool(row and row[0])


def test_the_url_sets_how_many_statement_connections_a_process_keeps(pg_url: str) -> None:
    name = session_name()
    inside, leave = threading.Barrier(4), threading.Event()

    def hold(ledger: Ledger) -> None:
        with ledger.atomic():  # a transaction holds its connection until it ends
            ledger.create_task()
            inside.wait(30)
            leave.wait(30)

    with Ledger(f"{pg_url}&connections=3&application_name={name}") as ledger:
        threads = [threading.Thread(target=hold, args=(ledger,)) for _ in range(3)]
        for thread in threads:
            thread.start()
        inside.wait(30)  # three transactions at once, none waited for a connection
        assert count_sessions(name) == 3
        leave.set()
        for thread in threads:
            thread.join(30)
        _run_threads(ledger, owner=False)
        assert ledger.status()["tasks"]["succeeded"] == THREADS * ROUNDS
        assert settled(name, 3) == 3  # all three kept, never more


@pytest.mark.parametrize("value", ["0", "65", "-1", "1.5", "", "x", "٣", "1&connections=2"])
def test_a_bad_connections_parameter_is_refused_and_creates_nothing(
    pg_url: str, value: str
) -> None:
    with pytest.raises(InvalidInput) as err:
        Ledger(f"{pg_url}&connections={value}")
    assert err.value.reason == "invalid_database_path"
    assert "connections must be one whole number from 1 to 64" in str(err.value)
    schema = pg_url.split("schema=", 1)[1]
    with psycopg.connect(PG_BASE, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM information_schema.schemata WHERE schema_name = %s", (schema,)
        ).fetchone()
    assert row == (0,)


def _hold_transactions(ledger: Ledger, count: int, during: Callable[[], None]) -> None:
    """``count`` threads each hold a transaction (so a connection) open at once while
    ``during`` runs, then end them."""
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
        during()
    finally:
        leave.set()
        for thread in threads:
            thread.join(60)


def test_the_opener_sets_the_connections_a_url_leaves_unset(pg_url: str) -> None:
    name = session_name()
    with Ledger(f"{pg_url}&application_name={name}", connections=3) as ledger:
        _hold_transactions(ledger, 3, lambda: None)
        assert settled(name, 3) == 3  # all three kept
        _run_threads(ledger, owner=False)
        assert settled(name, 3) == 3  # never more
    assert settled(name, 0) == 0


def test_the_urls_connections_win_over_the_openers(pg_url: str) -> None:
    name = session_name()
    url = f"{pg_url}&connections=1&application_name={name}"
    with Ledger(url, connections=3) as ledger:
        # Two of the three waited past the stall and ran on extra connections of their own.
        _hold_transactions(ledger, 3, lambda: None)
        assert settled(name, 1) == 1  # the extras closed: the URL's one is kept


@pytest.mark.parametrize("value", [0, 65, -1, True, 1.5, "2"])
def test_a_bad_connections_option_is_refused(pg_url: str, tmp_path: Path, value: object) -> None:
    for target in (pg_url, str(tmp_path / "tasks.sqlite")):
        with pytest.raises(InvalidInput, match="connections must be None or a whole number"):
            Ledger(target, connections=value)  # type: ignore[arg-type]
    assert not (tmp_path / "tasks.sqlite").exists()


def test_a_sqlite_ledger_ignores_the_connections_option(tmp_path: Path) -> None:
    with Ledger(tmp_path / "tasks.sqlite", connections=8) as ledger:
        _hold_transactions(ledger, 1, lambda: None)
        assert ledger.status()["tasks"]["queued"] == 1
