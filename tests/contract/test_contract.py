"""The adapters' shared contract: the same settings, error policy, public surface, counters
and attempt closing in Celery, Dramatiq and LangGraph."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from task_state_guard import InvalidInput, Ledger, StateConflict, StorageError, TaskNotFound
from task_state_guard.integration import ConfigurationError, LostTask

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "core"))
from core_helpers import run_cli
from prom_text import parse

STATS_KEYS = {"errors", "conflicts", "reconciles", "heartbeating", "verdicts_published",
              "ledger_usable", "ledger_reason"}


def _logical(driver: Any, db: str, fid: str) -> Any:
    with Ledger(db) as ledger:
        return ledger.get_task(driver.guard.logical_task_id(fid))


def _attempts(driver: Any, db: str, fid: str) -> list[Any]:
    with Ledger(db) as ledger:
        return ledger.children_of(driver.guard.logical_task_id(fid))


# ---------------------------------------------------------------------------- settings


def test_defaults_are_the_same(driver: Any, db: str) -> None:
    settings = driver.install(db).settings
    assert (settings.db, settings.active_grace_seconds, settings.delivery_grace_seconds) == (
        db, 600.0, 600.0
    )
    assert settings.heartbeat_seconds == 30.0  # min(30, active grace / 4)
    assert settings.reconcile_on_boot is True and settings.strict is False
    assert settings.busy_timeout_ms == 5000 and settings.reconcile_interval_seconds == 0
    assert settings.fail_lost_results is True and settings.metrics_dir is None
    assert settings.verdict_interval_seconds == 10  # running workers publish verdicts


def test_precedence_argument_then_framework_then_environment(
    driver: Any, db: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TSG_DB", str(tmp_path / "env.sqlite"))
    monkeypatch.setenv("TSG_ACTIVE_GRACE_SECONDS", "120")
    monkeypatch.setenv("TSG_DELIVERY_GRACE_SECONDS", "40")
    monkeypatch.setenv("TSG_HEARTBEAT_SECONDS", "7")
    conf = {"delivery_grace_seconds": 50} if driver.has_framework_config else None
    settings = driver.install(db, conf=conf, heartbeat_seconds=3).settings
    assert settings.db == db  # the argument wins over TSG_DB
    assert settings.active_grace_seconds == 120  # from the environment
    assert settings.heartbeat_seconds == 3  # the argument wins over the environment
    # The framework's configuration (where there is one) wins over the environment.
    assert settings.delivery_grace_seconds == (50 if driver.has_framework_config else 40)


def test_environment_durations_take_the_cli_units(
    driver: Any, db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TSG_ACTIVE_GRACE_SECONDS", "20m")
    monkeypatch.setenv("TSG_DELIVERY_GRACE_SECONDS", "2h")
    monkeypatch.setenv("TSG_HEARTBEAT_SECONDS", "1m")
    monkeypatch.setenv("TSG_RECONCILE_INTERVAL_SECONDS", "0.5h")
    monkeypatch.setenv("TSG_VERDICT_INTERVAL_SECONDS", "1m")
    settings = driver.install(db).settings
    assert settings.active_grace_seconds == 1200 and settings.delivery_grace_seconds == 7200
    assert settings.heartbeat_seconds == 60 and settings.reconcile_interval_seconds == 1800
    assert settings.verdict_interval_seconds == 60


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("TSG_ACTIVE_GRACE_SECONDS", "soon"),
        ("TSG_ACTIVE_GRACE_SECONDS", "1h30"),
        ("TSG_DELIVERY_GRACE_SECONDS", "-5m"),
        ("TSG_DELIVERY_GRACE_SECONDS", "1w"),
        ("TSG_BUSY_TIMEOUT_MS", "5s"),
        ("TSG_ACTIVE_GRACE_SECONDS", "-5"),
        ("TSG_DELIVERY_GRACE_SECONDS", "nan"),
        ("TSG_HEARTBEAT_SECONDS", "inf"),
        ("TSG_HEARTBEAT_SECONDS", "900"),  # not below the active grace
        ("TSG_STRICT", "maybe"),
        ("TSG_RECONCILE_ON_BOOT", "2"),
        ("TSG_BUSY_TIMEOUT_MS", "1.5"),
        # exactly the CLI's grammar: no exponent, sign, spaces, separators, other digits
        ("TSG_ACTIVE_GRACE_SECONDS", "1e3"),
        ("TSG_ACTIVE_GRACE_SECONDS", " 700 "),
        ("TSG_DELIVERY_GRACE_SECONDS", "1_000"),
        ("TSG_DELIVERY_GRACE_SECONDS", "+500"),
        ("TSG_RECONCILE_INTERVAL_SECONDS", "-0"),
        ("TSG_VERDICT_INTERVAL_SECONDS", "-5"),
        ("TSG_VERDICT_INTERVAL_SECONDS", "10 s"),
        ("TSG_VERDICT_INTERVAL_SECONDS", "often"),
        ("TSG_ACTIVE_GRACE_SECONDS", "\u0667\u0660\u0660"),
        ("TSG_ACTIVE_GRACE_SECONDS", "\uff17\uff10\uff10"),
        ("TSG_BUSY_TIMEOUT_MS", "1_000"),
        ("TSG_BUSY_TIMEOUT_MS", "+500"),
        ("TSG_BUSY_TIMEOUT_MS", "\u0667"),
    ],
)
def test_a_bad_environment_value_is_the_same_clear_error(
    driver: Any, db: str, monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigurationError) as caught:
        driver.install(db)
    assert variable in str(caught.value) and value not in str(caught.value)
    assert isinstance(caught.value, ValueError) and isinstance(caught.value, InvalidInput)


@pytest.mark.parametrize("value", ["1e3", " 700 ", "1_000", "+700", "\u0667\u0660\u0660"])
def test_a_setting_given_as_text_takes_exactly_the_cli_grammar(
    driver: Any, db: str, value: str
) -> None:
    with pytest.raises(ConfigurationError) as caught:
        driver.install(db, active_grace_seconds=value)
    assert value not in str(caught.value)
    if driver.has_framework_config:
        with pytest.raises(ConfigurationError):
            driver.install(db, conf={"active_grace_seconds": value})
    assert driver.install(db, active_grace_seconds="700").settings.active_grace_seconds == 700


def test_a_bad_argument_and_a_missing_path_are_the_same_clear_error(
    driver: Any, db: str
) -> None:
    with pytest.raises(ConfigurationError, match="active_grace_seconds"):
        driver.install(db, active_grace_seconds=0)
    with pytest.raises(ConfigurationError, match="TSG_DB"):
        driver.install(None)


# ---------------------------------------------------------------------------- error policy


@pytest.mark.sqlite_only(reason="an unusable ledger: a SQLite path whose directory is a file")
def test_ledger_errors_are_counted_logged_once_by_class_and_reason_and_jobs_run(
    driver: Any, broken_db: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger=driver.logger):
        driver.install(broken_db)
        driver.boot()
        ids = [driver.run("ok") for _ in range(3)]
    assert len(ids) == 3 and not getattr(driver, "raised", [])  # the jobs ran
    errors = driver.guard.stats()["errors"]
    assert errors and all(kind.endswith(":StorageError") for kind in errors)
    assert max(errors.values()) >= 3  # every job met the error
    logged = [r.getMessage() for r in caplog.records
              if r.name == driver.logger and "ledger error" in r.getMessage()]
    assert sorted(logged) == sorted(
        f"task-state-guard: ledger error ({kind}, reason directory_not_a_directory); the "
        f"{driver.guard.runtime.policy.subject} runs on. Further errors of this kind are "
        "counted, not logged."
        for kind in errors
    )
    # class names and the fixed reason only, never the path or a part of it
    assert all(broken_db not in message and "not-a-directory" not in message
               for message in logged)


@pytest.mark.sqlite_only(reason="an unusable ledger: a SQLite path whose directory is a file")
def test_strict_mode_raises_the_ledger_error_out_of_the_hook(
    driver: Any, broken_db: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG):
        driver.install(broken_db, strict=True, reconcile_on_boot=False)
        driver.boot()
        driver.run("ok")
    assert driver.strict_raised(caplog)
    assert driver.guard.stats()["errors"]  # counted as well


@pytest.mark.sqlite_only(reason="an unusable ledger: a SQLite path whose directory is a file")
def test_an_unusable_ledger_shows_in_stats_and_metrics(driver: Any, broken_db: str) -> None:
    """Whoever opened it first (the boot, a job's hook), an unusable ledger is visible in the
    process's counters with its fixed reason, never the path; the jobs ran anyway."""
    guard = driver.install(broken_db)
    driver.boot()
    driver.run("ok")
    stats = guard.stats()
    assert (stats["ledger_usable"], stats["ledger_reason"]) == (False, "directory_not_a_directory")
    text = guard.metrics_text()
    assert parse(text)["tsg_adapter_ledger_usable"].value(
        adapter=driver.name, reason="directory_not_a_directory") == 0
    assert broken_db not in text and "not-a-directory" not in text


@pytest.mark.sqlite_only(reason="an unusable ledger: a SQLite path whose directory is a file")
def test_ledger_errors_are_scrapeable_as_prometheus_text(driver: Any, broken_db: str) -> None:
    guard = driver.install(broken_db)
    driver.boot()
    for _ in range(3):
        driver.run("ok")
    stats = guard.stats()
    families = parse(guard.metrics_text())
    errors = families["tsg_adapter_ledger_errors_total"]
    assert errors.type == "counter" and errors.samples
    expected = {}
    for kind, count in stats["errors"].items():
        hook, _, error = kind.rpartition(":")
        expected[(guard.adapter_name, hook, error)] = count
    assert {(lab["adapter"], lab["hook"], lab["error"]): value
            for lab, value in errors.samples} == expected
    assert families["tsg_adapter_ledger_errors_all_total"].value(adapter=driver.name) == sum(
        stats["errors"].values())
    assert guard.adapter_name == driver.name
    conflicts = families["tsg_adapter_conflicts_total"]
    assert conflicts.value(adapter=driver.name, kind="logical_close") == 0
    assert families["tsg_adapter_reconciles_total"].value(adapter=driver.name) == stats[
        "reconciles"]
    assert families["tsg_adapter_heartbeating"].value(adapter=driver.name) == 0
    assert broken_db not in guard.metrics_text()


def test_with_a_metrics_directory_tsg_metrics_shows_the_same_counters(
    driver: Any, broken_db: str, db: str, tmp_path: Any
) -> None:
    """Every increment also reaches the metrics directory, where `tsg metrics` reads the sums
    of every process (here one): the same errors, conflicts at zero, the same reconciles."""
    from task_state_guard import Ledger
    from task_state_guard.metrics.adapter_counters import format_directory

    metrics_dir = tmp_path / "metrics"
    guard = driver.install(broken_db, metrics_dir=str(metrics_dir))
    driver.boot()
    for _ in range(2):
        driver.run("ok")
    stats = guard.stats()
    assert stats["errors"] and (metrics_dir / "tsg-adapter-counters.json").is_file()
    Ledger(db).close()  # a healthy ledger for the scrape itself
    scrape = run_cli("--db", db, "metrics", "--metrics-dir", str(metrics_dir))
    assert scrape.code == 0
    families = parse(scrape.stdout)
    assert scrape.stdout.endswith(format_directory(str(metrics_dir)))
    errors = {(lab["hook"], lab["error"]): value
              for lab, value in families["tsg_adapter_ledger_errors_total"].samples
              if lab["adapter"] == driver.name}
    assert errors == {tuple(kind.rsplit(":", 1)): n for kind, n in stats["errors"].items()}
    assert families["tsg_adapter_ledger_errors_all_total"].value(adapter=driver.name) == sum(
        stats["errors"].values())
    assert families["tsg_adapter_conflicts_total"].value(
        adapter=driver.name, kind="attempt_close") == 0
    assert families["tsg_adapter_reconciles_total"].value(adapter=driver.name) == stats[
        "reconciles"]
    assert broken_db not in scrape.stdout


ZERO_AT_START = ("tsg_adapter_ledger_errors_all_total", "tsg_adapter_reconciles_total",
                 "tsg_adapter_verdicts_published_total")


def _at_zero(families: dict[str, Any], adapter: str) -> None:
    """Every counter whose labels are known in advance is there, at 0; the detailed errors
    family (its hooks and classes are not a closed set) has no series yet."""
    for name in ZERO_AT_START:
        assert families[name].value(adapter=adapter) == 0, name
    for kind in ("attempt_close", "logical_close", "delivery_mark_dropped"):
        assert families["tsg_adapter_conflicts_total"].value(adapter=adapter, kind=kind) == 0
    assert families["tsg_adapter_ledger_errors_total"].samples == []


def test_every_counter_is_exported_at_zero_right_after_boot(
    driver: Any, db: str, tmp_path: Any
) -> None:
    """From a worker's start, before anything was counted, in the process's own exposition and
    in the metrics directory (`tsg metrics`): a later increment, the first of its kind, then
    moves a series that was already there, which is what `increase()` needs to see it."""
    metrics_dir = tmp_path / "metrics"
    guard = driver.install(db, metrics_dir=str(metrics_dir), reconcile_on_boot=False)
    driver.boot()
    _at_zero(parse(guard.metrics_text()), driver.name)
    scrape = run_cli("--db", db, "metrics", "--metrics-dir", str(metrics_dir))
    assert scrape.code == 0
    _at_zero(parse(scrape.stdout), driver.name)

    driver.run("close_parent")  # the first conflict: its series was at 0
    for text in (guard.metrics_text(),
                 run_cli("--db", db, "metrics", "--metrics-dir", str(metrics_dir)).stdout):
        assert parse(text)["tsg_adapter_conflicts_total"].value(
            adapter=driver.name, kind="logical_close") == 1


def test_a_running_worker_publishes_what_a_reconcile_elsewhere_recorded(
    driver: Any, db: str
) -> None:
    """A worker that runs (Celery's and Dramatiq's after their boot, LangGraph's background
    recovery) publishes, within its verdict interval, the verdict of a job an operator's
    `tsg reconcile` found lost: nobody restarts anything, no reconcile interval is set."""
    lost: list[LostTask] = []
    guard = driver.install(db, verdict_interval_seconds=0.1, heartbeat_seconds=0)
    assert guard.settings.reconcile_interval_seconds == 0
    guard.on_lost = lost.append
    runner = None
    if driver.publishes_in_reconcile:
        driver.boot()
    else:  # a LangGraph server's recovery beside serving
        runner = guard.start_recovery()
        assert runner.wait(30)
    assert guard.runtime.drain.running
    fid = str(uuid.uuid4())
    logical = guard.logical_task_id(fid)
    with Ledger(db) as ledger:  # the job of a worker elsewhere, dead now
        ledger.create_task(task_id=logical, delivery_required=False, name="elsewhere.job",
                           framework_id=fid, framework=driver.name)
        ledger.start_task(logical, owner=False)
    result = run_cli("--db", db, "reconcile", "--active-grace-seconds", "0")
    assert result.code == 0 and result.json["reconcile"]["tasks_timed_out"] == 1
    deadline = time.monotonic() + 30
    while not lost:
        assert time.monotonic() < deadline, "the running worker never published the verdict"
        time.sleep(0.02)
    assert [(x.task_id, x.code, x.name) for x in lost] == [
        (logical, "restart_stale", "elsewhere.job")]
    assert lost[0].framework_id == fid
    driver.close()
    assert not guard.runtime.drain.running
    if runner is not None:
        assert not runner.alive
    with Ledger(db) as ledger:
        owed = ledger.status()["verdicts"]
        assert (owed["pending"][driver.name], owed["published"][driver.name]) == (0, 1)
        assert ledger.doctor()["healthy"]


# ---------------------------------------------------------------------------- public surface


def test_logical_task_id_is_the_same_rule(driver: Any, db: str) -> None:
    import importlib

    guard = driver.install(db)
    module = importlib.import_module(f"task_state_guard_{driver.name}")
    assert guard.logical_task_id("job-1") == module.logical_task_id("job-1")
    assert guard.logical_task_id("job-1") != guard.logical_task_id("job-2")
    for bad in ("", None, 42):
        with pytest.raises(InvalidInput):
            guard.logical_task_id(bad)


def test_mark_delivered_outside_a_job(driver: Any, db: str) -> None:
    guard = driver.install(db)
    driver.boot()
    fid = driver.run("ok", deliver=True)
    assert _logical(driver, db, fid).delivery_status == "pending"
    task = guard.mark_delivered(fid)
    assert (task.delivery_status, task.delivery_code) == ("delivered", "transport_acknowledged")
    assert guard.mark_delivered(fid) == task  # idempotent
    with pytest.raises(StateConflict):
        guard.mark_delivery_failed(fid)  # never a rewrite
    with pytest.raises(TaskNotFound):
        guard.mark_delivered("never-ran")
    with pytest.raises(InvalidInput):
        guard.mark_delivered("")
    assert guard.stats()["errors"] == {} and guard.stats()["conflicts"] == {}


def test_mark_delivery_failed_outside_a_job(driver: Any, db: str) -> None:
    guard = driver.install(db)
    driver.boot()
    fid = driver.run("ok", deliver=True)
    task = guard.mark_delivery_failed(fid)
    assert (task.delivery_status, task.delivery_code) == ("failed", "transport_failed")


def _hold_ledger(db: str, backend: str, locked: threading.Event,
                 release: threading.Event) -> None:
    """Hold the ledger's write lock (SQLite) / its task table (PostgreSQL) until released,
    as another process's long transaction would."""
    if backend == "sqlite":
        conn = sqlite3.connect(db, isolation_level=None)
        conn.execute("BEGIN IMMEDIATE")
        locked.set()
        release.wait(30)
        conn.execute("COMMIT")
        conn.close()
        return
    import psycopg

    base, _, query = db.partition("?")
    schema = query.split("schema=", 1)[1].split("&", 1)[0]
    with psycopg.connect(base) as conn:
        conn.execute(f'SET search_path TO "{schema}"')
        conn.execute("LOCK TABLE tsg_tasks IN EXCLUSIVE MODE")
        locked.set()
        release.wait(30)


@pytest.mark.parametrize(
    ("method", "expected"),
    [
        ("amark_delivered", ("delivered", "transport_acknowledged")),
        ("amark_delivery_failed", ("failed", "transport_failed")),
    ],
)
def test_async_marks_never_block_the_event_loop(
    driver: Any, db: str, backend: str, method: str, expected: tuple[str, str]
) -> None:
    guard = driver.install(db)
    driver.boot()
    fid = driver.run("ok", deliver=True)
    locked, release = threading.Event(), threading.Event()
    holder = threading.Thread(target=_hold_ledger, args=(db, backend, locked, release))
    holder.start()
    try:
        assert locked.wait(30)

        async def main() -> tuple[int, Any]:
            mark = asyncio.ensure_future(getattr(guard, method)(fid))
            ticks = 0
            while not mark.done():
                await asyncio.sleep(0.01)
                ticks += 1
                if ticks == 20:
                    release.set()  # the loop ran 20 times while the mark waited for the lock
            return ticks, await mark

        ticks, task = asyncio.run(main())
    finally:
        release.set()
        holder.join(30)
    assert ticks >= 20  # the mark waited for the lock, beside a loop that kept running
    assert (task.delivery_status, task.delivery_code) == expected
    with pytest.raises(TaskNotFound):
        asyncio.run(guard.amark_delivered("never-ran"))
    assert guard.stats()["errors"] == {}


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("mark", ("delivered", "transport_acknowledged")),
        ("mark_failed", ("failed", "transport_failed")),
    ],
)
def test_a_mark_inside_the_job_is_written_with_its_close(
    driver: Any, db: str, kind: str, expected: tuple[str, str]
) -> None:
    guard = driver.install(db)
    driver.boot()
    fid = driver.run(kind, deliver=True)
    assert driver.seen[fid] is None  # kept: the logical task was still running
    logical = _logical(driver, db, fid)
    assert (logical.status, logical.terminal_code) in {
        ("succeeded", "worker_completed"), ("succeeded", "completed")
    }
    assert (logical.delivery_status, logical.delivery_code) == expected
    assert logical.delivery_updated_at >= logical.ended_at  # written with the close, no reconcile
    assert guard.stats()["errors"] == {}


