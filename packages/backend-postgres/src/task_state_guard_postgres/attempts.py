"""A guarded job's two writes on PostgreSQL: *begin attempt* and *end attempt*, one statement
each (a data-modifying CTE composed with the server's own parameters, ``$n`` cast to its type,
prepared on the server, no row lock taken before it).

At READ COMMITTED each sub-statement's guard is judged on the row it changes, re-checked
against a row committed meanwhile when it waited for that row's lock. Every lookup of a task
names its id (``id = ANY(...)`` beside each join) and no guard can be read as the open-work
index's predicate, so the generic plan the server keeps for each statement (the driver asks
for generic plans: no planning per call) never scans open work. The statement writes what every
row it inserts or changes owes (:mod:`.writes`): a row inserted already running its
``created`` and ``started`` events, a start its ``started`` event, a close its events, totals
and verdict. A step the statement refused is reported, and the ledger explains it one task at a
time.

Each write has a statement per shape, the parts a call does not need left out, so the common
call (a first delivery: no candidate placeholders; a close without a retry to queue or a
delivery to mark) sends fewer parameters and runs fewer sub-statements. Arrays go as one text
parameter each in PostgreSQL's array syntax (:func:`array`), cast on the server, which costs
the client less than adapting a list.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import partial
from typing import Any

from task_state_guard import rules
from task_state_guard.store.attempts import FLOAT_MAX, Begin, Boundary, End, Ended
from task_state_guard.store.transitions import Mark

from . import writes
from .driver import Conn, prepared

#: The type each bound value is cast to (arrays go as one text parameter each, :func:`array`).
TYPES = {
    "now": "float8", "timeout": "float8", "fmax": "float8", "redelivery": "float8",
    "lid": "text", "name": "text", "owner": "text", "ldr": "int", "lowner": "text",
    "lfid": "text", "lfw": "text", "open": "boolean", "fresh": "text", "parent": "text",
    "thread": "text",
    "cids": "text[]", "cmake": "boolean[]", "qids": "text[]", "qparents": "text[]",
    "qnames": "text[]", "qtimeouts": "float8[]", "ids": "text[]", "states": "text[]",
    "id1": "text", "id2": "text",
    "codes": "text[]", "mstates": "text[]", "mcodes": "text[]",
}
_RUNNING_COLUMNS = (
    "id, parent_id, name, status, delivery_required, delivery_status, timeout_seconds, "
    "deadline_at, created_at, started_at, delivery_updated_at, updated_at, owner, "
    "redelivery_seconds, version"
)


def _deadline_fits(v: Mark) -> str:
    """An attempt's deadline is a finite timestamp (PostgreSQL raises on a float8 overflow,
    where SQLite gives infinity): checked before the sum, which a CASE keeps from being folded
    early."""
    return f"({v('timeout')} IS NULL OR {v('timeout')} <= {v('fmax')} - {v('now')})"


def _attempt_values(v: Mark) -> str:
    """An attempt inserted already running (as created, then started: version 1)."""
    now = v("now")
    return (
        f"{v('lid')}, {v('name')}, 'running', 0, 'pending', {v('timeout')}, "
        f"CASE WHEN {_deadline_fits(v)} THEN {now} + {v('timeout')} END, "
        f"{now}, {now}, {now}, {now}, {v('owner')}, {v('redelivery')}, 1"
    )


def _logical(v: Mark, startable: str) -> str:
    """The sub-statements that open the logical task (inserted, or started when queued) and
    find it (``par``), only when ``startable`` holds: the attempt's deadline check and, when
    no placeholder may be picked, that its id is free (a refused begin writes nothing, as one
    transaction on SQLite)."""
    now = v("now")
    return f"""lg AS (
    INSERT INTO tsg_tasks(id, name, status, delivery_required, delivery_status, created_at,
        started_at, delivery_updated_at, updated_at, owner, version, framework_id, framework)
    SELECT {v('lid')}, {v('name')}, 'running', {v('ldr')}, 'pending', {now}, {now},
        {now}, {now}, {v('lowner')}, 1, {v('lfid')}, {v('lfw')}
    WHERE {v('open')} AND {startable}
    ON CONFLICT (id) DO NOTHING RETURNING seq, created_at, started_at),
