"""Retention and the read-side aggregates status / metrics: counts only, no ids."""

from __future__ import annotations

import json
import os
import re
import time

import pytest
from core_helpers import Clock, run_cli, sidecars, snapshot_tree
from task_state_guard import InvalidInput, Ledger, TaskNotFound

PRUNE_KEYS = {"dry_run", "applied", "trees_deleted", "tasks_deleted", "events_deleted",
              "trees_retained"}


def closed_tree(led: Ledger, clock: Clock, children: int = 2) -> list[str]:
    root = led.create_task(name="tree.root")
    ids = [root.id]
    for _ in range(children):
        child = led.create_task(parent_id=root.id, delivery_required=False, name="tree.child")
        led.start_task(child.id, owner=False)
        led.close_task(child.id, "succeeded")
        led.set_delivery(child.id, "not_applicable")
        ids.append(child.id)
    led.close_task(root.id, "succeeded")
    led.set_delivery(root.id, "delivered")
    return ids


def test_prune_whole_closed_trees_only(ledger: Ledger, clock: Clock) -> None:
    old_tree = closed_tree(ledger, clock)  # 3 tasks, 4 + 4 + 3 = 11 events
    # a closed root whose child is still running: never pruned
    root = ledger.create_task()
    child = ledger.create_task(parent_id=root.id, delivery_required=False)
    ledger.start_task(child.id, owner=False)
    ledger.close_task(root.id, "succeeded")
    ledger.set_delivery(root.id, "delivered")
    # a closed root whose child's delivery is still pending: never pruned
    root2 = ledger.create_task()
    child2 = ledger.create_task(parent_id=root2.id, delivery_required=False)
    ledger.close_task(child2.id, "failed")
    ledger.close_task(root2.id, "failed")
    ledger.set_delivery(root2.id, "failed")
    # a terminal task whose delivery is pending: not closed history
    pending = ledger.create_task()
    ledger.close_task(pending.id, "succeeded")
    # queued and running work
    queued = ledger.create_task()
    clock.advance(3600)
    recent_tree = closed_tree(ledger, clock)  # too recent
    total_before = ledger.doctor()
    clock.advance(100)

    preview = ledger.prune(1000, dry_run=True)
    assert set(preview) == PRUNE_KEYS
    assert preview["dry_run"] is True and preview["applied"] is False
    assert (preview["trees_deleted"], preview["tasks_deleted"], preview["events_deleted"]) == (
        1, 3, 11)
    assert preview["trees_retained"] == 2
    assert ledger.doctor() == total_before

    applied = ledger.prune(1000)
    assert applied["applied"] is True and applied["dry_run"] is False
    assert {k: v for k, v in applied.items() if k not in ("dry_run", "applied")} == {
        k: v for k, v in preview.items() if k not in ("dry_run", "applied")}
    after = ledger.doctor()
    assert after["healthy"] is True
    assert after["task_count"] == total_before["task_count"] - 3
    assert after["event_count"] == total_before["event_count"] - 11
    for tid in old_tree:
        with pytest.raises(TaskNotFound):
            ledger.get_task(tid)
    for tid in (root.id, child.id, root2.id, child2.id, pending.id, queued.id, *recent_tree):
        ledger.get_task(tid)
    again = ledger.prune(1000)
    assert again["trees_deleted"] == 0 and again["tasks_deleted"] == 0
    assert json.dumps(applied).count("-") == 0  # no ids


