"""`tsg serve` (and its alias `tsg metrics --serve`): a real server process, over HTTP.

The pages' content is checked here through HTTP on both backends; tests/web loads them in a
real browser."""

from __future__ import annotations

import contextlib
import os
import re
import socket
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlencode

import pytest
from core_helpers import Clock, assert_cli_error, cli_env, contradicted_jobs, run_cli
from ledger_backends import stored_state
from prom_text import parse
from serve_helpers import Served, reset
from task_state_guard import Ledger
from task_state_guard.integration.ids import job_task_id

SERVER_FAMILY = "tsg_serve_connections_dropped_total"
TOKEN = "s3cr3t-token-for-tests-" + "x" * 8


@pytest.fixture
def served(db: str) -> Iterator[tuple[Served, Ledger]]:
    with Ledger(db) as led:
        root = led.create_task(name="app.add")
        led.start_task(root.id, owner=False)
        server = Served(db, "--listen", "127.0.0.1:0", "--refresh", "0")
        try:
            yield server, led
        finally:
            server.stop()


@pytest.fixture
def scraped(db: str) -> Iterator[Served]:
    """The endpoint as 0.2's `tsg metrics --serve` ran it (now an alias of `tsg serve`)."""
    with Ledger(db) as led:
        led.create_task(name="app.add")
    server = Served(db, "--serve", "--listen", "127.0.0.1:0", command=("metrics",))
    try:
        yield server
    finally:
        server.stop()


def _job(led: Ledger, name: str, state: str | None = "succeeded") -> tuple[str, str]:
    root = led.create_task(name=name)
    led.start_task(root.id, owner=False)
    attempt = led.create_task(parent_id=root.id, delivery_required=False, name=name)
    led.start_task(attempt.id, owner=False)
    if state is not None:
        code = {"succeeded": "worker_completed", "failed": "worker_failed",
                "timed_out": "owner_lost"}[state]
        led.close_task(attempt.id, state, code=code)
        led.close_task(root.id, state, code=code)
    return root.id, attempt.id


# ----------------------------------------------------------------------------- /metrics


def test_metrics_are_fresh_and_carry_no_ids(served: tuple[Served, Ledger], db: str) -> None:
    server, led = served
    assert server.banner == {"listen": f"127.0.0.1:{server.port}", "ok": True}
    status, headers, body = server.request("/metrics")
    assert status == 200
    assert headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    fam = parse(body)
    assert fam["tsg_tasks"].value(kind="task", status="running") == 1
    assert set(fam) == set(parse(run_cli("--db", db, "metrics").stdout)) | {SERVER_FAMILY}
    assert "tsg_adapter_counters_readable" not in fam  # no metrics directory given
    documented = (Path(__file__).resolve().parents[2] / "docs" / "metrics.md").read_text()
    assert f"`{SERVER_FAMILY}`" in documented and "`reason`" in documented
    # each scrape reads fresh: a close made after the first scrape shows in the next
    task_id = led.find_task_ids("running")[0]
    attempt = led.create_task(parent_id=task_id, delivery_required=False, name="app.add")
    led.close_task_settled(attempt.id, "succeeded", code="worker_completed")
    led.close_task_settled(task_id, "succeeded", code="worker_completed")
    second = server.request("/metrics")[2]
    fam = parse(second)
    assert fam["tsg_tasks"].value(kind="task", status="running") == 0
    assert fam["tsg_outcomes_total"].value(
        kind="attempt", status="succeeded", code="worker_completed") == 1
    assert task_id not in body + second and attempt.id not in body + second