lgu AS (
    UPDATE tsg_tasks SET status = 'running', started_at = {now},
        deadline_at = {now} + timeout_seconds, owner = {v('lowner')},
        redelivery_seconds = NULL, updated_at = {now}, version = version + 1
    WHERE {v('open')} AND {startable} AND id = {v('lid')} AND status = 'queued'
        AND {rules.clock_guard('start', now)}
        AND (timeout_seconds IS NULL OR timeout_seconds <= {v('fmax')} - {now})
    RETURNING seq, started_at),
par AS (
    SELECT seq FROM lg
    UNION ALL SELECT seq FROM tsg_tasks WHERE id = {v('lid')} AND created_at <= {now}),"""


def _candidates(v: Mark) -> str:
    """The placeholder pick: the first candidate that can run the attempt, inserted or
    started."""
    now = v("now")
    return f"""
cand AS (
    SELECT c.id, c.make, c.ord, t.status, t.updated_at, t.timeout_seconds,
        (t.parent_id = {v('lid')} AND t.delivery_required = 0
         AND t.name IS NOT DISTINCT FROM {v('name')}
         AND t.timeout_seconds IS NOT DISTINCT FROM {v('timeout')}
         AND t.payload_hash IS NULL AND t.framework_id IS NULL) AS same
    FROM unnest({v('cids')}, {v('cmake')}) WITH ORDINALITY AS c(id, make, ord)
    LEFT JOIN tsg_tasks t ON t.id = c.id AND t.id = ANY({v('cids')})),
pick AS (
    SELECT id, status FROM cand
    WHERE (status IS NULL AND make AND EXISTS (SELECT 1 FROM par) AND {_deadline_fits(v)})
       OR (status = 'queued' AND (NOT make OR same) AND {rules.clock_guard('start', now)}
           AND (timeout_seconds IS NULL OR timeout_seconds <= {v('fmax')} - {now}))
    ORDER BY ord LIMIT 1),
ci AS (
    INSERT INTO tsg_tasks({_RUNNING_COLUMNS})
    SELECT pick.id, {_attempt_values(v)} FROM pick WHERE pick.status IS NULL
    ON CONFLICT (id) DO NOTHING RETURNING seq, id, created_at, started_at),
cu AS (
    UPDATE tsg_tasks t SET status = 'running', started_at = {now},
        deadline_at = {now} + t.timeout_seconds, owner = {v('owner')},
        redelivery_seconds = {v('redelivery')}, updated_at = {now},
        version = t.version + 1
    FROM pick WHERE pick.status = 'queued' AND t.id = pick.id AND t.status = 'queued'
        AND {rules.clock_guard('start', now, 't.')}
    RETURNING t.id, t.seq, t.started_at),"""


def _begin_parts(v: Mark, candidates: bool) -> tuple[str, str]:
    """*Begin attempt*'s sub-statements and its result (the attempt begun); without
    ``candidates`` the placeholder pick is left out (a new attempt is inserted whenever the
    logical task exists)."""
    fresh = " AND NOT EXISTS (SELECT 1 FROM pick)" if candidates else ""
    inserted = ("lg", "ci", "fr") if candidates else ("lg", "fr")
    started = ("lgu", "cu") if candidates else ("lgu",)
    # The created and started events of every row inserted already running, the started
    # event of every queued row started.
    owed = writes.events([*(("created", cte) for cte in inserted),
                          *(("started", cte) for cte in inserted + started)])
    result = "SELECT id FROM ci UNION ALL SELECT id FROM cu UNION ALL " if candidates else ""
    startable = _deadline_fits(v) if candidates else (
        f"{_deadline_fits(v)} AND NOT EXISTS (SELECT 1 FROM tsg_tasks WHERE id = {v('fresh')})")
    ctes = f"""{_logical(v, startable)}{_candidates(v) if candidates else ""}
