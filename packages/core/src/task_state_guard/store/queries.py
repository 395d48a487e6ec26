"""The read and pass operations whose SQL each backend writes in its own dialect.

The aggregates (status, history, reconcile, prune, the verdict outbox, the operator's reads)
state *what* they need once, here and in :mod:`task_state_guard.rules`, and run one algorithm;
a backend's :class:`Queries` object (``Database.queries``) decides *how* its database answers,
in its own SQL and placeholders (nothing rewrites another dialect's text): SQLite counts groups
one seq range at a time (a whole-table GROUP BY would sort every row), reads the at-risk
figures through the open-work index; PostgreSQL groups on the server, holds the rows a pass
reads, and writes a pass's closes as set-based statements. Every method takes the connection of the
caller's transaction and plain values, except a read of one task, which the backend runs in a
read of its own (see :class:`Queries`); no aggregate reads a backend flag, appends a backend's
SQL fragment or executes a statement itself.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from .. import rules
from ..model import ATTEMPT_SQL, LOST_CODES
from .transitions import TASK_COLUMNS

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
#: The :data:`AT_RISK` figures that are the oldest time of a kind of open work.
LEAST = tuple(name for name, (agg, _column, _cond) in AT_RISK.items() if agg == "min")
#: A root that closed in a time window (``{start}``, ``{end}``), for the history.
ROOT_CLOSED_IN = (
    "ended_at >= {start} AND ended_at < {end} AND parent_id IS NULL "
    f"AND status IN {rules.TERMINAL_SQL}"
)
#: The root closes in a time window, for the history.
ROOT_CLOSES = f"FROM tsg_tasks WHERE {ROOT_CLOSED_IN}"
#: The columns of an open row a reconcile pass judges (``version`` tells a row written since).
OPEN_COLUMNS = (
    "seq, status, created_at, started_at, heartbeat_at, deadline_at, owner, id, "
    "delivery_required, delivery_status, ended_at, parent_id, name, framework_id, version"
)
#: Open work, newest first, in batches (``{before}``: the last seq seen; ``{limit}``): what a
#: reconcile pass reads (children before their parents, so a parent sees this pass's
#: decisions about its children).
OPEN_BATCH = (
    f"SELECT {OPEN_COLUMNS} FROM tsg_tasks "
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


@dataclass(frozen=True, slots=True)
class TaskQuery:
    """One page of the operator's task listing, as plain values (the backend writes the SQL).

    ``attempts``: attempts (children owing nobody a delivery) rather than jobs; ``job``: only
    that job (``attempts``: its attempts); ``open_only``: only open work (the open-work index);
    ``status``: only that state, else ``active_only``: only queued and running tasks;
    ``name``: only that label; ``idle_before``: last sign of life (:data:`rules.IDLE_SINCE_SQL`)
    at or before; ``created_before``: created at or before; ``contradicted``: only jobs whose
    close an attempt contradicts (``attempts``: only those attempts;
    :func:`rules.contradicts_close`); ``thread``: only the tasks of that framework thread (a
    layout with the thread column); ``order``: a key of
    :data:`LIST_ORDERS`; ``after``: the (sort key, seq) of the row the page starts after;
    ``limit``: most rows. Rows: the task columns, its attempts, its idle-since time, its sort
    key and its seq.
    """

    attempts: bool
    job: str | None
    open_only: bool
    status: str | None
    active_only: bool
    name: str | None
    idle_before: float | None
    created_before: float | None
    order: str
    descending: bool
    after: tuple[Any, int] | None
    limit: int
    contradicted: bool = False
    #: ``thread``: only the tasks of that framework thread.
    thread: str | None = None
    #: ``code``: only that reason code; ``framework``: only tasks that adapter opened;
    #: ``contains``: only names holding that text (case as written); ``deadline_before``:
    #: only running tasks whose deadline is at or before it; ``owners``: only running tasks
    #: of those owner tokens; ``verdict``: only jobs with a lost verdict in that state;
    #: ``awaiting_delivery``: only closed tasks whose owed delivery is still pending.
    code: str | None = None
    framework: str | None = None
    contains: str | None = None
    deadline_before: float | None = None
    owners: tuple[str, ...] | None = None
    verdict: str | None = None
    awaiting_delivery: bool = False
    #: When set, the statement counts the matches instead, up to this many (the cursor, the
    #: order and ``limit`` aside): one row, the count.
    count_up_to: int | None = None


#: The sort keys of a listing: creation order (the ledger's own, oldest first), the last sign of
#: life (longest idle first), the name label, the state. Ties go by creation order.
LIST_ORDERS: dict[str, str] = {
    "created": "seq",
    "activity": rules.IDLE_SINCE_SQL,
    "name": "coalesce(name, '')",
    "status": "status",
}
#: The qualifier of the listed row in the listing's subqueries.
LISTED = "tsg_tasks."
#: A listed task's attempts: its direct children that owe nobody a delivery.
LIST_ATTEMPTS = (
    f"(SELECT count(*) FROM tsg_tasks AS a WHERE a.parent_id = {LISTED}id "
    "AND a.delivery_required = 0)"
)
@dataclass(frozen=True, slots=True)
class FindQuery:
    """The ids of tasks in ``status`` (attempts included), oldest first, as plain values:
    ``open_only``: only open work (the open-work index); ``idle_before``: last sign of life
    (:data:`FIND_IDLE_SINCE`) at or before; ``name``: only that label; ``created_before``:
    created at or before; ``job``: only that task and its direct children; ``limit``: most ids
    (None: all)."""

    status: str | None
    open_only: bool
    idle_before: float | None
    name: str | None
    created_before: float | None
    job: str | None
    limit: int | None
    thread: str | None = None


#: When a task of a state last showed life, for :class:`FindQuery`: its heartbeat or start
#: while running, its creation while queued, its last change once terminal.
FIND_IDLE_SINCE = {"running": rules.RUNNING_IDLE_SINCE_SQL, "queued": "created_at"}
#: ... any other state.
FIND_IDLE_SINCE_CLOSED = "updated_at"


#: Prune's candidate roots: delivery closed, last change before the cut-off (a partial index).
PRUNABLE = (
    "parent_id IS NULL AND delivery_status != 'pending' AND delivery_updated_at <= {cutoff}"
)


@dataclass(frozen=True, slots=True)
class CloseWindow:
    """The history's window read beside the status counts: ``[start, end)`` in buckets of
    ``width`` seconds."""

    start: float
    width: float
    end: float


@dataclass(slots=True)
class StatusGroups:
    """What status counts in one read: task counts per :data:`STATUS_KEY` group, and the
    :data:`AT_RISK` figures (``least``: the oldest queued, running and owed times); given a
    :class:`CloseWindow`, its root closes as :meth:`Queries.root_closes` gives them."""

    counts: Counter[GroupKey]
    least: dict[str, Any]
    past_deadline: int
    stale: int
    closes: list[tuple[Any, Any, Any, int]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Dialect:
    """How a backend writes the values a shared statement binds: ``mark(name)``, one value
    bound by name (SQLite ``:name``, psycopg ``%(name)s``); ``among(column, name, type)``,
    ``column`` is one of the list bound as ``name`` (its elements of SQL type ``type``);
    ``skip_held``, what a claim appends to read past rows other writers hold (``""`` where a
    write transaction holds the whole database)."""

    mark: Callable[[str], str]
    among: Callable[[str, str, str], str]
    skip_held: str = ""
    #: ``column`` holds the text bound as ``name`` (a substring, case as written).
    contains: Callable[[str, str], str] = lambda column, marked: f"instr({column}, {marked}) > 0"


#: Statements a backend runs as they are (no bound value).
COUNT_OPEN = f"SELECT count(*) FROM tsg_tasks WHERE {OPEN_WORK}"
OPEN_RUNNING_OWNERS = (
    f"SELECT owner, count(*) FROM tsg_tasks WHERE {OPEN_WORK} "
    "AND status = 'running' AND owner IS NOT NULL GROUP BY owner"
)
TOTALS = f"SELECT {rules.TOTALS_COLUMNS} FROM tsg_totals"
VERDICT_COUNTS = (
    "SELECT framework, state, count(*), min(recorded_at) FROM tsg_verdicts GROUP BY 1, 2"
)
#: A task's lost verdict that no adapter has published yet (current layout only), per row ``t``.
OWED_VERDICTS = (
    "(SELECT count(*) FROM tsg_verdicts v WHERE v.task_seq = t.seq AND v.state = 'pending')"
)


def tree_walk(d: Dialect, *, outbox: bool) -> str:
    """Prune's read of the trees under the roots bound as ``seqs``: each task's root, seq,
    states, last change, event count and pending verdicts (0 in a layout without the outbox,
    ``outbox`` False)."""
    verdicts = OWED_VERDICTS if outbox else "0"
    changed = ("CASE WHEN {row}updated_at > {row}delivery_updated_at THEN {row}updated_at "
               "ELSE {row}delivery_updated_at END")
    # Each task's columns are taken as the walk reaches it (one read of each row).
    return (
        "WITH RECURSIVE tree(root, seq, id, status, delivery_status, changed) AS ("
        f" SELECT seq, seq, id, status, delivery_status, {changed.format(row='')}"
        f" FROM tsg_tasks WHERE {d.among('seq', 'seqs', 'bigint')}"
        " UNION ALL SELECT tree.root, c.seq, c.id, c.status, c.delivery_status,"
        f" {changed.format(row='c.')} FROM tsg_tasks c JOIN tree ON c.parent_id = tree.id)"
        " SELECT t.root, t.seq, t.status, t.delivery_status, t.changed,"
        " (SELECT count(*) FROM tsg_events e WHERE e.task_seq = t.seq),"
        f" {verdicts} FROM tree t"
    )


def statements(d: Dialect) -> dict[str, str]:
    """The statements both backends run, written once and composed in dialect ``d`` (each
    backend renders them at import time; what stays in a backend is what really differs)."""
    v = d.mark
    # A lost attempt's broker may still redeliver the job while this holds (the pass's cutoff).
    redelivery_open = (f"(redelivery_seconds IS NOT NULL AND {rules.RUNNING_IDLE_SINCE_SQL} "
                       f"+ redelivery_seconds > {v('cutoff')})")
    parents = d.among("parent_id", "parents", "text")
    prunable = render(PRUNABLE, v, "cutoff")
    pending_free = (f"framework = {v('framework')} AND state = 'pending' "
                    f"AND (lease_until IS NULL OR lease_until <= {v('now')})")
    of_tasks = ("task_seq IN (SELECT seq FROM tsg_tasks WHERE "
                f"{d.among('id', 'ids', 'text')})")
    claim = (
        f"UPDATE tsg_verdicts SET lease_until = {v('until')}, claim = {v('token')} "
        f"WHERE task_seq IN (SELECT task_seq FROM tsg_verdicts WHERE {pending_free}"
    )
    claim_end = f" ORDER BY task_seq LIMIT {v('limit')}{d.skip_held}) RETURNING task_seq"
    return {
        "active_children": (
            f"SELECT parent_id, seq, status, {redelivery_open} FROM tsg_tasks "
            f"WHERE {parents} AND (status IN {rules.ACTIVE_SQL} "
            f"OR (status = 'timed_out' AND terminal_code IN {rules.sql_set(LOST_CODES)} "
            f"AND {redelivery_open}))"
        ),
        # An older layout (read in place by a read-only open) records no redelivery windows.
        "active_children_old": (
            f"SELECT parent_id, seq, status, 0 FROM tsg_tasks "
            f"WHERE {parents} AND status IN {rules.ACTIVE_SQL}"
        ),
        "runs_for_owner": (
            f"SELECT 1 FROM tsg_tasks WHERE {OPEN_WORK} AND status = 'running' "
            f"AND owner = {v('owner')} LIMIT 1"
        ),
        "task": f"SELECT {TASK_COLUMNS} FROM tsg_tasks WHERE id = {v('id')}",
        "exists": f"SELECT 1 FROM tsg_tasks WHERE id = {v('id')}",
        "children": f"SELECT {TASK_COLUMNS} FROM tsg_tasks WHERE parent_id = {v('id')} "
                    "ORDER BY seq",
        "children_limit": f"SELECT {TASK_COLUMNS} FROM tsg_tasks WHERE parent_id = {v('id')} "
                          f"ORDER BY seq LIMIT {v('limit')}",
        "count_prunable": f"SELECT count(*) FROM tsg_tasks WHERE {prunable}",
        "prunable_roots": (
            f"SELECT seq, delivery_updated_at FROM tsg_tasks WHERE {prunable} "
            f"AND (delivery_updated_at, seq) > ({v('updated')}, {v('seq')}) "
            f"ORDER BY delivery_updated_at, seq LIMIT {v('limit')}"
        ),
        "trees": tree_walk(d, outbox=True),
        "trees_old": tree_walk(d, outbox=False),
        "any_claimable": f"SELECT 1 FROM tsg_verdicts WHERE {pending_free} LIMIT 1",
        "claim": claim + claim_end,
        "claim_only": f"{claim} AND {of_tasks}{claim_end}",
        "claimed": (
            "SELECT t.id, t.framework_id, t.name, t.terminal_code, v.framework, v.recorded_at, "
            "NULL FROM tsg_verdicts v JOIN tsg_tasks t ON t.seq = v.task_seq "
            f"WHERE {d.among('v.task_seq', 'seqs', 'bigint')} ORDER BY v.task_seq"
        ),
        # A layout with the thread column: the thread of each claimed task too.
        "claimed_threads": (
            "SELECT t.id, t.framework_id, t.name, t.terminal_code, v.framework, v.recorded_at, "
            "t.thread_id FROM tsg_verdicts v JOIN tsg_tasks t ON t.seq = v.task_seq "
            f"WHERE {d.among('v.task_seq', 'seqs', 'bigint')} ORDER BY v.task_seq"
        ),
        "publish": (
            f"UPDATE tsg_verdicts SET state = 'published', published_at = {v('now')}, "
            f"lease_until = NULL, claim = NULL WHERE state = 'pending' AND {of_tasks} "
            "RETURNING task_seq"
        ),
        "release": (
            "UPDATE tsg_verdicts SET lease_until = NULL, claim = NULL WHERE state = 'pending' "
            f"AND claim = {v('token')} AND {of_tasks} RETURNING task_seq"
        ),
    }


#: A listed job's lost verdict: its state, when it was recorded and when published (current
#: layout only; an older one has no verdicts).
VERDICT_COLUMNS = ", ".join(
    f"(SELECT v.{column} FROM tsg_verdicts v WHERE v.task_seq = {LISTED}seq)"
    for column in ("state", "recorded_at", "published_at"))
#: Most owner tokens one listing names (the owners found dead, a handful in practice).
MAX_OWNERS = 500


def listing(d: Dialect, columns: str, query: TaskQuery) -> tuple[str, dict[str, Any]]:
    """A :class:`TaskQuery`'s statement in dialect ``d`` and the values it binds by name."""
    v = d.mark
    clauses = [ATTEMPT_SQL if query.attempts else f"NOT {ATTEMPT_SQL}"]
    params: dict[str, Any] = {"limit": query.limit}
    if query.awaiting_delivery:  # through the open-work index, as open_only
        clauses.append(f"delivery_required = 1 AND status IN {rules.TERMINAL_SQL}")
    if query.code is not None:
        clauses.append(f"terminal_code = {v('code')}")
        params["code"] = query.code
    if query.framework is not None:
        clauses.append(f"framework = {v('framework')}")
        params["framework"] = query.framework
    if query.contains is not None:
        clauses.append(f"name IS NOT NULL AND {d.contains('name', v('contains'))}")
        params["contains"] = query.contains
    if query.deadline_before is not None:
        clauses.append(f"status = 'running' AND deadline_at <= {v('deadline_before')}")
        params["deadline_before"] = query.deadline_before
    if query.owners is not None:  # one bound value each: at most MAX_OWNERS
        marks = [f"owner{n}" for n in range(min(len(query.owners), MAX_OWNERS))]
        clauses.append("status = 'running' AND owner IN ("
                       + ", ".join(v(m) for m in marks) + ")" if marks else "0 = 1")
        params.update(zip(marks, query.owners, strict=False))
    if query.verdict is not None:
        clauses.append(f"seq IN (SELECT task_seq FROM tsg_verdicts WHERE state = {v('verdict')})")
        params["verdict"] = query.verdict
    if query.job is not None:  # one job: the task itself, or its attempts
        clauses.append(f"parent_id = {v('job')}" if query.attempts else f"id = {v('job')}")
        params["job"] = query.job
    if query.open_only:
        clauses.append(OPEN_WORK)  # the open-work index
    if query.status is not None:
        clauses.append(f"status = {v('status')}")
        params["status"] = query.status
    elif query.active_only:
        clauses.append(f"status IN {rules.ACTIVE_SQL}")
    if query.name is not None:
        clauses.append(f"name = {v('name')}")
        params["name"] = query.name
    if query.thread is not None:  # the thread index
        clauses.append(f"thread_id = {v('thread')}")
        params["thread"] = query.thread
    if query.idle_before is not None:
        clauses.append(f"{rules.IDLE_SINCE_SQL} <= {v('idle_before')}")
        params["idle_before"] = query.idle_before
    if query.created_before is not None:
        clauses.append(f"created_at <= {v('created_before')}")
        params["created_before"] = query.created_before
    if query.contradicted:
        clauses.append(rules.contradicts_its_close(LISTED) if query.attempts
                       else rules.close_contradicted(LISTED))
    if query.count_up_to is not None:  # the matches, counted up to a bound
        params = {k: value for k, value in params.items() if k != "limit"}
        params["up_to"] = query.count_up_to
        return (f"SELECT count(*) FROM (SELECT 1 FROM tsg_tasks WHERE {' AND '.join(clauses)} "
                f"LIMIT {v('up_to')}) AS matched", params)
    key = LIST_ORDERS[query.order]
    direction, beyond = ("DESC", "<") if query.descending else ("ASC", ">")
    if query.after is not None:
        clauses.append(f"({key} {beyond} {v('key')} OR ({key} = {v('key')} "
                       f"AND seq {beyond} {v('after_seq')}))")
        params["key"], params["after_seq"] = query.after
    ordering = f"seq {direction}" if query.order == "created" else (
        f"{key} {direction}, seq {direction}")
    sql = (
        f"SELECT {columns}, {LIST_ATTEMPTS}, {rules.IDLE_SINCE_SQL}, {key}, seq FROM tsg_tasks "
        f"WHERE {' AND '.join(clauses)} ORDER BY {ordering} LIMIT {v('limit')}"
    )
    return sql, params


