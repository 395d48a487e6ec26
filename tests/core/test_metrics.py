"""`tsg metrics` / `tsg status`: logical tasks and attempts apart, owed and internal deliveries
apart, outcome totals that survive prune and reopening, strict exposition format, no ids."""

from __future__ import annotations

import hashlib
import os
import sqlite3
import stat
from pathlib import Path

import pytest
from core_helpers import (
    Clock,
    as_v4,
    assert_cli_error,
    assert_json_line,
    raw_execute,
    run_cli,
)
from prom_text import parse
from task_state_guard import Ledger
from task_state_guard.model import TASK_CODES


def _job(led: Ledger, name: str, *, owed: bool, attempts: list[tuple[str, str]],
         close: tuple[str, str] | None) -> list[str]:
    """A logical task with attempts (children), as an adapter writes them; returns ids."""
    root = led.create_task(name=name, delivery_required=owed)
    led.start_task(root.id, owner=False)
    ids = [root.id]
    for status, code in attempts:
        attempt = led.create_task(parent_id=root.id, delivery_required=False, name=name)
        led.start_task(attempt.id, owner=False)
        led.close_task_settled(attempt.id, status, code=code)
        ids.append(attempt.id)
    if close is not None:
        led.close_task_settled(root.id, close[0], code=close[1])
    return ids


def _build(led: Ledger) -> list[str]:
    ids = []
    # a retried job: two attempts, one logical success, owes a delivery (not yet made)
    ids += _job(led, "app.add", owed=True,
                attempts=[("failed", "retry_scheduled"), ("succeeded", "worker_completed")],
                close=("succeeded", "worker_completed"))
    # a job nobody is owed: its logical delivery closes not_applicable at once
    ids += _job(led, "app.add", owed=False, attempts=[("succeeded", "worker_completed")],
                close=("succeeded", "worker_completed"))
    # a delivered one
    ids += _job(led, "app.mail", owed=True, attempts=[("failed", "worker_failed")],
                close=("failed", "worker_failed"))
    led.set_delivery(ids[-2], "failed", code="transport_failed")
    # still running
    ids += _job(led, "app.mail", owed=True, attempts=[], close=None)
    return ids


def _metrics(db: str) -> dict[str, object]:
    result = run_cli("--db", db, "metrics")
    assert result.code == 0 and result.stderr == ""
    return parse(result.stdout)  # type: ignore[return-value]


def test_logical_tasks_and_attempts_are_counted_apart(ledger: Ledger, db: str) -> None:
    ids = _build(ledger)
    report = ledger.status()
    assert report["tasks_by_kind"]["task"] == {
        "queued": 0, "running": 1, "succeeded": 2, "failed": 1, "timed_out": 0, "cancelled": 0}
    assert report["tasks_by_kind"]["attempt"] == {
        "queued": 0, "running": 0, "succeeded": 2, "failed": 2, "timed_out": 0, "cancelled": 0}
    assert report["tasks"]["succeeded"] == 4  # every row, as before
    assert report["by_name"]["app.add"]["succeeded"] == 2  # the two jobs, each once
    assert report["attempts_by_name"]["app.add"] == {
        "queued": 0, "running": 0, "succeeded": 2, "failed": 1, "timed_out": 0, "cancelled": 0}
    fam = _metrics(db)
    by_name = fam["tsg_tasks_by_name"]
    assert by_name.value(kind="task", name="app.add", status="succeeded") == 2
    assert by_name.value(kind="attempt", name="app.add", status="succeeded") == 2
    assert by_name.value(kind="attempt", name="app.add", status="failed") == 1
    assert fam["tsg_tasks"].value(kind="task", status="running") == 1
    assert fam["tsg_tasks"].value(kind="attempt", status="failed") == 2
    text = run_cli("--db", db, "status", "--format", "text").stdout
    assert "ATTEMPTS BY NAME" in text
    for tid in ids:
        assert tid not in str(report) and tid not in text


def test_owed_and_internal_deliveries_are_counted_apart(ledger: Ledger, db: str) -> None:
    _build(ledger)
    report = ledger.status()
    assert report["deliveries_by_kind"]["owed"] == {
        "pending": 2, "delivered": 0, "failed": 1, "not_applicable": 0}
    assert report["deliveries_by_kind"]["internal"] == {
        "pending": 0, "delivered": 0, "failed": 0, "not_applicable": 5}
    assert report["deliveries_awaiting"] == {"owed": 1, "internal": 0}  # app.add, closed
    assert report["oldest_owed_delivery_age_seconds"] == 0
    fam = _metrics(db)
    assert fam["tsg_deliveries"].value(kind="owed", delivery_status="pending") == 2
    assert fam["tsg_deliveries"].value(kind="internal", delivery_status="pending") == 0
    assert fam["tsg_deliveries_awaiting"].value(kind="owed") == 1
    # an internal record nobody could close (its process died first) is internal, not owed
    root = ledger.create_task(delivery_required=False)
    ledger.close_task(root.id, "timed_out", code="owner_lost")
    fam = _metrics(db)
    assert fam["tsg_deliveries_awaiting"].value(kind="internal") == 1
    assert fam["tsg_deliveries_awaiting"].value(kind="owed") == 1


