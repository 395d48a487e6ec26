"""Ledger URLs: the schema parameter, connection defaults (TCP keepalive) and redaction.

``postgresql://USER@HOST[:PORT]/DB?schema=NAME&...`` (a password may follow the user, after a
colon): ``schema`` is the ledger's own parameter (stripped before connecting; default ``tsg``);
every other parameter goes to libpq. The password is kept only inside :class:`Target` and never
shown (its ``repr`` and ``shown`` carry the URL without it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from task_state_guard import reasons as r
from task_state_guard.backends import redact
from task_state_guard.model import InvalidInput

DEFAULT_SCHEMA = "tsg"
_SCHEMA = re.compile(r"[a-z_][a-z0-9_]{0,62}")

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


def parse(url: str) -> Target:
    """Parse a ledger URL; a malformed one is a fixed ``InvalidInput`` (no value echoed)."""
    try:
        parts = urlsplit(url)
        query = parse_qsl(parts.query, keep_blank_values=True)
        port_ok = parts.port is None or 0 < parts.port < 65536
    except ValueError:
        port_ok = False
    if not port_ok:  # raised outside the handler: no rejected value is chained
        raise InvalidInput("the PostgreSQL URL does not parse", reason=r.INVALID_DATABASE_PATH)
    schemas = [value for key, value in query if key == "schema"]
    if len(schemas) > 1 or (schemas and not _SCHEMA.fullmatch(schemas[0])):
        raise InvalidInput(
            "the URL's schema must match [a-z_][a-z0-9_]{0,62}", reason=r.INVALID_DATABASE_PATH
        )
    schema = schemas[0] if schemas else DEFAULT_SCHEMA
    rest = [(key, value) for key, value in query if key != "schema"]
    conninfo = ""
    try:
        params = conninfo_to_dict(urlunsplit(parts._replace(query=urlencode(rest))))
        for key, value in CLIENT_DEFAULTS.items():
            params.setdefault(key, value)
        conninfo = make_conninfo("", **params)
    except (psycopg.Error, ValueError, TypeError):
        pass
    if not conninfo:
        raise InvalidInput("the PostgreSQL URL does not parse", reason=r.INVALID_DATABASE_PATH)
    shown = redact(urlunsplit(parts._replace(query=urlencode(
        [(k, v) for k, v in query if k.lower() != "password"]))))
    return Target(conninfo=conninfo, schema=schema, shown=shown)


__all__ = ["CLIENT_DEFAULTS", "DEFAULT_SCHEMA", "SERVER_KEEPALIVE", "Target", "parse"]
