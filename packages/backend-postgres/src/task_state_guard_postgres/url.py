"""Ledger URLs: the schema parameter, connection defaults (TCP keepalive) and redaction.

``postgresql://USER@HOST[:PORT]/DB?schema=NAME&...`` (a password may follow the user, after a
colon; ``postgres://`` and SQLAlchemy's ``postgresql+psycopg://`` / ``+psycopg2://`` are read
as ``postgresql://``): ``schema`` (default ``tsg``), ``owner_reconnect_seconds`` (default 60;
see ``owners``) and ``connections`` (the statement connections a process keeps, 1 to 64;
unset: the number the opener asks for, else 1; see ``pool``) are the ledger's own parameters,
stripped before connecting; every other parameter goes to libpq exactly as written (libpq
decodes it). The password is kept only inside :class:`Target` and never shown (its ``repr``
and ``shown`` carry the URL without the user info's password and without any parameter
whose key ends in ``password``).
"""

from __future__ import annotations

import contextlib
import math
import re
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit, urlunsplit

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from task_state_guard import reasons as r
from task_state_guard.durations import parse_seconds
from task_state_guard.model import InvalidInput
from task_state_guard.store.backends import redact

DEFAULT_SCHEMA = "tsg"
_SCHEMA = re.compile(r"[a-z_][a-z0-9_]{0,62}")
#: How long after a server restart or failover an owner whose advisory lock is free still
#: counts as possibly alive (it may be reconnecting); see ``owners``.
DEFAULT_OWNER_RECONNECT_SECONDS = 60.0
MAX_OWNER_RECONNECT_SECONDS = 86400.0
MAX_CONNECTIONS = 64
_OWN_PARAMETERS = ("schema", "owner_reconnect_seconds", "connections")

#: Client-side connection defaults, used unless the URL sets them. The TCP keepalive
#: settings make a connection to a vanished server fail within about 25 s of silence
#: (idle 10 s + 3 probes x 5 s) and unacknowledged writes fail after 30 s.
CLIENT_DEFAULTS: dict[str, str] = {
    "connect_timeout": "10",
    "keepalives": "1",
    "keepalives_idle": "10",
    "keepalives_interval": "5",
    "keepalives_count": "3",
    "tcp_user_timeout": "30000",
}
#: The same bounds on the server's side of each session (set per session; they need no
#: privilege): the server ends the session of a vanished client host, and with it the
#: owner's advisory lock, within about 25 s of silence (30 s with unacknowledged data).
SERVER_KEEPALIVE: dict[str, str] = {
    "tcp_keepalives_idle": "10",
    "tcp_keepalives_interval": "5",
    "tcp_keepalives_count": "3",
    "tcp_user_timeout": "30000",
}


@dataclass(frozen=True)
class Target:
    """Where a ledger lives: the libpq connection string (secret), schema, and shown URL."""

    conninfo: str = field(repr=False)
    schema: str
    shown: str
    owner_reconnect_seconds: float = DEFAULT_OWNER_RECONNECT_SECONDS
    #: Statement connections a process keeps for the ledger (``pool``); None: not in the URL.
    connections: int | None = None


def _invalid(message: str) -> InvalidInput:
    return InvalidInput(message, reason=r.INVALID_DATABASE_PATH)


def _reconnect_seconds(values: list[str]) -> float:
    """The ``owner_reconnect_seconds`` parameter: one plain number of seconds (ASCII digits, an
    optional fraction: the CLI's grammar without a unit), 0 to a day."""
    if not values:
        return DEFAULT_OWNER_RECONNECT_SECONDS
    seconds = math.nan
    if len(values) == 1 and values[0][-1:].isdigit():
        with contextlib.suppress(InvalidInput):
            seconds = parse_seconds(values[0], "owner_reconnect_seconds")
    if not (math.isfinite(seconds) and 0 <= seconds <= MAX_OWNER_RECONNECT_SECONDS):
        raise _invalid("the URL's owner_reconnect_seconds must be one number from 0 to 86400")
    return seconds


def _connections(values: list[str]) -> int | None:
    """The ``connections`` parameter: one whole number (ASCII digits) from 1 to 64 (None: unset)."""
    if not values:
        return None
    value = values[0]
    if len(values) != 1 or not (value.isascii() and value.isdigit() and len(value) <= 2) or not (
        1 <= int(value) <= MAX_CONNECTIONS
    ):
        raise _invalid("the URL's connections must be one whole number from 1 to 64")
    return int(value)


def _split_query(query: str) -> tuple[dict[str, list[str]], str]:
    """The ledger's own parameters (decoded as libpq decodes: ``%XX`` only, ``+`` stays) and
    the rest of the query exactly as written, for libpq to decode itself."""
    own: dict[str, list[str]] = {name: [] for name in _OWN_PARAMETERS}
    rest: list[str] = []
    for part in query.split("&"):
        if not part:
            continue
        raw_key, _, raw_value = part.partition("=")
        key = unquote(raw_key)
        if key in own:
            own[key].append(unquote(raw_value))
        else:
            rest.append(part)
    return own, "&".join(rest)


def parse(url: str) -> Target:
    """Parse a ledger URL; a malformed one is a fixed ``InvalidInput`` (no value echoed).

    Every parameter but the ledger's own reaches libpq exactly as the URL percent-encodes it
    (``options=-c%20statement_timeout%3D1000``, ``application_name=my%20app``)."""
    try:
        parts = urlsplit(url)
        port_ok = parts.port is None or 0 < parts.port < 65536
    except ValueError:
        port_ok = False
    if not port_ok:  # raised outside the handler: no rejected value is chained
        raise _invalid("the PostgreSQL URL does not parse")
    own, rest = _split_query(parts.query)
    schemas = own["schema"]
    if len(schemas) > 1 or (schemas and not _SCHEMA.fullmatch(schemas[0])):
        raise _invalid("the URL's schema must match [a-z_][a-z0-9_]{0,62}")
    schema = schemas[0] if schemas else DEFAULT_SCHEMA
    reconnect = _reconnect_seconds(own["owner_reconnect_seconds"])
    connections = _connections(own["connections"])
    conninfo = ""
    try:
        # libpq's scheme: SQLAlchemy's postgresql+psycopg:// (or +psycopg2) means the same URL
        libpq_url = urlunsplit(parts._replace(scheme="postgresql", query=rest, fragment=""))
        params = conninfo_to_dict(libpq_url)
        for key, value in CLIENT_DEFAULTS.items():
            params.setdefault(key, value)
        conninfo = make_conninfo("", **params)
    except (psycopg.Error, ValueError, TypeError):
        pass
    if not conninfo:
        raise _invalid("the PostgreSQL URL does not parse")
    return Target(
        conninfo=conninfo, schema=schema, shown=redact(url), owner_reconnect_seconds=reconnect,
        connections=connections,
    )


__all__ = [
    "CLIENT_DEFAULTS", "DEFAULT_OWNER_RECONNECT_SECONDS", "DEFAULT_SCHEMA",
    "MAX_CONNECTIONS", "MAX_OWNER_RECONNECT_SECONDS", "SERVER_KEEPALIVE", "Target", "parse",
]
