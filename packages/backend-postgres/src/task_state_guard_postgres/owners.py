"""Owner liveness across hosts: a session-level advisory lock per owning process.

A process that starts a task with an owner first opens a connection of its own to the ledger's
database and takes ``pg_advisory_lock`` on a 64-bit key derived from the ledger's schema and a
fresh random token; the task row stores only the token. The connection (and so the lock) lives
as long as the process: the server ends the session, releasing the lock, at once when the
process dies (its socket closes), and within the keepalive bounds of ``url.SERVER_KEEPALIVE``
when its host vanishes.

A probe asks for the same key *shared*, at transaction level (``pg_try_advisory_xact_lock_shared``):
granted means nobody holds it exclusively, so the owner's session has ended and its running
tasks are provably lost; refused means the owner is alive. A token is locked before any row
names it and never locked again, so a probe can neither block nor outlive a live owner.
Should this process's owner connection break, its token is given up and the next owning start
takes a fresh one (the tasks of the old token are then, honestly, ownerless).
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
    """This process's owner tokens: one per (server, database, schema)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pid = os.getpid()
        self.held: dict[tuple[str, str], tuple[str, driver.Conn]] = {}

    def reset_after_fork(self) -> None:
        # The inherited connections are neutralised by the driver's fork hook; never closed.
        self.lock = threading.Lock()
        self.pid = os.getpid()
        self.held = {}


_REGISTRY = _Registry()
os.register_at_fork(after_in_child=_REGISTRY.reset_after_fork)


def _key(target: Target) -> tuple[str, str]:
    return (target.conninfo, target.schema)


def held_token(target: Target) -> str | None:
    """This process's token for the ledger while its lock connection is usable, else None."""
    entry = _REGISTRY.held.get(_key(target))
    if entry is not None and _REGISTRY.pid == os.getpid() and entry[1].usable:
        return entry[0]
    return None


def own_token(target: Target, busy_timeout_ms: int) -> str:
    """Return this process's owner token, taking its advisory lock on first use."""
    token = held_token(target)
    if token is not None:
        return token
    with _REGISTRY.lock:
        if _REGISTRY.pid != os.getpid():
            _REGISTRY.reset_after_fork()
        entry = _REGISTRY.held.get(_key(target))
        if entry is not None and entry[1].usable:
            return entry[0]
        if entry is not None:
            entry[1].close()  # broken: its lock is gone with its session
        conn = driver.connect(target, busy_timeout_ms=busy_timeout_ms, read_only=False)
        token = uuid.uuid4().hex
        try:
            key = lock_key(OWNER_KIND, target.schema, token)
            conn.execute("SELECT pg_advisory_lock(?)", (key,))
        except BaseException:
            conn.close()
            raise
        _REGISTRY.held[_key(target)] = (token, conn)
        return token


def probe(conn: driver.Conn, target: Target, token: str) -> Liveness:
    """Whether the owner holding ``token`` is alive or provably dead (``conn``: the caller's
    connection, inside its transaction; the probe's shared lock ends with that transaction)."""
    if len(token) != 32 or not all(c in "0123456789abcdef" for c in token):
        return Liveness.UNKNOWN
    if held_token(target) == token:
        return Liveness.ALIVE
    row = conn.execute(
        "SELECT pg_try_advisory_xact_lock_shared(?)", (lock_key(OWNER_KIND, target.schema, token),)
    ).fetchone()
    return Liveness.DEAD if row is not None and row[0] is True else Liveness.ALIVE


__all__ = ["held_token", "own_token", "probe"]
