"""How a failed node run is read: will LangGraph retry it (its RetryPolicy), and which ledger
state and code a final error maps to."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import Any

from langgraph.errors import GraphBubbleUp, ParentCommand
from task_state_guard.integration import codes as c


class RetryOracle:
    """Predicts, when a node attempt raises, whether LangGraph's ``RetryPolicy`` retries it.

    Mirrors ``langgraph.pregel._retry.run_with_retry``: the node's own policy or the graph's
    default; the first policy whose ``retry_on`` matches; retry while the failed attempts are
    fewer than ``max_attempts``. Subgraph nodes are found through ``get_subgraphs``.
    """

    def __init__(self, graph: Any) -> None:
        self._graph = graph
        self._subgraphs: dict[str, Any] | None = None
        self._lock = threading.Lock()

    def _graph_at(self, path: tuple[str, ...]) -> Any:
        if not path:
            return self._graph
        if self._subgraphs is None:
            with self._lock:
                if self._subgraphs is None:
                    try:
                        found = dict(self._graph.get_subgraphs(recurse=True))
                    except Exception:
                        found = {}
                    self._subgraphs = found
        return self._subgraphs.get("|".join(path))

    def policies(self, checkpoint_ns: str) -> Sequence[Any]:
        """The retry policies that apply to the node at ``checkpoint_ns``."""
        names = tuple(seg.rpartition(":")[0] or seg for seg in checkpoint_ns.split("|"))
        if not names:
            return ()
        graph = self._graph_at(names[:-1])
        if graph is None:
            return ()
        node = getattr(graph, "nodes", {}).get(names[-1])
        own = getattr(node, "retry_policy", None) if node is not None else None
        policy = own or getattr(graph, "retry_policy", None) or ()
        if not isinstance(policy, Sequence):
            policy = (policy,)
        return tuple(policy)

    def will_retry(self, checkpoint_ns: str, failed_attempts: int, exc: BaseException) -> bool:
        """True when LangGraph will run another attempt after this failure."""
        if not isinstance(exc, Exception):
            return False
        for policy in self.policies(checkpoint_ns):
            if _retry_on(policy, exc):
                return failed_attempts < int(getattr(policy, "max_attempts", 1))
        return False


def _retry_on(policy: Any, exc: Exception) -> bool:
    retry_on = getattr(policy, "retry_on", None)
    try:
        if isinstance(retry_on, Sequence):
            return isinstance(exc, tuple(retry_on))
        if isinstance(retry_on, type) and issubclass(retry_on, Exception):
            return isinstance(exc, retry_on)
        if callable(retry_on):
            predicate: Any = retry_on
            return bool(predicate(exc))
    except Exception:
        return False
    return False


def classify_error(exc: BaseException) -> tuple[str, str]:
    """Ledger ``(status, code)`` for a run that ended with ``exc`` (no retry considered)."""
    if isinstance(exc, ParentCommand):
        return c.SUCCEEDED, c.WORKER_COMPLETED
    if isinstance(exc, GraphBubbleUp):
        # GraphInterrupt (interrupt()), GraphDrained (cooperative shutdown): control flow.
        return c.CANCELLED, c.INTERRUPTED
    if isinstance(exc, (asyncio.CancelledError, KeyboardInterrupt, GeneratorExit)):
        return c.CANCELLED, c.CALLER_CANCELLED
    return c.FAILED, c.WORKER_FAILED
