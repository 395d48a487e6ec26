"""The operator's CLI through the real command: the stuck-task listing (``tsg tasks`` rows and
filters), durations with units everywhere a command takes seconds, ``get --events``,
``--format text`` on every read command (aligned tables, no ids in aggregates) and
``--progress`` on reconcile and prune; every earlier invocation keeps its exact output."""

from __future__ import annotations

import json
import os
import re
import shutil
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from core_helpers import CliResult, Clock, assert_cli_error, assert_json_line, cli_env, run_cli
from ledger_backends import write_raw
from task_state_guard import (
    InvalidInput,
    Ledger,
    StorageError,
    TaskEvent,
    TaskNotFound,
)

HOUR = 3600.0
DAY = 86400.0
FRAMEWORK_ID = "5b0d2c43-8f4e-4a57-9d0f-3a1e6c2b7d19"


def ok(result: CliResult, code: int = 0) -> Any:
    payload = assert_json_line(result)
    assert result.code == code, result.stdout
    return payload


def compact(payload: Any) -> str:
    return json.dumps(payload, sort_keys=True, separators=(",", ":")) + "\n"


@dataclass
class Scene:
    """A ledger as an operator finds it (times relative to the real clock the CLI reads)."""

    db: str
    fetch: str  # logical, running, framework id stored, heartbeat 2 h old, two attempts
    first_attempt: str  # closed failed/retry_scheduled
    second_attempt: str  # running, heartbeat 2 h old
    render: str  # logical, queued 10 min ago
    done: str  # logical, succeeded a day ago, delivery still pending
    plan: str  # logical, running, started 30 s ago

    @property
    def ids(self) -> list[str]:
        return [self.fetch, self.first_attempt, self.second_attempt, self.render, self.done,
                self.plan, FRAMEWORK_ID]


@pytest.fixture
def scene(db: str) -> Scene:
    now = time.time()
    clock = Clock(now - DAY - 3 * HOUR)
    with Ledger(db, clock=clock) as led:
        done = led.create_task(name="app.fetch").id
        led.start_task(done, owner=False)
        clock.set(now - DAY)
        led.close_task(done, "succeeded", code="worker_completed")
        clock.set(now - 3 * HOUR)
        fetch = led.create_task(name="app.fetch", framework_id=FRAMEWORK_ID).id
        led.start_task(fetch, owner=False)
        first = led.create_task(parent_id=fetch, delivery_required=False, name="app.fetch").id
        led.start_task(first, owner=False)
        clock.set(now - 2.5 * HOUR)
        led.close_task_settled(first, "failed", code="retry_scheduled")
        second = led.create_task(parent_id=fetch, delivery_required=False, name="app.fetch").id
        clock.set(now - 2 * HOUR)
        led.start_task(second, owner=False)
        led.heartbeat_many([fetch, second])
        clock.set(now - 600)
        render = led.create_task(name="app.render").id
        clock.set(now - 30)
        plan = led.create_task(name="agent.plan", timeout_seconds=3600).id
        led.start_task(plan, owner=False)
    return Scene(db, fetch, first, second, render, done, plan)


def tsg(scene: Scene, *args: str, env: dict[str, str] | None = None) -> CliResult:
    return run_cli("--db", scene.db, *args, env=cli_env(env))


def rows(scene: Scene, *args: str) -> list[dict[str, Any]]:
    payload = ok(tsg(scene, "tasks", "--details", *args))
    assert set(payload) == {"ok", "more", "tasks"}
    return list(payload["tasks"])


# ----------------------------------------------------------------------------- text helpers

_CELL = re.compile(r"\S+(?: \S+)*")


def assert_table(lines: list[str], headers: list[str], right: set[str]) -> list[list[str]]:
    """Check a text table as a person reads it: the header row names every column, every cell
    sits under its header (left-aligned columns start with it, right-aligned ones end with it);
    return the cells of each row."""
    header = list(_CELL.finditer(lines[0]))
    assert [m.group() for m in header] == headers, lines[0]
    out = []
    for line in lines[1:]:
        cells = list(_CELL.finditer(line))
        assert len(cells) == len(headers), line
        for head, cell in zip(header, cells, strict=True):
            if head.group() in right:
                assert cell.end() == head.end(), (line, head.group())
            else:
                assert cell.start() == head.start(), (line, head.group())
        out.append([c.group() for c in cells])
    return out


