"""Settling a finding: report the lost runs of a thread's lineage whose verdicts this process
claims, and claim the thread's resumption. Starting the recovering invocation is the claim: its
id is derived from the head's ledger id, so exactly one process starts it."""

from __future__ import annotations

from functools import partial
from typing import Any

from . import _node_replay as replay
from ._ids import recovery_id_for_task
from ._invocation import Invocation
from ._recovery_find import Finding
from ._recovery_types import CANCELLED, DRAINED, LOST, RecoveryReport, RecoveryScope
from ._verdicts import claim_lineage
from ._verdicts import publish as publish_claimed
from ._verdicts import report as report_lost
from .callbacks import GuardCallbackHandler, logger


def settle(
    scope: RecoveryScope,
    finding: Finding,
    config: dict[str, Any] | None,
    report: RecoveryReport,
    handler_cls: type[GuardCallbackHandler],
) -> Invocation | None:
    """Report the lost runs of the thread's lineage whose verdicts this process claims,
    and claim the thread's resumption when it can be resumed (ledger writes: off the
    event loop in async passes). Returns the claimed run."""
    rt = scope.rec.rt
    claimed = claim_lineage(rt, finding.head)
    # The node history the lost runs' processes took with them, from the checkpoints.
    rt.policy.call("node_replay", partial(replay.write_claimed, rt, claimed,
                                          finding.lost_nodes))
    lost = report_lost(rt, claimed, finding.thread_id)
    if lost:
        report.lost.append(finding.thread_id)
        report.reported.extend(lost)
    run: Invocation | None = None
    if finding.kind == CANCELLED and finding.work_left:
        report.cancelled.append(finding.thread_id)
        if finding.head.task.id not in scope.seen_cancelled:
            scope.seen_cancelled.add(finding.head.task.id)
            logger.info(
                "recovery: a thread's last run was cancelled by its caller with work left; "
                "it is reported, not resumed"
            )
    elif finding.kind in (LOST, DRAINED) and finding.resumable:
        run = _claim(scope, finding, config, handler_cls)
        if run is None:
            report.claimed_elsewhere += 1
            logger.info("recovery: another process is resuming a thread; left to it")
    # Published once the resumption is claimed (by this process or another).
    publish_claimed(rt, claimed)
    return run


def _claim(
    scope: RecoveryScope,
    finding: Finding,
    config: dict[str, Any] | None,
    handler_cls: type[GuardCallbackHandler],
) -> Invocation | None:
    """Start the recovering invocation (None: another process started it first)."""
    base = dict(config or {})
    base["configurable"] = {
        **(base.get("configurable") or {}), "thread_id": finding.thread_id
    }
    head = finding.head.task
    return scope.runs.open_run(
        base, recovery_id_for_task(head.id), head.id, True, handler_cls, recovery=True
    )


__all__ = ["settle"]
