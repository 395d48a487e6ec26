"""A guard that cannot guard says so at worker start: each worker process of the real
``dramatiq`` CLI logs an unusable ledger once at ERROR with its fixed reason and processes its
messages with nothing recorded; ``require_ledger`` makes the worker refuse to start."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from _dramatiq_helpers import BrokerEnv, CliWorker, Producer, wait_for

UNUSABLE = ("task-state-guard: the ledger cannot be used at worker start (UnsafeLocation, "
            "reason directory_writable_by_others)")


def _unusable(env: BrokerEnv, tmp_path: Path) -> str:
    directory = tmp_path / "group-writable"
    directory.mkdir()
    os.chmod(directory, 0o770)  # tsg refuses it: others could swap the ledger
    return str(directory / "tasks.sqlite")


@pytest.mark.sqlite_only(reason="a SQLite directory others could write")
def test_an_unusable_ledger_is_logged_once_per_process(redis_env: BrokerEnv,
                                                       tmp_path: Path) -> None:
    db = _unusable(redis_env, tmp_path)
    worker = CliWorker(redis_env, extra_env={"TSG_DB": db}).start()
    producer = Producer(redis_env)
    try:
        tag = "health"
        producer.send("crash_once", tag, 0.0)
        wait_for((redis_env.scratch / f"pid-{tag}-1").exists, 30, "the message to run")
        log = worker.log()
        lines = [line for line in log.splitlines() if "the ledger cannot be used" in line]
        assert len(lines) == worker.processes, log  # once per worker process, at its start
        assert all(UNUSABLE in line and "ERROR" in line for line in lines), log
        assert db not in log and "group-writable" not in log
        assert not os.path.exists(db)
    finally:
        producer.close()
        worker.stop()


@pytest.mark.sqlite_only(reason="a SQLite directory others could write")
def test_require_ledger_refuses_to_start_the_worker(redis_env: BrokerEnv,
                                                    tmp_path: Path) -> None:
    db = _unusable(redis_env, tmp_path)
    worker = CliWorker(redis_env, extra_env={"TSG_DB": db, "TSG_REQUIRE_LEDGER": "1"})
    worker.start(wait=False)
    code = worker.wait_exit(60)
    log = worker.log()
    assert code != 0, log
    assert "Worker process is ready for action." not in log
    assert UNUSABLE in log and "require_ledger is set: the worker does not start" in log
    assert db not in log
