"""Owner liveness across hosts: a session-level advisory lock per owning process.

A process that starts a task with an owner first opens a connection of its own to the ledger's
database (one per server and database, shared by the ledger schemas there) and takes
``pg_advisory_lock`` on a 64-bit key derived from the ledger's schema and a fresh random token;
the task row stores only the token. The connection (and so the lock) lives
as long as the process: the server ends the session, releasing the lock, at once when the
process dies (its socket closes), and within the keepalive bounds of ``url.SERVER_KEEPALIVE``
when its host vanishes.

A probe asks for the same key *shared*, at transaction level
(``pg_try_advisory_xact_lock_shared``): granted means nobody holds it exclusively, so the
owner's session has ended and its running tasks are provably lost; refused means the owner is
alive. A token is locked before any row names it and never locked again, so a probe can neither
block nor outlive a live owner. Should this process's owner connection break, its tokens are
given up and the next owning start takes a fresh one (the tasks of the old token are then,
honestly, ownerless).
"""

from __future__ import annotations

import os
import threading
import uuid

from task_state_guard.owners import Liveness

from . import driver
from .ddl import lock_key
from .url import Target

OWNER_KIND = "tsg-owner"


class _Registry:
    """This process's owner lock connections (one per server and database, shared by every
    ledger schema there) and its tokens (one per schema)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pid = os.getpid()
        self.conns: dict[str, driver.Conn] = {}
        self.tokens: dict[tuple[str, str], str] = {}

    def reset_after_fork(self) -> None:
        # The parent's connections are never used or closed here (see ``driver``).
        self.lock = threading.Lock()
        self.pid = os.getpid()
        self.conns = {}
        self.tokens = {}


_REGISTRY = _Registry()
os.register_at_fork(after_in_child=_REGISTRY.reset_after_fork)


def held_token(target: Target) -> str | None:
    """This process's token for the ledger while its lock connection is usable, else None."""
    registry = _REGISTRY
    if registry.pid != os.getpid():
        return None
    conn = registry.conns.get(target.conninfo)
    if conn is None or not conn.usable:
        return None
    return registry.tokens.get((target.conninfo, target.schema))


def own_token(target: Target, busy_timeout_ms: int) -> str:
    """Return this process's owner token, taking its advisory lock on first use."""
    token = held_token(target)
    if token is not None:
        return token
    with _REGISTRY.lock:
        registry = _REGISTRY
        if registry.pid != os.getpid():
            registry.reset_after_fork()
        conn = registry.conns.get(target.conninfo)
        if conn is not None and not conn.usable:
            # Broken: every lock it held is gone with its session; so are its tokens.
            conn.close()
            registry.tokens = {
                key: value for key, value in registry.tokens.items() if key[0] != target.conninfo
            }
            conn = None
        token = registry.tokens.get((target.conninfo, target.schema))
        if conn is not None and token is not None:
            return token
        if conn is None:
            conn = driver.connect(target, busy_timeout_ms=busy_timeout_ms, read_only=False)
            registry.conns[target.conninfo] = conn
        token = uuid.uuid4().hex
        conn.execute(
            "SELECT pg_advisory_lock(?)", (lock_key(OWNER_KIND, target.schema, token),)
        )
        registry.tokens[(target.conninfo, target.schema)] = token
        return token


def probe(conn: driver.Conn, target: Target, token: str) -> Liveness:
    """Whether the owner holding ``token`` is alive or provably dead (``conn``: the caller's
    connection, inside its transaction; the probe's shared lock ends with that transaction)."""
    if len(token) != 32 or not all(c in "0123456789abcdef" for c in token):
        return Liveness.UNKNOWN
    if held_token(target) == token:
        return Liveness.ALIVE
    key = lock_key(OWNER_KIND, target.schema, token)
    row = conn.execute("SELECT pg_try_advisory_xact_lock_shared(?)", (key,)).fetchone()
    return Liveness.DEAD if row is not None and row[0] is True else Liveness.ALIVE


__all__ = ["held_token", "own_token", "probe"]
