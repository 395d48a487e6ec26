"""Names for the task states, delivery states and reason codes adapters write.

Plain string constants (the values the ledger stores), so adapter code never spells a state or
a code as a bare literal and a typo is a name error instead of an ``InvalidInput`` at run time.
"""

from __future__ import annotations

from typing import Final

# Task states.
QUEUED: Final = "queued"
RUNNING: Final = "running"
SUCCEEDED: Final = "succeeded"
FAILED: Final = "failed"
TIMED_OUT: Final = "timed_out"
CANCELLED: Final = "cancelled"
ACTIVE: Final = frozenset({QUEUED, RUNNING})
TERMINAL: Final = frozenset({SUCCEEDED, FAILED, TIMED_OUT, CANCELLED})

# Delivery states.
PENDING: Final = "pending"
DELIVERED: Final = "delivered"
DELIVERY_FAILED: Final = "failed"
NOT_APPLICABLE: Final = "not_applicable"

# Reason codes of task closes.
COMPLETED: Final = "completed"
WORKER_COMPLETED: Final = "worker_completed"
WORKER_FAILED: Final = "worker_failed"
RETRY_SCHEDULED: Final = "retry_scheduled"
WORKER_LOST: Final = "worker_lost"
TIME_LIMIT_EXCEEDED: Final = "time_limit_exceeded"
CALLER_CANCELLED: Final = "caller_cancelled"
REVOKED: Final = "revoked"
INTERRUPTED: Final = "interrupted"
SKIPPED: Final = "skipped"
REJECTED: Final = "rejected"
IGNORED: Final = "ignored"

# Reason codes of delivery closes.
TRANSPORT_ACKNOWLEDGED: Final = "transport_acknowledged"
TRANSPORT_FAILED: Final = "transport_failed"
INTERNAL_TASK: Final = "internal_task"

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
