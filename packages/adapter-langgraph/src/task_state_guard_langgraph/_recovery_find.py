"""Finding what a recovery pass has to do: each thread's head (:mod:`._lineage`), classified.

A head ``timed_out`` is **lost**, one ``cancelled/interrupted`` **drained**, one
``cancelled/caller_cancelled`` **cancelled** (see :mod:`._recovery`); a head that is none of
these still matters when a run earlier on its lineage was lost (its verdict is owed a report).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from task_state_guard.integration import codes as c

from . import _node_replay as replay
from ._lineage import (
    Head,
    acheckpoint_invocation,
    aget_tuple,
    checkpoint_invocation,
    resume_pending,
    thread_head,
)
from ._recovery_types import CANCELLED, DRAINED, LOST, RecoveryScope


@dataclass(frozen=True)
class Finding:
    """A thread a recovery pass examined, with what is to be done for it."""

    thread_id: str
    head: Head
    #: ``LOST``, ``DRAINED``, ``CANCELLED``, or ``None``: nothing to do for the thread itself
    #: (a lost run earlier on its lineage may still be owed a report).
    kind: str | None
    #: ``invoke(None)`` would run something: work left, no failed task, no interrupt waiting
    #: for a human (unless its answer is saved).
    resumable: bool
    #: The thread has work left at all.
    work_left: bool
    #: The node attempts of the lost runs on the lineage, from the checkpoints (by invocation
    #: id): written by the process that claims their verdicts.
    lost_nodes: dict[str, list[replay.LostNode]] = field(default_factory=dict)


def _kind(head: Head) -> str | None:
    task = head.task
    if task.status == c.TIMED_OUT:
        return LOST
    if task.status == c.CANCELLED and task.terminal_code == c.INTERRUPTED:
        return DRAINED
    if task.status == c.CANCELLED and task.terminal_code == c.CALLER_CANCELLED:
        return CANCELLED
    return None


def _finding(
    thread_id: str, head: Head, kind: str | None, state: Any, tup: Any,
    lost_nodes: dict[str, list[replay.LostNode]],
) -> Finding:
    if state is None:
        return Finding(thread_id, head, kind, False, False, lost_nodes)
    work_left = bool(state.next)
    failed = any(t.error is not None for t in state.tasks)
    waiting = any(t.interrupts for t in state.tasks) and not resume_pending(tup)
    return Finding(
        thread_id, head, kind, work_left and not failed and not waiting, work_left, lost_nodes
    )


def _lineage_lost(head: Head) -> bool:
    return any(link.task.status == c.TIMED_OUT for link in head.path)


def nothing_to_recover(scope: RecoveryScope) -> bool:
    """True when the ledger holds no ``timed_out`` and no ``cancelled`` task at all: no
    invocation can be lost, drained or abandoned, so the checkpointer is not read."""
    ledger = scope.ledger()
    return ledger is not None and not any(
        ledger.find_task_ids(status, limit=1) for status in (c.TIMED_OUT, c.CANCELLED)
    )


def _head(scope: RecoveryScope, named: str) -> tuple[Head, str | None] | None:
    rt = scope.rec.rt
    head = thread_head(rt.get, scope.rec.children, named)
    if head is None:
        return None  # unknown to the ledger: no proof it is not running elsewhere
    kind = _kind(head)
    if kind == DRAINED and head.task.id in scope.runs.drained_here:
        kind = None  # a drain by this live process is left to the next start
    if kind is None and not _lineage_lost(head):
        return None
    return head, kind


def examine(scope: RecoveryScope, saver: Any, thread_id: str) -> Finding | None:
    tup = saver.get_tuple({"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}})
    named = checkpoint_invocation(saver, tup)
    found = None if named is None else _head(scope, named)
    if found is None:
        return None
    state = None
    if found[1] is not None:
        state = scope.graph.get_state({"configurable": {"thread_id": thread_id}})
    lost_nodes = replay.read(scope.graph, thread_id, found[0])
    return _finding(thread_id, *found, state, tup, lost_nodes)


async def aexamine(scope: RecoveryScope, saver: Any, thread_id: str) -> Finding | None:
    tup = await aget_tuple(
        saver, {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
    )
    named = await acheckpoint_invocation(saver, tup)
    found = None if named is None else await scope.rec.call(_head, scope, named)
    if found is None:
        return None
    state = None
    if found[1] is not None:
        state = await scope.graph.aget_state({"configurable": {"thread_id": thread_id}})
    lost_nodes = await replay.aread(scope.graph, thread_id, found[0])
    return _finding(thread_id, *found, state, tup, lost_nodes)


__all__ = ["Finding", "aexamine", "examine", "nothing_to_recover"]
