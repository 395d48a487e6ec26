"""The verdict outbox: a close that declares an adapter's job lost owes that framework a verdict,
recorded in the same transaction whoever closes it; adapters claim verdicts with a lease,
publish them once and mark them published; doctor checks the outbox; prune keeps what is owed.

Runs on both backends (SQLite and PostgreSQL), through the public API: the integration layer
opens jobs as an adapter does, the core's reconcile, ``close_task`` and the real CLI close
them.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from core_helpers import T0, Clock, as_v4, is_sqlite, raw_execute, run_cli
from task_state_guard import InvalidInput, Ledger, ReconcilePolicy, Verdict
from task_state_guard.integration import AdapterRuntime, AttemptSpec, LostTask, resolve_settings

GRACE = 60.0
FID = "0ac03e98-045d-499b-a3e1-22df12f98c64"


def runtime(ledger: Ledger, framework: str | None = "celery", **hooks: Any) -> AdapterRuntime:
    settings = resolve_settings(db_required=False, active_grace_seconds=GRACE,
                                heartbeat_seconds=0)
    rt = AdapterRuntime(settings, logger=logging.getLogger("test.verdicts"), ledger=ledger,
                        framework=framework, on_lost=hooks.get("on_lost"))
    rt.fail_lost = hooks.get("fail_lost")
    return rt


def open_job(rt: AdapterRuntime, fid: str | None = FID, name: str = "app.job",
             redelivery: float | None = None) -> tuple[str, str]:
    """A job as an adapter records it: its logical task and a running attempt."""
    logical = str(uuid.uuid5(uuid.NAMESPACE_URL, f"job:{fid}:{uuid.uuid4()}"))
    rt.open_logical(logical, delivery_required=False, name=name, framework_id=fid)
    attempt = rt.claim_attempt(AttemptSpec(logical, name, redelivery_seconds=redelivery))
    return logical, attempt


def verdicts(ledger: Ledger) -> dict[str, dict[str, int]]:
    return ledger.status()["verdicts"]  # type: ignore[no-any-return]


def reconcile(ledger: Ledger, **kw: Any) -> dict[str, Any]:
    return ledger.reconcile(ReconcilePolicy(active_grace_seconds=GRACE), **kw)


@pytest.fixture
def rt(ledger: Ledger) -> Iterator[AdapterRuntime]:
    yield runtime(ledger)


def test_a_lost_close_owes_one_verdict_and_nothing_else_does(
    ledger: Ledger, clock: Clock, rt: AdapterRuntime
) -> None:
    lost, lost_attempt = open_job(rt)
    done, done_attempt = open_job(rt, fid=None)
    plain = ledger.create_task(delivery_required=False)  # a plain ledger task: no framework
    ledger.start_task(plain.id, owner=False)
    rt.close_tasks([(done_attempt, "succeeded", "worker_completed", True),
                    (done, "timed_out", "time_limit_exceeded", False)])  # not a lost code
    clock.advance(GRACE + 1)
    report = reconcile(ledger)
    assert report["tasks_timed_out"] == 3  # the lost job's attempt and logical task, plain
    assert ledger.get_task(lost).terminal_code == "restart_stale"
    assert ledger.get_task(plain.id).terminal_code == "restart_stale"
    # Only the logical task an adapter opened owes a verdict, to that adapter's framework.
    assert verdicts(ledger) == {"pending": {"celery": 1, "dramatiq": 0, "langgraph": 0},
                                "published": {"celery": 0, "dramatiq": 0, "langgraph": 0}}
    assert ledger.status()["oldest_pending_verdict_age_seconds"] == 0.0
    assert ledger.claim_verdicts("dramatiq") == []
    [verdict] = ledger.claim_verdicts("celery")
    assert isinstance(verdict, Verdict)
    assert (verdict.task_id, verdict.framework, verdict.framework_id, verdict.name,
            verdict.code, verdict.recorded_at) == (
        lost, "celery", FID, "app.job", "restart_stale", clock.t)
    assert lost_attempt not in str(ledger.status())
    assert ledger.doctor()["healthy"] is True


@pytest.mark.parametrize("code", ["owner_lost", "restart_stale", "deadline_exceeded"])
def test_every_lost_code_owes_a_verdict_through_a_plain_close(
    ledger: Ledger, rt: AdapterRuntime, code: str
) -> None:
    """The row trigger: any close with a lost code (not only a reconcile pass) records it."""
    logical, attempt = open_job(rt)
    rt.close_tasks([(attempt, "timed_out", code, True), (logical, "timed_out", code, False)])
    [verdict] = ledger.claim_verdicts("celery")
    assert (verdict.task_id, verdict.code) == (logical, code)
    assert ledger.doctor()["healthy"] is True


def test_a_dry_run_decides_the_same_and_owes_nothing(
    ledger: Ledger, clock: Clock, rt: AdapterRuntime
) -> None:
    open_job(rt)
    clock.advance(GRACE + 1)
    preview = reconcile(ledger, dry_run=True)
    assert preview["tasks_timed_out"] == 2
    assert verdicts(ledger)["pending"]["celery"] == 0
    applied = reconcile(ledger)
    assert {k: v for k, v in applied.items() if k not in ("dry_run", "applied")} == {
        k: v for k, v in preview.items() if k not in ("dry_run", "applied")}
    assert verdicts(ledger)["pending"]["celery"] == 1


def test_the_cli_reconcile_records_the_verdict(db: str) -> None:
    """An operator's ``tsg reconcile`` (a process of its own, no adapter) owes it too."""
    with Ledger(db) as ledger:
        logical, _attempt = open_job(runtime(ledger))
    result = run_cli("--db", db, "reconcile", "--active-grace-seconds", "0")
    assert result.code == 0 and result.json["reconcile"]["tasks_timed_out"] == 2
    status = run_cli("--db", db, "status")
    assert status.json["status"]["verdicts"]["pending"]["celery"] == 1
    assert logical not in status.stdout and FID not in status.stdout
    metrics = run_cli("--db", db, "metrics")
    assert 'tsg_verdicts{framework="celery",status="pending"} 1' in metrics.stdout
    assert logical not in metrics.stdout
    text = run_cli("--db", db, "status", "--format", "text")
    assert "VERDICTS (lost jobs)" in text.stdout


