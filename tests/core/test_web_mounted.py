"""`task_state_guard.web.make_wsgi_app` mounted in a third-party WSGI server (waitress, in a
process of its own, as a user's deployment runs it): the pages and `/metrics` over HTTP."""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from core_helpers import cli_env
from ledger_backends import stored_state
from prom_text import parse
from task_state_guard import Ledger

TOKEN = "mounted-token-for-the-tests-" + "z" * 8
#: A user's own module: the app made from the ledger, served by waitress on a free port.
_SERVE = """
import json, sys
from waitress import create_server
from task_state_guard.web import make_wsgi_app

app = make_wsgi_app(sys.argv[1], token=sys.argv[2] or None, no_token=not sys.argv[2],
                    refresh_seconds=0)
server = create_server(app, host="127.0.0.1", port=0, threads=4)
print(json.dumps({"port": server.effective_port}), flush=True)
server.run()
"""
SECURITY = ("X-Content-Type-Options", "X-Frame-Options", "Content-Security-Policy",
            "Referrer-Policy", "Cache-Control")


@contextmanager
def _waitress(db: str, token: str = "") -> Iterator[int]:
    proc = subprocess.Popen([sys.executable, "-c", _SERVE, db, token], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=cli_env())
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, proc.communicate(timeout=30)
        yield int(json.loads(line)["port"])
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


def _get(port: int, path: str, headers: Mapping[str, str] | None = None,
         ) -> tuple[int, dict[str, str], str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", path, headers=dict(headers or {}))
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read().decode()
    finally:
        conn.close()


def test_the_wsgi_app_serves_its_pages_and_metrics_in_waitress(db: str) -> None:
    """Every page and `/metrics` through waitress, with the security headers and the Host
    check, a job found by its id, concurrent loads answered alike; nothing is written."""
    with Ledger(db) as led:
        root = led.create_task(name="app.mounted")
        led.start_task(root.id, owner=False)
    before = stored_state(db)
    with _waitress(db) as port:
        for path in ("/", "/?window=7d", "/stuck", "/stuck?status=running&sort=name",
                     "/job", f"/job?id={root.id}&kind=ledger", "/metrics"):
            status, headers, _body = _get(port, path)
            assert status == 200, path
            assert all(name in headers for name in SECURITY), path
        assert "app.mounted" in _get(port, "/stuck")[2]
        assert root.id in _get(port, f"/job?id={root.id}")[2]
        metrics = parse(_get(port, "/metrics")[2])
        assert metrics["tsg_tasks"].value(kind="task", status="running") == 1
        assert _get(port, "/stuck", {"Host": "evil.example"})[0] == 421
        assert _get(port, "/stuck?per=%C2%B2")[0] == 400
        assert _get(port, "/nothing")[0] == 404
        answers: list[int] = []
        threads = [threading.Thread(target=lambda: answers.append(_get(port, "/")[0]))
                   for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert answers == [200] * 8
    assert stored_state(db) == before


def test_the_wsgi_app_in_waitress_wants_its_token(db: str) -> None:
    with Ledger(db) as led:
        led.create_task(name="app.mounted")
    with _waitress(db, TOKEN) as port:
        status, _headers, body = _get(port, "/metrics", {"Host": "tsg.example"})
        assert status == 401 and "tsg_" not in body
        bearer = {"Host": "tsg.example", "Authorization": f"Bearer {TOKEN}"}
        assert _get(port, "/metrics", bearer)[0] == 200
        assert "app.mounted" in _get(port, "/stuck", bearer)[2]