def test_metrics_serve_is_an_alias_of_serve(db: str, tmp_path: Path) -> None:
    with Ledger(db) as led:
        _job(led, "app.alias")
    (tmp_path / "counters").mkdir()
    server = Served(db, "--serve", "--listen", "127.0.0.1:0", command=("metrics",),
                    env={"TSG_METRICS_DIR": str(tmp_path / "counters")})
    try:
        assert server.banner == {"listen": f"127.0.0.1:{server.port}", "ok": True}
        fam = parse(server.request("/metrics")[2])
        assert fam["tsg_tasks"].value(kind="task", status="succeeded") == 1
        assert fam["tsg_adapter_counters_readable"].value() == 1  # the metrics directory
        status, headers, body = server.request("/")
        assert status == 200 and headers["Content-Type"] == "text/html; charset=utf-8"
        assert "app.alias" in body
    finally:
        code, out, err = server.stop()
    assert (code, out, err) == (0, "", "")


# ----------------------------------------------------------------------------- never writes


def test_no_page_and_no_scrape_writes_the_ledger(db: str) -> None:
    with Ledger(db) as led:
        root, attempt = _job(led, "app.done")
        _job(led, "app.failed", "failed")
        running, _ = _job(led, "app.running", None)
    server = Served(db, "--listen", "127.0.0.1:0", "--refresh", "0")
    try:
        paths = ["/", "/?window=1h", "/?window=7d", "/stuck", "/stuck?status=succeeded",
                 "/stuck?rows=attempts&sort=activity&dir=desc", "/stuck?name=app.done&idle=0s",
                 f"/job?id={root}", f"/job?id={attempt}", f"/job?id={running}", "/metrics",
                 "/job", f"/job?id={uuid.uuid4()}", "/nothing"]
        server.request("/")  # the first read of a closed SQLite file leaves nothing either
        before = stored_state(db)
        assert before
        for _ in range(2):
            for path in paths:
                assert server.request(path)[0] in (200, 404), path
            assert server.request("/", "HEAD")[0] == 200
        assert stored_state(db) == before
    finally:
        code, _out, err = server.stop()
    assert code == 0 and err == ""
    assert stored_state(db) == before


# ----------------------------------------------------------------------------- the pages


def test_overview_shows_aggregates_and_no_id(db: str) -> None:
    with Ledger(db) as led:
        ids = [*_job(led, "app.done"), *_job(led, "app.lost", "timed_out"),
               *_job(led, "app.running", None)]
    server = Served(db, "--listen", "127.0.0.1:0", "--refresh", "0")
    try:
        status, _headers, body = server.request("/")
        assert status == 200
        for text in ("Running at risk", "Awaiting delivery", "Lost-job verdicts", "app.done",
                     "app.lost", "app.running", "owner_lost", "<svg"):
            assert text in body, text
        assert not any(task_id in body for task_id in ids)
        # the chart counts the lost job under "lost" in the bucket it closed in
        assert re.search(r"<title>[^<]*1 lost[^<]*</title>", body)
        assert server.request("/?window=2h")[0] == 400
    finally:
        server.stop()


def test_stuck_work_filters_sorts_and_pages(db: str) -> None:
    with Ledger(db) as led:
        with led.atomic():
            made = []
            for n in range(30):
                task = led.create_task(name=f"app.n{n % 3}")
                made.append(task.id)
            for task_id in made[:10]:
                led.start_task(task_id, owner=False)
        done, _ = _job(led, "app.done")
    server = Served(db, "--listen", "127.0.0.1:0", "--refresh", "0")

    def ids(body: str) -> list[str]:
        return re.findall(r'href="/job\?id=([0-9a-f-]{36})', body)

    try:
        first = server.request("/stuck?per=25")[2]
        assert ids(first) == made[:25] and done not in first
        after = re.search(r'href="(/stuck\?[^"]*after=[^"]+)"', first)
        assert after is not None
        second = server.request(after.group(1).replace("&amp;", "&"))[2]
        assert ids(second) == made[25:]
        before = re.search(r'href="(/stuck\?[^"]*before=[^"]+)"', second)
        assert before is not None
        assert ids(server.request(before.group(1).replace("&amp;", "&"))[2]) == made[:25]
        # filters: state, name; sort: name descending (ties in creation order, reversed too)
        running = ids(server.request("/stuck?status=running")[2])
        assert running == made[:10]
        named = ids(server.request("/stuck?name=app.n1&per=100")[2])
        assert named == [t for n, t in enumerate(made) if n % 3 == 1]
        by_name = ids(server.request("/stuck?sort=name&dir=desc&per=100")[2])
        assert by_name == sorted(made, key=lambda t: (made.index(t) % 3, made.index(t)))[::-1]
        assert ids(server.request("/stuck?status=succeeded")[2]) == [done]
        # a refused value: a fixed message, never the value
        status, _headers, body = server.request("/stuck?idle=fortnight-ish")
        assert status == 400 and "fortnight-ish" not in body and "Durations are" in body
        assert server.request("/stuck?after=zzz")[0] == 400
        assert server.request("/stuck?" + "&".join(f"x{n}=1" for n in range(30)))[0] == 400
    finally:
        server.stop()


