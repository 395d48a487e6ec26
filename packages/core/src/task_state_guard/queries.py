"""The read and pass operations whose SQL each backend writes in its own dialect.

The aggregates (status, history, reconcile, the verdict outbox) state *what* they need once,
here and in :mod:`task_state_guard.rules`, and run one algorithm; a backend's
:class:`Queries` object (``Database.queries``) decides *how* its database answers: SQLite
streams rows and counts them in Python (its GROUP BY would sort every row) and reads the
at-risk figures through the open-work index; PostgreSQL groups on the server, holds the rows
a pass reads, and writes a pass's closes as set-based statements. No aggregate reads a backend
flag or appends a backend's SQL fragment.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from . import rules

#: The open work: every task whose delivery is not closed yet.
OPEN_WORK = "delivery_status = 'pending'"
#: What status counts tasks by: state, delivery state, name, is a root, owes its delivery.
STATUS_KEY = "status, delivery_status, name, parent_id IS NULL, delivery_required = 1"
#: The figures of open work at risk, each an aggregate over :data:`OPEN_WORK`: name ->
#: (aggregate, column, condition). A condition's parameter is a named marker each backend
#: renders in its own placeholder style (:func:`render`): ``{now}``, the clock (a deadline
#: passed); ``{stale_before}``, the clock minus the active grace (no sign of life since).
AT_RISK: dict[str, tuple[str, str, str]] = {
    "queued": ("min", "created_at", "status = 'queued'"),
    "running": ("min", "started_at", "status = 'running'"),
    "owed": ("min", "ended_at", f"delivery_required = 1 AND status IN {rules.TERMINAL_SQL}"),
    "past_deadline": ("count", "*", "status = 'running' AND deadline_at <= {now}"),
    "stale": ("count", "*",
              f"status = 'running' AND {rules.RUNNING_IDLE_SINCE_SQL} <= {{stale_before}}"),
}
#: The root closes in a time window (``{start}``, ``{end}``), for the history.
ROOT_CLOSES = (
    "FROM tsg_tasks WHERE parent_id IS NULL AND ended_at >= {start} AND ended_at < {end} "
    f"AND status IN {rules.TERMINAL_SQL}"
)
#: Open work, newest first, in batches (``{before}``: the last seq seen; ``{limit}``): what a
#: reconcile pass reads (children before their parents, so a parent sees this pass's
#: decisions about its children).
OPEN_BATCH = (
    "SELECT seq, status, created_at, started_at, heartbeat_at, deadline_at, owner, id, "
    "delivery_required, delivery_status, ended_at, parent_id, name, framework_id FROM tsg_tasks "
    f"WHERE {OPEN_WORK} AND seq < {{before}} ORDER BY seq DESC LIMIT {{limit}}"
)


def render(template: str, mark: Callable[[str], str], *names: str) -> str:
    """A shared statement in one backend's dialect: each named marker ``{name}`` of ``names``
    becomes ``mark(name)`` (SQLite ``:name``, psycopg ``%(name)s``); no other text changes."""
    return template.format(**{name: mark(name) for name in names})

#: A status group's key: (state, delivery state, name, is a root, owes its delivery).
GroupKey = tuple[Any, Any, Any, Any, Any]
INVALID_LABEL = "<invalid>"  # a tampered name is counted under this label, never shown
#: Beyond this many distinct (state, delivery state, name) groups, names fold into
#: :data:`INVALID_LABEL` (only tampering makes that many).
MAX_GROUPS = 50_000


def add_group(counts: Counter[GroupKey], key: GroupKey, count: int,
              bound: int = MAX_GROUPS) -> None:
    """Count ``count`` rows under ``key``; past ``bound`` groups a new name folds."""
    if key not in counts and len(counts) >= bound:
        key = (key[0], key[1], None if key[2] is None else INVALID_LABEL, key[3], key[4])
    counts[key] += count


def before(value: Any, least: Any) -> bool:
    """``value < least`` as SQL's ``min`` orders them (NaN above every number)."""
    return bool(value < least or (least != least and value == value))


@dataclass(slots=True)
class StatusGroups:
    """What status counts in one read: task counts per :data:`STATUS_KEY` group, and the
    :data:`AT_RISK` figures (``least``: the oldest queued, running and owed times)."""

    counts: Counter[GroupKey]
    least: dict[str, Any]
    past_deadline: int
    stale: int


class Queries(Protocol):
    """A backend's answers to the aggregates' reads and to a reconcile pass's writes."""

    def status_groups(self, conn: Any, now: float, stale_before: float,
                      bound: int) -> StatusGroups:
        """Count the tasks per group (folding names past ``bound`` groups) and the figures of
        open work at risk (``stale_before``: the clock minus the active grace)."""
        ...

    def root_closes(self, conn: Any, start: float, width: float,
                    end: float) -> list[tuple[Any, Any, Any, int]]:
        """The root closes in ``[start, end)`` as ``(bucket, state, code, count)`` rows, the
        bucket ``(ended_at - start) / width`` (a real or whole number; the caller clamps)."""
        ...

    def open_batch(self, conn: Any, before_seq: int, limit: int,
                   hold: bool) -> list[tuple[Any, ...]]:
        """:data:`OPEN_BATCH`; ``hold``: keep the rows from other writers until the pass
        commits (where the backend locks rows), skipping rows a writer holds now."""
        ...

    def close_lost(self, conn: Any, timeouts: list[tuple[str, float, int]],
                   deliveries: list[tuple[str, str, float, int]]) -> None:
        """A pass's writes: time out tasks ``(code, now, seq)`` and close deliveries
        ``(state, code, now, seq)``, each with its events and totals (the rules)."""
        ...

    #: Appended to the verdict claim's selection (a row lock that skips held rows, or "").
    claim_lock: str


__all__ = [
    "AT_RISK", "INVALID_LABEL", "MAX_GROUPS", "OPEN_BATCH", "OPEN_WORK", "ROOT_CLOSES",
    "STATUS_KEY", "GroupKey", "Queries", "StatusGroups", "add_group", "before", "render",
]
