"""Hostile input: fuzzing of the CLI argument vector and of every public API argument, tampered
rows, and path attacks (symlink swaps, hard links, sidecar aliases, unsafe ancestors).

The fuzzers and the tampered rows run on each ledger backend (``[sqlite]``, ``[postgresql]``: a
schema of its own); the path attacks, the ledger path fuzz and a tampered timestamp concern the
SQLite file and stay ``sqlite_only``.

Contract checked on every CLI run: exactly one compact key-sorted JSON line on stdout (the only
exceptions are --help/--version and the text formats ``metrics`` / ``status --format text``),
nothing on stderr, exit 0, 1 or 2 - never 3 - and no input value echoed back. Inputs carry a
canary that no field accepts, so finding it in any output means something was echoed.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import sqlite3
import stat
import sys
import threading
import uuid
from collections.abc import Iterator
from contextlib import redirect_stderr, redirect_stdout, suppress
from pathlib import Path
from typing import Any

import hypothesis.strategies as st
import ledger_backends
import pytest
import task_state_guard
from hypothesis import HealthCheck, given, settings
from task_state_guard import (
    Heartbeater,
    InvalidInput,
    Ledger,
    LedgerError,
    ReconcilePolicy,
    StorageError,
    UnsafeLocation,
    payload_fingerprint,
    reasons,
    reconcile_restart,
)
from task_state_guard.cli import commands as cli
from task_state_guard.sqlite import storage

from .conftest import assert_cli_error, cli_env, one_json_line, private_dir, run_cli

CANARY = "Zq7c4n4ry~"  # "~" and the mix make it invalid as a name, id, code, state or number
FUZZ = settings(deadline=None, suppress_health_check=list(HealthCheck),
                max_examples=int(os.environ.get("TSG_FUZZ_EXAMPLES", "250")))

COMMANDS = ["init", "create", "start", "heartbeat", "close", "delivery", "reconcile", "doctor",
            "get", "children", "tasks", "status", "metrics", "prune"]
OPTIONS = ["--id", "--parent", "--timeout-seconds", "--internal", "--name", "--payload-sha256",
           "--code", "--active-grace-seconds", "--delivery-grace-seconds", "--dry-run",
           "--status", "--stale-seconds", "--limit", "--format", "--older-than", "--db",
           "--busy-timeout-ms", "--allow-external-acl", "json", "text", "--", "-", "-x",
           "--events", "--details", "--attempts", "--progress"]
WORDS = ["queued", "running", "succeeded", "failed", "timed_out", "cancelled", "delivered",
         "not_applicable", "pending", "completed", "worker_failed", "transport_acknowledged",
         "internal_task", "0", "-1", "1e309", "nan", "inf", "600", "1", "0x10", "", " ",
         "90s", "15m", "2h", "1d", "1h30", "-5m", "1w"]
PROGRESS_LINE = re.compile(r"tsg (reconcile|prune): \d+/\d+ (open tasks|closed trees) examined "
                           r"\(\d+%\)")


def canary_text() -> st.SearchStrategy[str]:
    return st.builds(lambda a, b: a + CANARY + b, st.text(max_size=8), st.text(max_size=8))


class _Env:
    """Shared ledger for the fuzzers (one per backend for the module's tests)."""

    def __init__(self, directory: Path, db: str) -> None:
        self.dir = directory  # a private directory, on either backend (for hostile paths)
        self.db = db
        with Ledger(self.db) as ledger:
            self.ids = []
            parent = ledger.create_task(name="fuzz.parent")
            self.ids.append(parent.id)
            for i in range(4):
                t = ledger.create_task(parent_id=parent.id, delivery_required=False)
                self.ids.append(t.id)
                if i % 2:
                    ledger.start_task(t.id, owner=False)


@contextlib.contextmanager
def _new_env(backend: str) -> Iterator[_Env]:
    directory = private_dir()
    try:
        with ledger_backends.ledger_target(backend, directory) as db:
            yield _Env(directory, db)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def env(backend: str, per_backend: Any) -> _Env:
    return per_backend.get(backend, _new_env)


def main_in_process(argv: list[str]) -> tuple[int | str, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            code: int | str = cli.main(argv)
        except SystemExit as exc:
            code = f"SystemExit:{exc.code}"
    return code, out.getvalue(), err.getvalue()


def _asks_for_help(argv: list[str]) -> bool:
    return any(a in ("-h", "--version") or (len(a) > 2 and "--help".startswith(a))
               for a in argv)


def _asks_for_progress(argv: list[str]) -> bool:
    return any(len(a) > 2 and "--progress".startswith(a) for a in argv)


def check_cli_contract(argv: list[str], code: int | str, out: str, err: str) -> None:
    if err and _asks_for_progress(argv):  # progress lines only, and only when asked
        assert all(PROGRESS_LINE.fullmatch(line) for line in err.splitlines()), err
        err = ""
    assert err == "", "stderr must stay empty"
    assert CANARY not in out, "an input value was echoed"
    if isinstance(code, str):
        assert code == "SystemExit:0" and _asks_for_help(argv), (code, argv)
        return
    assert code in (0, 1, 2), (code, out)
    text_formats = ("metrics" in argv or "text" in argv)
    if text_formats and code == 0 and not out.startswith("{"):
        return  # Prometheus exposition or the status table
    if "text" in argv and code == 2 and not out.startswith("{"):  # a --format text error
        category = out.splitlines()[0].removeprefix("error: ")
        assert category in ("InvalidInput", "TaskNotFound", "StateConflict"), out
        return
    parsed = one_json_line(out)
    if code == 2:
        assert set(parsed) - {"reason"} == {"error", "ok"} and parsed["ok"] is False
        assert parsed["error"] in ("InvalidInput", "TaskNotFound", "StateConflict")
        if "reason" in parsed:  # a fixed name from the closed vocabulary, never input text
            assert parsed["reason"] in reasons.ALL, parsed
    else:
        assert parsed["ok"] is (code == 0)


def token(env: _Env) -> st.SearchStrategy[str]:
    return st.one_of(
        st.sampled_from(COMMANDS + OPTIONS + WORDS), canary_text(), st.text(max_size=12),
        st.sampled_from(env.ids), st.uuids().map(str),
        st.floats(allow_nan=True).map(repr), st.integers().map(str),
    )


@FUZZ
@given(data=st.data())
def test_cli_argv_fuzz_in_process(env: _Env, data: st.DataObject) -> None:
    prefix = data.draw(st.sampled_from([
        [], ["--db", env.db], ["--db", os.path.join(str(env.dir), CANARY, "x.db")],
        ["--db", os.path.join(str(env.dir), "l")], ["--busy-timeout-ms", CANARY],
        ["--allow-external-acl", "--db", env.db], ["--db", env.db, "--busy-timeout-ms", "50"],
    ]))
    command = data.draw(st.one_of(st.sampled_from(COMMANDS), st.just(None), canary_text()))
    rest = data.draw(st.lists(token(env), max_size=6))
    argv = prefix + ([command] if command is not None else []) + rest
    grace = data.draw(st.sampled_from([None, "5", CANARY, "nan"]))
    os.environ["TSG_DB"] = env.db
    if grace is not None:
        os.environ["TSG_ACTIVE_GRACE_SECONDS"] = grace
    try:
        code, out, err = main_in_process(argv)
    finally:
        os.environ.pop("TSG_DB", None)
        os.environ.pop("TSG_ACTIVE_GRACE_SECONDS", None)
    check_cli_contract(argv, code, out, err)


@FUZZ
@given(argv=st.lists(st.one_of(st.sampled_from(COMMANDS + OPTIONS + WORDS), st.text(max_size=30),
                               canary_text()), max_size=8))
def test_cli_unstructured_argv_fuzz(env: _Env, argv: list[str]) -> None:
    argv = [a for a in argv if not a.startswith("--db")]  # never point the fuzzer at real paths
    os.environ["TSG_DB"] = env.db
    try:
        code, out, err = main_in_process(argv)
    finally:
        os.environ.pop("TSG_DB", None)
    check_cli_contract(argv, code, out, err)


def test_help_and_version_exit_zero() -> None:
    for argv in (["--help"], ["--version"], ["create", "--help"], ["reconcile", "-h"]):
        code, out, err = main_in_process(argv)
        assert code == "SystemExit:0" and err == "" and out


@pytest.mark.parametrize("argv", [
    ["create", "--name", CANARY],
    ["create", "--timeout-seconds", CANARY],
    ["create", "--id", CANARY, "--parent", CANARY],
    ["close", CANARY, "--status", CANARY, "--code", CANARY],
    ["delivery", str(uuid.uuid4()), "--status", "delivered", "--code", CANARY],
    ["get", CANARY * 5000],
    ["tasks", "--status", CANARY + "\n{\"ok\":true}"],
    ["reconcile", "--active-grace-seconds", CANARY],
    ["prune", "--older-than", "-" + CANARY],
    [CANARY, "\u202e\u0000x"],
    ["status", "--format", CANARY],
    [""],
])
def test_cli_real_subprocess_hostile_argv(env: _Env, argv: list[str]) -> None:
    argv = [a.replace("\u0000", "") for a in argv]  # a real argv cannot hold NUL
    code, out, err = run_cli("--db", env.db, *argv)
    assert CANARY not in out
    assert_cli_error(code, out, err)


def test_cli_real_subprocess_undecodable_argv(env: _Env) -> None:
    import subprocess

    proc = subprocess.run([sys.executable, "-m", "task_state_guard", "--db", env.db.encode(),
                           b"get", b"\xff\xfe" + CANARY.encode()], capture_output=True,
                          env=cli_env(), timeout=60, check=False)
    assert proc.stderr == b"" and CANARY.encode() not in proc.stdout
    assert_cli_error(proc.returncode, proc.stdout.decode(), "")


@pytest.mark.sqlite_only(reason="a SQLite path (a directory named with the canary)")
def test_cli_canary_database_path_is_not_echoed(tmp_path: Path) -> None:
    db = tmp_path / f"d{CANARY}" / "tasks.sqlite"
    for args in (["doctor"], ["init"], ["create"], ["status"], ["metrics"]):
        code, out, err = run_cli("--db", str(db), *args)
        assert err == "" and CANARY not in out and code in (0, 2)


# ----------------------------------------------------------------------------- API fuzz
ANY = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(), canary_text(), st.text(max_size=20),
    st.binary(max_size=20), st.uuids(), st.uuids().map(str),
    st.uuids().map(lambda u: str(u).upper()),
    st.lists(st.text(max_size=5), max_size=3), st.dictionaries(st.text(max_size=3), st.integers(),
                                                                max_size=2),
    st.just(float("nan")), st.just(float("inf")), st.just(-0.0), st.just(10**30),
    st.sampled_from(["queued", "running", "succeeded", "failed", "cancelled", "timed_out",
                     "delivered", "not_applicable", "completed", "internal_task", "x" * 300]),
)


def _in_atomic(ledger: Ledger, fn: Any) -> Any:
    with ledger.atomic():
        return fn()


def _constant(value: Any) -> Any:
    return lambda: value


def _allowed(fn: Any) -> Any:
    """Run ``fn``: only a return value or a LedgerError subclass is acceptable."""
    try:
        result = fn()
    except LedgerError as exc:
        assert CANARY not in str(exc) and CANARY not in repr(exc.args)
        return exc
    assert CANARY not in repr(result)
    return result


@FUZZ
@given(data=st.data())
def test_api_argument_fuzz(env: _Env, data: st.DataObject) -> None:
    ledger = Ledger(env.db)
    try:
        some = st.one_of(ANY, st.sampled_from(env.ids))
        d = data.draw
        calls = [
            lambda: ledger.create_task(task_id=d(some), parent_id=d(some),
                                       timeout_seconds=d(ANY), delivery_required=d(ANY),
                                       name=d(ANY), payload_hash=d(ANY)),
            lambda: ledger.create_task(task_id=d(ANY)),
            lambda: ledger.create_task(name=d(ANY)),
            lambda: ledger.create_task(timeout_seconds=d(ANY)),
            lambda: ledger.create_task(framework_id=d(some)),
            lambda: ledger.start_task(d(some), owner=d(ANY)),
            lambda: ledger.heartbeat(d(some)),
            lambda: ledger.heartbeat_many(d(st.lists(some, max_size=4))),
            lambda: ledger.heartbeat_many(d(st.one_of(canary_text(), st.binary(max_size=4)))),
            lambda: ledger.close_task(d(some), d(ANY), code=d(ANY)),
            lambda: ledger.set_delivery(d(some), d(ANY), code=d(ANY)),
            lambda: ledger.get_task(d(some)),
            lambda: ledger.children_of(d(some)),
            lambda: ledger.find_task_ids(d(ANY), stale_seconds=d(ANY), limit=d(ANY)),
            lambda: ledger.find_task_ids("queued", name=d(ANY), older_than_seconds=d(ANY)),
            lambda: ledger.list_tasks(status=d(ANY), name=d(ANY), attempts=d(ANY),
                                      stale_seconds=d(ANY), older_than_seconds=d(ANY),
                                      limit=d(ANY)),
            lambda: ledger.list_tasks(limit=d(ANY)),
            lambda: ledger.events_of(d(some)),
            lambda: ledger.reconcile(dry_run=d(ANY), progress=d(ANY)),
            lambda: ledger.prune(d(ANY), dry_run=d(ANY), progress=d(ANY)),
            lambda: ledger.prune(d(ANY), dry_run=True, progress=lambda done, total: None),
            lambda: ledger.reconcile(ReconcilePolicy(d(ANY), d(ANY)), dry_run=d(ANY)),
            lambda: ledger.reconcile(d(ANY), dry_run=d(ANY)),
            lambda: reconcile_restart(ledger, d(ANY), d(ANY)),
            lambda: ledger.reconcile(dry_run=d(ANY), on_decision=d(ANY)),
            lambda: reconcile_restart(ledger, dry_run=d(ANY), on_decision=[].append),
            lambda: ledger.prune(d(ANY), dry_run=d(ANY)),
            lambda: ledger.status(active_grace_seconds=d(ANY)),
            lambda: ledger.claim_verdicts(d(ANY), limit=d(ANY), lease_seconds=d(ANY),
                                          task_ids=d(ANY)),
            lambda: ledger.claim_verdicts("celery", task_ids=d(st.lists(some, max_size=4))),
            lambda: ledger.has_claimable_verdicts(d(ANY)),
            lambda: ledger.mark_verdicts_published(d(ANY)),
            lambda: ledger.mark_verdicts_published(d(st.lists(some, max_size=4))),
            lambda: ledger.release_verdicts(d(ANY)),
            lambda: ledger.release_verdicts(ledger.claim_verdicts("dramatiq")),
            lambda: payload_fingerprint(d(ANY)),
            lambda: Heartbeater(ledger, d(ANY)),
            lambda: Heartbeater(d(ANY)),
            lambda: Ledger(env.db, clock=d(ANY)),
            lambda: Ledger(env.db, busy_timeout_ms=d(ANY), allow_external_acl=d(ANY),
                           read_only=d(ANY), snapshot_max_bytes=d(ANY),
                           transient_sidecars=d(ANY)),
            lambda: Ledger(env.db, clock=_constant(d(ANY))).create_task(),
            lambda: _in_atomic(ledger, lambda: ledger.create_task(task_id=d(some),
                                                                  name=d(ANY))),
            lambda: _in_atomic(ledger, lambda: _in_atomic(
                ledger, lambda: ledger.close_task(d(some), d(ANY), code=d(ANY)))),
        ]
        for index in data.draw(st.lists(st.integers(0, len(calls) - 1), min_size=1,
                                        max_size=4)):
            _allowed(calls[index])
        assert ledger.doctor()["healthy"]
    finally:
        ledger.close()


@pytest.mark.sqlite_only(reason="fuzzed SQLite file paths")
@FUZZ
@given(path=st.one_of(canary_text(), st.text(max_size=30), st.binary(max_size=10), ANY))
def test_api_ledger_path_fuzz(path: Any) -> None:
    if isinstance(path, str | bytes) and (
            path[:1] in ("/", b"/", "~") or ".." in str(path) or "\\" in str(path)):
        return  # keep the fuzzer inside its own working directory
    base = private_dir()
    cwd = os.getcwd()
    os.chdir(base)
    try:
        result = _allowed(lambda: Ledger(path).close())
        assert result is None or isinstance(result, LedgerError)
    finally:
        os.chdir(cwd)
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.parametrize("value", [5, None, 1.5, object()])
def test_api_heartbeat_many_non_iterable(env: _Env, value: object) -> None:
    """Used to raise TypeError (fixed in the core)."""
    with Ledger(env.db) as ledger, pytest.raises(InvalidInput):
        ledger.heartbeat_many(value)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- tampered rows
TAMPERS = {
    "code": ("UPDATE tsg_tasks SET status='failed', ended_at=updated_at, terminal_code=? "
             "WHERE id=?"),
    "delivery_code": ("UPDATE tsg_tasks SET status='failed', ended_at=updated_at, "
                      "delivery_status='failed', delivery_updated_at=updated_at, "
                      "delivery_code=? WHERE id=?"),
    "name": "UPDATE tsg_tasks SET name=? WHERE id=?",
    "payload_hash": "UPDATE tsg_tasks SET payload_hash=? WHERE id=?",
    "framework_id": "UPDATE tsg_tasks SET framework_id=? WHERE id=?",
    "owner": ("UPDATE tsg_tasks SET status='running', started_at=created_at, owner=? "
              "WHERE id=?"),
    "timestamp": "UPDATE tsg_tasks SET heartbeat_at=? WHERE id=?",
    "event_code": "UPDATE tsg_events SET code=? WHERE task_seq=(SELECT seq FROM tsg_tasks "
                  "WHERE id=?)",
}


def _tamper_case(db: str, field: str) -> None:
    with Ledger(db) as ledger:
        parent = ledger.create_task()
        child = ledger.create_task(parent_id=parent.id)
    ledger_backends.write_raw(db, TAMPERS[field], (f"{CANARY} secret text", child.id))
    outputs = []
    for args in (["get", child.id], ["children", parent.id], ["tasks", "--status", "failed"],
                 ["tasks", "--status", "running"], ["status"], ["metrics"],
                 ["status", "--format", "text"], ["doctor"], ["reconcile", "--dry-run"],
                 ["get", child.id, "--events"], ["get", child.id, "--format", "text"],
                 ["children", parent.id, "--format", "text"], ["tasks", "--details"],
                 ["tasks", "--format", "text", "--attempts"], ["doctor", "--format", "text"],
                 ["reconcile", "--dry-run", "--format", "text"]):
        code, out, err = main_in_process(["--db", str(db), *args])
        assert err == "" and code in (0, 1, 2)
        outputs.append(out)
    with Ledger(db) as ledger:
        for call in (lambda: ledger.get_task(child.id), lambda: ledger.children_of(parent.id)):
            with suppress(LedgerError):
                outputs.append(repr(call()))
        report = ledger.doctor()
    assert not report["healthy"], "doctor must notice the tampered row"
    leaked = [o for o in outputs if CANARY in o]
    assert not leaked, "a tampered value was returned"


@pytest.mark.parametrize("field", sorted(set(TAMPERS) - {"timestamp"}))
def test_tampered_rows_are_not_returned(ledger_target: str, field: str) -> None:
    """Free text written straight into the database never comes back (code, delivery_code,
    name, payload_hash and timestamps used to: fixed in the core)."""
    _tamper_case(ledger_target, field)


@pytest.mark.sqlite_only(reason="text in a REAL column: PostgreSQL's double precision refuses it")
def test_tampered_timestamp_is_not_returned(ledger_target: str) -> None:
    _tamper_case(ledger_target, "timestamp")


# ----------------------------------------------------------------------------- path attacks
def _victim(tmp_path: Path, wal: bool = True) -> tuple[Path, bytes]:
    victim = tmp_path / "victim" / "precious.sqlite"
    victim.parent.mkdir(mode=0o700)
    conn = sqlite3.connect(victim)
    if wal:
        conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE precious(v)")
    conn.execute("INSERT INTO precious VALUES ('keep')")
    conn.commit()
    conn.close()
    return victim, victim.read_bytes()


@pytest.mark.sqlite_only(reason="the SQLite file's path checks")
@pytest.mark.parametrize("existing", [True, False], ids=["existing-db", "new-db"])
def test_symlink_swapped_between_check_and_open(tmp_path: Path, existing: bool,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Deterministic race: the path check passes, then the db is swapped for a symlink."""
    victim, before = _victim(tmp_path)
    db = tmp_path / "l" / "tasks.sqlite"
    if existing:
        Ledger(db).close()
    else:
        db.parent.mkdir(mode=0o700)
    real_prepare = storage.prepare

    def prepare_then_swap(path: str, **kwargs: Any) -> Any:
        result = real_prepare(path, **kwargs)
        if os.path.lexists(path):
            os.unlink(path)
        os.symlink(victim, path)
        return result

    monkeypatch.setattr(storage, "prepare", prepare_then_swap)
    with pytest.raises(StorageError):  # a replaced file, or a symlink seen
        Ledger(db)
    monkeypatch.setattr(storage, "prepare", real_prepare)
    assert victim.read_bytes() == before
    refused = _allowed(lambda: Ledger(db))  # still a symlink: a StorageError, as in 0.1.0
    assert isinstance(refused, StorageError) and refused.reason == "file_is_symlink"


def _exchange(a: Path, b: Path) -> None:
    """Atomically swap two paths (Linux renameat2 RENAME_EXCHANGE): neither is ever absent."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    at_fdcwd, rename_exchange = -100, 2
    if libc.renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange):
        raise OSError(ctypes.get_errno(), "renameat2")


@pytest.mark.sqlite_only(reason="the SQLite file's path checks")
def test_symlink_swap_race_against_a_running_ledger(tmp_path: Path) -> None:
    """The database path flips atomically between the real file and a symlink to a victim
    while ledgers keep opening and writing: only ok or StorageError (a replaced file, or a
    symlink seen), and the victim is never
    touched. (A path that also vanishes in between: see the test below.)"""
    victim, before = _victim(tmp_path)
    db = tmp_path / "l" / "tasks.sqlite"
    Ledger(db).close()
    stop = threading.Event()
    link = tmp_path / "l" / "link"
    os.symlink(victim, link)
    swaps = []

    def swapper() -> None:
        while not stop.is_set():
            _exchange(db, link)
            swaps.append(1)
        if db.is_symlink():
            _exchange(db, link)

    thread = threading.Thread(target=swapper, daemon=True)
    thread.start()
    outcomes: dict[str, int] = {}
    try:
        for _ in range(150):
            def attempt() -> None:
                with Ledger(db) as ledger:
                    ledger.create_task()
            result = _allowed(attempt)
            key = type(result).__name__ if result is not None else "ok"
            outcomes[key] = outcomes.get(key, 0) + 1
    finally:
        stop.set()
        thread.join()
    assert set(outcomes) <= {"ok", "StorageError"}, outcomes
    refused = outcomes.get("StorageError", 0)
    assert len(swaps) > 150 and refused > 0
    conn = sqlite3.connect(victim)
    assert conn.execute("SELECT v FROM precious").fetchall() == [("keep",)]
    assert [r[0] for r in conn.execute("SELECT name FROM sqlite_master")] == ["precious"]
    conn.close()
    assert victim.read_bytes() == before
    with Ledger(db) as ledger:
        assert ledger.doctor()["healthy"]


@pytest.mark.sqlite_only(reason="the SQLite file's creation")
def test_database_path_flapping_during_creation(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression (found by the live swap race, fixed in the core). Deterministic interleaving:
    after the path check found
    no database, another process creates the file (so O_EXCL fails) and removes it again
    before the re-check. Only the scheduling points are injected; the outcome must be a
    LedgerError (or a fresh ledger), never a raw exception."""
    db = tmp_path / "l" / "tasks.sqlite"
    real_prepare, real_check = storage.prepare, storage.check_regular_file
    armed = []

    def prepare_then_appear(path: str, **kwargs: Any) -> Any:
        result = real_prepare(path, **kwargs)
        if result.identity is None and not armed:
            armed.append(True)
            Path(path).touch(mode=0o600)
        return result

    def check_after_vanish(path: str, **kwargs: Any) -> Any:
        if armed == [True] and path == str(db):
            armed.append(False)
            os.unlink(path)
        return real_check(path, **kwargs)

    monkeypatch.setattr(storage, "prepare", prepare_then_appear)
    monkeypatch.setattr(storage, "check_regular_file", check_after_vanish)
    result = _allowed(lambda: Ledger(db).close())
    assert armed == [True, False]
    assert result is None or isinstance(result, LedgerError)


@pytest.mark.sqlite_only(reason="links to the SQLite file")
def test_hard_links_are_refused(tmp_path: Path) -> None:
    db = tmp_path / "l" / "tasks.sqlite"
    with Ledger(db) as ledger:
        ledger.create_task()
    alias = tmp_path / "l" / "alias.sqlite"
    os.link(db, alias)
    assert isinstance(_allowed(lambda: Ledger(db)), StorageError)  # as in 0.1.0
    assert_cli_error(*run_cli("--db", str(db), "doctor"), expected=("StateConflict",))
    assert_cli_error(*run_cli("--db", str(alias), "create"), expected=("StateConflict",))
    os.unlink(alias)
    Ledger(db).close()


@pytest.mark.sqlite_only(reason="the SQLite file's sidecars")
@pytest.mark.parametrize("suffix", ["-wal", "-shm", "-journal"])
@pytest.mark.parametrize("kind", ["symlink", "hardlink", "directory", "fifo"])
def test_sidecar_aliases_are_refused(tmp_path: Path, suffix: str, kind: str) -> None:
    db = tmp_path / "l" / "tasks.sqlite"
    with Ledger(db) as ledger:
        ledger.create_task()
    victim, before = _victim(tmp_path)
    side = Path(str(db) + suffix)
    if kind == "symlink":
        os.symlink(victim, side)
    elif kind == "hardlink":
        os.link(victim, side)
    elif kind == "directory":
        side.mkdir()
    else:
        os.mkfifo(side, 0o600)
    # a link alias and a non-file alike: a StorageError (StateConflict), as in 0.1.0
    assert isinstance(_allowed(lambda: Ledger(db)), StorageError)
    for args in (["create"], ["doctor"]):
        assert_cli_error(*run_cli("--db", str(db), *args, timeout=20),
                         expected=("StateConflict",))
    assert victim.read_bytes() == before


@pytest.mark.sqlite_only(reason="the SQLite file's path")
def test_database_path_aliases_are_refused(tmp_path: Path) -> None:
    victim, before = _victim(tmp_path)
    d = tmp_path / "l"
    d.mkdir(mode=0o700)
    (d / "link.sqlite").symlink_to(victim)
    (d / "dir.sqlite").mkdir()
    os.mkfifo(d / "fifo.sqlite", 0o600)
    for name, error, category in (("link.sqlite", StorageError, "StateConflict"),
                                  ("dir.sqlite", StorageError, "StateConflict"),
                                  ("fifo.sqlite", StorageError, "StateConflict")):
        assert isinstance(_allowed(lambda n=name: Ledger(d / n)), error)
        assert_cli_error(*run_cli("--db", str(d / name), "create", timeout=20),
                         expected=(category,))
    assert victim.read_bytes() == before


@pytest.mark.sqlite_only(reason="the SQLite backend's owner lock directory")
def test_owner_directory_alias_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "l" / "tasks.sqlite"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    with Ledger(db) as ledger:
        task = ledger.create_task()
        os.symlink(elsewhere, str(db) + "-owners")
        assert isinstance(_allowed(lambda: ledger.start_task(task.id)), UnsafeLocation)
        assert ledger.get_task(task.id).status == "queued"
        assert os.listdir(elsewhere) == []


@pytest.mark.sqlite_only(reason="the SQLite file's directories")
@pytest.mark.parametrize("case", ["ancestor-0777", "ancestor-0775", "leaf-0777", "leaf-0770",
                                  "ancestor-foreign-owner", "leaf-foreign-owner",
                                  "leaf-symlink-to-open-dir"])
def test_unsafe_ancestors_are_refused(tmp_path: Path, case: str) -> None:
    base = tmp_path / "base"
    base.mkdir(mode=0o700)
    leaf = base / "leaf"
    leaf.mkdir(mode=0o700)
    if case.startswith("ancestor-0"):
        os.chmod(base, int(case[-4:], 8))
    elif case.startswith("leaf-0"):
        os.chmod(leaf, int(case[-4:], 8))
    elif case == "ancestor-foreign-owner":
        os.chown(base, 65534, 65534)
    elif case == "leaf-foreign-owner":
        os.chown(leaf, 65534, 65534)
    else:
        open_dir = tmp_path / "open"
        open_dir.mkdir()
        os.chmod(open_dir, 0o777)
        leaf.rmdir()
        leaf.symlink_to(open_dir)
    db = leaf / "tasks.sqlite"
    assert isinstance(_allowed(lambda: Ledger(db)), UnsafeLocation)
    assert_cli_error(*run_cli("--db", str(db), "create"), expected=("InvalidInput",))
    assert not db.exists()


@pytest.mark.sqlite_only(reason="the SQLite file's directories")
def test_sticky_world_writable_ancestor_is_accepted(tmp_path: Path) -> None:
    base = tmp_path / "shared"
    base.mkdir()
    os.chmod(base, 0o1777)
    with Ledger(base / "mine" / "tasks.sqlite") as ledger:
        ledger.create_task()
        info = ledger.storage_info()
    assert info["database_mode"] == "0o600"
    assert stat.S_IMODE(os.stat(base / "mine").st_mode) == 0o700


def test_everything_exported_is_covered() -> None:
    """Keep the fuzz honest: a new public name must be added to the fuzzers above."""
    assert set(task_state_guard.__all__) == {
        "DeliveryStatus", "Heartbeater", "InvalidInput", "Ledger", "LedgerBusy", "LedgerError",
        "ReconcileDecision", "ReconcilePolicy", "StateConflict", "StorageError", "Task",
        "TaskNotFound", "TaskStatus", "UnsafeLocation", "__version__", "payload_fingerprint",
        "reconcile_restart", "ListedTask", "TaskListing", "TaskEvent",  # results of the reads
        "Verdict",  # what claim_verdicts returns (fuzzed through claim and release above)
        "reasons"}  # constants only; check_cli_contract holds every emitted reason to them
    json.dumps(task_state_guard.__version__)