fr AS (
    INSERT INTO tsg_tasks({_RUNNING_COLUMNS})
    SELECT {v('fresh')}, {_attempt_values(v)}
    WHERE EXISTS (SELECT 1 FROM par) AND {_deadline_fits(v)}{fresh}
    ON CONFLICT (id) DO NOTHING RETURNING seq, id, created_at, started_at),
ev AS ({owed})"""
    return ctes, f"{result}SELECT id FROM fr"


def _begin_sql(v: Mark, candidates: bool) -> str:
    """*Begin attempt*'s statement."""
    ctes, result = _begin_parts(v, candidates)
    return f"WITH\n{ctes}\n{result}"


def _open_only(v: Mark) -> str:
    """A delivering task with a parent link (or none), created already running and no
    attempt: what a create followed by a start at the same instant store. A row recorded
    earlier is left to the ledger's one-task steps (which explain a refusal)."""
    now, parent = v("now"), v("parent")
    return f"""WITH
lg AS (
    INSERT INTO tsg_tasks(id, parent_id, name, status, delivery_required, delivery_status,
        created_at, started_at, delivery_updated_at, updated_at, owner, version, framework_id,
        framework, thread_id)
    SELECT {v('lid')}, {parent}, {v('name')}, 'running', {v('ldr')},
        'pending', {now}, {now}, {now}, {now}, {v('lowner')}, 1, {v('lfid')},
        {v('lfw')}, {v('thread')}
    WHERE {parent} IS NULL OR EXISTS (SELECT 1 FROM tsg_tasks p
        WHERE p.id = {parent} AND p.created_at <= {now})
    ON CONFLICT (id) DO NOTHING RETURNING seq, id, created_at, started_at),
ev AS ({writes.events([("created", "lg"), ("started", "lg")])})
SELECT id FROM lg"""


def _queue(v: Mark) -> str:
    """The attempts queued by an end (each under a parent that exists), recorded in the
    order given (their ``seq`` order, which lists a task's children oldest first)."""
    now = v("now")
    return f"""q AS (
    INSERT INTO tsg_tasks(id, parent_id, name, status, delivery_required, delivery_status,
        timeout_seconds, created_at, delivery_updated_at, updated_at)
    SELECT u.id, u.parent, u.name, 'queued', 0, 'pending', u.timeout, {now}, {now}, {now}
    FROM unnest({v('qids')}, {v('qparents')}, {v('qnames')},
        {v('qtimeouts')}) WITH ORDINALITY AS u(id, parent, name, timeout, ord)
    WHERE EXISTS (SELECT 1 FROM tsg_tasks p WHERE p.id = u.parent
        AND p.id = ANY({v('qparents')}) AND p.created_at <= {now})
    ORDER BY u.ord
    ON CONFLICT (id) DO NOTHING RETURNING id, seq, created_at),
"""


#: Most closes an *end attempt* names one by one (``id1``, ``id2``) rather than as an array.
FEW = 2


