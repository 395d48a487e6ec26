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

import re
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..durations import parse_seconds
from ..ledger import Ledger
from ..metrics.exposition import metrics_text
from ..metrics.prometheus import CONTENT_TYPE, format_server_counters
from ..model import InvalidInput, LedgerError, TaskNotFound
from ..ops.task_list import TaskListing
from . import jobs, pages
from .auth import GuessLimit, Sessions, client_key, cookie_value, same_token
from .cache import Cache
from .html import View
from .messages import (
    HTML,
    PHRASES,
    PLAIN_POLICY,
    BadInput,
    Counters,
    Request,
    Response,
    common_headers,
    html_policy,
    is_loopback_host,
    limited,
    query_values,
    read_request,
    text_response,
)
from .query_params import ID_KINDS, job_candidates, stuck_query

if TYPE_CHECKING:
    from wsgiref.types import StartResponse, WSGIEnvironment

_SAFE_NEXT = re.compile(r"/(?!/)[A-Za-z0-9/_.~%&=+?-]{0,500}")


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
            request = read_request(environ, method)
        except BadInput as exc:
            response = text_response(413 if str(exc) == "too large" else 400, str(exc))
            response.headers[:0] = common_headers(PLAIN_POLICY)
        else:
            response = self(request)
        headers = [("Content-Type", response.content_type),
                   ("Content-Length", str(len(response.body))), *response.headers]
        start_response(f"{response.status} {PHRASES.get(response.status, 'Error')}", headers)
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
        response.headers[:0] = common_headers(
            html_policy(nonce) if response.content_type == HTML else PLAIN_POLICY)
        return response

    _ROUTES = frozenset({"/", "/stuck", "/job", "/metrics", "/login", "/logout"})

    def _dispatch(self, request: Request, nonce: str) -> Response:
        if request.method not in ("GET", "HEAD", "POST"):
            return text_response(501, "not implemented")
        if self.settings.token is None and not is_loopback_host(
                request.headers.get("host", "localhost")):
            return text_response(421, "this server answers requests for its loopback address only")
        if request.path not in self._ROUTES:
            return self._page(404, nonce, lambda view: pages.message(
                view, "Not found", "There is no such page."))
        if request.path in ("/login", "/logout"):
            try:
                return self._login(request, nonce)
            except BadInput as exc:
                return self._refused(nonce, exc)
        if request.method == "POST":
            response = text_response(405, "method not allowed")
            response.headers.append(("Allow", "GET, HEAD"))
            return response
        public = request.path == "/metrics" and self.settings.public_metrics
        refusal = None if public else self._refusal(request, nonce)
        if refusal is not None:
            return refusal
        if request.path == "/metrics":
            return self._metrics()
        try:
            params = query_values(request.query)
        except BadInput as exc:
            return self._refused(nonce, exc)
        signed_in = self._sessions is not None and self._sessions.valid(
            cookie_value(request.headers.get("cookie", "")))
        view = View(nonce, self.settings.refresh_seconds, params.get("refresh") == "off",
                    sign_out=signed_in)
        handler = {"/": self._overview, "/stuck": self._stuck, "/job": self._job}[request.path]
        try:
            return self._cached(request, nonce, lambda: handler(view, params))
        except BadInput as exc:
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

    def _refused(self, nonce: str, exc: BadInput) -> Response:
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
                return limited(wait)
            if same_token(credentials.strip(), token):
                return None
            self._guesses.wrong(client, sign_in=False)
        if request.path == "/metrics":
            response = text_response(401, "unauthorized")
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
                response = text_response(405, "method not allowed")
                response.headers.append(("Allow", "POST"))
                return response
            sessions.end(cookie_value(request.headers.get("cookie", "")))
            response = Response(303, b"", "text/plain; charset=utf-8")
            response.headers += [("Location", "/login"),
                                 ("Set-Cookie", sessions.clearing_cookie(secure=secure))]
            return response
        form = query_values(request.body.decode("utf-8", "replace") if request.method == "POST"
                       else request.query)
        target = form.get("next", "/")
        safe = target if _SAFE_NEXT.fullmatch(target) else "/"
        if request.method != "POST" and "token" not in form:
            return self._page(200, nonce, lambda view: pages.login(view, safe, False))
        client = client_key(request.client)
        wait = self._guesses.retry_after(client, sign_in=True)
        if wait is not None:
            return limited(wait)
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
            return text_response(503, f"error: {self._categorize(exc)}")
        if self.counters is not None:
            text += format_server_counters(self.counters.snapshot())
        return Response(200, text.encode("utf-8"), CONTENT_TYPE)

    def _overview(self, view: View, params: dict[str, str]) -> Response:
        window = params.get("window", "24h")
        if window not in pages.WINDOWS:
            raise BadInput("The chart window must be one of 1h, 6h, 24h or 7d.")
        seconds, buckets = pages.WINDOWS[window]
        with self._ledger(aggregate=True) as ledger:
            report, history = ledger.overview(active_grace_seconds=self.settings.grace,
                                              window_seconds=seconds, buckets=buckets)
        now = history.start + seconds
        body = pages.overview(view, report, history, window, now)
        return Response(200, body, HTML)

    def _stuck(self, view: View, params: dict[str, str]) -> Response:
        try:
            query, cursor, backwards = stuck_query(params)
        except BadInput as exc:
            fallback = stuck_query({})[0]
            body = pages.stuck(view, fallback, TaskListing([], False, time.time()),
                               has_previous=False, error=str(exc), kinds=ID_KINDS)
            return Response(400, body, HTML)
        with self._ledger() as ledger:
            job = None
            if query.job:
                found = jobs.existing(ledger, job_candidates(query.job_kind, query.job))
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
            raise BadInput("Unknown kind of id.")
        if not value:
            return Response(200, pages.job_search(view, ID_KINDS, chosen=kind), HTML)
        try:
            candidates = job_candidates(kind, value)
        except InvalidInput:
            body = pages.job_search(view, ID_KINDS, chosen=kind,
                                    error="That is not a valid id of the kind chosen.")
            return Response(400, body, HTML)
        with self._ledger() as ledger:
            found = jobs.existing(ledger, candidates)
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


__all__ = ["Settings", "WebApp"]
