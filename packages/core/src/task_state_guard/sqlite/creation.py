"""Creating a new SQLite ledger file: whole or not at all.

A ledger is built under a hidden temporary name in the database's (judged, private) directory,
its schema committed in WAL mode and its connection closed (SQLite removes the temporary's WAL
and SHM), then published at the database's path with ``link()``, which never replaces anything.
So a file at the path is either absent or a complete ledger made by this release; an existing
file is never taken over, whatever it holds (empty, an SQLite file without tables, another
program's data): the open judges what is there and refuses anything but a ledger. Processes
that create the same ledger at once each build one; the first link wins, the others open it.
A process killed while it builds leaves its hidden temporary behind; the next creation of the
same ledger removes those older than ten minutes.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import sqlite3
import time

from .. import reasons as r
from ..model import StorageError
from . import connections, schema, storage

_TEMPORARY_SUFFIX = ".tsg-new"
#: A temporary this much older than now was left by a process that died while it built it (a
#: build takes milliseconds): the next creation of the same ledger removes it.
STALE_TEMPORARY_SECONDS = 600.0


def _temporary_name(path: str) -> str:
    directory, name = os.path.split(path)
    return os.path.join(directory, f".{name}.{secrets.token_hex(8)}{_TEMPORARY_SUFFIX}")


def _remove(path: str) -> None:
    for suffix in ("", *storage.SIDECAR_SUFFIXES):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path + suffix)


def _remove_stale_temporaries(path: str) -> int:
    """Remove what a creation of ``path`` that died midway left behind: its hidden temporaries
    (and their sidecars) older than :data:`STALE_TEMPORARY_SECONDS`. Returns how many."""
    directory, name = os.path.split(path)
    pattern = re.compile(
        re.escape(f".{name}.")
        + r"[0-9a-f]{16}"
        + re.escape(_TEMPORARY_SUFFIX)
        + r"(-wal|-shm|-journal)?"
    )
    cutoff = time.time() - STALE_TEMPORARY_SECONDS
    removed = 0
    try:
        entries = list(os.scandir(directory or "."))
    except OSError:
        return 0
    for entry in entries:
        if not pattern.fullmatch(entry.name):
            continue
        with contextlib.suppress(OSError):
            if (
                entry.is_file(follow_symlinks=False)
                and entry.stat(follow_symlinks=False).st_mtime < cutoff
            ):
                os.unlink(entry.path)
                removed += 1
    return removed


def _build(temporary: str, busy_timeout_ms: int) -> None:
    """Write the current schema into the new private file ``temporary`` and close it."""
    storage.create_database_file(temporary)
    conn = connections.connect_writable(temporary, busy_timeout_ms)
    try:
        connections.ensure_wal(conn, busy_timeout_ms / 1000.0)
        try:
            conn.execute("BEGIN IMMEDIATE")
            schema.create(conn)
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            raise connections.translate(exc) from None
    finally:
        conn.close()


def create_ledger_file(path: str, busy_timeout_ms: int) -> None:
    """Publish a new empty ledger at ``path`` unless something is there already (the caller
    then judges what it finds, as for any existing file)."""
    _remove_stale_temporaries(path)
    temporary = _temporary_name(path)
    try:
        _build(temporary, busy_timeout_ms)
        try:
            os.link(temporary, path)
        except FileExistsError:
            pass  # created meanwhile (by another process, or not a ledger): judged by the caller
        except OSError as exc:
            raise StorageError(
                "cannot create the database file", reason=r.DATABASE_NOT_CREATABLE
            ) from exc
    finally:
        _remove(temporary)


__all__ = ["create_ledger_file"]
