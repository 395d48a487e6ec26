"""Recovery beside serving: ``start_recovery()`` returns at once, repeats every
``reconcile_interval_seconds`` (so a live process takes over the threads of one that died next
to it), and stopping it drains its resumed runs so that the next start resumes them."""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from lg_crash_graph import builder, saver_at
from lg_helpers import assert_healthy, shape, tree
from lg_procs import Stores, kill_in_slow
from task_state_guard import Ledger
from task_state_guard.integration import LostTask
from task_state_guard.integration.settings import DEFAULT_VERDICT_INTERVAL_SECONDS
from task_state_guard_langgraph import Recovery, guard, logical_task_id, recovery_invocation_id
from verdict_checks import tsg

OK = ("succeeded", "worker_completed", ())


def _until(predicate: Any, what: str, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_periodic_recovery_takes_over_a_thread_lost_next_to_it(
    stores: Stores, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="task_state_guard_langgraph")
    lost: list[LostTask] = []
    recovered: list[Recovery] = []
    with saver_at(stores.checkpoints) as saver:
        app = guard(
            builder(None).compile(checkpointer=saver, name="crashy"), db=stores.db,
            strict=True, on_lost=lost.append, on_recovered=recovered.append,
            reconcile_interval_seconds=0.5,
        )
        try:
            runner = app.start_recovery(durability="sync")
            assert app.start_recovery() is runner  # one runner per guarded graph
            assert runner.wait(60) and runner.report == []  # nothing lost yet
            # Another process dies mid-node while this one serves.
            kill_in_slow(stores, "t-bg", "bg-1")
            _until(lambda: recovered, "a periodic pass to resume the thread")
            new_id = recovery_invocation_id("bg-1")
            assert recovered == [Recovery("t-bg", new_id, "bg-1", "succeeded", None)]
            assert recovered[0].output["log"] == ["prepare", "slow", "finish"]
            assert [(x.thread_id, x.task_id) for x in lost] == [
                ("t-bg", logical_task_id("bg-1"))
            ]
            passes = runner.passes
            _until(lambda: runner.passes > passes + 1, "two more passes")
            assert len(lost) == 1 and len(recovered) == 1  # nothing reported twice
            assert runner.alive and app.stats()["errors"] == {}
        finally:
            app.close()
        assert not runner.alive
    # After guard()'s boot pass (INFO), a periodic pass logs its reconcile at DEBUG when it
    # changed nothing, at INFO with its counts when it closed the dead process's work.
    boot, *passes = [(r.levelno, json.loads(r.getMessage().split(") ", 1)[1]))
                     for r in caplog.records
                     if r.getMessage().startswith("task-state-guard: reconcile (reconcile) ")]
    assert boot[0] == logging.INFO
    assert {level for level, report in passes if report["tasks_timed_out"]} == {logging.INFO}
    assert {level for level, report in passes if not report["tasks_timed_out"]
            and not report["deliveries_failed"] and not report["deliveries_not_applicable"]} == {
        logging.DEBUG}
    with Ledger(stores.db) as ledger:
        assert_healthy(ledger)


def test_stopping_drains_resumed_runs_and_the_next_start_resumes_them(stores: Stores) -> None:
    kill_in_slow(stores, "t-stop", "stop-1")
    marker = str(stores.work / "resumed")
    with saver_at(stores.checkpoints) as saver:
        # This process's resumed run blocks in `slow` until released.
        graph = builder(marker, release=True).compile(checkpointer=saver, name="crashy")
        app = guard(graph, db=stores.db, strict=True)
        runner = app.start_recovery(durability="sync")
        _until(lambda: Path(marker).exists(), "the resumed run to reach `slow`")
        assert runner.running and runner.report is None  # the pass is still going
        stopper = threading.Thread(target=app.close)
        stopper.start()  # asks the resumed run to drain, then waits for it
        _until(lambda: not app._recovery_controls or all(
            c.drain_requested for c in app._recovery_controls), "the drain request")
        Path(marker + ".release").write_text("go")  # `slow` ends: the step boundary
        stopper.join(60)
        assert not stopper.is_alive() and not runner.alive
        first = recovery_invocation_id("stop-1")
        assert runner.report is not None
        assert [(r.thread_id, r.outcome) for r in runner.report] == [("t-stop", "cancelled")]

        # The next start resumes the drained recovery run from where it stopped.
        again = guard(builder(None).compile(checkpointer=saver, name="crashy"),
                      db=stores.db, strict=True)
        try:
            report = again.recover(durability="sync")
            assert report == [Recovery("t-stop", recovery_invocation_id(first), first,
                                       "succeeded", None, "drained")]
            assert shape(tree(again.ledger, logical_task_id("stop-1")))[3][-1] == (
                "crashy", "cancelled", "interrupted", (
                    ("slow", *OK),
                    ("crashy", "succeeded", "completed", (("finish", *OK),)),
                ),
            )
            assert_healthy(again.ledger)
        finally:
            again.close()


def test_the_interval_reconciles_even_without_background_recovery(stores: Stores) -> None:
    with saver_at(stores.checkpoints) as saver:
        app = guard(builder(None).compile(checkpointer=saver, name="crashy"), db=stores.db,
                    strict=True, reconcile_interval_seconds=0.5)
        try:
            kill_in_slow(stores, "t-int", "int-1")
            with Ledger(stores.db) as ledger:
                _until(lambda: str(ledger.get_task(logical_task_id("int-1")).status)
                       == "timed_out", "the periodic reconcile to close the dead run")
                assert ledger.get_task(logical_task_id("int-1")).terminal_code == "owner_lost"
            assert app.stats()["reconciles"] >= 2  # the boot pass and a periodic one
        finally:
            app.close()
        reconciles = app.stats()["reconciles"]
        time.sleep(1.5)
        assert app.stats()["reconciles"] == reconciles  # stopped with the guard


def test_under_defaults_recovery_publishes_what_an_operator_reconcile_recorded(
    stores: Stores,
) -> None:
    """No reconcile interval: after its first pass the runner waits; the runtime's verdict
    drain (every ``verdict_interval_seconds``, default 10 s) finds the verdict an operator's
    ``tsg reconcile`` recorded for a process that died next to this one and wakes it for a
    pass, which reports the lost thread and resumes it, once, within that interval."""
    lost: list[LostTask] = []
    recovered: list[Recovery] = []
    with saver_at(stores.checkpoints) as saver:
        app = guard(builder(None).compile(checkpointer=saver, name="crashy"), db=stores.db,
                    on_lost=lost.append, on_recovered=recovered.append)
        settings = app.settings
        assert settings.reconcile_interval_seconds == 0
        assert settings.verdict_interval_seconds == DEFAULT_VERDICT_INTERVAL_SECONDS
        try:
            runner = app.start_recovery(durability="sync")
            assert runner.wait(60) and runner.report == [] and runner.alive
            kill_in_slow(stores, "t-op", "op-1")  # another process dies mid-node
            report = tsg(stores.db, "reconcile")["reconcile"]  # the operator, default graces
            deadline = time.monotonic() + DEFAULT_VERDICT_INTERVAL_SECONDS + 5
            assert report["tasks_timed_out"] >= 1
            _until(lambda: lost, "the lost thread reported",
                   timeout=max(0.1, deadline - time.monotonic()))
            assert [(x.thread_id, x.task_id, x.code) for x in lost] == [
                ("t-op", logical_task_id("op-1"), "owner_lost")]
            _until(lambda: recovered, "the lost thread resumed")
            assert recovered[0].outcome == "succeeded"
            time.sleep(1)  # later checks find nothing owed: reported once
            assert len(lost) == 1 and len(recovered) == 1
            assert runner.alive and app.stats()["errors"] == {}
        finally:
            app.close()
        assert not runner.alive
    with Ledger(stores.db) as ledger:
        owed = ledger.status()["verdicts"]
        assert (owed["pending"]["langgraph"], owed["published"]["langgraph"]) == (0, 1)
        assert_healthy(ledger)
