"""Deterministic ledger ids for Dramatiq messages."""

from __future__ import annotations

import uuid

from task_state_guard.integration import IdScheme, name_label

__all__ = [
    "ATTEMPT_NAMESPACE",
    "MESSAGE_NAMESPACE",
    "attempt_task_id",
    "logical_task_id",
    "name_label",
]

#: Namespace of the logical task (parent) ids: ``uuid5(MESSAGE_NAMESPACE, message_id)``.
MESSAGE_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "urn:task-state-guard:dramatiq:message")
#: Namespace of the expected attempt ids: ``uuid5(ATTEMPT_NAMESPACE, f"{message_id}/{retries}")``.
ATTEMPT_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "urn:task-state-guard:dramatiq:attempt")

MESSAGES = IdScheme(MESSAGE_NAMESPACE)
_MESSAGES = MESSAGES
_ATTEMPTS = IdScheme(ATTEMPT_NAMESPACE)


def logical_task_id(message_id: str) -> str:
    """The ledger id of the logical task (parent) of a Dramatiq ``message_id``.

    Deterministic, so any process (a producer, a web handler, an operator) can find it.
    Retries keep the ``message_id``, so every attempt of one message shares this parent.
    """
    return _MESSAGES.logical_task_id(message_id)


def attempt_task_id(message_id: str, retries: int) -> str:
    """The id of the attempt *expected* for a delivery that has seen ``retries`` failures.

    The first delivery and each retry scheduled by Retries get this id; a duplicate
    delivery of the same message (crash redelivery, consumer timeout) finds it already
    claimed and records a fresh random attempt instead.
    """
    return _ATTEMPTS.derived_id(f"{message_id}/{int(retries)}")