def test_a_mark_for_a_job_running_elsewhere_raises_and_changes_nothing(
    driver: Any, db: str
) -> None:
    guard = driver.install(db)
    logical = guard.logical_task_id("running-elsewhere")
    with Ledger(db) as other:  # another process runs this job right now
        other.create_task(task_id=logical)
        before = other.start_task(logical, owner=False)
    with pytest.raises(StateConflict):
        guard.mark_delivered("running-elsewhere")
    with Ledger(db) as other:
        assert other.get_task(logical) == before
    assert guard.stats()["errors"] == {}


# ---------------------------------------------------------------------------- counters


def test_counters_have_the_same_keys_and_meaning(driver: Any, db: str) -> None:
    guard = driver.install(db)
    driver.boot()
    assert set(guard.stats()) == STATS_KEYS
    assert guard.stats()["reconciles"] == 1  # the boot reconcile
    inside = driver.run("stats")
    # the attempt and its logical task (a buffered attempt: the logical task alone until the
    # next heartbeat commits it)
    assert driver.seen[inside]["heartbeating"] == (1 if driver.attempts_are_history else 2)
    assert guard.stats()["heartbeating"] == 0
    late = driver.run("close_parent")
    assert guard.stats()["conflicts"] == {"logical_close": 1}  # refused, never rewritten
    logical = _logical(driver, db, late)
    assert (logical.status, logical.terminal_code) == ("cancelled", "caller_cancelled")
    assert guard.stats()["errors"] == {}


