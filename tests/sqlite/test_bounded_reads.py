"""Read commands on a cleanly closed ledger run in bounded memory and leave nothing behind.

A ledger of 100,000 tasks (about 45 MB, built through the public API) is closed, then every read
command runs in a child process whose peak RSS (its own VmHWM) must stay under 64 MB: a closed
ledger is read in place through transient private sidecars, never copied into memory. After each
command the directory holds exactly the entries it held before, with the same bytes, modes,
owners and times, and an old-schema ledger stays old. A dry-run creates nothing at all: on a
closed ledger it loads the verified private in-memory snapshot (so it is bounded by the snapshot
limit: a larger file fails closed), on a live ledger it reads through SQLite's read-only WAL
access in bounded memory.
A writer that starts during a read keeps working, and sidecars that a killed reader left behind
break neither the next reader nor the next writer.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from core_helpers import T0, Clock, assert_json_line, cli_env, run_cli, sidecars
from task_state_guard import Ledger

LIMIT_MB = 64.0
TASKS = 100_000
# Long (valid) name labels and payload fingerprints make the file larger than the bound.
RENDER = "app.tasks." + "render_" * 25
PLAN = "agent." + "plan_" * 35
FETCH = "app.tasks." + "fetch_" * 30
FIXTURES = Path(__file__).parents[1] / "fixtures"

# Runs the CLI in this child and reports its own peak RSS (VmHWM) on stderr.
_MEASURED_CLI = r"""
import json, os, sys
from task_state_guard.cli.commands import main
code = main(sys.argv[1:])
sys.stdout.flush()
rss_kib = next(int(line.split()[1]) for line in open("/proc/self/status")
               if line.startswith("VmHWM"))
