"""Storage faults: each one gives a clear LedgerError (CLI: the fixed JSON error, exit 2), never a
traceback or exit 3, never a partial write; afterwards the ledger is healthy or doctor says it
is not.

We run as root, which ignores file modes; the permission cases therefore run their ledger in a
subprocess under ``setpriv`` with CAP_DAC_OVERRIDE/CAP_DAC_READ_SEARCH removed from the bounding
set, so the kernel enforces modes on that process exactly as for an ordinary user.

Every row is ``sqlite_only``: each fault is one of the SQLite file's (its filesystem filling up
or turning read-only, its modes, its sidecars, the file replaced, deleted, truncated or not a
ledger, its schema edited with ``sqlite3``, a WAL left behind, another connection holding the
file's write lock past ``busy_timeout``). A PostgreSQL ledger has no file: its storage faults are
the server's (a restart: tests/fleet; a held row lock past ``busy_timeout_ms``, a foreign schema:
tests/postgres).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import resource
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from task_state_guard import Ledger, LedgerBusy, LedgerError, StorageError, reasons

from .conftest import assert_cli_error, cli_env, one_json_line, run_cli

pytestmark = pytest.mark.sqlite_only(reason="the SQLite file's faults (see above)")

UNPRIVILEGED = ["setpriv", "--bounding-set=-dac_override,-dac_read_search",
                "--inh-caps=-dac_override,-dac_read_search"]


def ledger_error(fn: Callable[[], object]) -> LedgerError:
    """Call ``fn``; it must raise a LedgerError subclass (anything else fails the test)."""
    try:
        fn()
    except LedgerError as exc:
        return exc
    raise AssertionError("expected a LedgerError")


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def populate(db: Path, n: int = 20) -> list[str]:
    with Ledger(db) as ledger:
        ids = []
        for i in range(n):
            task = ledger.create_task(name="fault.case")
            if i % 2:
                ledger.start_task(task.id, owner=False)
                ledger.close_task(task.id, "succeeded", code="completed")
                ledger.set_delivery(task.id, "delivered", code="transport_acknowledged")
            ids.append(task.id)
    return ids


def doctor_cli(db: Path) -> tuple[int, dict[str, object] | None]:
    """Doctor through the CLI: exit 0 healthy, 1 unhealthy, 2 error; never anything else."""
    code, out, err = run_cli("--db", str(db), "doctor")
    assert err == ""
    assert code in (0, 1, 2), code
    parsed = one_json_line(out)
    if code == 2:
        assert set(parsed) - {"reason"} == {"error", "ok"}
        assert parsed.get("reason", reasons.NOT_A_LEDGER) in reasons.STORAGE
        return code, None
    assert parsed["ok"] is (code == 0)
    return code, parsed


def assert_healthy(db: Path, ids: list[str]) -> None:
    with Ledger(db) as ledger:
        report = ledger.doctor()
        assert report["healthy"], report
        for tid in ids:
            ledger.get_task(tid)


@contextlib.contextmanager
def tmpfs(where: Path, size: str) -> Iterator[Path]:
    where.mkdir(mode=0o700)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(where)],
                   check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


# ----------------------------------------------------------------------------- disk full
def test_disk_full_on_a_tiny_tmpfs(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "mnt", "1m") as mnt:
        db = mnt / "l" / "tasks.sqlite"
        ledger = Ledger(db)
        returned: list[str] = []
        error: LedgerError | None = None
        for _ in range(20_000):
            try:
                task = ledger.create_task(name="fill.up")
                returned.append(task.id)
                ledger.start_task(task.id, owner=False)
            except LedgerError as exc:
                error = exc
                break
        assert isinstance(error, StorageError) and not isinstance(error, LedgerBusy)
        assert len(returned) > 10
        # The CLI on the full disk: the fixed error, nothing partial.
        code, out, err = run_cli("--db", str(db), "create", "--name", "cli.full")
        if code == 0:  # a freed page can still take one row: then it must be whole
            returned.append(one_json_line(out)["task"]["id"])  # type: ignore[index]
        else:
            assert_cli_error(code, out, err, expected=("StateConflict",))
        ledger.close()
        # Every returned transition is there, whole; doctor says so (or says it is not).
        code, report = doctor_cli(db)
        with Ledger(db) as again:
            if code == 0:
                assert report is not None and report["task_count"] >= len(returned)
            for tid in returned:
                again.get_task(tid)
            assert again.doctor()["healthy"]


def test_disk_full_through_rlimit_fsize(tmp_path: Path) -> None:
    db = tmp_path / "l" / "tasks.sqlite"
    populate(db, 2)
    script = textwrap.dedent(
        """
        import json, sys
        from task_state_guard import Ledger, LedgerError
        ids, error = [], None
        try:
            ledger = Ledger(sys.argv[1])
            for _ in range(100000):
                ids.append(ledger.create_task(name="rlimit.fill").id)
        except LedgerError as exc:
            error = type(exc).__name__
        print(json.dumps({"ids": ids, "error": error}))
        """
    )

    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1024 * 1024, 1024 * 1024))

    proc = subprocess.run([sys.executable, "-c", script, str(db)], capture_output=True,
                          text=True, preexec_fn=limit, timeout=120, env=cli_env(), check=False)
    assert proc.returncode == 0 and proc.stderr == ""
    result = json.loads(proc.stdout)
    assert result["error"] == "StorageError"
    assert len(result["ids"]) > 10
    assert_healthy(db, result["ids"])


# ----------------------------------------------------------------------------- read-only
def test_read_only_filesystem(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "mnt", "4m") as mnt:
        db = mnt / "l" / "tasks.sqlite"
        ids = populate(db)
        before = digest(db)
        subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
        try:
            exc = ledger_error(lambda: Ledger(db).create_task())
            assert isinstance(exc, StorageError) and exc.reason == "database_not_writable"
            for args in (["create"], ["init"], ["reconcile"], ["prune", "--older-than", "0"]):
                assert_cli_error(*run_cli("--explain", "--db", str(db), *args),
                                 expected=("StateConflict",), reason="database_not_writable")
            # Read-only commands still work on a read-only medium.
            code, report = doctor_cli(db)
            assert code == 0 and report is not None and report["task_count"] == len(ids)
            code, _out, err = run_cli("--db", str(db), "reconcile", "--dry-run")
            assert (code, err) == (0, "")
            assert digest(db) == before
        finally:
            subprocess.run(["mount", "-o", "remount,rw", str(mnt)], check=True)
        assert_healthy(db, ids)


UNPRIV_SCRIPT = textwrap.dedent(
    """
    import json, os, sys, threading
    from task_state_guard import Ledger, LedgerError
    db = sys.argv[1]; directory = os.path.dirname(db); results = {}

    def attempt(label, fn, new_thread=False):
        box = {}
        def run():
            try:
                fn(); box["r"] = "ok"
            except LedgerError as exc:
                box["r"] = type(exc).__name__
            except Exception as exc:
                box["r"] = "NonLedger:" + type(exc).__name__
        if new_thread:
            t = threading.Thread(target=run); t.start(); t.join()
        else:
            run()
        results[label] = box["r"]

    ledger = Ledger(db)
    first = ledger.create_task()
    # 1. the directory becomes read-only under the running process
    os.chmod(directory, 0o500)
    attempt("ro_dir_same_connection", lambda: ledger.create_task())
    attempt("ro_dir_new_thread", lambda: ledger.create_task(), new_thread=True)
    attempt("ro_dir_new_ledger", lambda: Ledger(db).create_task())
    os.chmod(directory, 0o700)
    # 2. the database file becomes read-only
    os.chmod(db, 0o400)
    attempt("ro_file_new_thread", lambda: ledger.create_task(), new_thread=True)
    attempt("ro_file_new_ledger", lambda: Ledger(db).create_task())
    os.chmod(db, 0o600)
    # 3. modes loosened under the process: the next open tightens or refuses
    os.chmod(db, 0o644)
    attempt("loose_file_new_thread", lambda: ledger.create_task(), new_thread=True)
    results["file_mode_after"] = oct(os.stat(db).st_mode & 0o777)
    os.chmod(directory, 0o777)
    attempt("loose_dir_new_ledger", lambda: Ledger(db).create_task())
    attempt("loose_dir_new_thread", lambda: ledger.create_task(), new_thread=True)
    os.chmod(directory, 0o700)
    attempt("restored", lambda: Ledger(db).create_task())
    print(json.dumps(results, sort_keys=True))
    """
)


def test_permissions_changed_under_a_running_process(tmp_path: Path) -> None:
    db = tmp_path / "l" / "tasks.sqlite"
    populate(db, 3)
    proc = subprocess.run([*UNPRIVILEGED, sys.executable, "-c", UNPRIV_SCRIPT, str(db)],
                          capture_output=True, text=True, timeout=120, env=cli_env(), check=False)
    assert proc.stderr == "" and proc.returncode == 0, proc.stderr[-2000:]
    results = json.loads(proc.stdout)
    outcomes = {k: v for k, v in results.items() if k != "file_mode_after"}
    assert all(v in ("ok", "StorageError", "LedgerBusy", "UnsafeLocation")
               for v in outcomes.values()), results
    # While this process keeps its WAL sidecars open, a read-only directory does not stop it
    # (no new file is needed); test_read_only_directory_through_the_cli covers a fresh open.
    # A new Ledger on the now read-only file is refused by the ledger's own writability check,
    # whatever SQLite's version or any descriptor SQLite may still hold for the same file.
    assert results["ro_file_new_ledger"] == "StorageError"
    assert results["loose_dir_new_ledger"] == "UnsafeLocation"  # an InvalidInput
    assert results["loose_file_new_thread"] == "ok"
    assert results["file_mode_after"] == "0o600"
    assert results["restored"] == "ok"
    assert_healthy(db, [])


SIDECAR_SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    from task_state_guard import Ledger, LedgerError
    db = sys.argv[1]; results = {}
    ledger = Ledger(db)
    ledger.create_task()
    for suffix in ("-wal", "-shm"):
        os.chmod(db + suffix, 0o400)
        try:
            Ledger(db).create_task(); results[suffix] = "ok"
        except LedgerError as exc:
            results[suffix] = type(exc).__name__ + ":" + str(exc.reason)
        os.chmod(db + suffix, 0o600)
    results["count"] = ledger.doctor()["task_count"]
    print(json.dumps(results, sort_keys=True))
    """
)


