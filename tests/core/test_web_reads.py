"""The reads behind `tsg serve`, through the public API on both backends: outcomes over time,
the task listing's orders and cursors, a job's attempts up to a limit, and the jobs whose
attempts contradict their close."""

from __future__ import annotations

from typing import Any

import pytest
from core_helpers import Clock, contradicted_jobs
from task_state_guard import InvalidInput, Ledger


def _close(ledger: Ledger, clock: Clock, state: str, code: str, *, at: float) -> str:
    clock.set(at - 5)
    root = ledger.create_task(name="app.job")
    ledger.start_task(root.id, owner=False)
    attempt = ledger.create_task(parent_id=root.id, delivery_required=False, name="app.job")
    ledger.start_task(attempt.id, owner=False)
    clock.set(at)
    ledger.close_task_settled(attempt.id, state, code=code)
    ledger.close_task_settled(root.id, state, code=code)
    return root.id


def test_outcome_history_counts_jobs_per_bucket_and_outcome(ledger: Ledger, clock: Clock) -> None:
    now = clock.t + 10_000
    _close(ledger, clock, "succeeded", "worker_completed", at=now - 3500)  # bucket 0
    _close(ledger, clock, "succeeded", "worker_completed", at=now - 2000)  # bucket 1
    _close(ledger, clock, "timed_out", "owner_lost", at=now - 1000)  # bucket 2: lost
    _close(ledger, clock, "timed_out", "time_limit_exceeded", at=now - 1100)  # time limit
    _close(ledger, clock, "failed", "worker_failed", at=now - 900)  # bucket 3 (its start)
    _close(ledger, clock, "cancelled", "revoked", at=now - 4000)  # before the window
    running = ledger.create_task(name="app.job")
    ledger.start_task(running.id, owner=False)
    clock.set(now)
    history = ledger.outcome_history(window_seconds=3600, buckets=4)
    assert (history.start, history.bucket_seconds, history.buckets) == (now - 3600, 900, 4)
    assert history.counts == {
        "succeeded": [1, 1, 0, 0], "failed": [0, 0, 0, 1], "lost": [0, 0, 1, 0],
        "timed_out": [0, 0, 1, 0], "cancelled": [0, 0, 0, 0],
    }  # attempts are not counted: a job counts once, when its logical task closed
    for bad in ({"window_seconds": 0, "buckets": 4}, {"window_seconds": 60, "buckets": 0},
                {"window_seconds": 60, "buckets": 501}, {"window_seconds": -1, "buckets": 1}):
        with pytest.raises(InvalidInput):
            ledger.outcome_history(**bad)  # type: ignore[arg-type]


def _mixed(ledger: Ledger, clock: Clock) -> float:
    """Jobs closed in and before the last hour (every outcome, attempts beside), running,
    queued and owed work; the clock left at the end."""
    now = clock.t + 10_000
    for n, (state, code) in enumerate([("succeeded", "worker_completed"),
                                       ("failed", "worker_failed"), ("timed_out", "owner_lost"),
                                       ("timed_out", "restart_stale"),
                                       ("timed_out", "time_limit_exceeded"),
                                       ("cancelled", "revoked"), ("succeeded", "completed")]):
        _close(ledger, clock, state, code, at=now - 400 * n - 1)
        _close(ledger, clock, state, code, at=now - 3601 - 100 * n)  # before the hour
    owed = ledger.create_task(name="app.owed")
    ledger.start_task(owed.id, owner=False)
    ledger.close_task(owed.id, "succeeded")  # its delivery still pending
    for name in ("app.run", "app.other", None):
        task = ledger.create_task(name=name)
        ledger.start_task(task.id, owner=False)
    ledger.create_task(name="app.queued")
    clock.set(now)
    return now


@pytest.mark.parametrize(("window", "buckets"), [(3600.0, 4), (86400.0, 24), (60.0, 1)])
def test_the_overview_reads_what_status_and_the_history_read(
        ledger: Ledger, clock: Clock, window: float, buckets: int) -> None:
    now = _mixed(ledger, clock)
    report, history = ledger.overview(active_grace_seconds=30.0, window_seconds=window,
                                      buckets=buckets)
    assert report == ledger.status(active_grace_seconds=30.0)
    assert history == ledger.outcome_history(window_seconds=window, buckets=buckets)
    assert history.start == now - window
    closed = sum(sum(per) for per in history.counts.values())
    assert closed == {3600.0: 7, 86400.0: 15, 60.0: 1}[window]
    assert report["tasks_by_kind"]["task"]["running"] == 3
    for bad in ({"window_seconds": 0, "buckets": 4}, {"window_seconds": 60, "buckets": 501},
                {"active_grace_seconds": -1}):
        with pytest.raises(InvalidInput):
            ledger.overview(**bad)  # type: ignore[arg-type]


def test_listing_orders_and_cursors_page_through_everything(ledger: Ledger,
                                                            clock: Clock) -> None:
    made = []
    for n in range(12):
        clock.advance(1)
        task = ledger.create_task(name=f"app.n{n % 4}")
        if n % 3 == 0:
            ledger.start_task(task.id, owner=False)
        made.append(task.id)
    clock.advance(100)
    for order in ("created", "activity", "name", "status"):
        for descending in (False, True):
            whole = [t.task.id for t in ledger.list_tasks(
                order=order, descending=descending, limit=100).tasks]
            assert sorted(whole) == sorted(made)
            pages: list[str] = []
            after = None
            while True:
                listing = ledger.list_tasks(order=order, descending=descending, limit=5,
                                            after=after)
                pages += [t.task.id for t in listing.tasks]
                if not listing.more:
                    break
                after = listing.tasks[-1].cursor
            assert pages == whole, (order, descending)
    by_name = [t.task.name for t in ledger.list_tasks(order="name", limit=100).tasks]
    assert by_name == sorted(by_name)
    assert [t.task.id for t in ledger.list_tasks(limit=100).tasks] == made
    idle = ledger.list_tasks(order="activity", limit=100).tasks
    assert [t.idle_seconds for t in idle] == sorted((t.idle_seconds for t in idle), reverse=True)
    with pytest.raises(InvalidInput):
        ledger.list_tasks(order="payload")
    cursor = ledger.list_tasks(order="name", limit=1).tasks[0].cursor
    for bad in ("", "x", "zz.1", "1.", cursor + "x", "nan.1"):
        with pytest.raises(InvalidInput):
            ledger.list_tasks(order="activity", after=bad)