def _end_parts(v: Mark, queue: bool, marks: bool, queued: str = "false",
               closed: str = "true", few: bool = False,
               if_queued: bool = False) -> tuple[str, str]:
    """*End attempt*'s sub-statements and its result (id, what, marked: ``what`` is
    ``queued`` for a retry queued, ``closed`` for a close); without ``queue`` the retry's
    insert is left out, without ``marks`` every close leaves a delivering task's delivery
    pending; with ``few`` (at most :data:`FEW` closes, the common call) the closed ids are
    also bound one by one, so that the generic plan finds them through the id index however
    small the table was when the statement was prepared (an array parameter is planned as ten
    elements, and a table of a few thousand rows was scanned whole for them); with
    ``if_queued`` it closes only tasks still queued."""
    if marks:
        delivery = "WHEN v.mstate IS NOT NULL THEN v.mstate ELSE t.delivery_status END"
        code = "WHEN v.mstate IS NOT NULL THEN v.mcode ELSE t.delivery_code END"
        settles = "t.delivery_required = 0 OR v.mstate IS NOT NULL"
        values = (f", {v('mstates')}, {v('mcodes')}) "
                  "AS v(id, status, code, mstate, mcode)")
        guard = "AND (v.mstate IS NULL OR t.delivery_required = 1) "
        marked = "(v.mstate IS NOT NULL)"
    else:
        delivery = "ELSE t.delivery_status END"
        code = "ELSE t.delivery_code END"
        settles = "t.delivery_required = 0"
        values = ") AS v(id, status, code)"
        guard = ""
        marked = "false"
    # ``coalesce(... = 'pending', false)``: the same guard (the column is never NULL), which
    # the planner cannot match to the open-work index's predicate (a generic plan that
    # intersected that index with the ids would scan every open task's entry).
    head = f"SELECT id, {queued}, false FROM q UNION ALL " if queue else ""
    among = f"ARRAY[{v('id1')}, {v('id2')}]" if few else v("ids")
    # What the closes owe (their events, totals and verdicts) and the queued rows' created
    # events.
    owed = ",\n".join(writes.owed("c", ("closed", "delivery"), prefix="c"))
    if queue:
        owed += f",\nqe AS ({writes.events([('created', 'q')])})"
    now = v("now")
    source = "= 'queued'" if if_queued else f"IN {rules.ACTIVE_SQL}"
    ctes = f"""{_queue(v) if queue else ""}c AS (
    UPDATE tsg_tasks t SET status = v.status, terminal_code = v.code, ended_at = {now},
        updated_at = {now},
        delivery_status = CASE WHEN t.delivery_required = 0 THEN 'not_applicable'
            {delivery},
        delivery_code = CASE WHEN t.delivery_required = 0 THEN 'internal_task'
            {code},
        delivery_updated_at = CASE WHEN {settles} THEN {now} ELSE t.delivery_updated_at END,
        version = t.version + CASE WHEN {settles} THEN 2 ELSE 1 END
    FROM unnest({v('ids')}, {v('states')}, {v('codes')}{values}
    WHERE t.id = ANY({among}) AND t.id = v.id AND t.status {source}
        AND coalesce(t.delivery_status = 'pending', false)
        {guard}AND {rules.clock_guard('close_settled', now, 't.')}
    RETURNING t.id, {marked} AS marked, {writes.returning('t.')}),
{owed}"""
    return ctes, f"{head}SELECT id, {closed}, marked FROM c"


def _end_sql(v: Mark, queue: bool, marks: bool, few: bool, if_queued: bool = False) -> str:
    """*End attempt*'s statement."""
    ctes, result = _end_parts(v, queue, marks, few=few, if_queued=if_queued)
    return f"WITH\n{ctes}\n{result}"


def _boundary_sql(v: Mark, queue: bool, marks: bool, candidates: bool, few: bool) -> str:
    """A :class:`~task_state_guard.store.attempts.Boundary`'s statement: the end's sub-statements
    and the begin's (under a logical task that exists, so never opening one) side by side;
    rows ``(id, what, marked)`` with ``what`` 0 queued, 1 closed, 2 begun."""
    end_ctes, ended = _end_parts(v, queue, marks, queued="0", closed="1", few=few)
    begin_ctes, begin_result = _begin_parts(v, candidates)
    return f"""WITH
{end_ctes},
{begin_ctes}
{ended} UNION ALL SELECT b.id, 2, false FROM ({begin_result}) AS b"""