def test_read_only_sidecar_refuses_a_new_writer(tmp_path: Path) -> None:
    """A writer needs its WAL sidecars writable; the ledger checks before SQLite opens them."""
    db = tmp_path / "l" / "tasks.sqlite"
    populate(db, 2)
    proc = subprocess.run([*UNPRIVILEGED, sys.executable, "-c", SIDECAR_SCRIPT, str(db)],
                          capture_output=True, text=True, timeout=120, env=cli_env(), check=False)
    assert proc.stderr == "" and proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout) == {"-wal": "StorageError:sidecar_not_writable",
                                       "-shm": "StorageError:sidecar_not_writable",
                                       "count": 3}
    assert_healthy(db, [])


def test_read_only_directory_through_the_cli(tmp_path: Path) -> None:
    db = tmp_path / "l" / "tasks.sqlite"
    ids = populate(db, 4)
    os.chmod(db.parent, 0o500)
    try:
        env = cli_env()
        proc = subprocess.run([*UNPRIVILEGED, sys.executable, "-m", "task_state_guard",
                               "--explain", "--db", str(db), "create"],
                              capture_output=True, text=True, env=env, timeout=60, check=False)
        assert_cli_error(proc.returncode, proc.stdout, proc.stderr, expected=("StateConflict",),
                         reason="directory_not_writable")
    finally:
        os.chmod(db.parent, 0o700)
    assert_healthy(db, ids)


