"""The adapter's counters reach Prometheus from every process: a real prefork worker (two pool
children) whose ledger is read-only for it counts a ledger error in each child's hooks, and one
`tsg metrics --metrics-dir` scrape shows the sum of both children's counts (and the main
process's), while each child's own `stats()` holds only its part."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from celery_harness import REPO, Scenario, wait_for

sys.path.insert(0, str(REPO / "tests" / "core"))
from core_helpers import run_cli
from prom_text import parse

# The worker sees its ledger directory read-only (a private mount namespace); the metrics
# directory and everything else stay writable, and the test itself reads the ledger as usual.
READ_ONLY = 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && exec "$@"'
JOBS = 8


@pytest.mark.sqlite_only(reason="the ledger's directory mounted read-only for the worker")
def test_error_counters_of_two_prefork_children_in_one_scrape(scenario: Scenario) -> None:
    metrics_dir = scenario.tmp / "metrics"
    scenario.ledger.create_task(name="seed")  # a healthy ledger, read-only for the worker
    scenario.ledger.close()
    scenario._ledger = None
    worker = scenario.start_worker(
        concurrency=2, TSG_METRICS_DIR=str(metrics_dir),
        wrap=["unshare", "--mount", "--propagation", "private", "sh", "-c", READ_ONLY,
              str(Path(scenario.db).parent)],
    )
    results = [scenario.send("tsgt.sleep", 0.4, f"job{i}") for i in range(JOBS)]
    assert [r.get(timeout=60) for r in results] == ["slept"] * JOBS
    children = {scenario.marker(f"job{i}") for i in range(JOBS)}
    assert len(children) == 2 and worker.pid not in children  # both pool children ran jobs

    scrape = run_cli("--db", scenario.db, "metrics", "--metrics-dir", str(metrics_dir))
    assert scrape.code == 0 and scrape.stderr == "", scrape.stdout
    families = parse(scrape.stdout)
    errors = families["tsg_adapter_ledger_errors_total"]
    by_hook: dict[str, float] = {}
    for labels, value in errors.samples:
        assert labels["adapter"] == "celery" and labels["error"].isidentifier()
        by_hook[labels["hook"]] = by_hook.get(labels["hook"], 0) + value
    # every job's first hook in its child met the read-only ledger: the sum over both children
    assert by_hook["task_prerun"] == JOBS, by_hook
    assert by_hook.get("reconcile_on_boot", 0) >= 1, by_hook  # the main process's boot pass
    conflicts = families["tsg_adapter_conflicts_total"].samples
    assert {labels["kind"] for labels, _ in conflicts} >= {
        "attempt_close", "logical_close", "delivery_mark_dropped"}
    assert families["tsg_adapter_counters_readable"].value() == 1
    # the ledger's own families are in the same scrape, unchanged by the worker
    assert families["tsg_tasks"].value(kind="task", status="queued") == 1
    # nothing was written to the ledger by the worker
    scenario.assert_healthy()


def test_refused_close_in_a_pool_child_reaches_the_scrape(scenario: Scenario) -> None:
    """A logical task closed elsewhere while a pool child still runs its task (as when Celery
    runs a task whose id was revoked already): the attempt is recorded as it really ended, the
    logical task keeps its first outcome, and the child's refused close is counted where one
    `tsg metrics --metrics-dir` scrape of the whole worker sees it."""
    metrics_dir = scenario.tmp / "metrics"
    worker = scenario.start_worker(concurrency=2, TSG_METRICS_DIR=str(metrics_dir))
    result = scenario.send("tsgt.sleep", 1.5, "late")
    child = scenario.marker("late")
    assert child != worker.pid
    scenario.wait_attempts(result.id, lambda found: [str(a.status) for a in found] == ["running"])
    logical = scenario.parent(result.id)
    scenario.ledger.close_task(logical.id, "cancelled", code="caller_cancelled")
    assert result.get(timeout=30) == "slept"
    scenario.wait_attempts(
        result.id, lambda found: [str(a.status) for a in found] == ["succeeded"]
    )
    assert scenario.outcome(result.id) == (
        ("cancelled", "caller_cancelled"), [("succeeded", "worker_completed")]
    )

    def scraped() -> dict[str, float]:
        out = run_cli("--db", scenario.db, "metrics", "--metrics-dir", str(metrics_dir))
        assert out.code == 0 and out.stderr == "", out.stdout
        return {
            labels["kind"]: value
            for labels, value in parse(out.stdout)["tsg_adapter_conflicts_total"].samples
        }

    # The child counts after its close transaction; the scrape may come first.
    conflicts = wait_for(lambda: (found := scraped())["logical_close"] == 1 and found)
    assert conflicts["attempt_close"] == 0
    scenario.assert_healthy()
