"""Readers of Celery tasks and requests, and the per-delivery record kept on the request.

Celery hands receivers a task (whose ``request`` is the execution context) or a worker
``Request``; the fields the adapter needs are read here, defensively, in one place.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ._ids import (
    logical_task_id,
    replace_attempt_id,
    requeue_attempt_id,
    retry_attempt_id,
    token_attempt_id,
)

#: Key of the per-delivery token injected into ``request_dict`` at receipt.
TOKEN_KEY = "tsg_attempt"

#: Message header naming the replaced tasks (Celery ids) whose outcome waits on this message:
#: set on the messages of a canvas that replaced a task (see ``_replace``).
REPLACED_KEY = "tsg_replaced"

# The one attribute the executing process sets on a task's request context.
_ATTEMPT_ATTR = "_tsg_attempt"


@dataclass(eq=False)
class Attempt:
    """The attempt one delivery runs as, in the process that executes it."""

    attempt_id: str
    parent_id: str
    closed: bool = False
    released: bool = False
    #: Stage records this delivery runs under replaced tasks: Celery id -> stage attempt id.
    stages: dict[str, str] = field(default_factory=dict)


def attempt_of(ctx: Any) -> Attempt | None:
    """The attempt recorded for this execution context, if the executing process recorded one."""
    found = getattr(ctx, _ATTEMPT_ATTR, None)
    return found if isinstance(found, Attempt) else None


def set_attempt(ctx: Any, attempt: Attempt) -> None:
    """Attach the attempt to the execution context (read back by :func:`attempt_of`)."""
    setattr(ctx, _ATTEMPT_ATTR, attempt)


def retries(ctx: Any) -> int:
    """How many retries preceded this execution (0 for the first delivery)."""
    try:
        return max(0, int(getattr(ctx, "retries", 0) or 0))
    except (TypeError, ValueError):
        return 0


def redelivered(ctx: Any) -> bool:
    """True when the broker flags the message as redelivered."""
    info = getattr(ctx, "delivery_info", None) or {}
    return bool(info.get("redelivered")) if isinstance(info, dict) else False


def token(ctx: Any) -> Any:
    """The per-delivery token the main process injected at receipt, if any."""
    return getattr(ctx, TOKEN_KEY, None)


def nesting(ctx: Any) -> int:
    """How many ``Task.replace()`` replacements led to this execution (0: none)."""
    value = getattr(ctx, "replaced_task_nesting", None)
    if value is None:
        value = (getattr(ctx, "request_dict", None) or {}).get("replaced_task_nesting")
    try:
        return max(0, int(value or 0))
    except (TypeError, ValueError):
        return 0


def replaced_ids(ctx: Any) -> list[str]:
    """The replaced tasks (Celery ids) whose outcome waits on this delivery (its header)."""
    value = getattr(ctx, REPLACED_KEY, None)
    if value is None:
        value = (getattr(ctx, "request_dict", None) or {}).get(REPLACED_KEY)
    if not isinstance(value, list | tuple):
        return []
    return [item for item in value if isinstance(item, str) and item]


def delivers(task: Any) -> bool:
    """True when the task declares a user-facing delivery (``@app.task(tsg_delivery=True)``)."""
    return bool(getattr(task, "tsg_delivery", False))


def acks_late(task: Any) -> bool:
    """True for an ``acks_late`` task (the broker redelivers it if its worker dies)."""
    return bool(getattr(task, "acks_late", False))


def attempt_timeout(task: Any) -> float | None:
    """The per-attempt deadline the task declares (``tsg_timeout``), if a positive number."""
    value = getattr(task, "tsg_timeout", None)
    if value is None:
        return None
    try:
        result = float(value)
    except (TypeError, ValueError):
        return None
    return result if 0 < result < float("inf") else None


def expected_attempts(ctx: Any, celery_id: str) -> list[tuple[str, bool]]:
    """The queued placeholders a delivery may claim, in order (see ``claim_attempt``).

    A retry (created when missing: its own signal may still be on its way), else a
    ``Task.replace()`` replacement; then, for a redelivered message, its requeue placeholder.
    """
    out: list[tuple[str, bool]] = []
    count, depth = retries(ctx), nesting(ctx)
    if count > 0:
        out.append((retry_attempt_id(celery_id, count), True))
    elif depth > 0:
        out.append((replace_attempt_id(celery_id, depth), False))
    if redelivered(ctx):
        out.append((requeue_attempt_id(celery_id, count), False))
    return out


def placeholder_attempts(ctx: Any, celery_id: str, *, with_nesting: bool = True) -> list[str]:
    """Placeholder attempts a delivery may have claimed, for the main process to find it."""
    out: list[str] = []
    count = retries(ctx)
    if with_nesting and nesting(ctx) > 0 and count == 0:
        out.append(replace_attempt_id(celery_id, nesting(ctx)))
    if redelivered(ctx):
        out.append(requeue_attempt_id(celery_id, count))
    if count > 0:
        out.append(retry_attempt_id(celery_id, count))
    return out


def fresh_attempt_id(ctx: Any) -> str | None:
    """The id a fresh attempt of this delivery gets: from the token injected at receipt."""
    value = token(ctx)
    return token_attempt_id(value) if value else None


__all__ = [
    "REPLACED_KEY",
    "TOKEN_KEY",
    "Attempt",
    "acks_late",
    "attempt_of",
    "attempt_timeout",
    "delivers",
    "expected_attempts",
    "fresh_attempt_id",
    "logical_task_id",
    "nesting",
    "placeholder_attempts",
    "redelivered",
    "replaced_ids",
    "retries",
    "set_attempt",
    "token",
]
