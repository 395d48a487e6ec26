"""The SQLite database object behind ``Ledger(path)``: the core's ``store.Database``.

One connection per thread and per process (never reused after ``fork()``), IMMEDIATE write
transactions that the threads of a process queue for on one writer lock, read transactions
whose snapshot is fixed before the clock is read, busy errors mapped to ``LedgerBusy``, owner
tokens through lock files beside the database, doctor and storage facts.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any, overload

from .. import reasons as r
from ..model import LedgerBusy, Liveness, StorageError, check_snapshot_limit
from ..process import THIS
from ..store import attempts
from ..store.protocol import Layout, Opened, read_clock
from ..store.transitions import Outcome, Step
from ..store.waiting import REQUEST, WouldWait
from . import attempts as sqlite_attempts
from . import connections, creation, doctor, owners, schema, storage
from . import transitions as sqlite_transitions
from .queries import SQLiteQueries

# Connections inherited across fork() are parked here and never touched or closed again.
_INHERITED: list[sqlite3.Connection] = []
# One writer lock per database per process (threads queue here, fairly and without polling).
_WRITER_LOCKS: dict[str, threading.RLock] = {}
_WRITER_LOCKS_GUARD = threading.Lock()


def writer_lock(path: str) -> threading.RLock:
    """Return this process's writer lock for the database at ``path``."""
    lock = _WRITER_LOCKS.get(path)
    if lock is None:
        with _WRITER_LOCKS_GUARD:
            lock = _WRITER_LOCKS.setdefault(path, threading.RLock())
    return lock


def _reset_writer_locks() -> None:
    global _WRITER_LOCKS_GUARD
    _WRITER_LOCKS.clear()
    _WRITER_LOCKS_GUARD = threading.Lock()


os.register_at_fork(after_in_child=_reset_writer_locks)


# The store's guarded job writes by the type of their spec (any other is a one-task step).
_Run = Callable[
    [sqlite3.Connection, Any, float],
    "Outcome | str | attempts.Ended | tuple[attempts.Ended, str | None] | None",
]
_RUNS: dict[type, _Run] = {
    attempts.Begin: sqlite_attempts.sqlite_begin,
    attempts.End: sqlite_attempts.sqlite_end,
    attempts.Boundary: sqlite_attempts.sqlite_boundary,
}


def integrity_ok(conn: sqlite3.Connection) -> bool:
    """SQLite's ``quick_check`` stopped at the first problem: True when the file is intact."""
    try:
        return [row[0] for row in conn.execute("PRAGMA quick_check(1)")] == ["ok"]
    except sqlite3.DatabaseError as exc:
        if isinstance(exc, sqlite3.OperationalError) and connections.is_busy(exc):
            raise
        return False  # damaged beyond what the check itself can read


class _Local(threading.local):
    """A thread's state of one database: its connection and write transaction."""

    #: ``(pid, connection)``: this thread's own connection, opened in process ``pid``.
    entry: tuple[int, sqlite3.Connection] | None = None
    #: ``(pid, writer connection)`` while this thread's write transaction is open.
    writing: tuple[int, sqlite3.Connection] | None = None
    #: True inside :meth:`SQLiteDatabase.group`.
    atomic: bool = False


class LockFiles:
    """A SQLite ledger's owner liveness (``Database.owners``): lock files beside the database
    (``task_state_guard.sqlite.owners``), found through its real path."""

    def __init__(self, db: SQLiteDatabase) -> None:
        self._db = db

    def own(self) -> str:
        """This process's owner token (its lock file beside the database, made once)."""
        return owners.own_token(self._db.path)

    def held(self) -> str | None:
        """This process's owner token if its lock file exists already."""
        return owners.held_token(self._db.path)

    def supervise(self) -> str:
        """This process owns what the children it forks start (``owners.supervise``)."""
        return owners.supervise(self._db.path)

    def probe(self, token: str) -> Liveness:
        """Probe the owner's lock file."""
        return owners.probe(self._db.path, token)

    def cleanup(self, is_referenced: Callable[[str], bool]) -> None:
        """Delete lock files of dead owners that no running task references."""
        owners.remove_dead(self._db.path, is_referenced)


class FileHealth:
    """A SQLite ledger's probes of its file (``Database.health``): doctor's report
    (``task_state_guard.sqlite.doctor``: ``quick_check``, the exact layout, the core's rules in
    SQLite's dialect) and the storage facts (modes, PRAGMAs)."""

    def __init__(self, db: SQLiteDatabase) -> None:
        self._db = db

    def doctor(self) -> dict[str, Any]:
        """The counts-only health report of the SQLite file."""
        return doctor.run_doctor(self._db)

    def storage(self) -> dict[str, Any]:
        """See :meth:`SQLiteDatabase.storage_info`."""
        return self._db.storage_info()


