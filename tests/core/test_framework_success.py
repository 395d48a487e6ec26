"""Never lost when the framework knows it succeeded: the adapter runtime's success check.

An adapter whose framework keeps results sets ``AdapterRuntime.framework_success``; a job the
check holds as succeeded is closed ``succeeded/worker_completed`` before the runtime's reconcile
would close it lost, and a verdict recorded anyway (a reconcile that could not ask) is
superseded: marked published without a result-backend write or ``on_lost``. Runs on both
backends through the public API, as an adapter drives the runtime.
"""

from __future__ import annotations

import logging
import uuid
from pathlib import Path
from typing import Any

import pytest
from core_helpers import Clock, run_cli
from prom_text import parse
from task_state_guard import Ledger, ReconcilePolicy
from task_state_guard.integration import (
    AdapterRuntime,
    AttemptSpec,
    LostTask,
    job_task_id,
    resolve_settings,
)

GRACE = 60.0


class Recorder:
    """The adapter's result store as the runtime sees it: the check, the writer, the hook."""

    def __init__(self) -> None:
        self.succeeded: set[str] = set()
        self.asked: list[LostTask] = []
        self.written: list[str] = []
        self.lost: list[str] = []
        self.down = False

    def check(self, lost: LostTask) -> bool:
        self.asked.append(lost)
        if self.down:
            raise ConnectionError("result store unreachable")
        return lost.framework_id in self.succeeded

    def runtime(self, ledger: Ledger, framework: str = "celery", **settings: Any) -> AdapterRuntime:
        rt = AdapterRuntime(
            resolve_settings(db_required=False, active_grace_seconds=GRACE, heartbeat_seconds=0,
                             **settings),
            logger=logging.getLogger("test.successes"), ledger=ledger, framework=framework,
            on_lost=lambda lost: self.lost.append(lost.task_id), adapter=framework)
        rt.fail_lost = lambda lost: self.written.append(lost.task_id)
        rt.framework_success = self.check
        return rt


def open_job(rt: AdapterRuntime, redelivery: float | None = None) -> tuple[str, str, str]:
    """A job as an adapter records it (a framework id its id scheme maps to the logical task):
    ``(framework id, logical task, running attempt)``."""
    fid = str(uuid.uuid4())
    assert rt.framework is not None
    logical = job_task_id(rt.framework, fid)
    attempt = rt.begin_attempt(AttemptSpec(logical, "app.job", redelivery_seconds=redelivery),
                               delivery_required=False, framework_id=fid)
    return fid, logical, attempt


def outcome(ledger: Ledger, task_id: str) -> tuple[str, str | None]:
    task = ledger.get_task(task_id)
    return str(task.status.value), task.terminal_code


def owed(ledger: Ledger, framework: str = "celery") -> tuple[int, int]:
    verdicts = ledger.status()["verdicts"]
    return verdicts["pending"][framework], verdicts["published"][framework]


def test_a_job_whose_success_the_framework_holds_is_closed_succeeded_not_lost(
    ledger: Ledger, clock: Clock
) -> None:
    store = Recorder()
    rt = store.runtime(ledger)
    done_fid, done, done_attempt = open_job(rt)
    _lost_fid, lost, lost_attempt = open_job(rt)
    store.succeeded.add(done_fid)
    clock.advance(GRACE + 1)
    decided: list[str] = []
    preview = rt.reconcile(dry_run=True, on_decision=lambda d: decided.append(d.task_id))
    # The preview asks the result store and counts what the apply will do; it writes nothing.
    assert preview["tasks_timed_out"] == 2 and preview["active_examined"] == 2
    assert set(decided) == {lost, lost_attempt}
    assert outcome(ledger, done) == ("running", None) and owed(ledger) == (0, 0)
    store.asked.clear()

    applied: list[str] = []
    report = rt.reconcile(on_decision=lambda d: applied.append(d.task_id))
    assert report["tasks_timed_out"] == 2  # the other job and its attempt only
    assert sorted(applied) == sorted(decided)
    assert {k: v for k, v in preview.items() if k not in ("dry_run", "applied")} == {
        k: v for k, v in report.items() if k not in ("dry_run", "applied")}
    assert outcome(ledger, done) == outcome(ledger, done_attempt) == (
        "succeeded", "worker_completed")
    assert outcome(ledger, lost) == ("timed_out", "restart_stale")
    assert outcome(ledger, lost_attempt) == ("timed_out", "restart_stale")
    # asked once each before the pass; the lost one again before its verdict was published
    assert sorted(a.task_id for a in store.asked) == sorted([done, lost, lost])
    assert [a for a in store.asked if a.task_id == done] == [
        LostTask(done_fid, done, "app.job", "restart_stale")]
    assert (store.written, store.lost) == ([lost], [lost])  # only the lost one is published
    assert owed(ledger) == (0, 1)
    assert rt.framework_successes() == {"reconcile": 1, "verdict": 0}
    totals = ledger.status()["outcomes_total"]
    assert totals["task"]["timed_out"]["restart_stale"] == 1
    assert totals["task"]["succeeded"]["worker_completed"] == 1
    assert ledger.get_task(done_attempt).delivery_status == "not_applicable"
    assert ledger.doctor()["healthy"] is True


