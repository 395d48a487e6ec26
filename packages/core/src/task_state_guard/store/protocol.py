"""The storage protocol every ledger backend provides, and the validated clock.

:class:`~task_state_guard.ledger.Ledger` owns one object of this protocol and hands it every
transition as a step it runs with its own SQL; the aggregates (reconcile, prune, status,
doctor) receive the same object and never reach into the ledger. The SQLite backend
(``task_state_guard.sqlite``) and the PostgreSQL backend (``task_state_guard_postgres``) each
provide one.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol, overload

from ..model import InvalidInput, Liveness
from . import attempts, transitions
from .queries import Queries

_FLOAT_MAX = sys.float_info.max


def read_clock(clock: Callable[[], float]) -> float:
    """Read ``clock``; a non-number, non-finite or negative reading is ``InvalidInput``."""
    value = clock()
    if type(value) is float and 0.0 <= value <= _FLOAT_MAX:  # the usual reading, at once
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidInput("clock returned a non-number")
    now = float(value)
    if not math.isfinite(now) or now < 0:
        raise InvalidInput("clock returned an invalid time")
    return now


@dataclass(frozen=True, slots=True)
class Layout:
    """A ledger's layout: ``version``, the schema version it stores (None: not yet opened, or
    not a ledger this release knows); ``current``, the version its backend writes (each backend
    versions its own layout); ``has_outbox``, whether it has the verdict outbox (an older
    layout a read-only open reads in place has none: it owes no verdicts); ``has_threads``,
    whether its tasks have the thread column (an older layout stores and finds no thread)."""

    version: int | None
    current: int
    has_outbox: bool
    has_threads: bool = False

    @classmethod
    def of(cls, version: int | None, current: int, first_with_outbox: int,
           first_with_threads: int) -> Layout:
        """The layout of a ledger at ``version`` of a backend that writes ``current`` and
        added the outbox in ``first_with_outbox``, the thread column in
        ``first_with_threads``."""
        known = version is not None and version <= current
        return cls(version, current,
                   known and first_with_outbox <= (version or 0),
                   known and first_with_threads <= (version or 0))


@dataclass(frozen=True, slots=True)
class Opened:
    """What a database object opened: ``path``, where the ledger lives (a SQLite file's real
    path, symbolic links resolved once the first open found it; a PostgreSQL URL without its
    password), and ``read_only``, whether it was opened so that no write is allowed."""

    path: str
    read_only: bool


class Owners(Protocol):
    """Owner liveness: a process that starts a task records its token; a probe of the token
    tells whether that process still lives (SQLite: lock files beside the database;
    PostgreSQL: session-level advisory locks)."""

    def own(self) -> str:
        """This process's owner token, its liveness lock taken on first use."""
        ...

    def held(self) -> str | None:
        """This process's owner token if it holds one already, else None."""
        ...

    def supervise(self) -> str:
        """Make this process the owner of what the children it forks from now on start: they
        record its token instead of one of their own, so their work is provably lost only when
        this process is gone. For a pool's main process that reports every end of its
        children's work (a lost child's included). Returns the token; idempotent."""
        ...

    def probe(self, token: str) -> Liveness:
        """Whether the process holding ``token`` is alive, provably dead, or unknown."""
        ...

    def cleanup(self, is_referenced: Callable[[str], bool]) -> None:
        """Drop what dead owners left behind (lock files); best effort."""
        ...


class Health(Protocol):
    """A backend's probes of its own storage, the reads only it can make (SQLite: PRAGMAs and
    ``quick_check`` on the file; PostgreSQL: the migration record, ``information_schema`` and
    the triggers): how healthy what it stores is, and what storage it runs on. The rules and
    the report are the core's (:mod:`task_state_guard.ops.doctor`); each backend supplies its
    dialect, its integrity and layout checks, and its storage facts."""

    def doctor(self) -> dict[str, Any]:
        """The counts-only health report (:func:`task_state_guard.ops.doctor.report`'s keys):
        the core's rules run on the ledger with this backend's probes."""
        ...

    def storage(self) -> dict[str, Any]:
        """The storage in force (no paths, no credentials)."""
        ...


