"""Path and permission safety for the database file and its SQLite sidecars.

POSIX hosts: the database's directory is reached from the root one directory at a time through
directory descriptors (``openat`` with ``O_NOFOLLOW``; ``O_PATH`` where the platform has it),
symbolic links resolved by the walk itself, so that every directory whose entries are looked
up is judged, whatever the path and its links say: owned by this user or root and not writable
by others unless sticky (or, a group-shared volume, setgid and not world-writable). The
directory the walk ends in (after every link) must be owned by this user and writable by nobody
else; missing directories are created 0700 inside judged ones. SQLite then opens the database at
that resolved real path, every directory of which was judged, so no other user can redirect it.
The database and sidecars must be regular, single-link, non-symlink files of this user; their
modes are tightened to 0600 only once the file is known to be a ledger (or was just created): an
unknown file is refused as it is. Other hosts need the caller's explicit acknowledgement of an
externally managed ACL.

A location that breaks this policy raises :class:`UnsafeLocation` (an ``InvalidInput``, as in
0.1.0); one that cannot be used (missing access, not a directory, cannot create) or a database
or sidecar that is a link alias raises :class:`StorageError` (a ``StateConflict``, as in 0.1.0).
"""

from __future__ import annotations

import collections
import errno
import os
import stat
import time
from typing import NamedTuple

from .. import reasons as r
from ..model import InvalidInput, StorageError, UnsafeLocation
from . import links as links_rule

SIDECAR_SUFFIXES = ("-wal", "-shm", "-journal")
_REMOTE_FS = frozenset(
    {
        "nfs", "nfs4", "cifs", "smb", "smb2", "smb3", "smbfs", "ncpfs", "afs", "9p",
        "fuse.sshfs", "sshfs", "davfs", "fuse.davfs2", "glusterfs", "fuse.glusterfs",
        "ceph", "fuse.ceph", "lustre", "gpfs", "fuse.s3fs", "fuse.gcsfuse", "fuse.rclone",
    }
)
POSIX = os.name == "posix"
# Directories are opened to be looked into, never read: O_PATH needs only search permission.
_DIRECTORY_FLAGS = (
    os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)
    | getattr(os, "O_PATH", 0)
)
_MAX_LINKS = 40  # as the kernel's own limit on links followed in one lookup
# How long a database file with a second hard link is awaited (a new ledger being published).
_PUBLISH_SECONDS = 0.5

#: How a file check treats a mode readable or writable by others.
REFUSE, ALLOW, TIGHTEN = "refuse", "allow", "tighten"


class FileIdentity(NamedTuple):
    """Device and inode of the opened database file."""

    dev: int
    ino: int


class Prepared(NamedTuple):
    """A checked database location."""

    #: The database's real path (every symbolic link on the way resolved): what SQLite opens.
    path: str
    #: The existing database file's identity, or None when it does not exist yet.
    identity: FileIdentity | None


def normalize_path(path: object) -> str:
    """Return an absolute, normalized database path or raise InvalidInput."""
    if isinstance(path, os.PathLike):
        path = os.fspath(path)
    if not isinstance(path, str) or not path or "\x00" in path:
        raise InvalidInput(
            "database path must be a non-empty string", reason=r.INVALID_DATABASE_PATH
        )
    if path.startswith("file:") or path == ":memory:":
        raise InvalidInput(
            "database path must be a filesystem path", reason=r.INVALID_DATABASE_PATH
        )
    if path.startswith("\\\\"):
        raise UnsafeLocation("network paths are not supported", reason=r.NETWORK_FILESYSTEM)
    return os.path.abspath(path)


def _safe_ancestor_mode(mode: int) -> bool:
    """Whether an ancestor's mode keeps other users from swapping the path below it.

    Not writable by group or others; or sticky (``/tmp``: others cannot rename or remove our
    entries); or a group-shared volume: setgid and group-writable but not world-writable, the
    shape Kubernetes gives an ``fsGroup`` volume. Members of that group can rename our private
    leaf directory but never read or write inside it, and every open checks the leaf's owner
    and mode and the file's identity again (see docs/architecture.md).
    """
    if mode & stat.S_ISVTX or not mode & (stat.S_IWGRP | stat.S_IWOTH):
        return True
    return bool(mode & stat.S_ISGID) and not mode & stat.S_IWOTH


