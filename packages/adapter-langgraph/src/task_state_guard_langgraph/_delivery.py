"""A recovery run's delivery settles the runs it recovers.

A lost (or drained) invocation owes its caller an answer; the run that recovers it, a child
derived from its ledger id (:func:`._ids.recovery_id_for_task`), produces that answer and
carries the obligation. When the recovery's delivery is marked (delivered, or failed), the
invocations it recovers whose delivery is still pending are marked the same way: the lost
run, and a recovery run that died before it, up the chain. So a crash raises one signal (the
lost-run verdict), not also a delivery failure for the lost run once the delivery grace ran
out.
"""

from __future__ import annotations

from task_state_guard import StateConflict, Task
from task_state_guard.integration import AdapterRuntime
from task_state_guard.integration import codes as c

from ._ids import logical_task_id, recovery_id_for_task

#: Longest chain of recovery runs walked (each a recovery of the one before).
_MAX_CHAIN = 256


def _recovered(rt: AdapterRuntime, task: Task) -> Task | None:
    """The invocation ``task`` recovers (its parent), when ``task`` is a recovery run."""
    parent = task.parent_id
    if parent is None or logical_task_id(recovery_id_for_task(parent)) != task.id:
        return None
    found: Task | None = rt.get(parent)
    return found


def settle_recovered(rt: AdapterRuntime, task_id: str, outcome: c.Outcome) -> int:
    """Mark ``outcome`` on the pending deliveries of the invocations the run ``task_id``
    recovers, up the chain of recoveries; returns how many were marked. A delivery closed
    meanwhile (by the user, or by reconcile) is left as it is."""
    state, code = outcome
    assert state is not None
    settled = 0
    task = rt.get(task_id)
    for _ in range(_MAX_CHAIN):
        recovered = None if task is None else _recovered(rt, task)
        if recovered is None:
            return settled
        if recovered.delivery_status == c.PENDING and recovered.status not in c.ACTIVE:
            try:
                rt.ledger.set_delivery(recovered.id, state, code=code)
                settled += 1
            except StateConflict:
                pass  # its delivery was closed meanwhile
        task = recovered
    return settled


def settle_recovered_by(rt: AdapterRuntime, invocation_id: str, outcome: c.Outcome) -> None:
    """:func:`settle_recovered` for the run of ``invocation_id``, once its own delivery was
    marked ``outcome``; a ledger error is counted under ``settle_recovered``."""
    own = logical_task_id(invocation_id)
    rt.policy.call("settle_recovered", lambda: settle_recovered(rt, own, outcome))


__all__ = ["settle_recovered", "settle_recovered_by"]