# ----------------------------------------------------------------------------- file identity
def test_database_replaced_under_a_running_ledger(tmp_path: Path) -> None:
    db = tmp_path / "l" / "tasks.sqlite"
    other = tmp_path / "o" / "tasks.sqlite"
    ids = populate(db, 4)
    populate(other, 2)
    ledger = Ledger(db)
    ledger.create_task()
    count = ledger.doctor()["task_count"]
    shutil.copy2(other, db.parent / "swap.sqlite")
    os.replace(db.parent / "swap.sqlite", db)
    replacement = digest(db)
    for call in (ledger.create_task, lambda: ledger.get_task(ids[0]), ledger.doctor,
                 ledger.reconcile):
        assert isinstance(ledger_error(call), StorageError)
    assert digest(db) == replacement  # the stranger's file was not written
    ledger.close()
    assert count == 5


def test_database_deleted_under_a_running_ledger(tmp_path: Path) -> None:
    db = tmp_path / "l" / "tasks.sqlite"
    populate(db, 3)
    ledger = Ledger(db)
    ledger.create_task()
    os.unlink(db)
    for call in (ledger.create_task, ledger.doctor, ledger.status,
                 lambda: ledger.prune(0.0)):
        assert isinstance(ledger_error(call), StorageError)
    assert not db.exists(), "a running ledger must not silently re-create its database"
    ledger.close()
    for args in (["doctor"], ["status"], ["tasks", "--status", "queued"]):
        assert_cli_error(*run_cli("--db", str(db), *args), expected=("InvalidInput",
                                                                      "StateConflict"))
    assert not db.exists(), "read commands never create a database"


