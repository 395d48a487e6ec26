"""What a 0.1.0 user's tooling sees of an error, and what an operator can ask for.

By default the CLI's error line is exactly the specification's ``{"error":"<category>",
"ok":false}``; ``--explain`` (a global option) or ``TSG_EXPLAIN=1`` adds the reason;
``--format text`` prints the category, the reason, what failed and its fix. Python exceptions
always carry ``.reason``. A stdout that cannot take the output (closed, full) is the contract's
internal failure: exit 3, nothing on stderr.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from core_helpers import (
    Clock,
    assert_cli_error,
    assert_cli_text_error,
    assert_json_line,
    cli_env,
    run_cli,
)
from task_state_guard import InvalidInput, Ledger, reasons
from task_state_guard.cli.reason_help import HELP

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.sqlite_only(reason="the error lines of a missing SQLite path")
def test_the_default_error_line_is_exactly_the_specifications(tmp_path: Path) -> None:
    missing = str(tmp_path / "nowhere" / "tasks.sqlite")
    for argv in (["--db", missing, "status"], ["stauts"], ["--db", missing, "bogus"], ["init"]):
        result = run_cli(*argv)
        assert result.stdout == '{"error":"InvalidInput","ok":false}\n', argv
        assert result.code == 2 and result.stderr == ""
    # a storage error and a task error look the same way
    db = str(tmp_path / "d" / "tasks.sqlite")
    assert_json_line(run_cli("--db", db, "init"))
    assert run_cli("--db", db, "get", "6f1c1d4e-4a5b-4c6d-8e9f-0a1b2c3d4e5f").stdout == (
        '{"error":"TaskNotFound","ok":false}\n')


@pytest.mark.sqlite_only(reason="the error lines of a missing SQLite path")
def test_explain_and_tsg_explain_add_the_reason(tmp_path: Path) -> None:
    missing = str(tmp_path / "nowhere" / "tasks.sqlite")
    for result in (
        run_cli("--explain", "--db", missing, "status"),
        run_cli("--db", missing, "--explain", "status"),
        run_cli("--db", missing, "status", env=cli_env({"TSG_EXPLAIN": "1"})),
        run_cli("--db", missing, "status", env=cli_env({"TSG_EXPLAIN": "true"})),
    ):
        assert_cli_error(result, "InvalidInput", reason="directory_missing")
    for off in ("0", "false", "", "no"):
        assert_cli_error(run_cli("--db", missing, "status", env=cli_env({"TSG_EXPLAIN": off})),
                         "InvalidInput")
    # an unknown TSG_EXPLAIN value is refused: the default line (a reason only with --explain)
    refused = run_cli("--db", missing, "status", env=cli_env({"TSG_EXPLAIN": "maybe"}))
    assert_cli_error(refused, "InvalidInput")
    # a task error has no reason to add
    db = str(tmp_path / "d" / "tasks.sqlite")
    assert_json_line(run_cli("--db", db, "init"))
    assert_cli_error(run_cli("--explain", "--db", db, "get",
                             "6f1c1d4e-4a5b-4c6d-8e9f-0a1b2c3d4e5f"), "TaskNotFound")


@pytest.mark.sqlite_only(reason="the error lines of a missing SQLite path")
def test_format_text_shows_the_class_the_reason_and_its_fix(tmp_path: Path) -> None:
    missing = str(tmp_path / "nowhere" / "tasks.sqlite")
    result = run_cli("--db", missing, "status", "--format", "text")
    assert_cli_text_error(result, "InvalidInput", reason="directory_missing")
    assert result.stdout.splitlines()[2] == (
        "fix: run `tsg init` first (it creates the directory 0700), or fix the path")
    assert str(tmp_path) not in result.stdout
    # a refused command line that asked for text gets text too
    assert_cli_text_error(run_cli("--db", missing, "tasks", "--format", "text", "--bogus"),
                          "InvalidInput", reason="unknown_option")
    db = str(tmp_path / "d" / "tasks.sqlite")
    assert_json_line(run_cli("--db", db, "init"))
    unknown = run_cli("--db", db, "get", "6f1c1d4e-4a5b-4c6d-8e9f-0a1b2c3d4e5f", "--format",
                      "text")
    assert unknown.stdout == "error: TaskNotFound\n" and unknown.code == 2


def test_tasks_names_the_option_it_misses(db: str) -> None:
    """The id list needs ``--status``; ``--attempts`` lists rows, so it needs ``--details`` (or
    ``--format text``): each refusal says an option is missing, not that a value was bad."""
    assert_json_line(run_cli("--db", db, "init"))
    for argv in (["tasks"], ["tasks", "--name", "report.build"],
                 ["tasks", "--status", "running", "--attempts"], ["tasks", "--attempts"]):
        assert_cli_error(run_cli("--explain", "--db", db, *argv), "InvalidInput",
                         reason="missing_argument")
        assert_cli_error(run_cli("--db", db, *argv), "InvalidInput")  # 0.1.0's line by default
    # a state that is not one is still a bad value; the rows it asks for are fine
    assert_cli_error(run_cli("--explain", "--db", db, "tasks", "--status", "stuck"),
                     "InvalidInput", reason="invalid_value")
    assert assert_json_line(run_cli("--db", db, "tasks", "--status", "running", "--attempts",
                                    "--details"))["ok"] is True
    assert assert_json_line(run_cli("--db", db, "tasks", "--status", "running")) == {
        "ok": True, "task_ids": []}
    helped = subprocess.run([sys.executable, "-m", "task_state_guard", "tasks", "--help"],
                            capture_output=True, text=True, env=cli_env(), timeout=60,
                            check=True).stdout
    assert "needs --details or --format text" in " ".join(helped.split())


@pytest.mark.sqlite_only(reason="the errors of a missing SQLite path")
def test_exceptions_keep_their_reason(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput) as info:
        Ledger(str(tmp_path / "nowhere" / "tasks.sqlite"), read_only=True)
    assert info.value.reason == reasons.DIRECTORY_MISSING


def _readme_help() -> dict[str, tuple[str, str]]:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text.split("### Error reasons", 1)[1].split("\n#", 1)[0]
    rows = re.findall(r"^\| `([a-z_]+)` \| [A-Za-z]+ \| (.+?) \| (.+) \|$", section,
                      flags=re.MULTILINE)
    return {name: (what, fix) for name, what, fix in rows}


def test_every_reason_has_its_help_and_the_readme_shows_the_same() -> None:
    assert set(HELP) == reasons.ALL
    assert _readme_help() == HELP


# ----------------------------------------------------------------------------- stdout


def _stale_ledger(db: str) -> tuple[str, str]:
    with Ledger(db, clock=Clock(1_000.0)) as led:
        task = led.create_task(timeout_seconds=10)
        led.start_task(task.id, owner=False)
    return db, task.id


def _shell(command: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m task_state_guard ARGS`` with its stdout redirected by the shell."""
    return subprocess.run(["sh", "-c", f'"$0" -m task_state_guard "$@" {command}',
                           sys.executable, *args], capture_output=True, text=True,
                          env=cli_env(), timeout=60, check=False)


@pytest.mark.parametrize("command", ["status", "doctor", "reconcile", "init"])
def test_a_closed_stdout_is_an_internal_failure_and_nothing_runs(
    db: str, command: str
) -> None:
    db, tid = _stale_ledger(db)
    done = _shell(">&-", "--db", db, command)
    assert (done.returncode, done.stderr) == (3, "")
    with Ledger(db, read_only=True) as led:  # nothing could be reported, so nothing was done
        assert led.get_task(tid).status == "running"


@pytest.mark.parametrize("argv", [["status"], ["reconcile"], ["--explain", "stauts"],
                                  ["metrics"], ["status", "--format", "text"]])
def test_a_full_stdout_is_an_internal_failure_without_a_traceback(
    db: str, argv: list[str]
) -> None:
    db, tid = _stale_ledger(db)
    done = _shell("> /dev/full", "--db", db, *argv)
    assert (done.returncode, done.stderr) == (3, "")
    if argv == ["reconcile"]:  # the pass ran; only its report was lost (exit 3 says so)
        with Ledger(db, read_only=True) as led:
            assert led.get_task(tid).status == "timed_out"
