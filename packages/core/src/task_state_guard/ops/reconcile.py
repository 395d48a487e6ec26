"""Restart reconciliation: one atomic pass over active tasks and pending deliveries.

Dry-run and apply share every decision; dry-run runs in a query-only read transaction and only
counts. Applying, a pass reads each batch without holding it, then holds only the rows it is
about to change, judged again as they are now: where writers run beside a pass, a worker waits
for it only to change a row the pass is closing. A task the pass times out that owes nobody a
delivery (an attempt, an internal task) has its delivery closed ``not_applicable`` in the same
pass, as the adapters' own closes do: the delivery grace is for deliveries somebody may still
confirm, or records a dead process left terminal with their delivery open. Candidates are read
through partial indexes in bounded batches, so memory stays flat whatever the ledger size. A
row that fails validation is skipped (doctor reports it) so one corrupt row never blocks the
others.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from .. import rules
from ..model import (
    ACTIVE_STATES,
    TERMINAL_STATES,
    InvalidInput,
    LedgerError,
    Liveness,
    check_seconds,
    is_canonical,
)
from . import verdicts

if TYPE_CHECKING:
    from ..store.protocol import Database

BATCH = 2000

#: Parents per read of their children.
_CHILDREN_CHUNK = 500
#: A row of a batch, the timed_out code its task gets (``None``: none) and the
#: ``(state, code)`` its delivery closes with (``None``: none).
_Outcome = tuple[tuple[Any, ...], "str | None", "tuple[str, str] | None"]


@dataclass(frozen=True, slots=True)
class ReconcilePolicy:
    """Grace periods for restart reconciliation, in seconds."""

    active_grace_seconds: float = 600.0
    delivery_grace_seconds: float = 600.0

    def __post_init__(self) -> None:
        check_seconds(self.active_grace_seconds, "active_grace_seconds", allow_zero=True)
        check_seconds(self.delivery_grace_seconds, "delivery_grace_seconds", allow_zero=True)


def policy_of(
    policy: ReconcilePolicy | None, active_grace_seconds: float | None,
    delivery_grace_seconds: float | None,
) -> ReconcilePolicy:
    """The policy a caller gave, as ``policy`` or as grace keywords (0.1.0's form), not both
    (``InvalidInput``); a grace left out is 600 s."""
    graces = {key: value for key, value in (
        ("active_grace_seconds", active_grace_seconds),
        ("delivery_grace_seconds", delivery_grace_seconds)) if value is not None}
    if policy is not None and graces:
        raise InvalidInput("pass either a policy or grace keywords, not both")
    return ReconcilePolicy(**graces) if policy is None else policy


@dataclass(frozen=True, slots=True)
class ReconcileDecision:
    """One task a reconcile pass closed, or whose delivery it closed (for in-process callers).

    ``kind`` is ``"task"`` (the task was timed out: ``status`` is ``timed_out`` and ``code``
    one of ``deadline_exceeded``, ``owner_lost``, ``restart_stale``) or ``"delivery"`` (its
    delivery was closed: ``status`` ``failed``/``not_applicable``). ``framework_id`` is the
    framework's own id when one was stored (a canonical UUID), else ``None``.
    """

    kind: str
    task_id: str
    parent_id: str | None
    framework_id: str | None
    name: str | None
    status: str
    code: str


#: The callback :func:`reconcile_restart` hands its decisions to.
DecisionCallback = Callable[[ReconcileDecision], object]
#: A progress callback: ``(done, total)`` once before the first batch and after each batch.
ProgressCallback = Callable[[int, int], object]

_isfinite = math.isfinite
_NUMBER_TYPES = (int, float)  # exact types: a bool is no timestamp


def _finite(*values: Any) -> bool:
    for v in values:
        if v is not None and (type(v) not in _NUMBER_TYPES or not _isfinite(v)):
            return False
    return True


class _Pass:
    """The state of one reconcile pass."""

    def __init__(self, db: Database, conn: Any, policy: ReconcilePolicy,
                 now: float, dry_run: bool, collect: bool = False,
                 progress: ProgressCallback | None = None) -> None:
        self.db = db
        self.progress = progress
        self.conn = conn
        self.now = now
        self.dry_run = dry_run
        self.active_cutoff = now - float(policy.active_grace_seconds)
        self.delivery_cutoff = now - float(policy.delivery_grace_seconds)
        #: Children this pass closed that the backend may still show running: those of this
        #: batch (its closes are written after it), and every earlier one in a dry run (which
        #: writes nothing). Only a child can keep a parent fresh, so no root is kept here, and
        #: an applied pass forgets each batch's once they are written: bounded memory.
        self.timed_out: set[int] = set()
        self.liveness: dict[str, Liveness] = {}
        self.decisions: list[ReconcileDecision] | None = [] if collect else None
        self.counts = dict.fromkeys(
            (
                "active_examined", "tasks_timed_out", "fresh_active_retained",
                "pending_delivery_examined", "deliveries_failed",
                "deliveries_not_applicable", "pending_delivery_retained",
            ),
            0,
        )

    def owner_dead(self, token: Any) -> bool:
        if not isinstance(token, str):
            return False
        state = self.liveness.get(token)
        if state is None:
            state = self.db.owners.probe(token)
            self.liveness[token] = state
        return state is Liveness.DEAD

    def verdict(self, row: tuple[Any, ...]) -> str | None:
        """The timed_out code a running task earns on its own (before parent freshness)."""
        created, started, heartbeat, deadline, owner = row[2:7]
        latest = max(t for t in (created, started, heartbeat) if t is not None)
        if latest > self.now:
            return None  # stored times ahead of this clock: never close before them
        if deadline is not None and deadline <= self.now:
            return "deadline_exceeded"
        if self.owner_dead(owner):
            return "owner_lost"
        if rules.running_idle_since(started, heartbeat) <= self.active_cutoff:
            return "restart_stale"
        return None

    def active_children(self, parent_ids: list[str]) -> dict[str, list[tuple[int, str, bool]]]:
        """The children of the given tasks that can keep them fresh (queued, running, or lost
        while their broker may still redeliver: ``redelivery_seconds``, the broker's window,
        plus the active grace, for the requeued job to reach a worker, after the attempt's
        last sign of life), in a few indexed queries. An older layout (read in place by a
        read-only open) records no redelivery windows."""
        found: dict[str, list[tuple[int, str, bool]]] = {}
        cutoff = self.active_cutoff if verdicts.current(self.db) else None
        for start in range(0, len(parent_ids), _CHILDREN_CHUNK):
            chunk = parent_ids[start : start + _CHILDREN_CHUNK]
            for parent, seq, status, redelivery in self.db.queries.active_children(
                self.conn, chunk, cutoff
            ):
                found.setdefault(parent, []).append((seq, status, bool(redelivery)))
        return found

    def fresh_through_children(self, children: list[tuple[int, str, bool]]) -> bool:
        """A queued child, a running child this pass keeps, or a lost attempt whose broker may
        still redeliver the job (its redelivery window plus the active grace is not over) keeps
        its parent fresh."""
        return any(
            status == "queued" or (status == "running" and seq not in self.timed_out)
            or redelivery
            for seq, status, redelivery in children
        )

    def decide(self, kind: str, row: tuple[Any, ...], status: str, code: str) -> None:
        """Keep one decision for the caller (only when one asked for them)."""
        if self.decisions is not None:
            fid = row[13] if type(row[13]) is str and is_canonical(row[13]) else None
            name = row[12] if type(row[12]) is str else None
            self.decisions.append(ReconcileDecision(kind, row[7], row[11], fid, name, status, code))

    @staticmethod
    def well_formed(row: tuple[Any, ...]) -> bool:
        """Skip rows that fail validation (doctor reports them) instead of failing the pass."""
        seq, status, created, started, heartbeat, deadline = row[:6]
        required, delivery, closed = row[8], row[9], row[10]
        if not isinstance(seq, int) or required not in (0, 1) or delivery != "pending":
            return False
        if created is None or not _finite(created, started, heartbeat, deadline, closed):
            return False
        if status in ACTIVE_STATES:
            return closed is None and not (status == "running" and started is None)
        return status in TERMINAL_STATES and closed is not None

    def judge(self, rows: list[tuple[Any, ...]]) -> list[_Outcome]:
        """What the pass does with each row of a batch (newest first): ``(row, code, delivery)``
        with the timed_out code of an active task it closes (``None``: kept fresh, and then
        its delivery is not judged) and the ``(state, code)`` its delivery closes with
        (``None``: retained)."""
        now = self.now
        rows = [row for row in rows if self.well_formed(row)]
        verdicts = {row[0]: self.verdict(row) for row in rows if row[1] == "running"}
        children = self.active_children(
            [row[7] for row in rows if verdicts.get(row[0]) in ("owner_lost", "restart_stale")]
        )
        outcomes: list[_Outcome] = []
        for row in rows:
            seq, status, required, closed = row[0], row[1], row[8], row[10]
            code: str | None = None
            owed_later = True  # a delivery somebody may still confirm gets its grace
            if status in ACTIVE_STATES:
                code = verdicts.get(seq)
                if code in ("owner_lost", "restart_stale") and self.fresh_through_children(
                    children.get(row[7], [])
                ):
                    code = None  # parent freshness outranks owner liveness and staleness
                if code is None:
                    outcomes.append((row, None, None))
                    continue
                if row[11] is not None:
                    self.timed_out.add(seq)
                closed = now  # its delivery is judged in this same pass:
                owed_later = bool(required)  # owing nobody, it closes with the task
            if owed_later and closed > self.delivery_cutoff:
                outcomes.append((row, code, None))
            elif required:
                outcomes.append((row, code, ("failed", "delivery_grace_expired")))
            else:
                outcomes.append((row, code, ("not_applicable", "internal_task")))
        return outcomes

    def held(self, outcomes: list[_Outcome]) -> list[_Outcome]:
        """Applying: the batch's outcomes once the rows it changes are held. A worker may have
        written one since the batch was read: when any row held differs from its read, or is
        gone (no longer open, or held by a worker right now: the next pass judges it), the rows
        held are judged again as they are now."""
        changing = [row for row, code, delivery in outcomes
                    if code is not None or delivery is not None]
        if not changing:
            return outcomes
        now_rows = self.db.queries.hold_open(self.conn, changing)
        if now_rows == changing:  # as read: every decision stands
            return outcomes
        self.timed_out.difference_update(row[0] for row in changing)  # judged again below
        again = {outcome[0][0]: outcome for outcome in self.judge(now_rows)}
        kept = []
        for outcome in outcomes:
            row, code, delivery = outcome
            if code is None and delivery is None:
                kept.append(outcome)
            elif row[0] in again:
                kept.append(again[row[0]])
        return kept

    def count(self, outcomes: list[_Outcome]) -> tuple[
            list[tuple[str, float, int]], list[tuple[str, str, float, int]]]:
        """Count a batch's outcomes, keep their decisions, and return its writes."""
        counts, now = self.counts, self.now
        timeouts: list[tuple[str, float, int]] = []
        deliveries: list[tuple[str, str, float, int]] = []
        for row, code, delivery in outcomes:
            if row[1] in ACTIVE_STATES:
                counts["active_examined"] += 1
                if code is None:
                    counts["fresh_active_retained"] += 1
                    continue
                counts["tasks_timed_out"] += 1
                timeouts.append((code, now, row[0]))
                self.decide("task", row, "timed_out", code)
            counts["pending_delivery_examined"] += 1
            if delivery is None:
                counts["pending_delivery_retained"] += 1
                continue
            state, dcode = delivery
            counts["deliveries_failed" if state == "failed" else "deliveries_not_applicable"] += 1
            deliveries.append((state, dcode, now, row[0]))
            self.decide("delivery", row, state, dcode)
        return timeouts, deliveries

    def scan(self) -> None:
        """Decide every open task, newest first, in bounded batches."""
        cursor = 1 << 62
        conn, progress = self.conn, self.progress
        done = total = 0
        if progress is not None:  # one count over the open-work index, only when asked
            total = self.db.queries.count_open(conn)
            progress(0, total)
        while True:
            rows = self.db.queries.open_batch(conn, cursor, BATCH)
            if not rows:
                return
            cursor = rows[-1][0]
            done += len(rows)
            if not self.dry_run:
                self.timed_out.clear()  # written with the last batch: the backend shows them
            outcomes = self.judge(rows)
            if not self.dry_run:
                outcomes = self.held(outcomes)
            timeouts, deliveries = self.count(outcomes)
            if not self.dry_run and (timeouts or deliveries):
                self.db.queries.close_lost(conn, timeouts, deliveries)
            if progress is not None:
                progress(done, max(done, total))


class _Reconcilable(Protocol):
    def reconcile(
        self, policy: ReconcilePolicy | None = None, *, dry_run: bool = False,
        on_decision: DecisionCallback | None = None,
    ) -> dict[str, Any]: ...


def reconcile_restart(
    ledger: _Reconcilable,
    policy: ReconcilePolicy | None = None,
    dry_run: bool = False,
    *,
    on_decision: DecisionCallback | None = None,
) -> dict[str, Any]:
    """Time out stale running tasks and settle overdue deliveries in one atomic pass.

    Returns exactly nine keys: the seven counts plus ``dry_run`` and ``applied``; never ids.
    ``on_decision`` (in-process callers only) is called once per :class:`ReconcileDecision`,
    in the pass's order (newest task first; a task's own close before its delivery's), after
    the pass committed (a dry run hands over the decisions it would make); an exception it
    raises propagates after the pass, which stays applied.
    """
    if policy is not None and not isinstance(policy, ReconcilePolicy):
        raise InvalidInput("policy must be a ReconcilePolicy")
    return ledger.reconcile(policy, dry_run=dry_run, on_decision=on_decision)


def run_reconcile(
    db: Database,
    policy: ReconcilePolicy | None = None,
    dry_run: bool = False,
    *,
    on_decision: DecisionCallback | None = None,
    progress: ProgressCallback | None = None,
) -> dict[str, Any]:
    """The reconcile pass behind :func:`reconcile_restart`, on the ledger's database.

    ``progress(done, total)`` (optional) is called inside the pass: once with ``(0, total)``
    (the open tasks it will examine) and after each batch; an exception it raises aborts the
    pass, which then applies nothing.
    """
    if policy is None:
        policy = ReconcilePolicy()
    if not isinstance(policy, ReconcilePolicy):
        raise InvalidInput("policy must be a ReconcilePolicy")
    if not isinstance(dry_run, bool):
        raise InvalidInput("dry_run must be a boolean")
    if on_decision is not None and not callable(on_decision):
        raise InvalidInput("on_decision must be callable")
    if progress is not None and not callable(progress):
        raise InvalidInput("progress must be callable")
    collect = on_decision is not None
    if dry_run:
        with db.read() as conn:
            run = _Pass(db, conn, policy, db.now(), dry_run, collect, progress)
            run.scan()
    else:
        with db.bulk(), db.write() as conn:
            run = _Pass(db, conn, policy, db.now(), dry_run, collect, progress)
            run.scan()
    if not dry_run:
        _remove_dead_owner_files(db)
    report: dict[str, Any] = dict(run.counts)
    report["dry_run"] = dry_run
    report["applied"] = not dry_run
    if on_decision is not None and run.decisions:
        for decision in run.decisions:
            on_decision(decision)
    return report


def _remove_dead_owner_files(db: Database) -> None:
    """Delete what dead owners left behind (lock files) that no running task references."""
    # housekeeping: a failure leaves the files for the next pass; each dead owner's token is
    # looked up in a read of its own (a dead owner starts nothing new meanwhile)
    with contextlib.suppress(OSError, LedgerError):
        db.owners.cleanup(db.queries.runs_for_owner)
