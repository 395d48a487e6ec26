"""Owner liveness across hosts: a session-level advisory lock per owning process.

A process that starts a task with an owner first opens a connection of its own to the ledger's
database (one per server and database, shared by the ledger schemas there) and takes
``pg_advisory_lock`` on a 64-bit key derived from the ledger's schema and its owner token; the
task row stores only the token. The connection (and so the lock) lives as long as the process:
the server ends the session, releasing the lock, at once when the process dies (its socket
closes), and within the keepalive bounds of ``url.SERVER_KEEPALIVE`` when its host vanishes.

A token is 32 lowercase hex digits: 8 name the server *incarnation* the token was made in, 24
are random. An incarnation starts when the server (re)starts its shared memory, which is where
advisory locks live: it is the latest of ``pg_postmaster_start_time()`` (a start or restart),
``pg_stat_bgwriter.stats_reset`` (PostgreSQL resets it when it reinitialises after a crashed
backend, which ends every session but keeps the postmaster and its start time; also when an
administrator resets those statistics) and, on a promoted standby, the time of the last
transaction it replayed before promotion, in whole seconds since the epoch.

A probe asks for the token's key *shared*, at transaction level
(``pg_try_advisory_xact_lock_shared``):

- refused: somebody holds it exclusively, the owner is **alive**;
- granted, and the token was made in the current incarnation: the owner's session ended while
  the server kept running, so the owner is **dead** (a SIGKILLed process is proven dead at once);
- granted, and the token is from an earlier incarnation: the server restarted or failed over
  since, which ended every session, the living owners' included. **Unknown** (the core then
  applies its heartbeat and deadline rules, never ``owner_lost``) until the incarnation is older
  than the URL's ``owner_reconnect_seconds`` (default 60), then **dead**: a living owner has
  taken its lock back by then.

An owner takes its lock back itself: its lock connection is checked (without a round trip
unless the server has sent it something) at the start of every write transaction of this
process, heartbeats included, and before every owning start; found broken, it is reopened and
the *same* tokens are locked again (they are random: nobody else ever locks them), so the
owner's tasks stay its own. A process that only heartbeats has its locks back at its first
heartbeat the restarted server accepts, so ``owner_reconnect_seconds`` must exceed the
heartbeat interval plus the time a restart or failover takes.

A probe never blocks: it only tries, and its shared lock ends with its transaction. An
administrator's ``pg_terminate_backend`` of a live owner's lock session is, within one
incarnation, indistinguishable from that owner's death: a reconcile may close its tasks
``owner_lost``; the owner then locks its token again and its later writes to those tasks get
``StateConflict``. Two incarnations that begin within the same second are not told apart.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import select
import threading

import psycopg
from task_state_guard.model import LedgerError, Liveness

from . import driver
from .ddl import lock_key
from .url import Target

OWNER_KIND = "tsg-owner"
_HEX = frozenset("0123456789abcdef")
#: The current incarnation's start (its seconds, and how long ago it was, by the server's clock).
_INCARNATION = (
    "greatest(pg_postmaster_start_time(), (SELECT stats_reset FROM pg_stat_bgwriter),"
    " CASE WHEN pg_is_in_recovery() THEN NULL ELSE pg_last_xact_replay_timestamp() END)"
)
_COLUMNS = (
    f"floor(extract(epoch FROM {_INCARNATION}))::bigint,"
    f" extract(epoch FROM clock_timestamp() - {_INCARNATION})::float8"
)
INCARNATION_SQL = f"SELECT {_COLUMNS}"
_PROBE = f"SELECT pg_try_advisory_xact_lock_shared(%(key)s), {_COLUMNS}"
_LOCK = "SELECT pg_advisory_lock(%(key)s)"


def epoch_hex(seconds: int) -> str:
    """The 8 hex digits that name an incarnation in a token."""
    return f"{seconds & 0xFFFFFFFF:08x}"


class _Registry:
    """This process's owner lock connections (one per server and database, shared by every
    ledger schema there) and its tokens (one per schema; kept when a connection breaks)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pid = os.getpid()
        self.conns: dict[str, driver.Conn] = {}
        self.tokens: dict[tuple[str, str], str] = {}
        #: (conninfo, schema) whose token this process lends to the children it forks.
        self.supervising: set[tuple[str, str]] = set()
        #: (conninfo, schema) -> the supervising parent's token, recorded instead of our own.
        self.delegated: dict[tuple[str, str], str] = {}
        #: (conninfo, schema) whose lock a thread of this process keeps (``supervise``).
        self.keepers: set[tuple[str, str]] = set()

    def reset_after_fork(self) -> None:
        # The parent's connections are never used or closed here (see ``driver``); nor are its
        # tokens: the child is another owner, unless the parent supervises it (``supervise``).
        self.delegated = {key: tok for key, tok in self.tokens.items() if key in self.supervising}
        self.lock = threading.Lock()
        self.pid = os.getpid()
        self.conns = {}
        self.tokens = {}
        self.supervising = set()
        self.keepers = set()


_REGISTRY = _Registry()
os.register_at_fork(after_in_child=_REGISTRY.reset_after_fork)


def _suspect(conn: driver.Conn) -> bool:
    """True when the idle lock connection is unusable or the server sent it something (an
    idle session receives nothing unless it is being ended): worth a real check."""
    if not conn.usable:
        return True
    try:
        fd = conn.raw.fileno()
        if hasattr(select, "poll"):  # no FD_SETSIZE limit
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            return bool(poller.poll(0))
        readable, _w, _x = select.select([fd], [], [], 0)
    except (OSError, ValueError, psycopg.Error):
        return True
    return bool(readable)


