"""The kernel's ``protected_symlinks`` rule, applied by the ledger itself whatever the sysctl
says: a symbolic link in a sticky world-writable directory (``/tmp``) is followed only when it
belongs to this user or to the directory's owner. Anyone may plant a link there, naming any
path: followed by root, it would point a ledger command at another service's files.

The database's path is walked by :mod:`.storage` (which calls :func:`judge_link` for each link
it meets); the metrics textfile's directory is resolved by :func:`resolve_protected`.
"""

from __future__ import annotations

import collections
import os
import stat

from .. import reasons as r
from ..model import UnsafeLocation

_MAX_LINKS = 40  # as the kernel's own limit on links followed in one lookup


def judge_link(directory: os.stat_result, link: os.stat_result) -> None:
    """The kernel's ``protected_symlinks`` rule, applied whatever the sysctl says: a link in a
    sticky world-writable directory (``/tmp``) is followed only when its owner is this user or
    the directory's owner; anyone may plant a link there, naming any path."""
    if os.name != "posix":
        return
    sticky_shared = directory.st_mode & stat.S_ISVTX and directory.st_mode & stat.S_IWOTH
    if sticky_shared and link.st_uid not in (directory.st_uid, os.geteuid()):
        raise UnsafeLocation(
            "a symbolic link in a shared sticky directory belongs to another user",
            reason=r.SYMLINK_IN_STICKY_DIRECTORY,
        )


def resolve_protected(path: str) -> str:
    """``path`` with every symbolic link on the way resolved, each judged by
    :func:`judge_link` (for paths outside the ledger's own checks: the metrics textfile).
    Missing or unreadable components are left to the caller's own opening."""
    pending = collections.deque(os.path.abspath(path).split("/"))
    real = "/"
    links = 0
    while pending:
        name = pending.popleft()
        if name in ("", "."):
            continue
        if name == "..":
            real = os.path.dirname(real)
            continue
        here = os.path.join(real, name)
        try:
            st = os.lstat(here)
        except OSError:
            return os.path.join(here, *[part for part in pending if part])
        if not stat.S_ISLNK(st.st_mode):
            real = here
            continue
        links += 1
        try:
            judge_link(os.stat(real), st)
            target = os.readlink(here)
        except OSError:
            target = None
        if target is None or links > _MAX_LINKS:
            return os.path.join(here, *[part for part in pending if part])
        if target.startswith("/"):
            real = "/"
        pending.extendleft(reversed(target.split("/")))
    return real


__all__ = ["judge_link", "resolve_protected"]
