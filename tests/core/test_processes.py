"""Connections across threads and fork() and owner liveness with real processes,
including a live owner in another pid namespace, and parent freshness over a dead owner."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from core_helpers import (
    T0,
    Clock,
    check_report,
    cli_env,
    is_sqlite,
    run_cli,
    sidecars,
    skip_unless_ci,
    snapshot_tree,
    without_counts_flags,
)
from ledger_backends import ledger_target
from task_state_guard import Heartbeater, Ledger, LedgerError, ReconcilePolicy

POLICY = ReconcilePolicy(active_grace_seconds=600, delivery_grace_seconds=600)


class TickClock:
    """Thread-safe, strictly increasing clock (reads happen inside write transactions)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._n = itertools.count()

    def __call__(self) -> float:
        with self._lock:
            return T0 + next(self._n) / 1000.0


# ----------------------------------------------------------------------------- threads


def test_many_threads_share_one_ledger(db: str) -> None:
    led = Ledger(db, clock=TickClock())
    errors: list[BaseException] = []
    per_thread = 25
    barrier = threading.Barrier(8)

    def work() -> None:
        try:
            barrier.wait()
            for _ in range(per_thread):
                t = led.create_task()
                led.start_task(t.id)
                led.heartbeat(t.id)
                led.close_task(t.id, "succeeded", code="completed")
                led.set_delivery(t.id, "delivered", code="transport_acknowledged")
                assert led.get_task(t.id).delivery_status == "delivered"
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []
    report = led.doctor()
    assert report["healthy"] is True
    assert report["task_count"] == 8 * per_thread
    assert report["event_count"] == 8 * per_thread * 4
    led.close()


def test_concurrent_identical_closes_are_idempotent(db: str) -> None:
    led = Ledger(db, clock=TickClock())
    tasks = [led.create_task() for _ in range(20)]
    results: list[object] = []
    barrier = threading.Barrier(6)

    def closer(state: str) -> None:
        barrier.wait()
        for t in tasks:
            try:
                results.append(led.close_task(t.id, state).status)
            except LedgerError as exc:
                results.append(type(exc).__name__)

    threads = [threading.Thread(target=closer, args=(s,))
               for s in ("succeeded", "succeeded", "succeeded", "failed", "failed", "failed")]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert set(results) <= {"succeeded", "failed", "StateConflict"}
    for t in tasks:
        final = led.get_task(t.id).status
        assert results.count("StateConflict") >= 0 and final in ("succeeded", "failed")
    assert results.count("StateConflict") == 3 * len(tasks)
    assert led.doctor() == {**led.doctor(), "healthy": True, "event_count": 2 * len(tasks)}
    led.close()


def test_read_only_live_ledger_from_many_threads(db: str) -> None:
    writer = Ledger(db, clock=Clock())
    ids = [writer.create_task().id for _ in range(10)]
    reader = Ledger(db, clock=Clock(T0 + 10), read_only=True)
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for i in range(40):
                assert reader.get_task(ids[i % 10]).status == "queued"
                check_report(reader.reconcile(POLICY, dry_run=True), dry_run=True)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    reader.close()
    writer.close()
    assert errors == []


@pytest.mark.sqlite_only(reason="a closed SQLite file read in place (transient sidecars)")
@pytest.mark.parametrize("transient", [True, False])
def test_read_only_closed_ledger_from_many_threads(db: str, transient: bool) -> None:
    with Ledger(db, clock=Clock()) as writer:
        ids = [writer.create_task().id for _ in range(10)]
    reader = Ledger(db, clock=Clock(T0 + 10), read_only=True, transient_sidecars=transient)
    # in place through transient sidecars, or a verified private snapshot creating nothing
    assert reader.storage_info()["read_snapshot"] is not transient
    errors: list[BaseException] = []
    barrier = threading.Barrier(6)

    def work() -> None:
        try:
            barrier.wait()
            for i in range(60):
                assert reader.get_task(ids[i % 10]).status == "queued"
                reader.reconcile(POLICY, dry_run=True)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    reader.close()
    assert errors == []
    assert sidecars(db) == []


