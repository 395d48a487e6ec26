"""The operator's reads: one task, its children, ids by state, and the stuck-task listing.

One query per listing, oldest task first unless another order is asked for: tasks (jobs:
roots, and children that owe their own delivery, such as a LangGraph resume or recovery run)
by default, or the attempts (children that owe nobody a delivery) when asked, filtered by
state, name label, idle time, age, one job and a contradicted close (jobs closed other than
``succeeded`` with an attempt that succeeded after the close, or those attempts). Each row
carries its kind, its number of attempts (direct children that are attempts) and its
position in the order (a cursor: the next page starts after the last row's, so a page costs
the same at any depth). The caller hands in the task columns and the row validator, so a
tampered row is never returned. The rules (what matches, in which order, how a cursor reads)
are here; each backend's ``queries`` writes the statements.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..model import (
    ACTIVE_STATES,
    TASK_STATES,
    InvalidInput,
    Task,
    TaskNotFound,
    canonical_id,
    check_name,
    check_seconds,
    check_state,
    check_thread_id,
    is_canonical,
    task_kind,
)
from ..store import queries

if TYPE_CHECKING:
    from ..store.protocol import Database

DEFAULT_LIMIT = 100
MAX_LIMIT = 10**6

#: The sort keys of a listing (each backend sorts by :data:`queries.LIST_ORDERS`): creation
#: order (the ledger's own, oldest first), the last sign of life (longest idle first), the name
#: label, the state. Ties go by creation order.
ORDERS = tuple(queries.LIST_ORDERS)
_TEXT_ORDERS = frozenset({"name", "status"})
#: A cursor's whole numbers: ASCII digits only (``str.isdigit`` also takes ``²`` and other
#: scripts' digits), at most 19 (a 64-bit column).
_DIGITS = re.compile(r"[0-9]{1,19}", re.ASCII)


@dataclass(frozen=True, slots=True)
class ListedTask:
    """One row of a task listing: the task, its attempts, its age and idle time (seconds)."""

    task: Task
    attempts: int
    age_seconds: float
    idle_seconds: float
    #: This row's position in its listing's order: pass it as ``after`` for the rows after it.
    cursor: str = ""

    @property
    def kind(self) -> str:
        """``"task"`` (a job) or ``"attempt"`` (one execution of a job)."""
        return task_kind(self.task.parent_id is None, self.task.delivery_required)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready row: ids, kind, name, states, code, ages and the attempt count."""
        task = self.task
        return {
            "id": task.id,
            "kind": self.kind,
            "parent_id": task.parent_id,
            "framework_id": task.framework_id,
            "name": task.name,
            "status": task.status.value,
            "code": task.terminal_code,
            "delivery_status": task.delivery_status.value,
            "age_seconds": round(self.age_seconds, 3),
            "idle_seconds": round(self.idle_seconds, 3),
            "attempts": self.attempts,
        }


@dataclass(frozen=True, slots=True)
class TaskListing:
    """The rows of one listing (oldest first), whether more matched past the limit, and the
    clock reading the ages were measured at."""

    tasks: list[ListedTask]
    more: bool
    at: float


def _cursor(order: str, key: Any, seq: Any) -> str:
    """An opaque position: the sort key and the creation order of a row."""
    if order in _TEXT_ORDERS:
        return f"{str(key).encode('utf-8').hex()}.{int(seq)}"
    return f"{float(key).hex() if order != 'created' else int(key)}.{int(seq)}"


def parse_cursor(order: str, text: object) -> tuple[Any, int]:
    """The sort key and creation order a cursor of ``order`` holds (``InvalidInput`` when it is
    not one; the error never repeats it)."""
    if not isinstance(text, str) or len(text) > 1000:
        raise InvalidInput("the cursor is malformed")
    key_text, dot, seq_text = text.rpartition(".")
    if not dot or not _DIGITS.fullmatch(seq_text) or len(seq_text) > 19:
        raise InvalidInput("the cursor is malformed")
    try:
        if order in _TEXT_ORDERS:
            key: Any = bytes.fromhex(key_text).decode("utf-8")
        elif order == "created":
            key = int(key_text) if _DIGITS.fullmatch(key_text) else None
        else:
            key = float.fromhex(key_text)
    except (ValueError, OverflowError):
        raise InvalidInput("the cursor is malformed") from None
    if key is None or (isinstance(key, float) and not math.isfinite(key)) or (
            isinstance(key, int) and key >= 1 << 63) or int(seq_text) >= 1 << 63:
        raise InvalidInput("the cursor is malformed")
    return key, int(seq_text)


