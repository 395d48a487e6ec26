"""Publishing LangGraph's lost-run verdicts: the report half of a recovery pass.

Whoever closes an invocation as lost (any reconcile, the CLI, another host) leaves a pending
verdict in the ledger's outbox. A recovery pass claims (with a lease) the verdicts of the lost
invocations on each thread's lineage it examines, calls ``on_lost`` with the thread id it knows
from the checkpointer, and marks them published once the thread's resumption is claimed; at
the end of a pass over every thread, the threads recorded with the verdicts still pending are
examined again (a run another process closed lost while the pass ran), and the verdicts no
checkpoint led to (a run under ``durability="exit"`` on a new thread, a thread deleted since)
are reported with the thread each run was recorded with.
Two processes never hold one verdict, so each lost run is reported once across all of them
(at least once across crashes: a process that dies between reporting and marking leaves the
verdict to the next pass once its lease expired).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from task_state_guard.integration import AdapterRuntime, LostTask, Verdict
from task_state_guard.integration import codes as c

from ._ids import logical_task_id, recovery_id_for_task
from ._lineage import Head, Link


@dataclass(frozen=True)
class Claimed:
    """A verdict this process holds, with the lineage link it belongs to (if any)."""

    verdict: Verdict
    link: Link | None

    #: The run's invocation id when only the ledger knows it (a recovery run's derived id).
    run_id: str | None = None

    def lost_task(self, thread_id: str | None) -> LostTask:
        """What ``on_lost`` gets: the thread the pass found, else the one the run was
        recorded with; the invocation id the lineage, the ledger or the derivation knows."""
        v = self.verdict
        known = self.link.invocation_id if self.link is not None else None
        run = known or v.framework_id or self.run_id
        return LostTask(run, v.task_id, v.name, v.code, thread_id or v.thread_id)


def _run_id(rt: AdapterRuntime, verdict: Verdict) -> str | None:
    """The invocation id of a lost recovery run (derived from its parent's ledger id), for a
    verdict that stores none; None for any other run."""
    if verdict.framework_id is not None:
        return None
    task = rt.get(verdict.task_id)
    parent = None if task is None else task.parent_id
    if parent is None:
        return None
    derived = recovery_id_for_task(parent)
    return derived if logical_task_id(derived) == verdict.task_id else None


def claim_lineage(rt: AdapterRuntime, head: Head) -> list[Claimed]:
    """Claim the pending verdicts of the lost invocations on ``head``'s lineage (none held by
    another process); reads only when nothing on it is lost."""
    lost = {link.task.id: link for link in head.path if link.task.status == c.TIMED_OUT}
    if not lost:
        return []
    return [Claimed(v, lost.get(v.task_id)) for v in rt.claim_verdicts(task_ids=list(lost))]


def report(rt: AdapterRuntime, claimed: Sequence[Claimed], thread_id: str | None) -> list[LostTask]:
    """Hand each claimed verdict to ``on_lost`` (a failing hook is counted, never raised)."""
    lost = [one.lost_task(thread_id) for one in claimed]
    for task in lost:
        rt.notify_lost(task)
    return lost


def publish(rt: AdapterRuntime, claimed: Sequence[Claimed]) -> None:
    """Mark the claimed verdicts published."""
    if claimed:
        rt.mark_published([one.verdict for one in claimed])


def pending_threads(rt: AdapterRuntime, batch: int = 100) -> list[str]:
    """The threads recorded with the pending, free verdicts (claimed and given back at once):
    after a pass over every thread, a run closed lost meanwhile (by another process's
    reconcile) is owed to a thread the pass may have examined before; examining it again
    reports the run with its lineage and resumes the thread in this pass."""
    threads: dict[str, None] = {}
    while True:
        verdicts = rt.claim_verdicts(limit=batch)
        if verdicts:
            rt.release_verdicts(verdicts)
        threads.update((v.thread_id, None) for v in verdicts if v.thread_id is not None)
        if len(verdicts) < batch:
            return list(threads)


def publish_unplaced(rt: AdapterRuntime, batch: int = 100) -> list[LostTask]:
    """Report and publish every verdict still pending and free (after a pass over every
    thread: no checkpoint led to them); each with the thread it was recorded with."""
    reported: list[LostTask] = []
    while True:
        claimed = [Claimed(v, None, _run_id(rt, v)) for v in rt.claim_verdicts(limit=batch)]
        reported += report(rt, claimed, None)
        publish(rt, claimed)
        if len(claimed) < batch:
            return reported


__all__ = ["Claimed", "claim_lineage", "pending_threads", "publish", "publish_unplaced",
           "report"]
