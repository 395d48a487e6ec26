"""Counts-only health check: the rules a ledger must satisfy and the report, for every backend.

The report (0.1.0's keys): ``healthy``, ``schema_version``, ``schema_ok``, ``quick_check``
(``"ok"`` or ``"failed"``), ``task_count``, ``event_count``, ``task_status_counts`` and
``delivery_status_counts`` (every state, zeros included), and one integer ``*_count`` per class
of finding (this version adds ``verdict_mismatch_count``: the verdict outbox disagrees with the
closes it records; ``unexpected_schema_object_count``: objects in the file's schema, such as a
trigger, that no layout of this release has), and ``warnings``: counts of what the ledger
records consistently but something outside it contradicted (``contradicted_close_count``:
jobs closed other than ``succeeded`` with an attempt that succeeded after the close). A warning
never makes the report unhealthy.

Memory stays bounded whatever the ledger size: state and code rules are judged once per distinct
row *shape* (SQLite groups the rows), timestamp and event-chain rules are counting queries
evaluated inside SQLite, and identifiers are checked in one streaming pass. Findings are counts;
no id, code, hash or stored value ever appears in the report.

The rules and the report are here; each backend supplies its probes (:class:`Probes`: the
dialect's statements, how it counts broken parent links and how it streams rows) and its own
integrity and layout checks (``task_state_guard.sqlite.doctor``,
``task_state_guard_postgres.doctor``), then calls :func:`check` and :func:`report`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from .. import rules
from ..model import (
    ACTIVE_STATES,
    CANONICAL_RE,
    DELIVERY_STATES,
    FRAMEWORK_LABELS,
    HASH_RE,
    NAME_RE,
    TASK_STATES,
    codes_registered,
)
from . import verdicts

FINDINGS = (
    "integrity_errors",
    "foreign_key_violations",
    "orphan_events",
    "invalid_ids",
    "invalid_values",
    "invalid_states",
    "invalid_codes",
    "invalid_timestamps",
    "parent_order_violations",
    "parent_cycles",
    "event_chain_mismatches",
    "verdict_mismatches",
    "unexpected_schema_objects",
)
#: The report key of each finding class.
COUNT_KEYS = {
    "integrity_errors": "integrity_error_count",
    "foreign_key_violations": "foreign_key_violation_count",
    "orphan_events": "orphan_event_count",
    "invalid_ids": "invalid_id_count",
    "invalid_values": "invalid_value_count",
    "invalid_states": "invalid_state_count",
    "invalid_codes": "invalid_code_count",
    "invalid_timestamps": "invalid_timestamp_count",
    "parent_order_violations": "parent_order_violation_count",
    "parent_cycles": "parent_cycle_count",
    "event_chain_mismatches": "event_chain_mismatch_count",
    "verdict_mismatches": "verdict_mismatch_count",
    "unexpected_schema_objects": "unexpected_schema_object_count",
}
#: What doctor counts without calling the ledger unhealthy: every record obeys the rules, but
#: the records contradict each other in a way the framework can cause (see
#: ``rules.contradicts_close``). The report key of each, under ``warnings``.
WARNING_KEYS = {"contradicted_closes": "contradicted_close_count"}
_TASK_ORDER = rules.TASK_ORDER
_DELIVERY_ORDER = rules.DELIVERY_ORDER
_HEX32 = re.compile(r"[0-9a-f]{32}")  # an owner token


#: The largest finite float as an SQL literal: a stored infinity compares above it.
FLOAT_MAX_SQL = "1.7976931348623157e308"


def times_ok_sql(fin: Callable[[str], str], false: str = "0") -> str:
    """The timestamp rules of one row as one SQL expression (``fin``: the finite-number test
    of a column; ``false``: the dialect's false literal)."""
    _fin = fin
    return f"""coalesce((
    {_fin("created_at")} AND {_fin("updated_at")} AND updated_at >= created_at
    AND (timeout_seconds IS NULL OR {_fin("timeout_seconds")})
    AND (started_at IS NULL OR ({_fin("started_at")} AND started_at >= created_at
         AND updated_at >= started_at))
    AND (ended_at IS NULL OR ({_fin("ended_at")}
         AND ended_at >= coalesce(started_at, created_at) AND updated_at >= ended_at))
    AND {_fin("delivery_updated_at")}
    AND CASE WHEN delivery_status = 'pending' THEN delivery_updated_at = created_at
        ELSE delivery_updated_at >= coalesce(ended_at, started_at, created_at) END
    AND (heartbeat_at IS NULL OR ({_fin("heartbeat_at")} AND started_at IS NOT NULL
         AND heartbeat_at >= started_at AND updated_at >= heartbeat_at
         AND (ended_at IS NULL OR heartbeat_at <= ended_at)))
    AND (deadline_at IS NULL OR ({_fin("deadline_at")} AND started_at IS NOT NULL
         AND timeout_seconds IS NOT NULL AND deadline_at = started_at + timeout_seconds))
    AND NOT (started_at IS NOT NULL AND timeout_seconds IS NOT NULL AND deadline_at IS NULL)
    ), {false})"""


_VALUES = "SELECT id, parent_id, name, owner, payload_hash, version, framework_id FROM tsg_tasks"


def outbox_values_sql(fin: Callable[[str], str]) -> str:
    """Count the task rows whose outbox columns (current layout) are malformed: a framework
    label outside the closed set or on an attempt (a child that owes no delivery; a child that
    owes its own, a LangGraph resume or recovery run, is a job), or a redelivery bound that is
    not a finite duration of a started task."""
    return f"""SELECT count(*) FROM tsg_tasks WHERE
    (framework IS NOT NULL AND (framework NOT IN {rules.sql_set(FRAMEWORK_LABELS)}
        OR (parent_id IS NOT NULL AND delivery_required = 0)))
    OR (redelivery_seconds IS NOT NULL AND NOT ({fin("redelivery_seconds")}
        AND redelivery_seconds <= 1e10 AND started_at IS NOT NULL))"""


@dataclass(frozen=True, slots=True)
class Dialect:
    """How a backend's SQL writes the few things dialects spell differently: ``fin`` (the
    finite-number test of a column), the boolean literals, null-safe equality, a boolean as an
    integer (``{}``) and any extra event-chain condition on ``version``."""

    fin: Callable[[str], str]
    false: str
    true: str
    is_same: str
    as_int: str
    chain_extra: str = ""
    shapes: str = field(init=False)
    event_chains: str = field(init=False)
    outbox_values: str = field(init=False)
    outbox: str = field(init=False)

    def __post_init__(self) -> None:
        # One row per distinct shape: states, codes, which optional fields are set, times valid.
        shapes = f"""SELECT status, terminal_code, delivery_status, delivery_code,
    delivery_required, started_at IS NULL, heartbeat_at IS NULL, ended_at IS NULL,
    deadline_at IS NULL, owner IS NULL, {times_ok_sql(self.fin, self.false)}, count(*)
    FROM tsg_tasks GROUP BY 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11"""
        # A task's events must be exactly those its row has made (``rules.expected_events``),
        # each with the task's own state, code and time; and its version counts at least
        # those changes (a 0.1.0 ledger may have counted more).
        chains = rules.event_chain_sql(is_same=self.is_same, as_int=self.as_int,
                                       false=self.false, true=self.true, extra=self.chain_extra)
        object.__setattr__(self, "shapes", shapes)
        object.__setattr__(self, "event_chains", chains)
        object.__setattr__(self, "outbox_values", outbox_values_sql(self.fin))
        object.__setattr__(self, "outbox", verdicts.consistency_sql(self.fin))


@dataclass(frozen=True, slots=True)
class Probes:
    """What a backend supplies to :func:`check`: its :class:`Dialect`; how it counts broken
    parent links (``parent_links(conn)``: the children whose parent is missing and those not
    created after their parent, see :data:`PARENT_ORDER_COUNT`); how it streams the rows of
    one query without parameters (``rows(conn, sql)``); and how it reads one task's parent id
    (``parent(conn, task_id)``: None for a root or an unknown id)."""

    dialect: Dialect
    parent_links: Callable[[Any], tuple[int, int]]
    rows: Callable[[Any, str], Iterable[tuple[Any, ...]]]
    parent: Callable[[Any, str], Any]


_CONTRADICTED_CLOSES = (
    f"SELECT count(*) FROM tsg_tasks AS j WHERE {rules.close_contradicted('j.')}"
)

#: A child must come after its parent: a later ``seq`` and a creation no earlier.
PARENT_ORDER_OK = "p.seq < c.seq AND p.created_at <= c.created_at"
_PARENT_ORDER = (
    f"SELECT c.id FROM tsg_tasks c JOIN tsg_tasks p ON p.id = c.parent_id "
    f"WHERE NOT ({PARENT_ORDER_OK})"
)
#: How many children break the parent order (a parent that is missing breaks no order).
PARENT_ORDER_COUNT = f"SELECT count(*) FROM ({_PARENT_ORDER}) AS misordered"


def _shape_ok(shape: tuple[Any, ...]) -> tuple[bool, bool]:
    """Judge one distinct shape: (states consistent, codes in the registry)."""
    (status, code, delivery, dcode, required, no_start, no_beat, no_close,
     no_deadline, no_owner) = shape
    codes_ok = codes_registered(status, code, delivery, dcode)
    if status not in TASK_STATES or delivery not in DELIVERY_STATES or required not in (0, 1):
        return False, codes_ok
    if status == "queued":
        ok = no_start and no_beat and no_close and no_deadline and no_owner and code is None
    elif status == "running":
        ok = not no_start and no_close and code is None
    else:
        ok = not no_close
    if status in ACTIVE_STATES and delivery != "pending":
        ok = False
    if delivery == "pending":
        ok = ok and dcode is None
    else:
        ok = ok and (delivery == "not_applicable") != (required == 1)
    return bool(ok), bool(codes_ok)


def _count(conn: Any, sql: str) -> int:
    return int(conn.execute(sql).fetchone()[0])


def _check_shapes(conn: Any, findings: dict[str, int],
                  shapes_sql: str) -> tuple[dict[str, int], dict[str, int]]:
    """Judge every shape; return the state counts (tasks, deliveries), which the shapes hold."""
    tasks = dict.fromkeys(_TASK_ORDER, 0)
    deliveries = dict.fromkeys(_DELIVERY_ORDER, 0)
    for *shape, times_ok, count in conn.execute(shapes_sql):
        states_ok, codes_ok = _shape_ok(tuple(shape))
        findings["invalid_states"] += 0 if states_ok else count
        findings["invalid_codes"] += 0 if codes_ok else count
        findings["invalid_timestamps"] += 0 if times_ok else count
        status, delivery = shape[0], shape[2]
        if status in tasks:
            tasks[status] += count
        if delivery in deliveries:
            deliveries[delivery] += count
    return tasks, deliveries


def _check_values(rows: Iterable[tuple[Any, ...]], findings: dict[str, int]) -> bool:
    uuid_ok, name_ok = CANONICAL_RE.fullmatch, NAME_RE.fullmatch
    known_names: set[str] = set()
    bad_ids = bad_values = 0
    for task_id, parent, name, owner, payload, version, framework in rows:
        if (
            not (type(task_id) is str and uuid_ok(task_id))
            or (parent is not None and not (type(parent) is str and uuid_ok(parent)))
            or (framework is not None and not (type(framework) is str and uuid_ok(framework)))
        ):
            bad_ids += 1
        if name is not None and name not in known_names:
            if type(name) is str and name_ok(name):
                if len(known_names) < 10_000:
                    known_names.add(name)
            else:
                bad_values += 1
                continue
        if (
            (owner is not None and not (type(owner) is str and _HEX32.fullmatch(owner)))
            or (payload is not None and not (type(payload) is str and HASH_RE.fullmatch(payload)))
            or type(version) is not int
            or version < 0
        ):
            bad_values += 1
    findings["invalid_ids"] = bad_ids
    findings["invalid_values"] = bad_values
    return True  # every row was read


def _cycles(conn: Any, parent: Callable[[Any, str], Any], misordered: int) -> int:
    """Count the distinct cycles reachable from the ``misordered`` children (read only when
    there are some).

    The API only links a child to an existing, older parent, so a cycle always contains an
    order violation: walking up from the violators alone finds every cycle.
    """
    if not misordered:
        return 0
    suspects = conn.execute(_PARENT_ORDER).fetchall()
    cycles: set[frozenset[str]] = set()
    for (start,) in suspects:
        path: list[str] = []
        seen: set[str] = set()
        node: Any = start
        while node is not None and node not in seen and len(path) < 100_000:
            seen.add(node)
            path.append(node)
            node = parent(conn, node)
        if node is not None and node in seen:
            cycles.add(frozenset(path[path.index(node) :]))
    return len(cycles)


#: Starts one query on another reader of the same snapshot and returns how to wait for its
#: row (which raises what the query raised).
Beside = Callable[[str], Callable[[], tuple[Any, ...]]]

#: A part of the check that may fail on a damaged ledger: it runs the read and returns its
#: result, or records the failure and returns None (or lets the error through).
Part = Callable[[Callable[[], Any]], Any]

#: Why a count in the report is ``None``, under ``checks_not_run``: the layout is not one this
#: release knows, so no rule could be checked; or the read a check needed failed.
NOT_RUN_SCHEMA = "schema_not_recognized"
NOT_RUN_UNREADABLE = "unreadable"
_COUNT_NAMES = ("task_count", "event_count", "task_status_counts", "delivery_status_counts")


def new_findings() -> dict[str, int | None]:
    """Every finding class not checked yet (``None``): a check that never runs stays so, and
    the report says it was not run instead of showing a zero that reads as healthy."""
    return dict.fromkeys(FINDINGS)


def unread_counts() -> dict[str, Any]:
    """The counts before anything was read (each ``None`` until a check reads it)."""
    return {**dict.fromkeys(_COUNT_NAMES),
            "warnings": dict.fromkeys(WARNING_KEYS.values())}


def empty_counts() -> dict[str, Any]:
    """The counts of a ledger that holds nothing."""
    return {"task_count": 0, "event_count": 0,
            "task_status_counts": dict.fromkeys(_TASK_ORDER, 0),
            "delivery_status_counts": dict.fromkeys(_DELIVERY_ORDER, 0),
            "warnings": dict.fromkeys(WARNING_KEYS.values(), 0)}


def check(conn: Any, probes: Probes, findings: dict[str, int | None], counts: dict[str, Any],
          part: Part, *, outbox: bool = True, beside: Beside | None = None) -> None:
    """Run every rule on the ledger read through ``conn`` (one read transaction): set the
    findings in ``findings`` and ``counts`` (the task and event counts, the state counts,
    the warnings) as far as each part could read; what a part could not read stays ``None``.
    ``outbox``: the layout has the verdict outbox (an older one has no verdicts to check).
    ``beside``: where the backend can, the longest check (the event chains, which join every
    event to its task) starts there first and runs while the others read."""
    dialect = probes.dialect

    def count_of(name: str, read: Callable[[], int]) -> None:
        findings[name] = part(read)

    chains = (beside(dialect.event_chains) if beside is not None
              else lambda: tuple(conn.execute(dialect.event_chains).fetchone()))

    counts["task_count"] = part(lambda: _count(conn, "SELECT count(*) FROM tsg_tasks"))
    counts["event_count"] = part(lambda: _count(conn, "SELECT count(*) FROM tsg_events"))
    links = part(lambda: probes.parent_links(conn))
    if links is not None:
        findings["foreign_key_violations"], findings["parent_order_violations"] = links
        count_of("parent_cycles", lambda: _cycles(conn, probes.parent, links[1]))
    shapes = dict.fromkeys(("invalid_states", "invalid_codes", "invalid_timestamps"), 0)
    states = part(lambda: _check_shapes(conn, shapes, dialect.shapes))
    if states is not None:  # the shapes hold the state counts too
        counts["task_status_counts"], counts["delivery_status_counts"] = states
        findings.update(shapes)
    values = {"invalid_ids": 0, "invalid_values": 0}
    if part(lambda: _check_values(probes.rows(conn, _VALUES), values)):
        findings.update(values)
    counts["warnings"] = {
        WARNING_KEYS["contradicted_closes"]: part(lambda: _count(conn, _CONTRADICTED_CLOSES)),
    }
    if outbox:
        outbox_values = part(lambda: _count(conn, dialect.outbox_values))
        known = findings["invalid_values"]
        findings["invalid_values"] = None if known is None or outbox_values is None else (
            known + outbox_values)
        count_of("verdict_mismatches", lambda: _count(conn, dialect.outbox))
    else:  # an older layout has no outbox: nothing there can disagree
        findings["verdict_mismatches"] = 0
    # the chains last: every other check has read while they ran beside
    chained = part(chains)  # (tasks whose chain is wrong, events that belong to a task)
    if chained is not None:
        findings["event_chain_mismatches"] = int(chained[0])
        events = counts["event_count"]
        # every event the chains did not join to a task is an orphan (the same snapshot)
        findings["orphan_events"] = None if events is None else events - int(chained[1])


def not_run(counts: dict[str, Any], findings: dict[str, int | None], *,
            schema_known: bool) -> dict[str, str]:
    """Each count of the report that is ``None`` because its check could not run, with why."""
    why = NOT_RUN_UNREADABLE if schema_known else NOT_RUN_SCHEMA
    missing = [name for name in _COUNT_NAMES if counts.get(name) is None]
    warnings = counts.get("warnings") or dict.fromkeys(WARNING_KEYS.values())
    missing += [key for key, value in warnings.items() if value is None]
    missing += [COUNT_KEYS[name] for name, value in findings.items() if value is None]
    return dict.fromkeys(missing, why)


def report(*, version: int | None, schema_ok: bool, read_ok: bool, counts: dict[str, Any],
           findings: dict[str, int | None], schema_known: bool | None = None) -> dict[str, Any]:
    """The report: healthy when the schema is right, every check ran and nothing was found
    (counts only; the ``warnings`` in ``counts`` do not count against it). A count whose check
    could not run is ``None`` and listed in ``checks_not_run`` with its reason
    (``schema_not_recognized`` or ``unreadable``), never a zero."""
    skipped = not_run(counts, findings,
                      schema_known=version is not None if schema_known is None else schema_known)
    result: dict[str, Any] = {
        "healthy": schema_ok and read_ok and not skipped and not any(findings.values()),
        "schema_version": version,
        "schema_ok": schema_ok,
        "quick_check": "ok" if read_ok else "failed",
        **counts,
        "checks_not_run": skipped,
    }
    for name, count in findings.items():
        result[COUNT_KEYS[name]] = count
    return result


__all__ = [
    "COUNT_KEYS", "FINDINGS", "FLOAT_MAX_SQL", "NOT_RUN_SCHEMA", "NOT_RUN_UNREADABLE",
    "WARNING_KEYS", "Beside", "Dialect", "Part", "Probes", "check", "empty_counts", "new_findings",
    "not_run", "outbox_values_sql", "report", "times_ok_sql", "unread_counts",
]
