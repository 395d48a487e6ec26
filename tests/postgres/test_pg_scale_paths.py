"""The PostgreSQL backend's large-ledger paths give exactly what the generic paths give:
status grouped on the server, reconcile's writes sent as set-based batches, doctor's value
checks streamed through a server-side cursor."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
from pg_helpers import sql
from task_state_guard import Ledger, ReconcilePolicy, rules
from task_state_guard.ops import status as core_status
from task_state_guard_postgres.driver import Conn
from task_state_guard_postgres.queries import PostgresQueries

T0 = 1_700_000_000.0


class Clock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _mixed_ledger(url: str, clock: Clock) -> None:
    """Queued, fresh and stale running, past deadline, closed owed and internal tasks, a
    running child keeping its parent fresh, and several names."""
    with Ledger(url, clock=clock) as ledger:
        for index in range(3):
            ledger.create_task(name=f"app.queued{index % 2}")
        stale = [ledger.create_task(name="app.stale") for _ in range(3)]
        for task in stale:
            ledger.start_task(task.id, owner=False)
        parent = ledger.create_task(name="agent.plan")
        ledger.start_task(parent.id, owner=False)
        clock.now += 50
        child = ledger.create_task(name="agent.tool", parent_id=parent.id)
        ledger.start_task(child.id, owner=False)
        late = ledger.create_task(name="app.late", timeout_seconds=5)
        ledger.start_task(late.id, owner=False)
        done = ledger.create_task(name="app.done")
        ledger.start_task(done.id, owner=False)
        ledger.close_task(done.id, "succeeded")
        internal = ledger.create_task(name="app.inner", parent_id=done.id, delivery_required=False)
        ledger.start_task(internal.id, owner=False)
        ledger.close_task(internal.id, "failed")
        clock.now += 20
        fresh = ledger.create_task(name="app.fresh")
        ledger.start_task(fresh.id, owner=False)
        ledger.heartbeat(child.id)


class _PerRow(PostgresQueries):
    """The PostgreSQL queries with a pass's closes sent one statement per row, as SQLite
    sends them: each row's change, then its event, total and verdict by the rules
    (``rules.expected_events``, ``rules.TOTAL_RULES``), written one at a time."""

    @staticmethod
    def close_lost(conn: Conn, timeouts: list[tuple[str, float, int]],
                   deliveries: list[tuple[str, str, float, int]]) -> None:
        changes = [
            ("UPDATE tsg_tasks SET status = 'timed_out', terminal_code = %(code)s, "
             "ended_at = %(at)s, updated_at = %(at)s, version = version + 1 WHERE seq = %(seq)s",
             {"code": code, "at": at, "seq": seq}, "closed") for code, at, seq in timeouts
        ] + [
            ("UPDATE tsg_tasks SET delivery_status = %(state)s, delivery_code = %(code)s, "
             "delivery_updated_at = %(at)s, version = version + 1 WHERE seq = %(seq)s",
             {"state": state, "code": code, "at": at, "seq": seq}, "delivery")
            for state, code, at, seq in deliveries
        ]
        for change, params, kind in changes:
            conn.run(change, params)
            rule = rules.EVENTS_BY_KIND[kind]
            source = f"(SELECT * FROM tsg_tasks WHERE seq = {int(params['seq'])}) AS r"
            conn.run(rules.event_insert_select(rule, source))
            conn.run(rules.TOTAL_RULES[kind].insert(source))
            if kind == "closed":
                conn.run("INSERT INTO tsg_verdicts(task_seq, framework, state, recorded_at) "
                         f"SELECT seq, framework, 'pending', ended_at FROM {source} "
                         f"WHERE {rules.close_owes_verdict()}")


@pytest.mark.parametrize("grace", [0.0, 30.0, 10_000.0])
def test_status_grouped_on_the_server_equals_sqlites_streamed_count(
    pg_url: str, grace: float, tmp_path: Path
) -> None:
    """The same ledger history on both backends gives the same status: PostgreSQL groups on
    the server, SQLite streams the rows and counts them (each backend's own queries)."""
    directory = tmp_path / "ledger"
    directory.mkdir(mode=0o700)
    path = str(directory / "tasks.sqlite")
    reports = []
    for target in (pg_url, path):
        clock = Clock()
        _mixed_ledger(target, clock)
        clock.now += 40
        if target == pg_url:
            sql(pg_url, "UPDATE tsg_tasks SET name = 'bad name!' WHERE name = 'app.queued1'")
        else:
            with sqlite3.connect(path) as conn:
                conn.execute("UPDATE tsg_tasks SET name = 'bad name!' WHERE name = 'app.queued1'")
            conn.close()
        with Ledger(target, read_only=True, clock=clock) as ledger:
            reports.append(ledger.status(active_grace_seconds=grace))
    assert reports[0] == reports[1]
    assert reports[0]["by_name"][core_status.INVALID_LABEL]["queued"] == 1
    assert reports[0]["running_past_deadline"] == 1
    assert reports[0]["oldest_owed_delivery_age_seconds"] is not None


def test_status_on_the_server_orders_nan_as_sql_min_does(pg_url: str) -> None:
    clock = Clock()
    _mixed_ledger(pg_url, clock)
    clock.now += 40
    # a tampered time: SQL's min orders NaN above every number, so must the grouped path
    sql(pg_url, "UPDATE tsg_tasks SET started_at = 'NaN' WHERE name = 'app.late'")
    with Ledger(pg_url, read_only=True, clock=clock) as ledger:
        assert isinstance(ledger._db.queries, PostgresQueries)  # type: ignore[attr-defined]
        report = ledger.status(active_grace_seconds=30.0)
    assert report["oldest_running_age_seconds"] == 110.0  # the stale tasks' start, not NaN
    assert report["running_past_deadline"] == 1


def test_status_on_the_server_folds_names_beyond_the_group_bound(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Ledger(pg_url, clock=Clock()) as ledger:
        for index in range(6):
            ledger.create_task(name=f"app.n{index}")
    monkeypatch.setattr(core_status, "_MAX_GROUPS", 2)
    with Ledger(pg_url, read_only=True, clock=Clock()) as ledger:
        report = ledger.status()
    assert report["tasks"]["queued"] == 6
    assert sum(per["queued"] for per in report["by_name"].values()) == 6
    assert report["by_name"][core_status.INVALID_LABEL]["queued"] >= 4


def _rows_and_events(url: str) -> tuple[list[tuple[Any, ...]], ...]:
    rows = sql(url, "SELECT id, status, terminal_code, ended_at, updated_at, delivery_status, "
                    "delivery_code, delivery_updated_at, version FROM tsg_tasks ORDER BY seq")
    events = sql(url, "SELECT t.id, e.step, e.kind, e.state, e.code, e.at FROM tsg_events e "
                      "JOIN tsg_tasks t ON t.seq = e.task_seq ORDER BY t.seq, e.step")
    totals = sql(url, "SELECT event, kind, state, code, sum(total) FROM tsg_totals "
                      "GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3, 4")
    return rows, events, totals


def test_reconcile_batches_write_what_one_statement_per_row_writes(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pg_fixtures import drop_pg_url, new_pg_url

    twin = new_pg_url()
    try:
        reports = []
        for url in (pg_url, twin):
            clock = Clock()
            _mixed_ledger(url, clock)
            # the same ids on both ledgers, so that rows and events compare one to one
            sql(url, "UPDATE tsg_tasks SET id = md5(seq::text)::uuid::text, "
                     "parent_id = md5((SELECT p.seq FROM tsg_tasks p "
                     "WHERE p.id = tsg_tasks.parent_id)::text)::uuid::text")
            clock.now += 5000
            with Ledger(url, clock=clock) as ledger:
                db: Any = ledger._db
                if url == twin:  # the generic path: one statement per row
                    monkeypatch.setattr(db, "queries", _PerRow(db.read))
                reports.append(ledger.reconcile(ReconcilePolicy(
                    active_grace_seconds=60, delivery_grace_seconds=0)))
        assert reports[0] == reports[1]
        assert reports[0]["tasks_timed_out"] >= 3 and reports[0]["deliveries_failed"] >= 1
        assert _rows_and_events(pg_url) == _rows_and_events(twin)
        for url in (pg_url, twin):
            with Ledger(url, clock=Clock(T0 + 9000)) as ledger:
                # a later close writes its own event
                late = ledger.create_task()
                ledger.close_task(late.id, "cancelled")
                assert ledger.doctor()["healthy"] is True
                assert ledger.reconcile()["tasks_timed_out"] == 0  # idempotent
    finally:
        drop_pg_url(twin)


def test_pass_closes_group_rows_by_values(pg_url: str) -> None:
    clock = Clock()
    with Ledger(pg_url, clock=clock) as ledger:
        tasks = [ledger.create_task() for _ in range(4)]
        for task in tasks:
            ledger.start_task(task.id, owner=False)
        seqs = [row[0] for row in sql(pg_url, "SELECT seq FROM tsg_tasks ORDER BY seq")]
        db: Any = ledger._db
        with db.write() as conn:
            db.queries.close_lost(conn, [
                ("owner_lost", T0 + 1, seqs[0]),
                ("restart_stale", T0 + 2, seqs[1]),
                ("owner_lost", T0 + 1, seqs[2]),
            ], [])
    rows = sql(pg_url, "SELECT status, terminal_code, ended_at FROM tsg_tasks ORDER BY seq")
    assert rows == [("timed_out", "owner_lost", T0 + 1), ("timed_out", "restart_stale", T0 + 2),
                    ("timed_out", "owner_lost", T0 + 1), ("running", None, None)]
    closed = sql(pg_url, "SELECT count(*) FROM tsg_events WHERE kind = 'closed'")
    assert closed == [(3,)]


def test_a_pass_counts_its_closes_in_a_few_totals_rows(pg_url: str) -> None:
    """A batch of lost tasks adds one totals row per (kind, state, code), not one per task:
    the totals a pass leaves stay small however many tasks it closes."""
    clock = Clock()
    with Ledger(pg_url, clock=clock) as ledger:
        for _ in range(30):
            task = ledger.create_task()
            ledger.start_task(task.id, owner=False)
        before = sql(pg_url, "SELECT count(*) FROM tsg_totals")[0][0]
        clock.now += 5000
        report = ledger.reconcile(ReconcilePolicy(active_grace_seconds=60,
                                                  delivery_grace_seconds=0))
        added = sql(pg_url, "SELECT count(*) FROM tsg_totals")[0][0] - before
        status = ledger.status()
        assert ledger.doctor()["healthy"] is True
    assert report["tasks_timed_out"] == 30 and report["deliveries_failed"] == 30
    assert added <= 2  # one closed row, one delivery row (each batch's compaction may fold)
    assert status["outcomes_total"]["task"]["timed_out"]["restart_stale"] == 30
    assert status["delivery_outcomes_total"]["owed"]["failed"]["delivery_grace_expired"] == 30


def test_doctor_streams_value_checks_and_counts_bad_values(pg_url: str) -> None:
    with Ledger(pg_url, clock=Clock()) as ledger:
        for index in range(12):
            ledger.create_task(name=f"app.v{index}")
    sql(pg_url, "UPDATE tsg_tasks SET id = 'not-a-uuid' "
                "WHERE seq = (SELECT min(seq) FROM tsg_tasks)")
    sql(pg_url, "UPDATE tsg_tasks SET name = 'bad name' "
                "WHERE seq = (SELECT max(seq) FROM tsg_tasks)")
    sql(pg_url, "UPDATE tsg_tasks SET payload_hash = 'XYZ' "
                "WHERE seq = (SELECT max(seq) - 1 FROM tsg_tasks)")
    with Ledger(pg_url, read_only=True) as ledger:
        db: Any = ledger._db
        conn = db.conn()
        conn.execute("BEGIN")
        try:  # a stream smaller than the table still sees every row
            assert sum(1 for _ in conn.stream("SELECT id FROM tsg_tasks", size=5)) == 12
        finally:
            conn.execute("ROLLBACK")
        report = ledger.doctor()
    assert report["invalid_id_count"] == 1
    assert report["invalid_value_count"] == 2
    assert report["healthy"] is False


def test_a_pass_s_hold_gives_the_rows_as_they_are_now(pg_url: str) -> None:
    """``hold_open`` (what a pass holds before it changes rows): a row as read comes back as
    read, a row a worker wrote since comes back as written, a row settled since or held by a
    worker's transaction right now does not come back."""
    import threading

    with Ledger(pg_url) as ledger:
        tasks = [ledger.create_task() for _ in range(4)]
        for task in tasks:
            ledger.start_task(task.id, owner=False)
        db: Any = ledger._db
        with db.read() as conn:
            rows = db.queries.open_batch(conn, 1 << 62, 10)
        by_id = {row[7]: row for row in rows}
        same, beaten, closed, busy = (by_id[t.id] for t in tasks)
        ledger.heartbeat(tasks[1].id)
        ledger.close_task(tasks[2].id, "succeeded")
        ledger.set_delivery(tasks[2].id, "delivered")  # no longer open work
        holding, release = threading.Event(), threading.Event()

        def worker() -> None:
            with Ledger(pg_url) as other, other.atomic():
                other.heartbeat(tasks[3].id)  # holds the row until its transaction ends
                holding.set()
                release.wait(10)

        thread = threading.Thread(target=worker)
        thread.start()
        try:
            assert holding.wait(10)
            with db.write() as conn:
                held = db.queries.hold_open(conn, [busy, closed, beaten, same])
        finally:
            release.set()
            thread.join(10)
    assert [row[7] for row in held] == [tasks[1].id, tasks[0].id]  # newest first
    assert held[1] is same  # unchanged: the row as read
    assert held[0][4] is not None and beaten[4] is None  # the heartbeat shows
    assert held[0][:4] == beaten[:4] and held[0][14] == beaten[14]
