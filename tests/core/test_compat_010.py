"""The public surface of the published 0.1.0, which this version must keep: names, types and
output shapes in Python and on the CLI, the owner-lock directory only when an owner is recorded,
and the specification's quick start run verbatim."""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest
from core_helpers import (
    TASK_KEYS,
    Clock,
    assert_cli_error,
    assert_json_line,
    check_report,
    cli_env,
    is_sqlite,
    raw_execute,
    run_cli,
)
from task_state_guard import (
    DeliveryStatus,
    InvalidInput,
    Ledger,
    LedgerBusy,
    ReconcilePolicy,
    StateConflict,
    StorageError,
    TaskNotFound,
    TaskStatus,
    UnsafeLocation,
    payload_fingerprint,
    reconcile_restart,
)

BIN = os.path.dirname(sys.executable)


# ----------------------------------------------------------------------------- Python


def test_0_1_0_exports() -> None:
    import task_state_guard

    for name in ("Ledger", "ReconcilePolicy", "reconcile_restart", "TaskStatus",
                 "DeliveryStatus", "InvalidInput", "StateConflict", "TaskNotFound",
                 "payload_fingerprint"):
        assert name in task_state_guard.__all__ and hasattr(task_state_guard, name)
    assert callable(reconcile_restart) and callable(payload_fingerprint)
    for cls in (TaskStatus, DeliveryStatus):
        assert issubclass(cls, enum.Enum) and issubclass(cls, str)
    assert [s.value for s in TaskStatus] == [
        "queued", "running", "succeeded", "failed", "timed_out", "cancelled"]
    assert [s.value for s in DeliveryStatus] == [
        "pending", "delivered", "failed", "not_applicable"]


def test_status_fields_are_enums_that_still_compare_as_strings(ledger: Ledger) -> None:
    task = ledger.create_task()
    assert type(task.status) is TaskStatus and type(task.delivery_status) is DeliveryStatus
    assert task.status.value == "queued" and task.delivery_status.value == "pending"
    running = ledger.start_task(task.id, owner=False)
    assert running.status is TaskStatus.RUNNING and running.status == "running"
    assert type(ledger.get_task(task.id).status) is TaskStatus
    done = ledger.close_task(task.id, "succeeded")
    assert done.status.value == "succeeded" and done.is_terminal
    failed = ledger.set_delivery(task.id, DeliveryStatus.FAILED)
    assert failed.delivery_status is DeliveryStatus.FAILED
    assert type(failed.to_dict()["status"]) is str  # plain JSON values


def test_task_fields(ledger: Ledger) -> None:
    names = {f.name for f in dataclasses.fields(ledger.create_task())}
    assert names >= {
        "id", "parent_id", "status", "delivery_status", "delivery_required", "payload_hash",
        "timeout_seconds", "created_at", "started_at", "updated_at", "ended_at", "deadline_at",
        "delivery_updated_at", "terminal_code", "delivery_code", "version",
    }
    assert names - {"name", "heartbeat_at", "has_owner", "framework_id"} == {
        "id", "parent_id", "status", "delivery_status", "delivery_required", "payload_hash",
        "timeout_seconds", "created_at", "started_at", "updated_at", "ended_at", "deadline_at",
        "delivery_updated_at", "terminal_code", "delivery_code", "version",
    }


