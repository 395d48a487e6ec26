"""The CLI at its edges, as a user runs it: odd digits in every numeric option, help and
progress into outputs that cannot take them, an invalid ``TSG_EXPLAIN``, a listen address in
use, database URLs of other schemes, and ``tsg get ID`` with any framework's job id."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from core_helpers import (
    CliResult,
    assert_cli_error,
    assert_cli_text_error,
    assert_json_line,
    cli_env,
    is_sqlite,
    run_cli,
)
from task_state_guard import Ledger
from task_state_guard.integration import job_task_id

#: Numbers no numeric option takes: past int()'s 4,300 digits, a superscript, Arabic-Indic
#: and full-width digits (str.isdigit() says True of each), and a number out of range.
ODD_NUMBERS = ("1" * 4301, "\u00b2", "\u0663", "\uff11", "9" * 25)


def _numeric_options(db: str) -> list[list[str]]:
    """Every command line with a numeric option, the value at ``{}``."""
    return [
        ["--busy-timeout-ms", "{}", "--db", db, "status"],
        ["--db", db, "tasks", "--status", "queued", "--limit", "{}"],
        ["--db", db, "tasks", "--details", "--limit", "{}"],
        ["--db", db, "tasks", "--status", "queued", "--stale-seconds", "{}"],
        ["--db", db, "tasks", "--status", "queued", "--older-than", "{}"],
        ["--db", db, "create", "--timeout-seconds", "{}"],
        ["--db", db, "reconcile", "--active-grace-seconds", "{}"],
        ["--db", db, "reconcile", "--delivery-grace-seconds", "{}"],
        ["--db", db, "status", "--active-grace-seconds", "{}"],
        ["--db", db, "metrics", "--active-grace-seconds", "{}"],
        ["--db", db, "prune", "--older-than", "{}"],
        ["--db", db, "serve", "--listen", "127.0.0.1:{}"],
        ["--db", db, "serve", "--refresh", "{}"],
        ["--db", db, "serve", "--active-grace-seconds", "{}"],
        ["--db", db, "metrics", "--serve", "--listen", "127.0.0.1:{}"],
    ]


def test_every_numeric_option_refuses_odd_digits_as_invalid_value(db: str) -> None:
    """Each is a fixed usage error (exit 2, ``invalid_value``), never an internal error (3),
    and changes nothing."""
    assert_json_line(run_cli("--db", db, "init"))
    for argv in _numeric_options(db):
        for value in ODD_NUMBERS:
            if value == "9" * 25 and "create" in argv:
                continue  # create --timeout-seconds takes any finite duration, as 0.1.0 did
            line = [part.replace("{}", value) for part in argv]
            result = run_cli("--explain", *line)
            assert_cli_error(result, "InvalidInput", reason="invalid_value")
            assert value not in result.stdout
    env = cli_env({"TSG_ACTIVE_GRACE_SECONDS": "\u0663"})
    assert_cli_error(
        run_cli("--explain", "--db", db, "status", env=env), "InvalidInput", reason="invalid_value"
    )
    assert assert_json_line(run_cli("--db", db, "tasks", "--status", "queued")) == {
        "ok": True,
        "task_ids": [],
    }  # no create went through


def test_help_and_version_into_a_full_stdout_exit_3() -> None:
    for argv in (["--help"], ["--version"], ["status", "--help"], ["serve", "-h"]):
        done = subprocess.run(
            ["sh", "-c", '"$0" -m task_state_guard "$@" > /dev/full', sys.executable, *argv],
            capture_output=True,
            text=True,
            env=cli_env(),
            timeout=60,
            check=False,
        )
        assert (done.returncode, done.stderr) == (3, ""), argv
        closed = subprocess.run(
            ["sh", "-c", '"$0" -m task_state_guard "$@" >&-', sys.executable, *argv],
            capture_output=True,
            text=True,
            env=cli_env(),
            timeout=60,
            check=False,
        )
        assert (closed.returncode, closed.stderr) == (3, ""), argv
    assert run_cli("--help").code == 0  # an output that takes it: exit 0 as before


def _stale(db: str) -> str:
    assert_json_line(run_cli("--db", db, "init"))
    task = assert_json_line(run_cli("--db", db, "create"))["task"]["id"]
    assert_json_line(run_cli("--db", db, "start", task))
    return str(task)


@pytest.mark.parametrize("stderr", ["closed", "broken pipe", "full"])
def test_progress_into_a_stderr_that_cannot_take_it_is_dropped(db: str, stderr: str) -> None:
    task = _stale(db)
    argv = [sys.executable, "-m", "task_state_guard", "--db", db]
    for command in (
        ["reconcile", "--active-grace-seconds", "0", "--progress"],
        ["prune", "--older-than", "0", "--progress"],
    ):
        if stderr == "closed":
            done = subprocess.run(
                ["sh", "-c", '"$0" "$@" 2>&-', *argv, *command],
                capture_output=False,
                stdout=subprocess.PIPE,
                text=True,
                env=cli_env(),
                timeout=60,
                check=False,
            )
        elif stderr == "full":
            done = subprocess.run(
                ["sh", "-c", '"$0" "$@" 2>/dev/full', *argv, *command],
                stdout=subprocess.PIPE,
                text=True,
                env=cli_env(),
                timeout=60,
                check=False,
            )
        else:
            read, write = os.pipe()
            os.close(read)  # every write to it is EPIPE
            try:
                done = subprocess.run(
                    [*argv, *command],
                    stdout=subprocess.PIPE,
                    stderr=write,
                    text=True,
                    env=cli_env(),
                    timeout=60,
                    check=False,
                )
            finally:
                os.close(write)
        assert done.returncode == 0, (command, done.stdout)
        assert assert_json_line(CliResult(0, done.stdout, ""))["ok"] is True
    with Ledger(db, read_only=True) as led:
        assert led.get_task(task).status == "timed_out"  # the pass itself ran


def test_an_invalid_tsg_explain_is_a_usage_error_without_a_reason_unless_asked(db: str) -> None:
    """The reason is added only when asked for (``--explain``, a valid ``TSG_EXPLAIN``, or
    ``--format text``): an invalid ``TSG_EXPLAIN`` is refused with the default line."""
    assert_json_line(run_cli("--db", db, "init"))
    for value in ("maybe", "2", "\u0661", "yes please"):
        env = cli_env({"TSG_EXPLAIN": value})
        assert_cli_error(run_cli("--db", db, "status", env=env), "InvalidInput")
        assert_cli_error(
            run_cli("--explain", "--db", db, "status", env=env),
            "InvalidInput",
            reason="invalid_value",
        )
        assert_cli_text_error(
            run_cli("--db", db, "status", "--format", "text", env=env),
            "InvalidInput",
            reason="invalid_value",
        )


@pytest.mark.no_ledger(reason="the listen address is refused before any ledger is opened")
def test_a_listen_port_in_use_has_its_reason(tmp_path: Path) -> None:
    db = str(tmp_path / "d" / "tasks.sqlite")
    assert_json_line(run_cli("--db", db, "init"))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        for argv in (["serve"], ["metrics", "--serve"]):
            listen = ["--listen", f"127.0.0.1:{port}"]
            assert_cli_error(
                run_cli("--explain", "--db", db, *argv, *listen),
                "InvalidInput",
                reason="address_in_use",
            )
            assert_cli_error(run_cli("--db", db, *argv, *listen), "InvalidInput")
    # an address that is not this host's has a reason of its own (TEST-NET-1, RFC 5737)
    token = tmp_path / "token"
    token.write_text("t" * 8 + "0123456789abcdef\n")
    token.chmod(0o600)
    assert_cli_error(
        run_cli(
            "--explain", "--db", db, "serve", "--listen", "192.0.2.7:0", "--token-file", str(token)
        ),
        "InvalidInput",
        reason="address_not_available",
    )


@pytest.mark.no_ledger(reason="URLs of unknown schemes are refused before any file is made")
def test_a_database_url_of_an_unknown_scheme_is_refused_never_a_path(tmp_path: Path) -> None:
    for url in (
        "postgresql+asyncpg://user:PW-9q@host/db",
        "mysql://user:PW-9q@host/db",
        "sqlite:///tasks.sqlite",
        "HTTP://user:PW-9q@host/db",
    ):
        for argv in (["init"], ["create"], ["status"], ["doctor"]):
            result = subprocess.run(
                [sys.executable, "-m", "task_state_guard", "--explain", "--db", url, *argv],
                capture_output=True,
                text=True,
                env=cli_env(),
                timeout=60,
                check=False,
                cwd=tmp_path,
            )
            assert_cli_error(
                CliResult(result.returncode, result.stdout, result.stderr),
                "InvalidInput",
                reason="unsupported_url_scheme",
            )
            assert "PW-9q" not in result.stdout
    assert os.listdir(tmp_path) == []  # no directory was made of a URL
    # a one-letter scheme is a Windows drive written with slashes: still a path
    drive = tmp_path / "C:" / "data"
    assert_json_line(run_cli("--db", str(drive / "tasks.sqlite"), "init"))


def _job_ledger(db: str) -> dict[str, str]:
    ids = {
        "celery": job_task_id("celery", "report-7f3a"),
        "dramatiq": job_task_id("dramatiq", "shared-id-1"),
        "langgraph": job_task_id("langgraph", "shared-id-1"),
    }
    with Ledger(db) as led:
        for task_id in ids.values():
            led.create_task(task_id=task_id)
        ids["plain"] = led.create_task().id
    return ids


def test_get_finds_a_task_by_its_ledger_id_or_any_frameworks_job_id(db: str) -> None:
    ids = _job_ledger(db)
    by_celery = assert_json_line(run_cli("--db", db, "get", "report-7f3a"))
    assert by_celery["task"]["id"] == ids["celery"]
    assert by_celery == assert_json_line(run_cli("--db", db, "get", "--celery", "report-7f3a"))
    assert assert_json_line(run_cli("--db", db, "get", ids["plain"]))["task"]["id"] == ids["plain"]
    assert (
        assert_json_line(run_cli("--db", db, "get", ids["plain"].upper()))["task"]["id"]
        == ids["plain"]
    )
    children = assert_json_line(run_cli("--db", db, "children", "report-7f3a"))
    assert children == {"children": [], "ok": True}
    text = run_cli("--db", db, "get", "report-7f3a", "--events", "--format", "text")
    assert text.code == 0 and ids["celery"] in text.stdout and "report-7f3a" not in text.stdout
    # two frameworks know the same id: refused, and naming the framework answers
    ambiguous = run_cli("--explain", "--db", db, "get", "shared-id-1")
    assert_cli_error(ambiguous, "InvalidInput", reason="ambiguous_id")
    assert "shared-id-1" not in ambiguous.stdout
    assert_cli_error(run_cli("--db", db, "get", "shared-id-1"), "InvalidInput")
    assert (
        assert_json_line(run_cli("--db", db, "get", "--dramatiq", "shared-id-1"))["task"]["id"]
        == ids["dramatiq"]
    )
    # unknown everywhere: TaskNotFound, the id never repeated
    missing = run_cli("--explain", "--db", db, "get", "no-such-job-42")
    assert_cli_error(missing, "TaskNotFound")
    assert "no-such-job-42" not in missing.stdout
    # a task id and a framework option together is still refused
    assert_cli_error(
        run_cli("--explain", "--db", db, "get", "x", "--celery", "x"),
        "InvalidInput",
        reason="unexpected_argument",
    )
    if is_sqlite(db):
        assert not os.path.exists(db + "-wal")  # a read: nothing left behind
