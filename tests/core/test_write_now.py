"""``AdapterRuntime.write_now``: a write transaction for a thread that must never wait (an
event loop's), begun at once or not at all.

On SQLite it begins when the ledger's write lock is free, and yields False, with nothing
begun, when another connection holds that lock or another thread of the process is writing;
a PostgreSQL ledger (each write a round trip to its server) and a ledger this process has not
opened yet always yield False. The block's writes commit together at its end; a nested
``atomic()`` block that fails undoes its own writes only; and a ledger written only this way
still has its WAL checkpointed into the database file."""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator

import pytest
from task_state_guard import Ledger, StorageError, TaskNotFound
from task_state_guard.integration import AdapterRuntime, resolve_settings
from task_state_guard.sqlite.connections import NOW_CHECKPOINT_TRANSACTIONS

#: The ledger's busy timeout: a write that waited for a lock held by the test's own thread
#: would fail with ``LedgerBusy`` after it (the lock is never released meanwhile).
BUSY_TIMEOUT_MS = 2000


def _runtime(ledger: Ledger) -> AdapterRuntime:
    settings = resolve_settings(db_required=False, heartbeat_seconds=0)
    return AdapterRuntime(settings, logger=logging.getLogger("test.write_now"), ledger=ledger)


@pytest.fixture
def led(db: str) -> Iterator[Ledger]:
    with Ledger(db, busy_timeout_ms=BUSY_TIMEOUT_MS) as opened:
        yield opened


def _exists(ledger: Ledger, task_id: str) -> bool:
    try:
        ledger.get_task(task_id)
    except TaskNotFound:
        return False
    return True


def test_a_sqlite_ledger_begins_at_once_and_a_postgresql_one_never(
        backend: str, led: Ledger) -> None:
    rt = _runtime(led)
    first, second = str(uuid.uuid4()), str(uuid.uuid4())
    with rt.write_now() as began:
        if began:
            led.create_task(task_id=first)
            led.create_task(task_id=second)
    assert began is (backend == "sqlite")
    assert (_exists(led, first), _exists(led, second)) == (began, began)


@pytest.mark.sqlite_only(reason="another connection holds the SQLite file's write lock")
def test_nothing_begins_while_another_connection_holds_the_write_lock(led: Ledger) -> None:
    rt = _runtime(led)
    led.create_task(task_id=str(uuid.uuid4()))  # opened and written: the file exists
    other = sqlite3.connect(led.path, isolation_level=None)
    task_id = str(uuid.uuid4())
    try:
        other.execute("BEGIN IMMEDIATE")
        with rt.write_now() as began:
            assert began is False
        other.execute("COMMIT")
        with rt.write_now() as began:
            assert began is True
            led.create_task(task_id=task_id)
    finally:
        other.close()
    assert _exists(led, task_id)
    assert rt.stats()["errors"] == {}


@pytest.mark.sqlite_only(reason="threads of one process share its SQLite writer lock")
def test_nothing_begins_while_another_thread_of_the_process_writes(led: Ledger) -> None:
    rt = _runtime(led)
    inside, leave = threading.Event(), threading.Event()

    def writer() -> None:
        with led.atomic():
            led.create_task(task_id=str(uuid.uuid4()))
            inside.set()
            leave.wait(30)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        assert inside.wait(30)
        with rt.write_now() as began:
            assert began is False
    finally:
        leave.set()
        thread.join(30)
    with rt.write_now() as began:
        assert began is True


def test_a_ledger_not_opened_in_this_process_never_begins(backend: str, db: str) -> None:
    settings = resolve_settings(db=db, heartbeat_seconds=0)
    rt = AdapterRuntime(settings, logger=logging.getLogger("test.write_now"))
    try:
        with rt.write_now() as began:
            assert began is False  # opening it (creating, migrating) could wait
        rt.check_ledger()
        with rt.write_now() as began:
            assert began is (backend == "sqlite")
    finally:
        rt.close()


@pytest.mark.sqlite_only(reason="PostgreSQL ledgers never write this way")
def test_an_error_in_the_block_rolls_all_of_it_back(led: Ledger) -> None:
    rt = _runtime(led)
    task_id = str(uuid.uuid4())
    with pytest.raises(RuntimeError), rt.write_now() as began:
        assert began
        led.create_task(task_id=task_id)
        raise RuntimeError("the block fails")
    assert not _exists(led, task_id)
    with rt.write_now() as began:  # the lock was let go
        assert began is True


@pytest.mark.sqlite_only(reason="PostgreSQL ledgers never write this way")
def test_a_failed_nested_block_undoes_its_own_writes_only(led: Ledger) -> None:
    rt = _runtime(led)
    kept, undone, after = (str(uuid.uuid4()) for _ in range(3))
    with rt.write_now() as began:
        assert began
        led.create_task(task_id=kept)
        with pytest.raises(StorageError), led.atomic():
            led.create_task(task_id=undone)
            raise StorageError("the nested write failed")
        led.create_task(task_id=after)
    assert (_exists(led, kept), _exists(led, undone), _exists(led, after)) == (
        True, False, True)


@pytest.mark.sqlite_only(reason="the WAL of a SQLite ledger")
def test_a_ledger_written_only_this_way_is_still_checkpointed(led: Ledger) -> None:
    rt = _runtime(led)
    led.create_task(task_id=str(uuid.uuid4()))
    size = os.path.getsize(led.path)
    # No other connection writes: only the checkpoints of write_now's connection move the
    # WAL's pages into the database file, which then grows.
    written = 0
    while written < 2 * NOW_CHECKPOINT_TRANSACTIONS:
        with rt.write_now() as began:
            if began:  # not while the checkpoint holds the writer lock
                led.create_task(task_id=str(uuid.uuid4()), name="x" * 200)
                written += 1
    for _ in range(3000):  # the checkpoint runs on a thread of its own
        if os.path.getsize(led.path) > size:
            break
        time.sleep(0.01)
    assert os.path.getsize(led.path) > size
