"""A real asyncio server (Starlette under uvicorn) serving guarded async graphs while another
process holds the ledger locked: the event loop keeps running, and every request is recorded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from lg_helpers import assert_healthy, shape, tree
from lg_procs import serve
from task_state_guard import Ledger
from task_state_guard_langgraph import logical_task_id

HERE = Path(__file__).parent
BUSY_TIMEOUT_MS = 8000
LOCK_SECONDS = 3.0

LOCKER = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
conn.execute("COMMIT")
print("released", flush=True)
"""


def _get(url: str, timeout: float = 60.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        assert response.status == 200
        return json.loads(response.read())


@pytest.fixture
def server(db: str, tmp_path: Path) -> Iterator[str]:
    env = {
        **os.environ,
        "TSG_DB": db,
        "TSG_BUSY_TIMEOUT_MS": str(BUSY_TIMEOUT_MS),
        "PYTHONPATH": str(HERE),
    }
    proc, port = serve("lg_async_server:app", env, tmp_path / "server.log")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.sqlite_only(reason="another process holds the SQLite file's write lock")
def test_event_loop_never_waits_for_a_locked_ledger(server: str, db: str) -> None:
    # Warm up: the ledger is open and the writer thread running before the lock is taken.
    assert _get(server + "/run/warm")["running_before_first_node"] is True
    _get(server + "/ticker?reset=1")

    locker = subprocess.Popen(
        [sys.executable, "-c", LOCKER, db, str(LOCK_SECONDS)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert locker.stdout is not None
        assert locker.stdout.readline().strip() == "locked"
        paths = [f"/{kind}/{kind}-{i}" for i in range(4) for kind in ("run", "stream", "events")]
        with ThreadPoolExecutor(len(paths)) as pool:
            answers = list(pool.map(lambda p: _get(server + p), paths))
        assert locker.stdout.readline().strip() == "released"
    finally:
        locker.wait(timeout=60)
    assert locker.returncode == 0
    ticker = _get(server + "/ticker")

    # Every request was served, and each invocation was a committed running record before its
    # first node ran, although its start had to wait for the other process's lock.
    assert all(a["running_before_first_node"] is True for a in answers)
    assert [a["log"] for a in answers[0::3]] == [["first", "second"]] * 4
    # The loop kept ticking while the writes waited: a blocked loop would show one gap as long
    # as the lock (3 s); allow a loaded machine's scheduling noise far below that.
    assert ticker["ticks"] > 0
    assert ticker["max_gap_ms"] < LOCK_SECONDS * 1000 / 3, ticker
    assert _get(server + "/stats")["errors"] == {}

    with Ledger(db) as ledger:
        ok = ("succeeded", "worker_completed", ())
        for path in paths:
            rid = path.rsplit("/", 1)[1]
            assert shape(tree(ledger, logical_task_id(rid))) == (
                "LangGraph", "succeeded", "completed", (("first", *ok), ("second", *ok)),
            ), rid
        assert_healthy(ledger)
