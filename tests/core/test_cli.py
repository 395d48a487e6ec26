"""The real CLI as a subprocess: one compact key-sorted JSON line, empty stderr, exit codes
0/1/2/3, no echo of rejected values or paths, TSG_* configuration, read commands never create."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest
from core_helpers import (
    REPORT_KEYS,
    TASK_KEYS,
    CliResult,
    Clock,
    assert_cli_error,
    assert_json_line,
    cli_env,
    is_sqlite,
    run_cli,
    skip_unless_ci,
)
from ledger_backends import ledger_target, pg_schema_exists
from task_state_guard import Ledger, payload_fingerprint

CANARY = "CANARYq7x9zz"
BIN = os.path.dirname(sys.executable)


def ok(result, code: int = 0):
    payload = assert_json_line(result)
    assert result.code == code, result.stdout
    return payload


def test_full_lifecycle_through_cli(db: str) -> None:
    init = ok(run_cli("--db", db, "init"))
    assert set(init) == {"ok", "storage"} and init["ok"] is True
    if is_sqlite(db):
        assert init["storage"]["permission_model"] == "posix_mode"
        assert init["storage"]["journal_mode"] == "wal"
        assert init["storage"]["foreign_keys"] is True
        expected_version = 9
    else:
        from task_state_guard_postgres import SCHEMA_VERSION as expected_version
    assert init["storage"]["busy_timeout_ms"] == 5000
    assert init["storage"]["schema_version"] == expected_version
    parent = ok(run_cli("--db", db, "create", "--name", "app.job", "--timeout-seconds", "900"))
    task = parent["task"]
    assert set(parent) == {"ok", "task"} and set(task) == TASK_KEYS
    assert parent["ok"] is True and task["status"] == "queued" and task["version"] == 0
    assert task["timeout_seconds"] == 900 and task["delivery_required"] is True
    assert task["delivery_updated_at"] == task["created_at"] == task["updated_at"]
    pid = task["id"]
    child = ok(run_cli("--db", db, "create", "--parent", pid, "--internal"))["task"]
    assert child["parent_id"] == pid and child["delivery_required"] is False
    started = ok(run_cli("--db", db, "start", pid))["task"]
    assert started["status"] == "running" and started["version"] == 1
    assert started["deadline_at"] == started["started_at"] + 900
    beat = ok(run_cli("--db", db, "heartbeat", pid))["task"]
    assert beat["version"] == 1 and beat["updated_at"] >= started["updated_at"]
    got = ok(run_cli("--db", db, "get", pid))["task"]
    assert got == beat and set(got) == TASK_KEYS
    extras = ok(run_cli("--db", db, "get", pid, "--extras"))["task"]
    assert extras == {**got, "name": "app.job", "heartbeat_at": beat["updated_at"],
                      "has_owner": False, "framework_id": None}
    kids = ok(run_cli("--db", db, "children", pid))["children"]
    assert [k["id"] for k in kids] == [child["id"]] and set(kids[0]) == TASK_KEYS
    kids = ok(run_cli("--db", db, "children", pid, "--extras"))["children"]
    assert kids[0]["name"] is None and kids[0]["has_owner"] is False
    assert ok(run_cli("--db", db, "tasks", "--status", "running"))["task_ids"] == [pid]
    assert ok(run_cli("--db", db, "tasks", "--status", "queued", "--limit", "5"))[
        "task_ids"] == [child["id"]]
    closed = ok(run_cli("--db", db, "close", child["id"], "--status", "cancelled",
                        "--code", "skipped"))
    assert closed["task"]["terminal_code"] == "skipped" and closed["task"]["version"] == 1
    assert closed["task"]["ended_at"] == closed["task"]["updated_at"]
    again = ok(run_cli("--db", db, "close", child["id"], "--status", "cancelled",
                       "--code", "revoked"))
    assert again == closed  # idempotent: the original code and version are kept
    ok(run_cli("--db", db, "delivery", child["id"], "--status", "not_applicable",
               "--code", "internal_task"))
    ok(run_cli("--db", db, "close", pid, "--status", "succeeded", "--code", "worker_completed"))
    done = ok(run_cli("--db", db, "delivery", pid, "--status", "delivered", "--code",
                      "transport_acknowledged"))["task"]
    assert done["delivery_status"] == "delivered" and done["delivery_code"] == (
        "transport_acknowledged")
    assert done["version"] == 3 and done["delivery_updated_at"] >= done["ended_at"]
    # the positional state of earlier development builds is not accepted
    assert_cli_error(run_cli("--db", db, "close", pid, "succeeded"), "InvalidInput")
    doctor = ok(run_cli("--db", db, "doctor"))
    assert doctor["ok"] is True and doctor["healthy"] is True
    assert doctor["task_count"] == 2 and doctor["event_count"] == 7
    for args in (["reconcile"], ["reconcile", "--dry-run"]):
        report = ok(run_cli("--db", db, *args))["reconcile"]
        assert set(report) == REPORT_KEYS
    status = ok(run_cli("--db", db, "status"))["status"]
    assert status["tasks"]["succeeded"] == 1 and status["tasks"]["cancelled"] == 1
    prune = ok(run_cli("--db", db, "prune", "--older-than", "0", "--dry-run"))["prune"]
    assert prune["dry_run"] is True and prune["tasks_deleted"] == 2
    prune = ok(run_cli("--db", db, "prune", "--older-than", "0"))["prune"]
    assert prune["applied"] is True and prune["trees_deleted"] == 1
    assert ok(run_cli("--db", db, "doctor"))["task_count"] == 0


@pytest.mark.sqlite_only(reason="the installed console scripts, run on a SQLite path")
def test_console_scripts_share_the_entry_point(tmp_path) -> None:
    db = str(tmp_path / "d" / "tasks.sqlite")
    for script in ("task-state-guard", "tsg"):
        path = os.path.join(BIN, script)
        if not os.path.exists(path):
            skip_unless_ci(f"{script} console script not installed in this environment")
        proc = subprocess.run([path, "--db", db, "init"], capture_output=True, text=True,
                              env=cli_env(), check=False, timeout=60)
        assert proc.returncode == 0 and proc.stderr == ""
        payload = assert_json_line(CliResult(proc.returncode, proc.stdout, proc.stderr))
        assert payload["ok"] is True and payload["storage"]["schema_version"] == 9


def test_help_and_version_exit_zero() -> None:
    assert run_cli("--help").code == 0
    version = run_cli("--version")
    assert version.code == 0 and "task-state-guard" in version.stdout


def test_payload_hash_never_printed(db: str) -> None:
    digest = payload_fingerprint(b"some payload")
    created = ok(run_cli("--db", db, "create", "--payload-sha256", digest))
    assert created["task"]["has_payload_hash"] is True
    assert digest not in run_cli("--db", db, "get", created["task"]["id"]).stdout
    assert digest not in created.__repr__()


# ----------------------------------------------------------------------------- errors


def test_state_errors_exit_2(db: str) -> None:
    tid = ok(run_cli("--db", db, "create"))["task"]["id"]
    unknown = str(uuid.uuid4())
    assert_cli_error(run_cli("--db", db, "get", unknown), "TaskNotFound")
    assert_cli_error(run_cli("--db", db, "heartbeat", tid), "StateConflict")
    conflict = "StateConflict"
    assert_cli_error(run_cli("--db", db, "delivery", tid, "--status", "delivered"), conflict)
    ok(run_cli("--db", db, "close", tid, "--status", "failed"))
    assert_cli_error(run_cli("--db", db, "close", tid, "--status", "succeeded"), conflict)
    assert_cli_error(run_cli("--db", db, "delivery", tid, "--status", "not_applicable"),
                     conflict)
    assert_cli_error(run_cli("--db", db, "close", unknown, "--status", "succeeded",
                             "--code", "bogus"),
                     "TaskNotFound")


def _bad_invocations(db: str, tid: str) -> list[tuple[list[str], dict[str, str], str]]:
    c = CANARY
    return [
        # `get` takes any framework's job id too: an unknown one is not found, not echoed
        (["--db", db, "get", c], {}, "TaskNotFound"),
        (["--db", db, "start", c], {}, "InvalidInput"),
        (["--db", db, "start", c + "-0000-4000-8000-000000000000"], {}, "InvalidInput"),
        (["--db", db, "get", tid, c], {}, "InvalidInput"),
        (["--db", db, "close", tid, "--status", c], {}, "InvalidInput"),
        (["--db", db, "close", tid, "--status", "succeeded", "--code", c], {}, "InvalidInput"),
        (["--db", db, "delivery", tid, "--status", c], {}, "InvalidInput"),
        (["--db", db, "create", "--name", c + " with spaces"], {}, "InvalidInput"),
        (["--db", db, "create", "--timeout-seconds", c], {}, "InvalidInput"),
        (["--db", db, "create", "--timeout-seconds", "nan"], {}, "InvalidInput"),
        (["--db", db, "create", "--payload-sha256", c], {}, "InvalidInput"),
        (["--db", db, "create", "--parent", c], {}, "InvalidInput"),
        (["--db", db, "create", "--id", c], {}, "InvalidInput"),
        (["--db", db, "--" + c], {}, "InvalidInput"),
        (["--db", db, c], {}, "InvalidInput"),
        ([c], {}, "InvalidInput"),
        ([], {}, "InvalidInput"),
        (["--db", db, "reconcile", "--active-grace-seconds", c], {}, "InvalidInput"),
        (["--db", db, "reconcile", "--delivery-grace-seconds", "-5"], {}, "InvalidInput"),
        (["--db", db, "reconcile", "--dry-run", "--" + c], {}, "InvalidInput"),
        (["--db", db, "tasks", "--status", c], {}, "InvalidInput"),
        (["--db", db, "tasks", "--status", "queued", "--stale-seconds", c], {}, "InvalidInput"),
        (["--db", db, "tasks", "--status", "queued", "--limit", c], {}, "InvalidInput"),
        (["--db", db, "tasks"], {}, "InvalidInput"),
        (["--db", db, "status", "--format", c], {}, "InvalidInput"),
        (["--db", db, "prune", "--older-than", c], {}, "InvalidInput"),
        (["--db", db, "prune"], {}, "InvalidInput"),
        (["--db", db, "--busy-timeout-ms", c, "doctor"], {}, "InvalidInput"),
        (["--db", db, "reconcile"], {"TSG_ACTIVE_GRACE_SECONDS": c}, "InvalidInput"),
        (["--db", db, "reconcile", "--dry-run"], {"TSG_DELIVERY_GRACE_SECONDS": c},
         "InvalidInput"),
        (["get", tid], {"TSG_DB": db + c}, "InvalidInput"),
        (["--db", os.path.join(os.path.dirname(db), c, "x.sqlite"), "doctor"], {},
         "InvalidInput"),
        (["doctor"], {}, "InvalidInput"),
    ]


@pytest.mark.sqlite_only(reason="rejected SQLite paths are among the values never echoed")
def test_rejected_values_and_paths_never_echoed(tmp_path) -> None:
    db = str(tmp_path / "d" / "tasks.sqlite")
    tid = ok(run_cli("--db", db, "create"))["task"]["id"]
    cases = _bad_invocations(db, tid)
    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(lambda c: run_cli(*c[0], env=cli_env(c[1])), cases))
    for (args, _extra, error), result in zip(cases, results, strict=True):
        assert_cli_error(result, error)
        assert CANARY not in result.stdout and CANARY not in result.stderr, args
        assert db not in result.stdout
    # a database that is a link alias: the error names only its category (a StateConflict,
    # as in 0.1.0)
    link = os.path.join(os.path.dirname(db), CANARY + ".sqlite")
    os.symlink(db, link)
    for args in (["init"], ["doctor"], ["create"]):
        result = run_cli("--db", link, *args)
        assert_cli_error(result, "StateConflict")
        assert CANARY not in result.stdout + result.stderr
    assert ok(run_cli("--db", db, "get", tid))["task"]["status"] == "queued"


def internal_error_cli(raised: str) -> Callable[..., subprocess.CompletedProcess[str]]:
    """The CLI in a process whose ``Ledger.get_task`` raises ``raised`` (an expression) with
    the canary and its arguments in the message."""
    script = (
        "import runpy, sqlite3, sys\n"
        "import task_state_guard.ledger as ledger_module\n"
        "def boom(*args, **kwargs):\n"
        f"    raise ({raised})('{CANARY} ' + repr(args))\n"
        "ledger_module.Ledger.get_task = boom\n"
        "sys.argv[0] = 'task_state_guard'\n"
        "runpy.run_module('task_state_guard', run_name='__main__', alter_sys=True)\n"
    )

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-c", script, *args], capture_output=True,
                              text=True, env=cli_env(), check=False, timeout=60)

    return cli


def test_unexpected_error_is_internal_error_exit_3(db: str) -> None:
    tid = ok(run_cli("--db", db, "create"))["task"]["id"]
    proc = internal_error_cli("RuntimeError")("--db", db, "get", tid)
    assert proc.returncode == 3
    assert proc.stderr == ""
    assert proc.stdout == '{"error":"InternalError","ok":false}\n'
    assert CANARY not in proc.stdout and tid not in proc.stdout


@pytest.mark.parametrize(
    ("raised", "named"),
    [
        # a class of the process's own: its nearest built-in base is named, never its own name
        (f"type('{CANARY}', (ConnectionResetError,), {{}})", "ConnectionResetError"),
        ("MemoryError", "MemoryError"),  # what SQLite's own allocation failure raises
        (f"type('{CANARY}', (sqlite3.OperationalError,), {{}})", "sqlite3.OperationalError"),
    ],
    ids=["own-class", "memory", "untranslated-sqlite"],
)
def test_an_internal_error_names_its_standard_class_when_asked(
    db: str, raised: str, named: str
) -> None:
    tid = ok(run_cli("--db", db, "create"))["task"]["id"]
    cli = internal_error_cli(raised)
    for proc, expected in (
        (cli("--db", db, "get", tid), '{"error":"InternalError","ok":false}\n'),
        (cli("--explain", "--db", db, "get", tid),
         f'{{"error":"InternalError","exception":"{named}","ok":false}}\n'),
        (cli("--explain", "--db", db, "get", tid, "--format", "text"),
         f"error: InternalError\nexception: {named}\n"),
        (cli("--db", db, "get", tid, "--format", "text"), "error: InternalError\n"),
    ):
        assert (proc.returncode, proc.stdout, proc.stderr) == (3, expected, "")
        assert CANARY not in proc.stdout and tid not in proc.stdout


@pytest.mark.sqlite_only(reason="tampers with the SQLite file (sqlite3)")
def test_unhealthy_doctor_exits_1(tmp_path) -> None:
    import sqlite3

    db = str(tmp_path / "d" / "tasks.sqlite")
    ok(run_cli("--db", db, "create"))
    conn = sqlite3.connect(db)
    conn.execute("DELETE FROM tsg_events")
    conn.commit()
    conn.close()
    payload = ok(run_cli("--db", db, "doctor"), code=1)
    assert payload["ok"] is False and payload["healthy"] is False


# ----------------------------------------------------------------------------- never create


READ_COMMANDS = [
    ["get", "00000000-0000-4000-8000-000000000000"],
    ["children", "00000000-0000-4000-8000-000000000000"],
    ["tasks", "--status", "queued"],
    ["status"],
    ["status", "--format", "text"],
    ["metrics"],
    ["doctor"],
    ["reconcile", "--dry-run"],
    ["prune", "--older-than", "10", "--dry-run"],
]


@pytest.mark.sqlite_only(reason="a missing SQLite path and its directory stay missing")
@pytest.mark.parametrize("args", READ_COMMANDS, ids=lambda a: "-".join(a[:2]))
def test_read_commands_never_create_a_database(tmp_path, args: list[str]) -> None:
    missing_dir = tmp_path / "missing" / "tasks.sqlite"
    assert_cli_error(run_cli("--db", str(missing_dir), *args), "InvalidInput")
    assert not os.path.exists(tmp_path / "missing")
    existing = tmp_path / "present"
    existing.mkdir(mode=0o700)
    before = sorted(os.listdir(existing))
    assert_cli_error(run_cli("--db", str(existing / "tasks.sqlite"), *args), "InvalidInput")
    assert sorted(os.listdir(existing)) == before == []
    result = run_cli(*args, env=cli_env({"TSG_DB": str(existing / "tasks.sqlite")}))
    assert_cli_error(result, "InvalidInput")
    assert os.listdir(existing) == []


@pytest.mark.postgresql_only
@pytest.mark.parametrize("args", READ_COMMANDS, ids=lambda a: "-".join(a[:2]))
def test_read_commands_never_create_a_postgresql_ledger(db: str, args: list[str]) -> None:
    """A missing ledger (its schema does not exist) is the same InvalidInput as a missing
    SQLite file, and a read command creates nothing."""
    assert_cli_error(run_cli("--db", db, *args), "InvalidInput")
    assert_cli_error(run_cli(*args, env=cli_env({"TSG_DB": db})), "InvalidInput")
    assert not pg_schema_exists(db)


# ----------------------------------------------------------------------------- environment


def test_tsg_db_env_and_flag_precedence(tmp_path, backend: str, db: str) -> None:
    with ledger_target(backend, tmp_path / "flag") as flag_db:
        _env_and_flag(db, flag_db)


def _env_and_flag(env_db: str, flag_db: str) -> None:
    env = cli_env({"TSG_DB": env_db})
    tid = ok(run_cli("create", env=env))["task"]["id"]
    assert ok(run_cli("get", tid, env=env))["task"]["id"] == tid
    ok(run_cli("--db", flag_db, "init", env=env))
    assert_cli_error(run_cli("--db", flag_db, "get", tid, env=env), "TaskNotFound")
    assert ok(run_cli("--db", env_db, "get", tid))["task"]["id"] == tid


def _ledger_with_stale_work(db: str, age: float) -> None:
    """A running task last seen ``age`` seconds ago and a pending delivery of that age."""
    with Ledger(db, clock=Clock(time.time() - age)) as led:
        running = led.create_task()
        led.start_task(running.id, owner=False)
        done = led.create_task()
        led.close_task(done.id, "succeeded")


def test_grace_from_env_and_flags(db: str) -> None:
    _ledger_with_stale_work(db, 1000)

    def preview(*flags: str, **env: str) -> dict:
        result = run_cli("--db", db, "reconcile", "--dry-run", *flags, env=cli_env(env))
        return ok(result)["reconcile"]

    assert preview()["tasks_timed_out"] == 1  # default 600 s grace
    assert preview(TSG_ACTIVE_GRACE_SECONDS="5000")["tasks_timed_out"] == 0
    assert preview(TSG_ACTIVE_GRACE_SECONDS="500")["tasks_timed_out"] == 1
    assert preview("--active-grace-seconds", "5000",
                   TSG_ACTIVE_GRACE_SECONDS="500")["tasks_timed_out"] == 0
    report = preview(TSG_DELIVERY_GRACE_SECONDS="5000")
    assert report["deliveries_failed"] == 0 and report["pending_delivery_retained"] == 2
    report = preview(TSG_DELIVERY_GRACE_SECONDS="500", TSG_ACTIVE_GRACE_SECONDS="5000")
    assert report["deliveries_failed"] == 1
    report = preview("--delivery-grace-seconds", "5000", TSG_DELIVERY_GRACE_SECONDS="500")
    assert report["deliveries_failed"] == 0
    applied = ok(run_cli("--db", db, "reconcile",
                         env=cli_env({"TSG_ACTIVE_GRACE_SECONDS": "5000"})))["reconcile"]
    assert applied["tasks_timed_out"] == 0 and applied["applied"] is True
    stale = ok(run_cli("--db", db, "tasks", "--status", "running", "--stale-seconds", "500"))
    assert len(stale["task_ids"]) == 1
    none = ok(run_cli("--db", db, "tasks", "--status", "running", "--stale-seconds", "5000"))
    assert none["task_ids"] == []
    applied = ok(run_cli("--db", db, "reconcile", "--active-grace-seconds", "900"))["reconcile"]
    assert applied["tasks_timed_out"] == 1


def test_status_and_metrics_text_outputs(db: str) -> None:
    tid = ok(run_cli("--db", db, "create", "--name", "app.job"))["task"]["id"]
    for args in (["status", "--format", "text"], ["metrics"]):
        result = run_cli("--db", db, *args)
        assert result.code == 0 and result.stderr == ""
        assert tid not in result.stdout and db not in result.stdout
        assert "app.job" in result.stdout
