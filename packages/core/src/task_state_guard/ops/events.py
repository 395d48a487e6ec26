"""A task's event history: the read side of the event chain the schema's triggers write.

An event holds only ledger vocabulary: its kind, the state it entered, the reason code and the
time. The ledger writes one per state change (``created``, ``started``, ``closed``,
``delivery``); heartbeats write none.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import reasons
from ..model import (
    DELIVERY_CODES,
    DELIVERY_STATES,
    TASK_CODES,
    TERMINAL_STATES,
    StorageError,
    TaskNotFound,
)

if TYPE_CHECKING:
    from ..store.protocol import Database

_FIXED = {1: ("created", "queued", "created"), 2: ("started", "running", "started")}


@dataclass(frozen=True, slots=True)
class TaskEvent:
    """One recorded state change of a task.

    ``kind`` is ``created`` (state ``queued``, code ``created``), ``started`` (``running``,
    ``started``), ``closed`` (the terminal state and its reason code, or ``None``) or
    ``delivery`` (the closed delivery state and its code, or ``None``); ``at`` is the ledger
    clock's reading when it happened.
    """

    kind: str
    state: str
    code: str | None
    at: float

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready mapping: ``kind``, ``state``, ``code``, ``at``."""
        return {"kind": self.kind, "state": self.state, "code": self.code, "at": self.at}


def _valid(step: Any, kind: Any, state: Any, code: Any, at: Any) -> bool:
    if type(at) not in (int, float) or not math.isfinite(at):
        return False
    if step in _FIXED:
        return (kind, state, code) == _FIXED[step]
    if step == 3:
        return kind == "closed" and state in TERMINAL_STATES and (
            code is None or code in TASK_CODES[state])
    if step == 4:
        return kind == "delivery" and state in DELIVERY_STATES and state != "pending" and (
            code is None or code in DELIVERY_CODES[state])
    return False


def events_of(db: Database, task_id: str) -> list[TaskEvent]:
    """The events of task ``task_id`` (a canonical id), oldest first.

    Raises :class:`TaskNotFound` for an unknown task and :class:`StorageError` when a stored
    event fails validation (doctor counts such findings), so no tampered value is returned.
    """
    rows = db.queries.task_events(task_id)
    if rows is None:
        raise TaskNotFound("task not found")
    events: list[TaskEvent] = []
    for step, kind, state, code, at in rows:
        if not _valid(step, kind, state, code, at):
            raise StorageError("a stored event failed validation (run doctor)",
                               reason=reasons.STORED_ROW_INVALID)
        events.append(TaskEvent(str(kind), str(state), code, float(at)))
    return events
