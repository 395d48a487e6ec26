"""Lost tasks in Celery's result backend: ``FAILURE`` with :class:`TaskLostError`.

When a reconcile (at boot, periodic, or called) closes the logical task of a Celery task
whose worker died (or that went stale or passed its deadline), and the app has a result
backend, the backend gets ``FAILURE`` with a :class:`TaskLostError` carrying the ledger's code,
so ``AsyncResult.state`` stops saying ``STARTED`` and ``AsyncResult.get()`` raises instead of
waiting forever. Only a task the backend still reports ``PENDING``, ``STARTED`` or ``RETRY`` is
written; ``SUCCESS``, ``FAILURE``, ``REVOKED`` (any other state) are never overwritten. The
check and the write are two backend calls: a worker that stores a result in between is
overwritten only if it wrote within that moment, which a lost task's worker cannot do.
"""

from __future__ import annotations

from typing import Any

from celery import states  # type: ignore[import-untyped]
from celery.exceptions import WorkerLostError  # type: ignore[import-untyped]
from task_state_guard.integration import LostTask

#: The backend states a lost task may be moved out of.
OPEN_STATES = frozenset({states.PENDING, states.STARTED, states.RETRY})


class TaskLostError(WorkerLostError):  # type: ignore[misc]
    """A ``WorkerLostError`` written by TaskStateGuard for a task a reconcile found lost.

    ``args`` are ``(message, code)``; :attr:`code` is the ledger's reason (``owner_lost``:
    the worker process died; ``restart_stale``: no heartbeat for the active grace;
    ``deadline_exceeded``: past its timeout). It round-trips through Celery's exception
    serialization when ``task_state_guard_celery`` is importable where the result is read.
    """

    def __init__(self, message: str = "task lost", code: str | None = None) -> None:
        super().__init__(message, code)

    @property
    def code(self) -> str | None:
        """The ledger's reason code."""
        return self.args[1] if len(self.args) > 1 else None


TaskLostError.__module__ = "task_state_guard_celery"


def stores_results(backend: Any) -> bool:
    """Whether ``backend`` keeps results that can be read back by task id (not disabled, not
    ``rpc://``, whose results live on the caller's queue: a read there would declare a reply
    queue and see nothing)."""
    from celery.backends.base import DisabledBackend  # type: ignore[import-untyped]

    if isinstance(backend, DisabledBackend):
        return False
    as_uri = getattr(backend, "as_uri", None)
    return not (callable(as_uri) and as_uri() == "rpc://")


def stored_state(backend: Any, celery_id: str) -> str | None:
    """The state ``backend`` holds for ``celery_id``; ``None`` when it keeps no results."""
    return str(backend.get_state(celery_id)) if stores_results(backend) else None


def _readable(app: Any) -> Any:
    """``app``'s result backend when results of its tasks can be read back, else ``None``."""
    if app.conf.task_always_eager and not app.conf.task_store_eager_result:
        return None  # eager results are never stored: nobody reads them from the backend
    backend = app.backend
    return backend if stores_results(backend) else None


def succeeded_in_backend(app: Any, lost: LostTask) -> bool:
    """Whether ``app``'s result backend holds ``SUCCESS`` for ``lost`` (the adapter's success
    check: such a job is closed succeeded, or its verdict superseded, never reported lost)."""
    if lost.framework_id is None:
        return False
    backend = _readable(app)
    return backend is not None and stored_state(backend, lost.framework_id) == states.SUCCESS


def fail_in_backend(app: Any, lost: LostTask) -> bool:
    """Write ``FAILURE`` for ``lost`` into ``app``'s result backend if it is still open there.

    Returns True when written; False without a backend, without a stored Celery id (a custom
    id is never stored, so there is no result to address) or when the task is settled there.
    """
    if lost.framework_id is None:
        return False
    backend = _readable(app)
    if backend is None or stored_state(backend, lost.framework_id) not in OPEN_STATES:
        return False
    exc = TaskLostError(
        f"task-state-guard: the worker running this task was lost ({lost.code})", lost.code
    )
    backend.mark_as_failure(lost.framework_id, exc, call_errbacks=False)
    return True


__all__ = ["OPEN_STATES", "TaskLostError", "fail_in_backend", "stored_state", "stores_results",
           "succeeded_in_backend"]
