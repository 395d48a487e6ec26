"""The verdict drain: a running worker publishes what any reconcile found lost, by default.

Whoever closes a job of this framework as lost (an operator's ``tsg reconcile``, another
host's worker, this process's own pass), the ledger records a pending verdict. A worker
publishes the verdicts owed to its framework when it starts and after each reconcile it runs
itself; :class:`VerdictDrain` adds a daemon thread in each worker process that, every
``verdict_interval_seconds`` (default 10 s, independent of ``reconcile_interval_seconds``; 0:
off), checks whether anything is owed (:meth:`VerdictDrain.pending`: one read, an index probe
with ``LIMIT 1``, no write and no write lock) and only then drains (the adapter's
``publish_verdicts``: claim with a lease, publish, mark). So a running fleet publishes what an
operator's reconcile recorded within one interval, at the cost of one small read per worker
process and interval. Several processes may drain at once: the claim's lease hands each
verdict to one of them.

A tick's error (the check's or the drain's) is counted under ``verdict_drain:<Class>`` and
logged once per kind by the error policy, and never raised (not even when strict: the thread
must keep ticking); a ledger that cannot be opened is skipped silently, since it is reported
already (at ERROR when the worker started, and in ``stats()``'s ``ledger_usable``), and a
later tick uses it once it can be opened; a tick whose ledger handle the process dropped
meanwhile (right before a fork) is not counted either: the next tick checks again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from .handle import LedgerHandle
from .lost_jobs import LostJobs

#: What a tick runs when something is owed: the adapter's drain (by default
#: :meth:`LostJobs.publish_verdicts`; LangGraph wakes its recovery runner instead).
Drain = Callable[[], object]


class VerdictDrain:
    """This process's periodic verdict drain (started and stopped by the adapter's worker
    lifecycle, next to its periodic reconcile)."""

    def __init__(self, handle: LedgerHandle, lost: LostJobs) -> None:
        self._handle = handle
        self._policy = handle.policy
        self._lost = lost

    def pending(self) -> bool:
        """Whether a verdict owed to this framework is free to claim now (raises ledger
        errors). False without a framework label, and when the ledger cannot be opened (not
        counted: that is reported already)."""
        framework = self._lost.framework
        if framework is None:
            return False
        ledger = self._handle.ledger_or_none()
        return ledger is not None and ledger.has_claimable_verdicts(framework)

    def tick(self, drain: Drain | None = None, where: str = "verdict_drain") -> bool:
        """One check, then ``drain`` (default: :meth:`LostJobs.publish_verdicts`) when
        something is owed. Returns whether it drained. Never raises: an error is recorded
        under ``where`` by the error policy (counted, logged once per kind)."""
        ledger = self._handle.opened
        try:
            if not self.pending():
                return False
            (self._lost.publish_verdicts if drain is None else drain)()
        except Exception as exc:
            if ledger is not None and self._handle.opened is not ledger:
                # This process dropped its ledger handle meanwhile (Celery does right before
                # its pool forks a child): not an error of the ledger; the next tick opens
                # a fresh handle and checks again.
                return False
            self._policy.record(where, exc)
            return False
        return True

    def start(self, where: str = "verdict_drain", drain: Drain | None = None) -> bool:
        """Check (and drain) every ``verdict_interval_seconds`` in a daemon thread of this
        process (a worker's process that consumes, or its main process); False when the
        interval is 0, this runtime is owed no verdicts (no framework label) or it runs
        already. The first check comes one interval after the start (the worker's boot has
        just drained)."""
        interval = self._handle.settings.verdict_interval_seconds
        if interval <= 0 or self._lost.framework is None:
            return False
        proc = self._handle.state()
        with proc.lock:
            if proc.drainer is not None:
                return False
            stop = threading.Event()
            thread = threading.Thread(
                target=self._loop, args=(stop, interval, where, drain),
                name="tsg-verdicts", daemon=True,
            )
            proc.drainer = (stop, thread)
        thread.start()
        return True

    @property
    def running(self) -> bool:
        """Whether this process's drain thread runs."""
        drainer = self._handle.state().drainer
        return drainer is not None and drainer[1].is_alive()

    def stop(self) -> None:
        """Stop this process's drain thread, if it runs (idempotent); waits for a tick in
        progress (up to 5 s)."""
        proc = self._handle.state()
        with proc.lock:
            running, proc.drainer = proc.drainer, None
        if running is not None:
            running[0].set()
            if running[1] is not threading.current_thread():
                running[1].join(timeout=5)

    def _loop(
        self, stop: threading.Event, interval: float, where: str, drain: Drain | None
    ) -> None:
        while not stop.wait(interval):
            # Held off while the process prepares a fork (no connection may cross it).
            with self._handle.background_pass(interval) as may_run:
                if may_run:
                    self.tick(drain, where)


__all__ = ["Drain", "VerdictDrain"]