class SQLiteDatabase:
    """The SQLite backend: one connection per thread and per process, never reused after fork."""

    def __init__(
        self,
        path: str,
        *,
        clock: Callable[[], float],
        busy_timeout_ms: int,
        allow_external_acl: bool,
        read_only: bool,
        transient_sidecars: bool,
        snapshot_max_bytes: int,
        check_schema: bool,
        create: bool = True,
        verify_integrity: bool = False,
    ) -> None:
        self._path = path
        # The real path (symbolic links resolved) the first open found: SQLite, the owner lock
        # directory and every later check use it; a later open that resolves elsewhere fails.
        self._real: str | None = None
        self._create = create
        self._verify_integrity = verify_integrity
        self._clock = clock
        self.busy_timeout_ms = busy_timeout_ms
        self.allow_external_acl = allow_external_acl
        self._read_only = read_only
        self._opened = Opened(path, read_only)
        self._transient_sidecars = transient_sidecars
        self._snapshot_max_bytes = snapshot_max_bytes
        self._check_schema = check_schema
        self._local = _Local()
        self._lock = threading.Lock()
        #: The statements other than transitions (a read of one task opens its own read).
        self.queries = SQLiteQueries(self.read)
        self._snapshot_lock = threading.RLock()  # serializes reads of a shared snapshot
        self._pid = THIS.pid
        self._open_conns: list[sqlite3.Connection] = []
        self._identity: storage.FileIdentity | None = None
        # How each read-only connection reads (by id of the connection).
        self._modes: dict[int, connections.ReadMode] = {}
        # A private in-memory snapshot of a closed ledger, shared by every thread.
        self._shared: sqlite3.Connection | None = None
        # The one connection every thread of this process writes through (under the writer
        # lock): its page cache stays warm from one thread's transaction to the next, where a
        # connection per thread would find its cache invalidated by every other thread's commit.
        self._writer: sqlite3.Connection | None = None
        # What a write of this process needs once the writer is open, read without a lookup:
        # (pid, writer connection, writer lock, real path, device, inode of the file).
        self._hot: tuple[int, sqlite3.Connection, threading.RLock, str, int, int] | None = None
        # The connection of write transactions begun without waiting (``store.waiting``): no
        # busy wait, no checkpoint at its commits (:class:`~.connections.NowWriter`).
        self._now: connections.NowWriter | None = None
        self._closed = False
        self.schema_version: int | None = None

    @property
    def path(self) -> str:
        """Absolute path of the database file (its real path, symbolic links resolved)."""
        return self._real if self._real is not None else self._path

    def _pin(self, real: str) -> str:
        """Remember where the first open's path led; a later open must lead there too."""
        if self._real is None:
            self._real = real
            self._opened = Opened(real, self._read_only)
        elif real != self._real:
            raise StorageError(
                "the database path now leads to another file", reason=r.DATABASE_REPLACED
            )
        return real

    @property
    def opened(self) -> Opened:
        """The database file's path (:attr:`path`) and whether it was opened read-only."""
        return self._opened

    @property
    def layout(self) -> Layout:
        """The file's layout (SQLite's layout 5 added the verdict outbox, 9 the thread
        column)."""
        return Layout.of(self.schema_version, schema.SCHEMA_VERSION,
                         schema.STORED_VERSION[schema.V5], schema.STORED_VERSION[schema.V9])

    # ----------------------------------------------------------------- connections
    def conn(self) -> sqlite3.Connection:
        """This thread's connection in this process (opened, checked and migrated lazily);
        inside a write transaction of this thread, the writer connection."""
        pid = THIS.pid
        local = self._local
        writing = local.writing
        if writing is not None and writing[0] == pid:
            return writing[1]
        entry = local.entry
        if entry is not None and entry[0] == pid:
            return entry[1]
        if self._closed:
            raise StorageError("the ledger is closed", reason=r.LEDGER_CLOSED)
        if pid != self._pid:  # a lock held by another thread at fork() time stays held
            self._lock = threading.Lock()
            self._snapshot_lock = threading.RLock()
        with self._lock:
            if pid != self._pid:  # forked: park inherited handles, never close them here
                self._forked(pid)
            if self._shared is not None:
                conn = self._shared
            else:
                conn = self._open()
                self._open_conns.append(conn)
                if self._modes.get(id(conn)) is connections.ReadMode.SNAPSHOT:
                    self._shared = conn
                elif not self._read_only:  # writes go through the writer: this one only reads
                    conn.execute("PRAGMA query_only=1")
        local.entry = (pid, conn)
        return conn

    def _forked(self, pid: int) -> None:
        _INHERITED.extend(self._open_conns)
        self._open_conns, self._shared, self._writer, self._pid = [], None, None, pid
        self._hot = None
        self._now = None
        self._modes = {}

    def writer(self) -> sqlite3.Connection:
        """This process's writer connection (opened lazily; never reused after ``fork()``)."""
        # A thread's first use opens its own connection: the file's safety checks (modes
        # tightened or refused, identity) and fork handling run then, as before any write.
        self.conn()
        pid = THIS.pid
        conn = self._writer
        if conn is not None and pid == self._pid:
            return conn
        with self._lock:
            if pid != self._pid:
                self._forked(pid)
            conn = self._writer
            if conn is None:
                conn = self._open()
                self._open_conns.append(conn)
                self._writer = conn
                identity = self._identity
                if identity is not None and not self._closed:
                    self._hot = (pid, conn, writer_lock(self.path), self.path,
                                 identity.dev, identity.ino)
        return conn

    def _open(self) -> sqlite3.Connection:
        if self._read_only:
            return self._open_read_only()
        prepared = storage.prepare(
            self._path, create=self._create, allow_external_acl=self.allow_external_acl,
            read_only=False,
        )
        path = self._pin(prepared.path)
        identity = prepared.identity
        if identity is None:
            creation.create_ledger_file(path, self.busy_timeout_ms)
            identity = storage.created_identity(path)
        if self._identity is not None:
            if identity != self._identity:
                raise StorageError("the database file was replaced", reason=r.DATABASE_REPLACED)
            storage.tighten(path)  # recognised as a ledger by the first open
        conn = connections.connect_writable(path, self.busy_timeout_ms)
        try:
            if self._identity is None:
                self._initialize(conn, path)
                self._identity = identity
            storage.tighten_sidecars(path)
            if storage.current_identity(path) != identity:
                raise StorageError("the database file was replaced", reason=r.DATABASE_REPLACED)
        except BaseException:
            conn.close()
            raise
        return conn

    def _recognize(self, conn: sqlite3.Connection) -> None:
        """Before anything is written or chmodded: the file must hold a ledger this release
        knows (an existing file is never taken over, even an empty one: a new ledger is only
        ever published whole, :mod:`.creation`), and, when asked (the CLI's writing commands),
        pass SQLite's quick_check."""
        try:  # judge the schema before anything (even the journal mode) is written
            fmt = schema.detect_format(conn)
            if fmt == schema.EMPTY:
                raise StorageError(
                    "the database file exists and is not a ledger", reason=r.NOT_A_LEDGER
                )
            if fmt == schema.NEWER:
                raise StorageError(
                    "the ledger's schema is newer than this release", reason=r.SCHEMA_NEWER
                )
            if fmt is None:
                raise StorageError(
                    "the database holds a foreign or tampered schema", reason=r.FOREIGN_SCHEMA
                )
            if self._verify_integrity and not integrity_ok(conn):
                raise StorageError("the ledger file is damaged", reason=r.DATABASE_DAMAGED)
        except sqlite3.Error as exc:
            raise connections.translate(exc) from None

    def _initialize(self, conn: sqlite3.Connection, path: str) -> None:
        self._recognize(conn)
        storage.tighten(path)  # a ledger (or a new file): only now may its modes change
        connections.ensure_wal(conn, self.busy_timeout_ms / 1000.0)
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:  # judged again under the write lock: another process may have migrated it
                fmt = schema.detect_format(conn)
                if fmt == schema.EMPTY:
                    raise StorageError(
                        "the database file exists and is not a ledger", reason=r.NOT_A_LEDGER
                    )
                elif fmt == schema.NEWER:
                    raise StorageError(
                        "the ledger's schema is newer than this release", reason=r.SCHEMA_NEWER
                    )
                elif fmt is None:
                    raise StorageError(
                        "the database holds a foreign or tampered schema",
                        reason=r.FOREIGN_SCHEMA,
                    )
                elif fmt != schema.CURRENT:
                    fmt = schema.migrate(conn, fmt)  # one transaction: all of it or nothing
                version = schema.STORED_VERSION[fmt]
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        except sqlite3.Error as exc:
            raise connections.translate(exc) from None
        self.schema_version = version

    def _open_read_only(self) -> sqlite3.Connection:
        prepared = storage.prepare(
            self._path, create=False, allow_external_acl=self.allow_external_acl, read_only=True
        )
        path = self._pin(prepared.path)
        identity = prepared.identity
        if self._identity is not None and identity != self._identity:
            raise StorageError("the database file was replaced", reason=r.DATABASE_REPLACED)
        transient = self._transient_sidecars and storage.sidecars_creatable(path)
        attach = any(m is connections.ReadMode.TRANSIENT for m in self._modes.values())
        conn, mode = connections.connect_read_only(
            path,
            self.busy_timeout_ms,
            self._snapshot_max_bytes,
            transient=transient,
            attach=attach,
        )
        version: int | None = None
        try:
            # the file SQLite opened is still the one judged (not swapped for a link meanwhile)
            if storage.current_identity(path) != identity:
                raise StorageError("the database file was replaced", reason=r.DATABASE_REPLACED)
            if mode is connections.ReadMode.TRANSIENT:
                # the sidecars SQLite just made (or a writer's, had one appeared) are private
                storage.check_sidecars(path, loose=storage.REFUSE)
            fmt = schema.detect_format(conn)
            if fmt == schema.NEWER:
                raise StorageError(
                    "the ledger's schema is newer than this release", reason=r.SCHEMA_NEWER
                )
            if fmt in schema.KNOWN:
                version = schema.STORED_VERSION[fmt]
                views = schema.compat_views(fmt)  # temporary: the file is not touched
                if views:
                    conn.execute("PRAGMA query_only=0")
                    for view in views:
                        conn.execute(view)
                    conn.execute("PRAGMA query_only=1")
            elif self._check_schema:
                raise StorageError(
                    "the database holds a foreign or tampered schema", reason=r.FOREIGN_SCHEMA
                )
        except sqlite3.Error as exc:
            conn.close()
            raise connections.translate(exc) from None
        except BaseException:
            conn.close()
            raise
        self.schema_version = version
        self._identity = identity
        self._modes[id(conn)] = mode
        return conn

    def read_mode(self) -> connections.ReadMode | None:
        """How this thread's connection reads the ledger (None for a writable ledger)."""
        return self._modes.get(id(self.conn()))

    def close(self) -> None:
        """Close every connection this process opened; no use afterwards. A write or
        checkpoint that this process runs on the file (another thread's, such as the
        :class:`~.connections.NowWriter`'s checkpoint thread) ends first: closing a connection
        while a statement runs on it can crash the interpreter. The wait is bounded by the busy
        timeout."""
        lock = writer_lock(self.path)
        held = lock.acquire(timeout=self.busy_timeout_ms / 1000.0)
        try:
            with self._lock:
                self._closed = True
                if THIS.pid == self._pid:
                    for conn in self._open_conns:
                        with suppress(sqlite3.Error):
                            conn.close()
                self._open_conns = []
                self._shared = None
                self._modes = {}
                self._writer = None
                self._hot = None
                self._now = None
        finally:
            if held:
                lock.release()
        self._local = _Local()

    def _check_identity(self) -> None:
        if (
            self._identity is not None
            and self._shared is None  # a private snapshot no longer depends on the file
            and storage.current_identity(self.path) != self._identity
        ):
            raise StorageError(
                "the database file was replaced or removed", reason=r.DATABASE_REPLACED
            )

    # ----------------------------------------------------------------- clock
    def now(self) -> float:
        """Read the clock; a non-number, non-finite or negative reading is ``InvalidInput``."""
        return read_clock(self._clock)

    # ----------------------------------------------------------------- transactions
    def _enter(self) -> tuple[sqlite3.Connection, threading.RLock]:
        """Begin this thread's IMMEDIATE transaction on the process's writer connection:
        the file's identity checked first (a replaced or removed file is refused), then the
        process's writer lock taken (bounded by the busy timeout); returns the connection and
        the lock, held. Inside ``store.waiting.no_wait``: :meth:`_enter_now`."""
        if REQUEST.on:
            return self._enter_now()
        pid = THIS.pid
        local = self._local
        hot = self._hot
        entry = local.entry
        if hot is not None and hot[0] == pid and entry is not None and entry[0] == pid:
            conn, lock = hot[1], hot[2]
            try:
                st = os.lstat(hot[3])
            except OSError:
                st = None
            if st is None or st.st_ino != hot[5] or st.st_dev != hot[4]:
                raise StorageError(
                    "the database file was replaced or removed", reason=r.DATABASE_REPLACED
                )
        else:  # a thread's first write, or the first after fork(): every check, the long way
            conn = self.writer()
            self._check_identity()
            lock = writer_lock(self.path)
        if not lock.acquire(timeout=self.busy_timeout_ms / 1000.0):
            raise LedgerBusy(
                "another thread held the ledger past the busy timeout", reason=r.DATABASE_BUSY
            )
        try:
            conn.execute("BEGIN IMMEDIATE")
        except BaseException as exc:
            self._leave(lock)
            if isinstance(exc, sqlite3.Error):
                raise connections.translate(exc) from None
            raise
        local.writing = (pid, conn)
        return conn, lock

    def _enter_now(self) -> tuple[sqlite3.Connection, threading.RLock]:
        """:meth:`_enter` at once or not at all: :class:`WouldWait`, with nothing begun, when
        another thread of this process holds the writer lock or another process the
        database's write lock. The transaction runs on the process's connection for such
        writes (no busy wait, no checkpoint at its commits: :class:`~.connections.NowWriter`)."""
        self.conn()  # a thread's first use: every check of the file, and fork handling
        lock = writer_lock(self.path)
        if not lock.acquire(blocking=False):
            raise WouldWait()
        try:
            now = self._now
            if now is None:
                with self._lock:
                    now = self._now
                    if now is None:
                        conn = self._open()
                        self._open_conns.append(conn)
                        now = self._now = connections.NowWriter(conn)
            self._check_identity()
            now.begin()
        except BaseException:
            lock.release()
            raise
        self._local.writing = (THIS.pid, now.conn)
        return now.conn, lock

    def _leave(self, lock: threading.RLock) -> None:
        """After :meth:`_enter`'s transaction ended (committed or rolled back): this thread
        no longer writes; the writer lock is released."""
        writing, self._local.writing = self._local.writing, None
        now = self._now
        if now is not None and writing is not None and writing[1] is now.conn:
            now.ended(lock, self.busy_timeout_ms)
        lock.release()

    @contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        """One IMMEDIATE transaction; commits on success, rolls back on any error.

        Threads of one process queue on a per-database lock (bounded by the busy timeout)
        instead of polling SQLite's sleeping busy handler; processes contend in SQLite. Inside
        :meth:`group` the enclosing transaction is reused.
        """
        if self._read_only:
            raise StorageError("the ledger was opened read-only", reason=r.READ_ONLY_LEDGER)
        local = self._local
        if local.atomic:
            yield self.conn()
            return
        conn, lock = self._enter()
        try:
            yield conn
            conn.execute("COMMIT")
        except BaseException as exc:
            with suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            if isinstance(exc, sqlite3.Error):
                raise connections.translate(exc) from None
            raise
        finally:
            self._leave(lock)

    @contextmanager
    def group(self) -> Iterator[None]:
        """Group this thread's writes into one transaction: all commit, or none. Nested use
        joins the open group; inside a transaction begun without waiting (:meth:`_enter_now`)
        it is a savepoint, so that a nested block that fails undoes its own writes, as its own
        transaction would have, and the enclosing block may go on."""
        local = self._local
        if local.atomic:
            now, writing = self._now, local.writing
            if now is None or writing is None or writing[1] is not now.conn:
                yield
                return
            with now.savepoint():
                yield
            return
        with self.write():
            self._local.atomic = True
            try:
                yield
            finally:
                self._local.atomic = False

    @contextmanager
    def read(self) -> Iterator[sqlite3.Connection]:
        """One read transaction whose snapshot is fixed before the caller reads the clock, on
        this thread's connection, which never writes (``query_only``: a writable ledger's
        writes go through the writer connection)."""
        conn = self.conn()
        self._check_identity()
        mode = self._modes.get(id(conn))
        shared = conn is self._shared
        if shared:
            self._snapshot_lock.acquire()
        try:
            connections.begin_read(
                conn, self.busy_timeout_ms, mode is connections.ReadMode.LIVE
            )
        except sqlite3.Error as exc:
            if shared:
                self._snapshot_lock.release()
            raise connections.translate(exc) from None
        try:
            yield conn
        except sqlite3.Error as exc:
            raise connections.translate(exc) from None
        finally:
            with suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            if shared:
                self._snapshot_lock.release()

    @contextmanager
    def bulk(self) -> Iterator[None]:
        """A large page cache and rarer checkpoints for this thread's connection meanwhile."""
        if self._read_only:
            raise StorageError("the ledger was opened read-only", reason=r.READ_ONLY_LEDGER)
        with connections.bulk_cache(self.writer()):
            yield

    # ----------------------------------------------------------------- transitions
    @overload
    def transition(self, spec: attempts.Begin) -> str | None: ...

    @overload
    def transition(self, spec: attempts.End) -> attempts.Ended: ...

    @overload
    def transition(self, spec: attempts.Boundary) -> tuple[attempts.Ended, str | None]: ...

    @overload
    def transition(self, spec: Step) -> Outcome: ...

    def transition(
        self, spec: Step | attempts.Begin | attempts.End | attempts.Boundary
    ) -> Outcome | str | attempts.Ended | tuple[attempts.Ended, str | None] | None:
        """One guarded write in an IMMEDIATE transaction (or the open group's): the database's
        write lock is held before the clock is read (SQLite's writes queue on that lock; a
        statement alone would be no shortcut). A one-task step answers with its outcome;
        *begin attempt* runs all of it, or nothing and answers None; *end attempt* answers
        what it wrote."""
        run: _Run = _RUNS.get(type(spec), sqlite_transitions.run)
        if self._read_only:
            raise StorageError("the ledger was opened read-only", reason=r.READ_ONLY_LEDGER)
        local = self._local
        if local.atomic:  # inside the group's transaction (a refused begin is not undone)
            return run(self.conn(), spec, read_clock(self._clock))
        conn, lock = self._enter()
        try:
            done = run(conn, spec, read_clock(self._clock))
            if done is None:  # a refused *begin attempt*: all of it undone
                with suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
                return None
            conn.execute("COMMIT")
            return done
        except BaseException as exc:
            with suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            if isinstance(exc, sqlite3.Error):
                raise connections.translate(exc) from None
            raise
        finally:
            self._leave(lock)

    # ----------------------------------------------------------------- owners and reports
    @property
    def owners(self) -> LockFiles:
        """Owner liveness through lock files beside the database."""
        return LockFiles(self)

    @property
    def health(self) -> FileHealth:
        """Doctor's report and the storage facts of the SQLite file."""
        return FileHealth(self)

    def storage_info(self) -> dict[str, Any]:
        """The permission model (``posix_mode`` or ``external_acl``), SQLite's journal mode,
        foreign keys, busy timeout and schema version (no paths)."""
        info = storage.storage_info(
            self.path, allow_external_acl=self.allow_external_acl, read_only=self._read_only
        )
        conn = self.conn()
        snapshot = self.read_mode() is connections.ReadMode.SNAPSHOT
        try:
            journal = str(conn.execute("PRAGMA journal_mode").fetchone()[0]).lower()
            foreign_keys = bool(conn.execute("PRAGMA foreign_keys").fetchone()[0])
        except sqlite3.Error as exc:
            raise connections.translate(exc) from None
        if snapshot:
            journal = "wal"  # the private copy of a closed WAL ledger; the file itself is WAL
        info["journal_mode"] = journal
        info["foreign_keys"] = foreign_keys
        info["busy_timeout_ms"] = self.busy_timeout_ms
        info["schema_version"] = self.schema_version
        info["read_snapshot"] = snapshot  # a verified private in-memory copy of a closed ledger
        return info


def open_database(
    target: object,
    *,
    clock: Callable[[], float],
    busy_timeout_ms: int,
    allow_external_acl: bool,
    read_only: bool,
    transient_sidecars: bool,
    snapshot_max_bytes: object,
    check_schema: bool,
    create: bool,
    verify_integrity: bool,
    connections: int | None = None,
) -> SQLiteDatabase:
    """The database object of the SQLite ledger at ``target`` (a path; nothing opened yet).
    ``connections`` (a PostgreSQL ledger's) is ignored: a SQLite ledger opens one connection
    per thread."""
    return SQLiteDatabase(
        storage.normalize_path(target),
        clock=clock,
        busy_timeout_ms=busy_timeout_ms,
        allow_external_acl=allow_external_acl,
        read_only=read_only,
        transient_sidecars=transient_sidecars,
        snapshot_max_bytes=check_snapshot_limit(snapshot_max_bytes),
        check_schema=check_schema,
        create=create,
        verify_integrity=verify_integrity,
    )


__all__ = ["FileHealth", "SQLiteDatabase", "integrity_ok", "open_database", "writer_lock"]
