"""StubBroker + programmatic ``dramatiq.Worker`` (how users test their own apps), install API,
settings, late completions, ledger errors, heartbeats during shutdown and fork safety."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dramatiq
import pytest
from _dramatiq_helpers import assert_healthy, attempts_of, outcomes, parent_of, wait_for
from dramatiq.brokers.stub import StubBroker
from dramatiq.middleware import AsyncIO, Retries
from ledger_backends import write_transactions
from task_state_guard import Ledger
from task_state_guard_dramatiq import (
    TaskStateGuardMiddleware,
    attempt_task_id,
    find,
    install,
    logical_task_id,
    uninstall,
)


@pytest.fixture
def db(ledger_target: str) -> str:
    """The test's ledger on its backend (``[sqlite]``: a path, ``[postgresql]``: a URL)."""
    return ledger_target


@pytest.fixture
def ledger(db: str) -> Iterator[Ledger]:
    led = Ledger(db)
    yield led
    assert_healthy(led)
    led.close()


def start_worker(worker: dramatiq.Worker) -> None:
    """Start ``worker`` and wait until each of its threads runs: Dramatiq's threads set
    ``running`` at the start of ``run()``, so a ``stop()`` that comes before a thread was first
    scheduled is lost and ``stop()`` then waits out its join timeout (seen under load)."""
    worker.start()
    threads = [*worker.workers, *worker.consumers.values()]
    wait_for(lambda: all(t.running for t in threads), 30, "the worker's threads running")


class App:
    """A StubBroker app with the guard installed and a programmatic Worker."""

    def __init__(self, db: str | Path, **settings: Any) -> None:
        self.broker = StubBroker(fail_fast_default=False)
        self.broker.add_middleware(AsyncIO())
        settings.setdefault("heartbeat_seconds", 0.1)
        self.guard = install(self.broker, db=db, **settings)
        dramatiq.set_broker(self.broker)
        self.worker: dramatiq.Worker | None = None

    def start(self) -> App:
        self.worker = dramatiq.Worker(self.broker, worker_threads=2, worker_timeout=50)
        start_worker(self.worker)
        return self

    def join(self, queue: str = "default") -> None:
        self.broker.join(queue)
        assert self.worker is not None
        self.worker.join()

    def stop(self) -> None:
        if self.worker is not None:
            self.worker.stop()
            self.worker = None
        self.broker.close()


@pytest.fixture
def app(db: str) -> Iterator[App]:
    application = App(db, strict=True)
    yield application
    application.stop()


def test_stub_success_failure_retry(app: App, ledger: Ledger) -> None:
    calls: dict[str, int] = {}

    @dramatiq.actor(max_retries=0)
    def good() -> None:
        pass

    @dramatiq.actor(max_retries=0, tsg_delivery=True)
    def bad() -> None:
        raise ValueError("boom")

    @dramatiq.actor(max_retries=3, min_backoff=10, max_backoff=20)
    def flaky() -> None:
        calls["flaky"] = calls.get("flaky", 0) + 1
        if calls["flaky"] < 3:
            raise ValueError("again")

    app.start()
    ok_id = good.send().message_id
    bad_id = bad.send().message_id
    flaky_id = flaky.send().message_id
    app.join()

    parent = parent_of(ledger, ok_id)
    assert parent is not None
    assert (parent.status, parent.terminal_code) == ("succeeded", "worker_completed")
    assert parent.name == "good" and parent.delivery_required is False
    assert outcomes(attempts_of(ledger, ok_id)) == [("succeeded", "worker_completed")]

    parent = parent_of(ledger, bad_id)
    assert parent is not None
    assert (parent.status, parent.terminal_code) == ("failed", "worker_failed")
    assert parent.delivery_required is True
    assert outcomes(attempts_of(ledger, bad_id)) == [("failed", "worker_failed")]

    parent = parent_of(ledger, flaky_id)
    assert parent is not None
    assert (parent.status, parent.terminal_code) == ("succeeded", "worker_completed")
    assert outcomes(attempts_of(ledger, flaky_id)) == [
        ("failed", "retry_scheduled"),
        ("failed", "retry_scheduled"),
        ("succeeded", "worker_completed"),
    ]
    assert [a.id for a in attempts_of(ledger, flaky_id)] == [
        attempt_task_id(flaky_id, n) for n in range(3)
    ]
    assert app.guard.stats()["errors"] == {}


