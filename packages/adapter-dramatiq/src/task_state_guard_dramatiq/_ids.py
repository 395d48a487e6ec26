"""Deterministic ledger ids for Dramatiq messages."""

from __future__ import annotations

import re
import uuid

__all__ = [
    "ATTEMPT_NAMESPACE",
    "MESSAGE_NAMESPACE",
    "attempt_task_id",
    "label",
    "logical_task_id",
]

#: Namespace of the logical task (parent) ids: ``uuid5(MESSAGE_NAMESPACE, message_id)``.
MESSAGE_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "urn:task-state-guard:dramatiq:message")
#: Namespace of the expected attempt ids: ``uuid5(ATTEMPT_NAMESPACE, f"{message_id}/{retries}")``.
ATTEMPT_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "urn:task-state-guard:dramatiq:attempt")

_LABEL_OK = re.compile(r"[A-Za-z0-9_<][A-Za-z0-9_.:/<>\-]{0,199}")
_LABEL_BAD_CHAR = re.compile(r"[^A-Za-z0-9_.:/<>\-]")


def logical_task_id(message_id: str) -> str:
    """The ledger id of the logical task (parent) of a Dramatiq ``message_id``.

    Deterministic, so any process (a producer, a web handler, an operator) can find it.
    Retries keep the ``message_id``, so every attempt of one message shares this parent.
    """
    if not isinstance(message_id, str) or not message_id:
        raise TypeError("message_id must be a non-empty string")
    return str(uuid.uuid5(MESSAGE_NAMESPACE, message_id))


def attempt_task_id(message_id: str, retries: int) -> str:
    """The id of the attempt *expected* for a delivery that has seen ``retries`` failures.

    The first delivery and each retry scheduled by Retries get this id; a duplicate
    delivery of the same message (crash redelivery, consumer timeout) finds it already
    claimed and records a fresh random attempt instead.
    """
    return str(uuid.uuid5(ATTEMPT_NAMESPACE, f"{message_id}/{int(retries)}"))


def label(actor_name: str) -> str | None:
    """The ledger ``name`` label for an actor name (the core only accepts identifiers)."""
    if _LABEL_OK.fullmatch(actor_name):
        return actor_name
    cleaned = _LABEL_BAD_CHAR.sub("_", actor_name)[:200]
    if not cleaned:
        return None
    if not re.match(r"[A-Za-z0-9_<]", cleaned[0]):
        cleaned = ("_" + cleaned)[:200]
    return cleaned if _LABEL_OK.fullmatch(cleaned) else None
