"""Attempts seen from a supervising process: one that hands jobs to other processes and learns
how a delivery ended from outside (a pool's main process: a child lost, a hard time limit, a
revocation, a cancel at shutdown, a redelivery of a job whose earlier process died silently).

Such a process did not run the attempt: it finds the attempt the delivery ran as from the ids
it can derive, and ends it only while it is still open, so that an end already recorded by the
process that ran it (or by a reconcile) is left alone and counts no conflict. Each operation
reads and then writes, outside any transaction; none is on a job's success path.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import TYPE_CHECKING

from . import codes

if TYPE_CHECKING:
    from . import AdapterRuntime


def first_open(
    rt: AdapterRuntime, candidates: Iterable[str], states: Collection[str] = codes.ACTIVE
) -> str | None:
    """The first of ``candidates`` the ledger has in one of ``states`` (queued or running by
    default), else ``None``."""
    for candidate in candidates:
        found = rt.get(candidate)
        if found is not None and found.status in states:
            return candidate
    return None


def attempt_ran_as(
    rt: AdapterRuntime, own_id: str | None, claimable: Iterable[str]
) -> str | None:
    """The attempt a delivery ran as: its own fresh attempt ``own_id`` when the ledger has it
    (in any state), else the first of ``claimable`` (the queued attempts the delivery may have
    claimed: a retry, a requeue, a replacement) that is running; ``None`` when the process that
    ran it recorded none."""
    if own_id is not None and rt.get(own_id) is not None:
        return own_id
    return first_open(rt, claimable, (codes.RUNNING,))


def end_if_open(
    rt: AdapterRuntime,
    attempt_id: str | None,
    outcome: codes.Outcome,
    *,
    where: str,
    states: Collection[str] = codes.ACTIVE,
) -> bool:
    """Close ``attempt_id`` with ``outcome`` (and its delivery ``not_applicable/internal_task``)
    while the ledger has it in one of ``states`` (queued or running by default); an attempt
    that is missing, ended already or in another state is left alone. True when closed.
    Without running among ``states`` the close itself applies only while it is still queued:
    one that starts between the read and the write is left running."""
    if attempt_id is None or first_open(rt, (attempt_id,), states) is None:
        return False
    only = () if codes.RUNNING in states else (attempt_id,)
    closing = (attempt_id, outcome[0], outcome[1], True)
    return rt.close_tasks((closing,), where=where, if_queued=only) == 1


__all__ = ["attempt_ran_as", "end_if_open", "first_open"]