def _intact(conn: driver.Conn | None) -> bool:
    """Whether the lock connection's session still holds its locks (a round trip only when
    the connection looks suspect)."""
    if conn is None:
        return False
    if not _suspect(conn):
        return True
    if not conn.usable:
        return False
    try:
        conn.execute("SELECT 1")
    except LedgerError:
        return False
    return conn.usable


def _relock(registry: _Registry, target: Target, busy_timeout_ms: int) -> driver.Conn:
    """Open a fresh lock connection and lock again every token this process owns on that
    server and database (caller holds the registry lock)."""
    old = registry.conns.pop(target.conninfo, None)
    if old is not None:
        old.close()
    conn = driver.connect(target, busy_timeout_ms=busy_timeout_ms, read_only=False)
    try:
        for (conninfo, schema), token in registry.tokens.items():
            if conninfo == target.conninfo:
                conn.run(_LOCK, {"key": lock_key(OWNER_KIND, schema, token)})
    except BaseException:
        conn.close()
        raise
    registry.conns[target.conninfo] = conn
    return conn


def held_token(target: Target) -> str | None:
    """This process's token for the ledger while its lock is known held, else None."""
    registry = _REGISTRY
    if registry.pid != os.getpid():
        return None
    delegated = registry.delegated.get((target.conninfo, target.schema))
    if delegated is not None:
        return delegated
    token = registry.tokens.get((target.conninfo, target.schema))
    conn = registry.conns.get(target.conninfo)
    if token is None or conn is None or _suspect(conn):
        return None
    return token


def supervise(target: Target, busy_timeout_ms: int) -> str:
    """Make this process the owner of the work its children forked from now on start: its
    token (locked now if needed) is what such a child records as owner. For a process that
    reports every end of its children's work, a lost child's included; idempotent (and a
    call retakes a lock whose connection broke)."""
    token = own_token(target, busy_timeout_ms)
    with _REGISTRY.lock:
        _REGISTRY.supervising.add((target.conninfo, target.schema))
        if (target.conninfo, target.schema) not in _REGISTRY.keepers:
            # The children heartbeat, but only this process can take its lock back after a
            # server restart: a supervisor that writes nothing for a while checks it itself,
            # well within owner_reconnect_seconds.
            _REGISTRY.keepers.add((target.conninfo, target.schema))
            interval = max(0.5, min(10.0, target.owner_reconnect_seconds / 4))
            threading.Thread(
                target=_keep_supervising, args=(target, busy_timeout_ms, interval, os.getpid()),
                name="tsg-owner-keeper", daemon=True,
            ).start()
    return token


def _keep_supervising(target: Target, busy_timeout_ms: int, interval: float, pid: int) -> None:
    stop = threading.Event()
    while not stop.wait(interval):
        if os.getpid() != pid:  # pragma: no cover - a thread does not survive a fork
            return
        keep_locks(target, busy_timeout_ms)


def own_token(target: Target, busy_timeout_ms: int) -> str:
    """Return this process's owner token with its advisory lock held: made and locked on
    first use, locked again (the same token) after the lock connection broke. A child of a
    supervising parent returns the parent's token (see :func:`supervise`)."""
    delegated = _REGISTRY.delegated.get((target.conninfo, target.schema))
    if delegated is not None and _REGISTRY.pid == os.getpid():
        return delegated
    with _REGISTRY.lock:
        registry = _REGISTRY
        if registry.pid != os.getpid():
            registry.reset_after_fork()
        conn = registry.conns.get(target.conninfo)
        if not _intact(conn):
            conn = _relock(registry, target, busy_timeout_ms)
        assert conn is not None
        token = registry.tokens.get((target.conninfo, target.schema))
        if token is not None:
            return token
        row = conn.execute(INCARNATION_SQL).fetchone()
        token = epoch_hex(int(row[0]) if row is not None else 0) + secrets.token_hex(12)
        conn.run(_LOCK, {"key": lock_key(OWNER_KIND, target.schema, token)})
        registry.tokens[(target.conninfo, target.schema)] = token
        return token


def keep_locks(target: Target, busy_timeout_ms: int) -> None:
    """At the start of each write transaction (so the server is reachable): when this process
    owns tokens on the ledger's server and its lock connection broke (a restart, a failover),
    reconnect and lock the same tokens again. A failure is left for the next write. Costs one
    ``select`` while the lock connection is intact."""
    registry = _REGISTRY
    if registry.pid != os.getpid() or not any(
        key[0] == target.conninfo for key in registry.tokens
    ):
        return
    conn = registry.conns.get(target.conninfo)
    if conn is not None and not _suspect(conn):
        return
    with registry.lock:
        if registry.pid != os.getpid():
            return
        if _intact(registry.conns.get(target.conninfo)):
            return
        with contextlib.suppress(LedgerError):
            _relock(registry, target, busy_timeout_ms)


def probe(conn: driver.Conn, target: Target, token: str) -> Liveness:
    """Whether the owner holding ``token`` is alive, dead, or unknown (``conn``: the caller's
    connection, inside its transaction; the probe's shared lock ends with that transaction)."""
    if len(token) != 32 or not _HEX.issuperset(token):
        return Liveness.UNKNOWN
    if held_token(target) == token:
        return Liveness.ALIVE
    key = lock_key(OWNER_KIND, target.schema, token)
    row = conn.run(_PROBE, {"key": key}).fetchone()
    if row is None or row[0] is not True:
        return Liveness.ALIVE
    incarnation, uptime = row[1], row[2]
    if token[:8] == epoch_hex(int(incarnation)):
        return Liveness.DEAD
    if float(uptime) > target.owner_reconnect_seconds:
        return Liveness.DEAD
    return Liveness.UNKNOWN


__all__ = [
    "INCARNATION_SQL", "epoch_hex", "held_token", "keep_locks", "own_token", "probe", "supervise",
]