def assert_counts_block(lines: list[str]) -> dict[str, str]:
    """Indented ``label  value`` lines whose values end in one column; label -> value."""
    ends = {len(line) for line in lines}
    assert len(ends) == 1, lines
    out = {}
    for line in lines:
        assert line.startswith("  ")
        label, value = re.fullmatch(r"  (\S+(?: \S+)*)\s{2,}(\S+(?: \S+)*)", line).groups()
        out[label] = value
    return out


def block(text: str, title: str) -> list[str]:
    """The indented lines under a section title."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(title)) + 1
    out = []
    for line in lines[start:]:
        if not line.startswith("  "):
            break
        out.append(line)
    return out


def assert_no_ids(text: str, scene: Scene) -> None:
    for value in scene.ids:
        assert value not in text
    assert scene.db not in text
    assert not re.search(r"[0-9a-f]{8}-[0-9a-f]{4}-", text)


# ----------------------------------------------------------------------------- tasks


def test_rows_list_open_logical_tasks_oldest_first_with_what_traces_them(scene: Scene) -> None:
    listed = rows(scene)
    assert [r["id"] for r in listed] == [scene.fetch, scene.render, scene.plan]
    fetch, render, plan = listed
    assert set(fetch) == {"id", "kind", "parent_id", "framework_id", "name", "status", "code",
                          "delivery_status", "age_seconds", "idle_seconds", "attempts"}
    assert fetch["framework_id"] == FRAMEWORK_ID and fetch["parent_id"] is None
    assert (fetch["name"], fetch["status"], fetch["code"]) == ("app.fetch", "running", None)
    assert fetch["attempts"] == 2 and render["attempts"] == 0
    assert 3 * HOUR <= fetch["age_seconds"] < 3 * HOUR + 60
    assert 2 * HOUR <= fetch["idle_seconds"] < 2 * HOUR + 60
    assert (render["status"], render["framework_id"]) == ("queued", None)
    assert 600 <= render["age_seconds"] < 660
    assert render["idle_seconds"] == pytest.approx(render["age_seconds"], abs=0.002)
    assert plan["name"] == "agent.plan" and plan["idle_seconds"] < 90


def test_filters_state_name_idle_age_attempts_and_limit(scene: Scene) -> None:
    def ids(*args: str) -> list[str]:
        return [r["id"] for r in rows(scene, *args)]

    assert ids("--status", "running") == [scene.fetch, scene.plan]
    assert ids("--status", "queued") == [scene.render]
    assert ids("--name", "app.fetch") == [scene.fetch]
    assert ids("--name", "app.fetch", "--status", "succeeded") == [scene.done]
    assert rows(scene, "--status", "succeeded")[0]["code"] == "worker_completed"
    assert ids("--stale-seconds", "1h") == [scene.fetch]
    assert ids("--stale-seconds", "5m") == [scene.fetch, scene.render]
    assert ids("--stale-seconds", "3h") == []
    assert ids("--older-than", "1h") == [scene.fetch]
    assert ids("--older-than", "5m") == [scene.fetch, scene.render]
    assert ids("--older-than", "2d") == []
    assert ids("--attempts") == [scene.second_attempt]
    attempt = rows(scene, "--attempts", "--status", "failed")
    assert [(a["id"], a["parent_id"], a["code"]) for a in attempt] == [
        (scene.first_attempt, scene.fetch, "retry_scheduled")]
    limited = ok(tsg(scene, "tasks", "--details", "--limit", "1"))
    assert [r["id"] for r in limited["tasks"]] == [scene.fetch] and limited["more"] is True
    assert ok(tsg(scene, "tasks", "--details", "--limit", "3"))["more"] is False
    # the filters narrow the id list too; its scope stays every task in the state
    assert ok(tsg(scene, "tasks", "--status", "running", "--name", "app.fetch"))[
        "task_ids"] == [scene.fetch, scene.second_attempt]
    assert ok(tsg(scene, "tasks", "--status", "running", "--older-than", "1h"))[
        "task_ids"] == [scene.fetch, scene.second_attempt]


def test_tasks_text_table_reads_as_a_table(scene: Scene) -> None:
    result = tsg(scene, "tasks", "--format", "text")
    assert result.code == 0 and result.stderr == ""
    lines = result.stdout.splitlines()
    cells = assert_table(
        lines,
        ["ID", "KIND", "FRAMEWORK_ID", "NAME", "STATE", "CODE", "DELIVERY", "AGE", "IDLE",
         "ATTEMPTS"],
        {"AGE", "IDLE", "ATTEMPTS"},
    )
    assert [c[0] for c in cells] == [scene.fetch, scene.render, scene.plan]
    assert cells[0][1:] == ["task", "5b0d2c43-8f4e-4a57-9d0f-3a1e6c2b7d19", "app.fetch",
                            "running", "-", "pending", "3h", "2h", "2"]
    assert cells[1][1:7] == ["task", "-", "app.render", "queued", "-", "pending"]
    assert cells[1][7] == cells[1][8] and re.fullmatch(r"10m(?: \d+s)?", cells[1][7])
    assert re.fullmatch(r"\d+s", cells[2][7]) and cells[2][9] == "0"
    attempts = tsg(scene, "tasks", "--format", "text", "--attempts", "--status", "failed")
    cells = assert_table(attempts.stdout.splitlines(),
                         ["ID", "KIND", "PARENT", "NAME", "STATE", "CODE", "DELIVERY", "AGE",
                          "IDLE"],
                         {"AGE", "IDLE"})
    assert cells == [[scene.first_attempt, "attempt", scene.fetch, "app.fetch", "failed",
                      "retry_scheduled", "not_applicable", "3h", "2h 30m"]]
    limited = tsg(scene, "tasks", "--format", "text", "--limit", "2").stdout.splitlines()
    assert len(assert_table(limited[:3], [h for h in lines[0].split()], {"AGE", "IDLE",
                                                                           "ATTEMPTS"})) == 2
    assert "raise --limit" in limited[3]
    empty = tsg(scene, "tasks", "--format", "text", "--stale-seconds", "1d").stdout
    assert empty.splitlines()[1] == "(no tasks match)"


def test_earlier_task_invocations_keep_their_exact_output(scene: Scene) -> None:
    with Ledger(scene.db, read_only=True) as led:
        fetch = led.get_task(scene.fetch)
        kids = led.children_of(scene.fetch)
    expected_ids = compact({"ok": True, "task_ids": [scene.fetch, scene.second_attempt,
                                                      scene.plan]})
    for args in (["--status", "running"], ["--status", "running", "--format", "json"]):
        assert tsg(scene, "tasks", *args).stdout == expected_ids
    assert tsg(scene, "tasks", "--status", "queued", "--stale-seconds", "300").stdout == (
        compact({"ok": True, "task_ids": [scene.render]}))
    assert tsg(scene, "get", scene.fetch).stdout == compact({"ok": True, "task": fetch.to_dict()})
    assert tsg(scene, "get", scene.fetch, "--format", "json").stdout == compact(
        {"ok": True, "task": fetch.to_dict()})
    assert tsg(scene, "get", scene.fetch, "--extras").stdout == compact(
        {"ok": True, "task": fetch.to_dict(extras=True)})
    assert tsg(scene, "children", scene.fetch).stdout == compact(
        {"ok": True, "children": [k.to_dict() for k in kids]})
    # the id list still needs a state; --attempts is for rows only
    assert_cli_error(tsg(scene, "tasks"), "InvalidInput")
    assert_cli_error(tsg(scene, "tasks", "--name", "app.fetch"), "InvalidInput")
    assert_cli_error(tsg(scene, "tasks", "--status", "running", "--attempts"), "InvalidInput")
    assert_cli_error(tsg(scene, "tasks", "--details", "--status", "stuck"), "InvalidInput")
    assert_cli_error(tsg(scene, "tasks", "--details", "--name", "has space"), "InvalidInput")
    assert_cli_error(tsg(scene, "tasks", "--details", "--limit", "0"), "InvalidInput")


def test_aggregate_json_outputs_are_unchanged(scene: Scene) -> None:
    expected = {
        "active_examined": 4, "applied": False, "deliveries_failed": 1,
        # the stale attempt it times out owes nobody a delivery: settled in the same pass
        "deliveries_not_applicable": 1, "dry_run": True, "fresh_active_retained": 2,
        "pending_delivery_examined": 3, "pending_delivery_retained": 1, "tasks_timed_out": 2,
    }
    assert tsg(scene, "reconcile", "--dry-run").stdout == compact(
        {"ok": True, "reconcile": expected})
    with Ledger(scene.db, read_only=True) as led:
        doctor = led.doctor()
    assert tsg(scene, "doctor").stdout == compact({"ok": True, **doctor})
    assert tsg(scene, "prune", "--older-than", "0", "--dry-run").stdout == compact(
        {"ok": True, "prune": {"applied": False, "dry_run": True, "events_deleted": 0,
                               "tasks_deleted": 0, "trees_deleted": 0, "trees_retained": 0}})


# ----------------------------------------------------------------------------- get --events


def test_get_events_json_and_text(scene: Scene) -> None:
    with Ledger(scene.db, read_only=True) as led:
        task = led.get_task(scene.first_attempt)
        events = led.events_of(scene.first_attempt)
    assert [(e.kind, e.state, e.code) for e in events] == [
        ("created", "queued", "created"), ("started", "running", "started"),
        ("closed", "failed", "retry_scheduled"), ("delivery", "not_applicable", "internal_task"),
    ]
    assert all(isinstance(e, TaskEvent) for e in events)
    assert events[0].at == task.created_at and events[2].at == task.ended_at
    payload = ok(tsg(scene, "get", scene.first_attempt, "--events"))
    assert payload == {"ok": True, "task": task.to_dict(),
                       "events": [e.to_dict() for e in events]}
    assert all(set(e) == {"kind", "state", "code", "at"} for e in payload["events"])
    with_extras = ok(tsg(scene, "get", scene.first_attempt, "--events", "--extras"))
    assert with_extras["task"] == task.to_dict(extras=True)
    text = tsg(scene, "get", scene.first_attempt, "--events", "--format", "text")
    assert text.code == 0 and text.stderr == ""
    head, events_part = text.stdout.split("\nEVENTS\n")
    matches = [re.fullmatch(r"(\S+(?: \S+)*)\s{2,}(.*)", line) for line in head.splitlines()]
    assert len({m.start(2) for m in matches}) == 1  # one value column
    fields = dict(m.groups() for m in matches)
    assert fields["id"] == scene.first_attempt and fields["parent"] == scene.fetch
    assert fields["state"] == "failed" and fields["code"] == "retry_scheduled"
    assert fields["delivery"].startswith("not_applicable") and fields["timeout"] == "-"
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ \(3h ago\)", fields["created"])
    lines = [line[2:] for line in events_part.splitlines()]
    cells = assert_table(lines, ["KIND", "STATE", "CODE", "AT", "SINCE CREATED"],
                         {"SINCE CREATED"})
    assert [(c[0], c[1], c[2], c[4]) for c in cells] == [
        ("created", "queued", "created", "+0s"), ("started", "running", "started", "+0s"),
        ("closed", "failed", "retry_scheduled", "+30m"),
        ("delivery", "not_applicable", "internal_task", "+30m"),
    ]
    plain = tsg(scene, "get", scene.fetch, "--format", "text").stdout
    assert "EVENTS" not in plain and "framework id" in plain and FRAMEWORK_ID in plain


def test_events_of_errors_and_tampered_events(scene: Scene) -> None:
    with Ledger(scene.db, read_only=True) as led:
        with pytest.raises(TaskNotFound):
            led.events_of(str(uuid.uuid4()))
        with pytest.raises(InvalidInput):
            led.events_of("not-an-id")
        assert [e.kind for e in led.events_of(scene.render)] == ["created"]
    assert_cli_error(tsg(scene, "get", str(uuid.uuid4()), "--events"), "TaskNotFound")
    write_raw(scene.db,
              "UPDATE tsg_events SET code = 'CANARYq7x9zz' WHERE kind = 'closed' AND task_seq = "
              "(SELECT seq FROM tsg_tasks WHERE id = ?)", (scene.first_attempt,))
    with Ledger(scene.db, read_only=True) as led, pytest.raises(StorageError):
        led.events_of(scene.first_attempt)
    for fmt in ("json", "text"):
        result = tsg(scene, "get", scene.first_attempt, "--events", "--format", fmt)
        assert_cli_error(result, "StateConflict")
        assert "CANARY" not in result.stdout


# ----------------------------------------------------------------------------- aggregates as text


def test_aggregates_as_text_are_counts_without_ids(scene: Scene) -> None:
    preview = tsg(scene, "reconcile", "--dry-run", "--format", "text")
    assert preview.code == 0 and preview.stderr == ""
    assert preview.stdout.splitlines()[0] == "RECONCILE (dry run: nothing changed)"
    counts = assert_counts_block(preview.stdout.splitlines()[1:])
    assert counts == {
        "active tasks examined": "4", "would be timed out": "2", "kept (fresh)": "2",
        "pending deliveries examined": "3", "deliveries would be failed": "1",
        "deliveries would be not applicable": "1", "deliveries kept (within grace)": "1",
    }
    assert_no_ids(preview.stdout, scene)

    doctor = tsg(scene, "doctor", "--format", "text")
    assert doctor.code == 0 and doctor.stdout.startswith("DOCTOR: healthy\n")
    tasks = assert_counts_block(block(doctor.stdout, "TASKS"))
    assert tasks == {"queued": "1", "running": "3", "succeeded": "1", "failed": "1",
                     "timed_out": "0", "cancelled": "0"}
    findings = assert_counts_block(block(doctor.stdout, "FINDINGS"))
    # one line per finding class, the schema's unexpected objects and the outbox included
    assert len(findings) == 13 and set(findings.values()) == {"0"}
    assert_counts_block(block(doctor.stdout, "DELIVERIES"))
    assert_no_ids(doctor.stdout, scene)

    applied = tsg(scene, "reconcile", "--format", "text")
    assert applied.stdout.splitlines()[0] == "RECONCILE (applied)"
    assert assert_counts_block(applied.stdout.splitlines()[1:])["timed out"] == "2"
    assert_no_ids(applied.stdout, scene)

    for args, head in ((["--dry-run"], "PRUNE (dry run: nothing deleted)"),
                       ([], "PRUNE (applied)")):
        pruned = tsg(scene, "prune", "--older-than", "12h", "--format", "text", *args)
        assert pruned.code == 0 and pruned.stdout.splitlines()[0] == head
        counts = assert_counts_block(pruned.stdout.splitlines()[1:])
        assert len(counts) == 4 and set(counts.values()) == {"0"}
        assert_no_ids(pruned.stdout, scene)
    status = tsg(scene, "status", "--format", "text", "--active-grace-seconds", "1h")
    assert status.code == 0
    assert_no_ids(status.stdout, scene)


def test_doctor_text_keeps_exit_1_when_unhealthy(scene: Scene) -> None:
    write_raw(scene.db, "UPDATE tsg_events SET at = at + 1 WHERE kind = 'created'")
    result = tsg(scene, "doctor", "--format", "text")
    assert result.code == 1 and result.stdout.startswith("DOCTOR: UNHEALTHY\n")
    findings = assert_counts_block(block(result.stdout, "FINDINGS"))
    assert int(findings["event chain mismatches"]) > 0
    assert_no_ids(result.stdout, scene)


def test_children_text_table(scene: Scene) -> None:
    result = tsg(scene, "children", scene.fetch, "--format", "text")
    cells = assert_table(result.stdout.splitlines(),
                         ["ID", "NAME", "STATE", "CODE", "DELIVERY", "AGE", "ENDED"],
                         {"AGE", "ENDED"})
    assert cells == [
        [scene.first_attempt, "app.fetch", "failed", "retry_scheduled", "not_applicable", "3h",
         "2h 30m ago"],
        [scene.second_attempt, "app.fetch", "running", "-", "pending",
         "2h 30m", "-"],
    ]
    lone = tsg(scene, "children", scene.render, "--format", "text").stdout.splitlines()
    assert lone[1] == "(no children)"


# ----------------------------------------------------------------------------- durations

ACCEPTED = [("90", 90.0), ("90s", 90.0), ("15m", 900.0), ("2h", 7200.0), ("1d", 86400.0),
            ("1.5h", 5400.0), ("0", 0.0), ("90.5", 90.5), ("007", 7.0)]
# exactly the documented grammar: no sign, spaces, exponent, separators or non-ASCII digits
REJECTED = ["1h30", "-5m", "1w", "nan", "", "15 m", "1H", "inf", "m", "+5m", "-5", "-0", "+5",
            " 7 ", "7 ", "1_000", "1e3", "\u0667", "\uff17", "1.", ".5", "5m "]


@pytest.mark.parametrize(("text", "seconds"), ACCEPTED)
def test_create_timeout_takes_a_duration(db: str, text: str, seconds: float) -> None:
    task = ok(run_cli("--db", db, "create", "--timeout-seconds", text))["task"]
    assert task["timeout_seconds"] == seconds


def test_graces_and_cut_offs_take_durations_from_flags_and_environment(scene: Scene) -> None:
    def timed_out(*flags: str, **env: str) -> int:
        result = tsg(scene, "reconcile", "--dry-run", *flags, env=env)
        return int(ok(result)["reconcile"]["tasks_timed_out"])

    assert timed_out("--active-grace-seconds", "3h") == 0
    assert timed_out("--active-grace-seconds", "1h") == 2
    assert timed_out("--active-grace-seconds", "150m") == 0
    assert timed_out(TSG_ACTIVE_GRACE_SECONDS="3h") == 0
    assert timed_out(TSG_ACTIVE_GRACE_SECONDS="90m") == 2
    failed = ok(tsg(scene, "reconcile", "--dry-run", "--delivery-grace-seconds", "2d"))
    assert failed["reconcile"]["deliveries_failed"] == 0
    failed = ok(tsg(scene, "reconcile", "--dry-run",
                    env={"TSG_DELIVERY_GRACE_SECONDS": "12h"}))
    assert failed["reconcile"]["deliveries_failed"] == 1
    stale = ok(tsg(scene, "status", "--active-grace-seconds", "1h"))["status"]
    assert stale["running_heartbeat_stale"] == 2 and stale["active_grace_seconds"] == 3600
    assert ok(tsg(scene, "status", "--active-grace-seconds", "3h"))["status"][
        "running_heartbeat_stale"] == 0
    metrics = tsg(scene, "metrics", "--active-grace-seconds", "1h")
    assert metrics.code == 0 and "tsg_running_heartbeat_stale 2\n" in metrics.stdout
    pruned = ok(tsg(scene, "prune", "--older-than", "1d", "--dry-run"))["prune"]
    assert pruned["trees_deleted"] == 0


def _duration_invocations(scene: Scene, bad: str) -> list[tuple[list[str], dict[str, str]]]:
    return [
        (["create", "--timeout-seconds", bad], {}),
        (["reconcile", "--active-grace-seconds", bad], {}),
        (["reconcile", "--dry-run", "--delivery-grace-seconds", bad], {}),
        (["reconcile", "--dry-run"], {"TSG_ACTIVE_GRACE_SECONDS": bad}),
        (["reconcile"], {"TSG_DELIVERY_GRACE_SECONDS": bad}),
        (["prune", "--older-than", bad], {}),
        (["prune", "--older-than", bad, "--dry-run"], {}),
        (["tasks", "--status", "running", "--stale-seconds", bad], {}),
        (["tasks", "--details", "--older-than", bad], {}),
        (["tasks", "--format", "text", "--stale-seconds", bad], {}),
        (["status", "--active-grace-seconds", bad], {}),
        (["status", "--format", "text"], {"TSG_ACTIVE_GRACE_SECONDS": bad}),
        (["metrics", "--active-grace-seconds", bad], {}),
    ]


def test_rejected_durations_are_invalid_input_never_echoed_and_change_nothing(
    scene: Scene,
) -> None:
    with Ledger(scene.db, read_only=True) as led:
        before = led.doctor()
    # every rejected form against two options (a flag, an environment value), and every
    # option against two rejected forms
    cases = [(bad, *_duration_invocations(scene, bad)[i]) for bad in REJECTED for i in (0, 3)]
    for i in range(len(_duration_invocations(scene, ""))):
        for bad in ("1h30", REJECTED[1 + i % (len(REJECTED) - 1)]):
            cases.append((bad, *_duration_invocations(scene, bad)[i]))
    with ThreadPoolExecutor(max_workers=6) as pool:
        results = list(pool.map(lambda case: tsg(scene, *case[1], env=case[2]), cases))
    for (bad, args, _env), result in zip(cases, results, strict=True):
        assert_cli_error(result, "InvalidInput")
        if bad:
            assert bad not in result.stdout, args
    with Ledger(scene.db, read_only=True) as led:
        assert led.doctor() == before


# ----------------------------------------------------------------------------- progress

PROGRESS = re.compile(r"tsg (reconcile|prune): (\d+)/(\d+) (open tasks|closed trees) examined "
                      r"\((\d+)%\)")


def _progress_lines(result: CliResult, command: str) -> list[tuple[int, int]]:
    out = []
    for line in result.stderr.splitlines():
        match = PROGRESS.fullmatch(line)
        assert match is not None and match.group(1) == command, line
        done, total = int(match.group(2)), int(match.group(3))
        assert int(match.group(5)) == (100 if total == 0 else done * 100 // total)
        out.append((done, total))
    return out


def test_reconcile_progress_on_stderr_and_the_same_json_line(scene: Scene) -> None:
    quiet = tsg(scene, "reconcile", "--dry-run")
    loud = tsg(scene, "reconcile", "--dry-run", "--progress")
    assert quiet.stderr == "" and loud.code == 0
    assert loud.stdout == quiet.stdout
    assert _progress_lines(loud, "reconcile") == [(0, 5), (5, 5)]
    text = tsg(scene, "reconcile", "--progress", "--format", "text")
    assert text.stdout.startswith("RECONCILE (applied)\n")
    assert _progress_lines(text, "reconcile")[-1] == (5, 5)
    assert_no_ids(text.stderr, scene)


def _closed_roots(db: str, count: int, age: float) -> None:
    clock = Clock(time.time() - age)
    with Ledger(db, clock=clock) as led, led.atomic():
        for _ in range(count):
            task = led.create_task(delivery_required=False)
            led.close_task_settled(task.id, "succeeded")


def test_prune_progress_over_several_batches(db: str) -> None:
    _closed_roots(db, 4500, 2 * DAY)
    preview = run_cli("--db", db, "prune", "--older-than", "1d", "--dry-run", "--progress")
    lines = _progress_lines(preview, "prune")
    assert lines[0] == (0, 4500) and lines[-1] == (4500, 4500)
    assert [d for d, _ in lines] == sorted(d for d, _ in lines)
    assert json.loads(preview.stdout)["prune"]["trees_deleted"] == 4500
    applied = run_cli("--db", db, "prune", "--older-than", "1d", "--progress")
    assert _progress_lines(applied, "prune")[-1] == (4500, 4500)
    payload = assert_json_line(CliResult(applied.code, applied.stdout, ""))
    assert payload["prune"]["tasks_deleted"] == 4500
    assert run_cli("--db", db, "prune", "--older-than", "1d").stderr == ""


def test_core_progress_callbacks_count_every_batch(db: str) -> None:
    _closed_roots(db, 4500, 2 * DAY)
    calls: list[tuple[int, int]] = []
    with Ledger(db) as led:
        report = led.reconcile(active_grace_seconds=60, delivery_grace_seconds=60,
                               dry_run=True, progress=lambda d, t: calls.append((d, t)))
        assert report["pending_delivery_examined"] == 0 and calls == [(0, 0)]
        for _ in range(4500):
            led.create_task()
        calls.clear()
        led.reconcile(dry_run=True, progress=lambda d, t: calls.append((d, t)))
        assert calls == [(0, 4500), (2000, 4500), (4000, 4500), (4500, 4500)]
        calls.clear()
        led.prune(DAY, dry_run=True, progress=lambda d, t: calls.append((d, t)))
        assert calls == [(0, 4500), (2000, 4500), (4000, 4500), (4500, 4500)]
        with pytest.raises(InvalidInput):
            led.reconcile(progress=42)  # type: ignore[arg-type]
        with pytest.raises(InvalidInput):
            led.prune(DAY, progress="no")  # type: ignore[arg-type]


def test_a_failing_progress_callback_aborts_the_reconcile_unapplied(db: str) -> None:
    clock = Clock(time.time() - DAY)
    with Ledger(db, clock=clock) as led:
        stale = led.create_task()
        led.start_task(stale.id, owner=False)
        clock.set(time.time())

        def boom(done: int, total: int) -> None:
            if done:
                raise RuntimeError("stop")

        with pytest.raises(RuntimeError):
            led.reconcile(progress=boom)
        assert led.get_task(stale.id).status == "running"
        assert led.reconcile()["tasks_timed_out"] == 1


@pytest.mark.sqlite_only(reason="a missing SQLite path stays missing")
def test_new_read_forms_never_create_a_database(tmp_path) -> None:
    existing = tmp_path / "present"
    existing.mkdir(mode=0o700)
    db = str(existing / "tasks.sqlite")
    some_id = str(uuid.uuid4())
    for args in (["tasks", "--format", "text"], ["tasks", "--details"],
                 ["get", some_id, "--events"], ["children", some_id, "--format", "text"],
                 ["doctor", "--format", "text"], ["reconcile", "--dry-run", "--progress"],
                 ["prune", "--older-than", "1d", "--dry-run", "--format", "text"]):
        result = run_cli("--db", db, *args)
        assert_cli_error(result, "InvalidInput")
        assert os.listdir(existing) == []


@pytest.mark.sqlite_only(reason="0.1.0's SQLite file (tests/fixtures)")
def test_events_and_rows_of_a_0_1_0_file_read_as_it_is_and_after_the_upgrade(tmp_path) -> None:
    directory = tmp_path / "old"
    directory.mkdir(mode=0o700)
    db = str(directory / "tasks.sqlite")
    shutil.copyfile(Path(__file__).parents[1] / "fixtures" / "ledger-0.1.0.sqlite", db)
    os.chmod(db, 0o600)

    def read() -> tuple[list[Any], dict[str, list[TaskEvent]]]:
        with Ledger(db, read_only=True) as led:
            listed = [(i.task.id, i.attempts) for i in led.list_tasks(status="succeeded").tasks]
            events = {tid: led.events_of(tid) for tid, _ in listed}
        return listed, events

    before = read()
    assert before[0] and all(
        [e.kind for e in chain] == ["created", "started", "closed", "delivery"]
        for chain in before[1].values())
    text = run_cli("--db", db, "get", before[0][0][0], "--events", "--format", "text")
    assert text.code == 0 and "\nEVENTS\n" in text.stdout
    Ledger(db).close()  # the writable open upgrades the file
    assert read() == before
