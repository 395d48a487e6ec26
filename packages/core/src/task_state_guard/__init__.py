"""TaskStateGuard: an embedded SQLite ledger that reconciles stale task and delivery state.

It keeps each task's terminal state apart from its delivery state, reconciles stale state after
a restart with explicit deadlines, heartbeats, owner liveness and grace periods, never guesses
that unknown work succeeded, previews changes as counts, and checks itself with a counts-only
doctor.
"""

from . import reasons
from .heartbeat import Heartbeater
from .ledger import Ledger
from .model import (
    DeliveryStatus,
    InvalidInput,
    LedgerBusy,
    LedgerError,
    StateConflict,
    StorageError,
    Task,
    TaskNotFound,
    TaskStatus,
    UnsafeLocation,
    payload_fingerprint,
)
from .ops.events import TaskEvent
from .ops.reconcile import ReconcileDecision, ReconcilePolicy, reconcile_restart
from .ops.task_list import ListedTask, TaskListing
from .ops.verdicts import Verdict

__version__ = "0.2.0"

__all__ = [
    "DeliveryStatus",
    "Heartbeater",
    "InvalidInput",
    "Ledger",
    "LedgerBusy",
    "LedgerError",
    "ListedTask",
    "ReconcileDecision",
    "ReconcilePolicy",
    "StateConflict",
    "StorageError",
    "Task",
    "TaskEvent",
    "TaskListing",
    "TaskNotFound",
    "TaskStatus",
    "UnsafeLocation",
    "Verdict",
    "__version__",
    "payload_fingerprint",
    "reasons",
    "reconcile_restart",
]
