"""A LangGraph service on a PostgreSQL ledger next to its PostgresSaver (one database: the
checkpoints in ``public``, the ledger in schema ``tsg``): one service process is SIGKILLed
mid-node; another service's guard closes the dead invocation ``owner_lost`` at once (600 s
grace) and ``recover()`` resumes the thread from the PostgreSQL checkpoints."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from celery_harness import wait_for
from langgraph.checkpoint.postgres import PostgresSaver
from lg_crash_graph import builder
from lg_helpers import shape, tree
from task_state_guard import Ledger
from task_state_guard_langgraph import Recovery, guard, logical_task_id, recovery_invocation_id

HERE = Path(__file__).resolve().parent
SERVER = "postgresql://postgres@127.0.0.1:5432/"


@pytest.fixture
def database() -> Iterator[str]:
    """A database of its own for the test (the saver's tables are not schema-qualified)."""
    name = f"tsgt_lg_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(SERVER + "test", autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield SERVER + name
    finally:
        with psycopg.connect(SERVER + "test", autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_a_killed_service_is_recovered_by_another_from_postgresql(
    tmp_path: Path, database: str
) -> None:
    ledger_url = database + "?schema=tsg"
    with PostgresSaver.from_conn_string(database) as saver:
        saver.setup()
    marker = tmp_path / "marker"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(HERE.parent / "langgraph"), os.environ.get("PYTHONPATH", "")]))
    service = subprocess.Popen(
        [sys.executable, str(HERE.parent / "langgraph" / "lg_crash_graph.py"), ledger_url,
         database, str(marker), "fleet-thread", "fleet-1"],
        cwd=str(HERE), env=env, start_new_session=True,
    )
    try:
        wait_for(lambda: marker.exists() or service.poll() is not None, 60,
                 what="the service to reach the slow node")
        assert service.poll() is None, "the service exited early"
        with Ledger(ledger_url) as ledger:
            assert str(ledger.get_task(logical_task_id("fleet-1")).status) == "running"
        os.killpg(service.pid, signal.SIGKILL)
    finally:
        if service.poll() is None:
            os.killpg(service.pid, signal.SIGKILL)
        service.wait(30)
    assert service.returncode == -signal.SIGKILL

    with PostgresSaver.from_conn_string(database) as saver:
        app = guard(builder(None).compile(checkpointer=saver, name="crashy"), db=ledger_url,
                    strict=True)
        try:
            # The guard's start-up reconcile: the dead owner's session lock is free.
            assert app.last_reconcile is not None
            # the run alone: its node attempts are history, written by the recovery pass
            assert app.last_reconcile["tasks_timed_out"] == 1
            assert shape(tree(app.ledger, app.logical_task_id("fleet-1"))) == (
                "crashy", "timed_out", "owner_lost", ())
            new_id = recovery_invocation_id("fleet-1")
            assert app.recover(durability="sync") == [
                Recovery("fleet-thread", new_id, "fleet-1", "succeeded", None)
            ]
            state = app.get_state({"configurable": {"thread_id": "fleet-thread"}})
            assert state.values["log"] == ["prepare", "slow", "finish"]
            lost = tree(app.ledger, app.logical_task_id("fleet-1"))
            assert tuple(shape(c) for c in lost["children"] if not c["delivery_required"]) == (
                ("prepare", "succeeded", "worker_completed", ()),
                ("slow", "timed_out", "owner_lost", ()),
            )
            recovered = tree(app.ledger, app.logical_task_id(new_id))
            assert shape(recovered) == (
                "crashy", "succeeded", "completed", (
                    ("slow", "succeeded", "worker_completed", ()),
                    ("finish", "succeeded", "worker_completed", ()),
                ),
            )
            assert app.recover() == []
            report = app.ledger.doctor()
            assert report["healthy"] is True, report
        finally:
            app.close()
