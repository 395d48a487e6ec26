"""Error reasons: which rule a storage or usage error broke, from one closed vocabulary.

A :class:`~task_state_guard.LedgerError` raised for a storage, location or usage problem carries
one of these names as ``exc.reason`` (the CLI adds it to its error line as ``"reason"``). A
reason is a fixed identifier: it never contains a path, an id, a value or any other text the
caller passed in. The README lists each one with its fix.
"""

from __future__ import annotations

# ----------------------------------------------------------------------------- CLI usage
MISSING_COMMAND = "missing_command"
UNKNOWN_COMMAND = "unknown_command"
UNKNOWN_OPTION = "unknown_option"
UNEXPECTED_ARGUMENT = "unexpected_argument"
MISSING_ARGUMENT = "missing_argument"
MISSING_VALUE = "missing_value"
INVALID_VALUE = "invalid_value"
MISSING_DATABASE_PATH = "missing_database_path"
USAGE_ERROR = "usage_error"
SERVE_TOKEN_REQUIRED = "serve_token_required"
SERVE_TOKEN_INVALID = "serve_token_invalid"
# tsg serve's listening address (``--listen``), when binding it fails
ADDRESS_IN_USE = "address_in_use"
ADDRESS_NOT_AVAILABLE = "address_not_available"
LISTEN_NOT_PERMITTED = "listen_not_permitted"
LISTEN_FAILED = "listen_failed"
# ``tsg get ID`` / ``children ID``: the id names more than one task
AMBIGUOUS_ID = "ambiguous_id"
SERVE_TOKEN_WEAK = "serve_token_weak"
SERVE_TOKEN_FILE_UNSAFE = "serve_token_file_unsafe"

# ----------------------------------------------------------------------------- the path
INVALID_DATABASE_PATH = "invalid_database_path"
UNSUPPORTED_URL_SCHEME = "unsupported_url_scheme"
NETWORK_FILESYSTEM = "network_filesystem"
EXTERNAL_ACL_REQUIRED = "external_acl_required"
ANCESTOR_NOT_ACCESSIBLE = "ancestor_not_accessible"
ANCESTOR_NOT_A_DIRECTORY = "ancestor_not_a_directory"
ANCESTOR_WRITABLE_BY_OTHERS = "ancestor_writable_by_others"
ANCESTOR_OWNED_BY_OTHER_USER = "ancestor_owned_by_other_user"
DIRECTORY_MISSING = "directory_missing"
DIRECTORY_NOT_ACCESSIBLE = "directory_not_accessible"
DIRECTORY_NOT_A_DIRECTORY = "directory_not_a_directory"
DIRECTORY_OWNED_BY_OTHER_USER = "directory_owned_by_other_user"
DIRECTORY_WRITABLE_BY_OTHERS = "directory_writable_by_others"
DIRECTORY_NOT_CREATABLE = "directory_not_creatable"
DIRECTORY_NOT_WRITABLE = "directory_not_writable"
SYMLINK_IN_STICKY_DIRECTORY = "symlink_in_sticky_directory"

# ----------------------------------------------------------------------------- the files
DATABASE_MISSING = "database_missing"
DATABASE_NOT_CREATABLE = "database_not_creatable"
DATABASE_NOT_WRITABLE = "database_not_writable"
DATABASE_REPLACED = "database_replaced"
SIDECAR_NOT_WRITABLE = "sidecar_not_writable"
FILE_IS_SYMLINK = "file_is_symlink"
FILE_HARD_LINKED = "file_hard_linked"
FILE_NOT_REGULAR = "file_not_regular"
FILE_OWNED_BY_OTHER_USER = "file_owned_by_other_user"
FILE_NOT_PRIVATE = "file_not_private"
FILE_NOT_ACCESSIBLE = "file_not_accessible"
FILE_MODE_NOT_FIXABLE = "file_mode_not_fixable"
OWNER_LOCK_UNAVAILABLE = "owner_lock_unavailable"
OWNER_LOCK_DIRECTORY_UNSAFE = "owner_lock_directory_unsafe"

# ----------------------------------------------------------------------------- the contents
NOT_A_LEDGER = "not_a_ledger"
DATABASE_DAMAGED = "database_damaged"
FOREIGN_SCHEMA = "foreign_schema"
MIGRATION_REFUSED = "migration_refused"
STORED_ROW_INVALID = "stored_row_invalid"
WAL_MODE_UNAVAILABLE = "wal_mode_unavailable"
WAL_MODE_REQUIRED = "wal_mode_required"
ROLLBACK_JOURNAL_PRESENT = "rollback_journal_present"
SNAPSHOT_TOO_LARGE = "snapshot_too_large"
SNAPSHOT_UNAVAILABLE = "snapshot_unavailable"
DATABASE_CHANGING = "database_changing"
WAL_INCOMPLETE = "wal_incomplete"

# ----------------------------------------------------------------------------- using it
DATABASE_BUSY = "database_busy"
DISK_FULL = "disk_full"
WRITE_REJECTED = "write_rejected"
DATABASE_UNUSABLE = "database_unusable"
READ_ONLY_LEDGER = "read_only_ledger"
LEDGER_CLOSED = "ledger_closed"

