"""uvicorn's graceful shutdown with requests in flight: when its timeout runs out, uvicorn
cancels the requests still running; every run they held is closed ``cancelled/caller_cancelled``
(the close completes however often the request task is cancelled meanwhile), nothing is logged
as an error, and the next start reports none of them lost. Ten shutdowns a backend, each with
``ainvoke`` and ``astream`` requests waiting in a slow node, with a real uvicorn server."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import time
from pathlib import Path

from lg_crash_graph import builder, saver_at
from lg_helpers import assert_healthy
from lg_procs import Stores, child_env, serve
from task_state_guard import Ledger
from task_state_guard.integration import LostTask
from task_state_guard_langgraph import guard, logical_task_id

TRIES = 10
PATHS = ("run", "run", "stream")
_GUARD_RECORD = re.compile(r"^task_state_guard\S* (WARNING|ERROR|CRITICAL)", re.MULTILINE)
_UVICORN_CANCEL = re.compile(
    r"ERROR: +Cancel \d+ running task\(s\), timeout graceful shutdown exceeded")


def _serve(stores: Stores, marker: Path, log: Path) -> tuple[subprocess.Popen[bytes], int]:
    env = dict(child_env(), TSG_DB=stores.db, CHECKPOINTS=stores.checkpoints,
               MARKER=str(marker))
    return serve("lg_stream_server:app", env, log, "--timeout-graceful-shutdown", "1")


def _running(db: str, ids: list[str]) -> bool:
    """Whether every run is recorded running (a run not yet recorded is not)."""
    with Ledger(db, read_only=True) as ledger:
        return all(i in ledger.find_task_ids("running", task_id=i) for i in ids)


def _shutdown_with_requests_in_flight(stores: Stores, attempt: int, log: Path) -> list[str]:
    """One server, three requests waiting in ``slow``, SIGTERM; the ledger ids of the runs."""
    marker = stores.work / f"in-slow-{attempt}"
    proc, port = _serve(stores, marker, log)
    clients, ids = [], []
    try:
        for n, path in enumerate(PATHS):
            thread = f"t-{attempt}-{n}"
            client = socket.create_connection(("127.0.0.1", port), timeout=60)
            client.sendall(f"GET /{path}/{thread} HTTP/1.1\r\nHost: test\r\n\r\n".encode())
            clients.append(client)
            ids.append(logical_task_id(f"{path}-{thread}"))
        deadline = time.monotonic() + 60
        while not (marker.exists() and _running(stores.db, ids)):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        time.sleep(0.2)  # every request is in `slow`
        proc.send_signal(signal.SIGTERM)
        # uvicorn ends by raising the signal it shut down for again.
        assert proc.wait(60) in (0, -signal.SIGTERM), log.read_text()
    finally:
        for client in clients:
            client.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    return ids


def test_a_graceful_shutdown_closes_every_cancelled_run(stores: Stores) -> None:
    log = stores.work / "server.log"
    runs: list[str] = []
    for attempt in range(TRIES):
        runs += _shutdown_with_requests_in_flight(stores, attempt, log)
    with Ledger(stores.db) as ledger:
        closed = [(str(t.status), t.terminal_code) for t in map(ledger.get_task, runs)]
        assert closed == [("cancelled", "caller_cancelled")] * len(runs)
    lost: list[LostTask] = []
    with saver_at(stores.checkpoints) as saver:
        app = guard(builder(None).compile(checkpointer=saver, name="crashy"), db=stores.db,
                    strict=True, on_lost=lost.append)
        try:
            assert app.last_reconcile is not None
            assert app.last_reconcile["tasks_timed_out"] == 0
            report = app.recover()
            assert report == [] and report.lost == [] and lost == []
            # Each was cancelled with work left: reported as such, never resumed.
            assert len(report.cancelled) == len(runs)
            assert_healthy(app.ledger)
        finally:
            app.close()
    # uvicorn logged that it cancelled requests (and each one's traceback); the guard logged
    # nothing (the server prints every other logger's records after its name).
    text = log.read_text()
    assert len(_UVICORN_CANCEL.findall(text)) == TRIES, text
    assert not _GUARD_RECORD.search(text), text
