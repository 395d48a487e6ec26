"""Recovery never strands a thread, whatever left it mid-node: a crash during recovery, a crash
after ``update_state``, a crash under ``durability="exit"``, a drain. Real child processes
SIGKILLed (or SIGTERMed) mid-node, on SQLite and on PostgreSQL (ledger and checkpointer);
recovery runs in this process."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from lg_crash_graph import builder, saver_at
from lg_helpers import assert_healthy, shape, tree
from lg_procs import HERE, Stores, child_env, kill_in_slow, sigkill, start_child, wait_marker
from task_state_guard import Ledger
from task_state_guard.integration import LostTask
from task_state_guard_langgraph import (
    GuardedGraph,
    Recovery,
    guard,
    logical_task_id,
    recovery_invocation_id,
)

OK = ("succeeded", "worker_completed", ())
LOST = ("timed_out", "owner_lost", ())


@contextmanager
def recovering(stores: Stores, lost: list[LostTask]) -> Iterator[GuardedGraph]:
    """A new process's guard (this one): its creation reconciles the ledger."""
    with saver_at(stores.checkpoints) as saver:
        graph = builder(None).compile(checkpointer=saver, name="crashy")
        app = guard(graph, db=stores.db, strict=True, on_lost=lost.append)
        try:
            yield app
        finally:
            app.close()


def _log(app: GuardedGraph, thread_id: str) -> list[str]:
    state = app.get_state({"configurable": {"thread_id": thread_id}})
    assert not state.next
    return list(state.values["log"])


def test_a_crash_during_recovery_is_taken_over(stores: Stores) -> None:
    kill_in_slow(stores, "t-rec", "rec-1")
    first = recovery_invocation_id("rec-1")
    # A second process recovers the thread and is killed while its resumed run is in `slow`.
    kill_in_slow(stores, "t-rec", "unused", "recover", running=first)
    lost: list[LostTask] = []
    with recovering(stores, lost) as app:
        report = app.recover(durability="sync")
        second = recovery_invocation_id(first)
        assert report == [Recovery("t-rec", second, first, "succeeded", None)]
        assert report.lost == ["t-rec"] and report.claimed_elsewhere == 0
        assert lost == [
            LostTask(first, logical_task_id(first), "crashy", "owner_lost", "t-rec")
        ]
        assert _log(app, "t-rec") == ["prepare", "slow", "finish"]
        # The lineage: lost run -> dead recovery claim -> the recovery that finished it.
        assert shape(tree(app.ledger, logical_task_id("rec-1"))) == (
            "crashy", "timed_out", "owner_lost", (
                ("prepare", *OK),
                ("slow", *LOST),
                ("crashy", "timed_out", "owner_lost", (
                    ("slow", *LOST),
                    ("crashy", "succeeded", "completed", (("slow", *OK), ("finish", *OK))),
                )),
            ),
        )
        # Nothing is left: no resume, no report, no hook call.
        again = app.recover(durability="sync")
        assert again == [] and again.lost == [] and len(lost) == 1
        assert app.stats()["errors"] == {}
        assert_healthy(app.ledger)


