"""Helpers for the black-box core tests (public API and the real CLI only)."""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import stat
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

import pytest
from task_state_guard import Ledger, reasons

T0 = 1_000_000.0  # a synthetic, exactly representable start time

REPORT_KEYS = frozenset(
    {
        "active_examined",
        "applied",
        "deliveries_failed",
        "deliveries_not_applicable",
        "dry_run",
        "fresh_active_retained",
        "pending_delivery_examined",
        "pending_delivery_retained",
        "tasks_timed_out",
    }
)


#: The keys of Task.to_dict() (0.1.0's set; payload_hash only on request).
TASK_KEYS = frozenset(
    {
        "id", "parent_id", "status", "delivery_status", "delivery_required", "has_payload_hash",
        "timeout_seconds", "created_at", "started_at", "updated_at", "ended_at", "deadline_at",
        "delivery_updated_at", "terminal_code", "delivery_code", "version",
    }
)

_ANY_TASK = "6f1c1d4e-4a5b-4c6d-8e9f-0a1b2c3d4e5f"
#: CLI commands (with their arguments) that act on an existing ledger and must never create a
#: missing one (a mistyped ``--db``): only init, create and reconcile do.
NEVER_CREATE = [
    ["start", _ANY_TASK],
    ["heartbeat", _ANY_TASK],
    ["close", _ANY_TASK, "--status", "succeeded"],
    ["delivery", _ANY_TASK, "--status", "delivered"],
    ["prune", "--older-than", "1d"],
]


class Clock:
    """An injected, manually advanced clock."""

    def __init__(self, t: float = T0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def set(self, t: float) -> None:
        self.t = t

    def advance(self, dt: float) -> None:
        self.t += dt


def skip_unless_ci(reason: str) -> None:
    """Skip on a developer machine that lacks a tool; under ``CI=true`` it is a failure."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"required in CI: {reason}")
    pytest.skip(reason)


def is_sqlite(db: str) -> bool:
    """Whether a test's ledger is a SQLite file (else a PostgreSQL URL)."""
    return not db.startswith(("postgresql://", "postgres://"))


def without_counts_flags(report: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in report.items() if k not in ("dry_run", "applied")}


def check_report(report: dict[str, Any], *, dry_run: bool) -> None:
    """The nine keys, the two invariants and the flags."""
    assert set(report) == REPORT_KEYS
    assert report["dry_run"] is dry_run
    assert report["applied"] is (not dry_run)
    for key in REPORT_KEYS - {"dry_run", "applied"}:
        assert isinstance(report[key], int) and not isinstance(report[key], bool)
        assert report[key] >= 0
    assert report["active_examined"] == report["tasks_timed_out"] + report["fresh_active_retained"]
    assert report["pending_delivery_examined"] == (
        report["deliveries_failed"]
        + report["deliveries_not_applicable"]
        + report["pending_delivery_retained"]
    )


def event_count(led: Ledger) -> int:
    return int(led.doctor()["event_count"])


# ----------------------------------------------------------------------------- CLI


@dataclass
class CliResult:
    code: int
    stdout: str
    stderr: str

    @property
    def json(self) -> Any:
        return json.loads(self.stdout)


def cli_env(extra: dict[str, str] | None = None, drop: tuple[str, ...] = ()) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("TSG_") and k not in drop
    }
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    if extra:
        env.update(extra)
    return env


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> CliResult:
    proc = subprocess.run(
        [sys.executable, "-m", "task_state_guard", *args],
        capture_output=True,
        text=True,
        env=env if env is not None else cli_env(),
        timeout=timeout,
        check=False,
    )
    return CliResult(proc.returncode, proc.stdout, proc.stderr)


def assert_json_line(result: CliResult) -> Any:
    """Exactly one compact, key-sorted JSON line on stdout and nothing on stderr."""
    assert result.stderr == ""
    assert result.stdout.endswith("\n")
    assert result.stdout.count("\n") == 1
    payload = json.loads(result.stdout)
    assert result.stdout == json.dumps(payload, sort_keys=True, separators=(",", ":")) + "\n"
    return payload


