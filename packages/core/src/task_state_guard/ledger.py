"""The Ledger: connections (one per thread, per process) and task transitions."""

from __future__ import annotations

import math
import os
import sqlite3
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager, suppress
from typing import Any, NoReturn

from . import attempts, backends, store, task_list
from . import events as _events
from . import history as _history
from . import prune as _prune
from . import reasons as r
from . import reconcile as _reconcile
from . import status as _status
from . import verdicts as _verdicts
from .model import (
    DELIVERY_CLOSED,
    DELIVERY_CODES,
    DELIVERY_STATES,
    TASK_CODES,
    TASK_STATES,
    TERMINAL_STATES,
    DeliveryStatus,
    InvalidInput,
    LedgerError,
    StateConflict,
    StorageError,
    Task,
    TaskNotFound,
    TaskStatus,
    canonical_id,
    check_code,
    check_code_shape,
    check_framework,
    check_name,
    check_payload_hash,
    check_seconds,
    check_state,
    is_canonical,
    is_payload_hash,
    is_valid_name,
)
from .placeholders import positional, positional_rows
from .sqlite import connections, schema

TASK_COLUMNS = (
    "seq, id, parent_id, name, status, terminal_code, delivery_required, delivery_status, "
    "delivery_code, timeout_seconds, deadline_at, created_at, started_at, heartbeat_at, "
    "ended_at, delivery_updated_at, updated_at, owner, payload_hash, version, framework_id"
)
_SELECT_BY_ID = f"SELECT {TASK_COLUMNS} FROM tsg_tasks WHERE id = ?"
_RETURNING = f" RETURNING {TASK_COLUMNS}"
# Events are written by the schema's triggers in the same statement as each state change.
# Each transition is one guarded statement inside a write transaction whose clock is read
# after the lock is taken (?1 is always that reading): the state change, its guard (allowed
# source state, clock not earlier than the stored times) and, through the schema's triggers,
# its event. When the guard refuses, the same transaction reads the row to explain why.
_INSERT_TASK = (
    "INSERT INTO tsg_tasks(id, parent_id, name, status, delivery_required, delivery_status, "
    "payload_hash, timeout_seconds, created_at, delivery_updated_at, updated_at, framework_id, "
    "framework) "
    "SELECT ?2, ?3, ?4, 'queued', ?5, 'pending', ?6, ?7, ?1, ?1, ?1, ?8, ?9 "
    "WHERE ?3 IS NULL OR EXISTS (SELECT 1 FROM tsg_tasks WHERE id = ?3 AND created_at <= ?1) "
    "ON CONFLICT(id) DO NOTHING RETURNING seq"
)
# updated_at is the last task-state change or heartbeat; a delivery change moves only
# delivery_updated_at. version counts state and delivery changes (heartbeats do not count).
# ?4 is the largest finite float: a start whose deadline (?1 + timeout) would not be a finite
# timestamp is refused (create_task takes any finite timeout, as 0.1.0 did). ?5: the attempt's
# redelivery window (seconds after its last sign of life during which its broker may still put
# the job back in its queue), or NULL.
_START = (
    "UPDATE tsg_tasks SET status = 'running', started_at = ?1, deadline_at = ?1 + timeout_seconds, "
    "owner = ?3, redelivery_seconds = ?5, updated_at = ?1, version = version + 1 "
    "WHERE id = ?2 AND status = 'queued' AND ?1 >= updated_at "
    "AND (timeout_seconds IS NULL OR timeout_seconds <= ?4 - ?1)" + _RETURNING
)
_FLOAT_MAX = sys.float_info.max
_HEARTBEAT = (
    "UPDATE tsg_tasks SET heartbeat_at = ?1, updated_at = ?1 WHERE id = ?2 AND status = 'running' "
    "AND ?1 >= updated_at AND ?1 >= coalesce(heartbeat_at, 0)" + _RETURNING
)
_CLOSE = (
    "UPDATE tsg_tasks SET status = ?3, terminal_code = ?4, ended_at = ?1, updated_at = ?1, "
    "version = version + 1 WHERE id = ?2 AND status IN ('queued','running') "
    "AND ?1 >= updated_at AND ?1 >= coalesce(heartbeat_at, 0)" + _RETURNING
)
# A close that also settles the delivery of a task that owes none (delivery_required = 0):
# one statement, two events (closed and delivery) written by the triggers, version + 2.
_CLOSE_SETTLED = (
    "UPDATE tsg_tasks SET status = ?3, terminal_code = ?4, ended_at = ?1, updated_at = ?1, "
    "delivery_status = CASE delivery_required WHEN 0 THEN 'not_applicable' "
    "ELSE delivery_status END, "
    "delivery_code = CASE delivery_required WHEN 0 THEN 'internal_task' ELSE delivery_code END, "
    "delivery_updated_at = CASE delivery_required WHEN 0 THEN ?1 ELSE delivery_updated_at END, "
    "version = version + 2 - delivery_required WHERE id = ?2 AND status IN ('queued','running') "
    "AND delivery_status = 'pending' AND ?1 >= updated_at AND ?1 >= delivery_updated_at "
    "AND ?1 >= coalesce(heartbeat_at, 0)" + _RETURNING
)
_START_QUIET = _START.replace(_RETURNING, " RETURNING seq")
_CLOSE_SETTLED_QUIET = _CLOSE_SETTLED.replace(_RETURNING, " RETURNING seq")
_DELIVER = (
    "UPDATE tsg_tasks SET delivery_status = ?3, delivery_code = ?4, delivery_updated_at = ?1, "
    "version = version + 1 WHERE id = ?2 AND delivery_status = 'pending' "
    "AND status IN ('succeeded','failed','timed_out','cancelled') AND delivery_required = ?5 "
    "AND ?1 >= updated_at AND ?1 >= delivery_updated_at" + _RETURNING
)
_HEARTBEAT_MANY = (
    "UPDATE tsg_tasks SET heartbeat_at = ?1, updated_at = ?1 WHERE id = ?2 AND status = 'running' "
    "AND ?1 >= updated_at AND ?1 >= coalesce(heartbeat_at, 0)"
)

