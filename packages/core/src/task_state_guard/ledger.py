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
from .ops import prune as _prune
from .ops import reconcile as _reconcile
from .ops import status as _status
from .ops import task_list
from .ops import verdicts as _verdicts
from .store import attempts, backends
from .store import protocol as store
from .store.transitions import TASK_COLUMNS, row_to_task


class Ledger:
    """An embedded SQLite task ledger (or, given a ``postgresql://`` URL, a PostgreSQL one),
    safe to share between threads and processes (no connection is reused across ``fork()``)."""

    #: The schema version this release writes (older known layouts migrate to it on open). On
    #: an instance it is its backend's: a PostgreSQL ledger versions its own layout.
    SCHEMA_VERSION: int = backends.SQLITE_SCHEMA_VERSION

    def __init__(
        self, path: str | os.PathLike[str], *, clock: Callable[[], float] | None = None,
        busy_timeout_ms: int = 5000, allow_external_acl: bool = False, read_only: bool = False,
        snapshot_max_bytes: int = 1 << 30, transient_sidecars: bool = True, create: bool = True,
        _check_schema: bool = True, _verify_integrity: bool = False,
    ) -> None:
        """Open (and, unless ``read_only``, create or migrate) the ledger at ``path``;
        ``create=False`` never creates one. The read modes are in ``docs/core-api.md``."""
        self._db: store.Database = backends.open_store(
            path, clock=time.time if clock is None else clock, busy_timeout_ms=busy_timeout_ms,
            allow_external_acl=allow_external_acl, read_only=read_only,
            transient_sidecars=transient_sidecars, snapshot_max_bytes=snapshot_max_bytes,
            check_schema=_check_schema, create=create, verify_integrity=_verify_integrity)
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
        ``framework``: the adapter opening it (a close declaring it lost owes it a verdict)."""
        task = writes.create(self._db, task_id, parent_id, timeout_seconds, delivery_required,
                             name, payload_hash, framework_id, quiet=False, framework=framework)
        assert isinstance(task, Task)
        return task

    def start_task(
        self, task_id: str | uuid.UUID, *, owner: bool = True,
        redelivery_seconds: float | None = None,
    ) -> Task:
        """Move a queued task to running; ``owner=True`` records this process as its owner
        (``redelivery_seconds``: how long the broker may still redeliver it after a death)."""
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
        """Close a queued or running task; the same terminal state again is a no-op (the
        stored task, its code included), another one a ``StateConflict``."""
        return writes.close(self._db, task_id, status, code)

    def close_task_settled(
        self, task_id: str | uuid.UUID, status: str, *, code: str | None = None
    ) -> Task:
        """:meth:`close_task`, and in the same statement the delivery of a task that owes
        none (``not_applicable/internal_task``), also on an identical repeat."""
        return writes.close_settled(self._db, task_id, status, code)

    def set_delivery(
        self, task_id: str | uuid.UUID, status: str, *, code: str | None = None
    ) -> Task:
        """Close the delivery of a terminal task; repeating the same state is a no-op."""
        return writes.set_delivery(self._db, task_id, status, code)

    # ----------------------------------------------------------------- a guarded job's writes
    def begin_attempt(
        self, logical_id: str | uuid.UUID, *, name: str | None = None,
        delivery_required: bool = False, framework_id: str | uuid.UUID | None = None,
        framework: str | None = None, open_logical: bool = True, logical_owner: bool = False,
        candidates: Iterable[tuple[str | uuid.UUID, bool]] = (),
        attempt_id: str | uuid.UUID | None = None, timeout_seconds: float | None = None,
        redelivery_seconds: float | None = None, parent_id: str | uuid.UUID | None = None,
        attempt: bool = True,
    ) -> str:
        """A guarded job's first write, before its body runs (one transaction or statement):
        open the logical task, then start the attempt (the first startable of ``candidates``,
        else ``attempt_id`` or a new one); returns its id. ``attempt=False``: the logical task
        alone (under ``parent_id``), created and started in one write; returns its id."""
        return writes.begin_attempt(
            self._db, logical_id, name=name, delivery_required=delivery_required,
            fid=framework_id, framework=framework, open_logical=open_logical,
            logical_owner=logical_owner, candidates=candidates, attempt_id=attempt_id,
            timeout_seconds=timeout_seconds, redelivery_seconds=redelivery_seconds,
            parent_id=parent_id, attempt=attempt)

    def end_and_begin_attempt(
        self, closes: Iterable[tuple[str | uuid.UUID, str, str | None]],
        logical_id: str | uuid.UUID, *, marks: Mapping[str, tuple[str, str | None]] | None = None,
        queue: Iterable[tuple[str | uuid.UUID, str | uuid.UUID, str | None, float | None]] = (),
        name: str | None = None, candidates: Iterable[tuple[str | uuid.UUID, bool]] = (),
        attempt_id: str | uuid.UUID | None = None, timeout_seconds: float | None = None,
        redelivery_seconds: float | None = None,
    ) -> tuple[attempts.Ended, str | None]:
        """:meth:`end_attempt`, then :meth:`begin_attempt` (``open_logical=False``) as one
        write; returns what the end wrote and the attempt begun (None: the begin was refused
        and wrote nothing, the end still commits)."""
        return writes.end_and_begin_attempt(
            self._db, closes, marks, queue, logical_id, name=name, candidates=candidates,
            attempt_id=attempt_id, timeout_seconds=timeout_seconds,
            redelivery_seconds=redelivery_seconds)

    def end_attempt(
        self, closes: Iterable[tuple[str | uuid.UUID, str, str | None]], *,
        marks: Mapping[str, tuple[str, str | None]] | None = None,
        queue: Iterable[tuple[str | uuid.UUID, str | uuid.UUID, str | None, float | None]] = (),
    ) -> attempts.Ended:
        """A guarded job's second write (SQLite: one transaction; PostgreSQL: one statement):
        record ``queue`` (a scheduled retry's queued attempts), close ``closes`` innermost
        first with the deliveries nobody owes, and mark the deliveries in ``marks``. Each step
        is judged on its own; a refused one changes nothing. Returns what was written."""
        return writes.end_attempt(self._db, closes, marks, queue)

    # ----------------------------------------------------------------- reads
    def get_task(self, task_id: str | uuid.UUID) -> Task:
        """Return one task."""
        return task_list.get_task(self._db, canonical_id(task_id), row_to_task)

    def children_of(self, task_id: str | uuid.UUID, *, limit: int | None = None) -> list[Task]:
        """The direct children of a task, oldest first (the first ``limit`` only)."""
        return task_list.children_of(self._db, canonical_id(task_id), row_to_task, limit)

    def find_task_ids(
        self, status: str, *, stale_seconds: float | None = None, limit: int | None = None,
        name: str | None = None, older_than_seconds: float | None = None,
        task_id: str | uuid.UUID | None = None,
    ) -> list[str]:
        """Ids of tasks in ``status`` (attempts included), oldest first, filtered by idle time
        (``stale_seconds``), label, age, or one task and its direct children."""
        return task_list.find_task_ids(
            self._db, status, stale_seconds=stale_seconds, limit=limit, name=name,
            older_than_seconds=older_than_seconds, task_id=task_id)

    def list_tasks(
        self, *, status: str | None = None, name: str | None = None, attempts: bool = False,
        stale_seconds: float | None = None, older_than_seconds: float | None = None,
        limit: int = task_list.DEFAULT_LIMIT, task_id: str | uuid.UUID | None = None,
        order: str = "created", descending: bool = False, after: str | None = None,
    ) -> task_list.TaskListing:
        """List tasks (``attempts=True``: attempts) for operators, active ones by default,
        filtered, ordered and paged (``after``: a row's ``cursor``). Rows carry ids."""
        return task_list.list_tasks(
            self._db, TASK_COLUMNS, row_to_task, status=status, name=name, attempts=attempts,
            stale_seconds=stale_seconds, older_than_seconds=older_than_seconds, limit=limit,
            task_id=None if task_id is None else canonical_id(task_id),
            order=order, descending=descending, after=after)

    def events_of(self, task_id: str | uuid.UUID) -> list[_events.TaskEvent]:
        """The task's recorded state changes, oldest first (kind, state, code, time)."""
        return _events.events_of(self._db, canonical_id(task_id))

    # ----------------------------------------------------------------- aggregates
    def reconcile(
        self, policy: _reconcile.ReconcilePolicy | None = None, *,
        active_grace_seconds: float | None = None, delivery_grace_seconds: float | None = None,
        dry_run: bool = False, on_decision: _reconcile.DecisionCallback | None = None,
        progress: _reconcile.ProgressCallback | None = None,
    ) -> dict[str, Any]:
        """Reconcile stale state (:func:`task_state_guard.reconcile_restart`): graces as keywords
        or a ``ReconcilePolicy`` (600 s when left out); the report is counts only."""
        policy = _reconcile.policy_of(policy, active_grace_seconds, delivery_grace_seconds)
        return _reconcile.run_reconcile(
            self._db, policy, dry_run=dry_run, on_decision=on_decision, progress=progress)

    # ----------------------------------------------------------------- verdict outbox
    def claim_verdicts(
        self, framework: str, *, limit: int = 100, lease_seconds: float = 60.0,
        task_ids: Iterable[str | uuid.UUID] | None = None,
    ) -> list[_verdicts.Verdict]:
        """Lease up to ``limit`` pending lost-job verdicts owed to ``framework``, oldest first;
        publish each, then :meth:`mark_verdicts_published` (or :meth:`release_verdicts`)."""
        return _verdicts.claim(
            self._db, framework, limit=limit, lease_seconds=lease_seconds, task_ids=task_ids)

    def mark_verdicts_published(self, task_ids: Iterable[str | uuid.UUID]) -> int:
        """Mark these logical tasks' pending verdicts published; returns how many changed."""
        return _verdicts.mark_published(self._db, task_ids)

    def release_verdicts(self, verdicts: Iterable[_verdicts.Verdict]) -> int:
        """Give claimed verdicts back while their lease holds; returns how many."""
        return _verdicts.release(self._db, verdicts)

    def doctor(self) -> dict[str, Any]:
        """Check the ledger's health; counts only."""
        return self._db.health.doctor()

    def status(self, *, active_grace_seconds: float | None = None) -> dict[str, Any]:
        """Counts by state, delivery state and name, and the age of the oldest work (no ids)."""
        return _status.collect_status(self._db, active_grace_seconds=active_grace_seconds)

    def outcome_history(self, *, window_seconds: float = 86400.0,
                        buckets: int = 24) -> _history.OutcomeHistory:
        """Logical tasks closed over the last ``window_seconds``, per bucket and outcome."""
        return _history.outcome_history(self._db, window_seconds=window_seconds, buckets=buckets)

    def prune(
        self, older_than_seconds: float, *, dry_run: bool = False,
        progress: _prune.ProgressCallback | None = None,
    ) -> dict[str, Any]:
        """Delete closed task trees whose latest change is older than the cut-off (counts)."""
        return _prune.prune(self._db, older_than_seconds, dry_run=dry_run, progress=progress)

    def storage_info(self) -> dict[str, Any]:
        """Describe the storage in force (no paths, no credentials)."""
        return self._db.health.storage()


__all__ = ["TASK_COLUMNS", "Ledger", "LedgerError", "row_to_task"]
