"""psycopg connections for the ledger: the backend's SQL as written, errors as ledger errors,
fork safety.

Every statement is the backend's own and runs as written (no statement's text is rewritten):
:meth:`Conn.run` takes psycopg's placeholders (``%(name)s``) and binds values on the client
side, so a ``NULL`` or a repeated parameter needs no type annotation; :meth:`Conn.fetch_named`
takes a :class:`Prepared` statement (the transitions, a guarded job's writes), composed with
the server's own ``$n`` parameters (:func:`prepared`: every value cast to its type), prepared
once per connection, values bound by the server and sent as text straight through libpq (the
hot path: no cursor, no adaptation per call); :meth:`Conn.execute` runs a statement without
parameters (``BEGIN``, a count, a DDL statement, doctor's shared checks).
Every driver error becomes a fixed ledger error (``LedgerBusy`` for lock waits,
deadlocks and serialization failures), never the server's text, which may quote stored values.

A connection is never used or closed by a process that did not open it (:attr:`Conn.usable`
and :meth:`Conn.close` check the process id; psycopg finalises a connection only in the process
that opened it), so a forked child can never end the parent's session or release the parent's
advisory locks; it opens connections of its own.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import psycopg
from psycopg import abc as pg_abc
from psycopg import errors as pg_errors
from psycopg import generators, pq
from psycopg.adapt import Transformer
from task_state_guard import reasons as r
from task_state_guard.model import LedgerBusy, LedgerError, StorageError, TaskNotFound

from . import passfile
from .url import SERVER_KEEPALIVE, Target

_BUSY = (
    pg_errors.LockNotAvailable,
    pg_errors.DeadlockDetected,
    pg_errors.SerializationFailure,
    pg_errors.QueryCanceled,
)
_FOREIGN = (pg_errors.UndefinedTable, pg_errors.UndefinedColumn, pg_errors.UndefinedFunction)


class Prepared(NamedTuple):
    """A statement :meth:`Conn.fetch_named` prepares: ``text`` written with the server's
    parameters ``$1..$n``, ``names`` the values' names in that order."""

    text: str
    names: tuple[str, ...]


class _Numbered:
    """The mark of one statement being composed: a name's ``$k::type``, ``k`` its place among
    the names this statement used so far."""

    def __init__(self, types: Mapping[str, str]) -> None:
        self.types = types
        self.names: dict[str, int] = {}

    def __call__(self, name: str) -> str:
        k = self.names.setdefault(name, len(self.names) + 1)
        return f"${k}::{self.types[name]}"


def prepared(types: Mapping[str, str], compose: Callable[[Callable[[str], str]], str]) -> Prepared:
    """One statement composed by ``compose`` with a mark of its own (a name's ``$k`` cast to
    its type in ``types``): its text and the names of its parameters in order."""
    mark = _Numbered(types)
    text = compose(mark)
    return Prepared(text, tuple(mark.names))


def translate_error(exc: BaseException) -> LedgerError:
    """Map a driver error to a fixed ledger error (never the server's text)."""
    if isinstance(exc, LedgerError):
        return exc
    if isinstance(exc, _BUSY):
        return LedgerBusy(
            "another connection held the ledger past the busy timeout", reason=r.DATABASE_BUSY
        )
    if isinstance(exc, pg_errors.ForeignKeyViolation):
        # Raised by the parent check (and by the foreign key of layouts before 10): a new
        # child's parent, which the write named, was deleted meanwhile by a prune that held it.
        return TaskNotFound("task not found")
    if isinstance(exc, pg_errors.ReadOnlySqlTransaction):
        return StorageError("the ledger was opened read-only", reason=r.READ_ONLY_LEDGER)
    if isinstance(exc, pg_errors.InsufficientPrivilege):
        return StorageError(
            "the PostgreSQL role lacks a privilege the ledger needs", reason=r.PRIVILEGE_MISSING
        )
    if isinstance(exc, _FOREIGN):
        return StorageError(
            "the database holds a foreign or tampered schema", reason=r.FOREIGN_SCHEMA
        )
    if isinstance(exc, pg_errors.DiskFull | pg_errors.OutOfMemory):
        return StorageError("the PostgreSQL server is out of space", reason=r.DISK_FULL)
    if isinstance(exc, psycopg.OperationalError):
        return StorageError(
            "the PostgreSQL server cannot be reached", reason=r.SERVER_UNREACHABLE
        )
    return StorageError(
        "the PostgreSQL ledger refused a statement", reason=r.DATABASE_UNUSABLE
    )