def _judge_ancestor(st: os.stat_result) -> None:
    """A directory the walk looks into must be safe against other users."""
    if not _safe_ancestor_mode(st.st_mode):
        raise UnsafeLocation(
            "a database ancestor directory is writable by other users",
            reason=r.ANCESTOR_WRITABLE_BY_OTHERS,
        )
    if st.st_uid not in (0, os.geteuid()):
        raise UnsafeLocation(
            "a database ancestor directory is owned by another user",
            reason=r.ANCESTOR_OWNED_BY_OTHER_USER,
        )


def _judge_leaf(st: os.stat_result) -> None:
    """The database's own directory: this user's, writable by nobody else."""
    if st.st_uid != os.geteuid():
        raise UnsafeLocation(
            "database directory is owned by another user", reason=r.DIRECTORY_OWNED_BY_OTHER_USER
        )
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        # Also a group-shared (setgid) volume: the database belongs in a private subdirectory.
        raise UnsafeLocation(
            "database directory is writable by other users",
            reason=r.DIRECTORY_WRITABLE_BY_OTHERS,
        )


def _not_accessible(last: bool) -> StorageError:
    if last:
        return StorageError(
            "database directory is not accessible", reason=r.DIRECTORY_NOT_ACCESSIBLE
        )
    return StorageError(
        "database ancestor directory is not accessible", reason=r.ANCESTOR_NOT_ACCESSIBLE
    )


def _not_a_directory(last: bool) -> StorageError:
    if last:
        return StorageError(
            "database directory is not a directory", reason=r.DIRECTORY_NOT_A_DIRECTORY
        )
    return StorageError("database ancestor is not a directory", reason=r.ANCESTOR_NOT_A_DIRECTORY)


def _make_directory(parent: int, name: str) -> None:
    """Create ``name`` 0700 inside the (judged) directory ``parent``."""
    try:
        os.mkdir(name, 0o700, dir_fd=parent)
    except FileExistsError:
        return  # made meanwhile by another process: judged like any other
    except OSError as exc:
        raise StorageError(
            "cannot create the database directory", reason=r.DIRECTORY_NOT_CREATABLE
        ) from exc
    try:  # the umask may have taken bits away
        os.chmod(name, 0o700, dir_fd=parent, follow_symlinks=False)
    except (OSError, NotImplementedError) as exc:
        raise StorageError(
            "cannot create the database directory", reason=r.DIRECTORY_NOT_CREATABLE
        ) from exc


