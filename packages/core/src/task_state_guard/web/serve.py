"""``tsg serve`` and its alias ``tsg metrics --serve``: check the options, bind, serve.

The listen address and the refresh interval are checked with the other values, before any
database is opened; the token (a file, or ``TSG_SERVE_TOKEN``) is read and checked next, still
before the ledger is opened. Listening beyond loopback without a token is refused. Then the
ledger is opened read-only once (a missing or foreign ledger fails fast, exit 2), the server
binds, prints ``{"listen":"HOST:PORT","ok":true}`` and serves until SIGTERM or SIGINT (exit 0).
The network code is imported only here, when serving.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from .. import reasons as r
from ..durations import parse_count, parse_seconds
from ..ledger import Ledger
from ..model import MAX_SECONDS, InvalidInput, LedgerError, error_category

DEFAULT_LISTEN = "127.0.0.1:9464"
DEFAULT_REFRESH_SECONDS = 30
TOKEN_ENV = "TSG_SERVE_TOKEN"
MIN_TOKEN_LENGTH = 16
MAX_TOKEN_BYTES = 4096
_TOKEN = re.compile(r"[!-~]+")  # printable ASCII, no spaces

if TYPE_CHECKING:
    from wsgiref.types import WSGIApplication

Payload = dict[str, Any] | str


def parse_listen(value: object) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` for IPv6; port 0 picks a free one) → ``(host, port)``.

    The host must be an IP address; errors never echo the value.
    """
    if not isinstance(value, str) or ":" not in value:
        raise InvalidInput("listen must be HOST:PORT")
    host, _, port_text = value.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        raise InvalidInput("the listen host must be an IP address") from None
    try:
        port = parse_count(port_text, "listen port", maximum=65535)
    except InvalidInput:
        raise InvalidInput("the listen port must be 0-65535") from None
    return str(address), port


def check_serve_options(listen: str | None, refresh: str | None) -> dict[str, Any]:
    """The listen address and the refresh interval in whole seconds (0: off, at most a day)."""
    seconds = DEFAULT_REFRESH_SECONDS if refresh is None else parse_seconds(refresh, "refresh")
    if seconds != 0 and not 1 <= seconds <= 86400:
        raise InvalidInput("the refresh interval must be 0 (off) or 1 s to 1 d")
    return {
        "listen": parse_listen(DEFAULT_LISTEN if listen is None else listen),
        "refresh": round(seconds),
    }


def read_token(token_file: str | None, environ: Mapping[str, str]) -> str | None:
    """The token from ``token_file`` (its first line) or ``TSG_SERVE_TOKEN``; None when
    neither is given. A token is at least 16 printable ASCII characters without spaces; an
    unreadable file or a weak token is ``InvalidInput`` (``serve_token_invalid``)."""
    if token_file is not None:
        try:
            with open(token_file, "rb") as handle:
                data = handle.read(MAX_TOKEN_BYTES + 1)
        except (OSError, ValueError):
            raise InvalidInput("the token file cannot be read",
                               reason=r.SERVE_TOKEN_INVALID) from None
        text = data.decode("ascii", "replace").splitlines()[0] if data.strip() else ""
        if len(data) > MAX_TOKEN_BYTES:
            text = ""
    else:
        text = environ.get(TOKEN_ENV, "")
        if not text:
            return None
    return check_token(text)


def check_token(text: object) -> str:
    """``text`` without surrounding whitespace when it is a token: at least 16 printable ASCII
    characters without spaces (else ``InvalidInput``, ``serve_token_invalid``)."""
    token = text.strip() if isinstance(text, str) else ""
    if len(token) < MIN_TOKEN_LENGTH or not _TOKEN.fullmatch(token):
        raise InvalidInput("the token must be at least 16 printable characters",
                           reason=r.SERVE_TOKEN_INVALID)
    return token


def run_serve(
    open_ledger: Callable[[], Ledger],
    values: dict[str, Any],
    *,
    token_file: str | None,
    emit: Callable[[Payload], None],
    categorize: Callable[[LedgerError], str],
) -> tuple[Payload, int]:
    """Serve the pages and ``/metrics`` until SIGTERM or SIGINT (see the module's docstring)."""
    host, _port = values["listen"]
    token = read_token(token_file, os.environ)
    if token is None and not ipaddress.ip_address(host).is_loopback:
        raise InvalidInput("listening beyond loopback needs a token",
                           reason=r.SERVE_TOKEN_REQUIRED)
    open_ledger().close()  # a missing, foreign or unsafe ledger fails here, before binding

    from .app import Counters, Settings, WebApp
    from .server import HttpServer  # the network code loads only to serve

    counters = Counters()
    settings = Settings(grace=values["grace"], refresh_seconds=values["refresh"], token=token,
                        metrics_dir=values.get("metrics_dir"))
    app = WebApp(open_ledger, settings, counters, categorize)
    server = HttpServer(values["listen"], app.wsgi, counters=counters)
    bound_host, bound_port = server.address
    shown = f"[{bound_host}]:{bound_port}" if ":" in bound_host else f"{bound_host}:{bound_port}"
    emit({"listen": shown, "ok": True})
    server.serve_until_signal()
    return "", 0


def make_wsgi_app(
    db: str | os.PathLike[str],
    *,
    token: str | None = None,
    active_grace_seconds: float = 600.0,
    refresh_seconds: int = 30,
    metrics_dir: str | None = None,
    busy_timeout_ms: int = 5000,
) -> WSGIApplication:
    """The read-only pages and ``/metrics`` of the ledger ``db`` as a WSGI application, to
    mount at the root path of any WSGI server (documented at
    :func:`task_state_guard.web.make_wsgi_app`).
    """
    from .app import Settings, WebApp  # the page code loads only when the app is made

    if token is not None:
        token = check_token(token)
    if isinstance(refresh_seconds, bool) or not isinstance(refresh_seconds, int) or not (
            refresh_seconds == 0 or 1 <= refresh_seconds <= 86400):
        raise InvalidInput("the refresh interval must be 0 (off) or 1 s to 1 d")
    if isinstance(active_grace_seconds, bool) or not isinstance(
            active_grace_seconds, int | float) or not 0 <= active_grace_seconds <= MAX_SECONDS:
        raise InvalidInput("the active grace must be 0 or more seconds")
    grace = float(active_grace_seconds)
    if metrics_dir is not None and (not isinstance(metrics_dir, str) or not metrics_dir
                                    or "\0" in metrics_dir):
        raise InvalidInput("the metrics directory must be a path")

    def open_ledger() -> Ledger:
        return Ledger(db, busy_timeout_ms=busy_timeout_ms, read_only=True,
                      transient_sidecars=True, create=False)

    open_ledger().close()  # a missing, foreign or unsafe ledger fails here, at once
    settings = Settings(grace=grace, refresh_seconds=refresh_seconds, token=token,
                        metrics_dir=metrics_dir)
    return WebApp(open_ledger, settings, None, error_category).wsgi


__all__ = ["DEFAULT_LISTEN", "TOKEN_ENV", "check_serve_options", "check_token", "make_wsgi_app",
           "parse_listen", "read_token", "run_serve"]
