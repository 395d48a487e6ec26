"""Reconcile passes an adapter runs: at worker boot, periodically in a worker's main process,
or on request; each applied pass is followed by a drain of this framework's verdicts."""

from __future__ import annotations

import json
import logging
import threading
from typing import Any

from ..model import LedgerBusy
from ..ops.reconcile import DecisionCallback, ReconcilePolicy
from .handle import LedgerHandle
from .lost_jobs import LostJobs
from .successes import FrameworkSuccesses

_BOOT_RECONCILE_TRIES = 5
# The report keys that count changes a pass made (the others count what it examined or kept).
_CHANGES = ("tasks_timed_out", "deliveries_failed", "deliveries_not_applicable")


class Reconciler:
    """This runtime's reconcile passes (the settings' graces) and the drains that follow."""

    def __init__(self, handle: LedgerHandle, lost: LostJobs) -> None:
        self._handle = handle
        self._policy = handle.policy
        self._lost = lost
        #: Whether each applied reconcile (and a boot without one) drains this framework's
        #: verdicts. False for an adapter whose own passes publish them (LangGraph: a recovery
        #: pass reconciles, then reports and resumes the lost threads it finds, where it knows
        #: their thread ids; a plain reconcile of the same process leaves them pending for it).
        self.drain_after_reconcile = True
        #: The report of this process's last reconcile (counts only), if any.
        self.last_reconcile: dict[str, Any] | None = None
        #: Consulted before each applied pass: the jobs the framework holds as succeeded are
        #: closed so instead of lost (see :mod:`.successes`).
        self.successes: FrameworkSuccesses | None = None

    @property
    def reconcile_policy(self) -> ReconcilePolicy:
        """The reconcile policy built from the settings' graces."""
        settings = self._handle.settings
        return ReconcilePolicy(
            active_grace_seconds=settings.active_grace_seconds,
            delivery_grace_seconds=settings.delivery_grace_seconds,
        )

    def reconcile(
        self, *, dry_run: bool = False, on_decision: DecisionCallback | None = None
    ) -> dict[str, Any]:
        """Run the core's reconcile with the settings' graces (raises ledger errors).

        ``on_decision`` receives each task the pass closed or whose delivery it closed (see
        :class:`~task_state_guard.ReconcileDecision`). An applied pass is followed by a drain
        of this framework's verdicts (``publish_verdicts``, under the error policy): the
        jobs this pass found lost, and any a reconcile elsewhere left owed. The returned
        report is counts only. Before an applied pass, the jobs it would close lost whose
        success the framework's result store holds (the adapter's success check) are closed
        ``succeeded/worker_completed`` instead (:meth:`FrameworkSuccesses.settle
        <.successes.FrameworkSuccesses.settle>`): the report (the core's nine counts) does not
        count them, and a dry run previews exactly that (:meth:`FrameworkSuccesses.preview
        <.successes.FrameworkSuccesses.preview>`); they are counted in
        ``framework_successes()``."""
        successes = self.successes if self.successes is not None and \
            self.successes.check is not None else None
        if dry_run and successes is not None:
            return successes.preview(self.reconcile_policy, on_decision)
        if successes is not None:
            successes.settle(self.reconcile_policy)
        report = dict(
            self._handle.ledger.reconcile(
                self.reconcile_policy, dry_run=dry_run, on_decision=on_decision
            )
        )
        if not dry_run:
            proc = self._handle.state()
            with proc.lock:
                proc.reconciles += 1
            if self._policy.on_count is not None:
                self._policy.on_count("tsg_adapter_reconciles_total", {})
            self.last_reconcile = report
            if self.drain_after_reconcile:
                self._policy.call("publish_verdicts", self._lost.publish_verdicts)
        return report

    def boot(self, where: str = "boot") -> dict[str, Any] | None:
        """What a worker does when it starts, before it consumes: ``check_ledger`` (an
        unusable ledger is logged once at ERROR; with ``require_ledger`` it raises, and the
        worker must not start), then, when the ledger is usable, :meth:`boot_reconcile` (the
        reconcile if ``reconcile_on_boot``, and the drain of this framework's verdicts).
        Returns the reconcile's report, if one ran."""
        if not self._handle.check_ledger(where):
            return None
        return self.boot_reconcile(where)

    def boot_reconcile(self, where: str = "boot_reconcile") -> dict[str, Any] | None:
        """Reconcile when a worker boots, if ``reconcile_on_boot``; guarded by the error policy.

        A busy ledger (several workers booting at once) is retried a few times; reconcile is
        idempotent. Logs the counts-only report (compact JSON) at info level. Either way the
        verdicts owed to this framework are drained (a reconcile elsewhere may have left some).
        """
        if not self._handle.settings.reconcile_on_boot:
            if self.drain_after_reconcile:
                self._lost.guarded_publish(where)
            return None
        return self.guarded_reconcile(where)

    def guarded_reconcile(
        self, where: str = "reconcile", *, quiet_when_unchanged: bool = False
    ) -> dict[str, Any] | None:
        """:meth:`reconcile` under the error policy (``None`` on error); logs the counts-only
        report at info level, or at debug level when ``quiet_when_unchanged`` and the pass
        changed nothing (a periodic pass: a quiet fleet logs nothing at info level)."""
        with self._policy.guarded(where):
            for attempt in range(_BOOT_RECONCILE_TRIES):
                try:
                    report = self.reconcile()
                except LedgerBusy:
                    if attempt == _BOOT_RECONCILE_TRIES - 1:
                        raise
                    continue
                changed = any(report[key] for key in _CHANGES)
                self._handle.logger.log(
                    logging.DEBUG if quiet_when_unchanged and not changed else logging.INFO,
                    "task-state-guard: reconcile (%s) %s",
                    where,
                    json.dumps(report, sort_keys=True, separators=(",", ":")),
                )
                return report
        return None

    def start_periodic_reconcile(self, where: str = "periodic_reconcile") -> bool:
        """Reconcile every ``reconcile_interval_seconds`` in a daemon thread of this process
        (for a worker's main process); False when the interval is 0 or it already runs."""
        interval = self._handle.settings.reconcile_interval_seconds
        if interval <= 0:
            return False
        proc = self._handle.state()
        with proc.lock:
            if proc.reconciler is not None:
                return False
            stop = threading.Event()
            thread = threading.Thread(
                target=self._loop, args=(stop, interval, where),
                name="tsg-reconcile", daemon=True,
            )
            proc.reconciler = (stop, thread)
        thread.start()
        return True

    def stop_periodic_reconcile(self) -> None:
        """Stop this process's periodic reconcile, if it runs (idempotent)."""
        proc = self._handle.state()
        with proc.lock:
            running, proc.reconciler = proc.reconciler, None
        if running is not None:
            running[0].set()
            if running[1] is not threading.current_thread():
                running[1].join(timeout=5)

    def _loop(self, stop: threading.Event, interval: float, where: str) -> None:
        while not stop.wait(interval):
            with self._handle.background_pass(interval) as may_run:
                if may_run:
                    self.guarded_reconcile(where, quiet_when_unchanged=True)


__all__ = ["Reconciler"]
