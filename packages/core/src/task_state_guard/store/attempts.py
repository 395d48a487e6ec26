"""A guarded job's two writes: *begin attempt* and *end attempt*, as the store receives them.

:class:`Begin` and :class:`End` describe the writes, already validated by the ledger; each
backend runs them as one write with its own SQL (SQLite: one transaction,
``task_state_guard.sqlite.attempts``; PostgreSQL: one statement). A step the write refuses (a
task closed meanwhile, an id taken, a clock behind the stored times) is left as it was and
reported, and the ledger explains it with its one-task transitions, which raise the
contract's errors.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import NamedTuple

#: The largest finite timestamp: a start whose deadline would pass it is refused.
FLOAT_MAX = sys.float_info.max


class Begin(NamedTuple):
    """*Begin attempt*: open the logical task (create it if missing and start it if queued,
    when ``open_logical``) and start the attempt this delivery runs as: the first of
    ``candidates`` (``(id, create)``: a queued placeholder, recorded first when ``create``)
    that can still be started, else a new attempt ``attempt_id``.

    ``attempt=False`` (with ``open_logical``): no attempt; the logical task alone is recorded
    already running (``logical_owner`` its owner), under ``parent_id`` when given, in one
    write; when it exists already the write does nothing and the ledger runs (and explains)
    the create and start one at a time."""

    logical_id: str
    name: str | None
    delivery_required: bool
    framework_id: str | None
    framework: str | None
    open_logical: bool
    logical_owner: str | None
    candidates: tuple[tuple[str, bool], ...]
    attempt_id: str
    timeout_seconds: float | None
    owner: str
    redelivery_seconds: float | None
    parent_id: str | None = None
    attempt: bool = True
    #: The framework's thread of the logical task (``attempt=False`` only): stored with it.
    thread_id: str | None = None


class End(NamedTuple):
    """*End attempt*: queue ``queue`` (``(id, parent_id, name, timeout_seconds)``: a scheduled
    retry's attempt, first), then close ``closes`` in order (``(id, status, code, mark)``:
    a task that owes no delivery has it closed ``not_applicable/internal_task`` with it; a
    ``mark`` ``(state, code)`` closes a delivering task's delivery in the same change).

    The closes of the tasks in ``if_queued`` (the first of ``closes``) apply only while the
    task is still queued: one that started meanwhile is left running, as it was."""

    closes: tuple[tuple[str, str, str | None, tuple[str, str | None] | None], ...]
    queue: tuple[tuple[str, str, str | None, float | None], ...]
    if_queued: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class Boundary:
    """A boundary between two attempts of one logical task: ``end`` (*end attempt*: the
    attempts that ended) and then ``begin`` (*begin attempt* of the next one, under a logical
    task that exists: ``begin.open_logical`` is False) as one write. The end is committed
    whatever the begin does; a begin it refused is left out and reported."""

    end: End
    begin: Begin


class Ended(NamedTuple):
    """What an *end attempt* wrote: the tasks it closed, the delivery marks it wrote and the
    attempts it queued (anything else it left as it was)."""

    closed: frozenset[str]
    marked: frozenset[str]
    queued: frozenset[str]


__all__ = ["FLOAT_MAX", "Begin", "Boundary", "End", "Ended"]
