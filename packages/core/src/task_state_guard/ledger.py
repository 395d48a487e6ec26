"""The Ledger: the public facade over one store (SQLite or PostgreSQL).

Every transition is validated and explained in :mod:`task_state_guard.writes` and run by the
store with its own SQL; reads and aggregates run in their own modules. Each method's full
contract (arguments, errors, idempotence) is in ``docs/core-api.md``.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from . import writes
from .model import LedgerError, Task, canonical_id
from .ops import events as _events
from .ops import history as _history
from .ops import job_state as _job_state
from .ops import prune as _prune
from .ops import reconcile as _reconcile
from .ops import status as _status
from .ops import task_list
from .ops import verdicts as _verdicts
from .store import attempts, backends
from .store import protocol as store
from .store.transitions import TASK_COLUMNS, row_to_task


class Ledger:
    """An embedded SQLite task ledger (or, given a ``postgresql://`` URL, a PostgreSQL one).

    Safe to share between threads (one connection per thread, opened lazily) and to use from
    many processes at once; a connection is never reused across ``fork()``.
    """

    #: The schema version this release writes (older known layouts migrate to it on open). On
    #: an instance it is its backend's: a PostgreSQL ledger versions its own layout.
    SCHEMA_VERSION: int = backends.SQLITE_SCHEMA_VERSION

    def __init__(
        self, path: str | os.PathLike[str], *, clock: Callable[[], float] | None = None,
        busy_timeout_ms: int = 5000, allow_external_acl: bool = False, read_only: bool = False,
        snapshot_max_bytes: int = 1 << 30, transient_sidecars: bool = True, create: bool = True,
        connections: int | None = None, _check_schema: bool = True,
        _verify_integrity: bool = False,
    ) -> None:
        """Open (with ``read_only=False``: create or migrate) the ledger at ``path``.

        ``create=False`` opens an existing ledger (migrating it when needed) but never creates
        one: a missing database or directory is ``InvalidInput`` (``database_missing``,
        ``directory_missing``). ``read_only=True`` never creates, migrates or writes anything:
        a live ledger is read through SQLite's read-only WAL access, a closed one in place
        (``transient_sidecars``: private WAL/SHM files removed on close) or, with
        ``transient_sidecars=False``, as a verified in-memory snapshot of at most
        ``snapshot_max_bytes``. ``connections`` (1 to 64): the statement connections this
        process keeps for a PostgreSQL ledger whose URL has no ``connections=`` (None: one);
        a SQLite ledger ignores it. ``docs/core-api.md`` has every mode and error.
        """
        self._db: store.Database = backends.open_store(
            path, clock=time.time if clock is None else clock, busy_timeout_ms=busy_timeout_ms,
            allow_external_acl=allow_external_acl, read_only=read_only,
            transient_sidecars=transient_sidecars, snapshot_max_bytes=snapshot_max_bytes,
            check_schema=_check_schema, create=create, verify_integrity=_verify_integrity,
            connections=connections)
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
        """Group several transitions into one transaction: all commit, or none (a transition
        that raises inside changed nothing itself). Nested use joins the outer one."""
        with self._db.group():
            yield self

    # ----------------------------------------------------------------- transitions
    def create_task(
        self, *, task_id: str | uuid.UUID | None = None, parent_id: str | uuid.UUID | None = None,
        timeout_seconds: float | None = None, delivery_required: bool = True,
        name: str | None = None, payload_hash: str | None = None,
        framework_id: str | uuid.UUID | None = None, framework: str | None = None,
    ) -> Task:
        """Create a queued task; with an explicit ``task_id`` an identical repeat is a no-op.

        ``framework_id``: the framework's own id of the job (a Celery task id, a Dramatiq
        message id), so that an operator can map the task back; only a canonical UUID is
        accepted (any other id may carry user data and is never stored). ``framework``: the
        adapter opening the job (a close declaring it lost owes that framework a verdict).
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

        ``redelivery_seconds``: for an attempt whose broker redelivers the job if its worker
        dies, how long after its last sign of life that may still happen (reconcile keeps the
        logical task fresh that long once the attempt is lost).
        """
        task = writes.start(self._db, task_id, owner=owner,
                            redelivery_seconds=redelivery_seconds, full=True)
        assert task is not None
        return task

    def supervise_children(self) -> None:
        """Make this process the owner of the tasks that processes it forks from now on start
        with an owner: they record this process's liveness token instead of their own, so
        reconcile finds their work lost only when this process is gone. For a pool's main
        process that reports every end of its children's work, a lost child's included (it
        then reports it before any reconcile can). Idempotent; call it before each fork."""
        writes.supervise(self._db)

    def heartbeat(self, task_id: str | uuid.UUID) -> Task:
        """Record that a running task is alive (no event is written); returns the task."""
        return writes.heartbeat(self._db, task_id)

    def heartbeat_many(self, task_ids: Iterable[str | uuid.UUID]) -> int:
        """Heartbeat every running task among ``task_ids`` in one transaction (the others are
        skipped); returns how many were refreshed."""
        return writes.heartbeat_many(self._db, task_ids)

    def close_task(self, task_id: str | uuid.UUID, status: str, *, code: str | None = None) -> Task:
        """Close a queued or running task with a terminal ``status`` (and a reason ``code``).

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
        in the same statement. An identical repeat closes such a delivery still pending; any
        other refusal raises as :meth:`close_task` does and changes nothing."""
        return writes.close_settled(self._db, task_id, status, code)

    def set_delivery(
        self, task_id: str | uuid.UUID, status: str, *, code: str | None = None
    ) -> Task:
        """Close the delivery of a terminal task (``delivered``, ``failed`` or
        ``not_applicable``; before the task is terminal: ``StateConflict``); repeating the same
        state is a no-op."""
        return writes.set_delivery(self._db, task_id, status, code)

    # ----------------------------------------------------------------- a guarded job's writes
    def begin_attempt(
        self, logical_id: str | uuid.UUID, *, name: str | None = None,
        delivery_required: bool = False, framework_id: str | uuid.UUID | None = None,
        framework: str | None = None, open_logical: bool = True, logical_owner: bool = False,
        candidates: Iterable[tuple[str | uuid.UUID, bool]] = (),
        attempt_id: str | uuid.UUID | None = None, timeout_seconds: float | None = None,
        redelivery_seconds: float | None = None, parent_id: str | uuid.UUID | None = None,
        attempt: bool = True, thread_id: str | None = None,
    ) -> str:
        """A guarded job's first write, committed before its body runs (SQLite: one
        transaction; PostgreSQL: one statement); returns the attempt's id.

        With ``open_logical`` the logical task is created when missing and started when queued
        (owned by this process with ``logical_owner``); one recorded earlier with other
        attributes, or started or closed already, is left as it is. The attempt (a child owing
        no delivery, owned by this process) is the first of ``candidates`` (``(id, create)``: a
        queued placeholder such as a scheduled retry's, recorded first when ``create``) that
        can still be started, else a new one, ``attempt_id`` (random when None).
        ``TaskNotFound``: the logical task does not exist; ``StateConflict``: ``attempt_id``
        exists and is not queued. ``attempt=False``: the logical task alone (under
        ``parent_id``), :meth:`create_task` then :meth:`start_task` in one write, with their
        errors; returns its id. ``thread_id`` (``attempt=False``, a delivering task only): the
        framework's thread of the task (a LangGraph thread id: 1-256 printable characters),
        stored with it where the layout has the column (:meth:`find_task_ids` finds a
        thread's tasks).
        """
        return writes.begin_attempt(
            self._db, logical_id, name=name, delivery_required=delivery_required,
            fid=framework_id, framework=framework, open_logical=open_logical,
            logical_owner=logical_owner, candidates=candidates, attempt_id=attempt_id,
            timeout_seconds=timeout_seconds, redelivery_seconds=redelivery_seconds,
            parent_id=parent_id, attempt=attempt, thread_id=thread_id)

    def end_and_begin_attempt(
        self, closes: Iterable[tuple[str | uuid.UUID, str, str | None]],
        logical_id: str | uuid.UUID, *, marks: Mapping[str, tuple[str, str | None]] | None = None,
        queue: Iterable[tuple[str | uuid.UUID, str | uuid.UUID, str | None, float | None]] = (),
        name: str | None = None, candidates: Iterable[tuple[str | uuid.UUID, bool]] = (),
        attempt_id: str | uuid.UUID | None = None, timeout_seconds: float | None = None,
        redelivery_seconds: float | None = None,
    ) -> tuple[attempts.Ended, str | None]:
        """A boundary between two attempts of ``logical_id`` (which exists) as one write
        (SQLite: one transaction; PostgreSQL: one statement): :meth:`end_attempt` of
        ``closes``, then :meth:`begin_attempt` of the next attempt with ``open_logical=False``.
        Returns what the end wrote and the attempt begun; None when the begin was refused (it
        wrote nothing, the end still commits; :meth:`begin_attempt` explains it)."""
        return writes.end_and_begin_attempt(
            self._db, closes, marks, queue, logical_id, name=name, candidates=candidates,
            attempt_id=attempt_id, timeout_seconds=timeout_seconds,
            redelivery_seconds=redelivery_seconds)

    def end_attempt(
        self, closes: Iterable[tuple[str | uuid.UUID, str, str | None]], *,
        marks: Mapping[str, tuple[str, str | None]] | None = None,
        queue: Iterable[tuple[str | uuid.UUID, str | uuid.UUID, str | None, float | None]] = (),
        if_queued: Iterable[str | uuid.UUID] = (),
    ) -> attempts.Ended:
        """A guarded job's second write (SQLite: one transaction; PostgreSQL: one statement).

        Records each of ``queue`` (``(task_id, parent_id, name, timeout_seconds)``: a scheduled
        retry's queued attempt), then closes each of ``closes`` (``(task_id, status, code)``,
        innermost first: the attempt, then the logical task once the framework settled it); a
        task owing no delivery has it closed ``not_applicable/internal_task`` in the same
        change, a task in ``marks`` (``task_id -> (state, code)``) has its delivery closed so.
        Each step is judged on its own and a refused one changes nothing; the returned
        :class:`~task_state_guard.store.attempts.Ended` lists what was written
        (:meth:`close_task_settled`, :meth:`set_delivery` and :meth:`create_task` explain the
        others). The closes of the tasks named in ``if_queued`` are written first and apply
        only while the task is still queued: work that was never started is closed (e.g.
        ``cancelled/skipped``) without ever closing one that started meanwhile, which is left
        running and not listed as closed. ``InvalidInput`` (nothing written) for a malformed
        id, a status that is not terminal, a name or timeout that is not valid.
        """
        return writes.end_attempt(self._db, closes, marks, queue, if_queued)

    # ----------------------------------------------------------------- reads
    def get_task(self, task_id: str | uuid.UUID) -> Task:
        """Return one task (``TaskNotFound`` when unknown)."""
        return task_list.get_task(self._db, canonical_id(task_id), row_to_task)

    def children_of(self, task_id: str | uuid.UUID, *, limit: int | None = None) -> list[Task]:
        """The direct children of a task, oldest first (the first ``limit`` only, when
        given)."""
        return task_list.children_of(self._db, canonical_id(task_id), row_to_task, limit)

    def find_task_ids(
        self, status: str | None, *, stale_seconds: float | None = None,
        limit: int | None = None, name: str | None = None,
        older_than_seconds: float | None = None, task_id: str | uuid.UUID | None = None,
        thread_id: str | None = None,
    ) -> list[str]:
        """Ids of tasks in ``status`` (attempts included), oldest first; with ``stale_seconds``
        only those idle that long, with ``name`` only that label, with ``older_than_seconds``
        only those created that long ago, with ``task_id`` only that task and its direct
        children, with ``thread_id`` only the tasks recorded with that framework thread (a
        LangGraph thread's runs; ``status`` None: in any state). Idle time counts from the last
        heartbeat or start (running), creation (queued) or the last change (terminal)."""
        return task_list.find_task_ids(
            self._db, status, stale_seconds=stale_seconds, limit=limit, name=name,
            older_than_seconds=older_than_seconds, task_id=task_id, thread_id=thread_id)

    def list_tasks(
        self, *, status: str | None = None, name: str | None = None, attempts: bool = False,
        stale_seconds: float | None = None, older_than_seconds: float | None = None,
        limit: int = task_list.DEFAULT_LIMIT, task_id: str | uuid.UUID | None = None,
        order: str = "created", descending: bool = False, after: str | None = None,
        contradicted: bool = False, code: str | None = None, framework: str | None = None,
        name_contains: str | None = None, flag: str | None = None, count: bool = False,
        thread_id: str | None = None,
    ) -> task_list.TaskListing:
        """List tasks (or, with ``attempts=True``, attempts) for operators: active ones by
        default, filtered as :meth:`find_task_ids`, ordered by ``order`` (``created``,
        ``activity``, ``name``, ``status``; ``descending`` reverses it), at most ``limit`` rows
        a page, ``after`` a row's ``cursor`` from the previous page. ``contradicted``: only
        jobs, in any state unless ``status``, closed other than ``succeeded`` with an attempt
        that succeeded after the close (doctor's ``contradicted_close_count``), or, with
        ``attempts``, those attempts. ``code``: only that reason code (any state unless
        ``status``); ``framework``: only what that adapter opened; ``name_contains``: only
        names holding that text; ``flag``: only the tasks behind one of the status report's
        counts (``task_list.FLAGS``: ``past_deadline``, ``owner_dead``, ``awaiting_delivery``,
        ``verdict_pending``, ``verdict_published``); ``count``: also count the matches (up to
        ``task_list.COUNT_CAP``); ``thread_id``: only the tasks of that framework thread, in
        any state unless ``status``. Rows carry ids on purpose: protect the output."""
        return task_list.list_tasks(
            self._db, TASK_COLUMNS, row_to_task, status=status, name=name, attempts=attempts,
            stale_seconds=stale_seconds, older_than_seconds=older_than_seconds, limit=limit,
            task_id=None if task_id is None else canonical_id(task_id),
            order=order, descending=descending, after=after, contradicted=contradicted,
            code=code, framework=framework, name_contains=name_contains, flag=flag,
            count=count, thread_id=thread_id)

    def job_state(self, task_id: str | uuid.UUID) -> _job_state.JobState | None:
        """A job's lost verdict (none, pending, published) and whether the processes that
        own it and its running attempts are alive; None when no job has that id."""
        return _job_state.job_state(self._db, canonical_id(task_id))

    def events_of(self, task_id: str | uuid.UUID) -> list[_events.TaskEvent]:
        """The task's recorded state changes, oldest first (``TaskNotFound`` when unknown);
        each event holds only its kind, state, reason code and time (heartbeats write none)."""
        return _events.events_of(self._db, canonical_id(task_id))

    # ----------------------------------------------------------------- aggregates
    def reconcile(
        self, policy: _reconcile.ReconcilePolicy | None = None, *,
        active_grace_seconds: float | None = None, delivery_grace_seconds: float | None = None,
        dry_run: bool = False, on_decision: _reconcile.DecisionCallback | None = None,
        progress: _reconcile.ProgressCallback | None = None,
    ) -> dict[str, Any]:
        """Reconcile stale state (see :func:`task_state_guard.reconcile_restart`).

        Give the graces as keywords or as a ``ReconcilePolicy``, not both; a grace left out is
        600 s. The returned report is counts only; ``on_decision`` receives each task the pass
        closed or whose delivery it closed, ``progress(done, total)`` the open tasks examined
        so far (before the first batch and after each).
        """
        policy = _reconcile.policy_of(policy, active_grace_seconds, delivery_grace_seconds)
        return _reconcile.run_reconcile(
            self._db, policy, dry_run=dry_run, on_decision=on_decision, progress=progress)

    # ----------------------------------------------------------------- verdict outbox
    def claim_verdicts(
        self, framework: str, *, limit: int = 100, lease_seconds: float = 60.0,
        task_ids: Iterable[str | uuid.UUID] | None = None,
    ) -> list[_verdicts.Verdict]:
        """Lease up to ``limit`` pending lost-job verdicts owed to ``framework``, oldest first,
        for ``lease_seconds`` (no other claim gets them meanwhile; ``task_ids``: only those
        logical tasks'). Publish each, then :meth:`mark_verdicts_published` (or
        :meth:`release_verdicts`); the verdicts carry ids (in-process only)."""
        return _verdicts.claim(
            self._db, framework, limit=limit, lease_seconds=lease_seconds, task_ids=task_ids)

    def has_claimable_verdicts(self, framework: str) -> bool:
        """Whether a pending verdict owed to ``framework`` is free to claim now: a read (an
        index probe, ``LIMIT 1``) that writes nothing, for a publisher's periodic check before
        it claims."""
        return _verdicts.claimable(self._db, framework)

    def mark_verdicts_published(self, task_ids: Iterable[str | uuid.UUID]) -> int:
        """Mark these logical tasks' pending verdicts published; returns how many changed (a
        repeat changes nothing)."""
        return _verdicts.mark_published(self._db, task_ids)

    def release_verdicts(self, verdicts: Iterable[_verdicts.Verdict]) -> int:
        """Give claimed verdicts back unpublished while their lease holds, so the next claim
        takes them at once; returns how many."""
        return _verdicts.release(self._db, verdicts)

    def doctor(self) -> dict[str, Any]:
        """Check the ledger's health: its layout, the file's integrity and every rule a row,
        an event chain or a verdict must satisfy, as counts only (``healthy`` sums it up)."""
        return self._db.health.doctor()

    def status(self, *, active_grace_seconds: float | None = None) -> dict[str, Any]:
        """Counts by state, delivery state and name, and the age of the oldest work (no ids)."""
        return _status.collect_status(self._db, active_grace_seconds=active_grace_seconds)

    def outcome_history(self, *, window_seconds: float = 86400.0,
                        buckets: int = 24) -> _history.OutcomeHistory:
        """Logical tasks closed over the last ``window_seconds``, per bucket and outcome
        (``succeeded``, ``failed``, ``lost``, ``timed_out``, ``cancelled``); counts only."""
        return _history.outcome_history(self._db, window_seconds=window_seconds, buckets=buckets)

    def overview(self, *, active_grace_seconds: float | None = None,
                 window_seconds: float = 86400.0,
                 buckets: int = 24) -> tuple[dict[str, Any], _history.OutcomeHistory]:
        """:meth:`status` and :meth:`outcome_history` in one read of the ledger (one clock;
        on SQLite, one pass over the tasks for both): what the web view's overview shows."""
        return _status.collect_overview(self._db, active_grace_seconds=active_grace_seconds,
                                        window_seconds=window_seconds, buckets=buckets)

    def prune(
        self, older_than_seconds: float, *, dry_run: bool = False,
        progress: _prune.ProgressCallback | None = None,
    ) -> dict[str, Any]:
        """Delete closed task trees whose latest change is older than ``older_than_seconds``;
        the report is counts only, ``progress(done, total)`` gets the closed roots examined so
        far (before the first batch and after each)."""
        return _prune.prune(self._db, older_than_seconds, dry_run=dry_run, progress=progress)

    def storage_info(self) -> dict[str, Any]:
        """Describe the storage in force (no paths, no credentials): for SQLite the permission
        model, journal mode, foreign keys, busy timeout and more (``docs/core-api.md``)."""
        return self._db.health.storage()


__all__ = ["TASK_COLUMNS", "Ledger", "LedgerError", "row_to_task"]
