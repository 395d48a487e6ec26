"""Deterministic ledger ids for Dramatiq messages."""

from __future__ import annotations

from task_state_guard.integration import name_label
from task_state_guard.integration.ids import DRAMATIQ, DRAMATIQ_ATTEMPTS

__all__ = [
    "ATTEMPT_NAMESPACE",
    "MESSAGE_NAMESPACE",
    "attempt_task_id",
    "logical_task_id",
    "name_label",
]

# The schemes are the core's (defined once in ``task_state_guard.integration.ids``, where
# ``tsg get --dramatiq ID`` finds them too).
MESSAGES = DRAMATIQ
_MESSAGES = MESSAGES
_ATTEMPTS = DRAMATIQ_ATTEMPTS
#: Namespace of the logical task (parent) ids: ``uuid5(MESSAGE_NAMESPACE, message_id)``.
MESSAGE_NAMESPACE = MESSAGES.namespace
#: Namespace of the expected attempt ids: ``uuid5(ATTEMPT_NAMESPACE, f"{message_id}/{retries}")``.
ATTEMPT_NAMESPACE = _ATTEMPTS.namespace


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