def test_a_job_page_shows_attempts_and_events_in_order(db: str) -> None:
    with Ledger(db) as led:
        root, attempt = _job(led, "app.lost", "timed_out")
    server = Served(db, "--listen", "127.0.0.1:0", "--refresh", "0")
    try:
        for asked in (root, attempt):
            status, _headers, body = server.request(f"/job?id={asked}")
            assert status == 200 and root in body and attempt in body and "owner_lost" in body
        timeline = body[body.index('class="timeline"'):]
        steps = re.findall(r"<strong>(job|attempt 1)</strong> (\w+)", timeline)
        assert steps == [("job", "created"), ("job", "started"), ("attempt 1", "created"),
                         ("attempt 1", "started"), ("attempt 1", "closed"), ("job", "closed")]
        assert "is attempt" in body  # the id asked for was the attempt
        status, _headers, body = server.request(f"/job?id={uuid.uuid4()}")
        assert status == 404 and "No job with that id" in body
        # a refused or unknown id: a fixed text, the form left empty (never the value sent)
        status, _headers, body = server.request("/job?id=not-an-id-at-all&kind=ledger")
        assert status == 400 and "not a valid id" in body and "not-an-id" not in body
        missing = str(uuid.uuid4())
        status, _headers, body = server.request(f"/job?id={missing}")
        assert status == 404 and missing not in body
    finally:
        server.stop()


def test_a_job_page_says_when_attempts_contradict_the_close(db: str) -> None:
    """A job closed other than succeeded with an attempt that succeeded after the close: the
    page says so and marks that attempt; a job whose part succeeded before it failed does
    not."""
    clock = Clock()
    with Ledger(db, clock=clock) as led:
        ids = contradicted_jobs(led, clock)
    server = Served(db, "--listen", "127.0.0.1:0", "--refresh", "0")
    try:
        for job, close, attempt in ((ids["revoked"], "cancelled/revoked", ids["revoked_success"]),
                                    (ids["lost"], "timed_out/owner_lost", ids["lost_success"])):
            for asked in (job, attempt):
                status, _headers, body = server.request(f"/job?id={asked}")
                assert status == 200 and "Attempts contradict the close" in body
                assert f"This job closed {close}, and 1 attempt of it succeeded after" in body
                rows = [r for r in re.findall(r"<tr>.*?</tr>", body) if attempt in r]
                assert len(rows) == 1 and "after the job closed" in rows[0]
            assert body.count("after the job closed") == 1  # the failed run is not marked
        for quiet in ("parts", "failed_again", "own_delivery", "duplicate", "open"):
            status, _headers, body = server.request(f"/job?id={ids[quiet]}")
            assert status == 200 and "contradict" not in body, quiet
    finally:
        server.stop()


