"""Scrapes are never starved: a real `tsg serve` under idle-socket hoarding and under a crowd
of page loads on a large ledger, over real sockets. The bounds (1 s, 3 s) are the acceptance
bounds the project set for these loads, generous on purpose; the time figures themselves are
benchmarks' business (`benchmarks/serve_pages.py`)."""

from __future__ import annotations

import contextlib
import http.client
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prom_text import parse
from serve_helpers import Served
from task_state_guard import Ledger

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
#: `tsg serve`'s connection cap (``HttpServer.max_connections``) and per-address cap.
CONNECTION_CAP = 256
PER_CLIENT = 32


def _scrape(server: Served) -> tuple[int, float, str]:
    """One `GET /metrics` on a new connection: the status, the seconds it took, the body."""
    started = time.monotonic()
    conn = http.client.HTTPConnection(server.host, server.port, timeout=30)
    try:
        conn.request("GET", "/metrics", headers={"Authorization": f"Bearer {server.token}"})
        response = conn.getresponse()
        body = response.read().decode()
        return response.status, time.monotonic() - started, body
    finally:
        conn.close()


def _hold(server: Served, count: int, source: str) -> list[socket.socket]:
    """``count`` connections from address ``source`` that never send a byte."""
    held = []
    for _ in range(count):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind((source, 0))
        sock.settimeout(10)
        try:
            sock.connect((server.host, server.port))
        except OSError:
            sock.close()
            continue
        held.append(sock)
    return held


@contextlib.contextmanager
def _serving(db: str) -> Iterator[Served]:
    server = Served(db, "--listen", "127.0.0.1:0", "--refresh", "0")
    try:
        yield server
    finally:
        code, out, err = server.stop()
        assert (code, out, err) == (0, "", ""), (code, out, err)


@pytest.mark.sqlite_only(reason="holds loopback sockets from many addresses; one backend is "
                         "enough for the server's connection handling")
def test_idle_sockets_beyond_the_connection_cap_never_delay_a_scrape(db: str) -> None:
    """One client holds more idle sockets than the whole connection cap, from the scraper's
    own address and from nine other loopback addresses, and keeps opening more between the
    scrapes: every scrape is answered 200 within 1 s (before: 503 until the client let go)."""
    with Ledger(db) as led:
        led.create_task(name="app.cap")
    held: list[socket.socket] = []
    with _serving(db) as server:
        try:
            sources = ["127.0.0.1"] + [f"127.0.0.{n}" for n in range(2, 11)]
            for source in sources:  # 300 in all, each address within its own cap
                held += _hold(server, PER_CLIENT - 2, source)
            assert len(held) > CONNECTION_CAP
            times = []
            for round_ in range(12):
                held += _hold(server, 25, sources[round_ % len(sources)])
                status, seconds, body = _scrape(server)
                assert status == 200, (round_, status, body[:80])
                assert parse(body)["tsg_tasks"].value(kind="task", status="queued") == 1
                times.append(seconds)
            assert max(times) < 1.0, times
            dropped = parse(_scrape(server)[2])["tsg_serve_connections_dropped_total"]
            assert dropped.value(reason="overload") > 0
            for path in ("/", "/stuck"):  # a page load gets in too
                assert server.request(path)[0] == 200
        finally:
            for sock in held:
                sock.close()


def _large_ledger(db: str, tasks: int) -> None:
    """``tasks`` tasks written inside SQLite by the scale benchmark's loader (its mix: open,
    closed, pending deliveries, children), in a few seconds."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        from scale import build_sql  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(BENCHMARKS))
    build_sql(db, tasks)


@pytest.mark.sqlite_only(reason="builds a large ledger with the SQLite bulk loader")
def test_scrapes_are_answered_while_clients_loop_on_the_overview(db: str) -> None:
    """Eight clients loop on the overview of a 200,000-task ledger (four chart windows, with
    and without refresh: eight different pages) and on a sorted stuck list for 15 s; a scrape
    every 0.3 s is answered 200 within 3 s every time (before: the overview and the scrape
    shared two slots and the page workers, and scrapes waited past Prometheus' timeout)."""
    _large_ledger(db, 200_000)
    stop = threading.Event()
    failures: list[str] = []
    loads = [0]

    def loop(path: str) -> None:
        while not stop.is_set():
            try:
                status = server.request(path)[0]
            except OSError as exc:  # counted below: a page load may be refused, never lost
                failures.append(f"{path}: {type(exc).__name__}")
                continue
            if status not in (200, 503):
                failures.append(f"{path}: {status}")
            loads[0] += 1

    with _serving(db) as server:
        paths = [f"/?window={w}{r}" for w in ("1h", "6h", "24h", "7d")
                 for r in ("", "&refresh=off")]
        threads = [threading.Thread(target=loop, args=(path,)) for path in paths]
        threads.append(threading.Thread(target=loop, args=("/stuck?sort=activity&per=200",)))
        for thread in threads:
            thread.start()
        times = []
        try:
            until = time.monotonic() + 15
            while time.monotonic() < until:
                status, seconds, body = _scrape(server)
                assert status == 200, (status, body[:80])
                times.append(seconds)
                time.sleep(0.3)
        finally:
            stop.set()
            for thread in threads:
                thread.join(60)
        assert max(times) < 3.0, sorted(times)[-5:]
        assert len(times) >= 10 and loads[0] >= len(paths)
        assert not failures, failures[:5]
        assert parse(body)["tsg_tasks"].value(kind="task", status="running") == 30_000
