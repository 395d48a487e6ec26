"""A client that disconnects mid-stream: the run is closed ``cancelled/caller_cancelled`` and
the next recovery reports its thread (work left behind) without resuming it, on SQLite and on
PostgreSQL, with a real uvicorn server and a real socket closed by the client."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from lg_crash_graph import builder, saver_at
from lg_helpers import assert_healthy, shape, tree
from lg_procs import Stores, child_env, serve
from task_state_guard import Ledger
from task_state_guard.integration import LostTask
from task_state_guard_langgraph import guard, logical_task_id


@pytest.fixture
def server(stores: Stores) -> Iterator[tuple[int, Path]]:
    marker = stores.work / "in-slow"
    env = dict(child_env(), TSG_DB=stores.db, CHECKPOINTS=stores.checkpoints,
               MARKER=str(marker))
    proc, port = serve("lg_stream_server:app", env, stores.work / "server.log")
    try:
        yield port, marker
    finally:
        proc.terminate()
        proc.wait(60)


def test_a_client_disconnect_mid_stream_is_reported_not_resumed(
    stores: Stores, server: tuple[int, Path]
) -> None:
    port, marker = server
    client = socket.create_connection(("127.0.0.1", port), timeout=60)
    client.sendall(b"GET /stream/t-gone HTTP/1.1\r\nHost: test\r\n\r\n")
    received = b""
    while b"prepare" not in received:  # the first node's update reached the client
        chunk = client.recv(4096)
        assert chunk, "the server closed the stream"
        received += chunk
    deadline = time.monotonic() + 60
    while not marker.exists():  # the run is in `slow`
        assert time.monotonic() < deadline
        time.sleep(0.02)
    client.close()  # the client goes away mid-stream

    run = logical_task_id("stream-t-gone")
    with Ledger(stores.db) as ledger:
        deadline = time.monotonic() + 60
        while str(ledger.get_task(run).status) == "running":
            assert time.monotonic() < deadline, "the disconnect was not recorded"
            time.sleep(0.05)
        assert shape(tree(ledger, run)) == (
            "crashy", "cancelled", "caller_cancelled", (
                ("prepare", "succeeded", "worker_completed", ()),
                ("slow", "cancelled", "caller_cancelled", ()),
            ),
        )

    lost: list[LostTask] = []
    with saver_at(stores.checkpoints) as saver:
        app = guard(builder(None).compile(checkpointer=saver, name="crashy"), db=stores.db,
                    strict=True, on_lost=lost.append)
        try:
            report = app.recover(durability="sync")
            assert report == [] and report.lost == [] and lost == []
            assert report.cancelled == ["t-gone"]  # reported, never resumed
            state = app.get_state({"configurable": {"thread_id": "t-gone"}})
            assert state.next == ("slow",)
            assert_healthy(app.ledger)
        finally:
            app.close()