def test_a_lost_attempt_kept_for_redelivery_closes_with_its_job(
    ledger: Ledger, clock: Clock
) -> None:
    """The worker died after the framework stored the result: its attempt is lost at once, the
    job is kept for the broker's redelivery window; the framework's success closes both."""
    store = Recorder()
    rt = store.runtime(ledger)
    fid, logical, attempt = open_job(rt, redelivery=600)
    store.succeeded.add(fid)
    clock.advance(GRACE + 1)
    assert ledger.reconcile(ReconcilePolicy(active_grace_seconds=GRACE), dry_run=True)[
        "fresh_active_retained"] == 1  # the job alone would be kept
    rt.reconcile()
    assert outcome(ledger, attempt) == outcome(ledger, logical) == (
        "succeeded", "worker_completed")
    assert [a.code for a in store.asked] == ["restart_stale"]  # the attempt's code
    # The broker redelivers the message: the copy runs as a new attempt of the closed job.
    again = rt.begin_attempt(AttemptSpec(logical, "app.job", redelivery_seconds=600),
                             delivery_required=False, framework_id=fid)
    rt.end_attempt(again, ("succeeded", "worker_completed"), logical_id=logical,
                   settled=("succeeded", "worker_completed"))
    assert outcome(ledger, again) == ("succeeded", "worker_completed")
    assert rt.stats()["conflicts"] == {}  # the same outcome again: nothing refused
    assert (store.written, store.lost, owed(ledger)) == ([], [], (0, 0))
    assert ledger.doctor()["healthy"] is True


def test_an_attempt_still_running_settles_the_job_itself(ledger: Ledger, clock: Clock) -> None:
    store = Recorder()
    rt = store.runtime(ledger)
    fid, logical, first = open_job(rt, redelivery=600)
    store.succeeded.add(fid)
    clock.advance(GRACE + 1)
    copy = rt.claim_attempt(AttemptSpec(logical, "app.job"))  # a second delivery, running
    rt.reconcile()
    assert outcome(ledger, first) == ("succeeded", "worker_completed")
    assert outcome(ledger, logical) == ("running", None)  # the running copy decides it
    rt.end_attempt(copy, ("failed", "worker_failed"), logical_id=logical,
                   settled=("failed", "worker_failed"))
    assert outcome(ledger, logical) == ("failed", "worker_failed")
    assert ledger.doctor()["healthy"] is True


def test_a_verdict_recorded_before_anyone_could_ask_is_superseded(
    db: str, ledger: Ledger, clock: Clock, tmp_path: Path
) -> None:
    """An operator's reconcile (the core's pass: no success check) declared both jobs lost; the
    adapter's drain asks the framework: the job that succeeded is not published, the other is."""
    store = Recorder()
    metrics_dir = tmp_path / "metrics"
    rt = store.runtime(ledger, metrics_dir=str(metrics_dir))
    done_fid, done, _ = open_job(rt)
    _, lost, _ = open_job(rt)
    store.succeeded.add(done_fid)
    clock.advance(GRACE + 1)
    ledger.reconcile(ReconcilePolicy(active_grace_seconds=GRACE))
    assert owed(ledger) == (2, 0) and store.asked == []

    assert rt.publish_verdicts() == 1  # the lost job's; the other is superseded
    assert (store.written, store.lost) == ([lost], [lost])
    assert owed(ledger) == (0, 2)
    assert outcome(ledger, done) == ("timed_out", "restart_stale")  # never rewritten
    assert rt.framework_successes() == {"reconcile": 0, "verdict": 1}
    assert rt.stats()["verdicts_published"] == 1
    assert rt.publish_verdicts() == 0 and len(store.asked) == 2
    scrape = run_cli("--db", db, "metrics", "--metrics-dir", str(metrics_dir))
    assert scrape.code == 0
    family = parse(scrape.stdout)["tsg_adapter_framework_successes_total"]
    assert family.value(adapter="celery", where="verdict") == 1
    assert family.value(adapter="celery", where="reconcile") == 0
    assert done not in scrape.stdout and done_fid not in scrape.stdout
    assert ledger.doctor()["healthy"] is True


def test_a_check_that_fails_never_lets_on_lost_fire(ledger: Ledger, clock: Clock) -> None:
    """The result store is unreachable: the reconcile declares the job lost (nothing else is
    known), but its verdict is given back until the store answers."""
    store = Recorder()
    rt = store.runtime(ledger)
    fid, logical, _ = open_job(rt)
    store.succeeded.add(fid)
    store.down = True
    clock.advance(GRACE + 1)
    rt.reconcile()
    assert outcome(ledger, logical) == ("timed_out", "restart_stale")
    assert owed(ledger) == (1, 0)  # given back: neither written nor handed to on_lost
    assert (store.written, store.lost) == ([], [])
    assert rt.stats()["errors"] == {"framework_success:ConnectionError": 2}
    store.down = False
    assert rt.publish_verdicts() == 0
    assert owed(ledger) == (0, 1) and (store.written, store.lost) == ([], [])
    assert rt.framework_successes()["verdict"] == 1


def test_only_jobs_of_its_own_framework_are_asked(ledger: Ledger, clock: Clock) -> None:
    store = Recorder()
    dramatiq = store.runtime(ledger, framework="dramatiq")
    other = Recorder().runtime(ledger)  # a Celery job in the same ledger
    _, celery_job, _ = open_job(other)
    plain = ledger.create_task(delivery_required=False)
    ledger.start_task(plain.id, owner=False)
    mine_fid, mine, _ = open_job(dramatiq)
    clock.advance(GRACE + 1)
    dramatiq.reconcile()
    assert {a.task_id for a in store.asked} == {mine}
    assert owed(ledger, "celery") == (1, 0)  # owed to Celery's adapters, not published here
    assert outcome(ledger, celery_job) == ("timed_out", "restart_stale")
    assert mine_fid not in store.succeeded and store.lost == [mine]


def test_the_check_must_be_callable(ledger: Ledger) -> None:
    rt = Recorder().runtime(ledger)
    with pytest.raises(TypeError, match="framework_success must be callable"):
        rt.framework_success = "yes"  # type: ignore[assignment]
    assert rt.framework_success is not None  # unchanged
    rt.framework_success = None
    assert rt.framework_success is None
