"""The backend registry: a ``postgresql://`` (or ``postgres://``) URL opens the optional
PostgreSQL backend (package ``task-state-guard-postgres``), and so does SQLAlchemy's spelling
of the same URL with a libpq driver (``postgresql+psycopg://``, ``postgresql+psycopg2://``);
any other ``scheme://`` is refused (``unsupported_url_scheme``), never taken for a path;
anything else is a SQLite path (``task_state_guard.sqlite``). ``Ledger`` opens its database
object through :func:`open_store`.

This module recognises and redacts URLs; a backend (and its driver) is imported only when a
ledger of its kind is opened.
"""

from __future__ import annotations

import importlib
import re
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, unquote_plus

from .. import reasons as r
from ..model import InvalidInput, StorageError

if TYPE_CHECKING:
    from .protocol import Database

URL_PREFIXES = ("postgresql://", "postgres://")
#: The schemes of a PostgreSQL ledger URL (compared without case): libpq's two, and
#: SQLAlchemy's ``dialect+driver`` names for the libpq drivers, whose URLs mean the same.
POSTGRES_SCHEMES = frozenset({
    "postgresql", "postgres", "postgresql+psycopg", "postgresql+psycopg2",
    "postgres+psycopg", "postgres+psycopg2",
})
# Anything that starts like a URL: a scheme of two or more characters, then ``://`` (a
# one-letter scheme is a Windows drive, ``C://data``, and stays a path).
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]{1,63})://")
#: The fixed error when a PostgreSQL URL is given but the backend is not installed.
MISSING_BACKEND = (
    "a PostgreSQL ledger needs the task-state-guard-postgres package "
    "(pip install task-state-guard-postgres)"
)
#: Each kind of ledger target and the module whose ``open_database(target, **options)`` makes
#: its database object (``options``: every ``Ledger`` option; a backend uses those it has).
BACKENDS = {"postgresql": "task_state_guard_postgres", "sqlite": "task_state_guard.sqlite.database"}
#: The layout version the SQLite backend writes (``sqlite.schema`` takes it from here), stated
#: here so the facade knows it without importing a backend.
SQLITE_SCHEMA_VERSION = 9
#: The most statement connections a process may keep for one ledger (``connections``).
MAX_CONNECTIONS = 64


def url_scheme(target: object) -> str | None:
    """The scheme (lower case) when ``target`` is written as a URL (``scheme://...``)."""
    if not isinstance(target, str):
        return None
    match = _SCHEME.match(target)
    return match.group(1).lower() if match else None


def is_url(target: object) -> bool:
    """True when ``target`` is a PostgreSQL URL (a scheme of :data:`POSTGRES_SCHEMES`)."""
    return url_scheme(target) in POSTGRES_SCHEMES


def check_target(target: object) -> None:
    """``InvalidInput`` (``unsupported_url_scheme``) when ``target`` is a URL of a scheme no
    backend opens: such a string is never taken for a SQLite path."""
    scheme = url_scheme(target)
    if scheme is not None and scheme not in POSTGRES_SCHEMES:
        raise InvalidInput(
            "a ledger URL must be postgresql:// (or postgres://, postgresql+psycopg://)",
            reason=r.UNSUPPORTED_URL_SCHEME,
        )


def is_secret_parameter(raw_key: str) -> bool:
    """Whether a URL query key names a secret: any key ending in ``password`` (``password``,
    ``sslpassword``, ...), however it is percent-encoded or capitalised."""
    keys = {unquote(raw_key), unquote_plus(raw_key)}
    return any(key.strip().lower().endswith("password") for key in keys)


def redact(target: str) -> str:
    """``target`` without any secret: the user info keeps only the user, every query parameter
    whose key ends in ``password`` is dropped (however its key is percent-encoded or
    capitalised, however often it repeats), and so is a fragment; the rest is kept as written.

    Any ``scheme://`` is redacted so, a refused one too. The user info ends at an ``@`` of the
    authority; a password with an unencoded ``@``, ``?`` or ``/`` is still cut out: the cut is
    made at the last ``@`` before the first ``/`` or before the first ``?``, whichever lies
    further on.
    """
    if url_scheme(target) is None:
        return target
    scheme, _, rest = target.partition("://")
    rest = rest.partition("#")[0]
    cut = -1
    for stop in ("/", "?"):
        end = rest.find(stop)
        cut = max(cut, rest.rfind("@", 0, len(rest) if end < 0 else end))
    if cut >= 0:
        user = rest[:cut].split(":", 1)[0]
        rest = (f"{user}@" if user else "") + rest[cut + 1 :]
    location, question, query = rest.partition("?")
    kept = [part for part in query.split("&")
            if part and not is_secret_parameter(part.partition("=")[0])]
    return f"{scheme}://{location}?{'&'.join(kept)}" if question and kept else (
        f"{scheme}://{location}")


def kind_of(target: object) -> str:
    """The kind of ledger ``target`` names: ``postgresql`` for a PostgreSQL URL, else
    ``sqlite``; a URL of any other scheme is refused (:func:`check_target`)."""
    check_target(target)
    return "postgresql" if is_url(target) else "sqlite"


def check_options(options: dict[str, Any]) -> None:
    """``InvalidInput`` for a ledger option every backend shares that is not valid: a clock
    that is not callable, a busy timeout that is not an integer in 0..600,000 ms, a flag that
    is not a boolean, a number of connections that is not None nor an integer in 1..64."""
    if not callable(options["clock"]):
        raise InvalidInput("clock must be callable")
    timeout = options["busy_timeout_ms"]
    if isinstance(timeout, bool) or not isinstance(timeout, int):
        raise InvalidInput("busy_timeout_ms must be an integer")
    if not 0 <= timeout <= 600_000:
        raise InvalidInput("busy_timeout_ms is out of range")
    for flag in ("allow_external_acl", "read_only", "transient_sidecars", "create"):
        if not isinstance(options[flag], bool):
            raise InvalidInput("flags must be booleans")
    connections = options["connections"]
    if connections is not None and (
        isinstance(connections, bool) or not isinstance(connections, int)
        or not 1 <= connections <= MAX_CONNECTIONS
    ):
        raise InvalidInput("connections must be None or a whole number from 1 to 64")


def open_store(target: object, **options: Any) -> Database:
    """The database object of the ledger at ``target`` from the backend of its kind (nothing
    is connected yet), once :func:`check_options` accepted ``options``; ``StorageError`` with
    :data:`MISSING_BACKEND` when that backend (or its driver) is not installed."""
    check_options(options)
    try:
        backend = importlib.import_module(BACKENDS[kind_of(target)])
    except ImportError:
        raise StorageError(MISSING_BACKEND, reason=r.BACKEND_MISSING) from None
    db: Database = backend.open_database(target, **options)
    return db


__all__ = [
    "BACKENDS", "MISSING_BACKEND", "POSTGRES_SCHEMES", "URL_PREFIXES", "check_options",
    "check_target", "is_url", "kind_of", "open_store", "redact", "url_scheme",
]