def test_outcome_totals_survive_prune_and_reopening(db: str) -> None:
    clock = Clock()
    with Ledger(db, clock=clock) as led:
        _build(led)
        before = led.status()["outcomes_total"]
        assert before["task"]["succeeded"]["worker_completed"] == 2
        assert before["attempt"]["failed"] == {
            "retry_scheduled": 1, "worker_failed": 1, "worker_lost": 0}
        delivery = led.status()["delivery_outcomes_total"]
        assert delivery["owed"]["failed"]["transport_failed"] == 1
        assert delivery["internal"]["not_applicable"]["internal_task"] == 5
        clock.advance(100)
        pruned = led.prune(10)
        assert pruned["tasks_deleted"] == 4 and pruned["trees_deleted"] == 2
        after = led.status()
        assert after["outcomes_total"] == before  # pruning history lowers no total
        assert after["tasks"]["succeeded"] == 2  # the gauges do drop (4 before)
    fam = _metrics(db)  # a new process, a read-only open
    outcomes = fam["tsg_outcomes_total"]
    assert outcomes.value(kind="task", status="succeeded", code="worker_completed") == 2
    assert outcomes.value(kind="attempt", status="failed", code="retry_scheduled") == 1
    assert outcomes.value(kind="task", status="timed_out", code="owner_lost") == 0  # zeros too
    delivered = fam["tsg_delivery_outcomes_total"]
    assert delivered.value(kind="owed", delivery_status="failed", code="transport_failed") == 1
    assert delivered.value(kind="internal", delivery_status="not_applicable",
                           code="internal_task") == 5
    # every registry code is exposed for both kinds, so rate() sees the first increment
    for kind in ("task", "attempt"):
        for state, codes in TASK_CODES.items():
            for code in codes:
                assert outcomes.value(kind=kind, status=state, code=code) >= 0


def test_reconcile_closes_count_and_a_close_without_code_counts_under_empty(
    db: str, clock: Clock
) -> None:
    with Ledger(db, clock=clock) as led:
        task = led.create_task(name="app.slow")
        led.start_task(task.id, owner=False)
        plain = led.create_task()
        led.close_task(plain.id, "cancelled")  # no code
        clock.advance(1000)
        led.reconcile(active_grace_seconds=10, delivery_grace_seconds=10)
        totals = led.status()["outcomes_total"]["task"]
        assert totals["timed_out"]["restart_stale"] == 1
        assert totals["cancelled"][""] == 1
        assert led.status()["delivery_outcomes_total"]["owed"]["failed"][
            "delivery_grace_expired"] == 1  # the one closed before the pass
        assert led.doctor()["healthy"] is True
    fam = _metrics(db)
    assert fam["tsg_outcomes_total"].value(kind="task", status="cancelled", code="") == 1


def test_exposition_is_strict_and_documented(ledger: Ledger, db: str) -> None:
    ids = _build(ledger)
    result = run_cli("--db", db, "metrics")
    fam = parse(result.stdout)
    documented = (Path(__file__).resolve().parents[2] / "docs" / "metrics.md").read_text()
    for name, family in fam.items():
        assert f"`{name}`" in documented, name
        for labels, _value in family.samples:
            for label in labels:
                assert f"`{label}`" in documented, label
    for tid in ids:
        assert tid not in result.stdout and tid.replace("-", "") not in result.stdout
    assert str(Path(db).parent) not in result.stdout


@pytest.mark.sqlite_only(reason="tampers with the SQLite file (raw UPDATE)")
def test_a_tampered_name_is_an_escaped_invalid_label(ledger: Ledger, db: str) -> None:
    task = ledger.create_task(name="app.ok")
    raw_execute(db, ("UPDATE tsg_tasks SET name = ? WHERE id = ?", ('a"b\\c\nd', task.id)))
    fam = _metrics(db)
    assert fam["tsg_tasks_by_name"].value(kind="task", name="<invalid>", status="queued") == 1


# ---------------------------------------------------------------------------- schema v4


def _as_v3(db: str) -> None:
    """Turn a fresh ledger into the exact v3 layout (what an earlier build wrote)."""
    as_v4(db)
    raw_execute(db, "DROP TRIGGER tsg_total_closed", "DROP TRIGGER tsg_total_delivery",
                "DROP TABLE tsg_totals",
                "UPDATE tsg_meta SET value = '3' WHERE key = 'schema_version'")


