"""The PostgreSQL database object behind ``Ledger(url)``: the core's ``Database`` protocol.

One kept statement connection per process, leased to one thread at a time for a statement or
a transaction (``task_state_guard_postgres.pool``; opened lazily, never used after ``fork()``).
Writes run at READ COMMITTED. A transition outside a group is first tried as its guarded
statement alone (one round trip, its own transaction; a statement that waited for a row lock
re-judges its guard against the row committed meanwhile). On a refusal, and inside a group,
the locked path runs: it first holds the task's row, then reads the clock, then runs the
guarded statement, so concurrent writers on one task queue on its row lock exactly as SQLite's
writers queue on the database lock, and a guard is always judged against the latest committed
row (``task_state_guard_postgres.transitions``). Reads run in REPEATABLE READ READ ONLY
transactions whose snapshot is taken before the caller reads the clock (a dry run writes
nothing).
Reconcile and prune passes (``bulk``) first take a transaction-level advisory lock of the
schema, so passes on many hosts run one after another, and reconcile holds the open rows it
reads until it commits, skipping any row a worker's transaction holds at that moment: no pass
double-closes, loses an update, or waits for (so deadlocks with) a worker.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any, overload

from task_state_guard import reasons as r
from task_state_guard.model import (
    InvalidInput,
    LedgerError,
    Liveness,
    StorageError,
    check_snapshot_limit,
)
from task_state_guard.store.attempts import Begin, Boundary, End, Ended
from task_state_guard.store.protocol import Layout, Opened, read_clock
from task_state_guard.store.transitions import Outcome, Step

from . import attempts as _attempts
from . import ddl, driver, owners
from . import doctor as _doctor
from . import pool as _pool
from . import transitions as _transitions
from .queries import PASS_KIND, PostgresQueries
from .url import CLIENT_DEFAULTS, SERVER_KEEPALIVE, Target, parse

#: What ``pg_export_snapshot()`` returns (hex numbers joined by dashes).
_SNAPSHOT_ID = re.compile(r"[0-9A-F]{1,16}(-[0-9A-F]{1,16}){1,2}")


class AdvisoryLocks:
    """A PostgreSQL ledger's owner liveness (``Database.owners``): session-level advisory
    locks (``task_state_guard_postgres.owners``)."""

    def __init__(self, db: PostgresDatabase) -> None:
        self._db = db

    def own(self) -> str:
        """This process's owner token (see :meth:`PostgresDatabase.own_token`)."""
        return self._db.own_token()

    def held(self) -> str | None:
        """This process's owner token while its lock connection is usable."""
        return self._db.held_token()

    def supervise(self) -> str:
        """This process owns what the children it forks start (``owners.supervise``)."""
        return self._db.supervise()

    def probe(self, token: str) -> Liveness:
        """See :meth:`PostgresDatabase.probe_owner`."""
        return self._db.probe_owner(token)

    def cleanup(self, is_referenced: Callable[[str], bool]) -> None:
        """Nothing to clean: an advisory lock ends with its session."""


class SchemaHealth:
    """A PostgreSQL ledger's probes of its schema (``Database.health``): doctor's report
    (``task_state_guard_postgres.doctor``: the migration record, the exact column layout and
    triggers, the core's rules in PostgreSQL's dialect) and the storage facts."""

    def __init__(self, db: PostgresDatabase) -> None:
        self._db = db

    def doctor(self) -> dict[str, Any]:
        """The counts-only health report (the core's report keys)."""
        return _doctor.run_doctor(self._db, self._db.schema)

    def storage(self) -> dict[str, Any]:
        """See :meth:`PostgresDatabase.storage_info`."""
        return self._db.storage_info()


