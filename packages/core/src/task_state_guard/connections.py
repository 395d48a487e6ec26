"""SQLite connection handling: pragmas, read-only opens and error translation."""

from __future__ import annotations

import os
import sqlite3
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from enum import StrEnum

from . import reasons as r
from .model import InvalidInput, LedgerBusy, LedgerError, StorageError

_HEADER = b"SQLite format 3\x00"
CACHE_KIB = 32768  # page cache per connection, used lazily
# One bulk write (reconcile apply, a prune batch) dirties pages all over the ledger; a page
# cache this large keeps SQLite from spilling them into the WAL one page at a time mid-way.
BULK_CACHE_KIB = 131072
AUTOCHECKPOINT_PAGES = 4000
# ... and a bulk run of many transactions checkpoints less often, so a page rewritten by
# several of them is copied into the database once.
BULK_AUTOCHECKPOINT_PAGES = 16000


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


def _busy(exc: sqlite3.Error) -> bool:
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
            if not _busy(exc) or time.monotonic() >= deadline:
                raise translate(exc) from None
        time.sleep(pause)
        pause = min(pause * 2, 0.05)
    if str(mode).lower() != "wal":
        raise StorageError(
            "the database could not be switched to WAL mode", reason=r.WAL_MODE_UNAVAILABLE
        )


def _read_header(path: str) -> bytes:
    """The first 100 bytes of the file, read with a descriptor of our own.

    Closing any descriptor of a file drops every POSIX lock this process holds on it, SQLite's
    included, so this is only done when no connection of this process can have the ledger
    open: for a closed ledger (no sidecars) about to be read in place.
    """
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise StorageError(
            "the database file cannot be read", reason=r.FILE_NOT_ACCESSIBLE
        ) from exc
    try:
        return os.read(fd, 100)
    finally:
        os.close(fd)


class ReadMode(StrEnum):
    """How a read-only connection reads the ledger."""

    #: SQLite's read-only WAL access to a live ledger (WAL and SHM present): creates nothing.
    LIVE = "live"
    #: A cleanly closed ledger opened in place in WAL mode: SQLite creates private (0600) WAL
    #: and SHM files for the connection and, as the last connection, removes them on close.
    TRANSIENT = "transient"
    #: A cleanly closed ledger read in place without any sidecar (SQLite's immutable mode);
    #: every read transaction is verified against a change of the file (:class:`StableFile`).
    IN_PLACE = "in_place"


# A closed ledger read in place is only trusted when its last change is older than this: a
# later change then moves its mtime or ctime even on filesystems with coarse (tick-sized)
# timestamps, so the check after a read cannot miss it.
_SETTLE_NS = 50_000_000


def _file_state(path: str) -> tuple[int, int, int, int, int]:
    try:
        st = os.lstat(path)
    except OSError as exc:
        raise StorageError(
            "the database file cannot be read", reason=r.FILE_NOT_ACCESSIBLE
        ) from exc
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _sidecar_present(path: str) -> bool:
    return any(os.path.lexists(path + suffix) for suffix in ("-wal", "-shm", "-journal"))


class StableFile:
    """The state of a cleanly closed ledger that a read in place relies on.

    SQLite's immutable mode takes no lock and reads the file as it is, so a writer could change
    it meanwhile: every read transaction starts only while no sidecar exists and the file is as
    it was captured, and its result counts only if the file is still unchanged at its end (a
    change there fails the read closed; nothing it read leaves the ledger).
    """

    def __init__(self, path: str) -> None:
        self.path = path
        state = _file_state(path)
        if time.time_ns() - max(state[3], state[4]) < _SETTLE_NS:
            raise _WriterOpening("the database changed a moment ago")
        if _sidecar_present(path):
            raise _WriterOpening("a writer appeared while the ledger was opened")
        self._state = state

    def check_start(self) -> None:
        """Refuse to start a read once a writer opened the ledger or the file changed."""
        if _sidecar_present(self.path) or _file_state(self.path) != self._state:
            raise StorageError(
                "a writer opened the ledger since it was opened read-only",
                reason=r.DATABASE_CHANGING,
            )

    def check_end(self) -> None:
        """Fail the read closed if the file changed while it was read."""
        if _file_state(self.path) != self._state:
            raise StorageError(
                "the database changed while it was read", reason=r.DATABASE_CHANGING
            )


