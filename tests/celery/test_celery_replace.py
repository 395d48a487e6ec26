"""Task.replace() with canvases: the replaced task's logical task ends with its replacement.

Celery runs a replacement's last task (a chain's last task, a chord's body, the accumulate task
of a group) under the replaced task's id and the tasks before it under new ids. The logical
task of the replaced id must stay open until that last task ran (or the replacement failed or
was lost) and end with that outcome, never ``cancelled/ignored``. The success and failure rows
share one prefork worker; the SIGKILL row has its own.
"""

from __future__ import annotations

import os
import signal
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from celery.exceptions import ChordError, WorkerLostError  # type: ignore[import-untyped]
from celery_harness import Scenario, ledger_on, wait_for
from task_state_guard import Task

IGNORED = ("cancelled", "ignored")
DONE = ("succeeded", "worker_completed")
FAILED = ("failed", "worker_failed")


@contextmanager
def _shared_worker(tmp: Path, backend: str) -> Iterator[Scenario]:
    with ledger_on(backend, tmp) as db:
        sc = Scenario(tmp, db=db)
        sc.start_worker(concurrency=2)
        try:
            yield sc
        finally:
            sc.close()


@pytest.fixture
def shared(per_backend: Any, backend: str, tmp_path_factory: pytest.TempPathFactory) -> Scenario:
    """The module's worker on the test's ledger backend (started on first use)."""
    return per_backend.get(  # type: ignore[no-any-return]
        backend, lambda b: _shared_worker(tmp_path_factory.mktemp("replace"), b))


def settled(sc: Scenario, celery_id: str) -> list[Task]:
    """The attempts of a logical task once none is queued or running any more."""
    return sc.wait_attempts(
        celery_id, lambda found: all(str(a.status) not in ("queued", "running") for a in found)
    )


def outcomes(attempts: list[Task]) -> Counter[tuple[str, str | None]]:
    return Counter((str(a.status), a.terminal_code) for a in attempts)


def names(attempts: list[Task], outcome: tuple[str, str | None]) -> list[str]:
    return sorted(str(a.name) for a in attempts if (str(a.status), a.terminal_code) == outcome)


@pytest.mark.parametrize(
    ("kind", "value", "final", "stages"),
    [
        ("chain", 12, "tsgt.add", ["tsgt.add"]),
        ("group", [2, 4], "celery.accumulate", ["tsgt.add", "tsgt.add"]),
        ("chord", 6, "tsgt.total", ["tsgt.add", "tsgt.add"]),
        ("chain_group", [3, 4], "celery.accumulate", ["tsgt.add"] * 3),
    ],
)
def test_replaced_by_a_canvas_ends_with_its_last_task(
    shared: Scenario, kind: str, value: object, final: str, stages: list[str]
) -> None:
    """The replaced attempt closes ignored, each task before the last runs as a stage attempt
    of the replaced logical task, and the last task (the replaced id) closes it succeeded."""
    result = shared.send("tsgt.replace_with", kind)
    assert result.get(timeout=30) == value
    shared.wait_parent(result.id, "succeeded")
    attempts = settled(shared, result.id)
    assert str(shared.parent(result.id).terminal_code) == "worker_completed"
    assert outcomes(attempts) == Counter({IGNORED: 1, DONE: len(stages) + 1})
    assert names(attempts, IGNORED) == ["tsgt.replace_with"]
    assert names(attempts, DONE) == sorted([final, *stages])
    shared.assert_healthy()


def test_second_order_replacement(shared: Scenario) -> None:
    """A chain whose last task (the replaced id) replaces itself with a chain again: the
    logical task follows both replacements and ends with the innermost last task."""
    result = shared.send("tsgt.replace_with", "nested")
    assert result.get(timeout=30) == 112
    shared.wait_parent(result.id, "succeeded")
    attempts = settled(shared, result.id)
    assert outcomes(attempts) == Counter({IGNORED: 2, DONE: 3})
    assert names(attempts, IGNORED) == ["tsgt.replace_inner", "tsgt.replace_with"]
    assert names(attempts, DONE) == ["tsgt.add"] * 3
    shared.assert_healthy()


