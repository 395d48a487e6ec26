"""What a lost job looks like to the user's ``on_lost`` hook and to an adapter's success check
(its own module: the verdict publisher and the success check both take it)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LostTask:
    """A job found lost: what the ``on_lost`` hook receives (in-process only, never logged).

    ``framework_id``: the framework's id of the job (Celery task id, Dramatiq message id,
    LangGraph invocation id) when it is known: a verdict carries it only where it was stored
    (a canonical UUID), else ``None`` (a custom Celery id, say: the hook still gets the ledger
    id and the name); ``task_id``: its logical task's ledger id; ``name``: the name label
    (task, actor or graph name); ``code``: why it was closed (``owner_lost``,
    ``restart_stale`` or ``deadline_exceeded``); ``thread_id``: the LangGraph thread, else
    ``None``.
    """

    framework_id: str | None
    task_id: str
    name: str | None
    code: str
    thread_id: str | None = None


#: The ``on_lost`` hook: called once per lost job, after the reconcile that found it committed.
LostHook = Callable[[LostTask], object]


__all__ = ["LostHook", "LostTask"]
