"""examples/deploy/entrypoint.sh, run for real: a ledger with a killed and a live owner, the
real ``tsg`` on PATH, and a real command that the script must ``exec``."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from deploy_helpers import ENTRYPOINT, Ledgers, base_env, json_lines, tsg

HOLDER = """
import sys, time
from task_state_guard import Ledger
ledger = Ledger(sys.argv[1])
task = ledger.create_task(name="report.build")
ledger.start_task(task.id)          # this process becomes the task's owner
print(task.id, flush=True)
time.sleep(600)
"""

#: the "worker": prints its pid (the entrypoint's pid when it was exec'd) and exits with 7
WORKER = "import os; print('worker', os.getpid(), flush=True); raise SystemExit(7)"


def _holder(db: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, db], stdout=subprocess.PIPE, text=True, env=base_env()
    )
    assert proc.stdout is not None
    return proc, proc.stdout.readline().strip()


@pytest.fixture
def owners(ledgers: Ledgers) -> Iterator[tuple[str, str]]:
    """One task whose owner was SIGKILLed, one whose owner is alive: (dead id, live id)."""
    tsg(ledgers.db, "init")
    dead, dead_id = _holder(ledgers.db)
    dead.kill()
    dead.wait(30)
    live, live_id = _holder(ledgers.db)
    try:
        yield dead_id, live_id
    finally:
        live.kill()
        live.wait(30)


def _run(
    db: str | None, *command: str, mode: str | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    env = base_env()
    if db is not None:
        env["TSG_DB"] = db
    if mode is not None:
        env["TSG_RECONCILE"] = mode
    return subprocess.run(
        ["sh", str(ENTRYPOINT), *command], env=env, capture_output=True, text=True,
        timeout=120, cwd=cwd,
    )


def _popen(db: str, *command: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        ["sh", str(ENTRYPOINT), *command], env=base_env(TSG_DB=db),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def test_apply_closes_the_dead_owners_task_keeps_the_live_one_and_execs(
    ledgers: Ledgers, owners: tuple[str, str]
) -> None:
    dead_id, live_id = owners
    proc = _popen(ledgers.db, sys.executable, "-c", WORKER)
    out, err = proc.communicate(timeout=120)
    assert err == ""
    assert proc.returncode == 7  # the worker's own exit status: it replaced the shell
    preview, applied = json_lines(out)
    assert preview["reconcile"]["dry_run"] is True
    assert preview["reconcile"]["tasks_timed_out"] == 1
    assert preview["reconcile"]["fresh_active_retained"] == 1
    assert applied["reconcile"]["applied"] is True
    assert applied["reconcile"]["tasks_timed_out"] == 1
    assert applied["reconcile"]["fresh_active_retained"] == 1
    # exec: the worker runs as the entrypoint's own process (the container's signal target)
    assert out.splitlines()[-1] == f"worker {proc.pid}"
    assert dead_id not in out and live_id not in out  # counts only

    dead = tsg(ledgers.db, "get", dead_id)["task"]
    assert (dead["status"], dead["terminal_code"]) == ("timed_out", "owner_lost")
    assert tsg(ledgers.db, "get", live_id)["task"]["status"] == "running"
    assert tsg(ledgers.db, "doctor")["ok"] is True


def test_preview_mode_only_logs_the_preview(ledgers: Ledgers, owners: tuple[str, str]) -> None:
    dead_id, _live_id = owners
    done = _run(ledgers.db, sys.executable, "-c", WORKER, mode="preview")
    assert done.returncode == 7, done.stdout + done.stderr
    (preview,) = json_lines(done.stdout)
    assert preview["reconcile"]["dry_run"] is True
    assert preview["reconcile"]["tasks_timed_out"] == 1
    # Left for the worker's boot reconcile: still running here.
    assert tsg(ledgers.db, "get", dead_id)["task"]["status"] == "running"


@pytest.mark.sqlite_only(reason="the volume's directory and file modes")
def test_a_fresh_volume_gets_a_private_ledger(ledgers: Ledgers) -> None:
    done = _run(ledgers.db, sys.executable, "-c", WORKER)
    assert done.returncode == 7, done.stdout + done.stderr
    preview, applied = json_lines(done.stdout)
    assert preview["reconcile"]["active_examined"] == 0
    assert applied["reconcile"]["applied"] is True
    directory = Path(ledgers.db).parent
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert stat.S_IMODE(Path(ledgers.db).stat().st_mode) == 0o600


def test_sigterm_reaches_the_worker_itself(ledgers: Ledgers) -> None:
    """No shell in between: the container's SIGTERM starts the worker's graceful shutdown."""
    worker = (
        "import signal, sys, time\n"
        "def stop(signum, frame):\n"
        "    print('graceful shutdown', flush=True); sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, stop)\n"
        "print('ready', flush=True)\n"
        "time.sleep(120)\n"
    )
    proc = _popen(ledgers.db, sys.executable, "-c", worker)
    assert proc.stdout is not None
    lines = []
    while True:
        line = proc.stdout.readline()
        assert line, "the worker never started"
        lines.append(line.strip())
        if line.strip() == "ready":
            break
    os.kill(proc.pid, signal.SIGTERM)
    out, _err = proc.communicate(timeout=60)
    assert proc.returncode == 0
    assert out.strip() == "graceful shutdown"


@pytest.mark.parametrize(
    ("setup", "mode", "code"),
    [
        ("no-db", None, 64),
        ("unsafe-directory", None, 2),
        ("bad-mode", "always", 64),
        ("no-command", None, 64),
    ],
)
@pytest.mark.sqlite_only(reason="refusals of the volume's path; nothing created on it")
def test_a_refusal_never_starts_the_worker(
    ledgers: Ledgers, tmp_path: Path, setup: str, mode: str | None, code: int
) -> None:
    marker = tmp_path / "worker-ran"
    command: tuple[str, ...] = (sys.executable, "-c", f"open({str(marker)!r}, 'w').close()")
    db: str | None = ledgers.db
    if setup == "no-db":
        db = None
    elif setup == "unsafe-directory":
        shared = ledgers.data / "shared"
        shared.mkdir()
        shared.chmod(0o777)  # writable by every user: tsg refuses it
        db = str(shared / "tasks.sqlite")
    elif setup == "no-command":
        command = ()
    done = _run(db, *command, mode=mode)
    assert done.returncode == code
    if setup == "unsafe-directory":
        assert json.loads(done.stdout) == {
            "error": "InvalidInput", "ok": False, "reason": "directory_writable_by_others"}
        assert str(ledgers.data) not in done.stdout + done.stderr  # no path echoed
    assert not marker.exists()
    assert not Path(ledgers.db).exists() or setup == "unsafe-directory"


def test_containers_starting_together_on_a_fresh_volume(tmp_path: Path) -> None:
    """shared-ledger-pod.yaml: its containers start at once on an empty emptyDir; every
    entrypoint creates or finds the ledger and starts its worker."""
    for round_ in range(3):
        db = str(tmp_path / f"volume{round_}" / "tsg" / "tasks.sqlite")
        (tmp_path / f"volume{round_}").mkdir(mode=0o700)
        procs = [_popen(db, sys.executable, "-c", WORKER) for _ in range(3)]
        for proc in procs:
            out, err = proc.communicate(timeout=120)
            assert proc.returncode == 7, out + err
            assert [line["reconcile"]["dry_run"] for line in json_lines(out)] == [True, False]
        assert tsg(db, "doctor")["ok"] is True