def test_a_claim_holds_a_lease_and_an_expired_one_is_claimed_again(
    ledger: Ledger, clock: Clock, rt: AdapterRuntime
) -> None:
    first, _ = open_job(rt)
    second, _ = open_job(rt)
    clock.advance(GRACE + 1)
    reconcile(ledger)
    mine = ledger.claim_verdicts("celery", limit=1, lease_seconds=30)
    assert [v.task_id for v in mine] == [first]  # oldest first
    assert mine[0].lease_until == clock.t + 30
    other = ledger.claim_verdicts("celery", lease_seconds=30)
    assert [v.task_id for v in other] == [second]  # never the one a live lease holds
    assert ledger.claim_verdicts("celery") == []
    clock.advance(30)  # both leases ended: a publisher that died lets the next one take over
    again = ledger.claim_verdicts("celery", task_ids=[second])
    assert [v.task_id for v in again] == [second] and again[0].claim != other[0].claim
    assert ledger.release_verdicts(other) == 0  # that claim is no longer the lease holder
    assert ledger.release_verdicts(again) == 1
    assert ledger.mark_verdicts_published([first, second]) == 2
    assert ledger.mark_verdicts_published([first]) == 0  # a repeat changes nothing
    assert ledger.claim_verdicts("celery") == []
    assert verdicts(ledger)["published"]["celery"] == 2
    assert ledger.status()["oldest_pending_verdict_age_seconds"] is None
    assert ledger.doctor()["healthy"] is True


def test_claim_input_is_checked(ledger: Ledger) -> None:
    for kwargs in ({"limit": 0}, {"limit": True}, {"lease_seconds": 0},
                   {"task_ids": "not-a-list"}, {"task_ids": ["not-a-uuid"]}):
        with pytest.raises(InvalidInput):
            ledger.claim_verdicts("celery", **kwargs)
    with pytest.raises(InvalidInput):
        ledger.claim_verdicts("rq")
    with pytest.raises(InvalidInput):
        runtime(ledger, framework="rq")


