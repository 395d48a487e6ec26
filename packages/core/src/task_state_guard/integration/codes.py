"""Names for the task states, delivery states and reason codes adapters write.

Plain string constants (the values the ledger stores, taken from the enums of
:mod:`task_state_guard.model`), so adapter code never spells a state or
a code as a bare literal and a typo is a name error instead of an ``InvalidInput`` at run time.
"""

from __future__ import annotations

from typing import Final

from ..model import (
    ACTIVE_STATES,
    TERMINAL_STATES,
    DeliveryCode,
    DeliveryStatus,
    TaskCode,
    TaskStatus,
)

# Task states.
QUEUED: Final[str] = TaskStatus.QUEUED.value
RUNNING: Final[str] = TaskStatus.RUNNING.value
SUCCEEDED: Final[str] = TaskStatus.SUCCEEDED.value
FAILED: Final[str] = TaskStatus.FAILED.value
TIMED_OUT: Final[str] = TaskStatus.TIMED_OUT.value
CANCELLED: Final[str] = TaskStatus.CANCELLED.value
ACTIVE: Final[frozenset[str]] = ACTIVE_STATES
TERMINAL: Final[frozenset[str]] = TERMINAL_STATES

# Delivery states.
PENDING: Final[str] = DeliveryStatus.PENDING.value
DELIVERED: Final[str] = DeliveryStatus.DELIVERED.value
DELIVERY_FAILED: Final[str] = DeliveryStatus.FAILED.value
NOT_APPLICABLE: Final[str] = DeliveryStatus.NOT_APPLICABLE.value

# Reason codes of task closes.
COMPLETED: Final[str] = TaskCode.COMPLETED.value
WORKER_COMPLETED: Final[str] = TaskCode.WORKER_COMPLETED.value
WORKER_FAILED: Final[str] = TaskCode.WORKER_FAILED.value
RETRY_SCHEDULED: Final[str] = TaskCode.RETRY_SCHEDULED.value
WORKER_LOST: Final[str] = TaskCode.WORKER_LOST.value
TIME_LIMIT_EXCEEDED: Final[str] = TaskCode.TIME_LIMIT_EXCEEDED.value
CALLER_CANCELLED: Final[str] = TaskCode.CALLER_CANCELLED.value
REVOKED: Final[str] = TaskCode.REVOKED.value
INTERRUPTED: Final[str] = TaskCode.INTERRUPTED.value
SKIPPED: Final[str] = TaskCode.SKIPPED.value
REJECTED: Final[str] = TaskCode.REJECTED.value
IGNORED: Final[str] = TaskCode.IGNORED.value

# Reason codes of delivery closes.
TRANSPORT_ACKNOWLEDGED: Final[str] = DeliveryCode.TRANSPORT_ACKNOWLEDGED.value
TRANSPORT_FAILED: Final[str] = DeliveryCode.TRANSPORT_FAILED.value
INTERNAL_TASK: Final[str] = DeliveryCode.INTERNAL_TASK.value

#: ``(status, code)`` of one close.
Outcome = tuple[str, "str | None"]

__all__ = [
    "ACTIVE",
    "CALLER_CANCELLED",
    "CANCELLED",
    "COMPLETED",
    "DELIVERED",
    "DELIVERY_FAILED",
    "FAILED",
    "IGNORED",
    "INTERNAL_TASK",
    "INTERRUPTED",
    "NOT_APPLICABLE",
    "PENDING",
    "QUEUED",
    "REJECTED",
    "RETRY_SCHEDULED",
    "REVOKED",
    "RUNNING",
    "SKIPPED",
    "SUCCEEDED",
    "TERMINAL",
    "TIMED_OUT",
    "TIME_LIMIT_EXCEEDED",
    "TRANSPORT_ACKNOWLEDGED",
    "TRANSPORT_FAILED",
    "WORKER_COMPLETED",
    "WORKER_FAILED",
    "WORKER_LOST",
    "Outcome",
]
