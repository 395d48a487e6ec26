"""Deterministic ledger ids and name labels derived from Celery identifiers."""

from __future__ import annotations

import re
import uuid

#: Namespace of every id this adapter derives (uuid5). Never change it: existing
#: ledgers would no longer find their logical tasks.
NAMESPACE = uuid.UUID("5b0c0e52-7c8f-5d0e-9a51-0c3e1a7a4c11")

_NAME_RE = re.compile(r"[A-Za-z0-9_<][A-Za-z0-9_.:\-/<>]{0,199}")


def logical_task_id(celery_task_id: str) -> str:
    """Return the ledger id of the logical task (the parent) of a Celery task id."""
    return str(uuid.uuid5(NAMESPACE, f"celery-task:{celery_task_id}"))


def retry_attempt_id(celery_task_id: str, retries: int) -> str:
    """Id of the queued attempt that stands for retry number ``retries`` (>= 1)."""
    return str(uuid.uuid5(NAMESPACE, f"celery-retry:{celery_task_id}:{int(retries)}"))


def requeue_attempt_id(celery_task_id: str, retries: int) -> str:
    """Id of the queued attempt that stands for a requeued message (Reject, cancel)."""
    return str(uuid.uuid5(NAMESPACE, f"celery-requeue:{celery_task_id}:{int(retries)}"))


def replace_attempt_id(celery_task_id: str, nesting: int) -> str:
    """Id of the queued attempt that stands for a ``Task.replace()`` replacement (>= 1)."""
    return str(uuid.uuid5(NAMESPACE, f"celery-replace:{celery_task_id}:{int(nesting)}"))


def token_attempt_id(token: str) -> str | None:
    """Turn the per-delivery token injected at receipt into an attempt id."""
    try:
        return str(uuid.UUID(hex=str(token)))
    except (TypeError, ValueError):
        return None


def name_label(name: object) -> str | None:
    """The task name as a ledger name label, or ``None`` when it does not fit.

    The ledger accepts 1-200 characters of ``[A-Za-z0-9_.:-/<>]`` starting with an
    alphanumeric, ``_`` or ``<``. A name that does not fit is dropped, never
    rewritten into something that could collide with another task's name.
    """
    if not isinstance(name, str):
        return None
    return name if _NAME_RE.fullmatch(name) else None