def test_timestamps_and_version_through_a_lifecycle(ledger: Ledger, clock: Clock) -> None:
    task = ledger.create_task(timeout_seconds=60)
    assert task.version == 0 and task.ended_at is None
    assert task.delivery_updated_at == task.created_at == task.updated_at == clock.t
    clock.advance(1)
    started = ledger.start_task(task.id, owner=False)
    assert started.version == 1 and started.updated_at == clock.t
    clock.advance(1)
    beat = ledger.heartbeat(task.id)
    assert beat.version == 1  # a heartbeat does not count ...
    assert beat.updated_at == beat.heartbeat_at == clock.t  # ... but it is the last update
    assert ledger.heartbeat_many([task.id]) == 1 and ledger.get_task(task.id).version == 1
    clock.advance(1)
    closed = ledger.close_task(task.id, "failed", code="worker_failed")
    assert closed.version == 2 and closed.ended_at == closed.updated_at == clock.t
    assert closed.delivery_updated_at == task.created_at
    clock.advance(1)
    assert ledger.close_task(task.id, "failed").version == 2  # an idempotent repeat
    delivered = ledger.set_delivery(task.id, "failed", code="transport_failed")
    assert delivered.version == 3 and delivered.delivery_updated_at == clock.t
    assert delivered.updated_at == closed.updated_at  # a delivery change moves only its own
    clock.advance(1)
    assert ledger.set_delivery(task.id, "failed") == delivered  # an idempotent repeat
    cancelled = ledger.close_task(ledger.create_task().id, "cancelled")
    assert cancelled.version == 1 and cancelled.started_at is None
    assert ledger.doctor()["healthy"] is True


def test_reconcile_counts_in_version(ledger: Ledger, clock: Clock) -> None:
    stale = ledger.create_task(delivery_required=False)
    ledger.start_task(stale.id, owner=False)
    clock.advance(700)
    ledger.reconcile(active_grace_seconds=600, delivery_grace_seconds=0)
    task = ledger.get_task(stale.id)
    assert (task.status, task.terminal_code, task.delivery_status) == (
        "timed_out", "restart_stale", "not_applicable")
    assert task.version == 3 and task.ended_at == task.delivery_updated_at == clock.t


def test_to_dict_keys(ledger: Ledger) -> None:
    digest = payload_fingerprint("payload")
    task = ledger.create_task(payload_hash=digest, name="x.y")
    assert set(task.to_dict()) == TASK_KEYS
    assert task.to_dict()["has_payload_hash"] is True and digest not in repr(task.to_dict())
    full = task.to_dict(include_payload_hash=True)
    assert set(full) == TASK_KEYS | {"payload_hash"} and full["payload_hash"] == digest
    assert ledger.create_task().to_dict(include_payload_hash=True)["payload_hash"] is None
    extras = task.to_dict(extras=True)
    assert set(extras) == TASK_KEYS | {"name", "heartbeat_at", "has_owner", "framework_id"}
    assert extras["name"] == "x.y"


def test_reconcile_with_grace_keywords(ledger: Ledger, clock: Clock) -> None:
    running = ledger.create_task()
    ledger.start_task(running.id, owner=False)
    clock.advance(50)
    preview = ledger.reconcile(active_grace_seconds=30, delivery_grace_seconds=30, dry_run=True)
    check_report(preview, dry_run=True)
    assert preview["tasks_timed_out"] == 1
    assert ledger.get_task(running.id).status == "running"
    applied = ledger.reconcile(active_grace_seconds=30, delivery_grace_seconds=30)
    check_report(applied, dry_run=False)
    assert applied["tasks_timed_out"] == 1
    assert ledger.get_task(running.id).terminal_code == "restart_stale"
    with pytest.raises(InvalidInput):
        ledger.reconcile(ReconcilePolicy(), active_grace_seconds=30)
    with pytest.raises(InvalidInput):
        ledger.reconcile(active_grace_seconds=-1, delivery_grace_seconds=30)
    with pytest.raises(TypeError):
        ledger.reconcile(30, 30)  # type: ignore[call-arg, arg-type]


def test_payload_fingerprint_of_text_and_bytes() -> None:
    text = "caf\u00e9 \u2603"
    expected = hashlib.sha256(text.encode("utf-8")).hexdigest()
    assert payload_fingerprint(text) == expected == payload_fingerprint(text.encode("utf-8"))
    assert payload_fingerprint("") == hashlib.sha256(b"").hexdigest()
    assert payload_fingerprint(bytearray(b"ab")) == hashlib.sha256(b"ab").hexdigest()
    for bad in (None, 5, ["a"], "\ud800"):
        with pytest.raises(InvalidInput):
            payload_fingerprint(bad)  # type: ignore[arg-type]


