"""Publishing LangGraph's lost-run verdicts: the report half of a recovery pass.

Whoever closes an invocation as lost (any reconcile, the CLI, another host) leaves a pending
verdict in the ledger's outbox. A recovery pass claims (with a lease) the verdicts of the lost
invocations on each thread's lineage it examines, calls ``on_lost`` with the thread id it knows
from the checkpointer, and marks them published once the thread's resumption is claimed; at
the end of a pass over every thread, the verdicts no thread led to (a run under
``durability="exit"`` on a new thread, a thread deleted since) are reported without a thread.
Two processes never hold one verdict, so each lost run is reported once across all of them
(at least once across crashes: a process that dies between reporting and marking leaves the
verdict to the next pass once its lease expired).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from task_state_guard.integration import AdapterRuntime, LostTask, Verdict
from task_state_guard.integration import codes as c

from ._lineage import Head, Link


@dataclass(frozen=True)
class Claimed:
    """A verdict this process holds, with the lineage link it belongs to (if any)."""

    verdict: Verdict
    link: Link | None

    def lost_task(self, thread_id: str | None) -> LostTask:
        v = self.verdict
        known = self.link.invocation_id if self.link is not None else None
        return LostTask(known or v.framework_id, v.task_id, v.name, v.code, thread_id)


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


def publish_unplaced(rt: AdapterRuntime, batch: int = 100) -> list[LostTask]:
    """Report and publish every verdict still pending and free (after a pass over every
    thread: no thread led to them)."""
    reported: list[LostTask] = []
    while True:
        claimed = [Claimed(v, None) for v in rt.claim_verdicts(limit=batch)]
        reported += report(rt, claimed, None)
        publish(rt, claimed)
        if len(claimed) < batch:
            return reported


__all__ = ["Claimed", "claim_lineage", "publish", "publish_unplaced", "report"]