# Each statement is composed on its own (:func:`~.driver.prepared`): its parameters numbered
# in the order it names them.
#: *Begin attempt*, with and without candidate placeholders.
BEGIN = {
    candidates: prepared(TYPES, partial(_begin_sql, candidates=candidates))
    for candidates in (False, True)
}
_FLAGS = (False, True)
#: *End attempt*, by (a retry to queue, a delivery to mark, at most :data:`FEW` closes).
END = {
    (queue, marks, few): prepared(TYPES, partial(_end_sql, queue=queue, marks=marks, few=few))
    for queue in _FLAGS for marks in _FLAGS for few in _FLAGS
}
#: The closes of tasks still queued (:attr:`End.if_queued
#: <task_state_guard.store.attempts.End.if_queued>`), by (a delivery to mark).
END_IF_QUEUED = {
    marks: prepared(TYPES, partial(_end_sql, queue=False, marks=marks, few=False,
                                   if_queued=True))
    for marks in _FLAGS
}
#: A boundary (*end attempt*, then *begin attempt*), by (a retry to queue, a delivery to mark,
#: candidate placeholders, at most :data:`FEW` closes).
BOUNDARY = {
    (queue, marks, candidates, few): prepared(
        TYPES, partial(_boundary_sql, queue=queue, marks=marks, candidates=candidates, few=few))
    for queue in _FLAGS for marks in _FLAGS for candidates in _FLAGS for few in _FLAGS
}
_OPEN_ONLY = prepared(TYPES, _open_only)


def _element(value: str | bool | float | None) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, bool):
        return "t" if value else "f"
    return repr(float(value))


def array(values: Iterable[str | bool | float | None]) -> str:
    """``values`` as one PostgreSQL array literal (strings quoted and escaped, ``None`` as
    ``NULL``), for a parameter cast to an array type on the server."""
    return "{" + ",".join(_element(v) for v in values) + "}"


def _begin_params(spec: Begin, now: float) -> dict[str, Any]:
    params: dict[str, Any] = {
        "now": now, "lid": spec.logical_id, "name": spec.name,
        "ldr": int(spec.delivery_required), "lowner": spec.logical_owner,
        "lfid": spec.framework_id, "lfw": spec.framework, "open": spec.open_logical,
        "fmax": FLOAT_MAX, "timeout": spec.timeout_seconds,
        "owner": spec.owner, "redelivery": spec.redelivery_seconds, "fresh": spec.attempt_id,
    }
    candidates = spec.candidates
    if candidates:
        params["cids"] = array([c[0] for c in candidates])
        params["cmake"] = array([c[1] for c in candidates])
    return params


def begin(conn: Conn, spec: Begin, now: float) -> str | None:
    """Run *begin attempt* as one statement: the attempt's id (with ``attempt=False``, the
    logical task's), or None when no attempt was started (the caller explains)."""
    if not spec.attempt:
        if not spec.open_logical:
            return None
        params = _begin_params(spec, now)
        params["parent"] = spec.parent_id
        params["thread"] = spec.thread_id
        rows = conn.fetch_named(_OPEN_ONLY, params)
        return str(rows[0][0]) if rows else None
    rows = conn.fetch_named(BEGIN[bool(spec.candidates)], _begin_params(spec, now))
    return str(rows[0][0]) if rows else None


def _end_params(spec: End) -> tuple[dict[str, Any], bool, bool, bool]:
    closes = spec.closes
    if len({c[0] for c in closes}) != len(closes):  # a task closed twice: the first close
        first = {c[0]: c for c in reversed(closes)}  # wins, the repeat is explained after
        closes = tuple(first[tid] for tid in dict.fromkeys(c[0] for c in closes))
    ids = [c[0] for c in closes]
    params: dict[str, Any] = {
        "ids": array(ids),
        "states": array([c[1] for c in closes]), "codes": array([c[2] for c in closes]),
    }
    queue = spec.queue
    if queue:
        params["qids"] = array([q[0] for q in queue])
        params["qparents"] = array([q[1] for q in queue])
        params["qnames"] = array([q[2] for q in queue])
        params["qtimeouts"] = array([q[3] for q in queue])
    marks = any(c[3] is not None for c in closes)
    if marks:
        params["mstates"] = array([None if c[3] is None else c[3][0] for c in closes])
        params["mcodes"] = array([None if c[3] is None else c[3][1] for c in closes])
    few = len(ids) <= FEW
    if few:
        params["id1"], params["id2"] = (*ids, None, None)[:FEW]
    return params, bool(queue), marks, few


