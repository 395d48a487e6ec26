"""The periodic verdict drain of a running worker: the ``verdict_interval_seconds`` setting (on by
default, 0 turns it off), the drain thread (publishes what an operator's ``tsg reconcile``
recorded, stops idempotently, survives its errors), and its check: a read that writes nothing
while nothing is owed (everything the ledger stores is unchanged, on both backends).

Runs on both backends through the public API: a runtime opens jobs as an adapter does, the real
CLI reconciles them; the adapters' own workers are tested in tests/celery, tests/dramatiq and
tests/langgraph.
"""

from __future__ import annotations

import json
import logging
import math
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from core_helpers import run_cli
from task_state_guard import Ledger
from task_state_guard.integration import (
    AdapterRuntime,
    AttemptSpec,
    ConfigurationError,
    LostTask,
    resolve_settings,
)
from task_state_guard.integration.settings import DEFAULT_VERDICT_INTERVAL_SECONDS

FID = "4d0c2a4e-7f43-4b8e-9b52-2f3f5b0e8c11"
ENV = "TSG_VERDICT_INTERVAL_SECONDS"


def _wait(predicate: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def _runtime(db: str, framework: str | None = "celery", **settings: Any) -> AdapterRuntime:
    return AdapterRuntime(resolve_settings(db=db, heartbeat_seconds=0, **settings),
                          logger=logging.getLogger("test.drain"), framework=framework,
                          adapter="celery")


def _lost_job(db: str) -> str:
    """A job as an adapter records it, then closed as lost by an operator's ``tsg reconcile``
    (a process of its own): one verdict owed to Celery. Returns its logical task id."""
    with Ledger(db) as ledger:
        opener = AdapterRuntime(resolve_settings(db_required=False, heartbeat_seconds=0),
                                logger=logging.getLogger("test.drain"), ledger=ledger,
                                framework="celery")
        logical = str(uuid.uuid5(uuid.NAMESPACE_URL, f"drain:{uuid.uuid4()}"))
        opener.open_logical(logical, delivery_required=False, name="app.job", framework_id=FID)
        opener.claim_attempt(AttemptSpec(logical, "app.job"))
    result = run_cli("--db", db, "reconcile", "--active-grace-seconds", "0")
    assert result.code == 0 and result.json["reconcile"]["tasks_timed_out"] == 2
    return logical


def stored_state(db: str) -> dict[str, str]:
    """``ledger_backends.stored_state`` (a digest of everything the ledger stores), taken in a
    process of its own: reading a SQLite file in this process would drop this process's locks
    on it (POSIX record locks belong to the process, and closing any descriptor of the file
    releases them)."""
    tests = str(Path(__file__).resolve().parents[1])
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); import ledger_backends; "
            "print(json.dumps(ledger_backends.stored_state(sys.argv[2])))")
    done = subprocess.run([sys.executable, "-c", code, tests, db], capture_output=True,
                          text=True, check=True, timeout=60)
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def _owed(db: str) -> dict[str, int]:
    with Ledger(db) as ledger:
        verdicts = ledger.status()["verdicts"]
    return {"pending": verdicts["pending"]["celery"], "published": verdicts["published"]["celery"]}


# ---------------------------------------------------------------------------- the setting


def test_the_setting_is_on_by_default_and_takes_the_duration_grammar() -> None:
    assert DEFAULT_VERDICT_INTERVAL_SECONDS == 10.0
    settings = resolve_settings(db="x", environ={})
    assert settings.verdict_interval_seconds == 10.0
    assert settings.reconcile_interval_seconds == 0  # independent: the reconcile stays off
    assert resolve_settings(db="x", environ={ENV: "30s"}).verdict_interval_seconds == 30.0
    assert resolve_settings(db="x", environ={ENV: "0"}).verdict_interval_seconds == 0.0
    assert resolve_settings(db="x", environ={ENV: "2.5"}).verdict_interval_seconds == 2.5
    assert resolve_settings(db="x", environ={ENV: ""}).verdict_interval_seconds == 10.0
    both = resolve_settings(db="x", environ={ENV: "1m", "TSG_RECONCILE_INTERVAL_SECONDS": "5m"})
    assert (both.verdict_interval_seconds, both.reconcile_interval_seconds) == (60.0, 300.0)
    explicit = resolve_settings(db="x", environ={ENV: "1m"}, verdict_interval_seconds=0)
    assert explicit.verdict_interval_seconds == 0.0  # the argument wins over the environment
    framework = resolve_settings(db="x", environ={ENV: "1m"},
                                 framework=lambda name: {"verdict_interval_seconds": "5"}.get(name))
    assert framework.verdict_interval_seconds == 5.0
    assert "verdict_interval_seconds=10.0" in repr(settings)


