"""An adapter's in-process counters (``stats()``) as Prometheus text, for an app to serve.

The counters belong to one process (see :class:`~task_state_guard.integration.ErrorPolicy`):
serve them from the process whose hooks run the jobs. Labels are the adapter's name, the hook
or operation, the exception's class name and the conflict kind; never ids, values or paths.

Every series whose labels are known in advance is exported from the start, at 0: the conflicts
of each kind, the reconciles, the published verdicts and ``tsg_adapter_ledger_errors_all_total``
(every ledger error of the adapter, whatever its hook and class), the one to alert on: the
detailed ``tsg_adapter_ledger_errors_total`` series appears only at its first error (hooks and
exception classes are not a closed set), so ``increase()`` over it misses that first one.
"""

from __future__ import annotations

from typing import Any, Protocol

from ..metrics.prometheus import Exposition, Sample

#: The conflict kinds the runtime counts (always exposed, zeros included).
CONFLICT_KINDS = ("attempt_close", "logical_close", "delivery_mark_dropped")


class _Guard(Protocol):
    adapter_name: str

    def stats(self) -> dict[str, Any]: ...


def format_adapter_metrics(*guards: _Guard) -> str:
    """Prometheus text of the counters of ``guards`` (adapter objects: ``CeleryGuard``,
    ``TaskStateGuardMiddleware``, ``GuardedGraph``) in this process, one family each."""
    errors: list[Sample] = []
    any_errors: list[Sample] = []
    conflicts: list[Sample] = []
    reconciles: list[Sample] = []
    heartbeating: list[Sample] = []
    published: list[Sample] = []
    usable: list[Sample] = []
    for guard in guards:
        adapter = guard.adapter_name
        stats = guard.stats()
        for kind, count in sorted(stats["errors"].items()):
            hook, _, error = kind.rpartition(":")
            errors.append(({"adapter": adapter, "error": error, "hook": hook}, count))
        any_errors.append(({"adapter": adapter}, sum(stats["errors"].values())))
        counted = stats["conflicts"]
        kinds = [*CONFLICT_KINDS, *sorted(set(counted) - set(CONFLICT_KINDS))]
        conflicts += [({"adapter": adapter, "kind": k}, counted.get(k, 0)) for k in kinds]
        reconciles.append(({"adapter": adapter}, stats["reconciles"]))
        heartbeating.append(({"adapter": adapter}, stats["heartbeating"]))
        published.append(({"adapter": adapter}, stats["verdicts_published"]))
        if stats["ledger_usable"] is not None:
            usable.append(({"adapter": adapter, "reason": stats["ledger_reason"] or ""},
                           int(stats["ledger_usable"])))
    out = Exposition()
    out.family("tsg_adapter_ledger_errors_all_total", "counter",
               "Ledger errors inside framework hooks in this process, of any hook and exception "
               "class, by adapter (0 from the start: alert on this one).", any_errors)
    out.family("tsg_adapter_ledger_errors_total", "counter",
               "Ledger errors inside framework hooks in this process, by adapter, hook or "
               "operation, and exception class (the job ran on).", errors)
    out.family("tsg_adapter_conflicts_total", "counter",
               "Refused rewrites of terminal records in this process (e.g. a late completion "
               "after a reconcile closed the task), by adapter and kind.", conflicts)
    out.family("tsg_adapter_reconciles_total", "counter",
               "Reconcile passes this process ran, by adapter.", reconciles)
    out.family("tsg_adapter_heartbeating", "gauge",
               "Tasks this process holds and heartbeats right now, by adapter.", heartbeating)
    out.family("tsg_adapter_verdicts_published_total", "counter",
               "Lost-job verdicts this process published (result backend, on_lost), by "
               "adapter.", published)
    out.family("tsg_adapter_ledger_usable", "gauge",
               "1 when this process's ledger could be opened, 0 when it could not (with the "
               "fixed reason), by adapter; absent before the first open.", usable)
    return out.render()


__all__ = ["CONFLICT_KINDS", "format_adapter_metrics"]
