"""An operator finds a job by the id the framework gave it: ``tsg get``, ``tsg children`` and
``tsg tasks`` with ``--celery``, ``--dramatiq`` or ``--langgraph``, for the framework's own ids
and for custom ones, printing exactly what the same command prints for the ledger id (so never
an id the operator did not type, and never a custom id at all)."""

from __future__ import annotations

import json
import re
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from task_state_guard import InvalidInput, Ledger, TaskNotFound
from task_state_guard.cli.commands import JOB_OPTIONS
from task_state_guard.integration import FRAMEWORKS, find_job, job_task_id

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "core"))
from core_helpers import assert_cli_error, assert_json_line, run_cli

_AGO = re.compile(r"\([^)]* ago\)")  # text views show times relative to the moment they ran

# A custom id as users write them: a business key with a space, a slash and non-ASCII text.
CUSTOM = "order 42/Zoë"


def _tsg(db: str, *args: str) -> Any:
    return run_cli("--db", db, *args)


def test_the_cli_and_the_adapter_compute_the_same_ledger_id(driver: Any, db: str) -> None:
    driver.install(db)
    for fid in ("5b0d2c43-8f4e-4a57-9d0f-3a1e6c2b7d19", CUSTOM, "x"):
        assert job_task_id(driver.name, fid) == driver.guard.logical_task_id(fid)
    assert driver.name in FRAMEWORKS and list(JOB_OPTIONS) == list(FRAMEWORKS)


def test_the_namespaces_are_the_published_ones() -> None:
    """Existing ledgers hold ids computed with these; they can never change."""
    import uuid

    celery = uuid.UUID("5b0c0e52-7c8f-5d0e-9a51-0c3e1a7a4c11")
    dramatiq = uuid.uuid5(uuid.NAMESPACE_URL, "urn:task-state-guard:dramatiq:message")
    langgraph = uuid.UUID("6f0c3b8e-4a57-5d7e-9a51-2b7f1c0e8d42")
    assert job_task_id("celery", CUSTOM) == str(uuid.uuid5(celery, "celery-task:" + CUSTOM))
    assert job_task_id("dramatiq", CUSTOM) == str(uuid.uuid5(dramatiq, CUSTOM))
    assert job_task_id("langgraph", CUSTOM) == str(uuid.uuid5(langgraph, CUSTOM))


@pytest.mark.parametrize(
    "job_id",
    ["7", "a" * 1000, "é-ü-✓-\U0001d11e", " spaced\tid\n", str(uuid.UUID(int=0)), "\x00"],
)
def test_every_job_id_maps_to_the_uuid5_of_its_namespace(job_id: str) -> None:
    """The ids are computed without uuid.uuid5 (a prehashed namespace): still exactly it."""
    spaces = {"celery": (uuid.UUID("5b0c0e52-7c8f-5d0e-9a51-0c3e1a7a4c11"), "celery-task:"),
              "dramatiq": (uuid.uuid5(uuid.NAMESPACE_URL, "urn:task-state-guard:dramatiq:message"),
                           ""),
              "langgraph": (uuid.UUID("6f0c3b8e-4a57-5d7e-9a51-2b7f1c0e8d42"), "")}
    for framework, (namespace, prefix) in spaces.items():
        assert job_task_id(framework, job_id) == str(uuid.uuid5(namespace, prefix + job_id))


@pytest.mark.parametrize("custom", [False, True], ids=["framework-id", "custom-id"])
def test_get_children_and_tasks_by_the_framework_id(driver: Any, db: str, custom: bool) -> None:
    driver.install(db)
    other = driver.run("ok", deliver=True)  # another job, never shown
    fid = driver.run("ok", deliver=True, job_id=CUSTOM if custom else None)
    option = f"--{driver.name}"
    with Ledger(db) as ledger:
        job = find_job(ledger, driver.name, fid)
        attempts = ledger.children_of(job.id)
    assert attempts and job.parent_id is None
    pairs = [
        (["get", option, fid], ["get", job.id]),
        (["get", option, fid, "--extras", "--events"], ["get", job.id, "--extras", "--events"]),
        (["get", option, fid, "--format", "text"], ["get", job.id, "--format", "text"]),
        (["children", option, fid], ["children", job.id]),
    ]
    for by_framework, by_ledger in pairs:
        found, expected = _tsg(db, *by_framework), _tsg(db, *by_ledger)
        assert (found.code, found.stderr) == (0, ""), by_framework
        assert _AGO.sub("", found.stdout) == _AGO.sub("", expected.stdout), by_framework
    printed = _tsg(db, "get", option, fid, "--extras").stdout
    assert CUSTOM not in printed and driver.guard.logical_task_id(other) not in printed
    # framework ids are shown only where the ledger stores them (canonical UUIDs, never custom)
    assert (fid in printed) == (not custom and driver.stores_framework_id)

    rows = assert_json_line(_tsg(db, "tasks", option, fid, "--details"))["tasks"]
    assert [(r["id"], r["kind"], r["status"]) for r in rows] == [(job.id, "task", "succeeded")]
    rows = assert_json_line(_tsg(db, "tasks", option, fid, "--details", "--attempts"))["tasks"]
    assert [(r["id"], r["kind"]) for r in rows] == [(a.id, "attempt") for a in attempts]
    ids = assert_json_line(_tsg(db, "tasks", option, fid, "--status", "succeeded"))["task_ids"]
    assert ids == [job.id, *(a.id for a in attempts)]
    text = _tsg(db, "tasks", option, fid, "--format", "text").stdout
    assert job.id in text and CUSTOM not in text and len(text.splitlines()) == 2


def test_an_unknown_or_malformed_job_id_is_refused_without_repeating_it(
    driver: Any, db: str
) -> None:
    driver.install(db)
    driver.run("ok")
    option = f"--{driver.name}"
    missing = _tsg(db, "get", option, CUSTOM)
    assert_cli_error(missing, "TaskNotFound")
    assert CUSTOM not in missing.stdout
    assert_cli_error(_tsg(db, "children", option, CUSTOM), "TaskNotFound")
    assert assert_json_line(_tsg(db, "tasks", option, CUSTOM, "--details"))["tasks"] == []
    assert_cli_error(_tsg(db, "get", option, ""), "InvalidInput")
    with Ledger(db) as ledger, pytest.raises(TaskNotFound) as caught:
        find_job(ledger, driver.name, CUSTOM)
    assert CUSTOM not in str(caught.value)
    with pytest.raises(InvalidInput) as refused:
        job_task_id("rq", CUSTOM)
    assert CUSTOM not in str(refused.value)


def test_a_job_is_named_once(db: str) -> None:
    with Ledger(db) as ledger:
        task = ledger.create_task()
    id_too = _tsg(db, "--explain", "get", task.id, "--celery", "abc")
    assert_cli_error(id_too, "InvalidInput", reason="unexpected_argument")
    assert_cli_error(_tsg(db, "--explain", "get"), "InvalidInput", reason="missing_argument")
    two = _tsg(db, "get", "--celery", "abc", "--dramatiq", "abc")
    assert_cli_error(two, "InvalidInput")
    assert "abc" not in two.stdout
    assert json.loads(_tsg(db, "get", task.id).stdout)["task"]["id"] == task.id
