"""SQLite connection handling: pragmas, read-only opens and error translation."""

from __future__ import annotations

import hashlib
import os
import sqlite3
import stat
import threading
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from enum import StrEnum

from .. import reasons as r
from ..model import LedgerBusy, LedgerError, StorageError
from ..store.waiting import WouldWait

_HEADER = b"SQLite format 3\x00"
CACHE_KIB = 32768  # page cache per connection, used lazily
# One bulk write (reconcile apply, a prune batch) dirties pages all over the ledger; a page
# cache this large keeps SQLite from spilling them into the WAL one page at a time mid-way.
BULK_CACHE_KIB = 131072
AUTOCHECKPOINT_PAGES = 4000
# ... and a bulk run of many transactions checkpoints less often, so a page rewritten by
# several of them is copied into the database once.
BULK_AUTOCHECKPOINT_PAGES = 16000
#: A :class:`NowWriter` has the WAL checkpointed after this many of its transactions (a
#: three-node LangGraph request's two writes add ~20 pages: about the automatic checkpoint's
#: interval of :data:`AUTOCHECKPOINT_PAGES`).
NOW_CHECKPOINT_TRANSACTIONS = 400


def translate(exc: BaseException) -> LedgerError:
    """Map a sqlite3 or OS error to a LedgerError subclass (message never echoes values)."""
    if isinstance(exc, LedgerError):
        return exc
    text = str(exc).lower()
    if "locked" in text or "busy" in text:
        return LedgerBusy(
            "the database stayed locked past the busy timeout", reason=r.DATABASE_BUSY
        )
    if "readonly" in text or "read-only" in text or "read only" in text:
        return StorageError("the database is not writable", reason=r.DATABASE_NOT_WRITABLE)
    if "full" in text:
        return StorageError("the disk is full", reason=r.DISK_FULL)
    if "not a database" in text or "malformed" in text or "corrupt" in text:
        return StorageError("the database file is not a valid ledger", reason=r.NOT_A_LEDGER)
    if isinstance(exc, sqlite3.IntegrityError):
        return StorageError("the database rejected the write", reason=r.WRITE_REJECTED)
    return StorageError("the database could not be used", reason=r.DATABASE_UNUSABLE)


def connect_writable(path: str, busy_timeout_ms: int) -> sqlite3.Connection:
    """Open a read-write connection with the ledger's pragmas."""
    try:
        conn = sqlite3.connect(
            path,
            timeout=busy_timeout_ms / 1000.0,
            isolation_level=None,
            check_same_thread=False,
            cached_statements=128,
        )
        conn.execute("PRAGMA foreign_keys=ON")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute(f"PRAGMA cache_size=-{CACHE_KIB}")
        # Checkpoint (and fsync) every ~16 MiB of WAL rather than 4 MiB: a transition dirties
        # 2-4 pages, so the default would fsync about every 300 commits.
        conn.execute(f"PRAGMA wal_autocheckpoint={AUTOCHECKPOINT_PAGES}")
        return conn
    except sqlite3.Error as exc:
        raise translate(exc) from None