def _look(parent: int, name: str, last: bool, *, create: bool) -> os.stat_result:
    """``lstat`` of ``name`` in ``parent``; a missing one is created first when ``create``
    (``FileNotFoundError`` otherwise). What is there afterwards is what gets judged."""
    for attempt in range(2):
        try:
            return os.stat(name, dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            if not create or attempt:
                raise
        except OSError as exc:
            if exc.errno == errno.ENOTDIR:
                raise _not_a_directory(False) from exc
            raise _not_accessible(last) from exc
        _make_directory(parent, name)
    raise AssertionError("unreachable")  # pragma: no cover


def _walk(directory: str, *, create: bool) -> tuple[int, str]:
    """Open ``directory`` from the root, one component at a time, judging each directory before
    looking into it; symbolic links are read and followed by the walk itself (never by a lookup
    that skips the judging). Missing directories are created 0700 when ``create``.

    Returns a descriptor of the directory reached (the caller closes it) and its real path.
    """
    pending = collections.deque(directory.split("/"))
    fd = os.open("/", _DIRECTORY_FLAGS)
    real: list[str] = []
    links = 0
    try:
        while pending:
            name = pending.popleft()
            if name in ("", "."):
                continue
            last = not any(part not in ("", ".") for part in pending)
            try:
                parent_st = os.fstat(fd)
            except OSError as exc:
                raise _not_accessible(False) from exc
            _judge_ancestor(parent_st)  # about to look up an entry in it
            if name == "..":
                parent = os.open("..", _DIRECTORY_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = parent
                del real[-1:]
                continue
            try:
                st = _look(fd, name, last, create=create)
            except FileNotFoundError:
                raise InvalidInput(
                    "database directory does not exist", reason=r.DIRECTORY_MISSING
                ) from None
            if stat.S_ISLNK(st.st_mode):
                links_rule.judge_link(parent_st, st)
                links += 1
                if links > _MAX_LINKS:
                    raise _not_accessible(last)
                try:
                    target = os.readlink(name, dir_fd=fd)
                except OSError as exc:
                    raise _not_accessible(last) from exc
                if target.startswith("/"):
                    os.close(fd)
                    fd = os.open("/", _DIRECTORY_FLAGS)
                    real = []
                pending.extendleft(reversed(target.split("/")))
                continue
            if not stat.S_ISDIR(st.st_mode):
                raise _not_a_directory(last)
            try:
                child = os.open(name, _DIRECTORY_FLAGS | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as exc:  # replaced by a link or a file since the look: refused
                raise _not_accessible(last) from exc
            os.close(fd)
            fd = child
            real.append(name)
        return fd, "/" + "/".join(real)
    except BaseException:
        os.close(fd)
        raise


def open_directory(directory: str, *, create: bool) -> str:
    """Check the database's directory (see the module docstring) and return its real path."""
    fd, real = _walk(directory, create=create)
    try:
        _judge_leaf(os.fstat(fd))
    finally:
        os.close(fd)
    return real


def _settled_lstat(path: str) -> os.stat_result:
    """``lstat``; a regular file with a second hard link is looked at again for a moment: a
    process publishing a new ledger (:mod:`.creation`) links it in, then removes its
    temporary name. A link that stays is refused by the caller."""
    st = os.lstat(path)
    pause = 0.001
    deadline = time.monotonic() + _PUBLISH_SECONDS
    while stat.S_ISREG(st.st_mode) and st.st_nlink > 1 and time.monotonic() < deadline:
        time.sleep(pause)
        pause = min(pause * 2, 0.05)
        st = os.lstat(path)
    return st


def check_regular_file(path: str, *, what: str, loose: str) -> os.stat_result | None:
    """Validate an existing database or sidecar file; return its stat or None if absent.

    ``loose``: what a mode readable or writable by others gets: ``REFUSE`` (read-only opens),
    ``ALLOW`` (a file not known to be a ledger yet: judged, never changed) or ``TIGHTEN``
    (chmod 0600: the file is a ledger, or was just created).
    """
    try:
        st = _settled_lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StorageError(f"{what} is not accessible", reason=r.FILE_NOT_ACCESSIBLE) from exc
    if stat.S_ISLNK(st.st_mode):
        raise StorageError(f"{what} is a symbolic link", reason=r.FILE_IS_SYMLINK)
    if not stat.S_ISREG(st.st_mode):
        raise StorageError(f"{what} is not a regular file", reason=r.FILE_NOT_REGULAR)
    if st.st_nlink == 0:
        return None  # unlinked while we looked (a closing writer removing its sidecar)
    if st.st_nlink != 1:
        raise StorageError(f"{what} has more than one hard link", reason=r.FILE_HARD_LINKED)
    if POSIX:
        if st.st_uid != os.geteuid():
            raise UnsafeLocation(
                f"{what} is owned by another user", reason=r.FILE_OWNED_BY_OTHER_USER
            )
        if st.st_mode & 0o077:
            if loose == REFUSE:
                raise UnsafeLocation(
                    f"{what} is readable or writable by other users", reason=r.FILE_NOT_PRIVATE
                )
            if loose == TIGHTEN:
                try:
                    os.chmod(path, 0o600, follow_symlinks=False)
                except FileNotFoundError:
                    return None  # a sidecar its last writer removed meanwhile
                except (OSError, NotImplementedError) as exc:
                    raise StorageError(
                        f"cannot tighten the mode of the {what}", reason=r.FILE_MODE_NOT_FIXABLE
                    ) from exc
    return st


def check_sidecars(db_path: str, *, loose: str) -> dict[str, bool]:
    """Validate existing -wal, -shm and -journal files; report which exist."""
    present = {}
    for suffix in SIDECAR_SUFFIXES:
        st = check_regular_file(db_path + suffix, what="database sidecar", loose=loose)
        present[suffix] = st is not None
    return present


def tighten(path: str) -> None:
    """Tighten the database and its sidecars to 0600 (call only once it is known to be ours)."""
    if POSIX:
        check_regular_file(path, what="database file", loose=TIGHTEN)
        check_sidecars(path, loose=TIGHTEN)


def _may_write(path: str) -> bool:
    """Whether this process may write ``path`` (permission bits, ACLs and capabilities).

    The kernel's own check, so it also sees a capability root lacks. Real and effective ids
    normally agree; only a set-id process needs the effective-id variant (emulated by some C
    libraries), so the exact real-id check is used whenever it answers the same question.
    """
    if not POSIX:
        return True  # an externally managed ACL decides; SQLite reports a refusal itself
    same_ids = os.getuid() == os.geteuid() and os.getgid() == os.getegid()
    if same_ids or os.access not in os.supports_effective_ids:
        return os.access(path, os.W_OK)
    return os.access(path, os.W_OK, effective_ids=True)


def check_writable(path: str) -> None:
    """Refuse to open ``path`` for writing unless this process may write what SQLite needs.

    Whether SQLite itself refuses a database file that became read-only depends on its
    version and on whether it reuses a descriptor this process already holds for the file,
    so the ledger decides: the database file and the existing WAL sidecars must be writable,
    and the directory too when a sidecar still has to be created. Checked once per open.
    """
    if not _may_write(path):
        raise StorageError("the database file is not writable", reason=r.DATABASE_NOT_WRITABLE)
    missing = False
    for suffix in ("-wal", "-shm"):
        writable = _sidecar_writable(path + suffix)
        if writable is False:
            raise StorageError("a database sidecar is not writable", reason=r.SIDECAR_NOT_WRITABLE)
        missing = missing or writable is None
    if missing and not _may_write(os.path.dirname(path)):
        raise StorageError(
            "the database directory is not writable", reason=r.DIRECTORY_NOT_WRITABLE
        )


def _sidecar_writable(path: str) -> bool | None:
    """True if writable, None if absent, False if present and not writable.

    Other processes create and remove sidecars concurrently (the last writer to close removes
    them), so a failed check counts only when the file is still there and still refused.
    """
    for _ in range(3):
        if _may_write(path):
            return True
        if not os.path.lexists(path):
            return None
    return False


def _filesystem_type(path: str) -> str | None:
    """Return the filesystem type of the mount holding ``path`` (Linux only)."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as handle:
            lines = handle.readlines()
    except OSError:
        return None
    best, best_type = "", None
    for line in lines:
        left, _, right = line.partition(" - ")
        fields = left.split()
        rest = right.split()
        if len(fields) < 5 or not rest:
            continue
        mount_point = fields[4].replace("\\040", " ")
        if (path == mount_point or path.startswith(mount_point.rstrip("/") + "/")) and len(
            mount_point
        ) >= len(best):
            best, best_type = mount_point, rest[0]
    return best_type


def check_local_filesystem(directory: str) -> None:
    """Reject databases on filesystems known to be remote."""
    fs_type = _filesystem_type(os.path.realpath(directory))
    if fs_type is not None and fs_type.lower() in _REMOTE_FS:
        raise UnsafeLocation(
            "the database must be on a local filesystem", reason=r.NETWORK_FILESYSTEM
        )


def prepare(
    path: str, *, create: bool, allow_external_acl: bool, read_only: bool
) -> Prepared:
    """Check (and, for writers with ``create``, create the directories of) the database's
    location; nothing existing is changed (modes are tightened later, by :func:`tighten`).

    Returns the real path SQLite is to open and the existing file's identity (None when it
    does not exist yet: a writer with ``create`` makes it, anyone else gets
    ``database_missing``).
    """
    directory, name = os.path.split(path)
    if not POSIX:
        if not allow_external_acl:
            raise UnsafeLocation(
                "non-POSIX hosts require allow_external_acl=True", reason=r.EXTERNAL_ACL_REQUIRED
            )
        if not os.path.isdir(directory):
            raise InvalidInput("database directory does not exist", reason=r.DIRECTORY_MISSING)
    else:
        directory = open_directory(directory, create=create and not read_only)
        check_local_filesystem(directory)
        path = os.path.join(directory, name)
    loose = REFUSE if read_only else ALLOW
    st = check_regular_file(path, what="database file", loose=loose)
    check_sidecars(path, loose=loose)
    if st is None:
        if read_only or not create:
            raise InvalidInput("database does not exist", reason=r.DATABASE_MISSING)
        return Prepared(path, None)
    if not read_only:
        check_writable(path)
    return Prepared(path, FileIdentity(st.st_dev, st.st_ino))


def created_identity(path: str) -> FileIdentity:
    """The identity of the file now at ``path`` (just published, or another's meanwhile),
    judged like any existing database file."""
    st = check_regular_file(path, what="database file", loose=ALLOW)
    if st is None:
        raise StorageError(
            "the database file appeared and vanished while it was created",
            reason=r.DATABASE_REPLACED,
        )
    if POSIX:
        check_writable(path)
    return FileIdentity(st.st_dev, st.st_ino)


def create_database_file(path: str) -> FileIdentity:
    """Create an empty private database file without following links."""
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    flags |= getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags, 0o600)
    except FileExistsError:  # created meanwhile by another process: judge what is there now
        st = check_regular_file(path, what="database file", loose=ALLOW)
        if st is None:
            raise StorageError(
                "the database file appeared and vanished while it was created",
                reason=r.DATABASE_REPLACED,
            ) from None
        return FileIdentity(st.st_dev, st.st_ino)
    except OSError as exc:
        raise StorageError(
            "cannot create the database file", reason=r.DATABASE_NOT_CREATABLE
        ) from exc
    try:
        st = os.fstat(fd)
        if POSIX:
            os.fchmod(fd, 0o600)
    finally:
        os.close(fd)
    return FileIdentity(st.st_dev, st.st_ino)


def current_identity(path: str) -> FileIdentity | None:
    """Return the identity of the file now at ``path`` (None when missing)."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return FileIdentity(st.st_dev, st.st_ino)


def tighten_sidecars(path: str) -> None:
    """Tighten sidecars SQLite may have created since the last check (the file is ours)."""
    if POSIX:
        check_sidecars(path, loose=TIGHTEN)


def storage_info(path: str, *, allow_external_acl: bool, read_only: bool) -> dict[str, object]:
    """Describe the active permission model (no paths)."""
    return {
        "permission_model": "posix_mode" if POSIX else "external_acl",
        "external_acl_acknowledged": bool(allow_external_acl) and not POSIX,
        "database_mode": oct(os.stat(path).st_mode & 0o777) if POSIX else None,
        "read_only": read_only,
        "local_filesystem_required": True,
    }


def sidecars_creatable(path: str) -> bool:
    """Whether a read of the closed ledger at ``path`` may open it in place with transient
    sidecars: the file and its directory are writable by this process (not on a read-only
    filesystem, not a read-only file), so SQLite can create the WAL and SHM and remove them
    again on close. Otherwise the ledger is read in place creating nothing."""
    return _may_write(path) and _may_write(os.path.dirname(path))