def test_schema_version_constant(ledger: Ledger) -> None:
    assert Ledger.SCHEMA_VERSION == 9
    if is_sqlite(str(ledger.path)):
        assert ledger.SCHEMA_VERSION == 9
    else:
        from task_state_guard_postgres import SCHEMA_VERSION as pg_version

        assert ledger.SCHEMA_VERSION == pg_version == 10
    assert ledger.doctor()["schema_version"] == ledger.SCHEMA_VERSION
    assert ledger.storage_info()["schema_version"] == ledger.SCHEMA_VERSION


def test_doctor_report_shape(ledger: Ledger) -> None:
    ledger.create_task()
    report = ledger.doctor()
    for key in ("task_count", "event_count", "schema_version", "healthy", "quick_check",
                "schema_ok", "task_status_counts", "delivery_status_counts"):
        assert key in report
    assert report["task_status_counts"] == {
        "queued": 1, "running": 0, "succeeded": 0, "failed": 0, "timed_out": 0, "cancelled": 0}
    assert report["delivery_status_counts"] == {
        "pending": 1, "delivered": 0, "failed": 0, "not_applicable": 0}
    counts = [k for k in report if k.endswith("_count") and k not in ("task_count",
                                                                       "event_count")]
    assert len(counts) >= 10
    assert all(type(report[k]) is int and report[k] == 0 for k in counts)


@pytest.mark.sqlite_only(reason="storage_info() of the SQLite backend")
def test_storage_info_keys(db: str) -> None:
    with Ledger(db, busy_timeout_ms=1234) as led:
        led.create_task()
        info = led.storage_info()
    assert info["permission_model"] == ("posix_mode" if os.name == "posix" else "external_acl")
    assert info["journal_mode"] == "wal" and info["foreign_keys"] is True
    assert info["busy_timeout_ms"] == 1234
    with Ledger(db, read_only=True, busy_timeout_ms=250) as ro:
        info = ro.storage_info()
    assert info["journal_mode"] == "wal" and info["foreign_keys"] is True
    assert info["busy_timeout_ms"] == 250 and info["read_only"] is True


def test_zero_timeout_means_the_deadline_is_the_start(ledger: Ledger, clock: Clock) -> None:
    task = ledger.create_task(timeout_seconds=0)
    assert task.timeout_seconds == 0.0
    clock.advance(5)
    started = ledger.start_task(task.id, owner=False)
    assert started.deadline_at == started.started_at == clock.t
    report = ledger.reconcile(active_grace_seconds=600, delivery_grace_seconds=600)
    assert report["tasks_timed_out"] == 1
    assert ledger.get_task(task.id).terminal_code == "deadline_exceeded"
    assert ledger.doctor()["healthy"] is True


def test_a_repeated_close_with_the_same_state_is_idempotent_whatever_its_code(
    ledger: Ledger, db: str
) -> None:
    task = ledger.create_task()
    ledger.close_task(task.id, "failed", code="worker_failed")
    stored = ledger.get_task(task.id)
    events = ledger.doctor()["event_count"]
    for code in (None, "worker_failed", "worker_lost", "completed", "transport_acknowledged",
                 "not_a_registered_code"):
        assert ledger.close_task(task.id, "failed", code=code) == stored
    repeat = assert_json_line(run_cli("--db", db, "close", task.id, "--status", "failed",
                                      "--code", "completed"))
    assert repeat["task"] == stored.to_dict() and repeat["task"]["terminal_code"] == "worker_failed"
    with pytest.raises(StateConflict):  # another terminal state is still a conflict
        ledger.close_task(task.id, "succeeded", code="completed")
    assert_cli_error(run_cli("--db", db, "close", task.id, "--status", "cancelled"),
                     "StateConflict")
    assert ledger.get_task(task.id) == stored and ledger.doctor()["event_count"] == events