class NowWriter:
    """The connection of a process's write transactions begun without waiting
    (``store.waiting``), used only under the process's writer lock.

    ``BEGIN IMMEDIATE`` with no busy wait: the database's write lock held by another process
    is :class:`WouldWait` at once, nothing begun. Its commits never checkpoint the WAL (that
    copies pages into the database and syncs files, on a thread that must not wait): every
    :data:`NOW_CHECKPOINT_TRANSACTIONS` of its transactions, a short-lived thread runs a
    passive checkpoint on it under the writer lock (the process's other connections still
    checkpoint at their own commits)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        try:
            conn.execute("PRAGMA busy_timeout=0")
            conn.execute("PRAGMA wal_autocheckpoint=0")
        except sqlite3.Error as exc:
            raise translate(exc) from None
        self.conn = conn
        self._transactions = 0
        self._checkpointing = False

    def begin(self) -> None:
        """``BEGIN IMMEDIATE`` now, or :class:`WouldWait` (nothing begun)."""
        try:
            self.conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            if is_busy(exc):
                raise WouldWait() from None
            raise translate(exc) from None

    @contextmanager
    def savepoint(self) -> Iterator[None]:
        """A savepoint in the open transaction, rolled back to when the block raises."""
        conn = self.conn
        try:
            conn.execute("SAVEPOINT tsg_nested")
        except sqlite3.Error as exc:
            raise translate(exc) from None
        try:
            yield
        except BaseException:
            with suppress(sqlite3.Error):
                conn.execute("ROLLBACK TO tsg_nested")
                conn.execute("RELEASE tsg_nested")
            raise
        try:
            conn.execute("RELEASE tsg_nested")
        except sqlite3.Error as exc:
            raise translate(exc) from None

    def ended(self, lock: threading.RLock, busy_timeout_ms: int) -> None:
        """A transaction ended (``lock``, the writer lock, still held by the caller): every
        :data:`NOW_CHECKPOINT_TRANSACTIONS`, a checkpoint on a thread of its own."""
        self._transactions += 1
        if self._transactions < NOW_CHECKPOINT_TRANSACTIONS or self._checkpointing:
            return
        self._transactions = 0
        self._checkpointing = True
        threading.Thread(target=self._checkpoint, args=(lock, busy_timeout_ms / 1000.0),
                         name="tsg-checkpoint", daemon=True).start()

    def _checkpoint(self, lock: threading.RLock, timeout: float) -> None:
        try:
            if lock.acquire(timeout=timeout):
                try:
                    with suppress(sqlite3.Error):  # closed meanwhile: the next one
                        self.conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
                finally:
                    lock.release()
        finally:
            self._checkpointing = False


@contextmanager
def bulk_cache(conn: sqlite3.Connection) -> Iterator[None]:
    """Give ``conn`` the bulk page cache and checkpoint interval for the block, then restore."""
    try:
        conn.execute(f"PRAGMA cache_size=-{BULK_CACHE_KIB}")
        conn.execute(f"PRAGMA wal_autocheckpoint={BULK_AUTOCHECKPOINT_PAGES}")
    except sqlite3.Error as exc:
        raise translate(exc) from None
    try:
        yield
    finally:
        with suppress(sqlite3.Error):
            conn.execute(f"PRAGMA wal_autocheckpoint={AUTOCHECKPOINT_PAGES}")
            conn.execute(f"PRAGMA cache_size=-{CACHE_KIB}")
            conn.execute("PRAGMA shrink_memory")


class _WriterOpening(Exception):
    """A writer is opening or closing the ledger right now: look again in a moment.

    ``reason`` is what the open reports when the moment outlasts the busy timeout.
    """

    def __init__(self, message: str, reason: str = r.DATABASE_CHANGING) -> None:
        super().__init__(message)
        self.reason = reason


def is_busy(exc: sqlite3.Error) -> bool:
    """Whether ``exc`` is SQLite's lock wait running out (not a fault of the file)."""
    text = str(exc).lower()
    return "locked" in text or "busy" in text


def _writer_moment(exc: sqlite3.Error) -> bool:
    """Errors a read-only view of a live ledger meets while a writer opens or closes it."""
    text = str(exc).lower()
    return any(word in text for word in ("unable to open", "readonly", "locked", "busy"))


def begin_read(conn: sqlite3.Connection, busy_timeout_ms: int, live_read_only: bool) -> None:
    """Start a read transaction and fix its snapshot with a first read.

    A read-only view of a live ledger cannot initialise or recover the wal-index itself, so
    while a writer opens or closes the ledger its first read can fail: retried until the busy
    timeout.
    """
    deadline = time.monotonic() + busy_timeout_ms / 1000.0
    pause = 0.002
    while True:
        try:
            conn.execute("BEGIN")
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
            return
        except sqlite3.Error as exc:
            with suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            if not (live_read_only and _writer_moment(exc)) or time.monotonic() >= deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 0.05)


def ensure_wal(conn: sqlite3.Connection, timeout: float) -> None:
    """Switch the database to WAL mode (a no-op when it already is).

    Processes that open a new ledger at the same moment race for the switch, and SQLite
    refuses the loser at once (its busy handler is not called there): retry until ``timeout``.
    """
    deadline = time.monotonic() + timeout
    pause = 0.002
    while True:
        try:
            mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
            if str(mode).lower() != "wal":
                mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            break
        except sqlite3.Error as exc:
            if not is_busy(exc) or time.monotonic() >= deadline:
                raise translate(exc) from None
        time.sleep(pause)
        pause = min(pause * 2, 0.05)
    if str(mode).lower() != "wal":
        raise StorageError(
            "the database could not be switched to WAL mode", reason=r.WAL_MODE_UNAVAILABLE
        )


