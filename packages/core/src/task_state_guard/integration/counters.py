"""The counters behind every adapter's ``stats()``, and their copy in the metrics directory.

With ``metrics_dir`` set, every increment the error policy and the runtime count is also added
to the directory's counters file, so ``tsg metrics`` shows the sums of every process.
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

    def count_in_directory(self, family: str, labels: Mapping[str, str]) -> None:
        """Add one increment to the metrics directory's counters file; never raises (a failure
        is logged once per process, and the in-process counters still count)."""
        directory = self._handle.settings.metrics_dir
        if directory is None:
            return
        adapter = self.adapter
        increments: list[adapter_counters.Increment] = [(family, {**labels, "adapter": adapter}, 1)]
        proc = self._handle.state()
        if not proc.counted:  # this process's first: its adapter's counters appear at zero
            proc.counted = True
            increments += [("tsg_adapter_conflicts_total", {"adapter": adapter, "kind": k}, 0)
                           for k in CONFLICT_KINDS]
            increments.append(("tsg_adapter_reconciles_total", {"adapter": adapter}, 0))
            increments.append(("tsg_adapter_verdicts_published_total", {"adapter": adapter}, 0))
            increments += [("tsg_adapter_framework_successes_total",
                            {"adapter": adapter, "where": where}, 0)
                           for where in ("reconcile", "verdict")]
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