def test_any_finite_timeout_is_taken_and_a_start_without_a_finite_deadline_refused(
    ledger: Ledger, clock: Clock, db: str
) -> None:
    long = ledger.create_task(timeout_seconds=1e300)
    assert long.timeout_seconds == 1e300
    assert ledger.start_task(long.id, owner=False).deadline_at == clock.t + 1e300
    created = assert_json_line(run_cli("--db", db, "create", "--timeout-seconds",
                                       "99999999999999"))["task"]
    assert created["timeout_seconds"] == 99999999999999.0
    clock.set(1e308)  # a clock this far on: this timeout's deadline overflows
    task = ledger.create_task(timeout_seconds=1e308)
    with pytest.raises(InvalidInput):
        ledger.start_task(task.id, owner=False)
    with pytest.raises(InvalidInput):
        ledger.start_task(task.id)
    after = ledger.get_task(task.id)
    assert after.status == "queued" and after.version == 0 and after.started_at is None
    for bad in (float("inf"), float("nan"), -1.0, 10**400):
        with pytest.raises(InvalidInput):
            ledger.create_task(timeout_seconds=bad)
    assert ledger.doctor()["healthy"] is True


@pytest.mark.sqlite_only(reason="errors of SQLite files and paths (foreign file, links, modes)")
def test_error_classes_catch_what_0_1_0_code_expects(tmp_path: Path) -> None:
    assert issubclass(StorageError, StateConflict) and issubclass(LedgerBusy, StateConflict)
    assert issubclass(UnsafeLocation, InvalidInput)
    assert not issubclass(UnsafeLocation, StateConflict)
    assert not issubclass(StorageError, InvalidInput)
    # a foreign schema: a storage problem, caught as StateConflict
    foreign = tmp_path / "f" / "tasks.sqlite"
    foreign.parent.mkdir(mode=0o700)
    raw_execute(str(foreign), "CREATE TABLE notes(body TEXT)")
    os.chmod(foreign, 0o600)
    try:
        Ledger(str(foreign))
    except StateConflict as exc:
        assert isinstance(exc, StorageError)
    else:
        raise AssertionError("a foreign schema was accepted")
    # a database that is a symlink or hard-link alias: StateConflict, as in 0.1.0
    real = tmp_path / "r" / "tasks.sqlite"
    Ledger(str(real)).close()
    link = tmp_path / "r" / "link.sqlite"
    os.symlink(real, link)
    os.link(real, tmp_path / "r" / "hard.sqlite")
    for alias in (link, real):
        try:
            Ledger(str(alias))
        except StateConflict as exc:
            assert isinstance(exc, StorageError)
        else:
            raise AssertionError("a database alias was accepted")
    os.unlink(tmp_path / "r" / "hard.sqlite")
    # an unsafe path: caught as InvalidInput
    open_dir = tmp_path / "open"
    open_dir.mkdir(mode=0o777)
    os.chmod(open_dir, 0o777)
    try:
        Ledger(str(open_dir / "tasks.sqlite"))
    except InvalidInput as exc:
        assert isinstance(exc, UnsafeLocation)
    else:
        raise AssertionError("an unsafe directory was accepted")
    with Ledger(str(real)) as led, pytest.raises(TaskNotFound):
        led.get_task(uuid.uuid4())


# ----------------------------------------------------------------------------- CLI