def test_ledger_metrics_count_a_job_once_and_its_attempts_apart(driver: Any, db: str) -> None:
    driver.install(db)
    driver.boot()
    fids = [driver.run("ok"), driver.run("fail")]
    expected: Counter[tuple[str, str, str]] = Counter()
    for fid in fids:
        logical = _logical(driver, db, fid)
        expected[("task", logical.name, logical.status.value)] += 1
        for attempt in _attempts(driver, db, fid):
            expected[("attempt", attempt.name, attempt.status.value)] += 1
    assert sum(n for (kind, _, _), n in expected.items() if kind == "task") == 2
    driver.close()
    result = subprocess.run([sys.executable, "-m", "task_state_guard", "--db", db, "metrics"],
                            capture_output=True, text=True, check=True)
    families = parse(result.stdout)
    seen = Counter({(lab["kind"], lab["name"], lab["status"]): int(value)
                    for lab, value in families["tsg_tasks_by_name"].samples if value})
    assert seen == expected
    tasks = families["tsg_tasks"]
    assert sum(v for lab, v in tasks.samples if lab["kind"] == "task") == 2  # two jobs
    outcomes = families["tsg_outcomes_total"]
    assert sum(v for lab, v in outcomes.samples if lab["kind"] == "task") == 2
    owed = families["tsg_deliveries"]
    internal = sum(v for lab, v in owed.samples if lab["kind"] == "internal")
    assert internal == sum(n for (kind, _, _), n in expected.items() if kind == "attempt") + (
        0 if driver.logical_delivers_by_default else 2)


