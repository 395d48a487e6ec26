"""The application behind ``tsg serve``: routes, access, security headers and the reads.

Routes (``GET`` and ``HEAD``): ``/`` the overview, ``/stuck`` the stuck-work list, ``/job`` a
job (by ledger id, or by the id a framework gave it), ``/metrics`` the Prometheus exposition;
``/login`` (the form, ``POST`` it, or ``GET /login?token=...``, the address ``tsg serve``
prints) and ``POST /logout`` only when a token is set. Every request opens the ledger
read-only, reads, and closes it: nothing here writes the ledger. At most two overview reads
run at once, so a few open browser tabs cannot multiply the memory of a large ledger's status
pass; a scrape never waits for them. An expensive page or scrape is reused for a few seconds,
and concurrent identical requests share one read (:mod:`.cache`).

Access: with a token, every route but the sign-in wants it, as ``Authorization: Bearer
<token>`` (Prometheus' ``authorization`` setting) or as the session cookie the sign-in sets
(:mod:`.auth`: it expires, ``POST /logout`` ends it, wrong tokens are rate-limited); with
``public_metrics``, ``/metrics`` alone is answered without. Without a token (an explicit
choice of the operator's), only requests that name a loopback host are answered (a web page
elsewhere cannot reach the server by DNS rebinding).

Every response carries ``X-Content-Type-Options: nosniff``, ``Cache-Control: no-store``, a
``Content-Security-Policy`` that allows the page's own nonce'd style and script and nothing
else (``frame-ancestors 'none'``), ``X-Frame-Options: DENY`` and ``Referrer-Policy:
no-referrer``. Errors answer a fixed text: the error's category at most, never a trace, a
path or the value that was refused.
"""

from __future__ import annotations

import ipaddress
import re
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import parse_qs

from ..durations import parse_count, parse_seconds
from ..ledger import Ledger
from ..metrics.exposition import metrics_text
from ..metrics.prometheus import CONTENT_TYPE, format_server_counters
from ..model import (
    TASK_STATES,
    InvalidInput,
    LedgerError,
    TaskNotFound,
    canonical_id,
    check_name,
)
from ..ops.task_list import ORDERS, TaskListing, parse_cursor
from . import filters, jobs, pages
from .auth import GuessLimit, Sessions, client_key, cookie_value, same_token
from .cache import Cache
from .html import View

if TYPE_CHECKING:
    from wsgiref.types import StartResponse, WSGIEnvironment

