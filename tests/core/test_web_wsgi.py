"""The web view as a WSGI application: malformed requests to a running `tsg serve` over raw
sockets (never a 500, never a crash, never the value echoed), and `make_wsgi_app` mounted in
the standard library's own WSGI server."""

from __future__ import annotations

import contextlib
import http.client
import io
import re
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import pytest
from core_helpers import assert_cli_error, run_cli
from ledger_backends import stored_state
from prom_text import parse
from serve_helpers import Served
from task_state_guard import InvalidInput, Ledger
from task_state_guard.web import make_wsgi_app

TOKEN = "wsgi-token-for-the-tests-" + "y" * 8
#: Digits ``str.isdigit`` accepts and ``int`` may refuse: superscript two, Arabic-Indic three,
#: full-width one, and whole numbers too long for any field.
ODD_DIGITS = ("\u00b2", "\u0663", "\uff11", "9" * 30, "9" * 5000)
#: The query values that are numbers, or hold one (a page position is ``KEY.SEQUENCE``).
NUMERIC_KEYS = ("per", "idle", "older", "after", "before", "window", "refresh")


def _raw(server: Served, data: bytes) -> bytes:
    """Send ``data`` as it is, end the sending side, and read the whole answer."""
    with socket.create_connection((server.host, server.port), timeout=30) as sock:
        with contextlib.suppress(OSError):  # a server that answered early may reset the rest
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
        chunks = []
        with contextlib.suppress(ConnectionResetError):
            while chunk := sock.recv(65536):
                chunks.append(chunk)
    return b"".join(chunks)


def _status(answer: bytes) -> int:
    match = re.match(rb"HTTP/1\.1 (\d{3}) ", answer)
    assert match is not None, answer[:200]
    return int(match.group(1))


def _job(led: Ledger) -> str:
    root = led.create_task(name="app.wsgi")
    led.start_task(root.id, owner=False)
    return root.id


def _every_page(job: str) -> list[str]:
    return ["/", "/?window=1h", "/stuck", "/stuck?per=25&sort=name&dir=desc", "/job",
            f"/job?id={job}", "/metrics"]


#: What a refusal may answer: a client error, or "not implemented" / "version not supported".
REFUSED = frozenset({*range(400, 500), 501, 505})


def _malformed_requests() -> list[tuple[bytes, frozenset[int]]]:
    """Requests, each with the statuses it may be answered (never 500)."""
    head = b"GET /stuck HTTP/1.1\r\nHost: localhost\r\n"
    bad: list[tuple[bytes, frozenset[int]]] = [(data, REFUSED) for data in (
        b"\r\n\r\n", b"GET\r\n\r\n", b"GET /\r\n\r\n", b"GET / HTTP/1.1 x\r\n\r\n",
        b"G\xb2T / HTTP/1.1\r\n\r\n", b"GET /\xb2 HTTP/1.1\r\nHost: localhost\r\n\r\n",
        b"GET / HTTP/\xb2.1\r\n\r\n", b"GET / HTTP/1.\xb2\r\n\r\n", b"GET / HTTP/2.0\r\n\r\n",
        b"GET / HTTP/" + b"1" * 40 + b".1\r\n\r\n", b"GET / HTTP/1.1\r\n" * 3,
        b"GET http://x/ HTTP/1.1\r\nHost: x\r\n\r\n", b"\x00\x01\x02\xff\r\n\r\n",
        b"GET /" + b"a" * 70000 + b" HTTP/1.1\r\n\r\n",
        head + b"No colon here\r\n\r\n", head + b" folded: line\r\n\r\n",
        head + b"Host : localhost\r\n\r\n", head + b"X: a\x00b\r\n\r\n",
        head + b"X: " + b"v" * 70000 + b"\r\n\r\n",
        head + b"".join(b"X-%d: 1\r\n" % n for n in range(200)) + b"\r\n",
        head + b"Host: localhost\r\n\r\n", head + b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        b"GET /stuck HTTP/1.1\r\nHost: \xb2\xb2\xb2\r\n\r\n",
        b"POST /login HTTP/1.1\r\nHost: localhost\r\nContent-Length: 5\r\n"
        b"Content-Length: 5\r\n\r\nabcde",
    )]
    # odd bytes in the values the view reads but does not parse as numbers: answered as usual
    bad.append((head + b"Cookie: tsg_session=\xb2\xff\r\nAuthorization: Bearer \xb2\r\n\r\n",
                frozenset({200})))
    for length in ("\u00b2", "\u0663", "\uff11", "-1", "+5", "1e3", "0x10", "5 5", "9" * 30,
                   "9" * 5000, "4097"):
        for encoding in ("utf-8", "latin-1"):
            bad.append((b"POST /login HTTP/1.1\r\nHost: localhost\r\nContent-Length: "
                        + length.encode(encoding, "replace") + b"\r\n\r\ntoken=x",
                        frozenset({400, 413})))
    for key in NUMERIC_KEYS:
        # each key on the page that reads it (refresh is "off" or ignored: any page)
        path, refused = {"window": ("/", frozenset({400})),
                         "refresh": ("/", frozenset({200}))}.get(key, ("/stuck", frozenset({400})))
        for odd in ODD_DIGITS:
            # a long run of ASCII nines can still be a duration (1.999...): answered or refused
            allowed = refused | {200} if odd.isascii() and key in ("idle", "older") else refused
            for value in (quote(odd), f"1.{quote(odd)}", f"{quote(odd)}.1", f"{quote(odd)}m"):
                bad.append((f"GET {path}?{key}={value} HTTP/1.1\r\nHost: localhost\r\n\r\n"
                            .encode("ascii"), allowed))
        bad.append((f"GET {path}?{key}=".encode("ascii") + b"\xb2 HTTP/1.1\r\nHost: localhost"
                    b"\r\n\r\n", REFUSED))
    return bad


