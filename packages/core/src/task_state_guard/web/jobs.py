"""The reads behind the job page: the job an id belongs to, its attempts, its later runs,
the run it follows, its events, its owner's liveness and its lost verdict.

An attempt's job is its nearest ancestor that is a job (a root, or a child that owes its own
delivery: a LangGraph resume or recovery run), so a recovery run's page is its own, linked to
the run it recovers. A recovery run is recognised by its id: the LangGraph adapter derives it
from the lost run's ledger id (:func:`task_state_guard.integration.ids.langgraph_recovery_id`).
"""

from __future__ import annotations

from ..integration.ids import LANGGRAPH, langgraph_recovery_id
from ..ledger import Ledger
from ..model import Task, TaskNotFound
from . import job_parts
from .pages import JobView

#: The most children of a job read for its page (attempts and later runs together).
CHILDREN_SHOWN = 100
_MAX_DEPTH = 8  # nested attempts (a LangGraph node running a subgraph) are this deep at most


def _is_job(task: Task) -> bool:
    return task.parent_id is None or task.delivery_required


def role(run: Task) -> str:
    """Whether a later run of a job recovers it (its id is the one LangGraph's recovery
    derives from its parent's) or continues it."""
    if run.parent_id is not None and run.id == LANGGRAPH.logical_task_id(
            langgraph_recovery_id(run.parent_id)):
        return job_parts.RECOVERY
    return job_parts.CONTINUATION


def job_view(ledger: Ledger, task_id: str) -> JobView:
    """What the job page of ``task_id`` shows (``TaskNotFound`` when it is gone)."""
    asked = ledger.get_task(task_id)
    job = asked
    for _ in range(_MAX_DEPTH):
        if job.parent_id is None or _is_job(job):
            break
        job = ledger.get_task(job.parent_id)
    children = ledger.children_of(job.id, limit=CHILDREN_SHOWN + 1)
    shown = children[:CHILDREN_SHOWN]
    attempts = [child for child in shown if not child.delivery_required]
    runs = tuple(child for child in shown if child.delivery_required)
    parent = None if job.parent_id is None else ledger.get_task(job.parent_id)
    events = {task.id: ledger.events_of(task.id) for task in [job, *attempts]}
    # The attempts that succeeded after the job closed otherwise (doctor's warning).
    contradicting = ledger.list_tasks(task_id=job.id, attempts=True, contradicted=True,
                                      limit=CHILDREN_SHOWN)
    return JobView(job, attempts, len(children) > CHILDREN_SHOWN, events, asked.id,
                   frozenset(item.task.id for item in contradicting.tasks),
                   contradicting.more, runs=runs, parent=parent,
                   roles={run.id: role(run) for run in (job, *runs) if run.parent_id},
                   state=ledger.job_state(job.id))


def existing(ledger: Ledger, candidates: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The candidates whose task is in the ledger (each ledger id once)."""
    found: list[tuple[str, str]] = []
    for kind, task_id in candidates:
        if any(task_id == seen for _kind, seen in found):
            continue
        try:
            ledger.get_task(task_id)
        except TaskNotFound:
            continue
        found.append((kind, task_id))
    return found


__all__ = ["CHILDREN_SHOWN", "existing", "job_view", "role"]
