"""``heartbeat()``: a helper a long-running node calls to prove it is alive."""

from __future__ import annotations

from typing import Any

from .callbacks import GuardCallbackHandler


def _handlers(manager: Any) -> list[Any]:
    found: list[Any] = []
    for attr in ("handlers", "inheritable_handlers"):
        for handler in getattr(manager, attr, None) or []:
            if handler not in found:
                found.append(handler)
    return found


def heartbeat() -> bool:
    """Heartbeat the calling node's attempt and its ancestors (up to the invocation) now.

    Call it from inside a node (sync or async) of a guarded graph, e.g. once per batch of a
    long loop. The background heartbeater already beats every running attempt; this helper
    adds progress-based liveness and also calls LangGraph's ``Runtime.heartbeat()`` so a
    node ``idle_timeout`` stays in sync. Returns True when the ledger recorded a beat; never
    raises (outside a graph it returns False).
    """
    try:
        from langgraph.config import get_config

        config = get_config()
    except Exception:
        return False
    manager = config.get("callbacks")
    run_id = getattr(manager, "parent_run_id", None)
    beat = False
    for handler in _handlers(manager):
        if isinstance(handler, GuardCallbackHandler):
            try:
                beat = handler.beat_run(run_id) > 0 or beat
            except Exception:
                if handler.runtime.policy.strict:
                    raise
    try:
        from langgraph.runtime import get_runtime

        get_runtime().heartbeat()
    except Exception:
        pass
    return beat