# ---------------------------------------------------------------------------- lost jobs


def _lost_run(driver: Any, db: str, hook: Any) -> tuple[Any, str, list[Any]]:
    guard = driver.install(db, active_grace_seconds=0.05, heartbeat_seconds=0)
    assert guard.on_lost is None
    guard.on_lost = hook
    driver.boot()
    fid = driver.run("reconcile_inside")
    return guard, fid, driver.seen[fid]


def test_reconcile_hands_its_decisions_and_reports_lost_jobs(driver: Any, db: str) -> None:
    lost: list[LostTask] = []
    guard, fid, decisions = _lost_run(driver, db, lost.append)
    logical_id = guard.logical_task_id(fid)
    by = {(d.task_id, d.kind): d for d in decisions}
    mine = by[(logical_id, "task")]
    assert (mine.status, mine.code, mine.parent_id) == ("timed_out", "restart_stale", None)
    assert mine.name is not None
    for attempt in _attempts(driver, db, fid):
        if driver.attempts_are_history:  # committed after the reconcile (no heartbeat here)
            assert (attempt.id, "task") not in by
            continue
        decided = by[(attempt.id, "task")]
        assert (decided.parent_id, decided.framework_id) == (logical_id, None)
    logical = _logical(driver, db, fid)
    assert (logical.status, logical.terminal_code) == ("timed_out", "restart_stale")
    if driver.stores_framework_id:
        assert mine.framework_id == fid == logical.framework_id
        assert lost == [LostTask(fid, logical_id, mine.name, "restart_stale")]
    else:  # LangGraph reports lost threads from recover(), where it knows them
        assert mine.framework_id is None and logical.framework_id is None and lost == []
    # The job's own closes came too late: refused and counted, never rewritten.
    assert guard.stats()["conflicts"]
    assert guard.stats()["errors"] == {}
    report = guard.runtime.last_reconcile
    assert set(report) == {
        "active_examined", "tasks_timed_out", "fresh_active_retained",
        "pending_delivery_examined", "deliveries_failed", "deliveries_not_applicable",
        "pending_delivery_retained", "dry_run", "applied",
    }
    assert fid not in str(report) and logical_id not in str(report)
    with Ledger(db) as ledger:
        assert ledger.doctor()["healthy"]