def end(conn: Conn, spec: End, now: float, *, if_queued: bool = False) -> Ended:
    """Run *end attempt* as one statement; with ``if_queued`` (closes alone) it closes only
    tasks still queued (``spec.if_queued`` itself is :func:`end_in_steps`'s to split)."""
    params, queue, marks, few = _end_params(spec)
    params["now"] = now
    statement = END_IF_QUEUED[marks] if if_queued else END[queue, marks, few]
    rows = conn.fetch_named(statement, params)
    closed = frozenset(str(r[0]) for r in rows if r[1])
    marked = frozenset(str(r[0]) for r in rows if r[1] and r[2])
    queued = frozenset(str(r[0]) for r in rows if not r[1])
    return Ended(closed, marked, queued)


def in_steps(spec: End) -> bool:
    """Whether one *end attempt* statement cannot write ``spec``: a statement sees no row it
    inserts itself, so an attempt queued under another of the same queue, or a close of an
    attempt the queue records, needs :func:`end_in_steps`; so do closes of tasks still queued
    (``spec.if_queued``), a statement of their own."""
    if spec.if_queued:
        return True
    queued = {q[0] for q in spec.queue}
    return bool(queued) and (any(q[1] in queued for q in spec.queue)
                             or any(c[0] in queued for c in spec.closes))


def end_in_steps(conn: Conn, spec: End, now: float) -> Ended:
    """*End attempt* as one statement per nesting depth of ``spec.queue`` (a parent's depth
    before its children's), then one for the closes of tasks still queued
    (``spec.if_queued``, a task another transaction started meanwhile is re-checked and left
    as it is) and one for the other closes: run it in one transaction."""
    queued: set[str] = set()
    for level in _levels(spec.queue):
        queued |= end(conn, End((), tuple(level)), now).queued
    closed: set[str] = set()
    marked: set[str] = set()
    for only in (True, False):  # the queued-only closes first, as the spec lists them
        part = tuple(c for c in spec.closes if (c[0] in spec.if_queued) is only)
        if part:
            done = end(conn, End(part, ()), now, if_queued=only)
            closed |= done.closed
            marked |= done.marked
    return Ended(frozenset(closed), frozenset(marked), frozenset(queued))


def _levels(queue: Iterable[tuple[str, str, str | None, float | None]]
            ) -> list[list[tuple[str, str, str | None, float | None]]]:
    """``queue`` by nesting depth: an attempt whose parent is among them comes one level after
    its parent."""
    depth: dict[str, int] = {}
    levels: list[list[tuple[str, str, str | None, float | None]]] = []
    for entry in queue:
        level = depth.get(entry[1], -1) + 1
        depth[entry[0]] = level
        if level == len(levels):
            levels.append([])
        levels[level].append(entry)
    return levels


def boundary(conn: Conn, spec: Boundary, now: float) -> tuple[Ended, str | None]:
    """Run a boundary (*end attempt*, then *begin attempt* under a logical task that exists)
    as one statement: what the end wrote, and the attempt begun (None when the begin was
    refused; the caller explains)."""
    params, queue, marks, few = _end_params(spec.end)
    params.update(_begin_params(spec.begin, now))
    rows = conn.fetch_named(BOUNDARY[queue, marks, bool(spec.begin.candidates), few], params)
    closed = frozenset(str(r[0]) for r in rows if r[1] == 1)
    marked = frozenset(str(r[0]) for r in rows if r[1] == 1 and r[2])
    queued = frozenset(str(r[0]) for r in rows if r[1] == 0)
    begun = [str(r[0]) for r in rows if r[1] == 2]
    return Ended(closed, marked, queued), begun[0] if begun else None


__all__ = ["BEGIN", "BOUNDARY", "END", "array", "begin", "boundary", "end", "end_in_steps",
           "in_steps"]
