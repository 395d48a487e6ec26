"""The counters behind every adapter's ``stats()``, and their copy in the metrics directory.

With ``metrics_dir`` set, every increment the error policy and the runtime count is also added
to the directory's counters file, so ``tsg metrics`` shows the sums of every process; a worker's
start writes the adapter's counters there at zero first (:meth:`Counters.export_zeros`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..metrics import adapter_counters
from .handle import LedgerHandle
from .metrics import CONFLICT_KINDS


class Counters:
    """This process's counters of one adapter (labelled ``adapter``)."""

    def __init__(self, handle: LedgerHandle, adapter: str) -> None:
        self._handle = handle
        self.adapter = adapter
        self._failed = False

    def _zeros(self) -> list[adapter_counters.Increment]:
        """This adapter's counters whose label sets are known in advance, at zero (with them
        the file names the adapter, so its ``tsg_adapter_ledger_errors_all_total`` reads 0)."""
        adapter = self.adapter
        zeros: list[adapter_counters.Increment] = [
            ("tsg_adapter_conflicts_total", {"adapter": adapter, "kind": k}, 0)
            for k in CONFLICT_KINDS]
        zeros.append(("tsg_adapter_reconciles_total", {"adapter": adapter}, 0))
        zeros.append(("tsg_adapter_verdicts_published_total", {"adapter": adapter}, 0))
        zeros += [("tsg_adapter_framework_successes_total", {"adapter": adapter, "where": where}, 0)
                  for where in ("reconcile", "verdict")]
        return zeros

    def export_zeros(self) -> None:
        """At a worker's start (before anything is counted): write this adapter's counters at
        zero into the metrics directory, if one is set, so every series an alert's
        ``increase()`` reads exists before its first increment. Never raises."""
        if self._handle.settings.metrics_dir is not None:
            self._handle.state().counted = True
            self._add(self._zeros())

    def count_in_directory(self, family: str, labels: Mapping[str, str]) -> None:
        """Add one increment to the metrics directory's counters file; never raises (a failure
        is logged once per process, and the in-process counters still count)."""
        if self._handle.settings.metrics_dir is None:
            return
        increments: list[adapter_counters.Increment] = [
            (family, {**labels, "adapter": self.adapter}, 1)]
        proc = self._handle.state()
        if not proc.counted:  # a process that never started a worker: its zeros come first
            proc.counted = True
            increments += self._zeros()
        self._add(increments)

    def _add(self, increments: list[adapter_counters.Increment]) -> None:
        directory = self._handle.settings.metrics_dir
        assert directory is not None
        try:
            adapter_counters.add(directory, increments)
        except (OSError, ValueError) as exc:
            if not self._failed:
                self._failed = True
                self._handle.logger.warning(
                    "task-state-guard: the adapter counters cannot be added to the metrics "
                    "directory (%s); this process's counters stay in stats() only.",
                    type(exc).__name__,
                )

    def stats(self) -> dict[str, Any]:
        """This process's counters, with the same keys in every adapter.

        ``errors``: ledger errors by ``"<where>:<ExceptionClass>"``; ``conflicts``: refused
        rewrites of terminal records by kind (``attempt_close``, ``logical_close``,
        ``delivery_mark_dropped``); ``reconciles``: reconciles run; ``heartbeating``: tasks this
        process holds right now; ``verdicts_published``: lost-job verdicts this process
        published; ``ledger_usable``: whether this process's ledger could be opened (``None``
        before the first try) and ``ledger_reason``: the fixed reason when it could not.
        """
        proc = self._handle.state()
        with proc.lock:
            reconciles, held, published = proc.reconciles, len(proc.refs), proc.published
        usable, reason = self._handle.health
        policy = self._handle.policy
        return {
            "errors": policy.errors(),
            "conflicts": policy.conflicts(),
            "reconciles": reconciles,
            "heartbeating": held,
            "verdicts_published": published,
            "ledger_usable": usable,
            "ledger_reason": reason,
        }


__all__ = ["Counters"]
