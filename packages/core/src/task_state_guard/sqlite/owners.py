"""Owner liveness: one exclusively locked file per owning process.

A process that starts a task first creates ``<db>-owners/<token>.lock`` (under a temporary name,
locked with ``flock(LOCK_EX)``, then renamed) and keeps it locked for its whole lifetime. The
task row stores only the random token. Anyone can later ask whether that owner is alive: if a
shared lock on its file can be taken, the holder is gone (the kernel drops ``flock`` locks when a
process dies, whatever its pid namespace or container), so its running tasks are provably lost.
A missing file proves nothing; liveness is then unknown and the grace rules apply.

The directory is opened without following a link (``O_NOFOLLOW``) and must be this user's, not
writable by others; its files are reached through that descriptor only. A symbolic link there
is refused by a start (``owner_lock_directory_unsafe``) and ignored by reconcile and status:
nothing behind it proves an owner dead, and nothing behind it is ever deleted.

Assumes a local filesystem shared by every process that uses the ledger (the same requirement
SQLite's own locking has). Children created by ``fork()`` close the inherited descriptor at once
so that a parent's lock never outlives the parent, and get their own token when they start work,
unless the parent supervises them (:func:`supervise`): a pool's main process that reports every
end of its children's work, a lost child's included. Such a child records its parent's token, so
its work is provably lost only when the supervisor is gone, never in the moment between the
child's death and the supervisor's report of it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import threading
import time
import uuid
from collections.abc import Callable

from .. import reasons as r
from ..model import Liveness, StorageError, UnsafeLocation
from ..process import THIS

LOCK_SUFFIX = ".lock"
_TMP_SUFFIX = ".tmp"
# A temporary lock file is only ever unlocked for the instant between its creation and its
# flock(); cleanup leaves it alone until it is this old, so a starting owner never loses it.
_TMP_MIN_AGE_SECONDS = 300.0


def owners_dir(db_path: str) -> str:
    """Directory that holds the owner lock files of the database at ``db_path``."""
    return db_path + "-owners"


class _Registry:
    """This process's owner tokens, one per owners directory."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pid = os.getpid()
        self.held: dict[str, tuple[str, int]] = {}  # directory -> (token, fd)
        #: Directories whose token this process lends to the children it forks.
        self.supervising: set[str] = set()
        #: directory -> the supervising parent's token, recorded instead of a token of our own.
        self.delegated: dict[str, str] = {}

    def reset_after_fork(self) -> None:
        self.delegated = {
            directory: token for directory, (token, _fd) in self.held.items()
            if directory in self.supervising
        }
        for _token, fd in self.held.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self.held = {}
        self.supervising = set()
        self.pid = os.getpid()
        self.lock = threading.Lock()


_REGISTRY = _Registry()
os.register_at_fork(after_in_child=_REGISTRY.reset_after_fork)


_DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class _Unsafe(Exception):
    """The owner lock directory is a symbolic link or not this user's private directory."""


def _open_directory(directory: str, *, create: bool) -> int | None:
    """A descriptor of the owner lock directory, opened without following a link (None when it
    does not exist and ``create`` is false); every file in it is then reached through this
    descriptor, so a link swapped in later is never followed either. Raises :class:`_Unsafe`
    for a link, or a directory that is not this user's private one."""
    if create:
        try:
            os.mkdir(directory, 0o700)
        except FileExistsError:
            pass
        except OSError as exc:
            raise StorageError(
                "cannot create the owner lock directory", reason=r.OWNER_LOCK_UNAVAILABLE
            ) from exc
    try:
        fd = os.open(directory, _DIRECTORY_FLAGS)
    except FileNotFoundError:
        if create:
            raise StorageError(
                "the owner lock directory vanished", reason=r.OWNER_LOCK_UNAVAILABLE
            ) from None
        return None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise _Unsafe() from None
        raise StorageError(
            "cannot open the owner lock directory", reason=r.OWNER_LOCK_UNAVAILABLE
        ) from exc
    st = os.fstat(fd)
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        os.close(fd)
        raise _Unsafe()
    return fd


def _unsafe() -> UnsafeLocation:
    return UnsafeLocation(
        "the owner lock directory is unsafe", reason=r.OWNER_LOCK_DIRECTORY_UNSAFE
    )


def held_token(db_path: str) -> str | None:
    """This process's owner token for the database if its lock file exists already (or the
    supervising parent's, see :func:`supervise`), else None."""
    if _REGISTRY.pid != THIS.pid:
        return None
    directory = owners_dir(db_path)
    entry = _REGISTRY.held.get(directory)
    if entry is not None:
        return entry[0]
    return _REGISTRY.delegated.get(directory)