def test_a_recovery_run_lost_during_a_pass_is_reported_with_its_thread_and_resumed(
    stores: Stores,
) -> None:
    """A recovering server dies while another one's pass runs: the pass examined the dead
    run's thread while it was still running, and a reconcile closed it lost afterwards. The
    pass examines that thread again: the loss is reported with its thread and run id and the
    thread resumed in the same pass (not reported without them, and resumed a pass later)."""
    kill_in_slow(stores, "t-late", "late-1")
    first = recovery_invocation_id("late-1")
    recovering_child, marker = start_child(stores, "t-late", "unused", "recover")
    try:
        wait_marker(recovering_child, marker)  # its resumed run is in `slow`, alive
        kill_in_slow(stores, "t-z", "z-1")  # another thread lost, examined after "t-late"
        lost: list[LostTask] = []

        def on_lost(task: LostTask) -> None:
            lost.append(task)
            if task.thread_id == "t-z":  # meanwhile the recovering server dies, and is found
                sigkill(recovering_child)
                with Ledger(stores.db) as ledger:
                    # the run (its node attempts are history: the pass that reports it
                    # writes them from the checkpoints)
                    assert ledger.reconcile()["tasks_timed_out"] == 1

        with saver_at(stores.checkpoints) as saver:
            graph = builder(None).compile(checkpointer=saver, name="crashy")
            app = guard(graph, db=stores.db, strict=True, on_lost=on_lost)
            try:
                report = app.recover(durability="sync")
                assert report.resumed == ["t-z", "t-late"]
                assert lost == [
                    LostTask("z-1", logical_task_id("z-1"), "crashy", "owner_lost", "t-z"),
                    LostTask(first, logical_task_id(first), "crashy", "owner_lost", "t-late"),
                ]
                assert _log(app, "t-late") == _log(app, "t-z") == ["prepare", "slow", "finish"]
                again = app.recover()
                assert again == [] and again.reported == [] and len(lost) == 2
                assert app.stats()["errors"] == {}
                assert_healthy(app.ledger)
            finally:
                app.close()
    finally:
        if recovering_child.poll() is None:
            sigkill(recovering_child)


def test_a_recovery_that_delivers_settles_the_deliveries_it_owed(stores: Stores) -> None:
    """Lost run -> dead recovery -> recovery that delivers its answer: the two runs it
    recovered are marked delivered with it, so no delivery of theirs fails after the grace."""
    kill_in_slow(stores, "t-owed", "owed-1")
    first = recovery_invocation_id("owed-1")
    kill_in_slow(stores, "t-owed", "unused", "recover", running=first)
    second = recovery_invocation_id(first)
    lost: list[LostTask] = []
    with recovering(stores, lost) as app:
        app.on_recovered = lambda r: app.mark_delivered(r.invocation_id)
        report = app.recover(durability="sync")
        assert report.resumed == ["t-owed"] and report[0].invocation_id == second
        runs = [app.ledger.get_task(logical_task_id(i)) for i in ("owed-1", first, second)]
        assert [(str(t.status), str(t.delivery_status), t.delivery_code) for t in runs] == [
            ("timed_out", "delivered", "transport_acknowledged"),
            ("timed_out", "delivered", "transport_acknowledged"),
            ("succeeded", "delivered", "transport_acknowledged"),
        ]
        # Past the delivery grace: no delivery left to fail, one lost-run signal in all.
        assert app.ledger.reconcile(delivery_grace_seconds=0)["deliveries_failed"] == 0
        assert len(lost) == 1 and app.stats()["errors"] == {}
        assert_healthy(app.ledger)


@pytest.mark.parametrize("mode", ["edit", "raw-edit"])
def test_a_crash_after_update_state_is_resumed_with_its_lineage(
    stores: Stores, mode: str
) -> None:
    # A canonical UUID invocation id is stored, so recovery can name it; another is not.
    inv = str(uuid.uuid4()) if mode == "edit" else "edited-run"
    kill_in_slow(stores, "t-edit", inv, mode)
    lost: list[LostTask] = []
    with recovering(stores, lost) as app:
        report = app.recover(durability="sync")
        known = inv if mode == "edit" else None
        assert report == [
            Recovery("t-edit", recovery_invocation_id(inv), known, "succeeded", None)
        ]
        assert report[0].recovers_task_id == logical_task_id(inv)
        assert report.lost == ["t-edit"]
        assert lost == [LostTask(known, logical_task_id(inv), "crashy", "owner_lost", "t-edit")]
        assert _log(app, "t-edit") == ["prepare", "edited", "slow", "finish"]
        # The run that continued the edited state is a child of the run whose state was
        # edited; the recovery, a child of it.
        assert shape(tree(app.ledger, logical_task_id(inv + "-first"))) == (
            "crashy", "succeeded", "completed", (
                ("prepare", *OK),
                ("crashy", "timed_out", "owner_lost", (
                    ("slow", *LOST),
                    ("crashy", "succeeded", "completed", (("slow", *OK), ("finish", *OK))),
                )),
            ),
        )
        assert app.recover() == [] and len(lost) == 1
        assert_healthy(app.ledger)


