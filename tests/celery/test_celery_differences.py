"""Where the ledger and Celery's own record can differ (the README's "Where the ledger and
Celery can differ"), with real workers: a revoked Celery id that runs anyway."""

from __future__ import annotations

import sys
import uuid

from celery_harness import REPO, Scenario, wait_for

sys.path.insert(0, str(REPO / "tests" / "core"))
from core_helpers import assert_json_line, run_cli


def test_a_revoked_id_that_runs_again_keeps_its_close(scenario: Scenario) -> None:
    """Celery revokes an id; a worker that never heard of the revoke (revokes live in each
    worker's memory) runs it twice. Celery's result turns from REVOKED to SUCCESS; the ledger
    keeps the job ``cancelled/revoked`` (a close is final) with the two ``succeeded`` attempts
    under it. Doctor stays healthy and warns once; ``tsg tasks --contradicted`` names it."""
    first = scenario.start_worker()
    celery_id = str(uuid.uuid4())
    replies = scenario.client.control.revoke(celery_id, reply=True, timeout=10)
    assert replies, "the worker did not confirm the revoke"
    revoked = scenario.send("tsgt.ok", task_id=celery_id)
    scenario.wait_parent(celery_id, "cancelled")
    assert scenario.outcome(celery_id) == (("cancelled", "revoked"), [])
    wait_for(lambda: revoked.state == "REVOKED", what="Celery's REVOKED")
    first.stop()

    scenario.start_worker()  # no state file, no mingle: it knows of no revoke
    for run in (1, 2):
        again = scenario.send("tsgt.ok", task_id=celery_id)
        scenario.wait_attempts(celery_id, lambda a, n=run: sum(
            str(t.status) == "succeeded" for t in a) == n)
    # Celery's record now says it succeeded (SUCCESS stored over REVOKED).
    wait_for(lambda: again.state == "SUCCESS", what="Celery's SUCCESS")
    assert again.get(timeout=5) == "ok"
    assert scenario.outcome(celery_id) == (
        ("cancelled", "revoked"),
        [("succeeded", "worker_completed"), ("succeeded", "worker_completed")],
    )
    report = scenario.ledger.doctor()
    assert report["healthy"] is True, report
    assert report["warnings"] == {"contradicted_close_count": 1}
    parent = scenario.parent(celery_id)
    listed = assert_json_line(run_cli("--db", scenario.db, "tasks", "--contradicted",
                                      "--details"))
    assert [(row["id"], row["framework_id"], row["status"], row["code"])
            for row in listed["tasks"]] == [(parent.id, celery_id, "cancelled", "revoked")]
    attempts = assert_json_line(run_cli("--db", scenario.db, "tasks", "--contradicted",
                                        "--attempts", "--details", "--celery", celery_id))
    assert [row["id"] for row in attempts["tasks"]] == [
        a.id for a in scenario.attempts(celery_id)]