def test_publish_verdicts_reports_a_lost_job_once(driver: Any, db: str) -> None:
    lost: list[LostTask] = []
    guard, fid, _decisions = _lost_run(driver, db, lost.append)
    logical_id = guard.logical_task_id(fid)
    if driver.publishes_in_reconcile:  # the reconcile that found it drained its verdict
        assert guard.publish_verdicts() == 0
    else:  # left pending for the adapter's own pass
        assert lost == [] and guard.publish_verdicts() == 1
    assert [(x.task_id, x.code) for x in lost] == [(logical_id, "restart_stale")]
    assert guard.publish_verdicts() == 0 and asyncio.run(guard.apublish_verdicts()) == 0
    assert len(lost) == 1 and guard.stats()["verdicts_published"] == 1
    with Ledger(db) as ledger:
        assert ledger.doctor()["healthy"]


def test_an_on_lost_hook_that_raises_is_counted_not_raised(driver: Any, db: str) -> None:
    def boom(lost: LostTask) -> None:
        raise RuntimeError("hook failed")

    guard, _fid, decisions = _lost_run(driver, db, boom)
    assert decisions  # the pass ran and handed its decisions over
    expected = {"on_lost:RuntimeError": 1} if driver.stores_framework_id else {}
    assert guard.stats()["errors"] == expected
    with pytest.raises(TypeError):
        guard.on_lost = "not callable"