os.write(2, json.dumps({"exit": code, "peak_rss_mb": rss_kib / 1024}).encode())
os._exit(code)
"""


def measured_cli(db: str, *args: str) -> tuple[int, str, float]:
    """Run ``tsg --db DB ARGS`` in a fresh process: exit code, stdout, peak RSS in MB."""
    proc = subprocess.run(
        [sys.executable, "-c", _MEASURED_CLI, "--db", db, *args],
        capture_output=True, text=True, env=cli_env(), timeout=600, check=False,
    )
    report = json.loads(proc.stderr)
    assert report["exit"] == proc.returncode
    return proc.returncode, proc.stdout, float(report["peak_rss_mb"])


def entries(directory: str) -> dict[str, tuple[Any, ...]]:
    """Every entry with its type, mode, owner, size, mtime and inode (no content hash: 45 MB)."""
    out = {}
    for name in sorted(os.listdir(directory)):
        st = os.lstat(os.path.join(directory, name))
        out[name] = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid,
                     st.st_size, st.st_mtime_ns, st.st_ino)
    return out


def build(db: str, tasks: int) -> tuple[str, str]:
    """``tasks`` tasks through the public API, in batched transactions; a root with a child."""
    clock = Clock()
    with Ledger(db, clock=clock) as led:
        root_id = child_id = ""
        made = 0
        while made < tasks:
            with led.atomic():
                for _ in range(500):  # 10 tasks per round: every state and delivery state
                    clock.advance(0.001)
                    digest = f"{made:064x}"
                    done = led.create_task(name=RENDER, payload_hash=digest)
                    inner = led.create_task(parent_id=done.id, delivery_required=False,
                                            name=RENDER)
                    led.close_task_settled(inner.id, "succeeded", code="completed")
                    led.close_task(done.id, "succeeded", code="worker_completed")
                    delivered = led.create_task(name=PLAN, payload_hash=digest)
                    led.close_task(delivered.id, "failed", code="worker_failed")
                    led.set_delivery(delivered.id, "delivered")
                    running = led.create_task(name=PLAN, timeout_seconds=60)
                    led.start_task(running.id, owner=False)
                    for _ in range(6):
                        led.create_task(name=FETCH, payload_hash=digest)
                    root_id, child_id = done.id, inner.id
                    made += 10
    assert sidecars(db) == []
    return root_id, child_id


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str, str]:
    directory = tmp_path_factory.mktemp("bounded") / "d"
    directory.mkdir(mode=0o700)
    db = str(directory / "tasks.sqlite")
    root_id, child_id = build(db, TASKS)
    return db, root_id, child_id


READS = {
    "status": ["status"],
    "status_text": ["status", "--format", "text"],
    "doctor": ["doctor"],
    "tasks": ["tasks", "--status", "queued"],
    "metrics": ["metrics"],
}


@pytest.mark.parametrize("name", [*READS, "get", "children"])
def test_read_command_on_a_closed_ledger_stays_under_64_mb(
    big: tuple[str, str, str], name: str
) -> None:
    db, root_id, child_id = big
    directory = os.path.dirname(db)
    args = {
        "get": ["get", root_id, "--extras"],
        "children": ["children", root_id],
    }.get(name) or READS[name]
    assert os.path.getsize(db) > 40 * 2**20  # larger than the bound: a copy could not fit
    before = entries(directory)
    code, out, peak = measured_cli(db, *args)
    assert code == 0, out
    assert peak < LIMIT_MB, f"{name}: peak RSS {peak:.1f} MB"
    assert sidecars(db) == []
    assert entries(directory) == before  # same entries, bytes (size, mtime), modes, owners
    if name in ("metrics", "status_text"):
        assert "queued" in out
        return
    payload = json.loads(out)
    assert payload["ok"] is True
    if name == "doctor":
        assert payload["task_count"] == TASKS and payload["healthy"] is True
    elif name == "status":
        assert sum(payload["status"]["tasks"].values()) == TASKS
    elif name == "tasks":
        assert len(payload["task_ids"]) == TASKS * 6 // 10
    elif name == "get":
        assert payload["task"]["id"] == root_id
    else:
        assert [task["id"] for task in payload["children"]] == [child_id]


def test_dry_run_on_the_live_ledger_stays_under_64_mb(big: tuple[str, str, str]) -> None:
    """A writer holds the ledger open: the dry-run reads through SQLite's read-only WAL access,
    in bounded memory, and changes no entry (not even the directory's mtime)."""
    db, _, _ = big
    directory = os.path.dirname(db)
    with Ledger(db) as writer:
        writer.status()  # the writer's WAL and SHM exist
        assert sidecars(db) == [db + "-wal", db + "-shm"]
        before = entries(directory)
        directory_mtime = os.stat(directory).st_mtime_ns
        for args in (["reconcile", "--dry-run"], ["prune", "--older-than", "0", "--dry-run"]):
            code, out, peak = measured_cli(db, *args)
            assert code == 0, out
            assert peak < LIMIT_MB, f"{args[0]}: peak RSS {peak:.1f} MB"
            assert entries(directory) == before
            assert os.stat(directory).st_mtime_ns == directory_mtime
            payload = json.loads(out)
            if args[0] == "reconcile":
                assert payload["reconcile"]["dry_run"] is True
                assert payload["reconcile"]["active_examined"] == TASKS * 7 // 10
            else:
                assert payload["prune"]["dry_run"] is True
    assert sidecars(db) == []


def test_dry_run_on_a_closed_ledger_over_the_snapshot_limit_fails_closed(
    tmp_path: Path,
) -> None:
    """The CLI's dry-run loads a closed ledger as a private in-memory snapshot of at most the
    default limit (1 GiB): a larger file is refused before a byte of it is read (exit 2,
    ``snapshot_too_large``), and nothing is created or changed."""
    db, _ = small_ledger(tmp_path)
    os.truncate(db, (1 << 30) + 4096)  # sparse: a larger file costs no disk (pages unused)
    directory = os.path.dirname(db)
    before = entries(directory)
    directory_mtime = os.stat(directory).st_mtime_ns
    for args in (["reconcile", "--dry-run"], ["prune", "--older-than", "0", "--dry-run"]):
        code, out, peak = measured_cli(db, *args)
        assert code == 2, out
        payload = json.loads(out)
        assert payload == {"error": "StateConflict", "ok": False}
        assert json.loads(measured_cli(db, "--explain", *args)[1]) == {
            "error": "StateConflict", "ok": False, "reason": "snapshot_too_large"}
        assert peak < LIMIT_MB
        assert entries(directory) == before
        assert os.stat(directory).st_mtime_ns == directory_mtime


def test_python_read_only_ledger_reads_the_closed_ledger_in_bounded_memory(
    big: tuple[str, str, str],
) -> None:
    db, root_id, _ = big
    script = (
        "import json, os, sys\n"
        "from task_state_guard import Ledger\n"
        "with Ledger(sys.argv[1], read_only=True) as led:\n"
        "    present = sorted(n for n in os.listdir(os.path.dirname(sys.argv[1]))\n"
        "                     if n.endswith(('-wal', '-shm')))\n"
        "    info = led.storage_info()\n"
        "    out = [led.doctor()['healthy'], led.status()['tasks']['running'],\n"
        "           len(led.children_of(sys.argv[2])), led.get_task(sys.argv[2]).status,\n"
        "           len(led.find_task_ids('queued', limit=10)), present,\n"
        "           info['read_snapshot'], info['journal_mode'], info['schema_version']]\n"
        "rss = next(int(line.split()[1]) for line in open('/proc/self/status')\n"
        "           if line.startswith('VmHWM'))\n"
        "print(json.dumps([out, rss / 1024]))\n"
    )
    before = entries(os.path.dirname(db))
    proc = subprocess.run([sys.executable, "-c", script, db, root_id], capture_output=True,
                          text=True, env=cli_env(), timeout=600, check=True)
    out, peak = json.loads(proc.stdout)
    # transient private sidecars while it is open (a writer could join), gone after close()
    assert out == [True, TASKS // 10, 1, "succeeded", 10,
                   ["tasks.sqlite-shm", "tasks.sqlite-wal"], False, "wal",
                   Ledger.SCHEMA_VERSION]
    assert peak < LIMIT_MB
    assert entries(os.path.dirname(db)) == before


# ----------------------------------------------------------------------------- small ledgers


def small_ledger(tmp_path: Path) -> tuple[str, list[str]]:
    directory = tmp_path / "d"
    directory.mkdir(mode=0o700)
    db = str(directory / "tasks.sqlite")
    with Ledger(db, clock=Clock()) as led:
        ids = [led.create_task().id for _ in range(20)]
    return db, ids


def test_transient_sidecars_are_private_and_removed_on_close(tmp_path: Path) -> None:
    db, ids = small_ledger(tmp_path)
    reader = Ledger(db, read_only=True)
    for path in (db + "-wal", db + "-shm"):
        st = os.lstat(path)
        assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.geteuid()
    assert reader.get_task(ids[0]).status == "queued"
    reader.close()
    assert sidecars(db) == []


def test_a_writer_starting_during_a_read_keeps_working(tmp_path: Path) -> None:
    db, ids = small_ledger(tmp_path)
    reader = Ledger(db, clock=Clock(T0 + 100), read_only=True)
    assert reader.status()["tasks"]["queued"] == 20
    # another process writes while the reader holds the ledger open, and exits
    created = run_cli("--db", db, "create")
    assert created.code == 0
    new_id = assert_json_line(created)["task"]["id"]
    assert run_cli("--db", db, "close", ids[0], "--status", "cancelled").code == 0
    assert reader.get_task(new_id).status == "queued"  # the reader sees the writer's commits
    assert reader.get_task(ids[0]).status == "cancelled"
    # a writer in this process that opens during the read and keeps writing after it closed
    writer = Ledger(db, clock=Clock(T0 + 200))
    writer.create_task()
    assert reader.status()["tasks"]["queued"] == 21
    reader.close()
    more = writer.create_task()
    writer.close_task(more.id, "succeeded")
    assert sidecars(db) != []  # the writer is still open: its WAL stays
    writer.close()
    assert sidecars(db) == []
    with Ledger(db, read_only=True) as again:
        assert again.status()["tasks"]["queued"] == 21 and again.doctor()["healthy"] is True
    assert sidecars(db) == []


def test_a_writer_process_running_during_a_long_read(big: tuple[str, str, str],
                                                     tmp_path: Path) -> None:
    db, _, _ = big
    copy_dir = tmp_path / "copy"
    copy_dir.mkdir(mode=0o700)
    copy = str(copy_dir / "tasks.sqlite")
    shutil.copyfile(db, copy)
    os.chmod(copy, 0o600)
    doctor = subprocess.Popen(
        [sys.executable, "-m", "task_state_guard", "--db", copy, "doctor"],
        stdout=subprocess.PIPE, text=True, env=cli_env(),
    )
    written = 0
    with Ledger(copy) as writer:
        while doctor.poll() is None or written < 50:
            task = writer.create_task()
            writer.close_task_settled(task.id, "succeeded", code="completed")
            written += 1
    out, _ = doctor.communicate(timeout=600)
    assert doctor.returncode == 0 and json.loads(out)["healthy"] is True
    assert sidecars(copy) == []
    with Ledger(copy, read_only=True) as led:
        assert led.doctor()["task_count"] == TASKS + written


def test_sidecars_left_by_a_killed_reader_break_neither_reader_nor_writer(
    tmp_path: Path,
) -> None:
    db, ids = small_ledger(tmp_path)
    script = (
        "import os, signal, sys\n"
        "from task_state_guard import Ledger\n"
        "led = Ledger(sys.argv[1], read_only=True)\n"
        "led.status()\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    proc = subprocess.run([sys.executable, "-c", script, db], env=cli_env(), check=False)
    assert proc.returncode == -signal.SIGKILL
    assert sidecars(db) == [db + "-wal", db + "-shm"]  # the crash leftover
    for suffix in ("-wal", "-shm"):
        assert stat.S_IMODE(os.stat(db + suffix).st_mode) == 0o600
    # the next readers: the CLI (a read command and a dry-run) and the Python API
    status = run_cli("--db", db, "status")
    assert status.code == 0 and assert_json_line(status)["status"]["tasks"]["queued"] == 20
    assert run_cli("--db", db, "reconcile", "--dry-run").code == 0
    with Ledger(db, read_only=True) as reader:
        assert reader.get_task(ids[1]).status == "queued"
    # the next writer takes the leftovers over and removes them when it closes
    closed = run_cli("--db", db, "close", ids[1], "--status", "cancelled")
    assert closed.code == 0
    assert sidecars(db) == []
    doctor = run_cli("--db", db, "doctor")
    assert doctor.code == 0 and assert_json_line(doctor)["healthy"] is True
    assert sidecars(db) == []


def test_snapshot_read_without_sidecars_is_a_private_copy(tmp_path: Path) -> None:
    """Without sidecars a closed ledger is loaded as a private in-memory snapshot: a writer
    that opens and changes the file meanwhile is not held up, and the snapshot keeps the state
    it was taken at; the next read-only open sees the writer's change."""
    db, ids = small_ledger(tmp_path)
    before = entries(os.path.dirname(db))
    reader = Ledger(db, clock=Clock(T0 + 100), read_only=True, transient_sidecars=False)
    info = reader.storage_info()
    assert info["read_snapshot"] is True and info["journal_mode"] == "wal"
    assert sidecars(db) == []
    assert entries(os.path.dirname(db)) == before
    assert reader.reconcile(dry_run=True)["active_examined"] == 20
    with Ledger(db, clock=Clock(T0 + 200)) as writer:
        writer.close_task(ids[0], "cancelled")
        assert reader.get_task(ids[0]).status == "queued"  # the snapshot's state
    assert reader.status()["tasks"]["queued"] == 20
    reader.close()
    with Ledger(db, read_only=True, transient_sidecars=False) as again:
        assert again.get_task(ids[0]).status == "cancelled"
    assert sidecars(db) == []


def test_old_schema_stays_old_after_every_read_command(tmp_path: Path) -> None:
    directory = tmp_path / "d"
    directory.mkdir(mode=0o700)
    db = str(directory / "tasks.sqlite")
    shutil.copyfile(FIXTURES / "ledger-0.1.0.sqlite", db)
    os.chmod(db, 0o600)
    expected = json.loads((FIXTURES / "ledger-0.1.0.expected.json").read_text())["tasks"]
    some_id = expected["succeeded_delivered"]["id"]
    before = entries(str(directory))
    content = Path(db).read_bytes()
    for args in (["status"], ["doctor"], ["tasks", "--status", "running"], ["metrics"],
                 ["get", some_id], ["children", some_id], ["reconcile", "--dry-run"]):
        result = run_cli("--db", db, *args)
        assert result.code == 0, args
        assert entries(str(directory)) == before, args
    with Ledger(db, read_only=True) as led:
        assert led.schema_version == 2  # 0.1.0's layout, not migrated
        assert led.get_task(some_id).id == some_id
    assert entries(str(directory)) == before
    assert Path(db).read_bytes() == content  # 0.1.0's tables, byte for byte


def test_snapshot_read_of_a_file_dated_in_the_future(tmp_path: Path) -> None:
    """A modification time ahead of the clock (a copy from another host, a clock stepped back)
    does not hold up the snapshot of a closed ledger: read at once, nothing created."""
    db, ids = small_ledger(tmp_path)
    ahead = time.time_ns() + 3600 * 10**9
    os.utime(db, ns=(ahead, ahead))
    time.sleep(0.1)  # the change of the times itself (its ctime) settles
    before = entries(os.path.dirname(db))
    with Ledger(db, read_only=True, transient_sidecars=False, busy_timeout_ms=0) as reader:
        assert reader.get_task(ids[0]).status == "queued"
    dry_run = run_cli("--db", db, "--busy-timeout-ms", "1", "reconcile", "--dry-run")
    assert dry_run.code == 0
    assert entries(os.path.dirname(db)) == before