HTML = "text/html; charset=utf-8"
PER_PAGE = (25, 50, 100, 200)
_ASCII_DIGITS = re.compile(r"[0-9]+", re.ASCII)
_SAFE_NEXT = re.compile(r"/(?!/)[A-Za-z0-9/_.~%&=+?-]{0,500}")
#: The kinds of id a job can be found by: (form value, label). ``any`` tries each in turn.
ID_KINDS: tuple[tuple[str, str], ...] = (
    ("any", "any kind of id"), ("ledger", "ledger id"), ("celery", "Celery task id"),
    ("dramatiq", "Dramatiq message id"), ("langgraph", "LangGraph invocation id"),
)
MAX_ID_LENGTH = 1000
#: The largest request body read (the sign-in form); a longer one is answered 413.
MAX_BODY = 4 * 1024
#: The reasons a connection is counted under (``tsg_serve_connections_dropped_total``).
REASONS = ("reset", "timeout", "overload", "malformed", "internal")
_PHRASES = {200: "OK", 303: "See Other", 400: "Bad Request", 401: "Unauthorized",
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


def _common_headers(policy: str) -> list[tuple[str, str]]:
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
    return _common_headers(_PLAIN_POLICY)


def _html_policy(nonce: str) -> str:
    return (f"default-src 'none'; script-src 'nonce-{nonce}'; style-src 'nonce-{nonce}'; "
            "img-src data:; form-action 'self'; base-uri 'none'; frame-ancestors 'none'")


_PLAIN_POLICY = "default-src 'none'; frame-ancestors 'none'"


def is_loopback_host(header: str) -> bool:
    """Whether a ``Host`` header names this machine's loopback (``localhost``, ``127.x``,
    ``[::1]``), with or without a port."""
    host = header.strip().lower()
    if host.startswith("["):
        name = host[1:].partition("]")[0]
    else:
        name, colon, port = host.rpartition(":")
        if not colon or not _ASCII_DIGITS.fullmatch(port):
            name = host
    if name in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


class _BadInput(Exception):
    """A query value the page refuses (its message is fixed text, never the value)."""


@dataclass(frozen=True, slots=True)
class Settings:
    """How the app answers: the active grace of the at-risk counts, the refresh interval
    (0: off), the token (None: loopback only, no sign-in), the adapters' metrics directory
    whose summed counters ``/metrics`` adds (None: none), how long a session lasts, whether
    its cookie is ``Secure`` even over plain HTTP (an HTTPS proxy in front), and whether
    ``/metrics`` is answered without the token."""

    grace: float
    refresh_seconds: int
    token: str | None
    metrics_dir: str | None = None  # the adapters' metrics directory, added to /metrics
    session_seconds: float = 12 * 3600
    secure_cookie: bool = False
    public_metrics: bool = False


class WebApp:
    """The pages and ``/metrics`` of one ledger: :meth:`wsgi` is the WSGI application.

    ``counters`` (given by ``tsg serve``) counts the application's internal errors and adds
    the serving process's ``tsg_serve_connections_dropped_total`` to ``/metrics``; without
    it, neither."""

    def __init__(self, open_ledger: Callable[[], Ledger], settings: Settings,
                 counters: Counters | None, categorize: Callable[[LedgerError], str]) -> None:
        self._open = open_ledger
        self.settings = settings
        self.counters = counters
        self._categorize = categorize
        self._aggregates = threading.BoundedSemaphore(2)
        self._pages: Cache[tuple[Response, str]] = Cache()
        self._scrapes: Cache[str] = Cache(max_entries=1)
        self._sessions = None if settings.token is None else Sessions(
            settings.token, settings.session_seconds)
        self._guesses = GuessLimit()

    # ------------------------------------------------------------------ WSGI
    def wsgi(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        """The WSGI application (PEP 3333): one request from ``environ``, answered whole."""
        method = str(environ.get("REQUEST_METHOD", "GET"))
        try:
            request = _request(environ, method)
        except _BadInput as exc:
            response = _text(413 if str(exc) == "too large" else 400, str(exc))
            response.headers[:0] = _common_headers(_PLAIN_POLICY)
        else:
            response = self(request)
        headers = [("Content-Type", response.content_type),
                   ("Content-Length", str(len(response.body))), *response.headers]
        start_response(f"{response.status} {_PHRASES.get(response.status, 'Error')}", headers)
        return [b"" if method == "HEAD" else response.body]

    # ------------------------------------------------------------------ dispatch
    def __call__(self, request: Request) -> Response:
        nonce = secrets.token_urlsafe(16)
        try:
            response = self._dispatch(request, nonce)
        except Exception:
            if self.counters is not None:
                self.counters.add("internal")
            response = self._page(500, nonce, lambda view: pages.message(
                view, "Internal error", "The page could not be made (InternalError)."))
        response.headers[:0] = _common_headers(
            _html_policy(nonce) if response.content_type == HTML else _PLAIN_POLICY)
        return response

    _ROUTES = frozenset({"/", "/stuck", "/job", "/metrics", "/login", "/logout"})

    def _dispatch(self, request: Request, nonce: str) -> Response:
        if request.method not in ("GET", "HEAD", "POST"):
            return _text(501, "not implemented")
        if self.settings.token is None and not is_loopback_host(
                request.headers.get("host", "localhost")):
            return _text(421, "this server answers requests for its loopback address only")
        if request.path not in self._ROUTES:
            return self._page(404, nonce, lambda view: pages.message(
                view, "Not found", "There is no such page."))
        if request.path in ("/login", "/logout"):
            try:
                return self._login(request, nonce)
            except _BadInput as exc:
                return self._refused(nonce, exc)
        if request.method == "POST":
            response = _text(405, "method not allowed")
            response.headers.append(("Allow", "GET, HEAD"))
            return response
        public = request.path == "/metrics" and self.settings.public_metrics
        refusal = None if public else self._refusal(request, nonce)
        if refusal is not None:
            return refusal
        if request.path == "/metrics":
            return self._metrics()
        try:
            params = _params(request.query)
        except _BadInput as exc:
            return self._refused(nonce, exc)
        signed_in = self._sessions is not None and self._sessions.valid(
            cookie_value(request.headers.get("cookie", "")))
        view = View(nonce, self.settings.refresh_seconds, params.get("refresh") == "off",
                    sign_out=signed_in)
        handler = {"/": self._overview, "/stuck": self._stuck, "/job": self._job}[request.path]
        try:
            return self._cached(request, nonce, lambda: handler(view, params))
        except _BadInput as exc:
            return self._refused(nonce, exc)
        except LedgerError as exc:  # the page keeps refreshing: it shows once the ledger reads
            note = ("It is read again on the next refresh." if view.refresh_seconds
                    and not view.paused else "Reload the page to read it again.")
            body = pages.message(view, "Ledger unavailable",
                                 f"The ledger could not be read ({self._categorize(exc)}).",
                                 note, here=request.path,
                                 params={k: v for k, v in params.items() if k != "refresh"})
            return Response(503, body, HTML)

    def _cached(self, request: Request, nonce: str, render: Callable[[], Response]) -> Response:
        """The page of this path and query: reused while fresh when it was expensive (with
        this response's nonce in place of the one it was made with), else rendered now."""
        response, made_with = self._pages.get(
            (request.path, request.query), lambda: (render(), nonce),
            lambda made: len(made[0].body))
        if made_with == nonce:
            return response
        return Response(response.status, response.body.replace(
            made_with.encode("ascii"), nonce.encode("ascii")), response.content_type,
            list(response.headers))

    def _refused(self, nonce: str, exc: _BadInput) -> Response:
        text = str(exc)
        return self._page(400, nonce, lambda view: pages.message(view, "Not understood", text))

    def _page(self, status: int, nonce: str, render: Callable[[View], bytes]) -> Response:
        return Response(status, render(View(nonce, 0, False)), HTML)

    # ------------------------------------------------------------------ access
    def _refusal(self, request: Request, nonce: str) -> Response | None:
        """None when ``request`` may read; else its answer: ``401`` (the sign-in form for a
        page), or ``429`` when its client guessed wrong too often."""
        token, sessions = self.settings.token, self._sessions
        if token is None or sessions is None:
            return None
        if sessions.valid(cookie_value(request.headers.get("cookie", ""))):
            return None
        scheme, _, credentials = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and credentials.strip():
            client = client_key(request.client)
            wait = self._guesses.retry_after(client, sign_in=False)
            if wait is not None:
                return _limited(wait)
            if same_token(credentials.strip(), token):
                return None
            self._guesses.wrong(client, sign_in=False)
        if request.path == "/metrics":
            response = _text(401, "unauthorized")
        else:  # back to this page after the sign-in (its path only: never the query sent)
            response = self._page(401, nonce, lambda view: pages.login(view, request.path,
                                                                       False))
        response.headers.append(("WWW-Authenticate", 'Bearer realm="tsg"'))
        return response

    def _login(self, request: Request, nonce: str) -> Response:
        """``/login``: the form, or a sign-in (``POST``, or ``GET`` with ``token``);
        ``POST /logout``: the session ends."""
        token, sessions = self.settings.token, self._sessions
        if token is None or sessions is None:
            return self._page(404, nonce, lambda view: pages.message(
                view, "Not found", "This server has no token: there is nothing to sign in to."))
        secure = self.settings.secure_cookie or request.scheme == "https"
        if request.path == "/logout":
            if request.method != "POST":
                response = _text(405, "method not allowed")
                response.headers.append(("Allow", "POST"))
                return response
            sessions.end(cookie_value(request.headers.get("cookie", "")))
            response = Response(303, b"", "text/plain; charset=utf-8")
            response.headers += [("Location", "/login"),
                                 ("Set-Cookie", sessions.clearing_cookie(secure=secure))]
            return response
        form = _params(request.body.decode("utf-8", "replace") if request.method == "POST"
                       else request.query)
        target = form.get("next", "/")
        safe = target if _SAFE_NEXT.fullmatch(target) else "/"
        if request.method != "POST" and "token" not in form:
            return self._page(200, nonce, lambda view: pages.login(view, safe, False))
        client = client_key(request.client)
        wait = self._guesses.retry_after(client, sign_in=True)
        if wait is not None:
            return _limited(wait)
        if not same_token(form.get("token", ""), token):
            self._guesses.wrong(client, sign_in=True)
            return self._page(401, nonce, lambda view: pages.login(view, safe, True))
        response = Response(303, b"", "text/plain; charset=utf-8")
        response.headers += [("Location", safe),
                             ("Set-Cookie", sessions.cookie(sessions.issue(), secure=secure))]
        return response

    # ------------------------------------------------------------------ reads
    @contextmanager
    def _ledger(self, aggregate: bool = False) -> Iterator[Ledger]:
        if aggregate:
            self._aggregates.acquire()
        try:
            ledger = self._open()
            try:
                yield ledger
            finally:
                ledger.close()
        finally:
            if aggregate:
                self._aggregates.release()

    def _metrics(self) -> Response:
        def read() -> str:
            with self._ledger() as ledger:  # a scrape's own lane: it never waits for pages
                return metrics_text(ledger, active_grace_seconds=self.settings.grace,
                                    metrics_dir=self.settings.metrics_dir)

        try:
            text = self._scrapes.get("metrics", read, len)
        except LedgerError as exc:
            return _text(503, f"error: {self._categorize(exc)}")
        if self.counters is not None:
            text += format_server_counters(self.counters.snapshot())
        return Response(200, text.encode("utf-8"), CONTENT_TYPE)

    def _overview(self, view: View, params: dict[str, str]) -> Response:
        window = params.get("window", "24h")
        if window not in pages.WINDOWS:
            raise _BadInput("The chart window must be one of 1h, 6h, 24h or 7d.")
        seconds, buckets = pages.WINDOWS[window]
        with self._ledger(aggregate=True) as ledger:
            report = ledger.status(active_grace_seconds=self.settings.grace)
            history = ledger.outcome_history(window_seconds=seconds, buckets=buckets)
        now = history.start + seconds
        body = pages.overview(view, report, history, window, now)
        return Response(200, body, HTML)

    def _stuck(self, view: View, params: dict[str, str]) -> Response:
        try:
            query, cursor, backwards = _stuck_query(params)
        except _BadInput as exc:
            fallback = _stuck_query({})[0]
            body = pages.stuck(view, fallback, TaskListing([], False, time.time()),
                               has_previous=False, error=str(exc), kinds=ID_KINDS)
            return Response(400, body, HTML)
        with self._ledger() as ledger:
            job = None
            if query.job:
                found = _existing(ledger, job_candidates(query.job_kind, query.job))
                job = found[0][1] if found else None
            if query.job and job is None:
                listing = TaskListing([], False, time.time())
            else:
                listing = ledger.list_tasks(
                    status=None if query.status == "active" else query.status,
                    name=query.name or None, attempts=query.attempts, task_id=job,
                    stale_seconds=None if not query.idle else parse_seconds(query.idle, "idle"),
                    older_than_seconds=None if not query.older else parse_seconds(
                        query.older, "older"),
                    limit=query.per_page, order=query.order,
                    descending=query.descending != backwards, after=cursor,
                    count=True, code=query.narrow.code or None,
                    framework=query.narrow.framework or None,
                    name_contains=query.narrow.contains or None, flag=query.narrow.flag or None,
                )
        has_previous = cursor is not None
        if backwards:  # the page before ``cursor``: read backwards, shown forwards
            has_previous = listing.more
            listing = TaskListing(listing.tasks[::-1], True, listing.at, listing.total,
                                  listing.total_capped)
        position = {"before" if backwards else "after": cursor} if cursor else {}
        body = pages.stuck(view, query, listing, has_previous=has_previous, kinds=ID_KINDS,
                           position=position)
        return Response(200, body, HTML)

    def _job(self, view: View, params: dict[str, str]) -> Response:
        value = params.get("id", "").strip()
        kind = params.get("kind", "any")
        if kind not in dict(ID_KINDS):
            raise _BadInput("Unknown kind of id.")
        if not value:
            return Response(200, pages.job_search(view, ID_KINDS, chosen=kind), HTML)
        try:
            candidates = job_candidates(kind, value)
        except InvalidInput:
            body = pages.job_search(view, ID_KINDS, chosen=kind,
                                    error="That is not a valid id of the kind chosen.")
            return Response(400, body, HTML)
        with self._ledger() as ledger:
            found = _existing(ledger, candidates)
            try:
                data = jobs.job_view(ledger, found[0][1]) if len(found) == 1 else None
            except TaskNotFound:  # pruned meanwhile
                found, data = [], None
        if data is not None:
            return Response(200, pages.job(view, data, ID_KINDS, time.time()), HTML)
        if found:  # the same text is a job id of several frameworks: let the operator pick
            links = [(view.href("/job", {"id": value, "kind": k}), dict(ID_KINDS)[k])
                     for k, _task_id in found]
            body = pages.job_search(view, ID_KINDS, chosen=kind, value=value, choices=links)
            return Response(200, body, HTML)
        body = pages.job_search(view, ID_KINDS, chosen=kind,
                                error="No job with that id is in this ledger.")
        return Response(404, body, HTML)


def _ledger_id(kind: str, value: str) -> str:
    if kind == "ledger":
        return canonical_id(value.lower() if len(value) == 36 else value)
    from ..integration.ids import job_task_id

    return job_task_id(kind, value)


def job_candidates(kind: str, value: str) -> list[tuple[str, str]]:
    """The ledger ids an operator's pasted id can stand for, as ``(kind, ledger id)``: one for
    a given kind (``InvalidInput`` when the text is not an id of that kind), every kind it can
    be for ``any`` (a framework's job id is computed from it, nothing is looked up)."""
    if len(value) > MAX_ID_LENGTH:
        raise InvalidInput("the id is too long")
    if kind != "any":
        return [(kind, _ledger_id(kind, value))]
    found = []
    for each, _label in ID_KINDS[1:]:
        try:
            found.append((each, _ledger_id(each, value)))
        except InvalidInput:
            continue
    if not found:
        raise InvalidInput("not an id of any kind")
    return found


def _existing(ledger: Ledger, candidates: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The candidates whose task is in the ledger (each ledger id once)."""
    found: list[tuple[str, str]] = []
    for kind, task_id in candidates:
        if any(task_id == seen for _kind, seen in found):
            continue
        try:
            ledger.get_task(task_id)
        except TaskNotFound:
            continue
        found.append((kind, task_id))
    return found


def _stuck_query(params: dict[str, str]) -> tuple[pages.StuckQuery, str | None, bool]:
    status = params.get("status") or "active"
    if status != "active" and status not in TASK_STATES:
        raise _BadInput("Unknown state.")
    name = params.get("name", "").strip()
    try:
        check_name(name or None)
    except InvalidInput:
        raise _BadInput("A name is a task, actor or graph name label.") from None
    durations = {}
    for key in ("idle", "older"):
        text = params.get(key, "").strip()
        try:
            if text:
                parse_seconds(text, key)
        except InvalidInput:
            raise _BadInput("Durations are seconds or a number with s, m, h or d (15m).") from None
        durations[key] = text
    rows = params.get("rows", "")
    if rows not in ("", "attempts"):
        raise _BadInput("Rows are jobs or attempts.")
    order = params.get("sort") or "created"
    if order not in ORDERS:
        raise _BadInput("Unknown sort order.")
    direction = params.get("dir", "")
    if direction not in ("", "asc", "desc"):
        raise _BadInput("Unknown sort direction.")
    per = params.get("per") or "50"
    if not _ASCII_DIGITS.fullmatch(per) or len(per) > 3 or int(per) not in PER_PAGE:
        raise _BadInput("Rows per page are 25, 50, 100 or 200.")
    job = params.get("job", "").strip()
    job_kind = params.get("job_kind") or "any"
    if job_kind not in dict(ID_KINDS):
        raise _BadInput("Unknown kind of id.")
    if job:
        try:
            job_candidates(job_kind, job)
        except InvalidInput:
            raise _BadInput("That is not a valid id of the kind chosen.") from None
    after, before = params.get("after"), params.get("before")
    if after and before:
        raise _BadInput("A page starts after one row or ends before one, not both.")
    try:
        narrow = filters.parse(params)
    except filters.Refused as exc:
        raise _BadInput(str(exc)) from None
    query = pages.StuckQuery(status, name, durations["idle"], durations["older"],
                             rows == "attempts", order, direction == "desc", int(per), job,
                             job_kind, narrow)
    cursor = after or before or None
    if cursor is not None:
        try:
            parse_cursor(order, cursor)
        except InvalidInput:
            raise _BadInput("That page position is not valid; start from the first page.") \
                from None
    return query, cursor, bool(before)


def _params(query: str) -> dict[str, str]:
    """The first value of each query (or form) parameter; at most 20 are read."""
    try:
        parsed = parse_qs(query, keep_blank_values=True, max_num_fields=20)
    except ValueError:
        raise _BadInput("Too many parameters.") from None
    return {key: values[0] for key, values in parsed.items()}


def _wsgi_text(value: object) -> str:
    """A WSGI environ string (bytes as Latin-1, PEP 3333) as the UTF-8 text it carries."""
    text = str(value)
    try:
        return text.encode("latin-1").decode("utf-8", "replace")
    except UnicodeEncodeError:  # a server that already decoded it
        return text


def _request(environ: WSGIEnvironment, method: str) -> Request:
    """The :class:`Request` in a WSGI environ; ``_BadInput`` (a fixed text) when its
    ``Content-Length`` is not ASCII digits, or larger than :data:`MAX_BODY` (``too large``)."""
    length_text = str(environ.get("CONTENT_LENGTH") or "0").strip()
    try:
        length = parse_count(length_text, "content length") if len(length_text) <= 18 else -1
    except InvalidInput:
        length = -1
    if length < 0:
        raise _BadInput("bad request")
    if length > MAX_BODY:
        raise _BadInput("too large")
    body = b""
    if length:
        try:
            body = environ["wsgi.input"].read(length)
        except (OSError, ValueError, KeyError):
            raise _BadInput("bad request") from None
        if not isinstance(body, bytes) or len(body) != length:
            raise _BadInput("bad request")
    headers = {name: str(environ[key]) for name, key in (
        ("host", "HTTP_HOST"), ("authorization", "HTTP_AUTHORIZATION"),
        ("cookie", "HTTP_COOKIE")) if key in environ}
    scheme = "https" if environ.get("wsgi.url_scheme") == "https" else "http"
    return Request(method, str(environ.get("PATH_INFO") or "/"),
                   _wsgi_text(environ.get("QUERY_STRING", "")), headers, body,
                   str(environ.get("REMOTE_ADDR") or ""), scheme)


def _text(status: int, text: str) -> Response:
    return Response(status, (text + "\n").encode("utf-8"))


def _limited(wait: int) -> Response:
    """``429``: too many wrong tokens from this client (or, signing in, from everyone)."""
    response = _text(429, "too many wrong tokens: try again later")
    response.headers.append(("Retry-After", str(wait)))
    return response


__all__ = ["ID_KINDS", "MAX_BODY", "REASONS", "Counters", "Request", "Response", "Settings",
           "WebApp", "is_loopback_host", "job_candidates", "plain_headers"]