def test_publish_verdicts_calls_the_writer_and_the_hook_once(
    ledger: Ledger, clock: Clock
) -> None:
    calls: list[tuple[str, LostTask]] = []
    rt = runtime(ledger, on_lost=lambda lost: calls.append(("hook", lost)),
                 fail_lost=lambda lost: calls.append(("writer", lost)))
    logical, _ = open_job(rt)
    custom, _ = open_job(rt, fid=None, name="app.custom")  # a custom id is never stored
    clock.advance(GRACE + 1)
    reconcile(ledger)  # the core's pass, as the CLI runs it: nothing is published yet
    assert calls == []
    assert rt.publish_verdicts() == 2
    expected = [LostTask(FID, logical, "app.job", "restart_stale"),
                LostTask(None, custom, "app.custom", "restart_stale")]
    assert calls == [(w, lost) for lost in expected for w in ("writer", "hook")]
    assert rt.publish_verdicts() == 0 and len(calls) == 4
    assert rt.stats()["verdicts_published"] == 2
    assert verdicts(ledger)["published"]["celery"] == 2


def test_a_reconcile_of_the_adapter_publishes_what_it_found(ledger: Ledger, clock: Clock) -> None:
    seen: list[LostTask] = []
    rt = runtime(ledger, on_lost=seen.append)
    logical, _ = open_job(rt)
    clock.advance(GRACE + 1)
    report = rt.reconcile()
    assert report["tasks_timed_out"] == 2 and set(report) >= {"dry_run", "applied"}
    assert [lost.task_id for lost in seen] == [logical]


def test_a_failed_backend_write_leaves_the_verdict_owed_and_a_failed_hook_does_not(
    ledger: Ledger, clock: Clock
) -> None:
    state = {"writer_fails": True, "hook_calls": 0}

    def writer(lost: LostTask) -> None:
        if state["writer_fails"]:
            raise ConnectionError("result backend down")

    def hook(lost: LostTask) -> None:
        state["hook_calls"] += 1
        raise RuntimeError("the user's hook failed")

    rt = runtime(ledger, on_lost=hook, fail_lost=writer)
    open_job(rt)
    clock.advance(GRACE + 1)
    reconcile(ledger)
    assert rt.publish_verdicts() == 0  # released for the next drain, the hook not called yet
    assert state["hook_calls"] == 0 and verdicts(ledger)["pending"]["celery"] == 1
    assert rt.stats()["errors"] == {"fail_lost_result:ConnectionError": 1}
    state["writer_fails"] = False
    assert rt.publish_verdicts() == 1
    assert state["hook_calls"] == 1  # a hook that raises is counted, never called again
    assert rt.publish_verdicts() == 0 and state["hook_calls"] == 1
    assert rt.stats()["errors"]["on_lost:RuntimeError"] == 1


def test_two_publishers_at_once_publish_each_verdict_once(db: str) -> None:
    """Two processes' drains at the same moment (threads with ledgers of their own)."""
    with Ledger(db) as ledger:
        rt = runtime(ledger)
        jobs = {open_job(rt)[0] for _ in range(30)}
        ledger.reconcile(ReconcilePolicy(active_grace_seconds=0))
    seen: list[str] = []
    lock = threading.Lock()
    start = threading.Barrier(2)
    ledgers = [Ledger(db), Ledger(db)]

    def drain(led: Ledger) -> None:
        def hook(lost: LostTask) -> None:
            with lock:
                seen.append(lost.task_id)

        publisher = runtime(led, on_lost=hook)
        start.wait()
        while publisher.publish_verdicts():
            pass

    threads = [threading.Thread(target=drain, args=(led,)) for led in ledgers]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert sorted(seen) == sorted(jobs)
        assert verdicts(ledgers[0])["published"]["celery"] == 30
    finally:
        for led in ledgers:
            led.close()


def test_a_runtime_without_a_framework_owes_and_publishes_nothing(
    ledger: Ledger, clock: Clock
) -> None:
    rt = runtime(ledger, framework=None, on_lost=lambda lost: pytest.fail("no verdicts"))
    open_job(rt)
    clock.advance(GRACE + 1)
    rt.reconcile()
    assert rt.publish_verdicts() == 0
    assert verdicts(ledger)["pending"] == {"celery": 0, "dramatiq": 0, "langgraph": 0}


