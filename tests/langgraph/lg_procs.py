"""Real processes for the LangGraph recovery tests: the stores they share (a ledger and a
checkpointer on SQLite or on PostgreSQL), children of ``lg_crash_graph.py`` killed mid-node, and
uvicorn servers of this folder's applications.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import psycopg
from task_state_guard import Ledger
from task_state_guard_langgraph import logical_task_id

HERE = Path(__file__).resolve().parent
PG_SERVER = "postgresql://postgres@127.0.0.1:5432/"


@dataclass(frozen=True)
class Stores:
    """Where a test's processes keep their ledger and their checkpoints."""

    db: str
    checkpoints: str
    work: Path


@contextmanager
def checkpoint_database() -> Iterator[str]:
    """A PostgreSQL database of its own for the checkpointer (the saver's tables are not
    schema-qualified), its tables set up, dropped afterwards."""
    from langgraph.checkpoint.postgres import PostgresSaver

    name = f"tsgt_lg_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_SERVER + "test", autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        with PostgresSaver.from_conn_string(PG_SERVER + name) as saver:
            saver.setup()
        yield PG_SERVER + name
    finally:
        with psycopg.connect(PG_SERVER + "test", autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def child_env() -> dict[str, str]:
    paths = [str(HERE), os.environ.get("PYTHONPATH", "")]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in paths if p))


#: uvicorn's line once it listens (logged after the bind; "Application startup complete" comes
#: before it), with the port the kernel gave it.
_LISTENING = re.compile(rb"Uvicorn running on http://127\.0\.0\.1:(\d+) ")


def serve(app: str, env: dict[str, str], log: Path, *options: str,
          timeout: float = 90) -> tuple[subprocess.Popen[bytes], int]:
    """Start uvicorn serving ``app`` (``module:attribute`` of this folder) with ``options``,
    its output appended to ``log``; return the process and its port once it listens.

    The kernel picks the port as uvicorn binds it (``--port 0``) and uvicorn's own line tells
    it: no port is chosen beforehand, so no other process can take it in between, and a
    request can never reach another process's server. uvicorn logs at ``info`` (its access
    log off); the application's own loggers are not changed."""
    start = log.stat().st_size if log.exists() else 0
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", app, "--host", "127.0.0.1", "--port", "0",
             "--log-level", "info", "--no-access-log", *options],
            env=env, cwd=str(HERE), stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + timeout
    while (found := _LISTENING.search(log.read_bytes()[start:])) is None:
        if proc.poll() is not None or time.monotonic() > deadline:
            if proc.poll() is None:
                proc.kill()
                proc.wait(30)
            raise AssertionError(f"uvicorn did not start:\n{log.read_text(errors='replace')}")
        time.sleep(0.05)
    return proc, int(found.group(1))


def start_child(stores: Stores, thread_id: str, invocation_id: str, mode: str = "",
                marker: Path | None = None, *, script: str = "lg_crash_graph.py",
                ) -> tuple[subprocess.Popen[str], Path]:
    """Start ``script`` (``lg_crash_graph.py``; another script of this directory taking the
    same arguments) in a process group of its own; returns it and its marker."""
    marker = marker or stores.work / f"marker-{uuid.uuid4().hex[:8]}"
    child = subprocess.Popen(
        [sys.executable, str(HERE / script), stores.db, stores.checkpoints,
         str(marker), thread_id, invocation_id, *([mode] if mode else [])],
        cwd=str(HERE), env=child_env(), start_new_session=True, text=True,
        stdout=subprocess.PIPE,
    )
    return child, marker


def wait_marker(child: subprocess.Popen[str], marker: Path, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not marker.exists():
        assert child.poll() is None, f"the child exited early ({child.returncode})"
        assert time.monotonic() < deadline, "the child never reached the slow node"
        time.sleep(0.02)


def sigkill(child: subprocess.Popen[str]) -> None:
    with suppress(ProcessLookupError):
        os.killpg(child.pid, signal.SIGKILL)
    child.wait(30)
    assert child.returncode == -signal.SIGKILL


def kill_in_slow(stores: Stores, thread_id: str, invocation_id: str, mode: str = "",
                 *, running: str | None = None) -> None:
    """Run a child until its ``slow`` node runs, check that ``running`` (an invocation id;
    default ``invocation_id``) is a running record, then SIGKILL it."""
    child, marker = start_child(stores, thread_id, invocation_id, mode)
    try:
        wait_marker(child, marker)
        with Ledger(stores.db) as ledger:
            task = ledger.get_task(logical_task_id(running or invocation_id))
            assert str(task.status) == "running"
    finally:
        sigkill(child)
