"""A job replaced by other work: its outcome waits on the deliveries of its replacement.

A framework may let a running job hand its outcome over to other jobs (Celery's
``Task.replace()``: a chain, a chord, a group). The replaced job stays open while the work of
its replacement runs: each delivery of that work claims a *stage* attempt under the replaced
job's logical task, which keeps it open and fresh, and closes it with its own outcome. The
replaced job then ends with the replacement's last task, or, when a stage ends without success,
with that stage's outcome, what of the replacement was still queued being skipped; a job
whose replacement ended quietly (the stage itself was replaced or ignored) ends only once none
of its work is queued or running any more.

The adapter names the replaced jobs (their logical task ids), the placeholders it queued for
each message and the outcome codes; these operations read the ledger and decide the writes.
None is on the path of a job that is not part of a replacement.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from contextlib import nullcontext
from typing import TYPE_CHECKING, NamedTuple

from . import codes
from .attempts import AttemptSpec
from .closing import Closing

if TYPE_CHECKING:
    from . import AdapterRuntime


def job_open(rt: AdapterRuntime, job_id: str) -> bool:
    """True while the logical task ``job_id`` is recorded and not terminal: a replaced job
    whose outcome still waits on its replacement (an ended one waits no more)."""
    found = rt.get(job_id)
    return found is not None and found.status not in codes.TERMINAL


def begin_with_stages(
    rt: AdapterRuntime,
    begin: Callable[[], str],
    job_id: str,
    stages: Mapping[str, tuple[str, str]],
    *,
    fallback_id: Callable[[str, str], str],
    name: str | None,
    timeout_seconds: float | None = None,
) -> tuple[str, dict[str, str]]:
    """Begin a delivery that works for replaced jobs: its own attempt and its stage attempts in
    one transaction; returns the attempt's id and the stage attempts by key.

    ``begin`` begins the delivery's own attempt under its logical task ``job_id`` (the
    adapter's :meth:`~task_state_guard.integration.AdapterRuntime.begin_attempt` call, which
    holds both). ``stages`` maps a key of the adapter's choice to ``(replaced_job_id,
    placeholder_id)``: the queued stage attempt published for this message, claimed (recorded
    first when missing); when another delivery has it, a fresh stage attempt is recorded with
    id ``fallback_id(key, attempt_id)``. The stage attempts are held (heartbeaten) until
    released. When anything fails, nothing is written, the delivery's attempt and logical task
    are released and the error is raised.
    """
    attempt: str | None = None
    claimed: dict[str, str] = {}
    try:
        with rt.ledger.atomic() if stages else nullcontext():
            attempt = begin()
            for key, (replaced, placeholder) in stages.items():
                claimed[key] = rt.claim_attempt(AttemptSpec(
                    replaced, name, candidates=[(placeholder, True)],
                    attempt_id=fallback_id(key, attempt), timeout_seconds=timeout_seconds,
                ))
    except BaseException:
        if attempt is not None:
            rt.release(attempt, job_id)
        raise
    if claimed:
        rt.hold(*claimed.values())
    return attempt, claimed


class Endings(NamedTuple):
    """The closes that end replaced jobs (:func:`replaced_endings`), for one write: pass
    ``closings`` and ``if_queued`` to
    :meth:`~task_state_guard.integration.AdapterRuntime.close_tasks` (or ``end_attempt``)."""

    closings: list[Closing]
    #: The stage attempts skipped: closed only while still queued.
    if_queued: frozenset[str]


def replaced_endings(
    rt: AdapterRuntime, job_ids: Iterable[str], outcome: codes.Outcome
) -> Endings:
    """The closes that end replaced jobs whose replacement ended without success: for each job
    still open, its attempts queued ``cancelled/skipped``, then the job with ``outcome``.

    A stage is skipped only if it is still queued when the write runs (``if_queued``): one
    whose delivery started after this read keeps running, and its delivery closes it with how
    it ran. Reads the ledger: call it outside of a transaction."""
    closings: list[Closing] = []
    skipped: set[str] = set()
    for job in job_ids:
        if not job_open(rt, job):
            continue
        for child in rt.ledger.children_of(job):
            if child.status == codes.QUEUED:
                closings.append((child.id, codes.CANCELLED, codes.SKIPPED, True))
                skipped.add(child.id)
        closings.append((job, outcome[0], outcome[1], False))
    return Endings(closings, frozenset(skipped))


def settle_if_idle(
    rt: AdapterRuntime, job_id: str, outcome: codes.Outcome, *, where: str
) -> bool:
    """Close the logical task ``job_id`` with ``outcome`` unless it is closed already or still
    has an attempt queued or running (its replacement carries it on). True when closed."""
    if not job_open(rt, job_id):
        return False
    if any(child.status in codes.ACTIVE for child in rt.ledger.children_of(job_id)):
        return False
    return rt.close_logical(job_id, outcome[0], outcome[1], where=where)


__all__ = ["Endings", "begin_with_stages", "job_open", "replaced_endings", "settle_if_idle"]
