"""Deterministic ledger ids for LangGraph runs (name labels: the core's ``name_label``)."""

from __future__ import annotations

import hashlib
import logging
from typing import Any

from task_state_guard.integration.ids import LANGGRAPH, langgraph_recovery_id
from task_state_guard.model import is_valid_thread_id

#: The core's id scheme of invocations (defined once in ``task_state_guard.integration.ids``,
#: where ``tsg get --langgraph ID`` finds it too).
INVOCATIONS = LANGGRAPH
#: Namespace of every ledger id this adapter derives (``uuid5(NAMESPACE, ...)``).
NAMESPACE = INVOCATIONS.namespace
_INVOCATIONS = INVOCATIONS


_logger = logging.getLogger("task_state_guard_langgraph")
_warned: list[bool] = []


def stored_thread(config: dict[str, Any] | None) -> str | None:
    """The thread id an invocation is recorded with: ``configurable.thread_id`` as text.
    One the ledger cannot store (over 256 characters, or with control characters) is not
    recorded (logged once): recovery still finds the thread through the checkpointer."""
    value = ((config or {}).get("configurable") or {}).get("thread_id")
    if value is None:
        return None
    thread = str(value)
    if is_valid_thread_id(thread):
        return thread
    if not _warned:
        _warned.append(True)
        _logger.warning("a thread id longer than 256 characters or with control characters "
                        "is not recorded in the ledger")
    return None


def logical_task_id(invocation_id: str) -> str:
    """Ledger id of the invocation (parent) task: ``uuid5(NAMESPACE, invocation_id)``.

    Any process can compute it from the invocation id alone.
    """
    return _INVOCATIONS.logical_task_id(invocation_id)


#: Characters of the invocation's ledger id a node attempt's id starts with (its first 48
#: bits: ``xxxxxxxx-xxxx``).
_SHARED = 13


def attempt_task_id(invocation_id: str, checkpoint_ns: str, attempt: int) -> str:
    """Ledger id of one node attempt.

    ``checkpoint_ns`` is LangGraph's ``langgraph_checkpoint_ns`` (node name and task id, with
    the subgraph path), ``attempt`` counts the starts of that namespace within the invocation.
    The id is ``uuid5(NAMESPACE, "attempt|<invocation_id>|<checkpoint_ns>|<attempt>")`` with
    its first 13 characters replaced by those of :func:`logical_task_id` ``(invocation_id)``:
    an invocation's node attempts sort next to it in the ledger's id index, so recording them
    writes one index page where random ids would write one each. ``InvalidInput`` for an
    empty invocation id, as :func:`logical_task_id`.
    """
    return AttemptIds(invocation_id)(checkpoint_ns, attempt)


class AttemptIds:
    """:func:`attempt_task_id` for one invocation, with the invocation's part of the uuid5
    hash and the shared prefix computed once (a node attempt then hashes only its own
    namespace and number)."""

    __slots__ = ("_base", "_prefix")

    def __init__(self, invocation_id: str) -> None:
        self._base = hashlib.sha1(
            NAMESPACE.bytes + f"attempt|{invocation_id}|".encode(), usedforsecurity=False
        )
        self._prefix = logical_task_id(invocation_id)[:_SHARED]

    def __call__(self, checkpoint_ns: str, attempt: int) -> str:
        h = self._base.copy()
        h.update(f"{checkpoint_ns}|{attempt}".encode())
        d = bytearray(h.digest()[:16])
        d[6] = (d[6] & 0x0F) | 0x50  # version 5
        d[8] = (d[8] & 0x3F) | 0x80  # RFC 4122 variant
        x = d.hex()
        return f"{self._prefix}-{x[12:16]}-{x[16:20]}-{x[20:]}"


def recovery_invocation_id(lost_invocation_id: str) -> str:
    """Invocation id of the run that recovers ``lost_invocation_id`` (deterministic, so two
    processes recovering at once race on one ledger task and only one wins the claim)."""
    return recovery_id_for_task(logical_task_id(lost_invocation_id))


def recovery_id_for_task(lost_task_id: str) -> str:
    """:func:`recovery_invocation_id` from the lost invocation's ledger id: recovery can
    compute it for an invocation whose own id it never saw (one that died before writing its
    first checkpoint is known only by its ledger record)."""
    return langgraph_recovery_id(lost_task_id)