# ----------------------------------------------------------------------------- metrics textfile
TEXTFILE_NAME_INVALID = "textfile_name_invalid"
TEXTFILE_IS_LEDGER = "textfile_is_ledger"
TEXTFILE_NOT_OURS = "textfile_not_ours"
TEXTFILE_NOT_ACCESSIBLE = "textfile_not_accessible"
TEXTFILE_DIRECTORY_NOT_WRITABLE = "textfile_directory_not_writable"
TEXTFILE_NOT_WRITTEN = "textfile_not_written"

# ----------------------------------------------------------------------------- PostgreSQL
BACKEND_MISSING = "backend_missing"
SERVER_UNREACHABLE = "server_unreachable"
AUTHENTICATION_FAILED = "authentication_failed"
SERVER_DATABASE_MISSING = "server_database_missing"
PASSWORD_FILE_NOT_PRIVATE = "password_file_not_private"
PRIVILEGE_MISSING = "privilege_missing"
SCHEMA_NEWER = "schema_newer"

#: Reasons of the command line's usage errors (always with ``"error":"InvalidInput"``).
USAGE: frozenset[str] = frozenset(
    {
        MISSING_COMMAND, UNKNOWN_COMMAND, UNKNOWN_OPTION, UNEXPECTED_ARGUMENT, MISSING_ARGUMENT,
        MISSING_VALUE, INVALID_VALUE, MISSING_DATABASE_PATH, USAGE_ERROR, TEXTFILE_NAME_INVALID,
        SERVE_TOKEN_REQUIRED, SERVE_TOKEN_INVALID, SERVE_TOKEN_WEAK, SERVE_TOKEN_FILE_UNSAFE,
        ADDRESS_IN_USE, ADDRESS_NOT_AVAILABLE, LISTEN_NOT_PERMITTED, LISTEN_FAILED, AMBIGUOUS_ID,
    }
)
#: Reasons of storage, location and identity errors (``StorageError``, ``LedgerBusy``,
#: ``UnsafeLocation`` and the ``InvalidInput`` of a missing or malformed database path).
STORAGE: frozenset[str] = frozenset(
    {
        INVALID_DATABASE_PATH, UNSUPPORTED_URL_SCHEME, NETWORK_FILESYSTEM, EXTERNAL_ACL_REQUIRED,
        ANCESTOR_NOT_ACCESSIBLE, ANCESTOR_NOT_A_DIRECTORY, ANCESTOR_WRITABLE_BY_OTHERS,
        ANCESTOR_OWNED_BY_OTHER_USER, DIRECTORY_MISSING, DIRECTORY_NOT_ACCESSIBLE,
        DIRECTORY_NOT_A_DIRECTORY, DIRECTORY_OWNED_BY_OTHER_USER, DIRECTORY_WRITABLE_BY_OTHERS,
        DIRECTORY_NOT_CREATABLE, DIRECTORY_NOT_WRITABLE, SYMLINK_IN_STICKY_DIRECTORY,
        DATABASE_MISSING, DATABASE_NOT_CREATABLE, DATABASE_NOT_WRITABLE, DATABASE_REPLACED,
        SIDECAR_NOT_WRITABLE, FILE_IS_SYMLINK, FILE_HARD_LINKED, FILE_NOT_REGULAR,
        FILE_OWNED_BY_OTHER_USER, FILE_NOT_PRIVATE, FILE_NOT_ACCESSIBLE, FILE_MODE_NOT_FIXABLE,
        OWNER_LOCK_UNAVAILABLE, OWNER_LOCK_DIRECTORY_UNSAFE,
        NOT_A_LEDGER, DATABASE_DAMAGED, FOREIGN_SCHEMA, MIGRATION_REFUSED, STORED_ROW_INVALID,
        WAL_MODE_UNAVAILABLE, WAL_MODE_REQUIRED, ROLLBACK_JOURNAL_PRESENT, SNAPSHOT_TOO_LARGE,
        SNAPSHOT_UNAVAILABLE, DATABASE_CHANGING, WAL_INCOMPLETE,
        DATABASE_BUSY, DISK_FULL, WRITE_REJECTED, DATABASE_UNUSABLE, READ_ONLY_LEDGER,
        LEDGER_CLOSED, TEXTFILE_IS_LEDGER, TEXTFILE_NOT_OURS, TEXTFILE_NOT_ACCESSIBLE,
        TEXTFILE_DIRECTORY_NOT_WRITABLE,
        TEXTFILE_NOT_WRITTEN,
        BACKEND_MISSING, SERVER_UNREACHABLE, AUTHENTICATION_FAILED, SERVER_DATABASE_MISSING,
        PRIVILEGE_MISSING, SCHEMA_NEWER, PASSWORD_FILE_NOT_PRIVATE,
    }
)
#: The whole closed vocabulary.
ALL: frozenset[str] = USAGE | STORAGE