def test_a_job_is_found_by_the_id_its_framework_gave_it(db: str) -> None:
    """What the operator pastes: a Celery task id, a Dramatiq message id, a LangGraph
    invocation id (custom ones too), or the ledger id; "any" tries each."""
    jobs = {("celery", "invoice-2024-0007"): "app.invoice", ("dramatiq", str(uuid.uuid4())):
            "send_mail", ("langgraph", "thread-9/run-3"): "agent_planner"}
    with Ledger(db) as led:
        for (framework, framework_id), name in jobs.items():
            led.create_task(task_id=job_task_id(framework, framework_id), name=name)
    server = Served(db, "--listen", "127.0.0.1:0", "--refresh", "0")
    try:
        for (framework, framework_id), name in jobs.items():
            ledger_id = job_task_id(framework, framework_id)
            for kind in ("any", framework):
                status, _headers, body = server.request(
                    f"/job?{urlencode({'id': framework_id, 'kind': kind})}")
                assert status == 200 and ledger_id in body and f"Job {name}" in body, kind
            assert server.request(f"/job?id={ledger_id}&kind=ledger")[0] == 200
            other = "dramatiq" if framework != "dramatiq" else "celery"
            status, _headers, body = server.request(
                f"/job?{urlencode({'id': framework_id, 'kind': other})}")
            assert status == 404 and "No job with that id" in body
            # the stuck-work list narrowed to that one job
            listed = server.request(f"/stuck?{urlencode({'job': framework_id})}")[2]
            assert re.findall(r'href="/job\?id=([0-9a-f-]{36})', listed) == [ledger_id]
    finally:
        server.stop()


def test_only_known_routes_and_methods(served: tuple[Served, Ledger]) -> None:
    server, _led = served
    for path in ("/metrics/", "/metrics.txt", "/tasks", "/../metrics"):
        status, _headers, body = server.request(path)
        assert status == 404 and "tsg_" not in body
    assert server.request("/login")[0] == 200  # the sign-in form (the server has a token)
    status, headers, _body = server.request("/logout")
    assert status == 405 and headers["Allow"] == "POST"
    assert server.request("/", "POST")[0] == 405
    for method in ("PUT", "DELETE", "PATCH"):
        assert server.request("/metrics", method)[0] == 501
    assert server.raw(b"GET /\r\n\r\n").startswith(b"HTTP/1.1 400 ")
    assert server.raw(b"GET / HTTP/2.0\r\n\r\n").startswith(b"HTTP/1.1 505 ")
    assert server.raw(b"GET http://x/ HTTP/1.1\r\nHost: x\r\n\r\n").startswith(b"HTTP/1.1 400 ")
    code, out, err = server.stop()
    assert code == 0 and out == "" and err == ""  # logs nothing, stops cleanly on SIGTERM


def test_every_response_carries_the_security_headers(served: tuple[Served, Ledger]) -> None:
    server, _led = served
    for path in ("/", "/stuck", "/job", "/metrics", "/nothing", "/stuck?idle=x"):
        _status, headers, body = server.request(path)
        assert headers["X-Content-Type-Options"] == "nosniff", path
        assert headers["X-Frame-Options"] == "DENY"
        assert headers["Cache-Control"] == "no-store"
        policy = headers["Content-Security-Policy"]
        assert "frame-ancestors 'none'" in policy and "default-src 'none'" in policy
        assert "unsafe-inline" not in policy and "unsafe-eval" not in policy
        if headers["Content-Type"].startswith("text/html"):
            nonce = re.search(r"script-src 'nonce-([A-Za-z0-9_-]+)'", policy)
            assert nonce is not None
            for tag in re.findall(r"<(?:script|style)\b[^>]*>", body):
                assert f'nonce="{nonce.group(1)}"' in tag, tag
            assert " on" not in " ".join(re.findall(r"<[^>]+>", body)).replace(
                "<option", "")  # no inline event handler attributes
            assert "http://" not in body.replace('xmlns="http://www.w3.org/2000/svg"', "")
            assert "https://" not in body
    # each response has its own nonce
    first = server.request("/")[1]["Content-Security-Policy"]
    assert first != server.request("/")[1]["Content-Security-Policy"]


