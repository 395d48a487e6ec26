"""What each error reason means and how to fix it (``tsg --format text`` prints them).

One entry per name of :mod:`task_state_guard.reasons`: what failed, and the fix. The README's
"Error reasons" table shows the same two texts (a test keeps them equal).
"""

from __future__ import annotations

from .. import reasons as r

#: reason -> (what failed, the fix)
HELP: dict[str, tuple[str, str]] = {
    r.MISSING_COMMAND: (
        'no command given',
        'add a command (`tsg --help`)',
    ),
    r.UNKNOWN_COMMAND: (
        "the command is not one of `tsg`'s",
        'check its spelling (`tsg --help`)',
    ),
    r.UNKNOWN_OPTION: (
        'an option the command does not take',
        'check `tsg COMMAND --help`; global options (`--db`, `--busy-timeout-ms`, '
        '`--allow-external-acl`) go before the command',
    ),
    r.UNEXPECTED_ARGUMENT: (
        'an extra argument',
        'remove it; quote values with spaces',
    ),
    r.MISSING_ARGUMENT: (
        'a required argument or option is absent (an id, `--status`, `--older-than`, `--details` '
        'with `tasks --attempts` or `--contradicted`)',
        'add it',
    ),
    r.MISSING_VALUE: (
        'an option was given without its value',
        'give the value (`--db PATH`)',
    ),
    r.INVALID_VALUE: (
        "a value did not parse or is out of range (an id, a state, a code's shape, a number, a "
        '`TSG_*` grace)',
        "see the command's reference above",
    ),
    r.MISSING_DATABASE_PATH: (
        'no database path',
        'pass `--db PATH` or set `TSG_DB`',
    ),
    r.USAGE_ERROR: (
        'any other refused command line',
        'check `tsg COMMAND --help`',
    ),
    r.SERVE_TOKEN_REQUIRED: (
        '`tsg serve --no-token` was asked to listen beyond loopback',
        'drop `--no-token` (a token is then made beside the ledger), or listen on `127.0.0.1`',
    ),
    r.SERVE_TOKEN_INVALID: (
        'the token file cannot be read or made, or the token is shorter than 16 characters or '
        'has spaces or non-ASCII characters; or `--no-token` was given with a token',
        'check the file; use a long random token (`openssl rand -hex 32`)',
    ),
    r.ADDRESS_IN_USE: (
        "`tsg serve`'s `--listen` port is already in use on that address",
        'stop what listens there (`ss -ltnp`), or choose another port (`--listen 127.0.0.1:0` '
        'picks a free one)',
    ),
    r.ADDRESS_NOT_AVAILABLE: (
        "`tsg serve`'s `--listen` IP address is not one of this host's",
        'listen on an address of this host (`ip addr`), `127.0.0.1` or `0.0.0.0`',
    ),
    r.LISTEN_NOT_PERMITTED: (
        '`tsg serve` may not listen on that port (below 1024 without the privilege)',
        'use a port from 1024 up, or grant `CAP_NET_BIND_SERVICE`',
    ),
    r.LISTEN_FAILED: (
        '`tsg serve` could not listen on `--listen` for another reason of the system',
        "check the address family (IPv6 enabled?) and the host's socket limits",
    ),
    r.AMBIGUOUS_ID: (
        'the id given to `get` or `children` names more than one task (a ledger id and a '
        "framework's job id, or the job ids of two frameworks)",
        'name the framework: `--celery ID`, `--dramatiq ID` or `--langgraph ID`',
    ),
    r.SERVE_TOKEN_WEAK: (
        'the token has fewer than 6 different characters, or repeats a short pattern',
        'use a long random token (`openssl rand -hex 32`)',
    ),
    r.SERVE_TOKEN_FILE_UNSAFE: (
        'the token file is not a regular file (a FIFO, a device, a directory), is a symbolic '
        'link where none is taken (the file beside the ledger), is owned by another user than '
        'the one serving or root, or is readable by others (a file of your own: by the group '
        'too)',
        '`chmod 600 FILE` as its owner; a root-owned file may be group-readable (a Kubernetes '
        'Secret with `defaultMode: 0440`)',
    ),
    r.INVALID_DATABASE_PATH: (
        'the path is empty, a `file:` URI or `:memory:`; or a `postgresql://` URL that does not '
        'parse, or whose `schema` or `owner_reconnect_seconds` is out of range',
        'give a filesystem path, or fix the URL',
    ),
    r.UNSUPPORTED_URL_SCHEME: (
        'the database is written as a URL (`scheme://...`) of a scheme no backend opens (it is '
        'never taken for a path)',
        'give a filesystem path, or a `postgresql://` URL (`postgres://`, `postgresql+psycopg://` '
        'and `postgresql+psycopg2://` mean the same)',
    ),
    r.NETWORK_FILESYSTEM: (
        'the database is on a network filesystem or UNC path',
        "use a local disk (SQLite's locking needs one)",
    ),
    r.EXTERNAL_ACL_REQUIRED: (
        'non-POSIX host without the ACL acknowledgement',
        "restrict the directory's DACL, then pass `--allow-external-acl` / "
        '`allow_external_acl=True`',
    ),
    r.ANCESTOR_NOT_ACCESSIBLE: (
        'a directory above the database cannot be examined',
        'give this user search (`x`) permission on the path',
    ),
    r.ANCESTOR_NOT_A_DIRECTORY: (
        'a component of the path is not a directory',
        'fix the path',
    ),
    r.ANCESTOR_WRITABLE_BY_OTHERS: (
        'a directory above is writable by other users, neither sticky nor a group-shared volume',
        '`chmod o-w,g-w DIR`, or `chmod +t DIR`; a group-shared volume (setgid, not '
        'world-writable) is accepted',
    ),
    r.ANCESTOR_OWNED_BY_OTHER_USER: (
        'a directory above belongs to another user (not root)',
        'use a path whose directories belong to you or root',
    ),
    r.DIRECTORY_MISSING: (
        "the database's directory does not exist (read commands, `--dry-run`, the commands that "
        'never create a ledger, Windows)',
        'run `tsg init` first (it creates the directory 0700), or fix the path',
    ),
    r.DIRECTORY_NOT_ACCESSIBLE: (
        "the database's directory cannot be examined",
        'give this user access to it',
    ),
    r.DIRECTORY_NOT_A_DIRECTORY: (
        "the database's directory is a file",
        'fix the path',
    ),
    r.DIRECTORY_OWNED_BY_OTHER_USER: (
        "the database's directory belongs to another user (e.g. a root-owned volume)",
        'point `--db` at a subdirectory that does not exist yet (`/data/tsg/tasks.sqlite`): `tsg`'
        " creates it 0700, owned by you; or run as the directory's owner",
    ),
    r.DIRECTORY_WRITABLE_BY_OTHERS: (
        "the database's directory is writable by group or others (also a group-shared volume)",
        'put the database in a subdirectory that does not exist yet: `--db '
        '/data/tsg/tasks.sqlite` (tsg creates `/data/tsg` 0700); or `chmod 700 DIR`. Kubernetes: '
        'set `fsGroupChangePolicy: OnRootMismatch`, or kubelet re-opens the group bits at each '
        'mount',
    ),
    r.DIRECTORY_NOT_CREATABLE: (
        'a missing directory could not be created',
        'give this user write permission on the parent, or create the directory (0700)',
    ),
    r.DIRECTORY_NOT_WRITABLE: (
        'the directory is not writable and a sidecar must be created',
        'give this user write permission on the directory',
    ),
    r.SYMLINK_IN_STICKY_DIRECTORY: (
        'the path (database or `--textfile`) goes through a symbolic link in a sticky '
        'world-writable directory (`/tmp`) that belongs to another user: anyone can plant one',
        'use the real path, or a link of your own; the kernel refuses the same link when '
        '`fs.protected_symlinks` is on',
    ),
    r.DATABASE_MISSING: (
        'the database does not exist (read commands, `--dry-run`, and `start`, `heartbeat`, '
        "`close`, `delivery`, `prune`, which never create one); PostgreSQL: the URL's schema "
        'holds no ledger',
        'run `tsg init` first, or fix the path',
    ),
    r.DATABASE_NOT_CREATABLE: (
        'the database file could not be created',
        "check the directory's permissions and free space",
    ),
    r.DATABASE_NOT_WRITABLE: (
        'the database file is not writable',
        '`chmod 600` it as its owner; check for a read-only mount',
    ),
    r.DATABASE_REPLACED: (
        'the database file was replaced or removed while in use',
        'stop whatever moves or deletes the file; reopen',
    ),
    r.SIDECAR_NOT_WRITABLE: (
        'a `-wal` or `-shm` file is not writable',
        '`chmod 600` it as its owner',
    ),
    r.FILE_IS_SYMLINK: (
        'the database or a sidecar is a symbolic link',
        'point `--db` at the real file',
    ),
    r.FILE_HARD_LINKED: (
        'the database or a sidecar has more than one hard link',
        "remove the other links (copy with SQLite's backup instead)",
    ),
    r.FILE_NOT_REGULAR: (
        'the database or a sidecar is not a regular file',
        'fix the path; remove what is there',
    ),
    r.FILE_OWNED_BY_OTHER_USER: (
        'the database or a sidecar belongs to another user',
        'run as the owner, or `chown` it',
    ),
    r.FILE_NOT_PRIVATE: (
        'a read-only open met a file readable or writable by others',
        'run a writable command once (`tsg init` tightens it to 0600), or `chmod 600`',
    ),
    r.FILE_NOT_ACCESSIBLE: (
        'the database or a sidecar cannot be examined or read',
        'give this user access to it',
    ),
    r.FILE_MODE_NOT_FIXABLE: (
        'the mode could not be tightened to 0600',
        '`chmod 600` it as its owner',
    ),
    r.OWNER_LOCK_UNAVAILABLE: (
        'the owner lock directory or file (`<db>-owners`) could not be created',
        "give this user write permission on the database's directory",
    ),
    r.OWNER_LOCK_DIRECTORY_UNSAFE: (
        '`<db>-owners` is not a private directory of this user',
        'remove it; the ledger recreates it 0700',
    ),
    r.NOT_A_LEDGER: (
        'the file is not an SQLite database, holds no tables (an existing empty file is never '
        'taken over), or is damaged',
        'fix the path (only a missing path is created); restore from a backup',
    ),
    r.DATABASE_DAMAGED: (
        "`tsg init`, `create`, `reconcile` or `prune` found the ledger file damaged (SQLite's "
        'quick_check failed); nothing was changed',
        'restore from a backup; `tsg doctor` counts what is wrong',
    ),
    r.FOREIGN_SCHEMA: (
        'an SQLite database that is not a ledger, or a tampered one',
        'fix the path; `tsg doctor` on a copy says more',
    ),
    r.MIGRATION_REFUSED: (
        'an older ledger holds data the upgrade cannot carry exactly',
        'keep using the old version for it, or migrate it explicitly',
    ),
    r.STORED_ROW_INVALID: (
        'a stored row failed validation',
        'run `tsg doctor`; restore from a backup',
    ),
    r.WAL_MODE_UNAVAILABLE: (
        'the database could not be switched to WAL mode',
        'check the filesystem (local disk, writable directory)',
    ),
    r.WAL_MODE_REQUIRED: (
        'a read-only open met a ledger not in WAL mode',
        'run a writable command once (`tsg init`)',
    ),
    r.ROLLBACK_JOURNAL_PRESENT: (
        'a read-only open met a rollback journal (`-journal`)',
        'run a writable command once; it recovers the journal',
    ),
    r.SNAPSHOT_TOO_LARGE: (
        'a closed ledger is larger than the read-only snapshot limit (dry-runs)',
        'raise `snapshot_max_bytes`, or run the dry-run while a writer has the ledger open (WAL '
        'access)',
    ),
    r.SNAPSHOT_UNAVAILABLE: (
        'this Python cannot load an in-memory snapshot',
        'use a Python whose `sqlite3` has `deserialize`, or read while a writer has it open',
    ),
    r.DATABASE_CHANGING: (
        'a read-only open kept meeting a writer opening or closing the ledger',
        'retry; raise `--busy-timeout-ms`',
    ),
    r.WAL_INCOMPLETE: (
        'a read-only open met a lone `-wal` or `-shm` (a crash leftover) past the busy timeout',
        'run a writable command once (`tsg init`); it recovers the WAL',
    ),
    r.DATABASE_BUSY: (
        'another connection held the lock past the busy timeout',
        'retry; raise `--busy-timeout-ms` / `busy_timeout_ms`',
    ),
    r.DISK_FULL: (
        'the disk is full',
        'free space',
    ),
    r.WRITE_REJECTED: (
        'SQLite refused the write (a constraint)',
        'run `tsg doctor`',
    ),
    r.DATABASE_UNUSABLE: (
        'any other SQLite or OS failure',
        'run `tsg doctor`; check the disk',
    ),
    r.READ_ONLY_LEDGER: (
        'a write on a ledger opened read-only',
        'open it writable',
    ),
    r.LEDGER_CLOSED: (
        'a call on a closed `Ledger`',
        'open a new one',
    ),
    r.TEXTFILE_NAME_INVALID: (
        "`tsg metrics --textfile`: the name does not end in `.prom` (the node exporter's textfile"
        ' collector reads only `*.prom`)',
        "name it `SOMETHING.prom` in the collector's directory",
    ),
    r.TEXTFILE_IS_LEDGER: (
        '`tsg metrics --textfile`: the path is the ledger, one of its sidecars or its owner lock '
        'directory',
        "write the metrics to a file of their own in the collector's directory",
    ),
    r.TEXTFILE_NOT_OURS: (
        '`tsg metrics --textfile`: something that is not a previous `tsg metrics` textfile is '
        "there (another program's file, a link, a directory); it is left as it is",
        'choose another name; remove that file only if it really is a stale textfile',
    ),
    r.TEXTFILE_NOT_ACCESSIBLE: (
        '`tsg metrics --textfile`: the existing file cannot be examined',
        'give this user access to it',
    ),
    r.TEXTFILE_DIRECTORY_NOT_WRITABLE: (
        '`tsg metrics --textfile`: no temporary file can be created next to it',
        "give this user write permission on the directory (the collector's textfile directory)",
    ),
    r.TEXTFILE_NOT_WRITTEN: (
        '`tsg metrics --textfile`: writing or renaming failed (the old file is kept)',
        "check free space and the directory's permissions",
    ),
    r.BACKEND_MISSING: (
        'a `postgresql://` URL, but `task-state-guard-postgres` is not installed',
        'install `task-state-guard-postgres` beside the core (from a clone: '
        '`pip install ./packages/backend-postgres`)',
    ),
    r.SERVER_UNREACHABLE: (
        'the PostgreSQL server could not be reached, or the connection broke (also a refusal '
        'reported in a language other than English)',
        'check the URL, the server and the network; retry',
    ),
    r.AUTHENTICATION_FAILED: (
        "the PostgreSQL server refused the URL's credentials: a wrong password, an unknown user, "
        'or a client its `pg_hba.conf` rejects',
        "check the user and password (`PGPASSWORD`, `~/.pgpass` or the URL) and the server's "
        '`pg_hba.conf`',
    ),
    r.PASSWORD_FILE_NOT_PRIVATE: (
        "the PostgreSQL server wants a password, and libpq's password file (`~/.pgpass` or "
        '`PGPASSFILE`) was skipped: group or others may access it, or it is not a regular file',
        '`chmod 600 ~/.pgpass` as its owner (or give the password in `PGPASSWORD` or the URL)',
    ),
    r.SERVER_DATABASE_MISSING: (
        "the PostgreSQL server has no database of the URL's name",
        'fix the database name in the URL, or create the database (`createdb`)',
    ),
    r.PRIVILEGE_MISSING: (
        'the PostgreSQL role lacks a privilege the ledger needs',
        "grant `CREATE` on the database (first open) or on the ledger's schema",
    ),
    r.SCHEMA_NEWER: (
        "the ledger's schema is newer than this release (a later release wrote it)",
        'upgrade `task-state-guard` (and `task-state-guard-postgres`)',
    ),
}


def describe(reason: str) -> tuple[str, str]:
    """``(what failed, the fix)`` of ``reason`` (a name of the closed vocabulary)."""
    return HELP[reason]


__all__ = ["HELP", "describe"]