@pytest.mark.parametrize("value", ["-1", "soon", "1e3", "inf", "nan", "1w", " 5 ", "+5", "5 s"])
def test_a_bad_environment_value_is_refused_with_the_fixed_error(value: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        resolve_settings(db="x", environ={ENV: value})
    message = str(caught.value)
    assert message == (f"task-state-guard: {ENV} must be a duration >= 0: seconds (90, 90.5) "
                       "or a number with one unit (90s, 15m, 2h, 1d)")


@pytest.mark.parametrize("value", [-1, math.inf, math.nan, True, [5]])
def test_a_bad_argument_is_refused_with_the_fixed_error(value: Any) -> None:
    with pytest.raises(ConfigurationError) as caught:
        resolve_settings(db="x", environ={}, verdict_interval_seconds=value)
    assert str(caught.value).startswith("task-state-guard: verdict_interval_seconds must be")
    assert repr(value) not in str(caught.value).removeprefix("task-state-guard: ")


# ---------------------------------------------------------------------------- the thread


def test_the_drain_publishes_what_an_operator_reconcile_recorded(db: str) -> None:
    """A running runtime publishes, within its interval, a verdict a reconcile elsewhere
    recorded: the result-backend writer first, then ``on_lost``, once."""
    calls: list[tuple[str, LostTask]] = []
    runtime = _runtime(db, verdict_interval_seconds=0.1)
    runtime.fail_lost = lambda lost: calls.append(("fail_lost", lost))
    runtime.on_lost = lambda lost: calls.append(("on_lost", lost))
    try:
        runtime.boot()
        assert runtime.start_verdict_drain() is True
        assert runtime.start_verdict_drain() is False  # one drain per process
        assert runtime.drain.running
        logical = _lost_job(db)
        _wait(lambda: len(calls) >= 2, "the drain to publish")
        assert [where for where, _ in calls] == ["fail_lost", "on_lost"]
        lost = calls[1][1]
        assert (lost.framework_id, lost.task_id, lost.name, lost.code) == (
            FID, logical, "app.job", "restart_stale")
        # marked published once its hooks returned: the drain's thread may not have committed yet
        _wait(lambda: _owed(db) == {"pending": 0, "published": 1}, "the verdict marked published")
        _wait(lambda: runtime.stats()["verdicts_published"] == 1, "the published count")
        time.sleep(0.5)  # more ticks: nothing is published again
        assert len(calls) == 2 and runtime.stats()["errors"] == {}
        assert _owed(db) == {"pending": 0, "published": 1}
    finally:
        runtime.close()
    assert not runtime.drain.running


def test_zero_turns_it_off_and_stop_is_idempotent(db: str) -> None:
    off = _runtime(db, verdict_interval_seconds=0)
    assert off.start_verdict_drain() is False and not off.drain.running
    off.stop_verdict_drain()  # nothing runs: nothing to stop
    off.close()
    nobody = _runtime(db, framework=None)  # a runtime owed no verdicts has nothing to drain
    assert nobody.start_verdict_drain() is False
    nobody.close()

    default = _runtime(db)  # the default interval: started
    try:
        assert default.settings.verdict_interval_seconds == DEFAULT_VERDICT_INTERVAL_SECONDS
        assert default.start_verdict_drain() is True and default.drain.running
        default.stop_verdict_drain()
        assert not default.drain.running
        default.stop_verdict_drain()  # again: nothing happens
        assert default.start_verdict_drain() is True  # a stopped drain can start again
        assert default.drain.running
    finally:
        default.close()
        default.close()
    assert not default.drain.running


def test_a_check_with_nothing_owed_writes_nothing(db: str) -> None:
    """The check is a read: a tick with nothing owed leaves everything the ledger stores
    exactly as it was (on PostgreSQL not even a new row version); a tick with a verdict owed
    writes (the claim, the mark), which is what shows that the comparison sees writes."""
    published: list[LostTask] = []
    runtime = _runtime(db, verdict_interval_seconds=0)
    runtime.on_lost = published.append
    try:
        runtime.boot()  # opens the ledger, the boot drain finds nothing
        before = stored_state(db)
        for _ in range(3):
            assert runtime.drain.tick() is False
        assert runtime.verdicts_pending() is False
        assert stored_state(db) == before
        assert runtime.stats()["errors"] == {}

        _lost_job(db)
        assert runtime.verdicts_pending() is True
        owed = stored_state(db)
        assert runtime.verdicts_pending() is True and stored_state(db) == owed  # still a read
        assert runtime.drain.tick() is True
        assert stored_state(db) != owed
        assert [lost.code for lost in published] == ["restart_stale"]
        assert runtime.verdicts_pending() is False
        assert _owed(db) == {"pending": 0, "published": 1}
    finally:
        runtime.close()


def test_a_tick_error_is_counted_and_the_thread_goes_on(db: str) -> None:
    """Even when strict, a drain's error is counted under ``verdict_drain`` and never raised:
    the thread keeps ticking and publishes once the cause is gone."""
    attempts: list[int] = []
    runtime = _runtime(db, verdict_interval_seconds=0.05, strict=True)

    def drain() -> None:
        attempts.append(1)
        if len(attempts) < 3:
            raise RuntimeError("private text")
        runtime.publish_verdicts()

    published: list[LostTask] = []
    runtime.on_lost = published.append
    try:
        runtime.boot()
        assert runtime.start_verdict_drain(drain=drain) is True
        _lost_job(db)
        _wait(lambda: published, "the third tick to publish")
        assert runtime.stats()["errors"] == {"verdict_drain:RuntimeError": 2}
        assert runtime.drain.running and len(published) == 1
    finally:
        runtime.close()


@pytest.mark.sqlite_only(reason="an unusable ledger: a SQLite path whose directory is a file")
def test_an_unusable_ledger_is_skipped_without_counting(tmp_path: Path) -> None:
    """A worker whose ledger cannot be opened reports it once (at its start, in ``stats()``);
    its drain's ticks add no error every interval."""
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    runtime = _runtime(str(blocker / "tasks.sqlite"), verdict_interval_seconds=0)
    try:
        assert runtime.boot() is None
        errors = runtime.stats()["errors"]
        assert list(errors) == ["boot:StorageError"]
        assert runtime.drain.tick() is False and runtime.drain.tick() is False
        assert runtime.stats()["errors"] == errors
        assert runtime.stats()["ledger_usable"] is False
    finally:
        runtime.close()


def test_a_tick_cut_short_by_a_dropped_handle_is_not_an_error(db: str) -> None:
    """A worker that drops its ledger handle while a tick runs (Celery does right before its
    pool forks a child) makes that tick fail; that is no error of the ledger, so it is not
    counted, and the next tick opens a fresh handle and publishes."""
    runtime = _runtime(db, verdict_interval_seconds=0)
    published: list[LostTask] = []
    runtime.on_lost = published.append

    def dropped_midway() -> None:
        runtime.drop_ledger()
        raise RuntimeError("the handle went away")

    try:
        runtime.boot()
        _lost_job(db)
        assert runtime.drain.tick(drain=dropped_midway) is False
        assert runtime.stats()["errors"] == {}
        assert runtime.drain.tick() is True and [x.code for x in published] == ["restart_stale"]
    finally:
        runtime.close()
