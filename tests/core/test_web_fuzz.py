"""Every malformed request head and byte class against a real `tsg serve`, over raw sockets:
each answer is a fixed refusal (never a 500, never the value sent) carrying the same security
headers as every page, the server keeps running, and afterwards every page still loads."""

from __future__ import annotations

import contextlib
import re
import socket
from urllib.parse import quote

from ledger_backends import stored_state
from prom_text import parse
from serve_helpers import Served
from task_state_guard import Ledger

#: The headers every answer carries, pages and the server's own refusals alike.
SECURITY = {
    "x-content-type-options": "nosniff",
    "cache-control": "no-store",
    "x-frame-options": "DENY",
    "referrer-policy": "no-referrer",
}
#: What a refusal may answer: a client error, or "not implemented" / "version not supported".
REFUSED = frozenset({*range(400, 500), 501, 505})
ANSWERED = REFUSED | {200}
#: A marker beside each odd byte: a refusal's body never contains it.
MARK = b"zqx-mark"
#: Digits `str.isdigit` accepts and `int` may refuse, and whole numbers too long for a field:
#: superscript two (Latin-1 0xB2), superscript one and three, Arabic-Indic three, Devanagari
#: five, full-width one.
ODD_DIGITS = ("\u00b2", "\u00b9", "\u00b3", "\u0663", "\u096b", "\uff11", "9" * 30, "9" * 5000)
#: The headers that hold a number (the view reads Content-Length; the rest must not matter).
NUMERIC_HEADERS = ("Content-Length", "Max-Forwards", "Upgrade-Insecure-Requests", "Age",
                   "Keep-Alive", "Retry-After", "DNT", "Content-Range", "Range")
#: The query values that are numbers or hold one (a page position is ``KEY.SEQUENCE``).
NUMERIC_KEYS = ("per", "idle", "older", "after", "before", "window", "refresh")
PAGES = ("/", "/stuck", "/job", "/metrics", "/login")
HEAD = b"GET /stuck HTTP/1.1\r\nHost: localhost\r\n"


def _send(server: Served, data: bytes) -> bytes:
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


def _requests() -> list[tuple[bytes, frozenset[int]]]:
    """Malformed or odd requests, each with the statuses it may be answered."""
    cases: list[tuple[bytes, frozenset[int]]] = []
    for n in range(256):
        b = bytes([n])
        cases += [
            (MARK + b + b" /stuck HTTP/1.1\r\nHost: localhost\r\n\r\n", REFUSED),
            (b"GET /stuck?name=" + MARK + b + b" HTTP/1.1\r\nHost: localhost\r\n\r\n", ANSWERED),
            (b"GET /" + MARK + b + b" HTTP/1.1\r\nHost: localhost\r\n\r\n", REFUSED),
            (HEAD + b"X-" + MARK + b + b"y: 1\r\n\r\n", ANSWERED),
            (HEAD + b"X-Value: " + MARK + b + b"b\r\n\r\n", ANSWERED),
            (b"GET /stuck HTTP/1.1\r\nHost: local" + MARK + b + b"\r\n\r\n", REFUSED),
            (b"GET /stuck HTTP/1." + b + b"\r\nHost: localhost\r\n\r\n", ANSWERED),
            (b"GET /stuck " + b + b"TTP/1.1\r\nHost: localhost\r\n\r\n", ANSWERED),
        ]
    for odd in ODD_DIGITS:
        for encoding in ("utf-8", "latin-1"):
            raw = odd.encode(encoding, "replace")
            for name in NUMERIC_HEADERS:
                allowed = frozenset({400, 413}) if name == "Content-Length" else ANSWERED
                for method, path in (("GET", "/stuck"), ("POST", "/login"), ("GET", "/metrics")):
                    cases.append((f"{method} {path} HTTP/1.1\r\nHost: localhost\r\n{name}: "
                                  .encode("ascii") + raw + b"\r\n\r\n", allowed))
            port = frozenset({400, 421, *((200,) if odd.isascii() else ())})  # 99...: a port
            cases.append((b"GET /stuck HTTP/1.1\r\nHost: localhost:" + raw + b"\r\n\r\n", port))
            for page in PAGES:
                for key in NUMERIC_KEYS:
                    for value in (quote(odd), f"1.{quote(odd)}", f"{quote(odd)}.1"):
                        cases.append((f"GET {page}?{key}={value} HTTP/1.1\r\nHost: "
                                      "localhost\r\n\r\n".encode("ascii"), ANSWERED))
                    cases.append((f"GET {page}?{key}=".encode("ascii") + raw
                                  + b" HTTP/1.1\r\nHost: localhost\r\n\r\n", ANSWERED))
    for cursor in ("9" * 19 + ".1", "1." + "9" * 19, "-1.-1", "0x1p99999.1", "inf.1", "nan.1",
                   "1e309.1", "ffff.1", "9" * 999 + ".1", "." * 50, "1..1"):
        for key in ("after", "before"):
            for order in ("created", "activity", "name", "status"):
                cases.append((f"GET /stuck?sort={order}&{key}={quote(cursor)} HTTP/1.1\r\n"
                              "Host: localhost\r\n\r\n".encode("ascii"), ANSWERED))
    for name in ("Host", "Content-Length", "Authorization", "Cookie", "Content-Type",
                 "Transfer-Encoding"):
        value = {"Host": b"localhost", "Content-Length": b"0"}.get(name, b"x")
        cases.append((b"POST /login HTTP/1.1\r\nHost: localhost\r\n" + name.encode() + b": "
                      + value + b"\r\n" + name.encode() + b": " + value + b"\r\n\r\n", REFUSED))
    for version in (b"HTTP/0.9", b"HTTP/2.0", b"HTTP/3", b"HTTP/1.10", b"HTTP/01.1",
                    b"http/1.1", b"HTTP/1.1.1", b"HTTP/1", b"HTTP/", b"HTTP/1.1 extra",
                    b"HTTP/\xb2.1", b"HTTP/1.\xb2", b"HTTP/" + b"1" * 60 + b".1"):
        cases.append((b"GET /stuck " + version + b"\r\nHost: localhost\r\n\r\n", REFUSED))
    cases += [(data, REFUSED) for data in (
        b"\r\n\r\n", b" \r\n\r\n", b"GET\r\n\r\n", b"GET /\r\n\r\n", b"\x00" * 64 + b"\r\n\r\n",
        b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n",
        HEAD + b"X-Long: " + b"v" * 70_000 + b"\r\n\r\n",
        HEAD + b"".join(b"X-%d: 1\r\n" % n for n in range(200)) + b"\r\n",
        HEAD + b"X-Fold: a\r\n folded\r\n\r\n", HEAD + b"X-Fold: a\r\n\tfolded\r\n\r\n",
        HEAD + b" leading: space\r\n\r\n", HEAD + b"No colon\r\n\r\n",
        HEAD + b"X-Cr: a\rb\r\n\r\n", HEAD + b"Host : localhost\r\n\r\n",
        HEAD + b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        b"GET http://localhost/stuck HTTP/1.1\r\nHost: localhost\r\n\r\n",
        b"GET //evil.example/ HTTP/1.1\r\nHost: localhost\r\n\r\n",
        b"GET /stuck HTTP/1.1\rHost: localhost\r\r",
        b"POST /login HTTP/1.1\r\nHost: localhost\r\nContent-Length: 5000\r\n\r\n" + b"x" * 5000,
    )]
    cases += [(data, ANSWERED) for data in (
        b"GET /stuck HTTP/1.1\nHost: localhost\n\n",  # bare LF ends lines as HTTP allows
        b"GET /stuck HTTP/1.0\r\n\r\n",
    )]
    return cases


