"""Find a job in the ledger by the id its framework gave it (for operators' tools)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .ids import job_task_id

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


__all__ = ["find_job"]