def test_malformed_requests_never_crash_or_echo(db: str) -> None:
    """Every malformed head, bad byte and odd digit: a 4xx (or 501/505) with a fixed text,
    never a 500, never the value sent; afterwards every page still loads, nothing was
    written, and the server stops cleanly (before: `Content-Length: ²` ended the server)."""
    with Ledger(db) as led:
        job = _job(led)
    server = Served(db, "--listen", "127.0.0.1:0", "--refresh", "0", "--no-token")
    try:
        before = stored_state(db)
        for data, allowed in _malformed_requests():
            answer = _raw(server, data)
            status = _status(answer)
            assert status in allowed, (status, data[:80])
            body = answer.partition(b"\r\n\r\n")[2].decode("utf-8")
            for odd in ODD_DIGITS if status != 200 else ():  # an accepted value is shown
                assert odd not in body, data[:80]
            assert "Traceback" not in body
            assert server.proc.poll() is None, data[:80]
        for path in _every_page(job):
            assert server.request(path)[0] == 200, path
        body = server.request("/metrics")[2]
        dropped = parse(body)["tsg_serve_connections_dropped_total"]
        assert dropped.value(reason="malformed") >= 20 and dropped.value(reason="internal") == 0
        assert stored_state(db) == before
    finally:
        code, out, err = server.stop()
    assert (code, out, err) == (0, "", "")


def test_a_request_that_stops_mid_way_is_dropped_quietly(db: str) -> None:
    """Half a head, then the client's end closed; a body shorter than its length: answered
    400 or closed, nothing on stderr, the server keeps serving."""
    with Ledger(db) as led:
        job = _job(led)
    server = Served(db, "--listen", "127.0.0.1:0", "--refresh", "0", "--no-token")
    try:
        for data in (b"GET /stuck HTTP/1.1\r\nHo", b"GET /stu",
                     b"POST /login HTTP/1.1\r\nHost: localhost\r\nContent-Length: 10\r\n\r\nab"):
            answer = _raw(server, data)
            assert answer == b"" or 400 <= _status(answer) < 500, answer[:80]
        for path in _every_page(job):
            assert server.request(path)[0] == 200, path
    finally:
        code, out, err = server.stop()
    assert (code, out, err) == (0, "", "")


def test_a_request_sent_a_byte_at_a_time_is_cut_at_its_deadline(db: str) -> None:
    """Each byte well within the per-read timeout, but the whole request late (10 s after the
    connection was accepted): the connection is closed unanswered and counted as a timeout;
    other clients are answered meanwhile."""
    with Ledger(db) as led:
        _job(led)
    server = Served(db, "--listen", "127.0.0.1:0", "--refresh", "0")
    try:
        with socket.create_connection((server.host, server.port), timeout=30) as slow:
            slow.sendall(b"GET /stuck HTTP/1.1\r\nX-Slow: ")
            slow.settimeout(1)
            answer, closed = b"", False
            for _second in range(60):
                try:
                    slow.sendall(b"x")
                    answer = slow.recv(100)
                except TimeoutError:
                    assert server.request("/stuck")[0] == 200
                    continue
                except OSError:
                    pass
                closed = True
                break
        assert closed and answer == b""
        dropped = parse(server.request("/metrics")[2])["tsg_serve_connections_dropped_total"]
        assert dropped.value(reason="timeout") >= 1
    finally:
        code, out, err = server.stop()
    assert (code, out, err) == (0, "", "")


# ----------------------------------------------------------------------------- mounted


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextlib.contextmanager
def _mounted(app: Any) -> Iterator[WSGIServer]:
    """``app`` in the standard library's reference WSGI server, in a thread."""
    server = make_server("127.0.0.1", 0, app, handler_class=_Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def _get(server: WSGIServer, path: str, headers: dict[str, str] | None = None,
         ) -> tuple[int, dict[str, str], str]:
    conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=30)
    try:
        conn.request("GET", path, headers=headers or {})
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read().decode()
    finally:
        conn.close()


