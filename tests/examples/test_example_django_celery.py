"""examples/django_celery for real: a `celery -A proj worker` started through the shipped
entrypoint against Redis, reports queued from Django code (a view through Django's test client,
a management command), the ledger read with `tsg`; then the worker's container is SIGKILLed
mid-task and the restarted worker's boot reconcile closes the task and fails its result."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from deploy_helpers import EXAMPLES, Ledgers, Service, base_env, json_lines, tsg, wait_for

PROJECT = EXAMPLES / "django_celery"
REDIS_DB = 11  # used by no other suite; every test also has its own queue

CLIENT = """
import json, sys
import django
django.setup()
from django.test import Client
method, path, body = sys.argv[1], sys.argv[2], sys.argv[3]
client = Client()
if method == "POST":
    response = client.post(path, data=body, content_type="application/json")
else:
    response = client.get(path)
print(json.dumps({"status": response.status_code, "body": response.json()}))
"""


@pytest.fixture(scope="module", autouse=True)
def _redis_required() -> None:
    """Redis is required (CI starts it): a missing broker fails, never skips."""
    client = redis.Redis(host="127.0.0.1", port=6379, db=REDIS_DB, socket_connect_timeout=2)
    try:
        assert client.ping()
    except redis.exceptions.ConnectionError as exc:
        pytest.fail(f"Redis is required at 127.0.0.1:6379 for tests/examples: {exc}")
    finally:
        client.close()


class Project:
    """The example project's environment for one test: ledger, queue, workers, Django calls."""

    def __init__(self, ledgers: Ledgers, tmp: Path) -> None:
        self.db = ledgers.db
        self.tmp = tmp
        self.queue = f"tsg-example-{uuid.uuid4().hex[:12]}"
        self.env = base_env(
            TSG_DB=self.db,
            CELERY_BROKER_URL=f"redis://127.0.0.1:6379/{REDIS_DB}",
            CELERY_QUEUE=self.queue,
            DJANGO_SETTINGS_MODULE="proj.settings",
            PYTHONPATH=str(PROJECT),
        )
        self.workers: list[Service] = []

    def worker(self, mode: str = "preview") -> Service:
        n = len(self.workers)
        service = Service(
            ["celery", "-A", "proj", "worker", "-c", "1", "-Q", self.queue,
             "-n", f"{self.queue}-{n}@%h", "--without-mingle", "--without-gossip",
             "--loglevel", "INFO"],
            env={**self.env, "TSG_RECONCILE": mode}, cwd=PROJECT, log=self.tmp / f"worker{n}.log",
        )
        self.workers.append(service)
        service.wait_log(" ready.")
        return service

    def django(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        done = subprocess.run(
            [sys.executable, "-c", CLIENT, method, path, json.dumps(body or {})],
            env=self.env, cwd=PROJECT, capture_output=True, text=True, timeout=120,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return json.loads(done.stdout.strip().splitlines()[-1])

    def manage(self, *args: str) -> str:
        done = subprocess.run(
            [sys.executable, "manage.py", *args], env=self.env, cwd=PROJECT,
            capture_output=True, text=True, timeout=120,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout.strip()

    def close(self) -> None:
        for service in self.workers:
            service.stop()
        client = redis.Redis(host="127.0.0.1", port=6379, db=REDIS_DB)
        try:
            for key in client.scan_iter(f"*{self.queue}*"):
                client.delete(key)
        finally:
            client.close()


@pytest.fixture
def project(ledgers: Ledgers, tmp_path: Path) -> Iterator[Project]:
    p = Project(ledgers, tmp_path)
    try:
        yield p
    finally:
        p.close()


def _ledger_task(db: str, ledger_id: str) -> Callable[[], dict[str, Any]]:
    return lambda: tsg(db, "get", ledger_id, "--extras")["task"]


def test_report_built_recorded_and_delivered(project: Project) -> None:
    project.worker()
    created = project.django("POST", "/reports/", {"pages": 3})
    assert created["status"] == 200
    task_id, ledger_id = created["body"]["task_id"], created["body"]["ledger_id"]

    task = wait_for(
        lambda: (t := _ledger_task(project.db, ledger_id)())["status"] == "succeeded" and t,
        what="the report's logical task to succeed",
    )
    assert task["terminal_code"] == "worker_completed"
    assert task["name"] == "reports.tasks.build_report"
    assert task["framework_id"] == task_id
    assert (task["delivery_required"], task["delivery_status"]) == (True, "pending")
    (attempt,) = tsg(project.db, "children", ledger_id)["children"]
    assert (attempt["status"], attempt["delivery_status"]) == ("succeeded", "not_applicable")

    status = project.django("GET", f"/reports/{task_id}/")["body"]
    assert status == {"task_id": task_id, "state": "SUCCESS", "report": {"pages": 3}}
    delivered = project.django("POST", f"/reports/{task_id}/delivered/")
    assert delivered == {"status": 200, "body": {"delivery": "delivered"}}
    task = _ledger_task(project.db, ledger_id)()
    assert (task["delivery_status"], task["delivery_code"]) == (
        "delivered", "transport_acknowledged")
    assert tsg(project.db, "doctor")["ok"] is True


def _start_long_report(project: Project) -> tuple[str, str]:
    task_id = project.manage("enqueue_report", "1", "--seconds-per-page", "300")
    uuid.UUID(task_id)
    early = project.django("POST", f"/reports/{task_id}/delivered/")  # nothing to deliver yet
    assert early["status"] == 409
    assert early["body"]["error"] in ("TaskNotFound", "StateConflict")
    from task_state_guard_celery import logical_task_id

    parent = logical_task_id(task_id)
    wait_for(lambda: _ledger_task(project.db, parent)()["status"] == "running",
             what="the report to run")
    wait_for(lambda: [c["status"] for c in tsg(project.db, "children", parent)["children"]]
             == ["running"], what="its attempt to run")
    assert project.django("GET", f"/reports/{task_id}/")["body"]["state"] == "STARTED"
    return task_id, parent


def test_killed_worker_is_reconciled_by_the_next_worker(project: Project) -> None:
    first = project.worker()
    task_id, parent = _start_long_report(project)
    first.kill()  # the container dies: main process and pool child, no Celery signal

    preview = tsg(project.db, "reconcile", "--dry-run")["reconcile"]
    assert preview["tasks_timed_out"] == 2  # the logical task and its attempt: owners dead
    assert _ledger_task(project.db, parent)()["status"] == "running"  # preview changed nothing

    second = project.worker(mode="preview")
    (logged,) = json_lines(second.log())  # the entrypoint's preview, counts only
    assert logged["reconcile"]["tasks_timed_out"] == 2
    assert task_id not in second.log().split(" ready.")[0]
    assert "task-state-guard: reconcile (reconcile_on_boot)" in second.log()
    task = _ledger_task(project.db, parent)()
    assert (task["status"], task["terminal_code"]) == ("timed_out", "owner_lost")
    (attempt,) = tsg(project.db, "children", parent)["children"]
    assert (attempt["status"], attempt["terminal_code"]) == ("timed_out", "owner_lost")

    # The boot reconcile also told Celery's result backend: STARTED -> FAILURE.
    status = project.django("GET", f"/reports/{task_id}/")["body"]
    assert status == {"task_id": task_id, "state": "FAILURE", "error": "TaskLostError"}
    assert tsg(project.db, "doctor")["ok"] is True


def test_applying_in_the_entrypoint_fails_the_result_too(project: Project) -> None:
    """Any reconcile will do: the pass the entrypoint applies (no adapter in that process)
    records the lost task's verdict in the ledger, and the worker publishes it when it starts:
    FAILURE in the result backend, exactly as if its own boot pass had closed the task."""
    first = project.worker()
    task_id, parent = _start_long_report(project)
    first.kill()

    second = project.worker(mode="apply")
    applied = [line["reconcile"] for line in json_lines(second.log())]
    assert [(r["dry_run"], r["tasks_timed_out"]) for r in applied] == [(True, 2), (False, 2)]
    task = _ledger_task(project.db, parent)()
    assert (task["status"], task["terminal_code"]) == ("timed_out", "owner_lost")
    status = project.django("GET", f"/reports/{task_id}/")["body"]
    assert status == {"task_id": task_id, "state": "FAILURE", "error": "TaskLostError"}
    verdicts = tsg(project.db, "status")["status"]["verdicts"]
    assert verdicts["pending"]["celery"] == 0 and verdicts["published"]["celery"] == 1
    assert tsg(project.db, "doctor")["ok"] is True
