"""Text renderings of the CLI's read commands, for people (``--format text``).

Tables have a header row and columns aligned with two spaces between them; durations are
humanised (``15m``, ``2h 5m``) and times shown in UTC. The aggregate reports (reconcile,
prune, doctor) are counts only and never contain ids. Every value shown comes from the ledger's
own vocabulary, validated ids and name labels, so nothing needs escaping.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from ..durations import humanize, utc
from ..model import Task
from ..ops.events import TaskEvent
from ..ops.task_list import TaskListing


def table(headers: Sequence[str], rows: Sequence[Sequence[str]],
          right: frozenset[int] = frozenset()) -> list[str]:
    """Aligned lines: the header row, then one per row; columns in ``right`` right-aligned."""
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]

    def line(cells: Sequence[str]) -> str:
        parts = [
            cell.rjust(width) if i in right else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(cells, widths, strict=True))
        ]
        return "  ".join(parts).rstrip()

    return [line(headers), *(line(row) for row in rows)]


def _counts(pairs: Sequence[tuple[str, Any]], indent: str = "  ") -> list[str]:
    if not pairs:
        return []
    width = max(len(label) for label, _ in pairs)
    digits = max(len(str(value)) for _, value in pairs)
    return [f"{indent}{label:<{width}}  {value!s:>{digits}}" for label, value in pairs]


def _since(at: float | None, now: float) -> str:
    if at is None:
        return "-"
    delta = now - at
    when = f"{humanize(delta)} ago" if delta >= 0 else f"in {humanize(-delta)}"
    return f"{utc(at)} ({when})"


def _dash(value: str | None) -> str:
    return "-" if value is None else value


# ----------------------------------------------------------------------------- tasks


def listing(result: TaskListing, *, attempts: bool) -> str:
    """The ``tsg tasks --format text`` table."""
    headers = ["ID", "KIND", "PARENT" if attempts else "FRAMEWORK_ID", "NAME", "STATE", "CODE",
               "DELIVERY", "AGE", "IDLE"]
    if not attempts:
        headers.append("ATTEMPTS")
    rows = []
    for item in result.tasks:
        task = item.task
        row = [task.id, item.kind, _dash(task.parent_id if attempts else task.framework_id),
               _dash(task.name), task.status.value, _dash(task.terminal_code),
               task.delivery_status.value, humanize(item.age_seconds),
               humanize(item.idle_seconds)]
        if not attempts:
            row.append(str(item.attempts))
        rows.append(row)
    right = frozenset({7, 8, 9})
    lines = table(headers, rows, right)
    if not rows:
        lines.append("(no tasks match)")
    if result.more:
        lines.append(f"(only the oldest {len(rows)} shown: more tasks match; raise --limit)")
    return "\n".join(lines) + "\n"


def children(tasks: Sequence[Task], now: float) -> str:
    """The ``tsg children ID --format text`` table, oldest first."""
    headers = ["ID", "NAME", "STATE", "CODE", "DELIVERY", "AGE", "ENDED"]
    rows = [
        [t.id, _dash(t.name), t.status.value, _dash(t.terminal_code), t.delivery_status.value,
         humanize(now - t.created_at),
         "-" if t.ended_at is None else humanize(now - t.ended_at) + " ago"]
        for t in tasks
    ]
    lines = table(headers, rows, frozenset({5, 6}))
    if not rows:
        lines.append("(no children)")
    return "\n".join(lines) + "\n"


def task_detail(task: Task, now: float, events: Sequence[TaskEvent] | None) -> str:
    """The ``tsg get ID --format text`` view: one field per line, then the events."""
    delivery = task.delivery_status.value + (
        "" if task.delivery_required else " (internal: no delivery owed)")
    fields = [
        ("id", task.id),
        ("parent", _dash(task.parent_id)),
        ("framework id", _dash(task.framework_id)),
        ("name", _dash(task.name)),
        ("state", task.status.value),
        ("code", _dash(task.terminal_code)),
        ("delivery", delivery),
        ("delivery code", _dash(task.delivery_code)),
        ("created", _since(task.created_at, now)),
        ("started", _since(task.started_at, now)),
        ("last heartbeat", _since(task.heartbeat_at, now)),
        ("ended", _since(task.ended_at, now)),
        ("deadline", _since(task.deadline_at, now)),
        ("timeout", humanize(task.timeout_seconds)),
        ("owner recorded", "yes" if task.has_owner else "no"),
        ("payload fingerprint", "yes" if task.has_payload_hash else "no"),
        ("version", str(task.version)),
    ]
    width = max(len(label) for label, _ in fields)
    lines = [f"{label:<{width}}  {value}" for label, value in fields]
    if events is not None:
        lines.append("")
        lines.append("EVENTS")
        rows = [
            [e.kind, e.state, _dash(e.code), utc(e.at), "+" + humanize(e.at - task.created_at)]
            for e in events
        ]
        lines += ["  " + line for line in
                  table(["KIND", "STATE", "CODE", "AT", "SINCE CREATED"], rows,
                        frozenset({4}))]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- aggregates


def reconcile(report: dict[str, Any]) -> str:
    """A reconcile report (counts only)."""
    head = "RECONCILE (dry run: nothing changed)" if report["dry_run"] else "RECONCILE (applied)"
    verb = "would be " if report["dry_run"] else ""
    lines = [head]
    lines += _counts([
        ("active tasks examined", report["active_examined"]),
        (f"{verb}timed out", report["tasks_timed_out"]),
        ("kept (fresh)", report["fresh_active_retained"]),
        ("pending deliveries examined", report["pending_delivery_examined"]),
        (f"deliveries {verb}failed", report["deliveries_failed"]),
        (f"deliveries {verb}not applicable", report["deliveries_not_applicable"]),
        ("deliveries kept (within grace)", report["pending_delivery_retained"]),
    ])
    return "\n".join(lines) + "\n"


def prune(report: dict[str, Any]) -> str:
    """A prune report (counts only)."""
    head = "PRUNE (dry run: nothing deleted)" if report["dry_run"] else "PRUNE (applied)"
    verb = "would be deleted" if report["dry_run"] else "deleted"
    lines = [head]
    lines += _counts([
        (f"trees {verb}", report["trees_deleted"]),
        (f"tasks {verb}", report["tasks_deleted"]),
        (f"events {verb}", report["events_deleted"]),
        ("trees kept (a task still open or recent)", report["trees_retained"]),
    ])
    return "\n".join(lines) + "\n"


_FINDINGS = (
    ("integrity_error_count", "integrity errors"),
    ("foreign_key_violation_count", "foreign key violations"),
    ("orphan_event_count", "orphan events"),
    ("invalid_id_count", "invalid ids"),
    ("invalid_value_count", "invalid values"),
    ("invalid_state_count", "invalid states"),
    ("invalid_code_count", "invalid codes"),
    ("invalid_timestamp_count", "invalid timestamps"),
    ("parent_order_violation_count", "parent order violations"),
    ("parent_cycle_count", "parent cycles"),
    ("event_chain_mismatch_count", "event chain mismatches"),
    ("verdict_mismatch_count", "verdict outbox mismatches"),
    ("unexpected_schema_object_count", "unexpected schema objects"),
)


_WARNINGS = (
    ("contradicted_close_count", "jobs whose attempts contradict their close"),
)


def doctor(report: dict[str, Any]) -> str:
    """A doctor report (counts only); a count whose check could not run reads ``not run
    (<reason>)``, never a zero."""
    lines = ["DOCTOR: " + ("healthy" if report["healthy"] else "UNHEALTHY")]
    schema = f"{report['schema_version']} ({'ok' if report['schema_ok'] else 'NOT OK'})"
    skipped: dict[str, str] = report.get("checks_not_run") or {}

    def shown(key: str, value: Any) -> Any:
        if value is not None:
            return value
        return f"not run ({skipped.get(key, 'unreadable')})"

    lines += _counts([
        ("schema version", schema),
        ("quick check", report["quick_check"]),
        ("tasks", shown("task_count", report["task_count"])),
        ("events", shown("event_count", report["event_count"])),
    ])
    for title, key in (("TASKS", "task_status_counts"), ("DELIVERIES", "delivery_status_counts")):
        lines.append(title)
        counts = report[key]
        lines += _counts(list(counts.items())) if counts is not None else [
            f"  {shown(key, None)}"]
    lines.append("FINDINGS")
    lines += _counts([(label, shown(key, report[key])) for key, label in _FINDINGS
                      if key in report])
    warnings = report.get("warnings") or {}
    lines.append("WARNINGS (not counted against health)")
    lines += _counts([(label, shown(key, warnings.get(key))) for key, label in _WARNINGS])
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- progress


def _drop_buffered(stream: TextIO) -> None:
    """Point ``stream``'s descriptor at the null device: the text still buffered in it is
    written there at exit instead of failing again (which would change the exit code)."""
    with contextlib.suppress(Exception):
        descriptor = stream.fileno()
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(null, descriptor)
        finally:
            os.close(null)


def progress_printer(
    command: str, what: str, stream: TextIO | None, interval: float = 1.0,
    clock: Callable[[], float] = time.monotonic,
) -> Callable[[int, int], None]:
    """A progress callback that writes ``tsg <command>: done/total <what> (pct%)`` lines to
    ``stream``: the first call, then at most one line per ``interval`` seconds, and the last
    (``done == total``). A stream that cannot be written to (closed, full, a broken pipe, or
    ``None``: the process started with it closed) is dropped for the rest of the pass, silently,
    and what it still buffers is discarded so that the exit does not fail on it."""
    last: list[float] = []
    broken: list[bool] = []

    def report(done: int, total: int) -> None:
        now = clock()
        if last and done < total and now - last[0] < interval:
            return
        last[:] = [now]
        pct = 100 if total == 0 else done * 100 // total
        if broken or stream is None:
            return
        try:
            stream.write(f"tsg {command}: {done}/{total} {what} ({pct}%)\n")
            stream.flush()
        except (OSError, ValueError, AttributeError):
            broken.append(True)  # closed, full or a broken pipe: progress is dropped
            _drop_buffered(stream)

    return report
