"""The web view's requests and responses: a WSGI environ read into a :class:`Request`, a
:class:`Response`, the security headers every answer carries, and the counters of connections
that ended badly. A value the view refuses raises :class:`BadInput`, whose text is fixed and
never the value sent.
"""

from __future__ import annotations

import ipaddress
import re
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import parse_qs

from ..durations import parse_count
from ..model import InvalidInput

if TYPE_CHECKING:
    from wsgiref.types import WSGIEnvironment

HTML = "text/html; charset=utf-8"
ASCII_DIGITS = re.compile(r"[0-9]+", re.ASCII)
#: The largest request body read (the sign-in form); a longer one is answered 413.
MAX_BODY = 4 * 1024
#: The reasons a connection is counted under (``tsg_serve_connections_dropped_total``).
REASONS = ("reset", "timeout", "overload", "malformed", "internal")
PHRASES = {200: "OK", 303: "See Other", 400: "Bad Request", 401: "Unauthorized",
            404: "Not Found", 405: "Method Not Allowed", 413: "Content Too Large",
            421: "Misdirected Request", 429: "Too Many Requests",
            500: "Internal Server Error", 501: "Not Implemented", 503: "Service Unavailable"}


@dataclass(frozen=True, slots=True)
class Request:
    """One request: method, path, query string, the headers the app reads (names lowercased),
    body, the client's address and the URL scheme the server says it was sent over."""

    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes
    client: str = ""
    scheme: str = "http"


@dataclass(slots=True)
class Response:
    """One response: status, body, content type and further headers."""

    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"
    headers: list[tuple[str, str]] = field(default_factory=list)


class Counters:
    """Connections that ended badly, by reason (thread-safe; never reset)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(REASONS, 0)

    def add(self, reason: str) -> None:
        """Count one connection under ``reason`` (one of :data:`REASONS`)."""
        with self._lock:
            self._counts[reason] += 1

    def snapshot(self) -> dict[str, int]:
        """The counts so far, by reason."""
        with self._lock:
            return dict(self._counts)


def common_headers(policy: str) -> list[tuple[str, str]]:
    return [
        ("Content-Security-Policy", policy),
        ("X-Content-Type-Options", "nosniff"),
        ("X-Frame-Options", "DENY"),
        ("Referrer-Policy", "no-referrer"),
        ("Cache-Control", "no-store"),
        ("Cross-Origin-Opener-Policy", "same-origin"),
        ("Cross-Origin-Resource-Policy", "same-origin"),
    ]


def plain_headers() -> list[tuple[str, str]]:
    """The security headers of a plain-text answer (also the server's own error answers)."""
    return common_headers(PLAIN_POLICY)


def html_policy(nonce: str) -> str:
    return (f"default-src 'none'; script-src 'nonce-{nonce}'; style-src 'nonce-{nonce}'; "
            "img-src data:; form-action 'self'; base-uri 'none'; frame-ancestors 'none'")


PLAIN_POLICY = "default-src 'none'; frame-ancestors 'none'"


def is_loopback_host(header: str) -> bool:
    """Whether a ``Host`` header names this machine's loopback (``localhost``, ``127.x``,
    ``[::1]``), with or without a port."""
    host = header.strip().lower()
    if host.startswith("["):
        name = host[1:].partition("]")[0]
    else:
        name, colon, port = host.rpartition(":")
        if not colon or not ASCII_DIGITS.fullmatch(port):
            name = host
    if name in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


class BadInput(Exception):
    """A query value the page refuses (its message is fixed text, never the value)."""


def query_values(query: str) -> dict[str, str]:
    """The first value of each query (or form) parameter; at most 20 are read."""
    try:
        parsed = parse_qs(query, keep_blank_values=True, max_num_fields=20)
    except ValueError:
        raise BadInput("Too many parameters.") from None
    return {key: values[0] for key, values in parsed.items()}


def wsgi_text(value: object) -> str:
    """A WSGI environ string (bytes as Latin-1, PEP 3333) as the UTF-8 text it carries."""
    text = str(value)
    try:
        return text.encode("latin-1").decode("utf-8", "replace")
    except UnicodeEncodeError:  # a server that already decoded it
        return text


def read_request(environ: WSGIEnvironment, method: str) -> Request:
    """The :class:`Request` in a WSGI environ; ``BadInput`` (a fixed text) when its
    ``Content-Length`` is not ASCII digits, or larger than :data:`MAX_BODY` (``too large``)."""
    length_text = str(environ.get("CONTENT_LENGTH") or "0").strip()
    try:
        length = parse_count(length_text, "content length") if len(length_text) <= 18 else -1
    except InvalidInput:
        length = -1
    if length < 0:
        raise BadInput("bad request")
    if length > MAX_BODY:
        raise BadInput("too large")
    body = b""
    if length:
        try:
            body = environ["wsgi.input"].read(length)
        except (OSError, ValueError, KeyError):
            raise BadInput("bad request") from None
        if not isinstance(body, bytes) or len(body) != length:
            raise BadInput("bad request")
    headers = {name: str(environ[key]) for name, key in (
        ("host", "HTTP_HOST"), ("authorization", "HTTP_AUTHORIZATION"),
        ("cookie", "HTTP_COOKIE")) if key in environ}
    scheme = "https" if environ.get("wsgi.url_scheme") == "https" else "http"
    return Request(method, str(environ.get("PATH_INFO") or "/"),
                   wsgi_text(environ.get("QUERY_STRING", "")), headers, body,
                   str(environ.get("REMOTE_ADDR") or ""), scheme)


def text_response(status: int, text: str) -> Response:
    return Response(status, (text + "\n").encode("utf-8"))


def limited(wait: int) -> Response:
    """``429``: too many wrong tokens from this client (or, signing in, from everyone)."""
    response = text_response(429, "too many wrong tokens: try again later")
    response.headers.append(("Retry-After", str(wait)))
    return response


__all__ = ["ASCII_DIGITS", "HTML", "MAX_BODY", "PHRASES", "REASONS", "BadInput", "Counters",
           "Request", "Response", "common_headers", "html_policy", "is_loopback_host",
           "limited", "plain_headers", "query_values", "read_request", "text_response",
           "wsgi_text"]