def assert_cli_error(
    result: CliResult, error: str, code: int = 2, reason: str | None = None
) -> None:
    """One error line. Without ``reason``: exactly the specification's line,
    ``{"error":"<category>","ok":false}``. With ``reason`` (the command ran with ``--explain``):
    that line plus exactly that reason. A ``--format text`` command prints the error as text
    instead: its category, then (for an error with a reason) the reason and its fix."""
    if not result.stdout.startswith("{"):
        assert_cli_text_error(result, error, code, reason)
        return
    payload = assert_json_line(result)
    assert result.code == code, (result.code, payload)
    expected: dict[str, Any] = {"error": error, "ok": False}
    if reason is not None:
        assert reason in reasons.ALL
        expected["reason"] = reason
    assert payload == expected, payload


def assert_cli_text_error(
    result: CliResult, error: str, code: int = 2, reason: str | None = None
) -> None:
    """A ``--format text`` error: ``error: <category>``; with a reason, ``reason: <name>: <what
    failed>`` and ``fix: <fix>`` from the vocabulary's help (nothing else, nothing on stderr)."""
    from task_state_guard.cli.reason_help import describe

    assert result.stderr == "" and result.code == code, result
    lines = result.stdout.splitlines()
    assert result.stdout.endswith("\n") and lines[0] == f"error: {error}", result.stdout
    if reason is not None:
        what, fix = describe(reason)
        assert lines[1:] == [f"reason: {reason}: {what}", f"fix: {fix}"], result.stdout
    else:
        assert len(lines) in (1, 3), result.stdout


# ----------------------------------------------------------------------------- files


def snapshot_tree(directory: str) -> dict[str, tuple[Any, ...]]:
    """Every entry under ``directory`` with type, mode, mtime, size and content hash."""
    out: dict[str, tuple[Any, ...]] = {}
    for root, dirs, files in os.walk(directory):
        for name in dirs + files:
            path = os.path.join(root, name)
            st = os.lstat(path)
            digest = None
            if stat.S_ISREG(st.st_mode):
                with open(path, "rb") as handle:
                    digest = hashlib.sha256(handle.read()).hexdigest()
            out[os.path.relpath(path, directory)] = (
                stat.S_IFMT(st.st_mode),
                stat.S_IMODE(st.st_mode),
                st.st_mtime_ns,
                st.st_size,
                st.st_ino,
                digest,
            )
    st = os.lstat(directory)
    out["."] = (stat.S_IMODE(st.st_mode), st.st_mtime_ns)
    return out


def snapshot_entries(directory: str) -> dict[str, tuple[Any, ...]]:
    """:func:`snapshot_tree` without the directory's own mtime: what a read command leaves as it
    found it (its transient sidecars on a closed ledger come and go, moving only that mtime)."""
    out = snapshot_tree(directory)
    out.pop(".")
    return out


