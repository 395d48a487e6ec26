"""Deterministic ledger ids and name labels for LangGraph runs."""

from __future__ import annotations

import hashlib
import re
import uuid

#: Namespace of every ledger id this adapter derives (``uuid5(NAMESPACE, ...)``).
NAMESPACE = uuid.UUID("6f0c3b8e-4a57-5d7e-9a51-2b7f1c0e8d42")

_NAME_BAD = re.compile(r"[^A-Za-z0-9_.:\-/<>]")
_NAME_FIRST = re.compile(r"[A-Za-z0-9_<]")
_NAME_MAX = 200


def logical_task_id(invocation_id: str) -> str:
    """Ledger id of the invocation (parent) task: ``uuid5(NAMESPACE, invocation_id)``.

    Any process can compute it from the invocation id alone.
    """
    return str(uuid.uuid5(NAMESPACE, str(invocation_id)))


def attempt_task_id(invocation_id: str, checkpoint_ns: str, attempt: int) -> str:
    """Ledger id of one node attempt.

    ``checkpoint_ns`` is LangGraph's ``langgraph_checkpoint_ns`` (node name and task id, with
    the subgraph path), ``attempt`` counts the starts of that namespace within the invocation.
    """
    return str(uuid.uuid5(NAMESPACE, f"attempt|{invocation_id}|{checkpoint_ns}|{attempt}"))


class AttemptIds:
    """:func:`attempt_task_id` for one invocation, with the invocation's part of the uuid5
    hash computed once (a node attempt then hashes only its own namespace and number)."""

    __slots__ = ("_base",)

    def __init__(self, invocation_id: str) -> None:
        self._base = hashlib.sha1(
            NAMESPACE.bytes + f"attempt|{invocation_id}|".encode(), usedforsecurity=False
        )

    def __call__(self, checkpoint_ns: str, attempt: int) -> str:
        h = self._base.copy()
        h.update(f"{checkpoint_ns}|{attempt}".encode())
        d = bytearray(h.digest()[:16])
        d[6] = (d[6] & 0x0F) | 0x50  # version 5
        d[8] = (d[8] & 0x3F) | 0x80  # RFC 4122 variant
        x = d.hex()
        return f"{x[:8]}-{x[8:12]}-{x[12:16]}-{x[16:20]}-{x[20:]}"


def recovery_invocation_id(lost_invocation_id: str) -> str:
    """Invocation id of the run that recovers ``lost_invocation_id`` (deterministic, so two
    processes recovering at once race on one ledger task and only one wins the claim)."""
    return "recover-" + uuid.uuid5(NAMESPACE, f"recover|{lost_invocation_id}").hex


def sanitize_name(name: object) -> str | None:
    """Map a graph or node name onto the ledger's name charset; ``None`` when nothing is left.

    Disallowed characters become ``_``, the label is cut to 200 characters, and a first
    character outside ``[A-Za-z0-9_<]`` gets a ``_`` prefix.
    """
    if not isinstance(name, str) or not name:
        return None
    label = _NAME_BAD.sub("_", name)
    if not _NAME_FIRST.match(label):
        label = "_" + label
    label = label[:_NAME_MAX]
    return label or None