def finding(d: Dialect, query: FindQuery) -> tuple[str, dict[str, Any]]:
    """A :class:`FindQuery`'s statement in dialect ``d`` and the values it binds by name."""
    v = d.mark
    clauses = [] if query.status is None else [f"status = {v('status')}"]
    params: dict[str, Any] = {} if query.status is None else {"status": query.status}
    if query.open_only:
        clauses.insert(0, OPEN_WORK)
    if query.thread is not None:  # the thread index
        clauses.append(f"thread_id = {v('thread')}")
        params["thread"] = query.thread
    sql = "SELECT id FROM tsg_tasks WHERE " + " AND ".join(clauses or ["1 = 1"])
    if query.idle_before is not None:
        since = FIND_IDLE_SINCE.get(query.status or "", FIND_IDLE_SINCE_CLOSED)
        sql += f" AND {since} <= {v('idle_before')}"
        params["idle_before"] = query.idle_before
    if query.name is not None:
        sql += f" AND name = {v('name')}"
        params["name"] = query.name
    if query.created_before is not None:
        sql += f" AND created_at <= {v('created_before')}"
        params["created_before"] = query.created_before
    if query.job is not None:
        sql += f" AND (id = {v('job')} OR parent_id = {v('job')})"
        params["job"] = query.job
    sql += " ORDER BY seq"
    if query.limit is not None:
        sql += f" LIMIT {v('limit')}"
        params["limit"] = query.limit
    return sql, params


