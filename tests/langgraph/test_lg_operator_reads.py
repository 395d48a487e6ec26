"""What an operator sees of a LangGraph recovery while it runs: the recovery run is a task of
its own (listed by default `tsg tasks`, kind ``task``, under the invocation it recovers), found
with `tsg get --langgraph ID`, and its node attempts are listed as attempts. A real child
process is SIGKILLed mid-node, then recovered here with the resumed node held open."""

from __future__ import annotations

import sqlite3
import sys
import threading
import time
from pathlib import Path
from typing import Any

from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import START, StateGraph
from lg_helpers import State
from task_state_guard import Ledger
from task_state_guard_langgraph import guard, logical_task_id, recovery_invocation_id
from test_lg_crash_recovery import _kill_mid_node

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "core"))
from core_helpers import assert_json_line, run_cli


def _held_graph(checkpoints: str, entered: threading.Event, release: threading.Event) -> Any:
    """The crash graph's shape (prepare -> slow -> finish) whose `slow` waits to be released."""

    def slow(state: State) -> dict[str, Any]:
        entered.set()
        assert release.wait(60)
        return {"log": ["slow"]}

    graph = StateGraph(State)
    graph.add_node("prepare", lambda state: {"log": ["prepare"]})
    graph.add_node("slow", slow)
    graph.add_node("finish", lambda state: {"log": ["finish"]})
    graph.add_edge(START, "prepare")
    graph.add_edge("prepare", "slow")
    graph.add_edge("slow", "finish")
    conn = sqlite3.connect(checkpoints, check_same_thread=False)
    return graph.compile(checkpointer=SqliteSaver(conn), name="crashy")


def test_a_running_recovery_run_is_listed_as_a_task(work: Path, db: str, apps: list[Any]) -> None:
    _kill_mid_node(work, db, "listed-thread", "listed-1")
    entered, release = threading.Event(), threading.Event()
    # Node attempts are history committed every heartbeat: a short one lists the running node.
    app = guard(_held_graph(str(work / "checkpoints.sqlite"), entered, release), db=db,
                heartbeat_seconds=0.2)
    apps.append(app)
    reports: list[Any] = []
    recovering = threading.Thread(target=lambda: reports.append(app.recover(durability="sync")))
    recovering.start()
    try:
        assert entered.wait(60), "the recovery never reached the resumed node"
        recovery = recovery_invocation_id("listed-1")
        run_id, lost_id = logical_task_id(recovery), logical_task_id("listed-1")

        rows = assert_json_line(run_cli("--db", db, "tasks", "--details"))["tasks"]
        assert [(r["id"], r["kind"], r["parent_id"], r["name"], r["status"]) for r in rows] == [
            (run_id, "task", lost_id, "crashy", "running")]
        text = run_cli("--db", db, "tasks", "--format", "text").stdout.splitlines()
        assert text[0].split()[:2] == ["ID", "KIND"]
        assert [line.split()[:2] for line in text[1:]] == [[run_id, "task"]]
        listed: list[Any] = []
        deadline = time.monotonic() + 30  # one heartbeat (0.2 s), generously
        while not listed and time.monotonic() < deadline:
            attempts = assert_json_line(
                run_cli("--db", db, "tasks", "--langgraph", recovery, "--attempts", "--details"))
            listed = [(r["name"], r["kind"], r["status"]) for r in attempts["tasks"]]
        assert listed == [("slow", "attempt", "running")]
        found = assert_json_line(run_cli("--db", db, "get", "--langgraph", recovery))["task"]
        assert (found["id"], found["parent_id"], found["status"]) == (run_id, lost_id, "running")
        assert recovery not in run_cli("--db", db, "get", "--langgraph", recovery).stdout
    finally:
        release.set()
        recovering.join(60)
    assert reports and reports[0].resumed == ["listed-thread"]
    with Ledger(db, read_only=True) as ledger:
        assert str(ledger.get_task(logical_task_id(recovery)).status) == "succeeded"


def test_the_web_view_shows_a_recovery_run_and_its_nodes(work: Path, db: str,
                                                        apps: list[Any]) -> None:
    """After a real crash and recovery, the lost run's job page lists its node attempts by
    node name and links the recovery run (never "attempt #3"); the recovery run's page links
    back to the run it recovers and lists its own nodes."""
    import io
    import re

    from lg_crash_graph import build
    from task_state_guard.web import make_wsgi_app

    _kill_mid_node(work, db, "web-thread", "web-1")
    app = guard(build(str(work / "checkpoints.sqlite"), None), db=db)
    apps.append(app)
    assert [r.thread_id for r in app.recover(durability="sync")] == ["web-thread"]
    lost_id = logical_task_id("web-1")
    run_id = logical_task_id(recovery_invocation_id("web-1"))
    web = make_wsgi_app(db, no_token=True, refresh_seconds=0)

    def page(task_id: str) -> str:
        environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/job", "QUERY_STRING": f"id={task_id}",
                   "HTTP_HOST": "localhost", "wsgi.input": io.BytesIO(b"")}
        statuses: list[str] = []
        body = b"".join(web(environ, lambda status, headers, exc=None: statuses.append(status)))
        assert statuses == ["200 OK"]
        return body.decode("utf-8")

    def nodes(body: str) -> list[str]:
        attempts = body[body.index("<h2>Attempts</h2>"):body.index("<h2>Timeline</h2>")]
        return re.findall(r'<td class="num">\d+</td><td><code>[^<]+</code></td><td>(\w+)</td>',
                          attempts)

    lost = page(lost_id)
    assert nodes(lost) == ["prepare", "slow"]
    runs = lost[lost.index("Later runs of this job"):lost.index("<h2>Attempts</h2>")]
    assert f'href="/job?id={run_id}&amp;kind=ledger"' in runs and "recovery run" in runs
    recovery = page(run_id)
    assert "This job is the recovery run of" in recovery
    assert f'href="/job?id={lost_id}&amp;kind=ledger"' in recovery
    assert nodes(recovery) == ["slow", "finish"]
