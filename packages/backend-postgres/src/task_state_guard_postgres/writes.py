"""What a state change owes, written by the statement that makes it (layout 9).

A statement that changes task states (a transition, *begin* or *end attempt*, a reconcile
pass's closes) names the rows it changed in a sub-statement (``WITH w AS (UPDATE ...
RETURNING ...)``) and adds these sub-statements beside it: the rows' events, their outcome
totals and the verdict a lost close owes its framework, each rendered from the core's rules
(``rules.EVENT_RULES``, ``rules.TOTAL_RULES``, ``rules.close_owes_verdict``). Every source
row passes its rule's ``present`` condition before it counts, so a source may hold rows that
made other transitions (the delivery of a close that left it pending writes nothing). The
statement's own guard keeps every source row to one that made the transition in this
statement (the row was active, or its delivery pending, before), which is what the row
trigger compares ``OLD`` with ``NEW`` for. The trigger stays, and steps aside for this release's
sessions (they set ``driver.PASS_EVENTS`` on connect), so that it writes these rows only for a
process of an earlier release still running during a rolling upgrade.
"""

from __future__ import annotations

from collections.abc import Iterable

from task_state_guard import rules

#: The columns a source row needs for any rule here (its events, totals and verdict).
OWED_COLUMNS = (
    "seq", "created_at", "started_at", "status", "terminal_code", "ended_at",
    "delivery_status", "delivery_code", "delivery_updated_at", "parent_id",
    "delivery_required", "framework",
)


def returning(row: str = "") -> str:
    """:data:`OWED_COLUMNS` as a ``RETURNING`` list (``row``: the table's alias and dot)."""
    return ", ".join(f"{row}{column}" for column in OWED_COLUMNS)


def _where(rule: rules.EventRule) -> str:
    if not rule.present.column:  # the created event: every inserted row
        return ""
    return f" WHERE {rule.present.sql(true='true')}"


def events(parts: Iterable[tuple[str, str]]) -> str:
    """One insert of the events of ``(kind, source)`` pairs: ``kind``'s event of each row of
    ``source`` that made the transition."""
    selects = [rules.event_select(rules.EVENTS_BY_KIND[kind], source)
               + _where(rules.EVENTS_BY_KIND[kind]) for kind, source in parts]
    return f"INSERT INTO tsg_events({rules.EVENT_COLUMNS}) " + " UNION ALL ".join(selects)


def totals(parts: Iterable[tuple[str, str]], *, grouped: bool = False) -> str:
    """One insert of the outcome totals of ``(event, source)`` pairs: an increment of one per
    row of ``source`` that made the transition (readers sum them; passes fold them), or with
    ``grouped`` one row per (event, kind, state, code) counting them (a pass's batch of
    thousands of rows adds a few rows, not one each)."""
    selects = [rules.TOTAL_RULES[event].select(source) if grouped
               else rules.TOTAL_RULES[event].increments(source) for event, source in parts]
    return rules.TOTALS_INSERT + " UNION ALL ".join(selects)


def verdicts(source: str) -> str:
    """The verdicts the rows of ``source`` (rows just closed) owe their framework."""
    return ("INSERT INTO tsg_verdicts(task_seq, framework, state, recorded_at) "
            f"SELECT seq, framework, 'pending', ended_at FROM {source} "
            f"WHERE {rules.close_owes_verdict()} ON CONFLICT (task_seq) DO NOTHING")


def owed(source: str, kinds: Iterable[str], prefix: str = "w", *,
         grouped: bool = False) -> list[str]:
    """The sub-statements (``name AS (...)``, named from ``prefix``) that write what the
    rows of ``source`` owe for the transitions ``kinds`` (event kinds): their events, and for
    a close or a delivery their totals (``grouped``: see :func:`totals`), and for a close its
    verdict."""
    kinds = tuple(kinds)
    parts = [f"{prefix}e AS ({events((kind, source) for kind in kinds)})"]
    counted = [(kind, source) for kind in kinds if kind in rules.TOTAL_RULES]
    if counted:
        parts.append(f"{prefix}t AS ({totals(counted, grouped=grouped)})")
    if "closed" in kinds:
        parts.append(f"{prefix}v AS ({verdicts(source)})")
    return parts


__all__ = ["OWED_COLUMNS", "events", "owed", "returning", "totals", "verdicts"]