def _digest(db: str) -> str:
    return hashlib.sha256(Path(db).read_bytes()).hexdigest()


@pytest.mark.sqlite_only(reason="a SQLite file taken back to layout 3")
def test_a_v3_ledger_reads_totals_read_only_and_migrates_with_them(db: str) -> None:
    with Ledger(db) as led:
        _build(led)
        expected = led.status()["outcomes_total"]
        expected_delivery = led.status()["delivery_outcomes_total"]
    _as_v3(db)
    digest = _digest(db)
    with Ledger(db, read_only=True) as ro:  # derived from the tasks it holds; file untouched
        assert ro.schema_version == 3
        assert ro.status()["outcomes_total"] == expected
        assert ro.status()["delivery_outcomes_total"] == expected_delivery
    assert _digest(db) == digest
    fam = _metrics(db)
    assert fam["tsg_outcomes_total"].value(
        kind="task", status="succeeded", code="worker_completed") == 2
    with Ledger(db) as led:  # a writable open migrates, seeding the totals
        assert led.schema_version == 9
        assert led.status()["outcomes_total"] == expected
        assert led.doctor()["healthy"] is True
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("SELECT value FROM tsg_meta WHERE key = 'schema_version'"
                            ).fetchone() == ("9",)
    finally:
        conn.close()


# ---------------------------------------------------------------------------- --textfile


@pytest.mark.sqlite_only(reason="the textfile and the SQLite ledger's files side by side")
def test_textfile_is_replaced_atomically_and_kept_on_error(ledger: Ledger, db: str,
                                                           tmp_path: Path) -> None:
    _build(ledger)
    out = tmp_path / "textfile"
    out.mkdir()
    target = out / "tsg.prom"
    result = run_cli("--db", db, "metrics", "--textfile", str(target))
    payload = assert_json_line(result)
    assert result.code == 0 and payload["ok"] is True
    text = target.read_text()
    assert payload["textfile"]["bytes"] == len(text.encode())
    fam = parse(text)
    assert payload["textfile"]["samples"] == sum(len(f.samples) for f in fam.values())
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    assert os.listdir(out) == ["tsg.prom"]  # no temporary file left
    assert str(tmp_path) not in result.stdout
    # the replacement always gets 0644, never the replaced file's mode
    target.chmod(0o640)
    assert run_cli("--db", db, "metrics", "--textfile", str(target)).code == 0
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    before = target.read_bytes()
    # errors: the JSON error on stdout only, the file neither written nor replaced
    for args in (
        ("--db", str(tmp_path / "missing.sqlite"), "metrics", "--textfile", str(target)),
        ("--db", db, "metrics", "--textfile", str(out)),  # a directory
        ("--db", db, "metrics", "--textfile", str(tmp_path / "nope" / "x.prom")),
        ("--db", db, "metrics", "--textfile", str(target), "--serve"),
        ("--db", db, "metrics", "--listen", "127.0.0.1:0"),
        ("--db", db, "metrics", "--serve", "--listen", "localhost:1"),
        ("--db", db, "metrics", "--serve", "--listen", "127.0.0.1:70000"),
    ):
        result = run_cli(*args)
        assert_cli_error(result, "InvalidInput")
        assert target.read_bytes() == before
        assert os.listdir(out) == ["tsg.prom"]
        assert str(tmp_path) not in result.stdout
    # a foreign schema: StateConflict, file untouched
    raw_execute(db, "CREATE TABLE foreign_thing (x)")
    assert_cli_error(run_cli("--db", db, "metrics", "--textfile", str(target)), "StateConflict")
    assert target.read_bytes() == before and os.listdir(out) == ["tsg.prom"]


@pytest.mark.sqlite_only(reason="digests the SQLite file's bytes")
def test_a_read_command_never_writes(ledger: Ledger, db: str, tmp_path: Path) -> None:
    _build(ledger)
    ledger.close()
    digest = _digest(db)
    for args in (("metrics",), ("status",), ("metrics", "--textfile", str(tmp_path / "m.prom"))):
        assert run_cli("--db", db, *args).code == 0
    assert _digest(db) == digest


@pytest.mark.parametrize("command", ["status", "metrics"])
def test_empty_ledger_status_has_every_key(db: str, command: str) -> None:
    with Ledger(db) as led:
        report = led.status()
    assert report["by_name"] == {} and report["attempts_by_name"] == {}
    assert report["deliveries_awaiting"] == {"owed": 0, "internal": 0}
    assert report["oldest_owed_delivery_age_seconds"] is None
    result = run_cli("--db", db, command)
    assert result.code == 0 and result.stderr == ""
