"""Owner liveness: one exclusively locked file per owning process.

A process that starts a task first creates ``<db>-owners/<token>.lock`` (under a temporary name,
locked with ``flock(LOCK_EX)``, then renamed) and keeps it locked for its whole lifetime. The
task row stores only the random token. Anyone can later ask whether that owner is alive: if a
shared lock on its file can be taken, the holder is gone (the kernel drops ``flock`` locks when a
process dies, whatever its pid namespace or container), so its running tasks are provably lost.
A missing file proves nothing; liveness is then unknown and the grace rules apply.

Assumes a local filesystem shared by every process that uses the ledger (the same requirement
SQLite's own locking has). Children created by ``fork()`` close the inherited descriptor at once
so that a parent's lock never outlives the parent, and get their own token when they start work.
"""

from __future__ import annotations

import contextlib
import enum
import fcntl
import os
import stat
import threading
import time
import uuid
from collections.abc import Callable

from . import reasons as r
from .model import StorageError, UnsafeLocation

LOCK_SUFFIX = ".lock"
_TMP_SUFFIX = ".tmp"
# A temporary lock file is only ever unlocked for the instant between its creation and its
# flock(); cleanup leaves it alone until it is this old, so a starting owner never loses it.
_TMP_MIN_AGE_SECONDS = 300.0


class Liveness(enum.Enum):
    """What a probe of an owner token proves."""

    ALIVE = "alive"
    DEAD = "dead"
    UNKNOWN = "unknown"


def owners_dir(db_path: str) -> str:
    """Directory that holds the owner lock files of the database at ``db_path``."""
    return db_path + "-owners"


class _Registry:
    """This process's owner tokens, one per owners directory."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pid = os.getpid()
        self.held: dict[str, tuple[str, int]] = {}  # directory -> (token, fd)

    def reset_after_fork(self) -> None:
        for _token, fd in self.held.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self.held = {}
        self.pid = os.getpid()
        self.lock = threading.Lock()


_REGISTRY = _Registry()
os.register_at_fork(after_in_child=_REGISTRY.reset_after_fork)


def _ensure_directory(directory: str) -> None:
    try:
        os.mkdir(directory, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise StorageError(
            "cannot create the owner lock directory", reason=r.OWNER_LOCK_UNAVAILABLE
        ) from exc
    st = os.lstat(directory)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise UnsafeLocation(
            "the owner lock directory is unsafe", reason=r.OWNER_LOCK_DIRECTORY_UNSAFE
        )


def held_token(db_path: str) -> str | None:
    """This process's owner token for the database if its lock file exists already, else None."""
    entry = _REGISTRY.held.get(owners_dir(db_path))
    if entry is not None and _REGISTRY.pid == os.getpid():
        return entry[0]
    return None


def own_token(db_path: str) -> str:
    """Return this process's owner token for the database, creating its lock file once."""
    directory = owners_dir(db_path)
    entry = _REGISTRY.held.get(directory)
    if entry is not None and _REGISTRY.pid == os.getpid():
        return entry[0]
    with _REGISTRY.lock:
        if _REGISTRY.pid != os.getpid():  # fork without the at-fork hook (should not happen)
            _REGISTRY.held = {}
            _REGISTRY.pid = os.getpid()
        entry = _REGISTRY.held.get(directory)
        if entry is not None:
            return entry[0]
        _ensure_directory(directory)
        token = uuid.uuid4().hex
        tmp = os.path.join(directory, token + _TMP_SUFFIX)
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(tmp, flags, 0o600)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.rename(tmp, os.path.join(directory, token + LOCK_SUFFIX))
        except OSError as exc:
            raise StorageError(
                "cannot create the owner lock file", reason=r.OWNER_LOCK_UNAVAILABLE
            ) from exc
        _REGISTRY.held[directory] = (token, fd)
        return token


def probe(db_path: str, token: str) -> Liveness:
    """Tell whether the process holding ``token`` is alive, dead, or unknown."""
    if len(token) != 32 or not all(c in "0123456789abcdef" for c in token):
        return Liveness.UNKNOWN
    directory = owners_dir(db_path)
    entry = _REGISTRY.held.get(directory)
    if entry is not None and entry[0] == token and _REGISTRY.pid == os.getpid():
        return Liveness.ALIVE
    return _probe_file(os.path.join(directory, token + LOCK_SUFFIX))


def _probe_file(path: str) -> Liveness:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return Liveness.UNKNOWN
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
    """Delete lock files of dead owners that no running task references; return the count."""
    directory = owners_dir(db_path)
    try:
        names = os.listdir(directory)
    except OSError:
        return 0
    removed = 0
    for name in names:
        token, dot, suffix = name.partition(".")
        if not dot or "." + suffix not in (LOCK_SUFFIX, _TMP_SUFFIX):
            continue
        path = os.path.join(directory, name)
        if "." + suffix == _TMP_SUFFIX:
            try:
                if time.time() - os.lstat(path).st_mtime < _TMP_MIN_AGE_SECONDS:
                    continue
            except OSError:
                continue
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
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
                os.unlink(path)
                removed += 1
            except OSError:
                pass
        finally:
            os.close(fd)
    return removed