@pytest.mark.sqlite_only(reason="a SQLite file made unreadable (file modes)")
def test_an_unreadable_ledger_answers_503_without_detail(db: str, tmp_path: Path) -> None:
    with Ledger(db) as led:
        led.create_task()
    server = Served(db, "--listen", "127.0.0.1:0")
    try:
        assert server.request("/metrics")[0] == 200
        # the ledger becomes foreign: reads fail closed, the server keeps serving
        conn = sqlite3.connect(db)
        conn.execute("CREATE TABLE foreign_thing (x)")
        conn.commit()
        conn.close()
        status, _headers, body = server.request("/metrics")
        assert status == 503 and body == "error: StateConflict\n"
        status, _headers, page = server.request("/stuck")
        assert status == 503 and "StateConflict" in page
        assert '<meta http-equiv="refresh" content="30">' in page  # read again on refresh
        for text in (body, page):
            assert db not in text and str(tmp_path) not in text and "Traceback" not in text
        assert server.request("/nothing")[0] == 404
    finally:
        code, _out, err = server.stop()
    assert code == 0 and err == ""


# ----------------------------------------------------------------------------- connections


def test_one_idle_connection_does_not_block_a_page_load(scraped: Served) -> None:
    """An idle client, and one that sends half a request, hold one worker each until their
    read timeout: every other request is answered meanwhile (before: one idle connection
    stopped every scrape until it left)."""
    server = scraped
    idle = socket.create_connection((server.host, server.port))
    partial = socket.create_connection((server.host, server.port))
    partial.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    try:
        for path in ("/metrics", "/", "/stuck"):
            assert server.request(path)[0] == 200
    finally:
        idle.close()
        partial.close()


def test_a_client_that_resets_is_counted_quietly(scraped: Served) -> None:
    """A reset before the request is complete, and one before the response is read: nothing
    on stderr (before: a traceback with install paths), counted under reason="reset"."""
    server = scraped

    def resets() -> float:
        family = parse(server.request("/metrics")[2]).get(SERVER_FAMILY)
        return -1 if family is None else family.value(reason="reset")

    for _round in range(5):
        half = socket.create_connection((server.host, server.port))
        half.sendall(b"GET /metrics HTTP/1.1\r\nHo")
        time.sleep(0.05)
        reset(half)
        whole = socket.create_connection((server.host, server.port))
        whole.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        time.sleep(0.01)
        reset(whole)
        counted = resets()
        if counted >= 2:
            break
    code, out, err = server.stop()
    assert (code, out, err) == (0, "", "")
    assert counted >= 2


def _answer_from(server: Served, source: str) -> bytes:
    """A whole answer to one request sent from the loopback address ``source``."""
    with socket.create_connection((server.host, server.port), timeout=30,
                                  source_address=(source, 0)) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     + f"Authorization: Bearer {server.token}\r\n\r\n".encode())
        chunks = []
        with contextlib.suppress(ConnectionResetError):
            while chunk := sock.recv(65536):
                chunks.append(chunk)
    return b"".join(chunks)


def test_a_flood_of_connections_is_bounded(served: tuple[Served, Ledger]) -> None:
    """Idle connections cost a socket, not a thread. One client (an IP address) holds at most
    32: its next connection closes its own oldest idle one, so it is still answered, and
    nobody else is pushed out. Beyond 256 connections from all clients, the next closes the
    oldest idle connection of all and is answered (before: 503 for as long as the idle ones
    were held). Both count as overload."""
    server, _led = served
    own = [socket.create_connection((server.host, server.port)) for _ in range(32)]
    others: list[socket.socket] = []
    try:
        assert server.request("/metrics")[0] == 200
        own[0].settimeout(30)
        assert own[0].recv(100) == b""  # the oldest idle one was closed, nothing sent
        for n in range(2, 10):  # 8 more clients (127.0.0.2-9), 32 idle connections each
            others += [socket.create_connection((server.host, server.port),
                                                source_address=(f"127.0.0.{n}", 0))
                       for _ in range(32)]
        assert _answer_from(server, "127.0.0.10").startswith(b"HTTP/1.1 200 ")
        own[1].settimeout(30)
        assert own[1].recv(100) == b""  # the oldest idle one of all made room
        newest = others[-1]  # the newest idle ones were kept
        assert newest.send(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n"
                           + f"Authorization: Bearer {server.token}\r\n\r\n".encode())
        newest.settimeout(30)
        assert newest.recv(100).startswith(b"HTTP/1.1 200 ")
    finally:
        for sock in own + others:
            sock.close()
    status, _headers, body = server.request("/metrics")
    assert status == 200 and parse(body)[SERVER_FAMILY].value(reason="overload") >= 2