def supervise(db_path: str) -> str:
    """Make this process the owner of the work its children forked from now on start: its
    token (made now if needed) is what such a child records as owner. For a process that
    reports every end of its children's work, a lost child's included; idempotent."""
    token = own_token(db_path)
    with _REGISTRY.lock:
        _REGISTRY.supervising.add(owners_dir(db_path))
    return token


def own_token(db_path: str) -> str:
    """Return this process's owner token for the database, creating its lock file once (a
    child of a supervising parent returns the parent's token: see :func:`supervise`)."""
    directory = owners_dir(db_path)
    if _REGISTRY.pid == THIS.pid:
        entry = _REGISTRY.held.get(directory)
        if entry is not None:
            return entry[0]
        delegated = _REGISTRY.delegated.get(directory)
        if delegated is not None:
            return delegated
    with _REGISTRY.lock:
        if _REGISTRY.pid != os.getpid():  # fork without the at-fork hook (should not happen)
            _REGISTRY.held = {}
            _REGISTRY.supervising = set()
            _REGISTRY.delegated = {}
            _REGISTRY.pid = os.getpid()
        entry = _REGISTRY.held.get(directory)
        if entry is not None:
            return entry[0]
        try:
            dir_fd = _open_directory(directory, create=True)
        except _Unsafe:
            raise _unsafe() from None
        assert dir_fd is not None
        token = uuid.uuid4().hex
        tmp, final = token + _TMP_SUFFIX, token + LOCK_SUFFIX
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(tmp, flags, 0o600, dir_fd=dir_fd)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.rename(tmp, final, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except OSError as exc:
            raise StorageError(
                "cannot create the owner lock file", reason=r.OWNER_LOCK_UNAVAILABLE
            ) from exc
        finally:
            os.close(dir_fd)
        _REGISTRY.held[directory] = (token, fd)
        return token


def probe(db_path: str, token: str) -> Liveness:
    """Tell whether the process holding ``token`` is alive, dead, or unknown (a lock file
    behind a symbolic link, or in a directory that is not ours, proves nothing)."""
    if len(token) != 32 or not all(c in "0123456789abcdef" for c in token):
        return Liveness.UNKNOWN
    directory = owners_dir(db_path)
    entry = _REGISTRY.held.get(directory)
    if entry is not None and entry[0] == token and _REGISTRY.pid == os.getpid():
        return Liveness.ALIVE
    try:
        dir_fd = _open_directory(directory, create=False)
    except (_Unsafe, StorageError):
        return Liveness.UNKNOWN
    if dir_fd is None:
        return Liveness.UNKNOWN
    try:
        return _probe_file(dir_fd, token + LOCK_SUFFIX)
    finally:
        os.close(dir_fd)


def _probe_file(dir_fd: int, name: str) -> Liveness:
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return Liveness.UNKNOWN
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return Liveness.ALIVE
        except OSError:
            return Liveness.UNKNOWN
        return Liveness.DEAD
    finally:
        os.close(fd)


def remove_dead(db_path: str, is_referenced: Callable[[str], bool]) -> int:
    """Delete lock files of dead owners that no running task references; return the count.

    Only in this user's private ``<db>-owners`` directory itself: a symbolic link there (or
    one swapped in meanwhile) is never followed, so nothing elsewhere is ever deleted.
    """
    try:
        dir_fd = _open_directory(owners_dir(db_path), create=False)
    except (_Unsafe, StorageError):
        return 0
    if dir_fd is None:
        return 0
    try:
        return _remove_dead_in(dir_fd, is_referenced)
    finally:
        os.close(dir_fd)


def _remove_dead_in(dir_fd: int, is_referenced: Callable[[str], bool]) -> int:
    try:
        names = os.listdir(dir_fd)
    except OSError:
        return 0
    removed = 0
    for name in names:
        token, dot, suffix = name.partition(".")
        if not dot or "." + suffix not in (LOCK_SUFFIX, _TMP_SUFFIX):
            continue
        if "." + suffix == _TMP_SUFFIX:
            try:
                age = time.time() - os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mtime
            except OSError:
                continue
            if age < _TMP_MIN_AGE_SECONDS:
                continue
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
        except OSError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # alive
            if "." + suffix == LOCK_SUFFIX and is_referenced(token):
                continue
            try:
                os.unlink(name, dir_fd=dir_fd)
                removed += 1
            except OSError:
                pass
        finally:
            os.close(fd)
    return removed
