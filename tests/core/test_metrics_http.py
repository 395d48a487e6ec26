"""`tsg metrics --serve`: a real server process, scraped over HTTP."""

from __future__ import annotations

import http.client
import json
import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from core_helpers import assert_cli_error, cli_env, run_cli
from ledger_backends import stored_state
from prom_text import parse
from task_state_guard import Ledger


class Server:
    def __init__(self, db: str, *extra: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "task_state_guard", "--db", db, "metrics", "--serve",
             "--listen", "127.0.0.1:0", *extra],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env(),
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        self.banner = json.loads(line)
        host, _, port = self.banner["listen"].rpartition(":")
        self.host, self.port = host, int(port)

    def request(self, path: str, method: str = "GET") -> tuple[int, dict[str, str], str]:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
        try:
            conn.request(method, path)
            response = conn.getresponse()
            return response.status, dict(response.getheaders()), response.read().decode()
        finally:
            conn.close()

    def stop(self) -> tuple[int, str, str]:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        out, err = self.proc.communicate(timeout=30)
        return self.proc.returncode, out, err


@pytest.fixture
def served(db: str) -> Iterator[tuple[Server, Ledger]]:
    with Ledger(db) as led:
        root = led.create_task(name="app.add")
        led.start_task(root.id, owner=False)
        server = Server(db)
        try:
            yield server, led
        finally:
            server.stop()


def test_serves_fresh_metrics_read_only(served: tuple[Server, Ledger], db: str) -> None:
    server, led = served
    assert server.banner == {"listen": f"127.0.0.1:{server.port}", "ok": True}
    status, headers, body = server.request("/metrics")
    assert status == 200
    assert headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    fam = parse(body)
    assert fam["tsg_tasks"].value(kind="task", status="running") == 1
    assert set(fam) == set(parse(run_cli("--db", db, "metrics").stdout))
    # each scrape reads fresh: a close made after the first scrape shows in the next
    task_id = led.find_task_ids("running")[0]
    attempt = led.create_task(parent_id=task_id, delivery_required=False, name="app.add")
    led.close_task_settled(attempt.id, "succeeded", code="worker_completed")
    led.close_task_settled(task_id, "succeeded", code="worker_completed")
    fam = parse(server.request("/metrics")[2])
    assert fam["tsg_tasks"].value(kind="task", status="running") == 0
    assert fam["tsg_outcomes_total"].value(
        kind="attempt", status="succeeded", code="worker_completed") == 1
    assert task_id not in body and attempt.id not in server.request("/metrics")[2]
    # scrapes never write: the SQLite file and its sidecars keep every byte, PostgreSQL's
    # tables every row version
    before = stored_state(db)
    assert before
    for _ in range(3):
        assert server.request("/metrics?x=1")[0] == 200
    assert stored_state(db) == before


def test_only_get_metrics_is_served(served: tuple[Server, Ledger], db: str) -> None:
    server, _led = served
    for path in ("/", "/metrics/", "/metrics.txt", "/tasks", "/../metrics"):
        status, _headers, body = server.request(path)
        assert status == 404 and "tsg_" not in body
    for method in ("POST", "PUT", "DELETE"):
        assert server.request("/metrics", method)[0] == 501
    code, out, err = server.stop()
    assert code == 0 and out == "" and err == ""  # logs nothing, stops cleanly on SIGTERM


@pytest.mark.sqlite_only
def test_a_scrape_that_cannot_read_answers_503_without_detail(db: str, tmp_path: Path) -> None:
    with Ledger(db) as led:
        led.create_task()
    server = Server(db)
    try:
        assert server.request("/metrics")[0] == 200
        # the ledger becomes foreign: the scrape fails closed, the server keeps serving
        conn = sqlite3.connect(db)
        conn.execute("CREATE TABLE foreign_thing (x)")
        conn.commit()
        conn.close()
        status, _headers, body = server.request("/metrics")
        assert status == 503 and body == "error: StateConflict\n"
        assert db not in body and str(tmp_path) not in body
        assert server.request("/nothing")[0] == 404
    finally:
        code, _out, err = server.stop()
    assert code == 0 and err == ""


def test_serve_fails_fast_on_a_missing_ledger_or_a_taken_port(db: str, tmp_path: Path) -> None:
    missing = run_cli("--db", str(tmp_path / "none.sqlite"), "metrics", "--serve",
                      "--listen", "127.0.0.1:0")
    assert_cli_error(missing, "InvalidInput")
    assert not os.path.exists(tmp_path / "none.sqlite")
    with Ledger(db) as led:
        led.create_task()
    first = Server(db)
    try:
        taken = run_cli("--db", db, "metrics", "--serve", "--listen",
                        f"127.0.0.1:{first.port}")
        assert_cli_error(taken, "InvalidInput")
    finally:
        first.stop()


def test_no_network_module_loads_unless_serving() -> None:
    code = ("import sys, task_state_guard, task_state_guard.cli, task_state_guard.integration\n"
            "from task_state_guard.cli import main\n"
            "import contextlib, io\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    main(['--db', '/nonexistent/x.sqlite', 'metrics'])\n"
            "print(sorted(m for m in ('http.server', 'socketserver', 'socket',\n"
            "             'task_state_guard.metrics_http') if m in sys.modules))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=cli_env(), check=True)
    assert result.stdout == "[]\n"
