"""``tsg serve`` and its alias ``tsg metrics --serve``: check the options, bind, serve.

The listen address and the refresh interval are checked with the other values, before any
database is opened; a token the operator gave (``--token-file``, or ``TSG_SERVE_TOKEN``) is
read and checked next, still before the ledger is opened. ``--no-token`` (no token: only
loopback Host names answered) is refused beyond loopback and with a token. Then the ledger is
opened read-only once (a missing or foreign ledger fails fast, exit 2); without a token given
nor ``--no-token``, the default token file (:mod:`.tokens`) is read, or made on the first
start. The server binds, prints ``{"listen":"HOST:PORT","ok":true}``, then on stderr the
sign-in address (with the token only when stderr is a terminal: the operator's own screen,
never a log), and serves until SIGTERM or SIGINT (exit 0). The network code is imported only
here, when serving.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from .. import reasons as r
from ..durations import parse_count, parse_seconds
from ..ledger import Ledger
from ..model import MAX_SECONDS, InvalidInput, LedgerError, error_category
from .auth import DEFAULT_SESSION_SECONDS
from .tokens import check_token, ensure_token_file, read_token_file

DEFAULT_LISTEN = "127.0.0.1:9464"
DEFAULT_REFRESH_SECONDS = 30
TOKEN_ENV = "TSG_SERVE_TOKEN"
MAX_SESSION_SECONDS = 30 * 86400

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


def choose_token(token_file: str | None, no_token: bool,
                 environ: Mapping[str, str]) -> str | None:
    """The token the operator gave: ``--token-file`` (its first line), else
    ``TSG_SERVE_TOKEN``; None when neither (the default token file is then used, unless
    ``no_token``, ``--no-token``, which excludes the others)."""
    if no_token and (token_file is not None or environ.get(TOKEN_ENV)):
        raise InvalidInput("--no-token and a token exclude each other",
                           reason=r.SERVE_TOKEN_INVALID)
    if token_file is not None:
        return read_token_file(token_file)
    if environ.get(TOKEN_ENV):
        return check_token(environ[TOKEN_ENV])
    return None


def check_access_options(no_token: bool, public_metrics: bool, session_lifetime: str | None,
                         behind_https_proxy: bool) -> dict[str, Any]:
    """``--no-token``, ``--public-metrics``, ``--session-lifetime`` (1 s to 30 d, default
    12 h) and ``--behind-https-proxy`` as the values :func:`run_serve` reads."""
    seconds = (DEFAULT_SESSION_SECONDS if session_lifetime is None
               else parse_seconds(session_lifetime, "session lifetime"))
    if not 1 <= seconds <= MAX_SESSION_SECONDS:
        raise InvalidInput("the session lifetime must be 1 s to 30 d")
    return {"no_token": no_token, "public_metrics": public_metrics,
            "session_seconds": float(seconds), "secure_cookie": behind_https_proxy}


def _login_hint(host: str, port: int, token: str, token_path: str | None) -> str | None:
    """The line ``tsg serve`` prints on stderr once listening: the sign-in address with the
    token when stderr is a terminal (the operator's own), else where the token is (the
    default file only); None when there is nothing to say."""
    shown = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    base = f"http://[{shown}]:{port}" if ":" in shown else f"http://{shown}:{port}"
    try:
        terminal = sys.stderr is not None and sys.stderr.isatty()
    except (OSError, ValueError):
        terminal = False
    if terminal:
        return f"tsg serve: open {base}/login?{urlencode({'token': token})}"
    if token_path is not None:
        return f"tsg serve: sign in at {base}/login with the token in {token_path}"
    return None


def run_serve(
    open_ledger: Callable[[], Ledger],
    values: dict[str, Any],
    *,
    db: str | os.PathLike[str],
    token_file: str | None,
    emit: Callable[[Payload], None],
    categorize: Callable[[LedgerError], str],
) -> tuple[Payload, int]:
    """Serve the pages and ``/metrics`` until SIGTERM or SIGINT (see the module's docstring)."""
    host, _port = values["listen"]
    no_token = bool(values.get("no_token"))
    if no_token and not ipaddress.ip_address(host).is_loopback:
        raise InvalidInput("--no-token is for a loopback address only",
                           reason=r.SERVE_TOKEN_REQUIRED)
    token = choose_token(token_file, no_token, os.environ)
    open_ledger().close()  # a missing, foreign or unsafe ledger fails here, before binding
    token_path = None
    if token is None and not no_token:  # the default token: made beside the ledger at first
        token, token_path, _made = ensure_token_file(db)

    from .app import Settings, WebApp
    from .messages import Counters
    from .server import HttpServer  # the network code loads only to serve

    counters = Counters()
    settings = Settings(grace=values["grace"], refresh_seconds=values["refresh"], token=token,
                        metrics_dir=values.get("metrics_dir"),
                        session_seconds=values.get("session_seconds", DEFAULT_SESSION_SECONDS),
                        secure_cookie=bool(values.get("secure_cookie")),
                        public_metrics=bool(values.get("public_metrics")))
    app = WebApp(open_ledger, settings, counters, categorize)
    server = HttpServer(values["listen"], app.wsgi, counters=counters)
    bound_host, bound_port = server.address
    shown = f"[{bound_host}]:{bound_port}" if ":" in bound_host else f"{bound_host}:{bound_port}"
    emit({"listen": shown, "ok": True})
    hint = None if token is None else _login_hint(bound_host, bound_port, token, token_path)
    if hint is not None:
        with contextlib.suppress(OSError, ValueError, AttributeError):  # stderr closed
            print(hint, file=sys.stderr, flush=True)
    server.serve_until_signal()
    return "", 0


def make_wsgi_app(
    db: str | os.PathLike[str],
    *,
    token: str | None = None,
    no_token: bool = False,
    public_metrics: bool = False,
    session_seconds: float = DEFAULT_SESSION_SECONDS,
    secure_cookie: bool = False,
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

    if no_token is not False and no_token is not True:
        raise InvalidInput("no_token must be True or False")
    if token is not None:
        if no_token:
            raise InvalidInput("a token and no_token=True exclude each other",
                               reason=r.SERVE_TOKEN_INVALID)
        token = check_token(token)
    elif not no_token:
        raise InvalidInput("give a token, or no_token=True to answer loopback hosts without one",
                           reason=r.SERVE_TOKEN_REQUIRED)
    for flag in (public_metrics, secure_cookie):
        if flag is not False and flag is not True:
            raise InvalidInput("public_metrics and secure_cookie are True or False")
    if isinstance(session_seconds, bool) or not isinstance(session_seconds, int | float) or \
            not 1 <= session_seconds <= MAX_SESSION_SECONDS:
        raise InvalidInput("the session lifetime must be 1 s to 30 d")
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
                        metrics_dir=metrics_dir, session_seconds=float(session_seconds),
                        secure_cookie=secure_cookie, public_metrics=public_metrics)
    return WebApp(open_ledger, settings, None, error_category).wsgi


__all__ = ["DEFAULT_LISTEN", "TOKEN_ENV", "check_access_options", "check_serve_options",
           "choose_token", "make_wsgi_app", "parse_listen", "run_serve"]
