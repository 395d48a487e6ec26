"""Find a job in the ledger by the id its framework gave it (for operators' tools)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import reasons as r
from ..model import InvalidInput, TaskNotFound, canonical_id
from .ids import FRAMEWORKS, job_task_id

if TYPE_CHECKING:
    from ..ledger import Ledger
    from ..model import Task


def find_job(ledger: Ledger, framework: str, framework_id: str) -> Task:
    """The job (logical task) that ``framework`` knows as ``framework_id``.

    The ledger id is computed with :func:`~task_state_guard.integration.ids.job_task_id` (so a
    custom id works, and nothing is stored to make it work); ``TaskNotFound`` when the ledger
    has no such job, ``InvalidInput`` for an unknown framework or an empty id. Neither error
    repeats the id.
    """
    return ledger.get_task(job_task_id(framework, framework_id))


def candidate_ids(any_id: str) -> list[str]:
    """The ledger ids ``any_id`` may name: itself when it is a UUID (a ledger id), and the job
    id of each framework (:data:`~task_state_guard.integration.ids.FRAMEWORKS`), without
    repeats. ``InvalidInput`` when it can be none of them (not a non-empty string, a lone
    surrogate); the error never repeats it."""
    found: list[str] = []
    tries: list[tuple[str | None, str]] = [(None, any_id)]
    tries += [(framework, any_id) for framework in FRAMEWORKS]
    for framework, text in tries:
        try:
            task_id = canonical_id(text) if framework is None else job_task_id(framework, text)
        except InvalidInput:
            continue
        if task_id not in found:
            found.append(task_id)
    if not found:
        raise InvalidInput("the id must be a ledger id or a framework's job id")
    return found


def find_any(ledger: Ledger, any_id: str) -> Task:
    """The one task ``any_id`` names, as a ledger id or as any framework's job id.

    ``TaskNotFound`` when it names none; ``InvalidInput`` (reason ``ambiguous_id``) when it
    names more than one (then name the framework: :func:`find_job`). No error repeats the id.
    """
    tasks: list[Task] = []
    for task_id in candidate_ids(any_id):
        try:
            tasks.append(ledger.get_task(task_id))
        except TaskNotFound:
            continue
    if not tasks:
        raise TaskNotFound("no task has that id")
    if len(tasks) > 1:
        raise InvalidInput(
            "the id names more than one task: name the framework", reason=r.AMBIGUOUS_ID
        )
    return tasks[0]


__all__ = ["candidate_ids", "find_any", "find_job"]
