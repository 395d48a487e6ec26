"""Deterministic ledger ids derived from Celery identifiers.

The logical task of a Celery task id is ``uuid5(NAMESPACE, "celery-task:" + id)``. Queued
placeholder attempts (a scheduled retry, a requeued message, a ``Task.replace()`` replacement,
the stages of a canvas that replaced a task) have deterministic ids too, so the delivery that
runs them, in whichever process, claims the same record.
"""

from __future__ import annotations

import uuid

from task_state_guard.integration import name_label
from task_state_guard.integration.ids import CELERY

#: The core's id scheme of Celery jobs (defined once in ``task_state_guard.integration.ids``,
#: where ``tsg get --celery ID`` finds it too).
IDS = CELERY
#: Namespace of every id this adapter derives (uuid5). Never changes: existing ledgers would
#: no longer find their logical tasks.
NAMESPACE = IDS.namespace


def logical_task_id(celery_task_id: str) -> str:
    """Return the ledger id of the logical task (the parent) of a Celery task id."""
    return IDS.logical_task_id(celery_task_id)


def retry_attempt_id(celery_task_id: str, retries: int) -> str:
    """Id of the queued attempt that stands for retry number ``retries`` (>= 1)."""
    return IDS.derived_id(f"celery-retry:{celery_task_id}:{int(retries)}")


def requeue_attempt_id(celery_task_id: str, retries: int) -> str:
    """Id of the queued attempt that stands for a requeued message (Reject, cancel)."""
    return IDS.derived_id(f"celery-requeue:{celery_task_id}:{int(retries)}")


def replace_attempt_id(celery_task_id: str, nesting: int) -> str:
    """Id of the queued attempt that stands for a ``Task.replace()`` replacement (>= 1)."""
    return IDS.derived_id(f"celery-replace:{celery_task_id}:{int(nesting)}")


def stage_attempt_id(replaced_id: str, stage_id: str, retries: int, nesting: int) -> str:
    """Id of the attempt that stands, under the logical task of a task replaced by a canvas
    (``replaced_id``), for one delivery of a task of that canvas (``stage_id``, its retry count
    and its ``replaced_task_nesting``); queued when that message is published."""
    return IDS.derived_id(
        f"celery-stage:{replaced_id}:{stage_id}:{int(retries)}:{int(nesting)}"
    )


def stage_fallback_id(replaced_id: str, attempt_id: str) -> str:
    """Id of the stage record of a delivery that found its queued one taken (a redelivery):
    derived from the delivery's own attempt, so the main process can find it too."""
    return IDS.derived_id(f"celery-stage-attempt:{replaced_id}:{attempt_id}")


def token_attempt_id(token: object) -> str | None:
    """Turn the per-delivery token injected at receipt into an attempt id."""
    try:
        return str(uuid.UUID(hex=str(token)))
    except (TypeError, ValueError):
        return None


__all__ = [
    "NAMESPACE",
    "logical_task_id",
    "name_label",
    "replace_attempt_id",
    "requeue_attempt_id",
    "retry_attempt_id",
    "stage_attempt_id",
    "stage_fallback_id",
    "token_attempt_id",
]