def row_to_task(row: tuple[Any, ...]) -> Task:
    """Build a Task from a row selected with TASK_COLUMNS; a tampered row is never returned."""
    if not row_is_valid(row):
        raise StorageError(
            "a stored task row failed validation (run doctor)", reason=r.STORED_ROW_INVALID
        )
    return Task(
        id=row[1],
        parent_id=row[2],
        status=TaskStatus(row[4]),
        delivery_status=DeliveryStatus(row[7]),
        delivery_required=bool(row[6]),
        payload_hash=row[18],
        timeout_seconds=_float(row[9]),
        created_at=float(row[11]),
        started_at=_float(row[12]),
        updated_at=float(row[16]),
        ended_at=_float(row[14]),
        deadline_at=_float(row[10]),
        delivery_updated_at=float(row[15]),
        terminal_code=row[5],
        delivery_code=row[8],
        version=int(row[19]),
        name=row[3],
        heartbeat_at=_float(row[13]),
        has_owner=row[17] is not None,
        framework_id=row[20],
    )


def row_is_valid(row: tuple[Any, ...]) -> bool:
    """Cheap shape check of a task row before any of its values leaves the ledger."""
    status, code, delivery, dcode = row[4], row[5], row[7], row[8]
    if not (
        status in TASK_STATES
        and delivery in DELIVERY_STATES
        and (code is None or code in TASK_CODES.get(status, ()))
        and (dcode is None or dcode in DELIVERY_CODES.get(delivery, ()))
        and type(row[1]) is str
        and is_canonical(row[1])
        and (row[2] is None or (type(row[2]) is str and is_canonical(row[2])))
        and (row[3] is None or (type(row[3]) is str and is_valid_name(row[3])))
        and (row[18] is None or (type(row[18]) is str and is_payload_hash(row[18])))
        and row[6] in (0, 1)
        and row[11] is not None
        and row[15] is not None
        and row[16] is not None
        and type(row[19]) is int
        and row[19] >= 0
        and (row[20] is None or (type(row[20]) is str and is_canonical(row[20])))
    ):
        return False
    for value in row[9:17]:  # timeout, deadline and every timestamp: None or a finite number
        if value is not None and not (type(value) in (float, int) and math.isfinite(value)):
            return False
    return True


def _framework_id(value: object) -> str:
    """A framework id as stored: exactly a canonical lowercase UUID (anything else may carry
    user data and is refused)."""
    if isinstance(value, uuid.UUID):
        return str(value)
    if type(value) is str and is_canonical(value):
        return value
    raise InvalidInput("framework id must be a canonical lowercase UUID")


def _float(value: Any) -> float | None:
    # RETURNING hands back integral REAL values as int; callers always get floats.
    return None if value is None else float(value)


def _explain_start(row: tuple[Any, ...] | None, now: float) -> NoReturn:
    """Why a guarded start was refused (the row as the refusing transaction read it)."""
    if row is None:
        raise TaskNotFound("task not found")
    if row[4] != "queued":
        raise StateConflict("only a queued task can start")
    if row[9] is not None and not math.isfinite(now + float(row[9])):
        raise InvalidInput("the task's deadline would not be a finite timestamp")
    raise StateConflict("clock is earlier than the task's stored times")


def _clock_behind(row: tuple[Any, ...], now: float) -> bool:
    """True when ``now`` is earlier than the task's last change, heartbeat or delivery change."""
    return now < row[16] or now < row[15] or (row[13] is not None and now < row[13])