@pytest.mark.parametrize("keep", ["0", "50", "100", "4096", "half", "minus1"])
def test_truncated_database(tmp_path: Path, keep: str) -> None:
    db = tmp_path / "l" / "tasks.sqlite"
    populate(db, 200)
    size = db.stat().st_size
    length = {"half": size // 2, "minus1": size - 1}.get(keep) or int(keep)
    with open(db, "r+b") as handle:
        handle.truncate(length)
    code, report = doctor_cli(db)
    if code == 0:  # healthy is only acceptable when nothing was lost
        assert report is not None and report["task_count"] == 200
    # A writer either refuses clearly or works on a file doctor vouches for.
    code, out, err = run_cli("--db", str(db), "create")
    assert err == "" and code in (0, 2)
    if code == 2:
        assert_cli_error(code, out, err, expected=("StateConflict",))
    else:
        with Ledger(db) as ledger:
            verdict = ledger.doctor()
        assert verdict["healthy"] or length > 0
    try:
        with Ledger(db) as ledger:
            verdict = ledger.doctor()  # the API either fails clearly or reports
            assert isinstance(verdict["healthy"], bool)
            if length and verdict["healthy"]:  # healthy only when nothing was lost
                assert verdict["task_count"] >= 200
    except LedgerError as exc:
        assert isinstance(exc, StorageError)


@pytest.mark.parametrize("content", ["text", "random", "zeros", "header_only"])
def test_non_sqlite_file(tmp_path: Path, content: str) -> None:
    db = tmp_path / "l" / "tasks.sqlite"
    db.parent.mkdir(mode=0o700)
    data = {
        "text": b"not a database\n" * 500,
        "random": os.urandom(8192),
        "zeros": bytes(8192),
        "header_only": b"SQLite format 3\x00" + os.urandom(300),
    }[content]
    db.write_bytes(data)
    os.chmod(db, 0o600)
    assert isinstance(ledger_error(lambda: Ledger(db)), StorageError)
    for args in (["create"], ["init"], ["doctor"], ["status"], ["reconcile", "--dry-run"]):
        assert_cli_error(*run_cli("--db", str(db), *args), expected=("StateConflict",))
    assert db.read_bytes() == data, "a non-ledger file must never be written"


def _foreign(db: Path, wal: bool) -> None:
    db.parent.mkdir(mode=0o700, exist_ok=True)
    conn = sqlite3.connect(db)
    if wal:
        conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE users(name TEXT)")
    conn.execute("INSERT INTO users VALUES ('someone')")
    conn.commit()
    conn.close()
    os.chmod(db, 0o600)


@pytest.mark.parametrize("wal", [True, False], ids=["wal", "rollback"])
def test_foreign_schema_is_refused(tmp_path: Path, wal: bool) -> None:
    db = tmp_path / "l" / "app.sqlite"
    _foreign(db, wal)
    assert isinstance(ledger_error(lambda: Ledger(db)), StorageError)
    for args in (["create"], ["init"], ["reconcile"], ["status"]):
        assert_cli_error(*run_cli("--db", str(db), *args), expected=("StateConflict",))
    code, report = doctor_cli(db)
    assert (code == 1 and report is not None and report["schema_ok"] is False) \
        or code == 2
    conn = sqlite3.connect(db)
    assert conn.execute("SELECT name FROM users").fetchall() == [("someone",)]
    assert [r[0] for r in conn.execute("SELECT name FROM sqlite_master")] == ["users"]
    conn.close()


def test_foreign_database_bytes_are_never_modified(tmp_path: Path) -> None:
    """The journal mode of a foreign file used to be switched to WAL before the refusal."""
    db = tmp_path / "l" / "app.sqlite"
    _foreign(db, wal=False)
    before = digest(db)
    assert isinstance(ledger_error(lambda: Ledger(db)), StorageError)
    assert digest(db) == before


@pytest.mark.parametrize("tamper", [
    "CREATE INDEX extra ON tsg_tasks(created_at)",
    "CREATE TABLE notes(x)",
    "UPDATE tsg_meta SET value = '99' WHERE key = 'schema_version'",
    "CREATE TRIGGER t AFTER INSERT ON tsg_events BEGIN SELECT 1; END",
])
def test_tampered_ledger_schema(tmp_path: Path, tamper: str) -> None:
    db = tmp_path / "l" / "tasks.sqlite"
    populate(db, 3)
    conn = sqlite3.connect(db)
    conn.execute(tamper)
    conn.commit()
    conn.close()
    assert isinstance(ledger_error(lambda: Ledger(db)), StorageError)
    assert_cli_error(*run_cli("--db", str(db), "create"), expected=("StateConflict",))
    code, report = doctor_cli(db)
    assert code == 1 and report is not None and report["schema_ok"] is False


# ----------------------------------------------------------------------------- sidecars
def _wal_leftover(tmp_path: Path) -> tuple[Path, list[str]]:
    """A crash leftover: db + -wal with committed frames, no -shm."""
    src = tmp_path / "src" / "tasks.sqlite"
    ids = populate(src, 3)
    ledger = Ledger(src)
    ids += [ledger.create_task(name="in.wal").id for _ in range(5)]
    dst = tmp_path / "dst" / "tasks.sqlite"
    dst.parent.mkdir(mode=0o700)
    shutil.copy(src, dst)
    shutil.copy(str(src) + "-wal", str(dst) + "-wal")
    ledger.close()
    for p in (dst, Path(str(dst) + "-wal")):
        os.chmod(p, 0o600)
    assert Path(str(dst) + "-wal").stat().st_size > 0
    return dst, ids


def test_lone_wal_with_committed_frames_is_recovered(tmp_path: Path) -> None:
    db, ids = _wal_leftover(tmp_path)
    # Read-only commands refuse the incomplete pair instead of guessing.
    assert_cli_error(*run_cli("--db", str(db), "doctor"), expected=("StateConflict",))
    # A writer recovers every committed transition.
    code, _out, err = run_cli("--db", str(db), "init")
    assert (code, err) == (0, "")
    assert_healthy(db, ids)


@pytest.mark.parametrize("sidecar", ["-wal", "-shm"])
def test_lone_garbage_sidecar(tmp_path: Path, sidecar: str) -> None:
    db = tmp_path / "l" / "tasks.sqlite"
    ids = populate(db, 5)
    path = Path(str(db) + sidecar)
    path.write_bytes(os.urandom(4096 * 3))
    os.chmod(path, 0o600)
    code, out, err = run_cli("--db", str(db), "doctor")
    if code != 0:
        assert_cli_error(code, out, err, expected=("StateConflict",))
    code, out, err = run_cli("--db", str(db), "create")
    assert err == ""
    if code == 2:
        assert_cli_error(code, out, err, expected=("StateConflict",))
    else:
        assert code == 0
        ids.append(one_json_line(out)["task"]["id"])  # type: ignore[index]
    assert_healthy(db, ids)


# ----------------------------------------------------------------------------- locks
class _LockHolder:
    """Another connection holding the write lock (or an exclusive lock) until released."""

    def __init__(self, db: Path, exclusive: bool = False) -> None:
        self.release = threading.Event()
        ready = threading.Event()

        def hold() -> None:
            conn = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
            if exclusive:
                conn.execute("PRAGMA locking_mode=EXCLUSIVE")
                conn.execute("BEGIN EXCLUSIVE")
            else:
                conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO tsg_meta(key, value) VALUES ('lock_holder', 'x')")
            ready.set()
            self.release.wait(120)
            conn.execute("ROLLBACK")
            conn.close()

        self.thread = threading.Thread(target=hold, daemon=True)
        self.thread.start()
        assert ready.wait(10)

    def join(self) -> None:
        self.release.set()
        self.thread.join()


def test_lock_held_past_the_busy_timeout(tmp_path: Path) -> None:
    db = tmp_path / "l" / "tasks.sqlite"
    ids = populate(db, 4)
    ledger = Ledger(db, busy_timeout_ms=200)
    holder = _LockHolder(db)
    began = time.monotonic()
    for call in (ledger.create_task, lambda: ledger.start_task(ids[0], owner=False),
                 lambda: ledger.close_task(ids[0], "cancelled"), ledger.reconcile,
                 lambda: ledger.prune(0.0), lambda: Ledger(db, busy_timeout_ms=200)):
        assert isinstance(ledger_error(call), LedgerBusy)
    assert time.monotonic() - began < 10  # 6 calls x 0.2 s busy timeout, on a loaded machine
    # WAL readers are not blocked by a writer.
    assert ledger.get_task(ids[0]).status == "queued"
    for args in (["create"], ["start", ids[0]], ["reconcile"]):
        assert_cli_error(*run_cli("--db", str(db), "--busy-timeout-ms", "200", *args),
                         expected=("StateConflict",))
    holder.join()
    assert ledger.get_task(ids[0]).status == "queued"  # nothing partial was written
    assert ledger.doctor()["task_count"] == 4
    ledger.close()
    assert_healthy(db, ids)


def test_exclusive_lock_blocks_readers_cleanly(tmp_path: Path) -> None:
    db = tmp_path / "l" / "tasks.sqlite"
    ids = populate(db, 4)
    holder = _LockHolder(db, exclusive=True)
    for args in (["doctor"], ["status"], ["create"]):
        assert_cli_error(*run_cli("--db", str(db), "--busy-timeout-ms", "200", *args),
                         expected=("StateConflict",))
    holder.join()
    assert_healthy(db, ids)