def test_stub_async_actors(app: App, ledger: Ledger) -> None:
    calls = {"n": 0}

    @dramatiq.actor(max_retries=0)
    async def async_good() -> None:
        pass

    @dramatiq.actor(max_retries=2, min_backoff=10, max_backoff=20)
    async def async_flaky() -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            raise ValueError("once")

    @dramatiq.actor(max_retries=0)
    async def async_bad() -> None:
        raise ValueError("always")

    app.start()
    ids = [async_good.send().message_id, async_flaky.send().message_id]
    bad_id = async_bad.send().message_id
    app.join()
    assert outcomes(attempts_of(ledger, ids[0])) == [("succeeded", "worker_completed")]
    assert outcomes(attempts_of(ledger, ids[1])) == [
        ("failed", "retry_scheduled"),
        ("succeeded", "worker_completed"),
    ]
    assert outcomes(attempts_of(ledger, bad_id)) == [("failed", "worker_failed")]
    for mid in (*ids, bad_id):
        parent = parent_of(ledger, mid)
        assert parent is not None
        assert parent.status == ("failed" if mid == bad_id else "succeeded")


def test_mark_delivered_inside_actor_and_delivery_failed_outside(app: App, ledger: Ledger) -> None:
    guard = app.guard

    @dramatiq.actor(max_retries=0, tsg_delivery=True)
    def answer() -> None:
        # Inside the actor the logical task is still running: the mark is deferred.
        assert guard.mark_delivered(seen["id"]) is None

    @dramatiq.actor(max_retries=0, tsg_delivery=True)
    def lost_answer() -> None:
        pass

    seen: dict[str, str] = {}
    app.start()
    msg = answer.message()
    seen["id"] = msg.message_id
    app.broker.enqueue(msg)
    other = lost_answer.send().message_id
    app.join()
    parent = parent_of(ledger, msg.message_id)
    assert parent is not None
    assert (parent.delivery_status, parent.delivery_code) == ("delivered", "transport_acknowledged")
    task = guard.mark_delivery_failed(other)
    assert task is not None and (task.delivery_status, task.delivery_code) == (
        "failed",
        "transport_failed",
    )


def test_late_completion_is_logged_and_counted_never_rewritten(
    app: App, ledger: Ledger, db: str, caplog: pytest.LogCaptureFixture
) -> None:
    guard = app.guard

    @dramatiq.actor(max_retries=0)
    def outlived() -> None:
        attempt = guard.current_attempt_id()
        assert attempt is not None
        # Meanwhile, somebody else's reconcile timed this attempt out.
        other = Ledger(db)
        other.close_task(attempt, "timed_out", code="restart_stale")
        other.close()

    app.start()
    mid = outlived.send().message_id
    with caplog.at_level(logging.WARNING, logger="task_state_guard_dramatiq"):
        app.join()
    attempts = attempts_of(ledger, mid)
    assert outcomes(attempts) == [("timed_out", "restart_stale")]  # not rewritten
    assert guard.stats()["conflicts"] == {"attempt_close": 1}
    assert sum("attempt_close refused" in r.getMessage() for r in caplog.records) == 1
    assert guard.stats()["errors"] == {}


def test_install_is_idempotent_outermost_and_symmetric(db: str) -> None:
    broker = StubBroker()
    before = list(broker.middleware)
    guard = install(broker, db=db)
    assert broker.middleware[0] is guard
    assert install(broker, db=db) is guard
    assert sum(isinstance(m, TaskStateGuardMiddleware) for m in broker.middleware) == 1
    assert find(broker) is guard
    assert "tsg_delivery" in broker.actor_options
    assert isinstance(broker.middleware[-1], Retries)

    @dramatiq.actor(broker=broker, tsg_delivery=True)
    def declared() -> None:
        pass

    assert uninstall(broker) is True
    assert uninstall(broker) is False
    assert broker.middleware == before
    assert "tsg_delivery" not in broker.actor_options
    with pytest.raises(ValueError):

        @dramatiq.actor(broker=broker, tsg_delivery=True)
        def rejected() -> None:
            pass

    assert install(broker, db=db) is not guard  # a fresh install after uninstall
    broker.close()