@pytest.mark.sqlite_only(reason="0.1.0's storage keys are the SQLite file's")
def test_cli_surface(db: str) -> None:
    init = run_cli("--db", db, "--allow-external-acl", "init")
    payload = assert_json_line(init)
    assert init.code == 0 and set(payload) == {"ok", "storage"} and payload["ok"] is True
    for key in ("journal_mode", "foreign_keys", "busy_timeout_ms", "permission_model"):
        assert key in payload["storage"]
    assert payload["storage"]["permission_model"] in ("posix_mode", "external_acl")
    digest = payload_fingerprint(b"payload bytes")
    created = assert_json_line(run_cli("--db", db, "create", "--payload-sha256", digest,
                                       "--timeout-seconds", "0"))
    assert set(created) == {"ok", "task"} and set(created["task"]) == TASK_KEYS
    assert created["task"]["has_payload_hash"] is True and digest not in str(created)
    tid = created["task"]["id"]
    with Ledger(db, read_only=True) as ro:
        assert ro.get_task(tid).payload_hash == digest
        assert created["task"] == ro.get_task(tid).to_dict()
    started = assert_json_line(run_cli("--db", db, "start", tid))["task"]
    assert started["deadline_at"] == started["started_at"]
    closed = assert_json_line(run_cli("--db", db, "close", tid, "--status", "failed",
                                      "--code", "worker_failed"))
    assert closed["task"]["terminal_code"] == "worker_failed" and closed["task"]["version"] == 2
    delivered = assert_json_line(run_cli("--db", db, "delivery", tid, "--status", "failed",
                                         "--code", "transport_failed"))
    assert delivered["task"]["delivery_code"] == "transport_failed"
    with Ledger(db, read_only=True) as ro:
        assert delivered == {"ok": True, "task": ro.get_task(tid).to_dict()}
    # the status is an option; a missing one is bad input
    assert_cli_error(run_cli("--db", db, "close", tid), "InvalidInput")
    assert_cli_error(run_cli("--db", db, "delivery", tid, "--code", "transport_failed"),
                     "InvalidInput")
    doctor = run_cli("--db", db, "doctor")
    report = assert_json_line(doctor)
    assert doctor.code == 0 and report["ok"] is True and report["healthy"] is True
    assert report["task_count"] == 1 and report["schema_ok"] is True
    assert report["task_status_counts"]["failed"] == 1


@pytest.mark.sqlite_only(reason="0.1.0's error names for SQLite paths and modes")
def test_cli_error_names_are_0_1_0_categories(tmp_path: Path) -> None:
    d = tmp_path / "d"
    d.mkdir(mode=0o700)
    foreign = d / "foreign.sqlite"
    raw_execute(str(foreign), "CREATE TABLE notes(body TEXT)")
    os.chmod(foreign, 0o600)
    assert_cli_error(run_cli("--db", str(foreign), "init"), "StateConflict")
    real = str(d / "tasks.sqlite")
    Ledger(real).close()
    os.symlink(real, d / "link.sqlite")
    assert_cli_error(run_cli("--db", str(d / "link.sqlite"), "init"), "StateConflict")
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    os.chmod(open_dir, 0o777)
    assert_cli_error(run_cli("--db", str(open_dir / "tasks.sqlite"), "init"), "InvalidInput")
    assert_cli_error(run_cli("--db", real, "get", str(uuid.uuid4())), "TaskNotFound")


# ----------------------------------------------------------------------------- files


def owners_dir(db: str) -> str:
    return db + "-owners"


@pytest.mark.sqlite_only(reason="the SQLite backend's owner lock directory")
def test_owner_lock_directory_only_when_an_owner_is_recorded(tmp_path: Path) -> None:
    db = str(tmp_path / "d" / "tasks.sqlite")
    with Ledger(db) as led:  # opening creates only the database (and SQLite's sidecars)
        assert not os.path.exists(owners_dir(db))
        queued = led.create_task()
        other = led.create_task()
        led.start_task(other.id, owner=False)
        led.heartbeat(other.id)
        led.close_task(other.id, "succeeded")
        led.set_delivery(other.id, "delivered")
        led.reconcile(dry_run=True)
        led.reconcile()
        led.doctor()
        led.status()
        # refused starts with an owner record nothing, so they create nothing either
        with pytest.raises(TaskNotFound):
            led.start_task(uuid.uuid4())
        with pytest.raises(StateConflict):
            led.start_task(other.id)
        assert not os.path.exists(owners_dir(db))
    for args in (["init"], ["create"], ["start", queued.id], ["heartbeat", queued.id],
                 ["close", queued.id, "--status", "succeeded"], ["reconcile"], ["doctor"],
                 ["status"], ["metrics"], ["reconcile", "--dry-run"]):
        result = run_cli("--db", db, *args)
        assert result.code == 0, (args, result.stdout)
    assert not os.path.exists(owners_dir(db))
    assert sorted(os.listdir(os.path.dirname(db))) == ["tasks.sqlite"]
    with Ledger(db) as led:
        owned = led.start_task(led.create_task().id)  # the first start with an owner
        assert owned.has_owner
        assert os.path.isdir(owners_dir(db))
        assert len(os.listdir(owners_dir(db))) == 1