class Conn:
    """One psycopg connection speaking the core's SQL (autocommit; transactions explicit)."""

    def __init__(self, raw: psycopg.Connection[Any]) -> None:
        self.raw = raw
        self.pid = os.getpid()
        #: Rows changed by this connection's statements (the core's heartbeat count).
        self.total_changes = 0
        # :meth:`fetch_named`'s statements: text -> its prepared name on this connection
        self._prepared: dict[str, bytes] = {}
        self._rows: pg_abc.Transformer | None = None
        self._encoding = "utf-8"

    @property
    def usable(self) -> bool:
        """True while the connection is open, not broken and owned by this process."""
        return self.pid == os.getpid() and not self.raw.closed and not self.raw.broken

    @property
    def in_transaction(self) -> bool:
        """True inside a transaction block (open or failed)."""
        return self.raw.pgconn.transaction_status in (
            pq.TransactionStatus.INTRANS, pq.TransactionStatus.INERROR
        )

    @property
    def failed(self) -> bool:
        """True inside a transaction block that a failed statement aborted."""
        return self.raw.pgconn.transaction_status == pq.TransactionStatus.INERROR

    def execute(self, sql: str) -> psycopg.Cursor[Any]:
        """Run one statement without parameters, as written; driver errors become ledger
        errors."""
        cursor = self.raw.cursor()
        try:
            cursor.execute(sql)
        except psycopg.Error as exc:
            error = translate_error(exc)
        else:
            if cursor.rowcount > 0 and _is_write(sql):
                self.total_changes += cursor.rowcount
            return cursor
        raise error  # outside the handler: the driver's text is not even chained

    def run(self, sql: str, params: Mapping[str, Any] | None = None) -> psycopg.Cursor[Any]:
        """Run one statement written in psycopg's own placeholders (``%(name)s``), as it is:
        the backend's own SQL, nothing rewritten; driver errors become ledger errors."""
        cursor = self.raw.cursor()
        try:
            cursor.execute(sql, params)
        except psycopg.Error as exc:
            error = translate_error(exc)
        else:
            if cursor.rowcount > 0 and _is_write(sql):
                self.total_changes += cursor.rowcount
            return cursor
        raise error  # outside the handler: the driver's text is not even chained

    def run_many(self, sql: str, rows: Sequence[Mapping[str, Any]]) -> int:
        """Run one statement written in psycopg's placeholders once per row of values; return
        the rows it changed in all. Driver errors become ledger errors."""
        cursor = self.raw.cursor()
        try:
            cursor.executemany(sql, rows)
        except psycopg.Error as exc:
            error = translate_error(exc)
        else:
            changed = max(cursor.rowcount, 0)
            self.total_changes += changed
            return changed
        raise error

    def fetch_named(self, statement: Prepared, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        """Run ``statement`` (every parameter cast to its type, which gives the server the
        parameter's type) as a server-side prepared statement (prepared on its first use on
        this connection), its values taken from ``params`` by name; return its rows. Values go
        as text (:func:`_as_text`). Driver errors become ledger errors."""
        try:
            rows = self._fetch_prepared(statement, params)
        except psycopg.Error as exc:
            error = translate_error(exc)
        else:
            return rows
        raise error  # outside the handler: the driver's text is not even chained

    def _fetch_prepared(
        self, statement: Prepared, params: Mapping[str, Any]
    ) -> list[tuple[Any, ...]]:
        raw = self.raw
        with raw.lock:
            pgconn = raw.pgconn
            text = statement.text
            name = self._prepared.get(text)
            if name is None:
                self._encoding = raw.info.encoding
                name = f"tsg_{len(self._prepared)}".encode()
                pgconn.send_prepare(name, text.encode(self._encoding))
                _check(raw.wait(generators.execute(pgconn)), self._encoding)
                self._prepared[text] = name
            encoding = self._encoding
            pgconn.send_query_prepared(
                name, [_as_text(params[n], encoding) for n in statement.names]
            )
            result = _check(raw.wait(generators.execute(pgconn)), encoding)
        rows = self._rows
        if rows is None:
            rows = self._rows = Transformer(raw)
        rows.set_pgresult(result)
        return rows.load_rows(0, result.ntuples, tuple)

    def stream(self, sql: str, size: int = 5000) -> Iterator[tuple[Any, ...]]:
        """The rows of one query (no parameters) through a server-side cursor, ``size`` rows
        per round trip, so the client never holds them all (inside a transaction block)."""
        cursor = self.raw.cursor(name="tsg_stream")
        cursor.itersize = size
        error: LedgerError | None = None
        try:
            cursor.execute(sql)
            yield from cursor
        except psycopg.Error as exc:
            error = translate_error(exc)
        finally:
            with contextlib.suppress(psycopg.Error):
                cursor.close()
        if error is not None:
            raise error

    def close(self) -> None:
        """Close the connection (only in the process that opened it)."""
        if self.pid == os.getpid() and not self.raw.closed:
            with contextlib.suppress(psycopg.Error):
                self.raw.close()


_REFUSALS = {
    r.SERVER_UNREACHABLE: "cannot connect to the PostgreSQL ledger",
    r.AUTHENTICATION_FAILED: "the PostgreSQL server refused the URL's credentials",
    r.SERVER_DATABASE_MISSING: "the PostgreSQL server has no database of the URL's name",
    r.PASSWORD_FILE_NOT_PRIVATE: "the server wants a password and libpq's password file, "
                                 "open to group or others, was skipped",
}
# A server sends no SQLSTATE a client can read for a refused connection (libpq reports only its
# message), so the server's English message decides; a server set to another language is
# reported server_unreachable. The message itself is never shown or kept.
_AUTHENTICATION = ("password authentication failed", "no password supplied",
                   "authentication failed", "no pg_hba.conf entry", "pg_hba.conf rejects")


def connect_refusal(exc: BaseException) -> str:
    """The reason of a failed connection: ``authentication_failed`` (a wrong password or user,
    or a client the server's rules refuse), ``server_database_missing``, else
    ``server_unreachable``. Judged from the driver's message, which is never repeated."""
    text = str(exc).lower()
    if "does not exist" in text and "database \"" in text:
        return r.SERVER_DATABASE_MISSING
    if any(marker in text for marker in _AUTHENTICATION) or (
        "role \"" in text and "does not exist" in text
    ):
        return r.AUTHENTICATION_FAILED
    return r.SERVER_UNREACHABLE


def _as_text(value: Any, encoding: str) -> bytes | None:
    """A parameter in PostgreSQL's text input form (``None``: SQL ``NULL``)."""
    if value is None:
        return None
    if isinstance(value, str):
        return value.encode(encoding)
    if isinstance(value, bool):
        return b"t" if value else b"f"
    if isinstance(value, int):
        return str(int(value)).encode()
    if isinstance(value, float):
        return repr(float(value)).encode()  # float8's input reads repr's inf, -inf and nan too
    if isinstance(value, (list, tuple)):
        return int_array(value).encode()
    raise TypeError(f"no text form for a {type(value).__name__} parameter")


def text_array(values: list[str]) -> str:
    """A list of strings in PostgreSQL's text form of an array, for a ``text[]`` parameter:
    every element double-quoted, its backslashes and double quotes escaped."""
    return "{" + ",".join('"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
                          for v in values) + "}"


def int_array(values: list[int] | tuple[int, ...]) -> str:
    """A list of integers in PostgreSQL's text form of an array (``{1,2,3}``), for a
    ``bigint[]`` parameter. Built in one join: psycopg's own form of a list checks every
    element for quoting (~0.5 us an integer; a prune or reconcile of 1M tasks binds millions)."""
    if all(type(v) is int for v in values):
        return "{" + ",".join(map(str, values)) + "}"
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise TypeError("an integer array holds integers only")
    return "{" + ",".join(str(int(v)) for v in values) + "}"


def _check(results: list[pq.abc.PGresult], encoding: str) -> pq.abc.PGresult:
    """The last of a statement's results; a failed one raised as psycopg's error."""
    for result in results:
        if result.status == pq.ExecStatus.FATAL_ERROR:
            raise pg_errors.error_from_result(result, encoding=encoding)
    return results[-1]


def _is_write(text: str) -> bool:
    head = text.lstrip()[:6].upper()
    return head in ("INSERT", "UPDATE", "DELETE")


#: The session setting that gates the ledger's row trigger (``ddl``): set to ``on`` by every
#: connection of this release, whose statements write their own events, totals and verdicts.
PASS_EVENTS = "tsg.pass_events"


def connect(target: Target, *, busy_timeout_ms: int, read_only: bool) -> Conn:
    """Open a connection to the ledger's schema: lock waits bounded by ``busy_timeout_ms``,
    the server's TCP keepalive bounds set, read-only transactions when ``read_only``."""
    raw: psycopg.Connection[Any] | None = None
    refused = r.SERVER_UNREACHABLE
    conninfo, passfile_skipped = passfile.quiet(target.conninfo)  # no libpq warning on stderr
    try:
        raw = psycopg.Connection.connect(
            conninfo, autocommit=True, cursor_factory=psycopg.ClientCursor,
            prepare_threshold=None,
        )
    except psycopg.Error as exc:
        refused = connect_refusal(exc)
        if refused == r.AUTHENTICATION_FAILED and passfile_skipped:
            refused = r.PASSWORD_FILE_NOT_PRIVATE
    if raw is None:  # raised outside the handler: the driver's text is not even chained
        raise StorageError(_REFUSALS[refused], reason=refused)
    conn = Conn(raw)
    settings = {
        "search_path": f'"{target.schema}"',
        # PostgreSQL's 0 would wait for ever; SQLite's 0 fails at once: keep the latter.
        "lock_timeout": f"{max(1, busy_timeout_ms)}ms",
        "default_transaction_read_only": "on" if read_only else "off",
        # The prepared statements (transitions, a guarded job's writes) and the row trigger's
        # run on the plan the server keeps for them: no planning per call (a custom plan of
        # *end attempt* cost more to plan than to run). Each is written so that its generic
        # plan finds its rows by id.
        "plan_cache_mode": "force_generic_plan",
        # The ledger's statements find their rows by index; compiling a large read (prune's
        # tree walk over thousands of roots) cost 0.18 s a call, more than it ran.
        "jit": "off",
        # For the whole session: the ledger's row trigger steps aside, since every statement of
        # this release that changes a state writes its own events, totals and verdicts (an
        # earlier release's process, which does not set it, keeps the trigger's).
        PASS_EVENTS: "on",
        **SERVER_KEEPALIVE,
    }
    try:
        calls = ", ".join(f"set_config(%(k{i})s, %(v{i})s, false)" for i in range(len(settings)))
        values = {f"{kind}{i}": value for i, item in enumerate(settings.items())
                  for kind, value in zip("kv", item, strict=True)}
        conn.run(f"SELECT {calls}", values)
    except BaseException:
        conn.close()
        raise
    return conn


__all__ = ["PASS_EVENTS", "Conn", "Prepared", "connect", "prepared", "translate_error"]