def test_a_crash_under_exit_durability_is_reported(stores: Stores) -> None:
    kill_in_slow(stores, "t-exit", "exit-1", "exit")
    lost: list[LostTask] = []
    with recovering(stores, lost) as app:
        report = app.recover(durability="sync")
        # Nothing of the run was saved: the thread is as the earlier run left it, so there
        # is nothing to resume, but the loss is reported with its thread.
        assert report == [] and report.lost == ["t-exit"]
        # "exit-1" is not a canonical UUID: never stored, so the hook gets the ledger id only.
        assert lost == [LostTask(None, logical_task_id("exit-1"), "crashy", "owner_lost",
                                 "t-exit")]
        assert _log(app, "t-exit") == ["prepare", "slow", "finish"]
        again = app.recover()  # reported once, not on every pass
        assert again == [] and again.lost == [] and len(lost) == 1
        assert shape(tree(app.ledger, logical_task_id("exit-1-first"))) == (
            "crashy", "succeeded", "completed", (
                ("prepare", *OK), ("slow", *OK), ("finish", *OK),
                # Its node attempts were history buffered in the dead process and it saved no
                # checkpoint: nothing tells what it ran.
                ("crashy", "timed_out", "owner_lost", ()),
            ),
        )
        assert_healthy(app.ledger)


def test_a_drained_run_is_resumed_on_restart(stores: Stores) -> None:
    child, marker = start_child(stores, "t-drain", "drain-1", "drain")
    try:
        wait_marker(child, marker)
        child.send_signal(15)  # SIGTERM: the worker's shutdown handler requests a drain
        Path(str(marker) + ".release").write_text("go")  # `slow` finishes its step
        out, _ = child.communicate(timeout=90)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(30)
    assert child.returncode == 0 and "drained" in out
    lost: list[LostTask] = []
    with recovering(stores, lost) as app:
        drained = tree(app.ledger, logical_task_id("drain-1"))
        assert shape(drained)[:3] == ("crashy", "cancelled", "interrupted")
        report = app.recover(durability="sync")
        assert report == [Recovery("t-drain", recovery_invocation_id("drain-1"), "drain-1",
                                   "succeeded", None, "drained")]
        assert report.lost == [] and lost == []  # drained, not lost
        assert _log(app, "t-drain") == ["prepare", "slow", "finish"]
        assert shape(tree(app.ledger, logical_task_id("drain-1"))) == (
            "crashy", "cancelled", "interrupted", (
                ("prepare", *OK), ("slow", *OK),
                ("crashy", "succeeded", "completed", (("finish", *OK),)),
            ),
        )
        assert app.recover() == []
        assert_healthy(app.ledger)