class PostgresDatabase:
    """A ledger in one schema of a PostgreSQL database."""

    def __init__(
        self,
        url: str,
        *,
        clock: Callable[[], float],
        busy_timeout_ms: int,
        read_only: bool,
        check_schema: bool = True,
        create: bool = True,
        connections: int | None = None,
    ) -> None:
        self._target: Target = parse(url)
        self._create = create
        self._clock = clock
        self.busy_timeout_ms = busy_timeout_ms
        self._read_only = read_only
        self._opened = Opened(self._target.shown, read_only)
        self._check_schema = check_schema
        self._local = threading.local()
        self._lock = threading.Lock()
        #: The statement connections kept per process (``pool``): the URL's ``connections``,
        #: else the opener's (an adapter sizes it to its worker's threads), else one.
        size = self._target.connections or connections or _pool.BASE_CONNECTIONS
        self._pool = _pool.Pool(self._open, size)
        self._prepared = False
        self._closed = False
        self.schema_version: int | None = None
        #: The statements other than transitions (a read of one task opens its own read).
        self.queries = PostgresQueries(self.read)

    def __repr__(self) -> str:
        return f"PostgresDatabase({self._target.shown!r})"

    @property
    def opened(self) -> Opened:
        """The ledger's URL without its password, and whether it was opened read-only."""
        return self._opened

    @property
    def schema(self) -> str:
        """The PostgreSQL schema that holds the ledger."""
        return self._target.schema

    @property
    def layout(self) -> Layout:
        """The schema's layout (the PostgreSQL layout 6 added the verdict outbox, 8 the thread
        column)."""
        return Layout.of(self.schema_version, ddl.SCHEMA_VERSION, ddl.OUTBOX_VERSION,
                         ddl.THREAD_VERSION)

    def now(self) -> float:
        """Read the clock; a non-number, non-finite or negative reading is ``InvalidInput``."""
        return read_clock(self._clock)

    # ----------------------------------------------------------------- connections
    def _open(self) -> driver.Conn:
        """A new statement connection (the schema checked and migrated on the first)."""
        conn = driver.connect(
            self._target, busy_timeout_ms=self.busy_timeout_ms, read_only=self._read_only
        )
        try:
            if not self._prepared:
                with self._lock:
                    if not self._prepared:
                        self.schema_version = ddl.prepare(
                            conn, self._target.schema, read_only=self._read_only,
                            check=self._check_schema, now=self.now, create=self._create,
                        )
                        self._prepared = True
        except BaseException:
            conn.close()
            raise
        return conn

    def conn(self) -> driver.Conn:
        """The connection this thread leases, else the process's kept connection without a
        lease (opened, checked and migrated lazily): for inspecting a session's settings."""
        return self._pool.peek()

    def close(self) -> None:
        """Close every connection this process opened; no use afterwards."""
        self._closed = True
        self._pool.close()

    # ----------------------------------------------------------------- transactions
    @contextmanager
    def write(self) -> Iterator[driver.Conn]:
        """One READ COMMITTED transaction; commits on success, rolls back on any error.
        Inside :meth:`group` the enclosing transaction is reused; inside :meth:`bulk` the
        schema's pass lock is taken first. Once it has begun (the server is reachable), an
        owning process whose owner lock connection broke (a server restart or failover) takes
        its locks back (``owners.keep_locks``). The transaction holds this thread's lease on
        a connection (``pool``) until it ends."""
        if self._read_only:
            raise StorageError("the ledger was opened read-only", reason=r.READ_ONLY_LEDGER)
        with self._pool.lease() as conn:
            if getattr(self._local, "atomic", False):
                yield conn
            else:
                with self._transaction(conn):
                    yield conn

    @contextmanager
    def _transaction(self, conn: driver.Conn) -> Iterator[None]:
        """:meth:`write`'s transaction on ``conn``."""
        conn.execute("BEGIN")
        try:
            owners.keep_locks(self._target, self.busy_timeout_ms)
            if getattr(self._local, "bulk", False):
                conn.run("SELECT pg_advisory_xact_lock(%(key)s)",
                         {"key": ddl.lock_key(PASS_KIND, self.schema)})
                if self._local.fold:  # once a pass: its later batches add no increments
                    conn.execute(ddl.COMPACT_TOTALS)
                    self._local.fold = False
            yield
            if conn.failed:
                # A statement failed inside and the caller went on: PostgreSQL would turn this
                # COMMIT into a silent ROLLBACK. Say so instead.
                raise StorageError(
                    "a statement of the transaction failed; nothing was written",
                    reason=r.WRITE_REJECTED,
                )
            conn.execute("COMMIT")
        except BaseException:
            self._rollback(conn)
            raise

    @staticmethod
    def _rollback(conn: driver.Conn) -> None:
        if conn.usable and conn.in_transaction:
            try:
                conn.execute("ROLLBACK")
            except LedgerError:
                conn.close()  # unusable: the next use opens a fresh connection

    @contextmanager
    def group(self) -> Iterator[None]:
        """Group this thread's writes into one transaction: all commit, or none."""
        if getattr(self._local, "atomic", False):
            yield
            return
        with self.write():
            self._local.atomic = True
            try:
                yield
            finally:
                self._local.atomic = False

    @contextmanager
    def read(self) -> Iterator[driver.Conn]:
        """One REPEATABLE READ READ ONLY transaction, its snapshot taken before the caller
        reads the clock (inside this thread's open transaction: that one)."""
        with self._pool.lease() as conn:
            if conn.in_transaction:
                yield conn
                return
            conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            try:
                conn.execute("SELECT 1")  # the snapshot is taken by the first statement
                yield conn
            finally:
                self._rollback(conn)

    def export_snapshot(self, conn: driver.Conn) -> str:
        """The snapshot of ``conn``'s read transaction (:meth:`read`), for :meth:`read_beside`;
        valid while that transaction is open."""
        row = conn.execute("SELECT pg_export_snapshot()").fetchone()
        snapshot = "" if row is None else str(row[0])
        if not _SNAPSHOT_ID.fullmatch(snapshot):  # inlined below: never anything but an id
            raise StorageError("the server returned an unexpected snapshot id",
                               reason=r.DATABASE_UNUSABLE)
        return snapshot

    @contextmanager
    def read_beside(self, snapshot: str) -> Iterator[driver.Conn]:
        """A read transaction on a connection of its own (opened here, closed after) that
        sees exactly ``snapshot`` (:meth:`export_snapshot`): a second reader of the same
        consistent view, for a long check run beside the others."""
        if not _SNAPSHOT_ID.fullmatch(snapshot):
            raise InvalidInput("snapshot must be an id from export_snapshot")
        conn = self._open()
        try:
            conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            conn.execute(f"SET TRANSACTION SNAPSHOT '{snapshot}'")
            yield conn
        finally:
            conn.close()  # the transaction ends with its session

    @contextmanager
    def bulk(self) -> Iterator[None]:
        """Mark this thread's next write transactions as one pass (reconcile, prune): each
        takes the schema's pass lock first, and the first folds the outcome totals' increments
        (:data:`ddl.COMPACT_TOTALS`)."""
        if self._read_only:
            raise StorageError("the ledger was opened read-only", reason=r.READ_ONLY_LEDGER)
        self._local.bulk = True
        self._local.fold = True
        try:
            yield
        finally:
            self._local.bulk = False

    # ----------------------------------------------------------------- transitions
    @overload
    def transition(self, spec: Begin) -> str | None: ...

    @overload
    def transition(self, spec: End) -> Ended: ...

    @overload
    def transition(self, spec: Boundary) -> tuple[Ended, str | None]: ...

    @overload
    def transition(self, spec: Step) -> Outcome: ...

    def transition(
        self, spec: Step | Begin | End | Boundary
    ) -> Outcome | str | Ended | tuple[Ended, str | None] | None:
        """One guarded write: *begin attempt* (:meth:`_begin_attempt`), *end attempt*
        (:meth:`_end_attempt`) and a boundary of both (:meth:`_boundary`) as one statement
        each, or a one-task step. Outside any
        transaction (no group, no pass) a step's statement is first tried alone
        (:func:`~task_state_guard_postgres.transitions.try_alone`: one round trip, its own
        transaction); on a refusal, and inside a group, the locked path runs
        (:func:`~task_state_guard_postgres.transitions.run_locked`), which re-reads the clock
        once the task's row is held and explains a refusal."""
        if isinstance(spec, Begin):
            return self._begin_attempt(spec)
        if isinstance(spec, End):
            return self._end_attempt(spec)
        if isinstance(spec, Boundary):
            return self._boundary(spec)
        local = self._local
        if _transitions.has_fast_path(spec) and not (
            getattr(local, "atomic", False) or getattr(local, "bulk", False)
        ):
            with self._write_lease() as conn:
                if not conn.in_transaction:
                    now = self.now()
                    row = _transitions.try_alone(conn, spec, now)
                    # The server answered: as after a write's BEGIN, an owner whose lock
                    # connection broke takes its locks back.
                    owners.keep_locks(self._target, self.busy_timeout_ms)
                    if row is not None:
                        return Outcome(row, now, None)
        with self.write() as conn:
            return _transitions.run_locked(conn, spec, self.now)

    # ----------------------------------------------------------------- a guarded job's writes
    def _begin_attempt(self, spec: Begin) -> str | None:
        """*Begin attempt* as one statement (its own transaction outside a group): the
        attempt's id, or None when no attempt was started (the ledger explains)."""
        with self._write_lease() as conn:
            begun = _attempts.begin(conn, spec, self.now())
            self._after_autocommit(conn)
            return begun

    def _end_attempt(self, spec: End) -> Ended:
        """*End attempt* as one statement (its own transaction outside a group); a queue of
        nested attempts, or closes of attempts it queues, as one transaction of a statement
        per nesting depth and one for the closes."""
        if _attempts.in_steps(spec):
            with self.write() as conn:
                return _attempts.end_in_steps(conn, spec, self.now())
        with self._write_lease() as conn:
            ended = _attempts.end(conn, spec, self.now())
            self._after_autocommit(conn)
            return ended

    def _boundary(self, spec: Boundary) -> tuple[Ended, str | None]:
        """A boundary (*end attempt*, then *begin attempt*) as one statement (its own
        transaction outside a group). When the begin names a task the end writes (an attempt
        the end queues, the logical task it closes), or when the end takes steps of its own,
        the statements run in one transaction instead: one statement's parts would not see
        each other's rows."""
        written = {c[0] for c in spec.end.closes} | {q[0] for q in spec.end.queue}
        begin = spec.begin
        steps = _attempts.in_steps(spec.end)
        if steps or written & {begin.logical_id, begin.attempt_id,
                               *(c[0] for c in begin.candidates)}:
            with self.write() as conn:
                now = self.now()
                end = _attempts.end_in_steps if steps else _attempts.end
                return end(conn, spec.end, now), _attempts.begin(conn, begin, now)
        with self._write_lease() as conn:
            crossed = _attempts.boundary(conn, spec, self.now())
            self._after_autocommit(conn)
            return crossed

    def _write_lease(self) -> AbstractContextManager[driver.Conn]:
        """This thread's lease on a connection for a write of its own (``pool``)."""
        if self._read_only:
            raise StorageError("the ledger was opened read-only", reason=r.READ_ONLY_LEDGER)
        return self._pool.lease()

    def _after_autocommit(self, conn: driver.Conn) -> None:
        # The server answered: as after a write's BEGIN, an owner whose lock connection broke
        # takes its locks back.
        if not conn.in_transaction:
            owners.keep_locks(self._target, self.busy_timeout_ms)

    # ----------------------------------------------------------------- owners and reports
    @property
    def owners(self) -> AdvisoryLocks:
        """Owner liveness through session-level advisory locks."""
        return AdvisoryLocks(self)

    def own_token(self) -> str:
        """This process's owner token, its session-level advisory lock held (taken on first
        use, taken again on the same token after the lock connection broke)."""
        if self._read_only:
            raise StorageError("the ledger was opened read-only", reason=r.READ_ONLY_LEDGER)
        return owners.own_token(self._target, self.busy_timeout_ms)

    def held_token(self) -> str | None:
        """This process's owner token while its lock connection is usable."""
        return owners.held_token(self._target)

    def supervise(self) -> str:
        """Lend this process's owner token to the children it forks (see ``owners``)."""
        if self._read_only:
            raise StorageError("the ledger was opened read-only", reason=r.READ_ONLY_LEDGER)
        return owners.supervise(self._target, self.busy_timeout_ms)

    def probe_owner(self, token: str) -> Liveness:
        """Whether the owner of ``token`` is alive (its advisory lock held), dead, or unknown
        (lock free within ``owner_reconnect_seconds`` of a server restart; see ``owners``)."""
        with self._pool.lease() as conn:
            return owners.probe(conn, self._target, token)

    @property
    def health(self) -> SchemaHealth:
        """Doctor's report and the storage facts of the ledger's schema."""
        return SchemaHealth(self)

    def storage_info(self) -> dict[str, Any]:
        """The storage in force, without host, database, user or password."""
        return {
            "backend": "postgresql",
            "schema_version": self.schema_version,
            "read_only": self._read_only,
            "busy_timeout_ms": self.busy_timeout_ms,
            "write_isolation": "read committed, row locks",
            "read_isolation": "repeatable read, read only",
            "owner_liveness": "advisory_lock",
            "owner_reconnect_seconds": self._target.owner_reconnect_seconds,
            "client_keepalive_defaults": {
                k: v for k, v in CLIENT_DEFAULTS.items() if k != "connect_timeout"
            },
            "server_keepalive": dict(SERVER_KEEPALIVE),
        }


def open_database(
    url: object,
    *,
    clock: Callable[[], float],
    busy_timeout_ms: int,
    read_only: bool,
    check_schema: bool = True,
    create: bool = True,
    snapshot_max_bytes: object = 1 << 30,
    allow_external_acl: bool = False,
    transient_sidecars: bool = True,
    verify_integrity: bool = False,
    connections: int | None = None,
) -> PostgresDatabase:
    """The database object for ``url`` (what ``Ledger(url)`` uses); nothing is opened yet.
    ``create=False``: a schema that holds no ledger is ``database_missing``, never created.
    ``snapshot_max_bytes`` is checked as for a SQLite ledger and unused here, like the other
    options only a SQLite file has. ``connections``: the statement connections a process
    keeps when the URL sets none (``pool``)."""
    check_snapshot_limit(snapshot_max_bytes)
    if not callable(clock):
        raise InvalidInput("clock must be callable")
    return PostgresDatabase(
        str(url), clock=clock, busy_timeout_ms=busy_timeout_ms, read_only=read_only,
        check_schema=check_schema, create=create, connections=connections,
    )


__all__ = ["PostgresDatabase", "SchemaHealth", "open_database"]
