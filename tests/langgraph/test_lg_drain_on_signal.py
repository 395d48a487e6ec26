"""The drain recipe for uvicorn: ``drain_on_signals(graph)`` in the lifespan startup drains the
requests in flight when SIGTERM arrives, within uvicorn's graceful-shutdown timeout: the run
stops at its next step boundary, its request answers 503, it is closed
``cancelled/interrupted`` and the next start resumes its thread. A real uvicorn server on each
ledger backend (its checkpointer on the same backend)."""

from __future__ import annotations

import json
import signal
import socket
import time

from lg_crash_graph import builder, saver_at
from lg_helpers import assert_healthy
from lg_procs import Stores, child_env, serve
from task_state_guard import Ledger
from task_state_guard.integration import LostTask
from task_state_guard_langgraph import Recovery, guard, logical_task_id, recovery_invocation_id

GRACE = 30  # uvicorn's --timeout-graceful-shutdown: the drain ends well within it


def test_sigterm_drains_the_requests_in_flight_and_the_next_start_resumes_them(
    stores: Stores,
) -> None:
    marker, log = stores.work / "in-slow", stores.work / "server.log"
    env = dict(child_env(), TSG_DB=stores.db, CHECKPOINTS=stores.checkpoints,
               MARKER=str(marker), DRAIN="1")
    proc, port = serve("lg_stream_server:app", env, log,
                       "--timeout-graceful-shutdown", str(GRACE))
    try:
        deadline = time.monotonic() + 90
        client = socket.create_connection(("127.0.0.1", port), timeout=60)
        client.sendall(b"GET /run/t-drain HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n")
        while not marker.exists():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)  # the drain is asked for before the node ends its step
        stopping = time.monotonic()
        (stores.work / "in-slow.release").write_text("go")
        answer = b""
        while chunk := client.recv(4096):
            answer += chunk
        client.close()
        assert proc.wait(GRACE + 30) in (0, -signal.SIGTERM), log.read_text()
        assert time.monotonic() - stopping < GRACE  # drained, not cancelled by the timeout
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503"), answer
    assert json.loads(body) == {"drained": "t-drain"}
    assert "Cancel" not in log.read_text(), log.read_text()  # no request was cancelled
    with Ledger(stores.db) as ledger:
        run = ledger.get_task(logical_task_id("run-t-drain"))
        assert (str(run.status), run.terminal_code) == ("cancelled", "interrupted")
    lost: list[LostTask] = []
    with saver_at(stores.checkpoints) as saver:
        app = guard(builder(None).compile(checkpointer=saver, name="crashy"), db=stores.db,
                    strict=True, on_lost=lost.append)
        try:
            report = app.recover(durability="sync")
            assert report == [Recovery("t-drain", recovery_invocation_id("run-t-drain"),
                                       "run-t-drain", "succeeded", None, "drained")]
            assert lost == []
            state = app.get_state({"configurable": {"thread_id": "t-drain"}})
            assert state.values["log"] == ["prepare", "slow", "finish"] and not state.next
            assert_healthy(app.ledger)
        finally:
            app.close()