class Queries(Protocol):
    """A backend's answers to the aggregates' reads and to a reconcile pass's writes.

    A read of one task (:meth:`task`, :meth:`children`, :meth:`task_events`) and the owner
    lookup of the cleanup after a pass (:meth:`runs_for_owner`) run inside the backend, in a
    read transaction of its own (inside this thread's open group, the group's): no connection
    is handed out for them. Every other method takes the connection of a unit of
    work the core drives and runs in it: status's one snapshot of several reads; the history,
    the listing and the id search, whose clock is read inside their snapshot; reconcile's pass
    (its batches, children, closes, owners); prune (candidates, trees, holds and deletes in one
    write a batch); the verdict outbox's claim, publish and release.
    """

    def status_groups(self, conn: Any, now: float, stale_before: float, bound: int,
                      closes: CloseWindow | None = None) -> StatusGroups:
        """Count the tasks per group (the first ``bound`` groups met keep their names, later
        ones fold) and the figures of open work at risk (``stale_before``: the clock minus the
        active grace); with ``closes``, also that window's root closes (in the same read)."""
        ...

    def root_closes(self, conn: Any, start: float, width: float,
                    end: float) -> list[tuple[Any, Any, Any, int]]:
        """The root closes in ``[start, end)`` as ``(bucket, state, code, count)`` rows, the
        bucket ``(ended_at - start) / width`` (a real or whole number; the caller clamps)."""
        ...

    def open_batch(self, conn: Any, before_seq: int, limit: int) -> list[tuple[Any, ...]]:
        """:data:`OPEN_BATCH`, read without holding a row (a pass holds only what it changes:
        :meth:`hold_open`)."""
        ...

    def hold_open(self, conn: Any, rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        """The rows of a batch a pass that writes (inside ``Database.bulk``) is about to
        change, as they are now (:data:`OPEN_COLUMNS`), kept from other writers until the pass
        commits: those still open, skipping any a writer holds at this moment (the next pass
        judges it). A backend whose write transaction keeps every other writer out returns
        ``rows`` as they are."""
        ...

    def close_lost(self, conn: Any, timeouts: list[tuple[str, float, int]],
                   deliveries: list[tuple[str, str, float, int]]) -> None:
        """A pass's writes: time out tasks ``(code, now, seq)`` and close deliveries
        ``(state, code, now, seq)``, each with its events and totals (the rules)."""
        ...

    def count_open(self, conn: Any) -> int:
        """How many tasks are open work (:data:`OPEN_WORK`): a pass's progress total."""
        ...

    def active_children(self, conn: Any, parent_ids: list[str],
                        cutoff: float | None) -> list[tuple[Any, Any, Any, Any]]:
        """``(parent_id, seq, status, may_be_redelivered)`` of the children of ``parent_ids``
        that are queued or running, or (``cutoff`` given: the layout records redelivery
        windows) were lost while their broker may still redeliver the job: the redelivery
        window past their last sign of life is after ``cutoff`` (the pass's active cutoff)."""
        ...

    def runs_for_owner(self, token: str) -> bool:
        """Whether an open running task names ``token`` as its owner (in a read of its own)."""
        ...

    def open_running_owners(self, conn: Any) -> list[tuple[Any, int]]:
        """``(owner, count)`` of the open running tasks, per owner that is set."""
        ...

    def totals(self, conn: Any) -> list[tuple[Any, Any, Any, Any, Any]]:
        """The rows of the outcome totals: ``(event, kind, state, code, total)``."""
        ...

    def task_events(self, task_id: str) -> list[tuple[Any, ...]] | None:
        """``(step, kind, state, code, at)`` of the task's events in step order; None when
        no task has ``task_id`` (in a read of its own)."""
        ...

    def list_tasks(self, conn: Any, columns: str, query: TaskQuery) -> list[tuple[Any, ...]]:
        """The rows of one listing page (see :class:`TaskQuery`), ``columns`` first."""
        ...

    def task(self, task_id: str) -> tuple[Any, ...] | None:
        """The task's row (:data:`~task_state_guard.store.transitions.TASK_COLUMNS`), or None when
        no task has ``task_id`` (in a read of its own)."""
        ...

    def children(self, task_id: str, limit: int | None) -> list[tuple[Any, ...]] | None:
        """The rows of the task's direct children in seq order (the first ``limit``, when
        given), or None when no task has ``task_id`` (in one read of its own)."""
        ...

    def find_ids(self, conn: Any, query: FindQuery) -> list[Any]:
        """The ids :class:`FindQuery` asks for, in seq order."""
        ...

    def count_prunable(self, conn: Any, cutoff: float) -> int:
        """How many roots are prune candidates (:data:`PRUNABLE`): a pass's progress total."""
        ...

    def prunable_roots(self, conn: Any, cutoff: float, after: tuple[float, int],
                       limit: int) -> list[tuple[Any, Any]]:
        """``(seq, delivery_updated_at)`` of the next ``limit`` candidate roots after ``after``
        (a ``(delivery_updated_at, seq)`` position), in that order."""
        ...

    def trees(self, conn: Any, roots: list[int],
              outbox: bool) -> list[tuple[Any, Any, Any, Any, Any, Any, Any]]:
        """Every task of the trees under ``roots``: ``(root, seq, status, delivery_status,
        last change, events, pending verdicts)`` (``outbox``: the layout has the outbox, else
        the last column is 0)."""
        ...

    def hold_for_delete(self, conn: Any,
                        seqs: list[int]) -> tuple[set[int], list[tuple[Any, Any]]] | None:
        """Hold the rows ``seqs`` against other writers until the transaction ends (new
        children's parent checks wait too), skipping rows held elsewhere: the rows held, and
        every child of them read after the hold as ``(parent's seq, child's seq)``; None where
        the write transaction already holds the whole database."""
        ...

    def delete_tasks(self, conn: Any, seqs: list[int]) -> None:
        """Delete the tasks ``seqs`` (children before their parents) with their events and
        verdicts."""
        ...

    def any_claimable(self, conn: Any, framework: str, now: float) -> bool:
        """Whether a pending verdict of ``framework`` has a free or expired lease at ``now``."""
        ...

    def claim_verdicts(self, conn: Any, framework: str, now: float, until: float, token: str,
                       task_ids: list[str] | None, limit: int) -> list[int]:
        """Lease (``until``, ``token``) up to ``limit`` claimable verdicts of ``framework``,
        oldest first (``task_ids``: only those tasks'), skipping rows other writers hold; the
        task seqs claimed."""
        ...

    def claimed(self, conn: Any, seqs: list[int], threads: bool) -> list[tuple[Any, ...]]:
        """``(id, framework_id, name, terminal_code, framework, recorded_at, thread_id)`` of
        the verdicts of ``seqs``, in seq order (``threads``: the layout has the thread
        column, else ``thread_id`` is None)."""
        ...

    def publish_verdicts(self, conn: Any, now: float, task_ids: list[str]) -> int:
        """Mark the pending verdicts of ``task_ids`` published at ``now``; how many changed."""
        ...

    def release_verdicts(self, conn: Any, token: str, task_ids: list[str]) -> int:
        """End the leases of claim ``token`` on the pending verdicts of ``task_ids``; how many
        were released."""
        ...

    def verdict_counts(self, conn: Any) -> list[tuple[Any, Any, Any, Any]]:
        """``(framework, state, count, oldest recorded_at)`` per framework and state."""
        ...


__all__ = [
    "AT_RISK",
    "COUNT_OPEN",
    "FIND_IDLE_SINCE",
    "FIND_IDLE_SINCE_CLOSED",
    "INVALID_LABEL",
    "LEAST",
    "LISTED",
    "LIST_ATTEMPTS",
    "LIST_ORDERS",
    "MAX_GROUPS",
    "MAX_OWNERS",
    "OPEN_BATCH",
    "OPEN_COLUMNS",
    "OPEN_RUNNING_OWNERS",
    "OPEN_WORK",
    "OWED_VERDICTS",
    "PRUNABLE",
    "ROOT_CLOSED_IN",
    "ROOT_CLOSES",
    "STATUS_KEY",
    "TOTALS",
    "VERDICT_COLUMNS",
    "VERDICT_COUNTS",
    "CloseWindow",
    "Dialect",
    "FindQuery",
    "GroupKey",
    "Queries",
    "StatusGroups",
    "TaskQuery",
    "add_group",
    "before",
    "finding",
    "listing",
    "render",
    "statements",
]
