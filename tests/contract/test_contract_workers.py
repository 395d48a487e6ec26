"""Contract rows that need real worker processes and a real broker (Redis): Celery's prefork
``celery worker`` and Dramatiq's CLI (2 processes x 2 threads), on each ledger backend (the
workers get the ledger, a SQLite path or a PostgreSQL URL, through ``TSG_DB``). LangGraph runs
in the caller's process and has no broker: its rows are in test_contract.py."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from task_state_guard import Ledger, StateConflict, Task

TESTS = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(TESTS / "celery"))
sys.path.insert(0, str(TESTS / "dramatiq"))
sys.path.insert(0, str(TESTS / "core"))

from _dramatiq_helpers import (  # noqa: E402
    BrokerEnv,
    CliWorker,
    Producer,
    attempts_of,
    parent_of,
    wait_closed,
)
from celery_harness import Scenario  # noqa: E402
from prom_text import parse  # noqa: E402


class CeleryRow:
    """A real prefork ``celery worker`` on Redis; marks from here are another process's."""

    def __init__(self, tmp: Path, db: str) -> None:
        self.scenario = Scenario(tmp, db=db)
        self.scenario.start_worker()
        self.ledger = self.scenario.ledger
        import task_state_guard_celery

        self.guard = task_state_guard_celery.install(self.scenario.client, db=self.scenario.db)

    def run(self, kind: str) -> tuple[str, Any]:
        result = self.scenario.send({"ok": "tsgt.ok", "deliver": "tsgt.deliver",
                                     "deliver_inside": "tsgt.deliver_inside"}[kind])
        value = result.get(timeout=30)
        self.scenario.wait_parent(result.id, "succeeded")
        return str(result.id), value

    def logical(self, fid: str) -> Task:
        return self.scenario.parent(fid)

    def attempts(self, fid: str) -> list[Task]:
        return self.scenario.attempts(fid)

    def close(self) -> None:
        self.guard.uninstall()
        self.scenario.close()


class DramatiqRow:
    """A real ``dramatiq`` CLI on Redis; marks from here are another process's."""

    def __init__(self, tmp: Path, db: str) -> None:
        from task_state_guard_dramatiq import TaskStateGuardMiddleware

        self.env = BrokerEnv.new("redis", tmp, db)
        self.worker = CliWorker(self.env).start()
        self.producer = Producer(self.env)
        self.ledger = Ledger(str(self.env.db))
        self.guard = TaskStateGuardMiddleware(db=self.env.db)

    def run(self, kind: str) -> tuple[str, Any]:
        mid = self.producer.send(kind)
        wait_closed(self.ledger, mid)
        return mid, None

    def logical(self, fid: str) -> Task:
        found = parent_of(self.ledger, fid)
        assert found is not None
        return found

    def attempts(self, fid: str) -> list[Task]:
        return attempts_of(self.ledger, fid)

    def close(self) -> None:
        self.guard.close()
        self.producer.close()
        self.worker.stop()
        self.ledger.close()
        self.env.cleanup()


@pytest.fixture(params=["celery", "dramatiq"])
def row(request: pytest.FixtureRequest, tmp_path: Path, db: str) -> Iterator[Any]:
    try:  # required (CI starts it): a missing broker fails, never skips
        socket.create_connection(("127.0.0.1", 6379), timeout=2).close()
    except OSError as exc:
        pytest.fail(f"Redis is required at 127.0.0.1:6379: {exc!r}")
    made = (CeleryRow if request.param == "celery" else DramatiqRow)(tmp_path, db)
    try:
        yield made
    finally:
        made.close()


def test_real_workers_keep_the_contract(row: Any) -> None:
    # Attempts, and a logical task that owes nobody a delivery: closed not_applicable at once.
    plain, _ = row.run("ok")
    logical = row.logical(plain)
    assert (logical.delivery_status, logical.delivery_code) == ("not_applicable", "internal_task")
    attempts = row.attempts(plain)
    assert attempts and all(
        (a.delivery_status, a.delivery_code) == ("not_applicable", "internal_task")
        for a in attempts
    )
    # A mark made inside the running job is written with the logical task's close.
    inside, value = row.run("deliver_inside")
    assert value in (None, "deferred")
    logical = row.logical(inside)
    assert (logical.delivery_status, logical.delivery_code) == (
        "delivered", "transport_acknowledged"
    )
    # Outside the job (this process): written at once, the Task returned; no rewrite.
    outside, _ = row.run("deliver")
    assert row.logical(outside).delivery_status == "pending"
    task = row.guard.mark_delivered(outside)
    assert (task.delivery_status, task.delivery_code) == ("delivered", "transport_acknowledged")
    with pytest.raises(StateConflict):
        row.guard.mark_delivery_failed(outside)
    with Ledger(str(row.ledger.path)) as ledger:
        assert ledger.doctor()["healthy"]
    # `tsg metrics` counts each job once (kind="task") and its attempts apart.
    jobs = [plain, inside, outside]
    attempt_count = sum(len(row.attempts(fid)) for fid in jobs)
    names = {row.logical(fid).name for fid in jobs}
    result = subprocess.run(
        [sys.executable, "-m", "task_state_guard", "--db", str(row.ledger.path), "metrics"],
        capture_output=True, text=True, check=True,
    )
    families = parse(result.stdout)
    tasks = families["tsg_tasks"]
    assert tasks.value(kind="task", status="succeeded") == 3
    assert tasks.value(kind="attempt", status="succeeded") == attempt_count
    by_name = families["tsg_tasks_by_name"]
    assert sum(by_name.value(kind="task", name=n, status="succeeded") for n in names) == 3
    outcomes = families["tsg_outcomes_total"]
    assert outcomes.value(kind="task", status="succeeded", code="worker_completed") == 3
    delivered = families["tsg_delivery_outcomes_total"]
    assert delivered.value(kind="owed", delivery_status="delivered",
                           code="transport_acknowledged") == 2
    assert delivered.value(kind="internal", delivery_status="not_applicable",
                           code="internal_task") == attempt_count + 1
    for fid in jobs:
        assert fid not in result.stdout