class ReadMode(StrEnum):
    """How a read-only connection reads the ledger."""

    #: SQLite's read-only WAL access to a live ledger (WAL and SHM present): creates nothing.
    LIVE = "live"
    #: A cleanly closed ledger opened in place in WAL mode: SQLite creates private (0600) WAL
    #: and SHM files for the connection and, as the last connection, removes them on close.
    TRANSIENT = "transient"
    #: A cleanly closed ledger read twice, verified and loaded as a private in-memory copy:
    #: creates nothing, and SQLite never opens the file itself.
    SNAPSHOT = "snapshot"


_CHUNK = 1 << 20


def _capture(path: str, max_bytes: int) -> tuple[os.stat_result, str, bytearray]:
    """Read the file once: its stat, SHA-256 and bytes (refused above ``max_bytes``).

    Closing a descriptor of a file drops every POSIX lock this process holds on it, SQLite's
    included: this is only done for a closed ledger (no sidecars), which no connection of this
    process can have open.
    """
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags)
    try:
        before = os.fstat(fd)
        if not stat.S_ISREG(before.st_mode):
            raise StorageError("the database is not a regular file", reason=r.FILE_NOT_REGULAR)
        if before.st_size > max_bytes:
            raise StorageError(
                "the closed database is larger than the snapshot limit",
                reason=r.SNAPSHOT_TOO_LARGE,
            )
        digest = hashlib.sha256()
        buffer = bytearray(before.st_size)
        view = memoryview(buffer)
        offset = 0
        while offset < before.st_size:
            got = os.readv(fd, [view[offset : offset + _CHUNK]])
            if got == 0:
                break
            digest.update(view[offset : offset + got])
            offset += got
        view.release()
        if offset != before.st_size or os.read(fd, 1):
            _wipe(buffer)
            raise _WriterOpening("the database changed while it was read")
        after = os.fstat(fd)
    finally:
        os.close(fd)
    if _identity(before) != _identity(after):
        _wipe(buffer)
        raise _WriterOpening("the database changed while it was read")
    return after, digest.hexdigest(), buffer