def test_prune_keeps_tree_with_a_recent_descendant(ledger: Ledger, clock: Clock) -> None:
    root = ledger.create_task()
    child = ledger.create_task(parent_id=root.id, delivery_required=False)
    grandchild = ledger.create_task(parent_id=child.id, delivery_required=False)
    for t in (root, child):
        ledger.close_task(t.id, "cancelled")
    ledger.set_delivery(root.id, "failed")
    ledger.set_delivery(child.id, "not_applicable")
    clock.advance(5000)
    ledger.close_task(grandchild.id, "cancelled")  # the newest change is deep in the tree
    ledger.set_delivery(grandchild.id, "not_applicable")
    clock.advance(100)
    report = ledger.prune(1000)
    assert report["trees_deleted"] == 0 and report["trees_retained"] == 1
    clock.advance(1000)
    report = ledger.prune(1000)
    assert (report["trees_deleted"], report["tasks_deleted"]) == (1, 3)
    assert ledger.doctor() == {**ledger.doctor(), "healthy": True, "task_count": 0}


def test_prune_cutoff_is_inclusive_and_validated(ledger: Ledger, clock: Clock) -> None:
    closed_tree(ledger, clock, children=0)
    clock.advance(99.5)
    assert ledger.prune(100)["trees_deleted"] == 0
    clock.advance(0.5)
    assert ledger.prune(100)["trees_deleted"] == 1
    for bad in (-1, float("nan"), "10", None):
        with pytest.raises(InvalidInput):
            ledger.prune(bad)  # type: ignore[arg-type]


