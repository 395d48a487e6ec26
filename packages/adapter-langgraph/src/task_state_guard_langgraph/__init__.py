"""TaskStateGuard adapter for LangGraph.

``guard(compiled_graph, db=...)`` records every invocation as a delivering parent task and
every node attempt as an internal child task in a TaskStateGuard ledger. See README.md.
"""

from task_state_guard.integration import LostTask

from ._guard import GuardedGraph
from ._ids import NAMESPACE, attempt_task_id, logical_task_id, recovery_invocation_id
from ._install import guard
from ._lineage import METADATA_KEY
from ._recovery_types import Recovery, RecoveryReport
from ._runner import RecoveryRunner
from ._shutdown import drain_on_signals
from .callbacks import AsyncGuardCallbackHandler, GuardCallbackHandler
from .heartbeat import heartbeat

__all__ = [
    "METADATA_KEY",
    "NAMESPACE",
    "AsyncGuardCallbackHandler",
    "GuardCallbackHandler",
    "GuardedGraph",
    "LostTask",
    "Recovery",
    "RecoveryReport",
    "RecoveryRunner",
    "attempt_task_id",
    "drain_on_signals",
    "guard",
    "heartbeat",
    "logical_task_id",
    "recovery_invocation_id",
]