def _identity(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _wipe(buffer: bytearray) -> None:
    zeros = bytes(min(len(buffer), _CHUNK))
    for start in range(0, len(buffer), _CHUNK):
        end = min(start + _CHUNK, len(buffer))
        buffer[start:end] = zeros[: end - start]


def _check_header(header: bytes) -> None:
    if len(header) < 100 or header[:16] != _HEADER:
        raise StorageError("the database file is not a valid ledger", reason=r.NOT_A_LEDGER)
    if header[18] != 2 or header[19] != 2:
        raise StorageError(
            "read-only access needs a ledger in WAL mode", reason=r.WAL_MODE_REQUIRED
        )


def _snapshot(path: str, max_bytes: int) -> sqlite3.Connection:
    """Load a verified private in-memory copy of a cleanly closed WAL ledger.

    The file is read twice; both reads must match in identity, size, times and SHA-256, with
    no sidecar appearing meanwhile (a writer or checkpoint), before the second copy is loaded.
    Our buffers are wiped; SQLite owns the loaded copy and frees it when the connection closes.
    """
    if not hasattr(sqlite3.Connection, "deserialize"):
        raise StorageError(
            "in-memory snapshots are unavailable on this Python", reason=r.SNAPSHOT_UNAVAILABLE
        )
    try:
        first_stat, first_hash, first = _capture(path, max_bytes)
        _wipe(first)
        del first
        second_stat, second_hash, data = _capture(path, max_bytes)
    except OSError as exc:
        raise StorageError(
            "the database file cannot be read", reason=r.FILE_NOT_ACCESSIBLE
        ) from exc
    try:
        if first_hash != second_hash or _identity(first_stat) != _identity(second_stat):
            raise _WriterOpening("the database changed between the two snapshot reads")
        if any(os.path.lexists(path + s) for s in ("-wal", "-shm", "-journal")):
            raise _WriterOpening("a writer appeared while the snapshot was taken")
        _check_header(bytes(data[:100]))
        data[18] = 1  # WAL read/write versions -> rollback journal, for the private copy only
        data[19] = 1
        conn = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
        try:
            conn.deserialize(data)
        except sqlite3.Error as exc:
            conn.close()
            raise translate(exc) from None
        return conn
    finally:
        _wipe(data)


def connect_read_only(
    path: str,
    busy_timeout_ms: int,
    snapshot_max_bytes: int,
    *,
    transient: bool,
    attach: bool = False,
) -> tuple[sqlite3.Connection, ReadMode]:
    """Open an existing WAL ledger without migrating or tightening anything.

    Returns the connection and how it reads (:class:`ReadMode`). A live ledger (WAL and SHM
    present) is read through SQLite's read-only WAL access. A cleanly closed one is opened in
    place with transient sidecars when ``transient`` is true (the caller checked that they can
    be created), else loaded as a verified private in-memory snapshot of at most
    ``snapshot_max_bytes`` (creating nothing). ``attach``: a transient connection of the caller
    is open, so the sidecars present are (or include) its own: open another transient
    connection, so that the last of them to close removes them.

    A writer that opens (or closes) the ledger meanwhile creates (or removes) the WAL and SHM
    files and can change the file: such a moment is retried until the busy timeout, after
    which the open fails closed (a crash leftover such as a lone WAL stays refused).
    """
    deadline = time.monotonic() + busy_timeout_ms / 1000.0
    pause = 0.005
    while True:
        try:
            return _connect_read_only(path, busy_timeout_ms, snapshot_max_bytes, transient, attach)
        except _WriterOpening as exc:
            if time.monotonic() >= deadline:
                raise StorageError(str(exc), reason=exc.reason) from None
        time.sleep(pause)
        pause = min(pause * 2, 0.1)


def _connect(target: str, busy_timeout_ms: int, *, uri: bool) -> sqlite3.Connection:
    try:
        return sqlite3.connect(
            target,
            uri=uri,
            timeout=busy_timeout_ms / 1000.0,
            isolation_level=None,
            check_same_thread=False,
        )
    except sqlite3.Error as exc:
        raise translate(exc) from None


def _connect_read_only(
    path: str, busy_timeout_ms: int, snapshot_max_bytes: int, transient: bool, attach: bool
) -> tuple[sqlite3.Connection, ReadMode]:
    present = {s: os.path.lexists(path + s) for s in ("-wal", "-shm", "-journal")}
    if present["-journal"]:
        raise StorageError(
            "a rollback journal is present", reason=r.ROLLBACK_JOURNAL_PRESENT
        )
    if present["-wal"] != present["-shm"]:
        raise _WriterOpening("an incomplete WAL/SHM pair is present", reason=r.WAL_INCOMPLETE)
    if attach or (transient and not present["-wal"]):
        mode = ReadMode.TRANSIENT
        conn = _connect(path, busy_timeout_ms, uri=False)
    elif present["-wal"]:
        mode = ReadMode.LIVE
        quoted = "file:" + urllib.parse.quote(path)
        conn = _connect(quoted + "?mode=ro&readonly_shm=1", busy_timeout_ms, uri=True)
    else:
        mode = ReadMode.SNAPSHOT
        conn = _snapshot(path, snapshot_max_bytes)
    try:
        # Before anything is read: the transient connection could write, this keeps it from
        # ever doing so (compatibility views are TEMP and lift it only while they are made).
        conn.execute("PRAGMA query_only=1")
        conn.execute("PRAGMA foreign_keys=ON")  # reported by storage_info; nothing is written
        # The first read: from here on this connection's shared lock keeps a live ledger's
        # WAL in place (the last writer to close would otherwise remove it under us).
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        if mode is not ReadMode.SNAPSHOT and (
            str(conn.execute("PRAGMA journal_mode").fetchone()[0]).lower() != "wal"
        ):
            # judged by SQLite, which read the header: no descriptor of ours touches the file
            raise StorageError(
                "read-only access needs a ledger in WAL mode", reason=r.WAL_MODE_REQUIRED
            )
    except sqlite3.Error as exc:
        conn.close()
        if mode is not ReadMode.SNAPSHOT and _writer_moment(exc):
            # The WAL or SHM came or went between the look and the read (a writer opened or
            # closed), or the SHM is not initialised yet: a read-only reader cannot help it.
            raise _WriterOpening("a writer opened or closed the ledger meanwhile") from None
        raise translate(exc) from None
    except BaseException:
        conn.close()
        raise
    return conn, mode