def test_two_servers_recovering_at_once_resume_and_report_each_thread_once(
    stores: Stores,
) -> None:
    threads = [f"t-two-{i}" for i in range(4)]
    # One process with four runs in flight, SIGKILLed.
    child, marker = start_child(stores, "t-two", "two", "many")
    try:
        for i in range(5):
            wait_marker(child, Path(f"{marker}-{i}"))
    finally:
        sigkill(child)
    go = stores.work / "go"
    outs = [stores.work / f"server-{i}.jsonl" for i in range(2)]
    servers = [
        subprocess.Popen(
            [sys.executable, str(HERE / "lg_recovery_server.py"), stores.db,
             stores.checkpoints, str(go), str(out)],
            cwd=str(HERE), env=child_env(),
        )
        for out in outs
    ]
    try:
        # Both have reconciled (their guards exist) before either recovers.
        deadline = time.monotonic() + 120
        while not all(out.exists() and "ready" in out.read_text() for out in outs):
            assert all(server.poll() is None for server in servers)
            assert time.monotonic() < deadline, "the servers did not start"
            time.sleep(0.05)
        go.write_text("go")
        for server in servers:
            assert server.wait(120) == 0
    finally:
        for server in servers:
            if server.poll() is None:
                server.kill()
                server.wait(30)
    lines = [json.loads(line) for out in outs for line in out.read_text().splitlines()]
    calls = Counter(line["thread"] for line in lines if line["kind"] == "on_lost")
    recovered = Counter(line["thread"] for line in lines if line["kind"] == "on_recovered")
    reports = [line for line in lines if line["kind"] == "report"]
    # Each lost thread: one on_lost, one resumption, across both servers; the exit-durability
    # run (nothing saved, so no checkpoint leads to it) one on_lost with the thread it was
    # recorded with.
    assert calls == Counter([*threads, "t-two-4"]) and recovered == Counter(threads)
    unplaced = [line for line in lines if line["kind"] == "on_lost"
                and line["thread"] == "t-two-4"]
    assert [line["task"] for line in unplaced] == [logical_task_id("two-4")]
    assert all(line["log"] == ["prepare", "slow", "finish"]
               for line in lines if line["kind"] == "on_recovered")
    assert sorted(t for r in reports for t in r["resumed"]) == threads
    assert sorted(t for r in reports for t in r["lost"]) == threads
    assert all(r["errors"] == {} for r in reports)
    with Ledger(stores.db) as ledger:
        for i in range(4):
            lost = tree(ledger, logical_task_id(f"two-{i}"))
            resumed = [c for c in lost["children"] if c["delivery_required"]]
            assert [shape(c)[:3] for c in resumed] == [("crashy", "succeeded", "completed")]
        assert_healthy(ledger)


def test_a_crash_under_exit_durability_on_a_new_thread_is_reported_once(
    stores: Stores,
) -> None:
    kill_in_slow(stores, "t-exit-new", "exit-new-1", "exit-new")
    lost: list[LostTask] = []
    with recovering(stores, lost) as app:
        # No checkpoint leads to the run (nothing was saved): its verdict is reported after
        # the pass over every thread, with the thread id the run was recorded with.
        report = app.recover(durability="sync")
        lid = logical_task_id("exit-new-1")
        assert report == [] and report.lost == []
        assert report.reported == lost == [
            LostTask(None, lid, "crashy", "owner_lost", "t-exit-new")]
        # The operator finds the thread's run by its thread id.
        assert app.ledger.find_task_ids(None, thread_id="t-exit-new") == [lid]
        assert app.get_state({"configurable": {"thread_id": "t-exit-new"}}).values == {}
        assert app.publish_verdicts() == 0 and len(lost) == 1  # published once
        assert app.stats()["verdicts_published"] == 1
        assert_healthy(app.ledger)


def test_a_run_closed_by_the_operator_cli_is_reported_and_resumed(stores: Stores) -> None:
    kill_in_slow(stores, "t-cli", "cli-1")
    # The operator reconciles first (the entrypoint's TSG_RECONCILE=apply, a cron job).
    cli = subprocess.run([str(Path(sys.executable).parent / "tsg"), "--db", stores.db,
                          "reconcile"], capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0, cli.stdout
    # The invocation alone: its node attempts were history buffered in the dead process.
    assert json.loads(cli.stdout)["reconcile"]["tasks_timed_out"] == 1
    lost: list[LostTask] = []
    with recovering(stores, lost) as app:
        assert app.last_reconcile is not None and app.last_reconcile["tasks_timed_out"] == 0
        report = app.recover(durability="sync")
        assert report.lost == report.resumed == ["t-cli"]
        # The checkpoint names the run: the hook gets its invocation id and thread.
        assert lost == [LostTask("cli-1", logical_task_id("cli-1"), "crashy", "owner_lost",
                                 "t-cli")]
        assert _log(app, "t-cli") == ["prepare", "slow", "finish"]
        # Recovery wrote them from the checkpoints: the node that was running is lost.
        run = shape(tree(app.ledger, logical_task_id("cli-1")))
        assert run[:3] == ("crashy", "timed_out", "owner_lost")
        assert run[3][:2] == (("prepare", *OK), ("slow", *LOST))
        assert app.recover() == [] and len(lost) == 1
        assert_healthy(app.ledger)