class Database(Protocol):
    """What the ledger and its aggregates need from a storage backend.

    A guarded write runs inside the backend (:meth:`transition`), and so does a read of one
    task (:attr:`queries`). The units of work the core drives over several statements hold a
    transaction the backend opens: :meth:`read` (status's snapshot, the listings, dry runs),
    :meth:`write` and :meth:`group` (the verdict outbox, prune's batches), :meth:`bulk`
    around the writes of a pass (reconcile, prune). No call names an engine's tuning: the
    one step of a unit of work that differs by engine, prune's
    :meth:`~task_state_guard.store.queries.Queries.hold_for_delete`, stays a step because
    the core judges the trees again between the hold and the delete.
    """

    @property
    def opened(self) -> Opened:
        """Where the ledger lives and whether this object may write to it."""
        ...

    def now(self) -> float:
        """A validated reading of the ledger's clock (finite, not negative)."""
        ...

    def read(self) -> AbstractContextManager[Any]:
        """One read transaction whose snapshot is fixed before the caller reads the clock;
        nothing run in it can write (a dry run is a read)."""
        ...

    def write(self) -> AbstractContextManager[Any]:
        """One write transaction (joined when a group is open); commit or roll back."""
        ...

    def group(self) -> AbstractContextManager[None]:
        """Group the writes of this thread into one transaction (nested use joins it)."""
        ...

    def bulk(self) -> AbstractContextManager[None]:
        """Mark this thread's write transactions meanwhile as one pass (reconcile's, prune's
        batches), a unit of work the core drives. The backend, not the caller, decides what a
        pass needs: SQLite's writer gets a larger page cache and rarer checkpoints (its write
        transaction already holds the whole database); PostgreSQL takes the schema's pass lock
        when each transaction begins, before the pass reads the clock (so it cannot be taken
        lazily by a statement), and a reconcile batch holds the open rows it reads."""
        ...

    @property
    def layout(self) -> Layout:
        """The ledger's layout as opened (after any migration this object ran)."""
        ...

    @property
    def queries(self) -> Queries:
        """Every other statement, in the backend's own dialect: the operator's reads (a task,
        its children, its events, listings), the aggregates' reads (status, history, doctor's
        parent lookup), and the writes of reconcile, prune and the verdict outbox."""
        ...

    @overload
    def transition(self, spec: attempts.Begin) -> str | None: ...

    @overload
    def transition(self, spec: attempts.End) -> attempts.Ended: ...

    @overload
    def transition(self, spec: attempts.Boundary) -> tuple[attempts.Ended, str | None]: ...

    @overload
    def transition(self, spec: transitions.Step) -> transitions.Outcome: ...

    def transition(
        self, spec: transitions.Step | attempts.Begin | attempts.End | attempts.Boundary
    ) -> transitions.Outcome | str | attempts.Ended | tuple[attempts.Ended, str | None] | None:
        """One guarded write of the ledger's domain, run with the backend's own SQL:

        - a one-task step (:mod:`task_state_guard.store.transitions`) in a write transaction (its
          own, or the open group's) whose clock is read once the task is locked: its
          ``Outcome``; on a refusal the outcome carries the row that transaction read, to
          explain it;
        - *begin attempt* (:class:`~task_state_guard.store.attempts.Begin`) as one write (its own
          transaction, or the open group's): the attempt's id, or None when a step was refused
          (the ledger then explains it);
        - *end attempt* (:class:`~task_state_guard.store.attempts.End`) as one write (its own
          transaction, or the open group's): what it wrote;
        - a :class:`~task_state_guard.store.attempts.Boundary` (an *end attempt* and then a *begin
          attempt*) as one write: what the end wrote, and the attempt begun (None when the
          begin was refused: it left nothing, the end still commits).
        """
        ...

    @property
    def owners(self) -> Owners:
        """Owner liveness: this process's token, and whether another token's process lives."""
        ...

    @property
    def health(self) -> Health:
        """What the backend reads about its own storage: doctor's report and the storage in
        force."""
        ...

    def close(self) -> None:
        """Close every connection this process opened."""
        ...


__all__ = ["Database", "Health", "Layout", "Opened", "Owners", "read_clock"]