class Ledger:
    """An embedded SQLite task ledger (or, given a ``postgresql://`` URL, a PostgreSQL one).

    Safe to share between threads (one connection per thread, opened lazily) and to use from
    many processes at once; a connection is never reused across ``fork()``.
    """

    #: The schema version this release writes (older known layouts migrate to it on open). On
    #: an instance it is its backend's: a PostgreSQL ledger versions its own layout.
    SCHEMA_VERSION: int = schema.SCHEMA_VERSION

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        clock: Callable[[], float] | None = None,
        busy_timeout_ms: int = 5000,
        allow_external_acl: bool = False,
        read_only: bool = False,
        snapshot_max_bytes: int = 1 << 30,
        transient_sidecars: bool = True,
        create: bool = True,
        _check_schema: bool = True,
        _verify_integrity: bool = False,
    ) -> None:
        """Open (with ``read_only=False``: create or migrate) the ledger at ``path``.

        ``create=False`` opens an existing ledger for writing (migrating it when needed) but
        never creates one: a missing database or directory is ``InvalidInput``
        (``database_missing``, ``directory_missing``), nothing made. A path whose directories
        are symbolic links is opened at its real path (``path`` shows it), after every directory
        on the way was checked.

        ``read_only=True`` never creates, migrates or tightens anything. A cleanly closed ledger
        (no WAL) with ``transient_sidecars=True`` is opened in place in bounded memory: SQLite
        may create private (0600) WAL and SHM files for the read, removed again when the last
        connection closes. With ``False`` (or when the
        sidecars cannot be created) nothing at all is created: the file is read twice, both
        reads must match (identity, times, SHA-256), and the copy is loaded into memory as a
        private snapshot of at most ``snapshot_max_bytes`` (a larger file, a writer during the
        reads or a Python without ``sqlite3`` deserialize fails closed with ``StorageError``).
        A live ledger (WAL and SHM present) is read through SQLite's read-only WAL access.
        """
        if clock is not None and not callable(clock):
            raise InvalidInput("clock must be callable")
        if isinstance(busy_timeout_ms, bool) or not isinstance(busy_timeout_ms, int):
            raise InvalidInput("busy_timeout_ms must be an integer")
        if not 0 <= busy_timeout_ms <= 600_000:
            raise InvalidInput("busy_timeout_ms is out of range")
        for flag in (allow_external_acl, read_only, transient_sidecars, create):
            if not isinstance(flag, bool):
                raise InvalidInput("flags must be booleans")
        self._db: store.Database = backends.open_store(
            path, clock=clock or time.time, busy_timeout_ms=busy_timeout_ms,
            allow_external_acl=allow_external_acl, read_only=read_only,
            transient_sidecars=transient_sidecars, snapshot_max_bytes=snapshot_max_bytes,
            check_schema=_check_schema, create=create, verify_integrity=_verify_integrity,
        )
        self._db.conn()  # connect and run every safety check (and migration) now
        self.SCHEMA_VERSION = self._db.layout.current

    # ----------------------------------------------------------------- connections
    @property
    def path(self) -> str:
        """Absolute path of the database file (a PostgreSQL URL without its password)."""
        return self._db.path

    @property
    def read_only(self) -> bool:
        """True when this ledger was opened with ``read_only=True``."""
        return self._db.read_only

    @property
    def schema_version(self) -> int | None:
        """The schema version of the file (after any migration this ledger ran)."""
        return self._db.layout.version

    def _conn(self) -> Any:
        return self._db.conn()

    def close(self) -> None:
        """Close every connection this process opened; the ledger cannot be used afterwards."""
        self._db.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def atomic(self) -> Iterator[Ledger]:
        """Group several transitions into one transaction: all of them commit, or none.

        A transition that raises inside the block changed nothing itself; the block decides
        whether to go on. Nested use joins the outer transaction.
        """
        with self._db.group():
            yield self

    def _guarded(
        self, sql: str, tid: str, *params: Any
    ) -> tuple[Any, float, tuple[Any, ...] | None]:
        """Run one guarded write in a transaction, the clock read once the lock is held.

        Returns the first RETURNING row (None when the guard refused), the clock reading, and
        the task's current row when the guard refused (None if the task does not exist).
        """
        db = self._db
        if db.in_group:  # joining the enclosing transaction: no context manager needed
            return self._guarded_on(db.conn(), sql, tid, params)
        if sql:
            done = self._write_one(sql, tid, params)
            if done is not None:
                return done[0], done[1], None
        with db.write() as conn:
            return self._guarded_on(conn, sql, tid, params)

    def _write_one(
        self, sql: str, tid: str, params: tuple[Any, ...]
    ) -> tuple[tuple[Any, ...], float] | None:
        """The guarded statement alone as its own transaction (one round trip), where the
        backend offers it and no group is open: its row and clock reading, or None (refused,
        or no such backend). A refusal proves nothing (the clock was read before any lock
        wait): the caller then takes the locked path, which explains."""
        db = self._db
        write_one = db.write_one
        if write_one is None or db.in_group:
            return None
        now = db.now()
        row = write_one(sql, (now, tid, *params))
        return None if row is None else (row, now)

    def _guarded_on(
        self, conn: Any, sql: str, tid: str, params: tuple[Any, ...]
    ) -> tuple[Any, float, tuple[Any, ...] | None]:
        self._db.lock_task(conn, tid)
        now = self._db.now()
        try:
            rows = conn.execute(*positional(sql, (now, tid, *params))).fetchall() if sql else []
            if rows:
                return rows[0], now, None
            found = conn.execute(_SELECT_BY_ID, (tid,)).fetchone()
        except sqlite3.Error as exc:
            raise connections.translate(exc) from None
        return None, now, (None if found is None else tuple(found))

    def _current(self, tid: str) -> tuple[Any, ...]:
        """Read a task row (TaskNotFound when missing)."""
        conn = self._db.conn()
        try:
            row = conn.execute(_SELECT_BY_ID, (tid,)).fetchone()
        except sqlite3.Error as exc:
            raise connections.translate(exc) from None
        if row is None:
            raise TaskNotFound("task not found")
        return tuple(row)

    # ----------------------------------------------------------------- transitions
    def create_task(
        self,
        *,
        task_id: str | uuid.UUID | None = None,
        parent_id: str | uuid.UUID | None = None,
        timeout_seconds: float | None = None,
        delivery_required: bool = True,
        name: str | None = None,
        payload_hash: str | None = None,
        framework_id: str | uuid.UUID | None = None,
        framework: str | None = None,
    ) -> Task:
        """Create a queued task; with an explicit ``task_id`` an identical repeat is a no-op.

        ``framework_id``: the framework's own id of the job (a Celery task id, a Dramatiq message
        id), stored so that an operator or a callback can map the task back; only a canonical
        UUID is accepted (an id that is not one may carry user data and is never stored).
        ``framework``: the label of the adapter that opens this job (one of
        ``model.FRAMEWORK_LABELS``): a close declaring it lost owes that framework a verdict.
        """
        task = self._create(task_id, parent_id, timeout_seconds, delivery_required, name,
                            payload_hash, framework_id, quiet=False, framework=framework)
        assert isinstance(task, Task)
        return task

    def _create(
        self,
        task_id: str | uuid.UUID | None,
        parent_id: str | uuid.UUID | None,
        timeout_seconds: float | None,
        delivery_required: bool,
        name: str | None,
        payload_hash: str | None,
        framework_id: str | uuid.UUID | None,
        *,
        quiet: bool,
        framework: str | None = None,
    ) -> Task | str:
        """:meth:`create_task`; ``quiet=True`` returns only the task's state (no Task built).

        ``framework`` (the integration layer's): the label of the adapter that opens this
        logical task (one of ``model.FRAMEWORK_LABELS``), so that a close declaring it lost owes
        that framework a verdict. An existing task keeps the label it was created with.
        """
        tid = str(uuid.uuid4()) if task_id is None else canonical_id(task_id)
        parent = None if parent_id is None else canonical_id(parent_id, "parent id")
        timeout = (  # any finite duration, as in 0.1.0 (a start checks the deadline)
            None
            if timeout_seconds is None
            else check_seconds(timeout_seconds, "timeout_seconds", allow_zero=True, maximum=None)
        )
        if not isinstance(delivery_required, bool):
            raise InvalidInput("delivery_required must be a boolean")
        label = check_name(name)
        fingerprint = check_payload_hash(payload_hash)
        fid = None if framework_id is None else _framework_id(framework_id)
        opener = check_framework(framework)
        inserted, now, row = self._guarded(
            _INSERT_TASK, tid, parent, label, int(delivery_required), fingerprint, timeout, fid,
            opener,
        )
        if inserted is None:
            if row is not None:  # an explicit id that already exists
                if (row[2], bool(row[6]), row[3], row[9], row[18], row[20]) != (
                    parent, delivery_required, label, timeout, fingerprint, fid
                ):
                    raise StateConflict("a task with this id exists with other attributes")
                if quiet:
                    if not row_is_valid(row):
                        raise StorageError(
                            "a stored task row failed validation (run doctor)",
                            reason=r.STORED_ROW_INVALID,
                        )
                    return str(row[4])
                return row_to_task(row)
            assert parent is not None
            self._current(parent)  # TaskNotFound when the parent is missing
            raise StateConflict("clock is earlier than the parent's creation")
        if quiet:
            return "queued"
        return Task(
            id=tid, parent_id=parent, status=TaskStatus.QUEUED,
            delivery_status=DeliveryStatus.PENDING, delivery_required=delivery_required,
            payload_hash=fingerprint, timeout_seconds=timeout, created_at=now, started_at=None,
            updated_at=now, ended_at=None, deadline_at=None, delivery_updated_at=now,
            terminal_code=None, delivery_code=None, version=0, name=label, framework_id=fid,
        )

    def start_task(
        self, task_id: str | uuid.UUID, *, owner: bool = True,
        redelivery_seconds: float | None = None,
    ) -> Task:
        """Move a queued task to running; ``owner=True`` records this process as its owner.

        The owner lock directory (``<db>-owners``) is created only for a start with an owner,
        and only once the task was found queued: a refused start creates nothing.
        ``redelivery_seconds``: for an attempt whose broker redelivers the job if its worker
        dies, how long after its last sign of life that may still happen (reconcile keeps the
        logical task fresh that long once the attempt is lost).
        """
        tid = canonical_id(task_id)
        if not isinstance(owner, bool):
            raise InvalidInput("owner must be a boolean")
        bound = None if redelivery_seconds is None else check_seconds(
            redelivery_seconds, "redelivery_seconds", allow_zero=True
        )
        if self._db.read_only:
            raise StorageError("the ledger was opened read-only", reason=r.READ_ONLY_LEDGER)
        token = self._db.owners.held() if owner else None
        if owner and token is None:
            # Judged before the lock file exists; the guarded update below decides for real.
            # The lock file is made outside the write transaction: its creation never waits
            # for (or holds up) another connection's write. Once this process holds it, a
            # refused start creates nothing, so no look ahead is needed.
            if self._current(tid)[4] != "queued":
                raise StateConflict("only a queued task can start")
            token = self._db.owners.own()
        updated, now, row = self._guarded(_START, tid, token, _FLOAT_MAX, bound)
        if updated is not None:
            return row_to_task(updated)
        _explain_start(row, now)

    def _start_quiet(
        self, task_id: str, *, owner: bool, redelivery_seconds: float | None = None
    ) -> None:
        """:meth:`start_task` for the integration layer: same guard and errors, no Task built.

        Once this process holds its owner lock file, the start is the guarded update alone
        (no look ahead: the lock file exists already, so a refused start creates nothing).
        ``redelivery_seconds``: for an attempt whose broker redelivers the job if its worker
        dies, how long after the attempt's last sign of life that may still happen; recorded in
        the same statement, it keeps the logical task fresh that long once the attempt is lost.
        """
        tid = canonical_id(task_id)
        bound = None if redelivery_seconds is None else check_seconds(
            redelivery_seconds, "redelivery_seconds", allow_zero=True
        )
        token = self._db.owners.held() if owner else None
        if owner and token is None:
            # Judged before the lock file exists (see start_task); the guarded update decides.
            if self._db.read_only:
                raise StorageError("the ledger was opened read-only", reason=r.READ_ONLY_LEDGER)
            if self._current(tid)[4] != "queued":
                raise StateConflict("only a queued task can start")
            token = self._db.owners.own()
        updated, now, row = self._guarded(_START_QUIET, tid, token, _FLOAT_MAX, bound)
        if updated is not None:
            return
        _explain_start(row, now)

    def heartbeat(self, task_id: str | uuid.UUID) -> Task:
        """Record that a running task is alive (no event is written)."""
        tid = canonical_id(task_id)
        updated, _now, row = self._guarded(_HEARTBEAT, tid)
        if updated is not None:
            return row_to_task(updated)
        if row is None:
            raise TaskNotFound("task not found")
        if row[4] != "running":
            raise StateConflict("only a running task can heartbeat")
        raise StateConflict("clock is earlier than the task's stored times")

    def heartbeat_many(self, task_ids: Iterable[str | uuid.UUID]) -> int:
        """Heartbeat every running task among ``task_ids`` in one transaction; return the count."""
        if isinstance(task_ids, str | bytes) or not isinstance(task_ids, Iterable):
            raise InvalidInput("task_ids must be an iterable of task ids")
        ids = [canonical_id(t) for t in task_ids]
        if not ids:
            return 0
        with self._db.write() as conn:
            now = self._db.now()
            before = conn.total_changes
            conn.executemany(*positional_rows(_HEARTBEAT_MANY, [(now, tid) for tid in ids]))
            return int(conn.total_changes - before)

    def close_task(self, task_id: str | uuid.UUID, status: str, *, code: str | None = None) -> Task:
        """Close a queued or running task.

        Repeating the same terminal state is a no-op whatever ``code`` the repeat passes: it
        returns the stored task unchanged, its stored code included; another terminal state is
        a ``StateConflict``.
        """
        tid = canonical_id(task_id)
        state = check_state(status, TERMINAL_STATES, "terminal task status")
        reason = check_code_shape(code)
        code_ok = reason is None or reason in TASK_CODES[state]
        updated, now, row = self._guarded(_CLOSE if code_ok else "", tid, state, reason)
        if updated is not None:
            return row_to_task(updated)
        if row is None:  # explain, in the contract's precedence order
            raise TaskNotFound("task not found")
        if row[4] == state:  # a repeat of the same close, whatever its code (as in 0.1.0):
            return row_to_task(row)  # the stored task, its stored code included
        if row[4] in TERMINAL_STATES:
            raise StateConflict("the task already closed with another state")
        if _clock_behind(row, now):
            raise StateConflict("clock is earlier than the task's stored times")
        check_code(reason, state, TASK_CODES)
        raise StateConflict("the task could not be closed")  # open, valid code and clock

    def close_task_settled(
        self, task_id: str | uuid.UUID, status: str, *, code: str | None = None
    ) -> Task:
        """Close a task as :meth:`close_task` does; a task that owes no delivery
        (``delivery_required=False``) has its delivery closed ``not_applicable/internal_task``
        in the same statement (two events: the close and the delivery).

        When the task is already closed with the same state (an identical repeat), a pending
        delivery it does not owe is closed; any other refusal raises as :meth:`close_task`
        does and changes nothing.
        """
        tid = canonical_id(task_id)
        state = check_state(status, TERMINAL_STATES, "terminal task status")
        reason = check_code_shape(code)
        if reason is None or reason in TASK_CODES[state]:
            done = self._write_one(_CLOSE_SETTLED, tid, (state, reason))
            if done is not None:
                return row_to_task(done[0])
        with self._db.group():
            if reason is None or reason in TASK_CODES[state]:
                updated, _now, _row = self._guarded(_CLOSE_SETTLED, tid, state, reason)
                if updated is not None:
                    return row_to_task(updated)
            task = self.close_task(tid, state, code=reason)  # explains, or closes the task
            if task.delivery_required or task.delivery_status != DeliveryStatus.PENDING:
                return task
            return self.set_delivery(tid, "not_applicable", code="internal_task")

    def _close_settled_quiet(self, task_id: str, status: str, code: str | None) -> None:
        """:meth:`close_task_settled` for the integration layer: no Task built."""
        tid = canonical_id(task_id)
        state = check_state(status, TERMINAL_STATES, "terminal task status")
        reason = check_code_shape(code)
        if reason is None or reason in TASK_CODES[state]:
            db = self._db
            if db.in_group:
                conn = db.conn()
                db.lock_task(conn, tid)
                now = db.now()
                try:
                    done = conn.execute(
                        *positional(_CLOSE_SETTLED_QUIET, (now, tid, state, reason))
                    ).fetchone()
                except sqlite3.Error as exc:
                    raise connections.translate(exc) from None
                if done is not None:
                    return
            elif self._write_one(_CLOSE_SETTLED_QUIET, tid, (state, reason)) is not None:
                return
        self.close_task_settled(tid, state, code=reason)  # outside a group, or to explain

    def set_delivery(
        self, task_id: str | uuid.UUID, status: str, *, code: str | None = None
    ) -> Task:
        """Close the delivery of a terminal task; repeating the same state is a no-op."""
        tid = canonical_id(task_id)
        state = check_state(status, DELIVERY_CLOSED, "delivery status")
        reason = check_code_shape(code)
        code_ok = reason is None or reason in DELIVERY_CODES[state]
        required = int(state != "not_applicable")
        updated, now, row = self._guarded(
            _DELIVER if code_ok else "", tid, state, reason, required
        )
        if updated is not None:
            return row_to_task(updated)
        if row is None:  # explain, in the contract's precedence order
            raise TaskNotFound("task not found")
        if row[4] not in TERMINAL_STATES:
            raise StateConflict("delivery can close only after the task is terminal")
        if row[7] != "pending" and row[7] != state:
            raise StateConflict("the delivery already closed with another state")
        if row[7] == "pending":
            if row[6] != required:
                raise StateConflict(
                    "delivering tasks cannot be not_applicable; internal tasks can only be"
                )
            if _clock_behind(row, now):
                raise StateConflict("clock is earlier than the task's stored times")
        check_code(reason, state, DELIVERY_CODES)
        if row[7] != state:  # a pending delivery with a valid code and clock would have closed
            raise StateConflict("the delivery could not be closed")
        return row_to_task(row)  # identical repeat: the original is kept

    # ----------------------------------------------------------------- a guarded job's writes
    def begin_attempt(
        self,
        logical_id: str | uuid.UUID,
        *,
        name: str | None = None,
        delivery_required: bool = False,
        framework_id: str | uuid.UUID | None = None,
        framework: str | None = None,
        open_logical: bool = True,
        logical_owner: bool = False,
        candidates: Iterable[tuple[str | uuid.UUID, bool]] = (),
        attempt_id: str | uuid.UUID | None = None,
        timeout_seconds: float | None = None,
        redelivery_seconds: float | None = None,
    ) -> str:
        """Begin the attempt a delivery of a framework job runs as, in one write committed
        before the job's body runs (SQLite: one transaction; PostgreSQL: one statement); return
        the attempt's id.

        With ``open_logical`` the logical task ``logical_id`` is created when missing (with
        ``delivery_required``, ``name``, ``framework_id``, ``framework``) and started when
        queued (owned by this process with ``logical_owner``); one recorded earlier with other
        attributes, or started or closed already, is left as it is. The attempt, a child owing
        no delivery, owned by this process, named ``name``, with ``timeout_seconds`` and
        ``redelivery_seconds`` (see :meth:`start_task`), is the first of ``candidates``
        (``(id, create)``: a queued placeholder such as a scheduled retry's, recorded first when
        ``create`` and missing) that can still be started, else a new one, ``attempt_id``
        (random when None): two deliveries never share an attempt. Events and totals are those
        of creating and starting each task. ``TaskNotFound`` when the logical task does not
        exist, ``StateConflict`` when ``attempt_id`` exists and is not queued.
        """
        lid = canonical_id(logical_id)
        for flag in (delivery_required, open_logical, logical_owner):
            if not isinstance(flag, bool):
                raise InvalidInput("flags must be booleans")
        if isinstance(candidates, str | bytes) or not isinstance(candidates, Iterable):
            raise InvalidInput("candidates must be an iterable of (task id, create) pairs")
        picks: list[tuple[str, bool]] = []
        for candidate, create in candidates:
            if not isinstance(create, bool):
                raise InvalidInput("flags must be booleans")
            picks.append((canonical_id(candidate), create))
        timeout = None if timeout_seconds is None else check_seconds(
            timeout_seconds, "timeout_seconds", allow_zero=True, maximum=None
        )
        bound = None if redelivery_seconds is None else check_seconds(
            redelivery_seconds, "redelivery_seconds", allow_zero=True
        )
        db = self._db
        if db.read_only:
            raise StorageError("the ledger was opened read-only", reason=r.READ_ONLY_LEDGER)
        token = db.owners.held() or db.owners.own()
        spec = attempts.Begin(
            logical_id=lid, name=check_name(name), delivery_required=delivery_required,
            framework_id=None if framework_id is None else _framework_id(framework_id),
            framework=check_framework(framework), open_logical=open_logical,
            logical_owner=token if logical_owner else None, candidates=tuple(picks),
            attempt_id=str(uuid.uuid4()) if attempt_id is None else canonical_id(attempt_id),
            timeout_seconds=timeout, owner=token, redelivery_seconds=bound,
        )
        begun = db.begin_attempt(spec)
        if begun is not None:
            return begun
        with db.group():  # a step was refused: the one-task transitions explain (or do it)
            return self._begin_steps(spec)

    def _begin_steps(self, spec: attempts.Begin) -> str:
        """:meth:`begin_attempt` one transition at a time (inside a group)."""
        lid, name, bound = spec.logical_id, spec.name, spec.redelivery_seconds
        if spec.open_logical:
            try:
                queued = self._create(
                    lid, None, None, spec.delivery_required, name, None, spec.framework_id,
                    quiet=True, framework=spec.framework,
                ) == "queued"
            except StateConflict:
                queued = True
            if queued:
                with suppress(StateConflict):  # started by a concurrent delivery
                    self._start_quiet(lid, owner=spec.logical_owner is not None)
        for candidate, create in spec.candidates:
            try:
                if create:
                    self._create(candidate, lid, spec.timeout_seconds, False, name, None, None,
                                 quiet=True)
                self._start_quiet(candidate, owner=True, redelivery_seconds=bound)
                return candidate
            except (StateConflict, TaskNotFound):
                continue
        fresh = spec.attempt_id
        self._create(fresh, lid, spec.timeout_seconds, False, name, None, None, quiet=True)
        self._start_quiet(fresh, owner=True, redelivery_seconds=bound)
        return fresh

    def end_attempt(
        self,
        closes: Iterable[tuple[str | uuid.UUID, str, str | None]],
        *,
        marks: Mapping[str, tuple[str, str | None]] | None = None,
        queue: Iterable[tuple[str | uuid.UUID, str | uuid.UUID, str | None, float | None]] = (),
    ) -> attempts.Ended:
        """End an attempt in one write (SQLite: one transaction; PostgreSQL: one statement):
        record each of ``queue`` (``(task_id, parent_id, name, timeout_seconds)``: the queued
        attempt of a scheduled retry, owing no delivery), then close each of ``closes``
        (``(task_id, status, code)``, innermost first: the attempt, the logical task when the
        framework has settled it). A task that owes no delivery has its delivery closed
        ``not_applicable/internal_task`` in the same change; a task in ``marks`` (``task_id ->
        (state, code)``, ``delivered`` or ``failed``: the job's own delivery mark) has its
        delivery closed so.

        Each step is judged on its own and one the ledger refuses changes nothing: a task
        closed already or missing, a clock behind its stored times, a code that does not
        belong to the state, a queued attempt that exists already. The returned
        :class:`~task_state_guard.attempts.Ended` lists what was written; for the others,
        :meth:`close_task_settled`, :meth:`set_delivery` and :meth:`create_task` explain (or
        do it). ``InvalidInput`` (nothing written) for an id that is not one, a status that is
        not terminal, a name or timeout that is not valid.
        """
        marked = {} if marks is None else {canonical_id(k): v for k, v in marks.items()}
        rows: list[tuple[str, str, str | None, tuple[str, str | None] | None]] = []
        for task_id, status, code in closes:
            tid = canonical_id(task_id)
            state = check_state(status, TERMINAL_STATES, "terminal task status")
            reason = check_code_shape(code)
            mark = marked.get(tid)
            if mark is not None:
                mstate = check_state(mark[0], DELIVERY_CLOSED, "delivery status")
                mcode = check_code_shape(mark[1])
                if mstate == "not_applicable" or (
                    mcode is not None and mcode not in DELIVERY_CODES[mstate]
                ):
                    continue  # left to set_delivery, which explains
                mark = (mstate, mcode)
            if reason is None or reason in TASK_CODES[state]:
                rows.append((tid, state, reason, mark))
        queued: list[tuple[str, str, str | None, float | None]] = []
        for attempt, parent, name, timeout in queue:
            queued.append((
                canonical_id(attempt), canonical_id(parent, "parent id"), check_name(name),
                None if timeout is None else check_seconds(
                    timeout, "timeout_seconds", allow_zero=True, maximum=None),
            ))
        if not rows and not queued:
            return attempts.Ended(frozenset(), frozenset(), frozenset())
        if self._db.read_only:
            raise StorageError("the ledger was opened read-only", reason=r.READ_ONLY_LEDGER)
        return self._db.end_attempt(attempts.End(tuple(rows), tuple(queued)))

    # ----------------------------------------------------------------- reads
    def get_task(self, task_id: str | uuid.UUID) -> Task:
        """Return one task."""
        return task_list.get_task(self._db, canonical_id(task_id), row_to_task)

    def children_of(self, task_id: str | uuid.UUID, *, limit: int | None = None) -> list[Task]:
        """Return the direct children of a task, oldest first (the first ``limit`` only, when
        given)."""
        return task_list.children_of(self._db, canonical_id(task_id), row_to_task, limit)

    def find_task_ids(
        self, status: str, *, stale_seconds: float | None = None, limit: int | None = None,
        name: str | None = None, older_than_seconds: float | None = None,
        task_id: str | uuid.UUID | None = None,
    ) -> list[str]:
        """Return ids of tasks in ``status`` (attempts included), oldest first; with
        ``stale_seconds`` only those idle that long, with ``name`` only that label, with
        ``older_than_seconds`` only those created that long ago, with ``task_id`` only that
        task and its direct children.

        Idle time counts from the last heartbeat or start (running), creation (queued) or the
        last change (terminal).
        """
        return task_list.find_task_ids(
            self._db, status, stale_seconds=stale_seconds, limit=limit, name=name,
            older_than_seconds=older_than_seconds, task_id=task_id)

    def list_tasks(
        self,
        *,
        status: str | None = None,
        name: str | None = None,
        attempts: bool = False,
        stale_seconds: float | None = None,
        older_than_seconds: float | None = None,
        limit: int = task_list.DEFAULT_LIMIT,
        task_id: str | uuid.UUID | None = None,
        order: str = "created",
        descending: bool = False,
        after: str | None = None,
    ) -> task_list.TaskListing:
        """List tasks for operators, oldest first (ids on purpose: protect the output).

        Tasks by default: the jobs (roots, and children that owe their own delivery, such as
        a LangGraph resume or recovery run); with ``attempts=True`` the attempts (children
        that owe nobody a delivery). ``status`` defaults to every active task (queued or
        running); ``name`` matches the label exactly; ``stale_seconds`` keeps tasks idle that
        long (no heartbeat or start while running, since creation while queued, since the
        close once terminal); ``older_than_seconds`` keeps tasks created that long ago;
        ``task_id`` keeps only that task (with ``attempts=True``: its attempts), in any state
        unless ``status`` is given (the id of a framework job:
        :func:`task_state_guard.integration.job_task_id`). At most ``limit`` rows (default
        100); ``more`` says whether others matched.

        ``order`` sorts by ``created`` (the ledger's creation order, the default),
        ``activity`` (the last sign of life: longest idle first), ``name`` or ``status``,
        ties in creation order; ``descending`` reverses the whole order, ties included.
        ``after`` is a row's ``cursor`` from an earlier listing with the same order: the rows
        after it (the next page).
        """
        return task_list.list_tasks(
            self._db, TASK_COLUMNS, row_to_task, status=status, name=name, attempts=attempts,
            stale_seconds=stale_seconds, older_than_seconds=older_than_seconds, limit=limit,
            task_id=None if task_id is None else canonical_id(task_id),
            order=order, descending=descending, after=after,
        )

    def events_of(self, task_id: str | uuid.UUID) -> list[_events.TaskEvent]:
        """The task's recorded state changes, oldest first (``TaskNotFound`` when unknown).

        Each :class:`~task_state_guard.events.TaskEvent` holds only the kind, the state, the
        reason code and the time; heartbeats write no event.
        """
        return _events.events_of(self._db, canonical_id(task_id))

    # ----------------------------------------------------------------- aggregates
    def reconcile(
        self,
        policy: _reconcile.ReconcilePolicy | None = None,
        *,
        active_grace_seconds: float | None = None,
        delivery_grace_seconds: float | None = None,
        dry_run: bool = False,
        on_decision: _reconcile.DecisionCallback | None = None,
        progress: _reconcile.ProgressCallback | None = None,
    ) -> dict[str, Any]:
        """Reconcile stale state; see :func:`task_state_guard.reconcile_restart`.

        Give the graces as keywords (as in 0.1.0) or as a ``ReconcilePolicy``, not both; a
        grace left out is 600 s. ``on_decision`` receives each task the pass closed or whose
        delivery it closed (a :class:`~task_state_guard.reconcile.ReconcileDecision`); the
        returned report stays counts only. ``progress(done, total)`` is called with the open
        tasks examined so far, before the first batch and after each (counts only).
        """
        graces = {
            key: value
            for key, value in (
                ("active_grace_seconds", active_grace_seconds),
                ("delivery_grace_seconds", delivery_grace_seconds),
            )
            if value is not None
        }
        if policy is not None and graces:
            raise InvalidInput("pass either a policy or grace keywords, not both")
        if policy is None:
            policy = _reconcile.ReconcilePolicy(**graces)
        return _reconcile.run_reconcile(
            self._db, policy, dry_run=dry_run, on_decision=on_decision, progress=progress
        )

    # ----------------------------------------------------------------- verdict outbox
    def claim_verdicts(
        self,
        framework: str,
        *,
        limit: int = 100,
        lease_seconds: float = 60.0,
        task_ids: Iterable[str | uuid.UUID] | None = None,
    ) -> list[_verdicts.Verdict]:
        """Claim up to ``limit`` pending lost-job verdicts owed to ``framework`` (``celery``,
        ``dramatiq``, ``langgraph``), oldest first, with a lease of ``lease_seconds`` during
        which no other claim gets them (an expired lease can be claimed again); ``task_ids``
        restricts the claim to those logical tasks. Publish each, then
        :meth:`mark_verdicts_published` (or :meth:`release_verdicts`). See
        :mod:`task_state_guard.verdicts`; the returned objects carry ids (in-process only).
        """
        return _verdicts.claim(
            self._db, framework, limit=limit, lease_seconds=lease_seconds, task_ids=task_ids
        )

    def mark_verdicts_published(self, task_ids: Iterable[str | uuid.UUID]) -> int:
        """Mark the pending verdicts of these logical tasks published; returns how many changed
        (an already published one is left as it is, so a repeat changes nothing)."""
        return _verdicts.mark_published(self._db, task_ids)

    def release_verdicts(self, verdicts: Iterable[_verdicts.Verdict]) -> int:
        """Give claimed verdicts back unpublished, so the next drain takes them at once (only
        while the lease is still the one they were claimed with); returns how many."""
        return _verdicts.release(self._db, verdicts)

    def doctor(self) -> dict[str, Any]:
        """Check the ledger's health; counts only."""
        return self._db.doctor()

    def status(self, *, active_grace_seconds: float | None = None) -> dict[str, Any]:
        """Counts by state, delivery state and name, and the age of the oldest work (no ids)."""
        return _status.collect_status(self._db, active_grace_seconds=active_grace_seconds)

    def outcome_history(
        self, *, window_seconds: float = 86400.0, buckets: int = 24
    ) -> _history.OutcomeHistory:
        """Logical tasks closed over the last ``window_seconds``, per bucket and outcome
        (``succeeded``, ``failed``, ``lost``, ``timed_out``, ``cancelled``); counts only."""
        return _history.outcome_history(self._db, window_seconds=window_seconds, buckets=buckets)

    def prune(
        self, older_than_seconds: float, *, dry_run: bool = False,
        progress: _prune.ProgressCallback | None = None,
    ) -> dict[str, Any]:
        """Delete closed task trees whose latest change is older than the cut-off.

        ``progress(done, total)`` is called with the closed roots examined so far, before the
        first batch and after each (counts only).
        """
        return _prune.prune(self._db, older_than_seconds, dry_run=dry_run, progress=progress)

    def storage_info(self) -> dict[str, Any]:
        """Describe the storage in force (no paths, no credentials): for SQLite the permission
        model (``posix_mode`` or ``external_acl``), journal mode, foreign keys and busy
        timeout, and more."""
        return self._db.storage_info()


__all__ = ["TASK_COLUMNS", "Ledger", "LedgerError", "row_to_task"]