def test_settings_from_arguments_then_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "ledger" / "tasks.sqlite"  # settings only: nothing is opened
    monkeypatch.setenv("TSG_DB", str(db))
    monkeypatch.setenv("TSG_ACTIVE_GRACE_SECONDS", "120")
    monkeypatch.setenv("TSG_DELIVERY_GRACE_SECONDS", "30")
    monkeypatch.setenv("TSG_STRICT", "yes")
    from_env = TaskStateGuardMiddleware()
    assert from_env.settings.db == str(db)
    assert from_env.settings.active_grace_seconds == 120
    assert from_env.settings.delivery_grace_seconds == 30
    assert from_env.settings.heartbeat_seconds == 30  # min(30, active grace / 4)
    assert from_env.settings.strict is True
    explicit = TaskStateGuardMiddleware(
        db=db.parent / "other.sqlite", active_grace_seconds=10, strict=False
    )
    assert explicit.settings.db == str(db.parent / "other.sqlite")
    assert explicit.settings.active_grace_seconds == 10
    assert explicit.settings.heartbeat_seconds == 2.5
    assert explicit.settings.strict is False
    monkeypatch.delenv("TSG_DB")
    with pytest.raises(ValueError):
        TaskStateGuardMiddleware()
    monkeypatch.setenv("TSG_ACTIVE_GRACE_SECONDS", "soon")
    with pytest.raises(ValueError):
        TaskStateGuardMiddleware(db=db)


def test_ledger_errors_logged_once_per_kind_and_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    application = App(blocker / "tasks.sqlite")
    ran = {"n": 0}

    @dramatiq.actor(max_retries=0)
    def work() -> None:
        ran["n"] += 1

    with caplog.at_level(logging.WARNING, logger="task_state_guard_dramatiq"):
        application.start()
        for _ in range(5):
            work.send()
        application.join()
        application.stop()
    assert ran["n"] == 5  # the user's jobs ran regardless
    stats = application.guard.stats()
    assert sum(v for k, v in stats["errors"].items() if k.startswith("before_process_message")) == 5
    logged = [
        r for r in caplog.records if "ledger error (before_process_message" in r.getMessage()
    ]
    assert len(logged) == 1


