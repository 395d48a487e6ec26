"""TaskStateGuard for Dramatiq: a ledger middleware for workers.

Every Dramatiq message is one *logical task* in the ledger (id
``uuid5(MESSAGE_NAMESPACE, message_id)``), and every execution attempt of it is an
internal child task. See the package README for the full model.

>>> from task_state_guard_dramatiq import install          # doctest: +SKIP
>>> guard = install(broker, db="/var/lib/tsg/tasks.sqlite")  # doctest: +SKIP
"""

from __future__ import annotations

from task_state_guard.integration import ConfigurationError, LostTask, Settings

from ._ids import ATTEMPT_NAMESPACE, MESSAGE_NAMESPACE, attempt_task_id, logical_task_id
from ._install import find, install, uninstall
from .middleware import ACTOR_OPTION, LedgerUnavailable, TaskLostError, TaskStateGuardMiddleware

__all__ = [
    "ACTOR_OPTION",
    "ATTEMPT_NAMESPACE",
    "MESSAGE_NAMESPACE",
    "ConfigurationError",
    "LedgerUnavailable",
    "LostTask",
    "Settings",
    "TaskLostError",
    "TaskStateGuardMiddleware",
    "attempt_task_id",
    "find",
    "install",
    "logical_task_id",
    "uninstall",
]

__version__ = "0.1.0"