def _answer(data: bytes) -> tuple[int, dict[str, str], bytes]:
    match = re.match(rb"HTTP/1\.[01] (\d{3}) ", data)
    assert match is not None, data[:200]
    head, _, body = data.partition(b"\r\n\r\n")
    headers = {}
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(match.group(1)), headers, body


def test_every_malformed_head_and_byte_is_refused_with_the_security_headers(db: str) -> None:
    """Each byte 0x00-0xFF in the method, target, query, header name and value, Host and
    version; odd digits in every numeric header and every numeric query value of every page;
    out-of-range page positions; over-long lines; repeated single headers; bad versions;
    folded lines; bare CR and LF. Every answer: an allowed status, never 500, the security
    headers, and a refusal never repeats what was sent. Then every page loads, nothing was
    written, nothing counted as an internal error, and the server stops cleanly."""
    with Ledger(db) as led:
        root = led.create_task(name="app.fuzz")
        led.start_task(root.id, owner=False)
    # without a token every request reaches the application (its query values included)
    server = Served(db, "--listen", "127.0.0.1:0", "--refresh", "0", "--no-token")
    try:
        before = stored_state(db)
        cases = _requests()
        assert len(cases) > 2500
        for data, allowed in cases:
            status, headers, body = _answer(_send(server, data))
            assert status in allowed, (status, data[:80])
            for name, value in SECURITY.items():
                assert headers.get(name) == value, (name, status, data[:80])
            assert "frame-ancestors 'none'" in headers.get("content-security-policy", "")
            if status != 200:
                assert MARK not in body, (status, data[:80])
                text = body.decode("utf-8")
                assert "Traceback" not in text
                assert not any(odd in text for odd in ODD_DIGITS), (status, data[:80])
            assert server.proc.poll() is None, data[:80]
        for path in ("/", "/?window=7d", "/stuck", "/stuck?status=running&sort=name&dir=desc",
                     "/job", f"/job?id={root.id}", "/metrics"):
            status, headers, _body = server.request(path)
            assert status == 200 and headers["X-Frame-Options"] == "DENY", path
        dropped = parse(server.request("/metrics")[2])["tsg_serve_connections_dropped_total"]
        assert dropped.value(reason="malformed") >= 100
        assert dropped.value(reason="internal") == 0
        assert stored_state(db) == before
    finally:
        code, out, err = server.stop()
    assert (code, out, err) == (0, "", "")