def test_a_lost_attempt_the_broker_will_redeliver_keeps_its_job_fresh(
    ledger: Ledger, clock: Clock, rt: AdapterRuntime
) -> None:
    """The attempt is closed at once; the logical task is kept (and owes nothing) until the
    attempt's redelivery window, plus the active grace for the requeued job to reach a worker,
    has passed after its last sign of life."""
    logical, attempt = open_job(rt, redelivery=100)  # kept 100 + 60 s after its start
    clock.advance(GRACE + 1)
    for dry_run in (True, False):
        report = reconcile(ledger, dry_run=dry_run)
        assert (report["tasks_timed_out"], report["fresh_active_retained"]) == (1, 1)
    assert ledger.get_task(attempt).terminal_code == "restart_stale"
    assert str(ledger.get_task(logical).status) == "running"
    assert verdicts(ledger)["pending"]["celery"] == 0
    clock.advance(100 - 1.5)  # the bound ends 160 s after the last sign of life
    assert reconcile(ledger)["tasks_timed_out"] == 0
    clock.advance(0.5)
    report = reconcile(ledger)
    assert report["tasks_timed_out"] == 1 and report["fresh_active_retained"] == 0
    assert ledger.get_task(logical).terminal_code == "restart_stale"
    assert verdicts(ledger)["pending"]["celery"] == 1
    assert ledger.doctor()["healthy"] is True


def test_a_redelivered_attempt_takes_over_and_the_job_succeeds(
    ledger: Ledger, clock: Clock, rt: AdapterRuntime
) -> None:
    logical, _lost = open_job(rt, redelivery=100)
    clock.advance(GRACE + 1)
    reconcile(ledger)
    again = rt.claim_attempt(AttemptSpec(logical, "app.job", redelivery_seconds=100))  # redelivered
    rt.close_tasks([(again, "succeeded", "worker_completed", True),
                    (logical, "succeeded", "worker_completed", False)])
    clock.advance(1000)
    reconcile(ledger)
    assert ledger.get_task(logical).terminal_code == "worker_completed"
    status = ledger.status()
    assert status["verdicts"]["pending"]["celery"] == 0
    assert status["outcomes_total"]["task"]["timed_out"]["restart_stale"] == 0  # no lost job
    assert status["outcomes_total"]["attempt"]["timed_out"]["restart_stale"] == 1


def test_prune_keeps_what_is_owed_and_deletes_published_verdicts_with_their_job(
    ledger: Ledger, clock: Clock, rt: AdapterRuntime
) -> None:
    logical, _ = open_job(rt)
    clock.advance(GRACE + 1)
    policy = ReconcilePolicy(active_grace_seconds=GRACE, delivery_grace_seconds=1)
    ledger.reconcile(policy)
    clock.advance(2)
    ledger.reconcile(policy)  # settles the deliveries nobody owes: the tree is closed
    clock.advance(1000)
    kept = ledger.prune(10)
    assert kept["trees_deleted"] == 0 and kept["trees_retained"] == 1
    assert ledger.mark_verdicts_published([logical]) == 1
    pruned = ledger.prune(10)
    assert pruned["trees_deleted"] == 1 and pruned["tasks_deleted"] == 2
    assert verdicts(ledger)["published"]["celery"] == 0
    assert ledger.doctor()["healthy"] is True


def _tamper(db: str, *statements: str) -> None:
    if is_sqlite(db):
        raw_execute(db, *statements)
        return
    import psycopg

    base, schema = db.split("?schema=", 1)
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'SET search_path TO "{schema}"')
        for statement in statements:
            conn.execute(statement)


@pytest.mark.parametrize("tamper", [
    "DELETE FROM tsg_verdicts",  # a lost close without its verdict
    "UPDATE tsg_verdicts SET framework = 'dramatiq'",  # owed to another framework
    "UPDATE tsg_verdicts SET state = 'published'",  # published without a time
    "UPDATE tsg_verdicts SET claim = 'x', lease_until = 1",  # a malformed lease
    "UPDATE tsg_verdicts SET task_seq = task_seq + 100000",  # its task is gone
])
def test_doctor_checks_the_outbox(db: str, tamper: str) -> None:
    with Ledger(db, clock=Clock()) as ledger:
        rt = runtime(ledger)
        logical, attempt = open_job(rt)
        rt.close_tasks([(attempt, "timed_out", "owner_lost", True),
                        (logical, "timed_out", "owner_lost", False)])
        assert ledger.doctor()["verdict_mismatch_count"] == 0
    _tamper(db, tamper)
    with Ledger(db) as ledger:
        report = ledger.doctor()
    assert report["healthy"] is False and report["verdict_mismatch_count"] >= 1
    assert logical not in str(report)


