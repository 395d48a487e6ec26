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

import dataclasses
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..model import (
    ACTIVE_STATES,
    TASK_CODES,
    TASK_STATES,
    InvalidInput,
    Liveness,
    Task,
    TaskNotFound,
    canonical_id,
    check_framework,
    check_name,
    check_seconds,
    check_state,
    check_thread_id,
    is_canonical,
    task_kind,
)
from ..store import queries
from . import verdicts

if TYPE_CHECKING:
    from ..store.protocol import Database

DEFAULT_LIMIT = 100
MAX_LIMIT = 10**6
#: A listing's total is counted up to this many matches ("10000+" beyond).
COUNT_CAP = 10_000
#: The flags a listing can be narrowed to: the overview's at-risk and owed counts.
FLAGS = ("past_deadline", "owner_dead", "awaiting_delivery", "verdict_pending",
         "verdict_published")
#: Most characters of a name search.
MAX_CONTAINS = 200

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
    #: How many rows match in all (asked with ``count=True``; else None), counted up to
    #: :data:`COUNT_CAP`: ``total_capped`` when at least that many match.
    total: int | None = None
    total_capped: bool = False


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
    code: str | None = None,
    framework: str | None = None,
    name_contains: str | None = None,
    flag: str | None = None,
    count: bool = False,
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
    narrow = _narrowing(code, framework, name_contains, flag, count)
    # Open work only by default; a named job or thread, a contradicted close, a reason code, a
    # closed task's owed delivery or a verdict: in any state.
    everything = (job is not None or contradicted or thread is not None
                  or narrow["code"] is not None
                  or flag in ("awaiting_delivery", "verdict_pending", "verdict_published"))
    position = None if after is None else parse_cursor(order, after)
    if thread is not None and not db.layout.has_threads:
        return TaskListing([], False, db.now())  # an older layout recorded no thread
    with db.read() as conn:
        now = db.now()
        query = queries.TaskQuery(
            attempts=attempts, job=job,
            # the open-work index, whenever only open work can match
            open_only=(state is None and not everything) or state in ACTIVE_STATES
            or flag == "awaiting_delivery",
            status=state, active_only=state is None and not everything, name=label,
            idle_before=None if stale is None else now - stale,
            created_before=None if older is None else now - older,
            order=order, descending=descending, after=position, limit=limit + 1,
            contradicted=contradicted, thread=thread, code=narrow["code"],
            framework=narrow["framework"],
            contains=narrow["contains"], awaiting_delivery=flag == "awaiting_delivery",
            deadline_before=now if flag == "past_deadline" else None,
            owners=_dead_owners(db, conn) if flag == "owner_dead" else None,
            verdict={"verdict_pending": "pending", "verdict_published": "published"}.get(
                flag or ""),
        )
        rows: list[Any] = []  # an older layout records neither frameworks nor verdicts
        total: int | None = 0
        if verdicts.current(db) or not (query.framework or query.verdict):
            rows = db.queries.list_tasks(conn, columns, query)
            total = _count(db, conn, query) if count else None
    listed: list[ListedTask] = []
    for row in rows[:limit]:
        task = to_task(tuple(row[:-4]))
        listed.append(ListedTask(task, int(row[-4]), now - task.created_at,
                                 now - float(row[-3]), _cursor(order, row[-2], row[-1])))
    return TaskListing(listed, len(rows) > limit, now,
                       None if not count else min(total or 0, COUNT_CAP),
                       bool(count and total is not None and total > COUNT_CAP))


def _narrowing(code: Any, framework: Any, contains: Any, flag: Any,
               count: Any) -> dict[str, str | None]:
    """The listing's further filters, checked (``InvalidInput``, never repeating a value)."""
    if code is not None and not any(code in codes for codes in TASK_CODES.values()):
        raise InvalidInput("unknown reason code")
    if framework is not None and check_framework(framework) is None:
        raise InvalidInput("unknown framework")
    if contains is not None and (not isinstance(contains, str) or not contains
                                 or len(contains) > MAX_CONTAINS or "\x00" in contains):
        raise InvalidInput("name_contains must be 1 to 200 characters of text")
    if flag is not None and flag not in FLAGS:
        raise InvalidInput("unknown flag")
    if not isinstance(count, bool):
        raise InvalidInput("count must be a boolean")
    return {"code": code, "framework": framework, "contains": contains}


def _dead_owners(db: Database, conn: Any) -> tuple[str, ...]:
    """The owner tokens of open running tasks whose process is provably dead (as status
    counts them), at most :data:`queries.MAX_OWNERS`."""
    dead = sorted(token for token, _count in db.queries.open_running_owners(conn)
                  if isinstance(token, str) and db.owners.probe(token) is Liveness.DEAD)
    return tuple(dead[:queries.MAX_OWNERS])


def _count(db: Database, conn: Any, query: queries.TaskQuery) -> int:
    """How many rows ``query`` matches, counted up to one past :data:`COUNT_CAP`."""
    capped = dataclasses.replace(query, after=None, count_up_to=COUNT_CAP + 1)
    rows = db.queries.list_tasks(conn, "", capped)
    return int(rows[0][0]) if rows else 0


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