# ----------------------------------------------------------------------------- fork


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_ledger_after_fork_child_and_parent_both_work(db: str) -> None:
    clock = Clock()
    led = Ledger(db, clock=clock)
    mine = led.create_task()
    led.start_task(mine.id)  # owned by this (parent) process
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        status = 1
        try:
            os.close(read_fd)
            clock.advance(1)
            assert led.get_task(mine.id).status == "running"
            child_task = led.create_task()
            led.start_task(child_task.id)  # owned by the child
            other = led.create_task()
            led.close_task(other.id, "cancelled", code="skipped")
            os.write(write_fd, json.dumps([child_task.id, other.id]).encode())
            status = 0
        finally:
            os._exit(status)
    os.close(write_fd)
    with os.fdopen(read_fd) as handle:
        data = handle.read()
    _, wait_status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(wait_status) == 0
    child_running, child_closed = json.loads(data)
    clock.advance(2)
    assert led.get_task(child_closed).status == "cancelled"
    again = led.create_task()
    led.close_task(again.id, "succeeded")
    assert led.doctor()["healthy"] is True
    # the child is gone: its task is provably orphaned, the parent's is not
    report = led.reconcile(POLICY)
    assert report["tasks_timed_out"] == 1
    assert led.get_task(child_running).terminal_code == "owner_lost"
    assert led.get_task(mine.id).status == "running"
    led.close()


@pytest.mark.sqlite_only(reason="a closed SQLite file read in place (transient sidecars)")
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
@pytest.mark.parametrize("transient", [True, False])
def test_read_only_closed_ledger_after_fork(db: str, transient: bool) -> None:
    with Ledger(db, clock=Clock()) as writer:
        tid = writer.create_task().id
    reader = Ledger(db, clock=Clock(T0 + 1), read_only=True, transient_sidecars=transient)
    assert reader.storage_info()["read_snapshot"] is not transient
    assert reader.get_task(tid).status == "queued"
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = 0 if reader.get_task(tid).status == "queued" else 2
        finally:
            os._exit(code)
    _, wait_status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(wait_status) == 0
    assert reader.get_task(tid).status == "queued"
    reader.close()


# ----------------------------------------------------------------------------- owners