def test_prune_in_batches(ledger: Ledger, clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    from task_state_guard.ops import prune

    monkeypatch.setattr(prune, "BATCH", 300)  # 1100 roots: four batches, the last one short
    with ledger.atomic():  # the set-up in one transaction (3300 on their own: slow on a server)
        for _ in range(1100):
            t = ledger.create_task()
            ledger.close_task(t.id, "cancelled")
            ledger.set_delivery(t.id, "failed")
    clock.advance(10)
    assert ledger.prune(5, dry_run=True)["trees_deleted"] == 1100
    report = ledger.prune(5)
    assert report["trees_deleted"] == 1100 and report["events_deleted"] == 3300
    assert ledger.doctor() == {**ledger.doctor(), "healthy": True, "task_count": 0}


@pytest.mark.sqlite_only(reason="the SQLite connection's page cache")
def test_bulk_writes_restore_the_connection_settings(ledger: Ledger, clock: Clock) -> None:
    """Reconcile apply and prune borrow a larger page cache and give it back."""
    from task_state_guard.sqlite import connections

    conn = ledger._db.conn()  # type: ignore[attr-defined]
    pragmas = ("cache_size", "wal_autocheckpoint")
    before = [conn.execute(f"PRAGMA {p}").fetchone()[0] for p in pragmas]
    assert before == [-connections.CACHE_KIB, connections.AUTOCHECKPOINT_PAGES]
    closed_tree(ledger, clock)
    clock.advance(10)
    ledger.reconcile()
    assert ledger.prune(5)["trees_deleted"] == 1
    after = [conn.execute(f"PRAGMA {p}").fetchone()[0] for p in pragmas]
    assert after == before


@pytest.mark.sqlite_only(reason="every byte and entry of the SQLite directory")
def test_cli_prune_dry_run_changes_nothing(tmp_path) -> None:
    directory = str(tmp_path / "d")
    db = os.path.join(directory, "tasks.sqlite")
    clock = Clock(time.time() - 10_000)
    with Ledger(db, clock=clock) as led:
        closed_tree(led, clock)
        led.create_task()
    assert sidecars(db) == []
    before = snapshot_tree(directory)
    result = run_cli("--db", db, "prune", "--older-than", "60", "--dry-run")
    assert result.code == 0 and result.stderr == ""
    payload = json.loads(result.stdout)
    assert payload["prune"]["tasks_deleted"] == 3 and payload["prune"]["dry_run"] is True
    assert snapshot_tree(directory) == before
    result = run_cli("--db", db, "prune", "--older-than", "60")
    assert json.loads(result.stdout)["prune"]["tasks_deleted"] == 3
    assert json.loads(run_cli("--db", db, "doctor").stdout)["task_count"] == 1


# ----------------------------------------------------------------------------- status


def build_status_ledger(led: Ledger, clock: Clock) -> list[str]:
    ids = []
    q = led.create_task(name="app.queue")
    ids.append(q.id)
    clock.advance(10)
    late = led.create_task(name="app.run", timeout_seconds=50)
    led.start_task(late.id, owner=False)
    ids.append(late.id)
    clock.advance(20)
    stale = led.create_task(name="app.run")
    led.start_task(stale.id, owner=False)
    ids.append(stale.id)
    done = led.create_task()
    led.close_task(done.id, "succeeded")
    led.set_delivery(done.id, "delivered")
    ids.append(done.id)
    failed = led.create_task(name="app.queue", delivery_required=False)
    led.close_task(failed.id, "failed")
    ids.append(failed.id)
    clock.advance(700)
    fresh = led.create_task(name="app.run")
    led.start_task(fresh.id, owner=False)
    ids.append(fresh.id)
    clock.advance(5)
    return ids


def test_status_contents(ledger: Ledger, clock: Clock) -> None:
    ids = build_status_ledger(ledger, clock)
    report = ledger.status()
    assert report["tasks"] == {"queued": 1, "running": 3, "succeeded": 1, "failed": 1,
                               "timed_out": 0, "cancelled": 0}
    assert report["deliveries"] == {"pending": 5, "delivered": 1, "failed": 0,
                                    "not_applicable": 0}
    assert report["by_name"]["app.run"]["running"] == 3
    assert report["by_name"]["app.queue"]["queued"] == 1
    assert report["by_name"]["app.queue"]["failed"] == 1
    assert report["oldest_queued_age_seconds"] == pytest.approx(735)
    assert report["oldest_running_age_seconds"] == pytest.approx(725)
    assert report["running_past_deadline"] == 1
    assert report["running_heartbeat_stale"] == 2
    assert report["running_owner_dead"] == 0
    text = json.dumps(report)
    for tid in ids:
        assert tid not in text
    assert ledger.status(active_grace_seconds=10_000)["running_heartbeat_stale"] == 0


def test_status_of_empty_ledger(ledger: Ledger) -> None:
    report = ledger.status()
    assert sum(report["tasks"].values()) == 0
    assert report["oldest_queued_age_seconds"] is None
    assert report["oldest_running_age_seconds"] is None


def test_cli_status_and_metrics_have_no_ids(db: str) -> None:
    clock = Clock(time.time() - 1000)
    with Ledger(db, clock=clock) as led:
        ids = build_status_ledger(led, clock)
    status = run_cli("--db", db, "status")
    payload = json.loads(status.stdout)
    assert status.code == 0 and payload["ok"] is True
    assert payload["status"]["tasks"]["running"] == 3
    text = run_cli("--db", db, "status", "--format", "text")
    assert text.code == 0 and text.stderr == ""
    assert "app.run" in text.stdout and "running" in text.stdout
    metrics = run_cli("--db", db, "metrics")
    assert metrics.code == 0 and metrics.stderr == ""
    for output in (status.stdout, text.stdout, metrics.stdout):
        for tid in ids:
            assert tid not in output
            assert tid.replace("-", "") not in output
    # Prometheus text exposition: HELP/TYPE before samples, valid sample lines
    sample = re.compile(r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{[a-z_]+="[^"]*"(,[a-z_]+="[^"]*")*\})? '
                        r"-?[0-9.e+]+$")
    declared = set()
    for line in metrics.stdout.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            assert kind in ("gauge", "counter")
            assert name.endswith("_total") == (kind == "counter")
            declared.add(name)
        elif line.startswith("# HELP "):
            continue
        else:
            assert sample.match(line), line
            assert line.split("{")[0].split(" ")[0] in declared
    assert 'tsg_tasks{kind="task",status="running"} 3' in metrics.stdout
    assert 'name="app.run"' in metrics.stdout
    labels = set(re.findall(r'([a-z_]+)="', metrics.stdout))
    assert labels <= {"status", "delivery_status", "name", "kind", "code", "framework"}