def test_children_up_to_a_limit(ledger: Ledger) -> None:
    root = ledger.create_task(name="app.retried")
    attempts = [ledger.create_task(parent_id=root.id, delivery_required=False).id
                for _ in range(5)]
    assert [t.id for t in ledger.children_of(root.id, limit=3)] == attempts[:3]
    assert [t.id for t in ledger.children_of(root.id)] == attempts
    for bad in (0, -1, True, 1.5):
        with pytest.raises(InvalidInput):
            ledger.children_of(root.id, limit=bad)  # type: ignore[arg-type]


def test_listing_the_jobs_whose_attempts_contradict_their_close(ledger: Ledger,
                                                                 clock: Clock) -> None:
    """``contradicted=True``: the jobs closed other than succeeded with an attempt that
    succeeded after the close, in any state unless one is asked for (or, with ``attempts``,
    those attempts); the other filters, orders and cursors apply as to any listing."""
    ids = contradicted_jobs(ledger, clock)
    jobs = [ids["revoked"], ids["lost"]]

    def listed(**filters: object) -> list[str]:
        return [t.task.id for t in ledger.list_tasks(contradicted=True, **filters).tasks]

    assert listed() == jobs
    assert listed(descending=True) == jobs[::-1]
    assert listed(status="cancelled") == [ids["revoked"]]
    assert listed(status="succeeded") == [] and listed(status="running") == []
    assert listed(attempts=True) == [ids["revoked_success"], ids["lost_success"]]
    assert listed(task_id=ids["lost"]) == [ids["lost"]]
    assert listed(task_id=ids["lost"], attempts=True) == [ids["lost_success"]]
    assert listed(task_id=ids["parts"]) == [] and listed(task_id=ids["own_delivery"]) == []
    first = ledger.list_tasks(contradicted=True, limit=1)
    assert first.more and [t.task.id for t in first.tasks] == jobs[:1]
    assert listed(after=first.tasks[0].cursor) == jobs[1:]
    # Without the filter the listing is what it was: open work by default.
    assert [t.task.id for t in ledger.list_tasks().tasks] == [ids["open"]]
    with pytest.raises(InvalidInput):
        ledger.list_tasks(contradicted=1)  # type: ignore[arg-type]


def test_listing_narrowed_by_code_framework_name_and_flag_with_a_total(ledger: Ledger,
                                                                        clock: Clock) -> None:
    """The filters the web view's lists offer, through the public API: ``code`` and a verdict
    flag match closed jobs in any state, ``framework`` what that adapter opened,
    ``name_contains`` a substring of the label (case as written); ``count`` adds the total."""
    def lost(name: str, framework: str | None) -> str:
        job = ledger.create_task(name=name, framework=framework)
        ledger.start_task(job.id, owner=False)
        ledger.close_task(job.id, "timed_out", code="owner_lost")
        return job.id

    celery, dramatiq, bare = lost("app.Fetch", "celery"), lost("app.fetch", "dramatiq"), \
        lost("app.other", None)
    late = ledger.create_task(name="app.fetch_late", timeout_seconds=5)
    ledger.start_task(late.id, owner=False)
    clock.advance(10)

    def listed(**filters: Any) -> list[str]:
        return [t.task.id for t in ledger.list_tasks(**filters).tasks]

    assert listed(code="owner_lost") == [celery, dramatiq, bare]
    assert listed(code="owner_lost", framework="celery") == [celery]
    assert listed(name_contains="fetch") == [late.id]  # open work by default
    assert listed(name_contains="fetch", status="timed_out") == [dramatiq]
    assert listed(name_contains="Fetch", code="owner_lost") == [celery]
    assert listed(flag="past_deadline") == [late.id]
    assert listed(flag="verdict_pending") == [celery, dramatiq]
    ledger.mark_verdicts_published([dramatiq])
    assert listed(flag="verdict_pending") == [celery]
    assert listed(flag="verdict_published", framework="dramatiq") == [dramatiq]
    assert listed(flag="awaiting_delivery") == [celery, dramatiq, bare]
    assert listed(flag="owner_dead") == []  # no task here has an owner
    page = ledger.list_tasks(code="owner_lost", limit=1, count=True)
    assert (len(page.tasks), page.more, page.total, page.total_capped) == (1, True, 3, False)
    assert ledger.list_tasks(code="owner_lost", limit=1, after=page.tasks[0].cursor,
                             count=True).total == 3  # the total is of every match
    assert ledger.list_tasks().total is None
    state = ledger.job_state(dramatiq)
    assert state is not None and state.verdict is not None
    assert state.verdict.state == "published" and state.verdict.published_at == clock.t
    assert ledger.job_state(bare) is not None and ledger.job_state(bare).verdict is None
    for bad in ({"code": "nope"}, {"framework": "rq"}, {"name_contains": ""},
                {"name_contains": "x" * 201}, {"flag": "all"}, {"count": 1}):
        with pytest.raises(InvalidInput):
            ledger.list_tasks(**bad)