def _check_header(header: bytes) -> None:
    if len(header) < 100 or header[:16] != _HEADER:
        raise StorageError("the database file is not a valid ledger", reason=r.NOT_A_LEDGER)
    if header[18] != 2 or header[19] != 2:
        raise StorageError(
            "read-only access needs a ledger in WAL mode", reason=r.WAL_MODE_REQUIRED
        )


def connect_read_only(
    path: str, busy_timeout_ms: int, *, transient: bool, attach: bool = False
) -> tuple[sqlite3.Connection, ReadMode, StableFile | None]:
    """Open an existing WAL ledger without migrating or tightening anything.

    Returns the connection, how it reads (:class:`ReadMode`) and, for a read in place, the
    file state each read transaction is verified against. A live ledger (WAL and SHM
    present) is read through SQLite's read-only WAL access. A cleanly closed one is opened in
    place with transient sidecars when ``transient`` is true (the caller checked that they can
    be created), else read in place creating nothing. ``attach``: a transient connection of the
    caller is open, so the sidecars present are (or include) its own: open another transient
    connection, so that the last of them to close removes them. Memory stays bounded by SQLite's
    page cache whatever the size of the ledger.

    A writer that opens (or closes) the ledger meanwhile creates (or removes) the WAL and SHM
    files and can change the file: such a moment is retried until the busy timeout, after
    which the open fails closed (a crash leftover such as a lone WAL stays refused).
    """
    deadline = time.monotonic() + busy_timeout_ms / 1000.0
    pause = 0.005
    while True:
        try:
            return _connect_read_only(path, busy_timeout_ms, transient, attach)
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
    path: str, busy_timeout_ms: int, transient: bool, attach: bool
) -> tuple[sqlite3.Connection, ReadMode, StableFile | None]:
    present = {s: os.path.lexists(path + s) for s in ("-wal", "-shm", "-journal")}
    if present["-journal"]:
        raise StorageError(
            "a rollback journal is present", reason=r.ROLLBACK_JOURNAL_PRESENT
        )
    if present["-wal"] != present["-shm"]:
        raise _WriterOpening("an incomplete WAL/SHM pair is present", reason=r.WAL_INCOMPLETE)
    stable: StableFile | None = None
    quoted = "file:" + urllib.parse.quote(path)
    if attach or (transient and not present["-wal"]):
        mode = ReadMode.TRANSIENT
        conn = _connect(path, busy_timeout_ms, uri=False)
    elif present["-wal"]:
        mode = ReadMode.LIVE
        conn = _connect(quoted + "?mode=ro&readonly_shm=1", busy_timeout_ms, uri=True)
    else:
        mode = ReadMode.IN_PLACE
        _check_header(_read_header(path))
        stable = StableFile(path)
        conn = _connect(quoted + "?mode=ro&immutable=1", busy_timeout_ms, uri=True)
    try:
        # Before anything is read: the transient connection could write, this keeps it from
        # ever doing so (compatibility views are TEMP and lift it only while they are made).
        conn.execute("PRAGMA query_only=1")
        conn.execute("PRAGMA foreign_keys=ON")  # reported by storage_info; nothing is written
        # The first read: from here on this connection's shared lock keeps a live ledger's
        # WAL in place (the last writer to close would otherwise remove it under us).
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        if stable is not None:
            stable.check_end()
        elif str(conn.execute("PRAGMA journal_mode").fetchone()[0]).lower() != "wal":
            # judged by SQLite, which read the header: no descriptor of ours touches the file
            raise StorageError(
            "read-only access needs a ledger in WAL mode", reason=r.WAL_MODE_REQUIRED
        )
    except sqlite3.Error as exc:
        conn.close()
        if mode is not ReadMode.IN_PLACE and _writer_moment(exc):
            # The WAL or SHM came or went between the look and the read (a writer opened or
            # closed), or the SHM is not initialised yet: a read-only reader cannot help it.
            raise _WriterOpening("a writer opened or closed the ledger meanwhile") from None
        raise translate(exc) from None
    except BaseException:
        conn.close()
        raise
    return conn, mode, stable


def check_snapshot_limit(value: object) -> int:
    """Validate the snapshot size limit (bytes)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 4096:
        raise InvalidInput("snapshot_max_bytes must be an integer of at least 4096")
    return value