def raw_execute(path: str, *statements: str | tuple[str, tuple[Any, ...]]) -> None:
    """Edit the SQLite file directly (tamper fixtures), committing and closing."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("BEGIN")
        for statement in statements:
            if isinstance(statement, tuple):
                conn.execute(statement[0], statement[1])
            else:
                conn.execute(statement)
        conn.execute("COMMIT")
    finally:
        conn.close()


def as_v8(path: str) -> None:
    """Turn a fresh (v9) SQLite ledger into the exact v8 layout: no thread column."""
    raw_execute(path, "DROP INDEX tsg_tasks_thread",
                "ALTER TABLE tsg_tasks DROP COLUMN thread_id",
                "UPDATE tsg_meta SET value = '8' WHERE key = 'schema_version'")


def as_v7(path: str) -> None:
    """Turn a fresh (v9) SQLite ledger into the exact v7 layout: checks and trigger conditions
    tested values against lists of constants."""
    from task_state_guard.sqlite import schema

    as_v8(path)

    scratch = sqlite3.connect(":memory:")
    for statement in schema.DDL_V7:
        scratch.execute(statement)
    tables = scratch.execute(
        "SELECT name, sql FROM sqlite_master WHERE type = 'table' AND name IN "
        "('tsg_tasks', 'tsg_events', 'tsg_totals')").fetchall()
    triggers = scratch.execute(
        "SELECT name, sql FROM sqlite_master WHERE type = 'trigger' AND name IN "
        "('tsg_event_closed', 'tsg_total_closed', 'tsg_verdict_owed')").fetchall()
    scratch.close()
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("BEGIN")
        cookie = conn.execute("PRAGMA schema_version").fetchone()[0]
        conn.execute("PRAGMA writable_schema = ON")
        for name, sql in tables:
            conn.execute("UPDATE sqlite_master SET sql = ? WHERE type = 'table' AND name = ?",
                         (sql, name))
        conn.execute(f"PRAGMA schema_version = {cookie + 1}")
        conn.execute("PRAGMA writable_schema = OFF")
        for name, sql in triggers:
            conn.execute(f"DROP TRIGGER {name}")
            conn.execute(sql)
        conn.execute("UPDATE tsg_meta SET value = '7' WHERE key = 'schema_version'")
        conn.execute("COMMIT")
    finally:
        conn.close()


def as_v6(path: str) -> None:
    """Turn a fresh (v9) SQLite ledger into the exact v6 layout: an insert wrote only its
    created event (rows were inserted queued, then started)."""
    as_v7(path)
    raw_execute(path, "DROP TRIGGER tsg_event_started_inserted",
                "UPDATE tsg_meta SET value = '6' WHERE key = 'schema_version'")


def as_v5(path: str) -> None:
    """Turn a fresh (v9) SQLite ledger into the exact v5 layout: its close totals counted a
    child as an attempt, whatever it owed."""
    from task_state_guard.sqlite import schema

    as_v6(path)
    raw_execute(path, "DROP TRIGGER tsg_total_closed", schema._TOTAL_TRIGGERS[0],
                "UPDATE tsg_meta SET value = '5' WHERE key = 'schema_version'")


def as_v4(path: str) -> None:
    """Turn a fresh (v9) SQLite ledger into the exact v4 layout an earlier build wrote:
    without the verdict outbox and its two task columns."""
    as_v5(path)
    raw_execute(path, "DROP TRIGGER tsg_verdict_owed", "DROP TABLE tsg_verdicts",
                "ALTER TABLE tsg_tasks DROP COLUMN redelivery_seconds",
                "ALTER TABLE tsg_tasks DROP COLUMN framework",
                "UPDATE tsg_meta SET value = '4' WHERE key = 'schema_version'")


def guarded_job(led: Ledger, clock: Clock) -> list[tuple[dict[str, Any], list[Any]]]:
    """A guarded job written through *begin attempt* / *end attempt* (a first delivery that
    fails and schedules its retry, the retry's delivery claiming the queued attempt and
    succeeding): each task's ``to_dict()`` and recorded chain, for comparing two ledgers
    (fixed ids, times from ``clock``)."""
    logical = "0000000a-0000-4000-8000-00000000000a"
    first_id = "0000000a-0000-4000-8000-00000000000b"
    retry = "0000000a-0000-4000-8000-00000000000c"
    first = led.begin_attempt(logical, name="job", delivery_required=True, framework_id=logical,
                              framework="celery", attempt_id=first_id, timeout_seconds=30.0,
                              redelivery_seconds=5.0)
    clock.advance(1)
    led.end_attempt([(first, "failed", "retry_scheduled")], queue=[(retry, logical, "job", 30.0)])
    clock.advance(1)
    claimed = led.begin_attempt(logical, name="job", candidates=[(retry, True)],
                                timeout_seconds=30.0)
    assert claimed == retry
    clock.advance(1)
    led.end_attempt([(retry, "succeeded", "worker_completed"),
                     (logical, "succeeded", "worker_completed")],
                    marks={logical: ("delivered", "transport_acknowledged")})
    return [(led.get_task(tid).to_dict(),
             [(e.kind, e.state, e.code, e.at) for e in led.events_of(tid)])
            for tid in (logical, first_id, retry)]


def _attempt(led: Ledger, clock: Clock, job: str, state: str, code: str, *,
             owes: bool = False) -> str:
    """One attempt of ``job`` (a child owing its own delivery with ``owes``), run to its close."""
    clock.advance(1)
    attempt = led.create_task(parent_id=job, delivery_required=owes, name="app.job").id
    led.start_task(attempt, owner=False)
    clock.advance(1)
    led.close_task_settled(attempt, state, code=code)
    return attempt


def _closed_job(led: Ledger, clock: Clock, state: str, code: str) -> str:
    clock.advance(1)
    job = led.create_task(name="app.job").id
    led.start_task(job, owner=False)
    clock.advance(1)
    led.close_task_settled(job, state, code=code)
    return job


def contradicted_jobs(led: Ledger, clock: Clock) -> dict[str, str]:
    """Jobs whose attempts do and do not contradict their close (doctor's warning, the
    listing's ``contradicted`` filter, the job page's notice); role -> id. Contradicted:
    ``revoked`` (closed cancelled/revoked, then run twice: a failure, then ``revoked_success``)
    and ``lost`` (closed timed_out/owner_lost, then ``lost_success``). Not contradicted:
    ``parts`` (an attempt succeeded, a later one failed, then the job failed), ``failed_again``
    (cancelled, then an attempt failed), ``own_delivery`` (cancelled, then a child that owes
    its own delivery succeeded: a job of its own, not an attempt), ``duplicate`` (succeeded,
    then a duplicate delivery failed) and ``open`` (running, one attempt succeeded)."""
    ids: dict[str, str] = {}
    ids["revoked"] = _closed_job(led, clock, "cancelled", "revoked")
    _attempt(led, clock, ids["revoked"], "failed", "retry_scheduled")
    ids["revoked_success"] = _attempt(led, clock, ids["revoked"], "succeeded", "worker_completed")
    ids["lost"] = _closed_job(led, clock, "timed_out", "owner_lost")
    ids["lost_success"] = _attempt(led, clock, ids["lost"], "succeeded", "worker_completed")
    clock.advance(1)
    ids["parts"] = led.create_task(name="app.job").id
    led.start_task(ids["parts"], owner=False)
    _attempt(led, clock, ids["parts"], "succeeded", "worker_completed")
    _attempt(led, clock, ids["parts"], "failed", "worker_failed")
    clock.advance(1)
    led.close_task_settled(ids["parts"], "failed", code="worker_failed")
    ids["failed_again"] = _closed_job(led, clock, "cancelled", "revoked")
    _attempt(led, clock, ids["failed_again"], "failed", "worker_failed")
    ids["own_delivery"] = _closed_job(led, clock, "cancelled", "caller_cancelled")
    _attempt(led, clock, ids["own_delivery"], "succeeded", "worker_completed", owes=True)
    ids["duplicate"] = _closed_job(led, clock, "succeeded", "worker_completed")
    _attempt(led, clock, ids["duplicate"], "failed", "worker_failed")
    clock.advance(1)
    ids["open"] = led.create_task(name="app.job").id
    led.start_task(ids["open"], owner=False)
    _attempt(led, clock, ids["open"], "succeeded", "worker_completed")
    return ids


def sidecars(path: str) -> list[str]:
    return [path + s for s in ("-wal", "-shm", "-journal") if os.path.lexists(path + s)]


# ----------------------------------------------------------------------------- raw rows
# Fixtures that write rows directly adapt to the stored layout (they only ever reproduce
# what the API itself writes, or deliberately corrupt it), so they never depend on internals.

EVENT_STEP = {"created": 1, "started": 2, "closed": 3, "delivery": 4}


def table_columns(conn: sqlite3.Connection, table: str) -> list[str]:
    return [str(r[1]) for r in conn.execute(f"PRAGMA table_info({table})")]


def events_written_by_triggers(conn: sqlite3.Connection) -> bool:
    row = conn.execute(
        "SELECT count(*) FROM sqlite_master WHERE type = 'trigger' AND tbl_name = 'tsg_tasks'"
    ).fetchone()
    return bool(row[0])


def insert_event(
    conn: sqlite3.Connection, task_seq: Any, kind: str, state: str, code: str | None, at: Any
) -> None:
    """Insert one event row in whatever event layout the database uses."""
    columns = table_columns(conn, "tsg_events")
    values: dict[str, Any] = {
        "task_seq": task_seq, "kind": kind, "state": state, "code": code, "at": at,
    }
    if "step" in columns:
        values["step"] = EVENT_STEP[kind]
    names = ", ".join(values)
    marks = ", ".join("?" for _ in values)
    conn.execute(f"INSERT INTO tsg_events({names}) VALUES ({marks})", tuple(values.values()))