def test_failing_chain_replacement_fails_the_replaced_task(shared: Scenario) -> None:
    """A chain task of the replacement raises: Celery fails the rest of the chain (the replaced
    id included), and so does the ledger; the last task never runs."""
    result = shared.send("tsgt.replace_with", "chain_fail")
    with pytest.raises(ValueError):
        result.get(timeout=30)
    shared.wait_parent(result.id, "failed")
    attempts = settled(shared, result.id)
    assert (str(shared.parent(result.id).status), shared.parent(result.id).terminal_code) == FAILED
    assert outcomes(attempts) == Counter({IGNORED: 1, DONE: 1, FAILED: 1})
    assert names(attempts, FAILED) == ["tsgt.boom"]
    shared.assert_healthy()


def test_failing_group_replacement_fails_the_replaced_task(shared: Scenario) -> None:
    """A group member raises: the chord Celery made of the group fails its body (the replaced
    id) once every member ended; the ledger fails the replaced task with the member, and the
    slower member's stage still records how it really ended."""
    result = shared.send("tsgt.replace_with", "group_fail")
    with pytest.raises(ChordError):
        result.get(timeout=30)
    shared.wait_parent(result.id, "failed")
    attempts = settled(shared, result.id)
    assert shared.parent(result.id).terminal_code == "worker_failed"
    found = outcomes(attempts)
    assert found[IGNORED] == 1 and found[FAILED] == 1
    # add(1, 1) succeeded; the sleeping member ran to its end (succeeded), or had not started
    # when the replaced task failed (its queued stage cancelled/skipped; a delivery that was
    # starting just then still records how it ran).
    assert set(found) <= {IGNORED, FAILED, DONE, ("cancelled", "skipped")}, found
    assert "tsgt.add" in names(attempts, DONE)
    assert names(attempts, FAILED) == ["tsgt.boom"]
    assert not [a for a in attempts if str(a.name) == "celery.accumulate"]
    shared.assert_healthy()


def test_pool_child_killed_during_a_stage_fails_the_replaced_task(shared: Scenario) -> None:
    """SIGKILL of the pool child running a chain replacement's first task: the main process
    sees the child die (``WorkerLostError``), Celery fails the rest of the chain (the replaced
    id included), and the main process ends the stage and the replaced task the same way."""
    result = shared.send("tsgt.replace_with", "chain_sleep", 30, "stage-child")
    child = shared.marker("stage-child")
    shared.wait_attempts(result.id, lambda found: any(
        str(a.status) == "running" and a.name == "tsgt.sleep" for a in found
    ))
    os.kill(child, signal.SIGKILL)
    with pytest.raises(WorkerLostError):
        result.get(timeout=30)
    parent = shared.wait_parent(result.id, "failed")
    assert parent.terminal_code == "worker_lost"
    assert outcomes(settled(shared, result.id)) == Counter(
        {IGNORED: 1, ("failed", "worker_lost"): 1}
    )
    shared.assert_healthy()


def test_worker_killed_while_the_replacement_runs(scenario: Scenario) -> None:
    """SIGKILL of the whole worker while a chain replacement's first task runs: the logical task
    stays open while it runs, and the restarted worker's boot reconcile closes it lost
    (``owner_lost``; FAILURE in the result backend), never ``cancelled/ignored``."""
    sc = scenario
    worker = sc.start_worker(concurrency=2)
    result = sc.send("tsgt.replace_with", "chain_sleep", 30, "replacement-runs")
    sc.marker("replacement-runs")
    running = sc.wait_attempts(
        result.id, lambda found: any(str(a.status) == "running" for a in found)
    )
    assert [str(a.name) for a in running if str(a.status) == "running"] == ["tsgt.sleep"]
    assert str(sc.parent(result.id).status) == "running"
    worker.sigkill()
    sc.start_worker(concurrency=1)  # its boot step reconciles before consuming
    parent = sc.wait_parent(result.id, "timed_out")
    assert parent.terminal_code == "owner_lost"
    assert outcomes(sc.attempts(result.id)) == Counter(
        {IGNORED: 1, ("timed_out", "owner_lost"): 1}
    )
    wait_for(lambda: result.state == "FAILURE", what="FAILURE in the result backend")
    sc.assert_healthy()
