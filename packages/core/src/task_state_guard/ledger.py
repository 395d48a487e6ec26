"""The Ledger: the public facade over one store (SQLite or PostgreSQL).

Every transition is validated and explained in :mod:`task_state_guard.writes` and run by the
store (``Database.transition``: a one-task step, *begin attempt*, *end attempt*) with its own
SQL; reads and aggregates run in their own modules.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from . import attempts, backends, store, task_list, writes
from . import events as _events
from . import history as _history
from . import prune as _prune
from . import reconcile as _reconcile
from . import status as _status
from . import verdicts as _verdicts
from .model import (
    InvalidInput,
    LedgerError,
    Task,
    canonical_id,
)
from .sqlite import schema
from .transitions import TASK_COLUMNS, row_to_task


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
        with self._db.read():  # connect and run every safety check (and migration) now
            pass
        self.SCHEMA_VERSION = self._db.layout.current

    # ----------------------------------------------------------------- connections
    @property
    def path(self) -> str:
        """Absolute path of the database file (a PostgreSQL URL without its password)."""
        return self._db.opened.path

    @property
    def read_only(self) -> bool:
        """True when this ledger was opened with ``read_only=True``."""
        return self._db.opened.read_only

    @property
    def schema_version(self) -> int | None:
        """The schema version of the file (after any migration this ledger ran)."""
        return self._db.layout.version

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
        task = writes.create(self._db, task_id, parent_id, timeout_seconds, delivery_required,
                             name, payload_hash, framework_id, quiet=False, framework=framework)
        assert isinstance(task, Task)
        return task

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
        task = writes.start(self._db, task_id, owner=owner,
                            redelivery_seconds=redelivery_seconds, full=True)
        assert task is not None
        return task

    def heartbeat(self, task_id: str | uuid.UUID) -> Task:
        """Record that a running task is alive (no event is written)."""
        return writes.heartbeat(self._db, task_id)

    def heartbeat_many(self, task_ids: Iterable[str | uuid.UUID]) -> int:
        """Heartbeat every running task among ``task_ids`` in one transaction; return the count."""
        return writes.heartbeat_many(self._db, task_ids)

    def close_task(self, task_id: str | uuid.UUID, status: str, *, code: str | None = None) -> Task:
        """Close a queued or running task.

        Repeating the same terminal state is a no-op whatever ``code`` the repeat passes: it
        returns the stored task unchanged, its stored code included; another terminal state is
        a ``StateConflict``.
        """
        return writes.close(self._db, task_id, status, code)

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
        return writes.close_settled(self._db, task_id, status, code)

    def set_delivery(
        self, task_id: str | uuid.UUID, status: str, *, code: str | None = None
    ) -> Task:
        """Close the delivery of a terminal task; repeating the same state is a no-op."""
        return writes.set_delivery(self._db, task_id, status, code)

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
        return writes.begin_attempt(
            self._db, logical_id, name=name, delivery_required=delivery_required,
            fid=framework_id, framework=framework, open_logical=open_logical,
            logical_owner=logical_owner, candidates=candidates, attempt_id=attempt_id,
            timeout_seconds=timeout_seconds, redelivery_seconds=redelivery_seconds,
        )

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
        return writes.end_attempt(self._db, closes, marks, queue)

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
        return self._db.health.doctor()

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
        return self._db.health.storage()


__all__ = ["TASK_COLUMNS", "Ledger", "LedgerError", "row_to_task"]