def list_tasks(
    db: Database,
    columns: str,
    to_task: Callable[[tuple[Any, ...]], Task],
    *,
    status: str | None = None,
    name: str | None = None,
    attempts: bool = False,
    stale_seconds: float | None = None,
    older_than_seconds: float | None = None,
    limit: int = DEFAULT_LIMIT,
    task_id: str | None = None,
    order: str = "created",
    descending: bool = False,
    after: str | None = None,
    contradicted: bool = False,
    thread_id: str | None = None,
) -> TaskListing:
    """List tasks, oldest first (see :meth:`task_state_guard.Ledger.list_tasks`)."""
    state = None if status is None else check_state(status, TASK_STATES, "task status")
    thread = None if thread_id is None else check_thread_id(thread_id)
    job = None if task_id is None else canonical_id(task_id)
    label = check_name(name)
    stale = None if stale_seconds is None else check_seconds(
        stale_seconds, "stale_seconds", allow_zero=True)
    older = None if older_than_seconds is None else check_seconds(
        older_than_seconds, "older_than_seconds", allow_zero=True)
    if not isinstance(attempts, bool):
        raise InvalidInput("attempts must be a boolean")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise InvalidInput("limit must be a positive integer")
    if not isinstance(order, str) or order not in ORDERS:
        raise InvalidInput("unknown order")
    if not isinstance(descending, bool):
        raise InvalidInput("descending must be a boolean")
    if not isinstance(contradicted, bool):
        raise InvalidInput("contradicted must be a boolean")
    # Open work only by default; a named job or thread, or a contradicted close, in any state.
    everything = job is not None or contradicted or thread is not None
    position = None if after is None else parse_cursor(order, after)
    if thread is not None and not db.layout.has_threads:
        return TaskListing([], False, db.now())  # an older layout recorded no thread
    with db.read() as conn:
        now = db.now()
        query = queries.TaskQuery(
            attempts=attempts, job=job,
            # the open-work index, whenever only open work can match
            open_only=(state is None and not everything) or state in ACTIVE_STATES,
            status=state, active_only=state is None and not everything, name=label,
            idle_before=None if stale is None else now - stale,
            created_before=None if older is None else now - older,
            order=order, descending=descending, after=position, limit=limit + 1,
            contradicted=contradicted, thread=thread,
        )
        rows = db.queries.list_tasks(conn, columns, query)
    listed: list[ListedTask] = []
    for row in rows[:limit]:
        task = to_task(tuple(row[:-4]))
        listed.append(ListedTask(task, int(row[-4]), now - task.created_at,
                                 now - float(row[-3]), _cursor(order, row[-2], row[-1])))
    return TaskListing(listed, len(rows) > limit, now)


def get_task(db: Database, task_id: str, to_task: Callable[[tuple[Any, ...]], Task]) -> Task:
    """The task ``task_id`` (a canonical id); ``TaskNotFound`` when unknown."""
    row = db.queries.task(task_id)
    if row is None:
        raise TaskNotFound("task not found")
    return to_task(row)


def children_of(
    db: Database, task_id: str, to_task: Callable[[tuple[Any, ...]], Task],
    limit: int | None = None,
) -> list[Task]:
    """The direct children of ``task_id`` (a canonical id), oldest first (the first ``limit``
    only, when given); ``TaskNotFound`` when unknown."""
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise InvalidInput("limit must be a positive integer")
    rows = db.queries.children(task_id, limit)
    if rows is None:
        raise TaskNotFound("task not found")
    return [to_task(row) for row in rows]


def find_task_ids(
    db: Database, status: str | None, *, stale_seconds: float | None = None,
    limit: int | None = None, name: str | None = None, older_than_seconds: float | None = None,
    task_id: Any = None,
    thread_id: str | None = None,
) -> list[str]:
    """The ids of tasks in ``status`` (see :meth:`task_state_guard.Ledger.find_task_ids`)."""
    thread = None if thread_id is None else check_thread_id(thread_id)
    state = None if status is None and thread is not None else check_state(
        status, TASK_STATES, "task status")
    stale = None if stale_seconds is None else check_seconds(
        stale_seconds, "stale_seconds", allow_zero=True
    )
    older = None if older_than_seconds is None else check_seconds(
        older_than_seconds, "older_than_seconds", allow_zero=True
    )
    label = check_name(name)
    job = None if task_id is None else canonical_id(task_id)
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise InvalidInput("limit must be a positive integer")
    if thread is not None and not db.layout.has_threads:
        return []  # an older layout recorded no thread
    with db.read() as conn:
        now = db.now()
        ids = db.queries.find_ids(conn, queries.FindQuery(
            status=state, open_only=state in ACTIVE_STATES,
            idle_before=None if stale is None else now - stale, name=label,
            created_before=None if older is None else now - older, job=job, limit=limit,
            thread=thread,
        ))
    return [i for i in ids if type(i) is str and is_canonical(i)]