def test_server_header_and_a_prompt_quiet_exit_on_sigterm(scraped: Served) -> None:
    """`Server: task-state-guard` with nothing after it (before: a trailing space), and SIGTERM
    with an idle and a half-sent connection open ends the process at once: exit 0, nothing on
    stderr, the port closed."""
    server = scraped
    head = server.raw(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").split(b"\r\n\r\n")[0]
    assert b"\r\nServer: task-state-guard\r\n" in head + b"\r\n"
    idle = socket.create_connection((server.host, server.port))
    partial = socket.create_connection((server.host, server.port))
    partial.sendall(b"GET / HTTP/1.1\r\n")
    try:
        code, out, err = server.stop()
        assert (code, out, err) == (0, "", "")
        for sock in (idle, partial):
            sock.settimeout(10)
            with contextlib.suppress(ConnectionResetError):  # the half-sent request unread
                assert sock.recv(100) == b""  # closed by the server, nothing sent
        with pytest.raises(OSError):
            socket.create_connection((server.host, server.port), timeout=5).close()
    finally:
        idle.close()
        partial.close()


# ----------------------------------------------------------------------------- access


def test_beyond_loopback_needs_a_token(db: str, tmp_path: Path) -> None:
    with Ledger(db) as led:
        led.create_task(name="app.secret")
    refused = run_cli("--db", db, "serve", "--listen", "0.0.0.0:0", "--no-token")
    assert_cli_error(refused, "InvalidInput")
    refused = run_cli("--explain", "--db", db, "serve", "--listen", "0.0.0.0:0", "--no-token")
    assert_cli_error(refused, "InvalidInput", reason="serve_token_required")
    weak = run_cli("--explain", "--db", db, "serve", "--listen", "0.0.0.0:0",
                   env=cli_env({"TSG_SERVE_TOKEN": "short"}))
    assert_cli_error(weak, "InvalidInput", reason="serve_token_invalid")
    unreadable = run_cli("--explain", "--db", db, "serve", "--token-file",
                         str(tmp_path / "missing"))
    assert_cli_error(unreadable, "InvalidInput", reason="serve_token_invalid")
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    for options, env in ((["--token-file", str(token_file)], None),
                         ([], {"TSG_SERVE_TOKEN": TOKEN})):
        server = Served(db, "--listen", "0.0.0.0:0", "--refresh", "0", *options, env=env,
                        token=None)
        try:
            status, headers, body = server.request("/metrics")
            assert status == 401 and headers["WWW-Authenticate"].startswith("Bearer")
            assert "tsg_" not in body
            status, _headers, body = server.request("/stuck")
            assert status == 401 and "app.secret" not in body and 'action="/login"' in body
            assert server.request("/metrics", headers={"Authorization": "Bearer nope"})[0] == 401
            bearer = {"Authorization": f"Bearer {TOKEN}"}
            assert server.request("/metrics", headers=bearer)[0] == 200
            assert "app.secret" in server.request("/stuck", headers=bearer)[2]
            # the sign-in form: a wrong token is refused, the right one sets the session
            form = {"Content-Type": "application/x-www-form-urlencoded"}
            status, headers, body = server.request("/login", "POST", headers=form,
                                                   body=b"token=wrong&next=/stuck")
            assert status == 401 and "Set-Cookie" not in headers
            status, headers, _body = server.request(
                "/login", "POST", headers=form,
                body=f"token={TOKEN}&next=/stuck".encode())
            assert status == 303 and headers["Location"] == "/stuck"
            cookie = headers["Set-Cookie"]
            assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and TOKEN not in cookie
            assert "Max-Age=43200" in cookie and "Secure" not in cookie  # 12 h, plain HTTP
            session = {"Cookie": cookie.split(";")[0]}
            assert "app.secret" in server.request("/stuck", headers=session)[2]
            assert server.request("/stuck", headers={"Cookie": "tsg_session=forged"})[0] == 401
            # an off-site "next" is not followed
            status, headers, _body = server.request(
                "/login", "POST", headers=form, body=f"token={TOKEN}&next=//evil/".encode())
            assert headers["Location"] == "/"
        finally:
            code, _out, err = server.stop()
        assert code == 0 and err == ""


def test_without_a_token_only_loopback_hosts_are_answered(db: str) -> None:
    """`--no-token`: a web page elsewhere cannot read the view through DNS rebinding: the
    Host it sends names its own domain."""
    with Ledger(db) as led:
        led.create_task(name="app.add")
    server = Served(db, "--listen", "127.0.0.1:0", "--refresh", "0", "--no-token")
    try:
        for host in ("evil.example", "evil.example:9464", "10.0.0.1"):
            status, _headers, body = server.request("/stuck", headers={"Host": host})
            assert status == 421 and "app.add" not in body
        for host in ("localhost", f"localhost:{server.port}", f"127.0.0.1:{server.port}"):
            assert server.request("/stuck", headers={"Host": host})[0] == 200
        assert server.request("/login")[0] == 404  # nothing to sign in to
    finally:
        code, _out, err = server.stop()
    assert code == 0 and err == ""


def test_serve_fails_fast_on_a_missing_ledger_or_a_taken_port(db: str, tmp_path: Path) -> None:
    missing = run_cli("--db", str(tmp_path / "none.sqlite"), "serve", "--listen", "127.0.0.1:0")
    assert_cli_error(missing, "InvalidInput")
    assert not os.path.exists(tmp_path / "none.sqlite")
    for bad in (["--listen", "localhost:80"], ["--refresh", "2w"], ["--listen", "1.2.3.4:99999"]):
        assert_cli_error(run_cli("--db", db, "serve", *bad), "InvalidInput")
    assert_cli_error(run_cli("--db", db, "metrics", "--token-file", "x"), "InvalidInput")
    with Ledger(db) as led:
        led.create_task()
    first = Served(db, "--listen", "127.0.0.1:0")
    try:
        for command in (["serve"], ["metrics", "--serve"]):
            taken = run_cli("--db", db, *command, "--listen", f"127.0.0.1:{first.port}")
            assert_cli_error(taken, "InvalidInput")
    finally:
        first.stop()


def test_no_network_module_loads_unless_serving() -> None:
    code = ("import sys, task_state_guard, task_state_guard.cli, task_state_guard.integration\n"
            "from task_state_guard.cli import main\n"
            "import contextlib, io\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    main(['--db', '/nonexistent/x.sqlite', 'metrics'])\n"
            "    main(['--db', '/nonexistent/x.sqlite', 'serve'])\n"
            "print(sorted(m for m in ('http.server', 'socketserver', 'socket',\n"
            "             'wsgiref.handlers', 'task_state_guard.web.server',\n"
            "             'task_state_guard.web.app')\n"
            "             if m in sys.modules))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=cli_env(), check=True)
    assert result.stdout == "[]\n"


def test_a_stop_signal_delivered_to_a_worker_thread_stops_the_server() -> None:
    """The kernel may hand SIGTERM to any thread; one that lands on a worker still stops the
    server (the selector is woken, the handler runs), instead of waiting for a connection."""
    script = (
        "import signal, threading\n"
        "from task_state_guard.web.server import HttpServer\n"
        "server = HttpServer(('127.0.0.1', 0), lambda environ, start_response: [])\n"
        "worker = next(t for t in threading.enumerate() if t.name.startswith('tsg-serve-'))\n"
        "threading.Timer(0.5, signal.pthread_kill, (worker.ident, signal.SIGTERM)).start()\n"
        "server.serve_until_signal()\n"
        "print('stopped')\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=30, check=False)
    assert (proc.returncode, proc.stdout) == (0, "stopped\n")