OWNER_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from task_state_guard import Ledger
    db, count = sys.argv[1], int(sys.argv[2])
    parent = sys.argv[3] if len(sys.argv) > 3 else None
    led = Ledger(db)
    ids = []
    for _ in range(count):
        task = led.create_task(parent_id=parent)
        led.start_task(task.id)
        ids.append(task.id)
    print(json.dumps(ids), flush=True)
    sys.stdin.read()  # stay alive (holding ownership) until stdin closes or a kill
    """
)


class Owner:
    """A real process that starts tasks and keeps running until told or killed."""

    def __init__(self, script: str, db: str, count: int, prefix: list[str] | None = None,
                 parent: str | None = None) -> None:
        args = [*(prefix or []), sys.executable, script, db, str(count)]
        if parent:
            args.append(parent)
        self.proc = subprocess.Popen(
            args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, env=cli_env(),
        )
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if not line:
            err = self.proc.stderr.read() if self.proc.stderr else ""
            self.proc.kill()
            raise AssertionError(f"owner process failed: {err[-2000:]}")
        self.ids: list[str] = json.loads(line)

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)
        self._close_pipes()

    def finish(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            self.proc.wait(timeout=30)
        self._close_pipes()

    def _close_pipes(self) -> None:
        for pipe in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if pipe is not None and not pipe.closed:
                pipe.close()


@pytest.fixture
def owner_script(tmp_path) -> str:
    path = tmp_path / "owner_process.py"
    path.write_text(OWNER_SCRIPT)
    return str(path)


def statuses(led: Ledger, ids: list[str]) -> list[tuple[str, str | None]]:
    return [(t.status, t.terminal_code) for t in (led.get_task(i) for i in ids)]


def test_sigkilled_owner_tasks_time_out_at_once(db: str, owner_script: str) -> None:
    Ledger(db).close()
    doomed = Owner(owner_script, db, 3)
    alive = Owner(owner_script, db, 2)
    try:
        with Ledger(db) as led:  # the real clock: everything started seconds ago
            own = led.create_task()
            led.start_task(own.id)
            unowned = led.create_task()
            led.start_task(unowned.id, owner=False)
            before_kill = led.reconcile(POLICY, dry_run=True)
            assert before_kill["tasks_timed_out"] == 0
            doomed.kill()
            assert led.status()["running_owner_dead"] == 3
            # SQLite: the owners' lock files sit next to the database file
            files = is_sqlite(db)
            entries = set(snapshot_tree(os.path.dirname(db))) if files else set()
            cli = run_cli("--db", db, "reconcile", "--dry-run")
            assert cli.code == 0 and cli.json["reconcile"]["tasks_timed_out"] == 3
            preview = led.reconcile(POLICY, dry_run=True)
            if files:  # dry-run only observes
                assert set(snapshot_tree(os.path.dirname(db))) == entries
            applied = led.reconcile(POLICY)
            if files:  # the dead owner's lock file goes once nothing references it
                remaining = set(snapshot_tree(os.path.dirname(db)))
                assert remaining < entries
            check_report(applied, dry_run=False)
            assert without_counts_flags(preview) == without_counts_flags(applied)
            assert applied["tasks_timed_out"] == 3
            assert applied["fresh_active_retained"] == 2 + 2
            assert statuses(led, doomed.ids) == [("timed_out", "owner_lost")] * 3
            assert statuses(led, alive.ids) == [("running", None)] * 2
            assert led.get_task(own.id).status == "running"
            assert led.get_task(unowned.id).status == "running"
            assert led.reconcile(POLICY)["tasks_timed_out"] == 0
            assert led.status()["running_owner_dead"] == 0
            assert led.doctor()["healthy"] is True
            # the surviving owner ends normally: now its tasks are provably lost too
            alive.finish()
            assert led.reconcile(POLICY)["tasks_timed_out"] == 2
            assert statuses(led, alive.ids) == [("timed_out", "owner_lost")] * 2
    finally:
        for owner in (doomed, alive):
            if owner.proc.poll() is None:
                owner.kill()


def _unshare_prefix() -> list[str]:
    tool = shutil.which("unshare")
    if tool is None:
        skip_unless_ci("unshare(1) is not installed")
    prefix = [tool, "--pid", "--fork", "--mount-proc", "--kill-child"]
    probe = subprocess.run([*prefix, sys.executable, "-c", "import os; print(os.getpid())"],
                           capture_output=True, text=True, check=False, timeout=30)
    if probe.returncode != 0:
        skip_unless_ci(f"the kernel refused a new pid namespace: {probe.stderr.strip()[:200]}")
    assert probe.stdout.strip() == "1", "the probe should be pid 1 in its own namespace"
    return prefix


def test_live_owner_in_another_pid_namespace_stays_running(db: str, owner_script: str) -> None:
    prefix = _unshare_prefix()
    Ledger(db).close()
    isolated = Owner(owner_script, db, 2, prefix=prefix)
    doomed = Owner(owner_script, db, 1)
    try:
        doomed.kill()
        with Ledger(db) as led:
            report = led.reconcile(POLICY)
            assert report["tasks_timed_out"] == 1
            assert statuses(led, isolated.ids) == [("running", None)] * 2
            assert statuses(led, doomed.ids) == [("timed_out", "owner_lost")]
            isolated.finish()
            assert led.reconcile(POLICY)["tasks_timed_out"] == 2
            assert statuses(led, isolated.ids) == [("timed_out", "owner_lost")] * 2
    finally:
        for owner in (isolated, doomed):
            if owner.proc.poll() is None:
                owner.kill()


def test_dead_owner_with_unknown_liveness_falls_back_to_grace(db: str) -> None:
    """Tasks started without an owner only follow the grace and deadline rules."""
    clock = Clock()
    with Ledger(db, clock=clock) as led:
        task = led.create_task()
        led.start_task(task.id, owner=False)
        assert led.get_task(task.id).has_owner is False
        clock.advance(599)
        assert led.reconcile(POLICY)["tasks_timed_out"] == 0
        clock.advance(1)
        assert led.reconcile(POLICY)["tasks_timed_out"] == 1
        assert led.get_task(task.id).terminal_code == "restart_stale"


# ------------------------------------------------------------- parent freshness over owners


def test_parent_with_queued_child_kept_even_when_its_owner_is_dead(
    db: str, owner_script: str
) -> None:
    Ledger(db).close()
    owner = Owner(owner_script, db, 1)
    parent = owner.ids[0]
    with Ledger(db) as led:
        retry = led.create_task(parent_id=parent, delivery_required=False)
    owner.kill()
    for jump in (0, 10**4, 10**8):
        with Ledger(db, clock=lambda j=jump: time.time() + j) as led:
            report = led.reconcile(POLICY, dry_run=True)
            applied = led.reconcile(POLICY)
            assert without_counts_flags(report) == without_counts_flags(applied)
            assert applied["tasks_timed_out"] == 0
            assert applied["fresh_active_retained"] == 2
            assert led.get_task(parent).status == "running"
    with Ledger(db, clock=lambda: time.time() + 10**8 + 1) as led:
        led.close_task(retry.id, "cancelled", code="revoked")
        assert led.reconcile(POLICY)["tasks_timed_out"] == 1
        assert led.get_task(parent).terminal_code == "owner_lost"
        assert led.doctor()["healthy"] is True


def test_heartbeater_keeps_running_work_fresh(db: str) -> None:
    clock = Clock()
    led = Ledger(db, clock=clock)
    task = led.create_task()
    led.start_task(task.id, owner=False)
    beater = Heartbeater(led, interval_seconds=0.02)
    try:
        clock.advance(500)
        beater.add(task.id)
        deadline = time.monotonic() + 10
        while led.get_task(task.id).heartbeat_at != clock.t and time.monotonic() < deadline:
            time.sleep(0.01)
        assert led.get_task(task.id).heartbeat_at == clock.t
    finally:
        beater.stop()
    clock.advance(500)  # 1000 s after the start, 500 s after the last beat
    assert led.reconcile(POLICY)["tasks_timed_out"] == 0
    assert led.doctor()["event_count"] == 2  # heartbeats write no events
    led.close()


WRITER_SCRIPT = textwrap.dedent(
    """
    import sys
    from task_state_guard import Ledger, LedgerError
    db, count = sys.argv[1], int(sys.argv[2])
    errors = 0
    with Ledger(db, busy_timeout_ms=30000) as led:
        for _ in range(count):
            try:
                task = led.create_task(name="proc.writer")
                led.start_task(task.id, owner=False)
                led.close_task(task.id, "succeeded", code="completed")
            except LedgerError:
                errors += 1
    sys.exit(1 if errors else 0)
    """
)


def test_many_processes_write_one_ledger(tmp_path, db: str) -> None:
    Ledger(db).close()
    script = tmp_path / "writer.py"
    script.write_text(WRITER_SCRIPT)
    procs = [
        subprocess.Popen([sys.executable, str(script), db, "60"], env=cli_env(),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for _ in range(4)
    ]
    outputs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0, 0], outputs
    with Ledger(db) as led:
        report = led.doctor()
        assert report["healthy"] is True
        assert report["task_count"] == 240 and report["event_count"] == 240 * 3
        assert led.status()["by_name"]["proc.writer"]["succeeded"] == 240


FIRST_OPEN_SCRIPT = textwrap.dedent(
    """
    import sys
    from task_state_guard import Ledger
    import task_state_guard_postgres  # imported before the start, as everything else is
    print("ready", flush=True)
    sys.stdin.readline()  # every process opens at the same instant: when all are ready
    with Ledger(sys.argv[1]) as led:
        led.create_task(name="proc.first_open")
    """
)


def test_processes_opening_a_new_ledger_at_once_all_succeed(tmp_path, backend: str) -> None:
    """Every first opener of a brand-new ledger races its set-up (SQLite: the WAL switch, which
    it refuses the losers at once; PostgreSQL: creating the schema), so the open must wait for
    the winner."""
    script = tmp_path / "first_open.py"
    script.write_text(FIRST_OPEN_SCRIPT)
    for round_ in range(3):
        directory = tmp_path / f"r{round_}"
        directory.mkdir(mode=0o700)
        with ledger_target(backend, directory) as db:
            if backend == "sqlite":
                db = str(directory / "tasks.sqlite")
            procs = [
                subprocess.Popen([sys.executable, str(script), db], env=cli_env(),
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE)
                for _ in range(6)
            ]
            # A fixed start time lost the race on a busy machine (imports outlasted it):
            # start them once every process has imported everything.
            for p in procs:
                assert p.stdout is not None and p.stdout.readline() == b"ready\n"
            outputs = [p.communicate(b"go\n", timeout=60) for p in procs]
            assert [p.returncode for p in procs] == [0] * 6, outputs
            with Ledger(db) as led:
                assert led.status()["by_name"]["proc.first_open"]["queued"] == 6
                assert led.doctor()["healthy"] is True


@pytest.mark.sqlite_only(reason="the WAL/SHM pair a closing SQLite writer removes")
def test_read_only_open_waits_out_a_writer_closing(db: str) -> None:
    """A closing writer removes the WAL, then the SHM: a read-only open that looks in between
    sees an incomplete pair. It waits (up to the busy timeout) instead of failing."""
    with Ledger(db) as led:
        led.create_task(name="proc.closing")
    fd = os.open(db + "-shm", os.O_CREAT | os.O_WRONLY, 0o600)  # the SHM not removed yet
    os.close(fd)
    timer = threading.Timer(0.3, os.unlink, args=(db + "-shm",))  # ... and now it is
    timer.start()
    try:
        started = time.monotonic()
        with Ledger(db, read_only=True) as led:
            assert led.status()["by_name"]["proc.closing"]["queued"] == 1
        assert time.monotonic() - started >= 0.25
    finally:
        timer.join()


SUPERVISOR_SCRIPT = textwrap.dedent(
    """
    import os, signal, sys
    from task_state_guard import Ledger

    db, supervise = sys.argv[1], sys.argv[2] == "1"
    with Ledger(db) as led:
        if supervise:
            led.supervise_children()
    ids = []
    for _ in range(2):
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # a pool child: starts its work, then dies without a word
            os.close(read)
            led = Ledger(db)
            task = led.create_task()
            led.start_task(task.id)
            os.write(write, task.id.encode())
            os.close(write)
            os.kill(os.getpid(), signal.SIGKILL)
        os.close(write)
        ids.append(os.read(read, 64).decode())
        os.close(read)
        os.waitpid(pid, 0)
    print(" ".join(ids), flush=True)
    sys.stdin.read()  # lives until the test closes stdin or kills it
    """
)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
@pytest.mark.parametrize("supervise", [True, False], ids=["supervised", "unsupervised"])
def test_supervised_childrens_work_is_lost_only_with_their_supervisor(
    db: str, tmp_path, supervise: bool
) -> None:
    """A process that supervises its forked children (a pool's main process) owns their work:
    a child's death alone proves nothing (the supervisor reports it), the supervisor's does.
    Unsupervised, the same dead children's work is ``owner_lost`` at once."""
    Ledger(db).close()
    script = tmp_path / "supervisor.py"
    script.write_text(SUPERVISOR_SCRIPT)
    proc = subprocess.Popen(
        [sys.executable, str(script), db, "1" if supervise else "0"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=cli_env(), text=True,
    )
    try:
        assert proc.stdout is not None
        ids = proc.stdout.readline().split()
        assert len(ids) == 2
        with Ledger(db) as led:
            report = led.reconcile(POLICY)
            if supervise:
                assert report["tasks_timed_out"] == 0
                assert statuses(led, ids) == [("running", None)] * 2
                proc.kill()
                proc.wait(30)
                assert led.reconcile(POLICY)["tasks_timed_out"] == 2
            else:
                assert report["tasks_timed_out"] == 2
            assert statuses(led, ids) == [("timed_out", "owner_lost")] * 2
            assert led.doctor()["healthy"] is True
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