# ---------------------------------------------------------------------------- attempts


@pytest.mark.parametrize("kind", ["ok", "fail"])
def test_an_attempt_closes_its_delivery_at_once(driver: Any, db: str, kind: str) -> None:
    driver.install(db)
    driver.boot()
    fid = driver.run(kind)
    attempts = _attempts(driver, db, fid)
    assert attempts
    for attempt in attempts:
        assert attempt.status in ("succeeded", "failed")
        assert (attempt.delivery_status, attempt.delivery_code) == (
            "not_applicable", "internal_task"
        )
        assert attempt.delivery_updated_at >= attempt.ended_at  # closed with the attempt
    logical = _logical(driver, db, fid)
    if driver.logical_delivers_by_default:
        assert logical.delivery_status == "pending"  # owed to somebody: stays open
    else:  # a logical task that owes nobody a delivery closes it at once, too
        assert (logical.delivery_status, logical.delivery_code) == (
            "not_applicable", "internal_task"
        )
    with Ledger(db) as ledger:
        assert ledger.doctor()["healthy"]


def test_uninstall_and_close_are_idempotent(driver: Any, db: str) -> None:
    guard = driver.install(db)
    driver.boot()
    driver.run("ok")
    driver.close()
    guard.uninstall()
    guard.close()
    driver.guard = None


def test_configuration_error_is_exported() -> None:
    assert issubclass(ConfigurationError, ValueError)
    assert issubclass(StorageError, Exception)
