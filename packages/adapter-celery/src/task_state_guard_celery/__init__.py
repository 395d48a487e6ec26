"""TaskStateGuard adapter for Celery.

``install(app, db=...)`` records every Celery task as a logical ledger task (the
parent, id ``uuid5`` of the Celery task id) with one internal child per execution
attempt, heartbeats running attempts, and reconciles the ledger when a worker boots (and
periodically with ``reconcile_interval_seconds``); a task found lost gets ``FAILURE`` with
:class:`TaskLostError` in the result backend and fires the ``on_lost`` hook.
See the package README for the full model.
"""

from __future__ import annotations

from typing import Any

from task_state_guard import Task
from task_state_guard.integration import LostTask

from ._guard import TOKEN_KEY, CeleryGuard
from ._ids import NAMESPACE, logical_task_id, name_label
from ._install import ReconcileOnBoot, guard_for, install, installed_guards, uninstall
from ._lost import TaskLostError

__all__ = [
    "NAMESPACE",
    "TOKEN_KEY",
    "CeleryGuard",
    "LostTask",
    "ReconcileOnBoot",
    "TaskLostError",
    "guard_for",
    "install",
    "logical_task_id",
    "mark_delivered",
    "mark_delivery_failed",
    "name_label",
    "uninstall",
]


def _only_guard(app: Any) -> CeleryGuard:
    if app is not None:
        guard = guard_for(app)
        if guard is None:
            raise LookupError("task-state-guard-celery is not installed on this app")
        return guard
    guards = installed_guards()
    if len(guards) != 1:
        raise LookupError(
            f"task-state-guard-celery: pass app= (installed on {len(guards)} apps)"
        )
    return guards[0]


def mark_delivered(celery_task_id: str, *, app: Any = None) -> Task | None:
    """Module-level :meth:`CeleryGuard.mark_delivered` (the guard of ``app``, or the only one)."""
    return _only_guard(app).mark_delivered(celery_task_id)


def mark_delivery_failed(celery_task_id: str, *, app: Any = None) -> Task | None:
    """Module-level :meth:`CeleryGuard.mark_delivery_failed`."""
    return _only_guard(app).mark_delivery_failed(celery_task_id)
