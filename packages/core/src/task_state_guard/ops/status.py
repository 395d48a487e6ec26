"""Read-side aggregates: status counts, a text table and Prometheus exposition. No ids."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import rules
from ..model import (
    DELIVERY_CODES,
    DELIVERY_STATES,
    TASK_CODES,
    TASK_KINDS,
    TASK_STATES,
    TERMINAL_STATES,
    Liveness,
    check_seconds,
    is_valid_name,
    task_kind,
)
from ..store import queries
from ..store.queries import CloseWindow, StatusGroups
from . import history, verdicts
from .history import OutcomeHistory

if TYPE_CHECKING:
    from ..store.protocol import Database

DEFAULT_ACTIVE_GRACE = 600.0
INVALID_LABEL = queries.INVALID_LABEL  # a tampered name counts under this label, never shown
_TASK_ORDER = rules.TASK_ORDER
_DELIVERY_ORDER = rules.DELIVERY_ORDER


KINDS = TASK_KINDS  # a job (a root, or a child owing its own delivery) or an attempt
OBLIGATIONS = ("owed", "internal")  # delivery_required, or a record nobody is owed


def collect_status(db: Database, *, active_grace_seconds: float | None = None) -> dict[str, Any]:
    """Counts by state, delivery state and name; logical tasks and attempts apart; owed and
    internal deliveries apart; monotonic outcome totals; oldest active ages; at-risk running
    tasks; lost-job verdicts by state and framework (pending: not yet published by an adapter
    of that framework) and the age of the oldest pending one."""
    return _collect(db, _grace(active_grace_seconds), None)[0]


def collect_overview(db: Database, *, active_grace_seconds: float | None = None,
                     window_seconds: float, buckets: int) -> tuple[dict[str, Any], OutcomeHistory]:
    """:func:`collect_status` and the outcome history of the last ``window_seconds``
    (:func:`~task_state_guard.ops.history.outcome_history`), read together: one read, one
    clock, and on SQLite one pass over the tasks for both."""
    grace = _grace(active_grace_seconds)
    window, width = history.checked_window(window_seconds, buckets)
    report, found, now = _collect(db, grace, (window, width))
    return report, history.history_of(now - window, width, buckets, found.closes)


def _grace(active_grace_seconds: float | None) -> float:
    return DEFAULT_ACTIVE_GRACE if active_grace_seconds is None else check_seconds(
        active_grace_seconds, "active_grace_seconds", allow_zero=True)


def _collect(db: Database, grace: float,
             window: tuple[float, float] | None) -> tuple[dict[str, Any], StatusGroups, float]:
    """The status report, the groups read for it and the clock it was read at (``window``:
    the history's ``(window, bucket width)``, read beside)."""
    by_status = dict.fromkeys(_TASK_ORDER, 0)
    by_delivery = dict.fromkeys(_DELIVERY_ORDER, 0)
    by_kind = {kind: dict.fromkeys(_TASK_ORDER, 0) for kind in KINDS}
    by_obligation = {kind: dict.fromkeys(_DELIVERY_ORDER, 0) for kind in OBLIGATIONS}
    names: dict[str, dict[str, dict[str, int]]] = {kind: {} for kind in KINDS}
    awaiting = dict.fromkeys(OBLIGATIONS, 0)  # terminal, delivery still pending
    with db.read() as conn:
        now = db.now()
        closes = None if window is None else CloseWindow(now - window[0], window[1], now)
        found = db.queries.status_groups(conn, now, now - grace, _MAX_GROUPS, closes)
        oldest = {what: _age(now, value) for what, value in found.least.items()}
        past_deadline, stale = found.past_deadline, found.stale
        for (status, delivery, name, root, owed), count in found.counts.items():
            kind = task_kind(root, owed)
            if status in TASK_STATES:
                by_status[status] += count
                by_kind[kind][status] += count
            if delivery in DELIVERY_STATES:
                by_delivery[delivery] += count
                by_obligation["owed" if owed else "internal"][delivery] += count
                if delivery == "pending" and status in TERMINAL_STATES:
                    awaiting["owed" if owed else "internal"] += count
            if name is not None and status in TASK_STATES:
                label = name if isinstance(name, str) and is_valid_name(name) else INVALID_LABEL
                per = names[kind].setdefault(label, dict.fromkeys(_TASK_ORDER, 0))
                per[status] += count
        totals = read_totals(db, conn)
        owed, oldest_owed = verdicts.counts(db, conn, now)
        owner_dead = 0
        for token, count in db.queries.open_running_owners(conn):
            if db.owners.probe(token) is Liveness.DEAD:
                owner_dead += count
    return {
        "tasks": by_status,
        "deliveries": by_delivery,
        "by_name": dict(sorted(names["task"].items())),
        "attempts_by_name": dict(sorted(names["attempt"].items())),
        "tasks_by_kind": by_kind,
        "deliveries_by_kind": by_obligation,
        "outcomes_total": totals["closed"],
        "delivery_outcomes_total": totals["delivery"],
        "deliveries_awaiting": awaiting,
        "oldest_queued_age_seconds": oldest["queued"],
        "oldest_running_age_seconds": oldest["running"],
        "oldest_owed_delivery_age_seconds": oldest["owed"],
        "running_past_deadline": past_deadline,
        "running_heartbeat_stale": stale,
        "running_owner_dead": owner_dead,
        "active_grace_seconds": grace,
        "verdicts": owed,
        "oldest_pending_verdict_age_seconds": oldest_owed,
    }, found, now


def _age(now: float, value: Any) -> float | None:
    return None if value is None else round(max(0.0, now - value), 3)


def read_totals(db: Database, conn: Any) -> dict[str, dict[str, dict[str, dict[str, int]]]]:
    """The monotonic outcome totals: ``closed`` by kind, state and code; ``delivery`` by
    obligation, state and code. Every known (kind, state, code) is present, zeros included; a
    code the transition did not give is ``""``; a tampered row counts under the invalid label.
    """
    totals: dict[str, dict[str, dict[str, dict[str, int]]]] = {
        "closed": {kind: {state: dict.fromkeys(sorted(TASK_CODES[state]), 0)
                          for state in _TASK_ORDER if state in TASK_CODES} for kind in KINDS},
        "delivery": {kind: {state: dict.fromkeys(sorted(DELIVERY_CODES[state]), 0)
                            for state in _DELIVERY_ORDER if state in _OBLIGED[kind]}
                     for kind in OBLIGATIONS},
    }
    for event, kind, state, code, total in db.queries.totals(conn):
        per_kind = totals.get(event, {}).get(kind)
        if per_kind is None or state not in per_kind or not isinstance(total, int):
            continue  # only a tampered file has such a row; doctor reports the file
        registry = TASK_CODES if event == "closed" else DELIVERY_CODES
        label = code if code == "" or code in registry[state] else INVALID_LABEL
        per_kind[state][label] = per_kind[state].get(label, 0) + max(total, 0)
    return totals


#: The delivery states each obligation can close to.
_OBLIGED = {"owed": frozenset({"delivered", "failed"}), "internal": frozenset({"not_applicable"})}


_MAX_GROUPS = queries.MAX_GROUPS  # beyond this many distinct groups, names fold


def _name_table(title: str, rows: dict[str, dict[str, int]]) -> list[str]:
    header = "".join(f"{s[:9]:>10}" for s in _TASK_ORDER)
    lines = [f"{title:<40}{header}"]
    for name, counts in rows.items():
        shown = name if len(name) <= 38 else name[:35] + "..."
        lines.append(f"  {shown:<38}" + "".join(f"{counts[s]:>10}" for s in _TASK_ORDER))
    return lines


def format_text(report: dict[str, Any]) -> str:
    """Render a status report as a readable table."""
    kinds, owed = report["tasks_by_kind"], report["deliveries_by_kind"]
    lines = [f"{'TASKS':<18}{'all':>10}{'logical':>10}{'attempts':>10}"]
    lines += [f"  {state:<16}{count:>10}{kinds['task'][state]:>10}{kinds['attempt'][state]:>10}"
              for state, count in report["tasks"].items()]
    lines.append(f"{'DELIVERIES':<18}{'all':>10}{'owed':>10}{'internal':>10}")
    lines += [f"  {state:<16}{count:>10}{owed['owed'][state]:>10}{owed['internal'][state]:>10}"
              for state, count in report["deliveries"].items()]
    if report["by_name"]:
        lines += _name_table("BY NAME (logical tasks)", report["by_name"])
    if report["attempts_by_name"]:
        lines += _name_table("ATTEMPTS BY NAME", report["attempts_by_name"])
    lines.append("OUTCOMES SINCE CREATION (kept across prune)")
    for key in ("outcomes_total", "delivery_outcomes_total"):
        for kind, states in report[key].items():
            for state, codes in states.items():
                for code, total in codes.items():
                    if total:
                        what = f"{kind} {state}/{code or '-'}"
                        lines.append(f"  {what:<48}{total:>10}")
    lines.append("RUNNING AT RISK")
    lines.append(f"  {'past deadline':<28}{report['running_past_deadline']:>10}")
    lines.append(
        f"  {'heartbeat stale (>= ' + str(int(report['active_grace_seconds'])) + ' s)':<28}"
        f"{report['running_heartbeat_stale']:>10}"
    )
    lines.append(f"  {'owner process dead':<28}{report['running_owner_dead']:>10}")
    lines.append("AWAITING DELIVERY (task closed, delivery pending)")
    for kind, count in report["deliveries_awaiting"].items():
        lines.append(f"  {kind:<28}{count:>10}")
    lines.append(f"{'VERDICTS (lost jobs)':<28}{'pending':>10}{'published':>10}")
    for framework, pending in report["verdicts"]["pending"].items():
        published = report["verdicts"]["published"][framework]
        lines.append(f"  {framework:<26}{pending:>10}{published:>10}")
    lines.append("OLDEST ACTIVE")
    for key, label in (
        ("oldest_queued_age_seconds", "queued"),
        ("oldest_running_age_seconds", "running"),
        ("oldest_owed_delivery_age_seconds", "owed delivery (closed)"),
        ("oldest_pending_verdict_age_seconds", "pending verdict"),
    ):
        value = report[key]
        lines.append(f"  {label:<28}{'-' if value is None else f'{value:.1f} s':>10}")
    return "\n".join(lines)