def test_doctor_checks_the_outbox_columns(db: str) -> None:
    with Ledger(db, clock=Clock()) as ledger:
        open_job(runtime(ledger), redelivery=5)
    _tamper(db, "UPDATE tsg_tasks SET redelivery_seconds = -1 WHERE redelivery_seconds = 5")
    with Ledger(db) as ledger:
        report = ledger.doctor()
    assert report["healthy"] is False and report["invalid_value_count"] == 1


@pytest.mark.sqlite_only(reason="a SQLite file taken back to layout 4")
def test_a_v4_ledger_migrates_to_the_outbox(db: str) -> None:
    with Ledger(db, clock=Clock()) as ledger:
        old = ledger.create_task(delivery_required=False)
        ledger.start_task(old.id, owner=False)
    as_v4(db)
    with Ledger(db, read_only=True) as ro:  # read in place: no outbox, no verdicts
        assert ro.schema_version == 4
        assert ro.status()["verdicts"]["pending"]["celery"] == 0
        assert ro.reconcile(dry_run=True, active_grace_seconds=0)["tasks_timed_out"] == 1
        assert ro.doctor()["healthy"] is True
    clock = Clock(T0 + 10)
    with Ledger(db, clock=clock) as ledger:
        assert ledger.schema_version == 9
        rt = runtime(ledger)
        logical, _ = open_job(rt)
        clock.advance(GRACE + 1)
        reconcile(ledger)
        # the task opened before the upgrade has no framework label: it owes nothing
        assert [v.task_id for v in ledger.claim_verdicts("celery")] == [logical]
        assert ledger.doctor()["healthy"] is True


def test_the_framework_labels_are_the_shipped_adapters() -> None:
    """The ledger's closed set of labels (the schema's check) names exactly the adapters whose
    id schemes the integration layer ships."""
    from task_state_guard.integration import FRAMEWORKS
    from task_state_guard.model import FRAMEWORK_LABELS

    assert set(FRAMEWORKS) == FRAMEWORK_LABELS


def test_a_root_started_through_the_runtime_is_a_logical_task_of_its_framework(
    ledger: Ledger, clock: Clock
) -> None:
    """An adapter that records its jobs with ``start_task`` (LangGraph's invocations) gets the
    same routing: a root carries the label, its children do not."""
    rt = runtime(ledger, framework="langgraph")
    root = str(uuid.uuid4())
    rt.start_task(root, parent_id=None, delivery_required=True, name="graph")
    rt.start_task(str(uuid.uuid4()), parent_id=root, delivery_required=False, name="node")
    clock.advance(GRACE + 1)
    assert reconcile(ledger)["tasks_timed_out"] == 2  # both stale: only the root owes
    assert [v.task_id for v in ledger.claim_verdicts("langgraph")] == [root]
    assert ledger.doctor()["healthy"] is True


def test_an_adapter_can_publish_in_its_own_way(ledger: Ledger, clock: Clock) -> None:
    """``publish_verdict`` replaces the default (result backend, then hook) for one verdict;
    the claim, the lease and the marking stay the runtime's. False or an exception gives the
    verdict back for the next drain."""
    rt = runtime(ledger, framework="langgraph", on_lost=lambda lost: pytest.fail("not used"))
    first, _ = open_job(rt)
    second, _ = open_job(rt)
    clock.advance(GRACE + 1)
    reconcile(ledger)
    seen: list[str] = []

    def publish(verdict: Verdict) -> bool:
        seen.append(verdict.task_id)
        if verdict.task_id == second:
            raise RuntimeError("cannot resume yet")
        return True

    rt.publish_verdict = publish
    assert rt.publish_verdicts() == 1
    assert seen == [first, second]
    assert rt.stats()["errors"] == {"publish_verdict:RuntimeError": 1}
    assert [v.task_id for v in ledger.claim_verdicts("langgraph")] == [second]  # given back