def test_make_wsgi_app_serves_the_pages_in_another_wsgi_server(db: str) -> None:
    """The public WSGI app in wsgiref's server: the same pages, `/metrics`, security headers
    and Host check as `tsg serve`, read-only; without the serving process's own counters."""
    with Ledger(db) as led:
        job = _job(led)
    app = make_wsgi_app(db, refresh_seconds=0, no_token=True)
    before = stored_state(db)
    with _mounted(app) as server:
        for path in _every_page(job):
            status, headers, body = _get(server, path)
            assert status == 200, path
            assert headers["X-Content-Type-Options"] == "nosniff"
            assert "frame-ancestors 'none'" in headers["Content-Security-Policy"]
        assert job in _get(server, f"/job?id={job}")[2]
        metrics = parse(_get(server, "/metrics")[2])
        assert metrics["tsg_tasks"].value(kind="task", status="running") == 1
        assert "tsg_serve_connections_dropped_total" not in metrics
        status, _headers, body = _get(server, "/stuck", {"Host": "evil.example"})
        assert status == 421 and "app.wsgi" not in body
        assert _get(server, "/nothing")[0] == 404
    assert stored_state(db) == before


def test_make_wsgi_app_with_a_token(db: str) -> None:
    with Ledger(db) as led:
        _job(led)
    app = make_wsgi_app(db, token=TOKEN)
    with _mounted(app) as server:
        status, headers, body = _get(server, "/metrics", {"Host": "tsg.example"})
        assert status == 401 and headers["WWW-Authenticate"].startswith("Bearer")
        assert "tsg_" not in body
        bearer = {"Host": "tsg.example", "Authorization": f"Bearer {TOKEN}"}
        assert _get(server, "/metrics", bearer)[0] == 200
        assert "app.wsgi" in _get(server, "/stuck", bearer)[2]


def _call(app: Any, **environ: Any) -> tuple[str, dict[str, str], bytes]:
    """Call a WSGI app directly with a made-up environ (values as a server passes them)."""
    answer: dict[str, Any] = {}

    def start_response(status: str, headers: list[tuple[str, str]],
                       exc_info: Any = None) -> Any:
        answer["status"], answer["headers"] = status, dict(headers)
        return lambda data: None

    base = {"REQUEST_METHOD": "GET", "PATH_INFO": "/", "QUERY_STRING": "",
            "HTTP_HOST": "localhost", "wsgi.input": io.BytesIO(b"")}
    body = b"".join(app({**base, **environ}, start_response))
    return answer["status"], answer["headers"], body


def test_make_wsgi_app_refuses_odd_digits_in_any_server(db: str) -> None:
    """What another server may pass through unchecked (raw bytes as Latin-1 text, PEP 3333):
    odd digits in every numeric query value and in `CONTENT_LENGTH` answer 400 with a fixed
    text that never repeats them; a HEAD answers the headers only."""
    with Ledger(db) as led:
        _job(led)
    app = make_wsgi_app(db, no_token=True)
    for key in ("per", "idle", "older", "after", "before", "window"):
        for odd in (digit for digit in ODD_DIGITS if not digit.isascii()):
            raw = odd.encode("utf-8").decode("latin-1")  # the bytes a client sent, unescaped
            for value in (odd, raw, f"1.{raw}", f"{raw}.1"):
                status, _headers, body = _call(app, PATH_INFO="/" if key == "window" else
                                               "/stuck", QUERY_STRING=f"{key}={value}")
                assert status.startswith("400 "), (key, value)
                assert odd.encode("utf-8") not in body and raw.encode("utf-8") not in body
    for length in ("\u00b2", "\xb2", "\u0663", "-1", "9" * 5000, "4097"):
        status, _headers, body = _call(app, REQUEST_METHOD="POST", PATH_INFO="/login",
                                       CONTENT_LENGTH=length,
                                       **{"wsgi.input": io.BytesIO(b"token=x")})
        assert status[:3] in ("400", "413") and length.encode("utf-8") not in body, length
    status, headers, body = _call(app, REQUEST_METHOD="HEAD")
    assert status.startswith("200 ") and body == b"" and int(headers["Content-Length"]) > 0


def test_make_wsgi_app_fails_fast(db: str, tmp_path: Path) -> None:
    """A missing ledger and a weak token are refused when the app is made, not per request."""
    with pytest.raises(InvalidInput):
        make_wsgi_app(str(tmp_path / "none.sqlite"), no_token=True)
    assert not (tmp_path / "none.sqlite").exists()
    with Ledger(db) as led:
        _job(led)
    for bad in ({"token": "short"}, {"token": "has spaces but is long enough"},
                {"token": TOKEN, "no_token": True}, {"no_token": 1},
                {"refresh_seconds": -1}, {"refresh_seconds": True},
                {"active_grace_seconds": float("nan")}, {"active_grace_seconds": "600"},
                {"metrics_dir": ""}):
        with pytest.raises(InvalidInput):
            make_wsgi_app(db, **{**({} if "token" in bad else {"no_token": True}), **bad})


def test_the_listen_port_takes_ascii_digits_only(db: str) -> None:
    for port in ("\u00b2", "\u0663", "9" * 5000, "-1"):
        assert_cli_error(run_cli("--db", db, "serve", "--listen", f"127.0.0.1:{port}"),
                         "InvalidInput")