# ----------------------------------------------------------------------------- quick start

# The specification's quick start, step 3, verbatim.
QUICK_START = '''
from task_state_guard import Ledger

ledger = Ledger("./private-state/tasks.sqlite")
task = ledger.create_task(timeout_seconds=900)
ledger.start_task(task.id)

# Close the task only after the worker confirms the outcome.
ledger.close_task(task.id, "succeeded", code="worker_completed")

# Close delivery only after the transport records an acknowledgement.
ledger.set_delivery(
    task.id,
    "delivered",
    code="transport_acknowledged",
)
'''

# The specification's embedded preview-then-apply example, verbatim.
EMBEDDED = '''
from task_state_guard import Ledger, ReconcilePolicy, reconcile_restart

preview_ledger = Ledger("./private-state/tasks.sqlite", read_only=True)
policy = ReconcilePolicy(
    active_grace_seconds=600,
    delivery_grace_seconds=600,
)
preview = reconcile_restart(preview_ledger, policy, dry_run=True)

apply_ledger = Ledger("./private-state/tasks.sqlite")
applied = reconcile_restart(apply_ledger, policy)
print(preview["tasks_timed_out"], applied["tasks_timed_out"])
'''

# The specification's quick start, step 4, verbatim (a POSIX shell).
PREVIEW_THEN_APPLY = r'''
task-state-guard --db ./private-state/tasks.sqlite reconcile \
  --active-grace-seconds 600 \
  --delivery-grace-seconds 600 \
  --dry-run
task-state-guard --db ./private-state/tasks.sqlite reconcile \
  --active-grace-seconds 600 \
  --delivery-grace-seconds 600
task-state-guard --db ./private-state/tasks.sqlite doctor
'''


@pytest.mark.sqlite_only(reason="the specification's quick start, verbatim, on a SQLite path")
def test_specification_quick_start_runs_verbatim(tmp_path: Path) -> None:
    work = tmp_path / "app"
    work.mkdir(mode=0o700)
    env = cli_env({"PATH": BIN + os.pathsep + os.environ.get("PATH", "")})
    for code in (QUICK_START, EMBEDDED):
        proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=work, env=env,
                              capture_output=True, text=True, timeout=120, check=False)
        assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert proc.stdout == "0 0\n"
    assert os.path.exists(BIN + "/task-state-guard"), "the console script is installed"
    shell = subprocess.run(["sh", "-c", PREVIEW_THEN_APPLY], cwd=work, env=env,
                           capture_output=True, text=True, timeout=120, check=False)
    assert shell.returncode == 0 and shell.stderr == ""
    lines = shell.stdout.splitlines()
    assert len(lines) == 3
    assert lines[0].startswith('{"ok":true,"reconcile":{"active_examined":0,"applied":false')
    assert lines[1].startswith('{"ok":true,"reconcile":{"active_examined":0,"applied":true')
    assert '"healthy":true' in lines[2] and '"task_count":1' in lines[2]
    with Ledger(work / "private-state" / "tasks.sqlite", read_only=True) as ro:
        (tid,) = ro.find_task_ids("succeeded")
        task = ro.get_task(tid)
    assert (task.status.value, task.terminal_code) == ("succeeded", "worker_completed")
    assert (task.delivery_status.value, task.delivery_code) == (
        "delivered", "transport_acknowledged")
    assert task.version == 3 and task.has_owner
