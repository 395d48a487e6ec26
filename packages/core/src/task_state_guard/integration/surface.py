"""The public surface every adapter object shares, with one meaning (a mixin)."""

from __future__ import annotations

from typing import Any

from ..model import Task
from ..ops.reconcile import DecisionCallback
from .ids import IdScheme
from .metrics import format_adapter_metrics
from .runtime import AdapterRuntime, LostHook
from .settings import Settings


class AdapterSurface:
    """``mark_delivered``, ``mark_delivery_failed`` (and their async ``amark_*``), ``reconcile``,
    ``publish_verdicts`` (and ``apublish_verdicts``), ``on_lost``, ``stats``, ``metrics_text``
    and ``settings``.

    An adapter class sets ``runtime`` and ``id_scheme`` (its id rule, fixed per framework).
    """

    runtime: AdapterRuntime
    #: The framework's deterministic ids (:meth:`logical_task_id`).
    id_scheme: IdScheme
    #: The ``adapter`` label of :meth:`metrics_text` (``celery``, ``dramatiq``, ``langgraph``).
    adapter_name: str = "adapter"

    def logical_task_id(self, framework_id: str) -> str:
        """The ledger id of the logical task of a framework job id (a non-empty string)."""
        return self.id_scheme.logical_task_id(framework_id)

    @property
    def settings(self) -> Settings:
        """The resolved settings (the same names and defaults in every adapter)."""
        return self.runtime.settings

    def mark_delivered(self, framework_id: str) -> Task | None:
        """Record that the job's result reached its recipient (``transport_acknowledged``).

        Call it only after your transport confirmed; a broker ack is not a delivery. Outside
        the running job: written at once, returns the updated logical task, raises the core's
        errors (``InvalidInput``, ``TaskNotFound``, ``StateConflict`` while the job is still
        open or its delivery closed otherwise, ``StorageError``) whatever ``strict`` says.
        Inside the running job of that id in this process: kept and written in the transaction
        that closes the logical task; returns ``None``.
        """
        return self.runtime.mark_delivered(self.logical_task_id(framework_id))

    def mark_delivery_failed(self, framework_id: str) -> Task | None:
        """Record that delivering the job's result failed (``transport_failed``); the same rules
        as :meth:`mark_delivered`."""
        return self.runtime.mark_delivery_failed(self.logical_task_id(framework_id))

    async def amark_delivered(self, framework_id: str) -> Task | None:
        """:meth:`mark_delivered` for async code: the ledger write runs in a worker thread, so
        the event loop never waits for it (not even while another process holds the ledger
        locked). A cancelled caller stops waiting; the write still completes."""
        import asyncio  # only async callers load it (it imports the network modules)

        return await asyncio.to_thread(self.mark_delivered, framework_id)

    async def amark_delivery_failed(self, framework_id: str) -> Task | None:
        """:meth:`mark_delivery_failed` for async code (see :meth:`amark_delivered`)."""
        import asyncio

        return await asyncio.to_thread(self.mark_delivery_failed, framework_id)

    def reconcile(
        self, *, dry_run: bool = False, on_decision: DecisionCallback | None = None
    ) -> dict[str, Any]:
        """Run the core's reconcile with the adapter's graces; returns the nine counts.

        ``on_decision`` receives each task the pass closed or whose delivery it closed (a
        :class:`~task_state_guard.ReconcileDecision`: ledger id, framework id where stored,
        name label, new state, code). An applied pass is followed by a drain of this framework's
        lost-job verdicts (:meth:`publish_verdicts`).
        """
        return self.runtime.reconcile(dry_run=dry_run, on_decision=on_decision)

    def publish_verdicts(self) -> int:
        """Publish, now, the lost-job verdicts the ledger holds for this framework (whoever
        reconciled: the CLI, a worker, another host): each is written into the framework's
        result backend where there is one (never over a stored result) and handed to
        ``on_lost``, then marked published. Returns how many this call published; raises the
        core's errors. Workers also do this at start, after each reconcile they run and on
        their periodic interval. At least once across crashes, exactly once otherwise."""
        return self.runtime.publish_verdicts()

    async def apublish_verdicts(self) -> int:
        """:meth:`publish_verdicts` in a worker thread, for an event loop."""
        import asyncio  # only where an event loop runs: it loads the network modules

        return await asyncio.to_thread(self.runtime.publish_verdicts)

    @property
    def on_lost(self) -> LostHook | None:
        """The hook called with a :class:`~task_state_guard.integration.LostTask` for each job
        found lost, once per job across every process of this framework that publishes
        verdicts (``None``: none). Settable."""
        return self.runtime.on_lost

    @on_lost.setter
    def on_lost(self, hook: LostHook | None) -> None:
        if hook is not None and not callable(hook):
            raise TypeError("on_lost must be callable")
        self.runtime.on_lost = hook

    def stats(self) -> dict[str, Any]:
        """This process's counters: ``errors``, ``conflicts``, ``reconciles``, ``heartbeating``,
        ``verdicts_published``, and the ledger's health: ``ledger_usable`` (``None`` until the
        first open), ``ledger_reason`` (the fixed reason it could not be opened, else ``None``).
        """
        return self.runtime.stats()

    def metrics_text(self) -> str:
        """This process's counters as Prometheus text (``tsg_adapter_*``), for the app to
        serve; several adapters in one exposition: ``integration.format_adapter_metrics``."""
        return format_adapter_metrics(self)


__all__ = ["AdapterSurface"]
