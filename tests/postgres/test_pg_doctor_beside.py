"""Doctor on PostgreSQL counts the event chains on a second connection that reads the same
snapshot as the other checks, beside them; the report is the same as one reader's."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest
from pg_helpers import sql
from task_state_guard import InvalidInput, Ledger, StorageError
from task_state_guard.ops import doctor as core


def _fill(ledger: Ledger, n: int) -> None:
    for i in range(n):
        task = ledger.create_task(name="job")
        if i % 2:
            ledger.start_task(task.id)
            ledger.close_task(task.id, "succeeded")


def test_a_second_reader_sees_exactly_the_exported_snapshot(pg_url: str) -> None:
    with Ledger(pg_url) as ledger, Ledger(pg_url) as other:
        ledger.create_task(name="before")
        db: Any = ledger._db
        with db.read() as conn:
            snapshot = db.export_snapshot(conn)
            other.create_task(name="after")  # committed after the snapshot
            with db.read_beside(snapshot) as beside:
                names = sorted(r[0] for r in beside.execute("SELECT name FROM tsg_tasks"))
        assert names == ["before"]
        assert ledger.status()["tasks"]["queued"] == 2


@pytest.mark.parametrize("snapshot", ["", "00000003-0000001B-1'; DROP TABLE x; --", "abc"])
def test_a_malformed_snapshot_is_refused_before_any_connection(
    pg_url: str, snapshot: str
) -> None:
    with Ledger(pg_url) as ledger:
        db: Any = ledger._db
        with pytest.raises(InvalidInput, match=r"^snapshot must be an id from export_snapshot$"),\
                db.read_beside(snapshot):
            pass


def test_doctor_finds_a_broken_chain_counted_beside(pg_url: str) -> None:
    with Ledger(pg_url) as ledger:
        _fill(ledger, 20)
        healthy = ledger.doctor()
        assert healthy["healthy"] is True and healthy["event_chain_mismatch_count"] == 0
        sql(pg_url, "UPDATE tsg_events SET at = at + 1 WHERE step = 3 AND task_seq IN "
                    "(SELECT task_seq FROM tsg_events WHERE step = 3 ORDER BY task_seq LIMIT 2)")
        report = ledger.doctor()
    assert report["event_chain_mismatch_count"] == 2
    assert report["healthy"] is False
    assert {k: v for k, v in report.items() if k != "event_chain_mismatch_count" and
            k != "healthy"} == {k: v for k, v in healthy.items()
                                if k != "event_chain_mismatch_count" and k != "healthy"}


def test_without_a_second_connection_the_chains_are_counted_on_the_first(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Ledger(pg_url) as ledger:
        _fill(ledger, 10)
        sql(pg_url, "DELETE FROM tsg_events WHERE step = 2 AND task_seq = "
                    "(SELECT min(task_seq) FROM tsg_events WHERE step = 2)")
        db: Any = ledger._db

        def refused(snapshot: str) -> Any:
            raise StorageError("too many connections", reason="server_unreachable")

        monkeypatch.setattr(db, "read_beside", refused)
        report = ledger.doctor()
    assert report["event_chain_mismatch_count"] == 1
    assert report["checks_not_run"] == {}


def test_a_check_that_fails_early_cancels_the_chains_beside(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from task_state_guard_postgres import doctor as pg_doctor

    probes = pg_doctor.PROBES
    dialect = core.Dialect(probes.dialect.fin, false="false", true="true",
                           is_same="IS NOT DISTINCT FROM", as_int="({})::int")
    # tagged, so that only this test's query is looked for (another suite may run beside)
    tag = f"tsgt-sleep-{uuid.uuid4().hex}"
    object.__setattr__(dialect, "event_chains", f"SELECT count(*) FROM pg_sleep(60) /* {tag} */")

    def broken(conn: Any) -> int:
        raise StorageError("the read failed", reason="database_unusable")

    monkeypatch.setattr(pg_doctor, "PROBES", core.Probes(dialect, broken, probes.rows,
                                                         probes.parent))
    with Ledger(pg_url) as ledger:
        _fill(ledger, 4)
        began = time.monotonic()
        report = ledger.doctor()
        waited = time.monotonic() - began
    assert waited < 30  # the 60 s query beside was cancelled, not waited for
    assert report["integrity_error_count"] == 1 and report["healthy"] is False
    assert not [t for t in threading.enumerate() if t.name == "tsg-doctor-beside"]
    sleeping = sql(pg_url, "SELECT count(*) FROM pg_stat_activity WHERE "
                           "position(%s IN query) > 0 AND pid <> pg_backend_pid()", (tag,))
    assert sleeping == [(0,)]
