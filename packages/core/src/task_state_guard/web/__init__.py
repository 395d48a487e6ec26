"""`tsg serve`: the read-only web view and `/metrics`, and the server that runs them.

:func:`make_wsgi_app` is the same view as a WSGI application, to mount in a WSGI server of
one's own. Importing this package loads no network code and no page code: they load when
:func:`make_wsgi_app` is called or ``tsg serve`` runs.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from wsgiref.types import WSGIApplication


def make_wsgi_app(
    db: str | os.PathLike[str],
    *,
    token: str | None = None,
    no_token: bool = False,
    public_metrics: bool = False,
    session_seconds: float = 12 * 3600,
    secure_cookie: bool = False,
    active_grace_seconds: float = 600.0,
    refresh_seconds: int = 30,
    metrics_dir: str | None = None,
    busy_timeout_ms: int = 5000,
) -> WSGIApplication:
    """The read-only pages and ``GET /metrics`` of the ledger ``db`` (a SQLite path or a
    ``postgresql://`` URL) as a WSGI application (PEP 3333), as ``tsg serve`` answers them.

    Mount it at the root path (its pages link to ``/``, ``/stuck``, ``/job``). Every request
    opens the ledger read-only and closes it; nothing is written.

    Access is an explicit choice: ``token`` (at least 16 printable ASCII characters without
    spaces, of at least 6 different ones, not a repeated pattern) is wanted by every route as
    ``Authorization: Bearer`` or as the session cookie that ``/login`` sets (it lasts
    ``session_seconds``, 12 h by default; ``POST /logout`` ends it; ``Secure`` when the
    server says the request came over HTTPS, ``wsgi.url_scheme``, or always with
    ``secure_cookie=True``, for a server behind an HTTPS proxy). Wrong tokens are
    rate-limited per client (``REMOTE_ADDR``) and, at the sign-in, overall: ``429`` with
    ``Retry-After``. ``no_token=True`` instead answers without a token, only requests whose
    ``Host`` names a loopback address. Neither raises ``InvalidInput``
    (``serve_token_required``). ``public_metrics=True``: ``/metrics`` alone is answered
    without the token (aggregates only, never ids).

    ``active_grace_seconds``, ``refresh_seconds`` (``0``: off) and ``metrics_dir`` mean what
    ``tsg serve``'s ``--active-grace-seconds``, ``--refresh`` and ``--metrics-dir`` do. The
    ledger is opened once here: a missing or foreign ledger, a weak token or a bad value raises
    ``InvalidInput`` (a ``LedgerError``) at once.
    """
    from .serve import make_wsgi_app as make

    return make(db, token=token, no_token=no_token, public_metrics=public_metrics,
                session_seconds=session_seconds, secure_cookie=secure_cookie,
                active_grace_seconds=active_grace_seconds, refresh_seconds=refresh_seconds,
                metrics_dir=metrics_dir, busy_timeout_ms=busy_timeout_ms)


__all__ = ["make_wsgi_app"]
