"""Read-side aggregates: status counts, a text table and Prometheus exposition. No ids."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

from . import owners
from .model import DELIVERY_STATES, TASK_STATES, check_seconds, is_valid_name

if TYPE_CHECKING:
    from .database import Database

DEFAULT_ACTIVE_GRACE = 600.0
INVALID_LABEL = "<invalid>"  # a tampered name is counted under this label, never shown
_TASK_ORDER = ("queued", "running", "succeeded", "failed", "timed_out", "cancelled")
_DELIVERY_ORDER = ("pending", "delivered", "failed", "not_applicable")


def collect_status(db: Database, *, active_grace_seconds: float | None = None) -> dict[str, Any]:
    """Counts by state, delivery state and name; oldest active ages; at-risk running tasks."""
    grace = DEFAULT_ACTIVE_GRACE if active_grace_seconds is None else check_seconds(
        active_grace_seconds, "active_grace_seconds", allow_zero=True)
    by_status = dict.fromkeys(_TASK_ORDER, 0)
    by_delivery = dict.fromkeys(_DELIVERY_ORDER, 0)
    by_name: dict[str, dict[str, int]] = {}
    with db.read() as conn:
        now = db.now()
        for (status, delivery, name), count in _group_counts(conn).items():
            if status in TASK_STATES:
                by_status[status] += count
            if delivery in DELIVERY_STATES:
                by_delivery[delivery] += count
            if name is not None and status in TASK_STATES:
                label = name if isinstance(name, str) and is_valid_name(name) else INVALID_LABEL
                per = by_name.setdefault(label, dict.fromkeys(_TASK_ORDER, 0))
                per[status] += count
        oldest: dict[str, Any] = {}
        for state, column in (("queued", "created_at"), ("running", "started_at")):
            value = conn.execute(
                f"SELECT min({column}) FROM tsg_tasks "
                f"WHERE delivery_status = 'pending' AND status = '{state}'"
            ).fetchone()[0]
            oldest[state] = None if value is None else round(max(0.0, now - value), 3)
        past_deadline = conn.execute(
            "SELECT count(*) FROM tsg_tasks WHERE delivery_status = 'pending' "
            "AND status = 'running' AND deadline_at <= ?", (now,)
        ).fetchone()[0]
        stale = conn.execute(
            "SELECT count(*) FROM tsg_tasks WHERE delivery_status = 'pending' "
            "AND status = 'running' AND coalesce(heartbeat_at, started_at) <= ?", (now - grace,)
        ).fetchone()[0]
        owner_dead = 0
        for token, count in conn.execute(
            "SELECT owner, count(*) FROM tsg_tasks WHERE delivery_status = 'pending' "
            "AND status = 'running' AND owner IS NOT NULL GROUP BY owner"
        ):
            if db.probe_owner(token) is owners.Liveness.DEAD:
                owner_dead += count
    return {
        "tasks": by_status,
        "deliveries": by_delivery,
        "by_name": dict(sorted(by_name.items())),
        "oldest_queued_age_seconds": oldest["queued"],
        "oldest_running_age_seconds": oldest["running"],
        "running_past_deadline": past_deadline,
        "running_heartbeat_stale": stale,
        "running_owner_dead": owner_dead,
        "active_grace_seconds": grace,
    }


_MAX_GROUPS = 50_000  # beyond this many distinct (state, delivery, name) groups, names fold


def _group_counts(conn: Any) -> Counter[tuple[Any, Any, Any]]:
    """Count tasks per (state, delivery state, name) in one streaming scan.

    A hash count in Python beats SQLite's GROUP BY here: that one sorts every row (spilling to
    disk on large ledgers), while the number of distinct groups stays small. Should tampering
    create unboundedly many names, the extra ones are counted under the invalid label.
    """
    counts: Counter[tuple[Any, Any, Any]] = Counter()
    cursor = conn.execute("SELECT status, delivery_status, name FROM tsg_tasks")
    while True:
        rows = cursor.fetchmany(4096)
        if not rows:
            return counts
        if len(counts) < _MAX_GROUPS:
            counts.update(rows)
        else:
            for status, delivery, name in rows:
                key = (status, delivery, name)
                if key in counts:
                    counts[key] += 1
                else:
                    counts[(status, delivery, None if name is None else INVALID_LABEL)] += 1


def format_text(report: dict[str, Any]) -> str:
    """Render a status report as a readable table."""
    lines = ["TASKS"]
    lines += [f"  {state:<16}{count:>10}" for state, count in report["tasks"].items()]
    lines.append("DELIVERIES")
    lines += [f"  {state:<16}{count:>10}" for state, count in report["deliveries"].items()]
    if report["by_name"]:
        header = "".join(f"{s[:9]:>10}" for s in _TASK_ORDER)
        lines.append(f"BY NAME{'':<33}{header}")
        for name, counts in report["by_name"].items():
            shown = name if len(name) <= 38 else name[:35] + "..."
            lines.append(f"  {shown:<38}" + "".join(f"{counts[s]:>10}" for s in _TASK_ORDER))
    lines.append("RUNNING AT RISK")
    lines.append(f"  {'past deadline':<28}{report['running_past_deadline']:>10}")
    lines.append(
        f"  {'heartbeat stale (>= ' + str(int(report['active_grace_seconds'])) + ' s)':<28}"
        f"{report['running_heartbeat_stale']:>10}"
    )
    lines.append(f"  {'owner process dead':<28}{report['running_owner_dead']:>10}")
    lines.append("OLDEST ACTIVE")
    for key, label in (
        ("oldest_queued_age_seconds", "queued"),
        ("oldest_running_age_seconds", "running"),
    ):
        value = report[key]
        lines.append(f"  {label:<28}{'-' if value is None else f'{value:.1f} s':>10}")
    return "\n".join(lines)


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def format_prometheus(report: dict[str, Any]) -> str:
    """Render a status report in the Prometheus text exposition format (gauges only)."""
    out: list[str] = []

    def gauge(name: str, help_text: str, samples: list[tuple[str, Any]]) -> None:
        out.append(f"# HELP {name} {help_text}")
        out.append(f"# TYPE {name} gauge")
        for labels, value in samples:
            out.append(f"{name}{labels} {value}")

    gauge("tsg_tasks", "Tasks in the ledger by task state.",
          [(f'{{status="{s}"}}', c) for s, c in report["tasks"].items()])
    gauge("tsg_deliveries", "Tasks in the ledger by delivery state.",
          [(f'{{delivery_status="{s}"}}', c) for s, c in report["deliveries"].items()])
    gauge("tsg_tasks_by_name", "Tasks by name label and task state.",
          [(f'{{name="{_label(n)}",status="{s}"}}', c)
           for n, counts in report["by_name"].items() for s, c in counts.items()])
    for key, name, text in (
        ("oldest_queued_age_seconds", "tsg_oldest_queued_age_seconds",
         "Age of the oldest queued task (0 when none)."),
        ("oldest_running_age_seconds", "tsg_oldest_running_age_seconds",
         "Time since the oldest running task started (0 when none)."),
    ):
        gauge(name, text, [("", report[key] or 0)])
    gauge("tsg_running_past_deadline", "Running tasks past their deadline.",
          [("", report["running_past_deadline"])])
    gauge("tsg_running_heartbeat_stale", "Running tasks without a heartbeat for the active grace.",
          [("", report["running_heartbeat_stale"])])
    gauge("tsg_running_owner_dead", "Running tasks whose owning process is provably dead.",
          [("", report["running_owner_dead"])])
    return "\n".join(out) + "\n"