def test_strict_mode_raises_into_dramatiq(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    application = App(blocker / "tasks.sqlite", strict=True)

    @dramatiq.actor(max_retries=0)
    def work() -> None:
        pass

    with caplog.at_level(logging.CRITICAL):
        application.start()
        work.send()
        application.join()
        application.stop()
    assert any(
        "Unexpected failure in before_process_message" in r.getMessage() for r in caplog.records
    )


def test_heartbeats_continue_until_after_worker_shutdown(app: App, ledger: Ledger) -> None:
    started = threading.Event()

    @dramatiq.actor(max_retries=0)
    def slow() -> None:
        started.set()
        time.sleep(1.2)

    app.start()
    mid = slow.send().message_id
    assert started.wait(5)
    attempt_id = attempt_task_id(mid, 0)
    assert app.worker is not None
    worker = app.worker
    stopper = threading.Thread(target=worker.stop)
    stopper.start()  # before_worker_shutdown fires now; the actor keeps running
    time.sleep(0.1)
    first = ledger.get_task(attempt_id).heartbeat_at
    wait_for(
        lambda: (ledger.get_task(attempt_id).heartbeat_at or 0) > (first or 0),
        3,
        "a heartbeat during the shutdown",
    )
    stopper.join(10)
    app.worker = None
    assert ledger.get_task(attempt_id).status == "succeeded"
    assert app.guard.runtime.handle.state().heartbeater is None  # stopped at after_worker_shutdown


def test_no_connection_crosses_fork(app: App, ledger: Ledger) -> None:
    @dramatiq.actor(max_retries=0)
    def child_job() -> None:
        pass

    parent_ledger = app.guard.ledger
    parent_ledger.status()  # a connection is open in this (parent) process
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        code = 1
        try:
            child_ledger = app.guard.ledger
            if child_ledger is not parent_ledger:
                app.start()
                message_id = child_job.send().message_id
                app.join()
                app.stop()
                if child_ledger.get_task(logical_task_id(message_id)).status == "succeeded":
                    os.write(write, message_id.encode())
                    code = 0
        finally:
            os._exit(code)
    os.close(write)
    _, status = os.waitpid(pid, 0)
    message_id = os.read(read, 100).decode()
    os.close(read)
    assert os.waitstatus_to_exitcode(status) == 0
    parent = parent_of(ledger, message_id)
    assert parent is not None and parent.status == "succeeded"
    assert app.guard.ledger is parent_ledger  # the parent keeps its own


def test_misplaced_middleware_warns(db: str, caplog: pytest.LogCaptureFixture) -> None:
    broker = StubBroker()
    broker.add_middleware(TaskStateGuardMiddleware(db=db))  # appended: after Retries
    worker = dramatiq.Worker(broker, worker_timeout=50)
    with caplog.at_level(logging.WARNING, logger="task_state_guard_dramatiq"):
        start_worker(worker)
        worker.stop()
    broker.close()
    assert any("must be the outermost" in r.getMessage() for r in caplog.records)


def test_ids_and_name_labels() -> None:
    import uuid

    from task_state_guard import InvalidInput
    from task_state_guard.integration import name_label as label
    from task_state_guard_dramatiq import MESSAGE_NAMESPACE

    mid = "0b8f1a52-6f0e-4c1e-9a55-3a0d2b0c9e11"
    assert logical_task_id(mid) == str(uuid.uuid5(MESSAGE_NAMESPACE, mid))
    assert logical_task_id(mid) == logical_task_id(mid)
    assert attempt_task_id(mid, 0) != attempt_task_id(mid, 1) != logical_task_id(mid)
    assert label("send_email") == "send_email"
    assert label("émoji actor!") == "_moji_actor_"
    assert label("x" * 300) == "x" * 200
    with pytest.raises(InvalidInput):
        logical_task_id("")


def test_delivery_obligation_per_message(app: App, ledger: Ledger) -> None:
    @dramatiq.actor(max_retries=0)
    def plain() -> None:
        pass

    app.start()
    mid = plain.send_with_options(tsg_delivery=True).message_id
    other = plain.send().message_id
    app.join()
    parent = parent_of(ledger, mid)
    assert parent is not None and parent.delivery_required is True
    parent = parent_of(ledger, other)
    assert parent is not None and parent.delivery_required is False


def test_start_and_retry_are_each_one_transaction(db: str, ledger: Ledger) -> None:
    """A message's start (its logical task created and started, its attempt created and
    started) commits as one transaction before the job runs, its end as one more, and a
    retry's queued successor commits with the failed attempt's close: all or nothing, so a
    failure late in the start leaves no half-recorded message. The transactions are counted
    in the storage itself (``write_transactions``: the WAL's commit frames, the distinct
    transactions among PostgreSQL's event rows), with heartbeats off so that only the
    messages write: a start split in two, or a successor written on its own, adds one."""
    application = App(db, heartbeat_seconds=0)
    seen: list[int] = []  # the count each job body saw
    base: list[int] = []

    @dramatiq.actor(max_retries=0)
    def work() -> None:
        seen.append(write_transactions(db)[1])

    @dramatiq.actor(max_retries=1, min_backoff=10, max_backoff=10)  # milliseconds
    def again() -> None:
        if len(seen) == 2:
            # The retry: Retries enqueued it before the failed attempt's close commits (at
            # the ack), so with a 10 ms backoff it may start first. Wait for the close: the
            # count then includes it, and a start or close written in two adds one still.
            deadline = time.monotonic() + 30
            while write_transactions(db)[1] - base[0] < 5 and time.monotonic() < deadline:
                time.sleep(0.02)
        seen.append(write_transactions(db)[1])
        if len(seen) == 2:
            raise ValueError("once")

    try:
        application.start()
        epoch, before = write_transactions(db)
        base.append(before)
        done = work.send().message_id
        application.join()
        mid = again.send().message_id
        application.join()
    finally:
        application.stop()
    final_epoch, after = write_transactions(db)
    # the same WAL throughout, so the counts compare (none yet at the start: a new ledger is
    # put in place whole, and a boot with nothing to reconcile writes nothing)
    assert final_epoch is not None and epoch in (None, final_epoch)
    # work: start (1, committed before the body ran), end (2); again: start (3), the failed
    # attempt's close with its queued successor (4), the retry's start (5), its end (6).
    assert [n - before for n in seen] == [1, 3, 5]
    assert after - before == 6
    assert application.guard.stats()["errors"] == {}
    parent = parent_of(ledger, done)
    assert parent is not None and parent.status == "succeeded"
    parent = parent_of(ledger, mid)
    assert parent is not None
    assert (parent.status, parent.terminal_code) == ("succeeded", "worker_completed")
    attempts = attempts_of(ledger, mid)
    assert outcomes(attempts) == [("failed", "retry_scheduled"), ("succeeded", "worker_completed")]
    # The queued successor is written first, in the transaction that closes the failed
    # attempt: the logical task never has a moment without an open child.
    assert attempts[1].created_at <= attempts[0].ended_at  # type: ignore[operator]
