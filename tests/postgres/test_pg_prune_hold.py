"""Prune on PostgreSQL while other writers go on: it holds the rows of the trees it deletes and
looks for children it did not see. A child committed under a tree between the pass's first
reading and its hold keeps that tree; a child added after the hold waits for the pass and then
finds its parent gone (``TaskNotFound``, never an orphan)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from pg_helpers import sql
from task_state_guard import Ledger, TaskNotFound

T0 = 1_000_000.0


def _closed_root(ledger: Ledger) -> str:
    root = ledger.create_task(name="tree.root")
    ledger.close_task(root.id, "succeeded")
    ledger.set_delivery(root.id, "delivered")
    return root.id


def _around_hold(ledger: Ledger, monkeypatch: pytest.MonkeyPatch, before: Any = None,
                 after: Any = None) -> None:
    """Run ``before`` just before prune holds a batch's rows and ``after`` just after."""
    queries = ledger._db.queries  # the seam between a pass's reading and its hold
    hold = queries.hold_for_delete

    def wrapped(conn: Any, seqs: list[int]) -> set[int] | None:
        if before is not None:
            before()
        held = hold(conn, seqs)
        if after is not None:
            after()
        return held

    monkeypatch.setattr(queries, "hold_for_delete", wrapped)


def test_a_child_committed_before_the_hold_keeps_its_tree(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [T0]
    with (Ledger(pg_url, clock=lambda: now[0]) as ledger,
          Ledger(pg_url, clock=lambda: now[0]) as other):
        root = _closed_root(ledger)
        doomed = _closed_root(ledger)
        now[0] += 1000
        added: list[str] = []
        _around_hold(ledger, monkeypatch, before=lambda: added.append(
            other.create_task(parent_id=root, name="tree.child").id))
        report = ledger.prune(100)
        assert ledger.get_task(root).status == "succeeded"
        assert ledger.get_task(added[0]).parent_id == root
        with pytest.raises(TaskNotFound):
            ledger.get_task(doomed)
        assert ledger.doctor()["healthy"] is True
    assert (report["trees_deleted"], report["tasks_deleted"], report["trees_retained"]) == (1, 1, 1)


def test_a_child_added_after_the_hold_finds_its_parent_gone(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [T0]
    outcome: list[BaseException | str] = []
    with (Ledger(pg_url, clock=lambda: now[0]) as ledger,
          Ledger(pg_url, clock=lambda: now[0]) as other):
        root = _closed_root(ledger)
        now[0] += 1000

        def add_child() -> None:
            try:
                outcome.append(other.create_task(parent_id=root, name="tree.child").id)
            except BaseException as exc:
                outcome.append(exc)

        adder = threading.Thread(target=add_child)

        def start_adder_and_wait_until_it_waits() -> None:
            pass_pid = ledger._db.conn().raw.info.backend_pid  # this thread's pass transaction
            adder.start()
            deadline = time.monotonic() + 10
            while not sql(pg_url, "SELECT 1 FROM pg_stat_activity "
                                  "WHERE %s = ANY(pg_blocking_pids(pid))", (pass_pid,)):
                assert time.monotonic() < deadline, "the child's insert never waited"
                time.sleep(0.02)

        _around_hold(ledger, monkeypatch, after=start_adder_and_wait_until_it_waits)
        report = ledger.prune(100)
        adder.join(10)
        assert not adder.is_alive()
        with pytest.raises(TaskNotFound):
            ledger.get_task(root)
        assert ledger.doctor()["healthy"] is True
    assert (report["trees_deleted"], report["tasks_deleted"], report["trees_retained"]) == (1, 1, 0)
    assert len(outcome) == 1 and isinstance(outcome[0], TaskNotFound)
    assert sql(pg_url, "SELECT count(*) FROM tsg_tasks") == [(0,)]


def test_the_children_check_finds_children_of_any_id(pg_url: str) -> None:
    """The check after the hold binds the held rows' ids as an array: an id with quotes, a
    backslash, a comma and braces (written by hand) still finds its child."""
    odd = 'odd"id\\with,{braces} and "quotes"'
    with Ledger(pg_url) as ledger:
        root = _closed_root(ledger)
        child = ledger.create_task(parent_id=root, name="tree.child")
        ledger.close_task(child.id, "succeeded")
        ledger.set_delivery(child.id, "delivered")
        sql(pg_url, "UPDATE tsg_tasks SET id = %s WHERE id = %s", (odd, root))
        sql(pg_url, "UPDATE tsg_tasks SET parent_id = %s WHERE id = %s", (odd, child.id))
        seqs = [row[0] for row in sql(pg_url, "SELECT seq FROM tsg_tasks ORDER BY seq")]
        db: Any = ledger._db
        with db.write() as conn:
            held, children = db.queries.hold_for_delete(conn, [seqs[0]])
    assert held == {seqs[0]}
    assert children == [(seqs[0], seqs[1])]
