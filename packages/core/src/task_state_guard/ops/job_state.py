"""What the job page adds to a job's rows: its lost verdict and whether its owners live.

A job closed as lost owes its framework a verdict (:mod:`.verdicts`): none, ``pending`` (no
adapter has published it yet) or ``published`` (with the time). A running task names the
process that runs it (an owner token, never shown); the backend's probe tells whether that
process is alive, provably dead, or unknown. Both are read through the listing's one statement
(:func:`task_state_guard.store.queries.listing`) narrowed to the job, in one snapshot.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..model import Liveness, is_canonical
from ..store import queries
from . import verdicts

if TYPE_CHECKING:
    from ..store.protocol import Database

#: Most running attempts whose owners one read probes.
MAX_PROBED = 100


@dataclass(frozen=True, slots=True)
class VerdictState:
    """A job's lost verdict: ``pending`` or ``published``, when the close recorded it and
    (published) when an adapter published it."""

    state: str
    recorded_at: float
    published_at: float | None


@dataclass(frozen=True, slots=True)
class JobState:
    """A job's verdict (None: it owes none) and the liveness of the owner of the job and of
    each of its running attempts (by ledger id; a task without an owner, or not running, is
    absent)."""

    verdict: VerdictState | None
    owners: dict[str, Liveness]


def _query(job: str, attempts: bool, limit: int) -> queries.TaskQuery:
    return queries.TaskQuery(
        attempts=attempts, job=job, open_only=False, status="running" if attempts else None,
        active_only=False, name=None, idle_before=None, created_before=None, order="created",
        descending=False, after=None, limit=limit)


def _finite(value: Any) -> bool:
    return type(value) in (int, float) and math.isfinite(value)


def _verdict(row: tuple[Any, ...]) -> VerdictState | None:
    state, recorded, published = row
    if state not in ("pending", "published") or not _finite(recorded) or (
            published is not None and not _finite(published)):
        return None  # none owed, or a tampered row (doctor reports it)
    return VerdictState(state, float(recorded), None if published is None else float(published))


def job_state(db: Database, job_id: str) -> JobState | None:
    """The verdict and owners of the job ``job_id`` (a canonical id); None when unknown."""
    outbox = verdicts.current(db)
    columns = f"id, status, owner, {queries.VERDICT_COLUMNS if outbox else 'NULL, NULL, NULL'}"
    with db.read() as conn:
        rows = db.queries.list_tasks(conn, columns, _query(job_id, False, 1))
        if not rows:
            return None
        running = db.queries.list_tasks(conn, "id, status, owner", _query(job_id, True,
                                                                         MAX_PROBED))
    owners: dict[str, Liveness] = {}
    for row in [rows[0][:3], *(r[:3] for r in running)]:
        task_id, status, owner = row
        if status == "running" and isinstance(owner, str) and type(task_id) is str \
                and is_canonical(task_id):
            owners[task_id] = db.owners.probe(owner)
    return JobState(_verdict(tuple(rows[0][3:6])), owners)


__all__ = ["MAX_PROBED", "JobState", "VerdictState", "job_state"]
