"""The adapter runtime: everything an adapter needs between its framework's hooks and the ledger.

One :class:`AdapterRuntime` per installed adapter: the one object the adapter holds. It is
assembled from small parts, one concern each, that share this process's state
(:class:`~.handle.LedgerHandle`):

==========================  ================================================================
part (module)               concern
==========================  ================================================================
``handle`` (``handle``)     the per-process ledger handle: opened lazily on first use in each
                            process; a forked child never touches its parent's handle,
                            heartbeat thread or counters (it starts afresh); ``check_ledger``
                            opens it at worker start and says loudly when it cannot be used;
                            ``write_now`` begins a write transaction only if that needs no
                            wait (for an event loop's writes)
``heartbeats``              ref-counted heartbeats: ``hold`` a running task while a job runs,
                            ``release`` it after; one daemon thread per process beats every
                            held task every ``heartbeat_seconds``
``attempts``                opening logical tasks (they carry the adapter's framework label,
                            so that the ledger knows whom a lost verdict is owed to) and
                            beginning or claiming attempts, each described by an
                            :class:`~.attempts.AttemptSpec`
``closes`` (``closing``)    ending attempts and closing tasks (an attempt's delivery closes
                            ``not_applicable/internal_task`` in the same transaction); delivery
                            marks (``mark_delivered``, ``mark_delivery_failed``)
``lost`` (``lost_jobs``)    the verdict outbox: ``publish_verdicts`` hands each lost job, as a
                            :class:`~.lost_jobs.LostTask`, to the adapter's result-backend
                            writer (``fail_lost``) and the user's ``on_lost`` hook
``reconciler``              reconcile at boot, periodically in a worker's main process, or on
(``reconciling``)           request; each applied pass drains the verdicts
``successes``               the adapter's success check (``framework_success``): a job whose
(``successes``)             success the framework's result store holds is closed succeeded
                            before a reconcile would close it lost, and its verdict, when one
                            was recorded anyway, is superseded instead of published
``drain`` (``draining``)    the periodic verdict drain of a running worker (by default every
                            ``verdict_interval_seconds``): a read-only check for verdicts owed
                            to this framework, and a drain only when there are
``counters``                the counters behind every adapter's ``stats()`` (with
                            ``metrics_dir`` set, every increment is also added to the
                            directory's counters file, so ``tsg metrics`` shows the sums of
                            every process)
==========================  ================================================================

The runtime's methods are the parts' own bound methods (no extra call on a job's path); the
settable hooks (``on_lost``, ``fail_lost``, ``framework_success``, ``publish_verdict``,
``drain_after_reconcile``) forward to the part that reads them. Transition methods raise ledger
errors; an adapter wraps each framework hook in :meth:`AdapterRuntime.guarded` so that the error
policy (:class:`~task_state_guard.integration.ErrorPolicy`: count, log once per kind, raise only
when strict) decides. Refused closes of terminal records are counted as conflicts inside the close
methods.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ..ledger import Ledger
from ..model import check_framework
from ..ops.verdicts import Verdict
from ..store.backends import MAX_CONNECTIONS
from .attempts import Attempts, AttemptSpec
from .closing import Closes, Closing
from .counters import Counters
from .draining import VerdictDrain
from .errors import ErrorPolicy, Guarded
from .handle import LedgerHandle
from .heartbeats import Heartbeats
from .lost_jobs import VERDICT_BATCH, VERDICT_LEASE_SECONDS, LostHook, LostJobs, LostTask
from .reconciling import Reconciler
from .settings import Settings
from .successes import FrameworkSuccesses, SuccessCheck


class AdapterRuntime:
    """The integration layer one installed adapter runs on (see the module docstring).

    ``ledger``: an already open ledger to use instead of opening ``settings.db`` per process
    (the caller keeps closing it). ``subject`` names the framework's unit of work in log lines.
    ``framework``: the adapter's framework label (``celery``, ``dramatiq``, ``langgraph``): the
    logical tasks it opens carry it, so a close that declares one lost owes this framework a
    verdict, which :meth:`publish_verdicts` drains (``None``: no verdicts).
    ``on_lost``: the user's hook for lost jobs. ``adapter``: the label of its counters.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        logger: logging.Logger,
        subject: str = "job",
        ledger: Ledger | None = None,
        framework: str | None = None,
        on_lost: LostHook | None = None,
        adapter: str = "adapter",
    ) -> None:
        self.settings = settings
        self.logger = logger
        self.policy = ErrorPolicy(logger, strict=settings.strict, subject=subject)
        self.framework = check_framework(framework)
        self.handle = handle = LedgerHandle(settings, self.policy, logger, ledger)
        self.heartbeats = heartbeats = Heartbeats(handle)
        self.attempts = attempts = Attempts(handle, heartbeats, self.framework)
        self.closes = closes = Closes(handle, heartbeats, attempts)
        self.lost = lost = LostJobs(handle, self.framework, on_lost)
        self.reconciler = reconciler = Reconciler(handle, lost)
        self.successes = successes = FrameworkSuccesses(handle, self.framework)
        lost.successes = reconciler.successes = successes
        self.drain = drain = VerdictDrain(handle, lost)
        self.counters = counters = Counters(handle, adapter)
        #: The ``adapter`` label of this runtime's counters (``celery``, ``dramatiq``, ...).
        self.adapter = adapter
        if settings.metrics_dir is not None:
            self.policy.on_count = counters.count_in_directory

        # The parts' methods, bound once: an adapter's call costs what a method call costs.
        # per-process ledger handle
        self.check_ledger = handle.check_ledger
        self.ledger_or_none = handle.ledger_or_none
        self.write_now = handle.write_now
        # heartbeats
        self.hold = heartbeats.hold
        self.release = heartbeats.release
        self.held = heartbeats.held
        self.stop_heartbeats = heartbeats.stop_heartbeats
        # opening and claiming
        self.open_logical = attempts.open_logical
        self.start_task = attempts.start_task
        self.begin_task = attempts.begin_task
        self.queue_attempt = attempts.queue_attempt
        self.claim_attempt = attempts.claim_attempt
        self.begin_attempt = attempts.begin_attempt
        self.get = attempts.get
        # closing, delivery marks
        self.end_attempt = closes.end_attempt
        self.close_and_claim = closes.close_and_claim
        self.close_tasks = closes.close_tasks
        self.close_attempt = closes.close_attempt
        self.close_logical = closes.close_logical
        self.mark_delivered = closes.mark_delivered
        self.mark_delivery_failed = closes.mark_delivery_failed
        self.drop_deferred_mark = closes.drop_deferred_mark
        # lost jobs (the outbox)
        self.claim_verdicts = lost.claim_verdicts
        self.mark_published = lost.mark_published
        self.release_verdicts = lost.release_verdicts
        self.lost_task = lost.lost_task
        self.publish_verdicts = lost.publish_verdicts
        self.guarded_publish = lost.guarded_publish
        self.notify_lost = lost.notify_lost
        # reconcile
        self.reconcile = reconciler.reconcile
        self.boot_reconcile = reconciler.boot_reconcile
        self.guarded_reconcile = reconciler.guarded_reconcile
        self.start_periodic_reconcile = reconciler.start_periodic_reconcile
        self.stop_periodic_reconcile = reconciler.stop_periodic_reconcile
        # the periodic verdict drain
        self.start_verdict_drain = drain.start
        self.stop_verdict_drain = drain.stop
        self.verdicts_pending = drain.pending
        # counters
        self.stats = counters.stats
        #: This process's jobs closed succeeded instead of lost (``reconcile``) and verdicts
        #: superseded (``verdict``), counts only.
        self.framework_successes = successes.counts

    # ------------------------------------------------------------------ settable, forwarded

    @property
    def ledger(self) -> Ledger:
        """This process's ledger (opened on first use; a forked child opens its own)."""
        return self.handle.ledger

    @property
    def connections(self) -> int | None:
        """The statement connections a PostgreSQL ledger keeps in each process when its URL
        has no ``connections=`` (None: one; a SQLite ledger ignores it)."""
        return self.handle.connections

    @connections.setter
    def connections(self, threads: int | None) -> None:
        """Size it to the threads that run jobs at once in this process (kept within 1..64),
        before the process opens its ledger (a ledger already open keeps its size)."""
        self.handle.connections = (
            None if threads is None else max(1, min(int(threads), MAX_CONNECTIONS)))

    @property
    def on_lost(self) -> LostHook | None:
        """The user's hook for lost jobs (see :class:`LostTask`)."""
        return self.lost.on_lost

    @on_lost.setter
    def on_lost(self, hook: LostHook | None) -> None:
        self.lost.on_lost = hook

    @property
    def fail_lost(self) -> LostHook | None:
        """The adapter's writer of a failure into the framework's result backend."""
        return self.lost.fail_lost

    @fail_lost.setter
    def fail_lost(self, writer: LostHook | None) -> None:
        self.lost.fail_lost = writer

    @property
    def framework_success(self) -> SuccessCheck | None:
        """The adapter's success check: called with a candidate lost job (a
        :class:`LostTask`: framework id, ledger id, name label, code), True when the
        framework's result store holds a success for it (see :mod:`.successes`)."""
        return self.successes.check

    @framework_success.setter
    def framework_success(self, check: SuccessCheck | None) -> None:
        if check is not None and not callable(check):
            raise TypeError("framework_success must be callable")
        self.successes.check = check

    @property
    def publish_verdict(self) -> Callable[[Verdict], bool] | None:
        """How :meth:`publish_verdicts` publishes one claimed verdict (see
        :attr:`LostJobs.publish_verdict <.lost_jobs.LostJobs.publish_verdict>`)."""
        return self.lost.publish_verdict

    @publish_verdict.setter
    def publish_verdict(self, publish: Callable[[Verdict], bool] | None) -> None:
        self.lost.publish_verdict = publish

    @property
    def drain_after_reconcile(self) -> bool:
        """Whether each applied reconcile (and a boot without one) drains this framework's
        verdicts (see :attr:`Reconciler.drain_after_reconcile
        <.reconciling.Reconciler.drain_after_reconcile>`)."""
        return self.reconciler.drain_after_reconcile

    @drain_after_reconcile.setter
    def drain_after_reconcile(self, drain: bool) -> None:
        self.reconciler.drain_after_reconcile = drain

    @property
    def last_reconcile(self) -> dict[str, Any] | None:
        """The report of this process's last reconcile (counts only), if any."""
        return self.reconciler.last_reconcile

    # ------------------------------------------------------------------ the whole runtime

    def boot(self, where: str = "boot") -> dict[str, Any] | None:
        """What a worker does when it starts, before it consumes: its counters appear at zero
        in the metrics directory (if set), then :meth:`Reconciler.boot
        <.reconciling.Reconciler.boot>` (``check_ledger``, the boot reconcile if
        ``reconcile_on_boot``, the drain of this framework's verdicts). Returns the reconcile's
        report, if one ran."""
        self.counters.export_zeros()
        return self.reconciler.boot(where)

    def guarded(self, where: str) -> Guarded:
        """Apply the error policy to the block (for the body of a framework hook)."""
        return self.policy.guarded(where)

    def supervise_children(self, where: str = "supervise_children") -> None:
        """Right before this process forks a worker child that it supervises (a pool's main
        process, which reports every end of a child's work, a lost child's included): the
        child's work is owned by this process (``Ledger.supervise_children``), so a reconcile
        never finds it lost in the moment between the child's death and this process's report.
        Under the error policy: on error the child owns its work itself."""
        with self.guarded(where):
            self.handle.ledger.supervise_children()

    def drop_ledger(self) -> None:
        """Close this process's own ledger handle right before the framework forks.

        Waits for a background pass in progress (periodic reconcile, verdict drain) and holds
        the next off until the fork happened, so that no SQLite connection, nor the record of
        its locks, is copied into the child (SQLite's rule: a connection must never cross a
        fork; a child that inherits one in use can lose its own commits). The next use opens a
        fresh one; held tasks keep being heartbeaten.
        """
        self.heartbeats.stop_heartbeats()
        self.handle.close_for_fork()
        self.heartbeats.resume()

    def close(self) -> None:
        """Stop this process's heartbeats, periodic reconcile and verdict drain and close its
        own ledger handle (idempotent)."""
        self.reconciler.stop_periodic_reconcile()
        self.drain.stop()
        self.heartbeats.stop_heartbeats(where="close", forget=True)
        self.handle.close_ledger()


__all__ = [
    "VERDICT_BATCH",
    "VERDICT_LEASE_SECONDS",
    "AdapterRuntime",
    "AttemptSpec",
    "Closing",
    "LostHook",
    "LostTask",
    "SuccessCheck",
]
