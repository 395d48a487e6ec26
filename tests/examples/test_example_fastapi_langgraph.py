"""examples/fastapi_langgraph for real: uvicorn started through the shipped entrypoint, HTTP
requests with urllib, a LangGraph graph with an on-disk checkpointer recorded in the ledger;
then the server is SIGKILLed mid-run; the restarted one's reconcile closes the lost run and its
background recovery resumes the thread while the server answers; killed during that recovery,
the next start takes the thread over from the dead claim and finishes it."""

from __future__ import annotations

import json
import os
import signal
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from deploy_helpers import EXAMPLES, Ledgers, Service, base_env, free_port, json_lines, tsg
from deploy_helpers import wait_for as wait
from task_state_guard_langgraph import logical_task_id, recovery_invocation_id

PROJECT = EXAMPLES / "fastapi_langgraph"


class Api:
    """One uvicorn server of the example (through the entrypoint, TSG_RECONCILE=apply)."""

    def __init__(self, ledgers: Ledgers, log: Path, gather_seconds: float, *,
                 db: str | None = None, started: bool = True, **extra: str) -> None:
        env = base_env(
            TSG_DB=db or ledgers.db,
            CHECKPOINTS=str(ledgers.data / "lg" / "checkpoints.sqlite"),
            GATHER_SECONDS=str(gather_seconds),
            TSG_RECONCILE="apply",
            PYTHONPATH=str(PROJECT),
            **extra,
        )
        for _attempt in range(3):
            self.port = free_port()
            self.base = f"http://127.0.0.1:{self.port}"
            self.service = Service(
                ["uvicorn", "service:app", "--host", "127.0.0.1", "--port", str(self.port),
                 "--timeout-graceful-shutdown", "5"],
                env=env, cwd=PROJECT, log=log, entrypoint=db is None,
            )
            if not started or self._listening():
                return
        raise AssertionError(f"no free port in three tries:\n{self.service.log()}")

    def _listening(self) -> bool:
        """Wait until uvicorn listens: it logs "Application startup complete" before it
        binds, so only "Uvicorn running on" says the port is ours. Another process can take
        the port between free_port() and the bind; then False, and the caller tries again."""
        try:
            self.service.wait_log("Uvicorn running on", timeout=120)
            return True
        except AssertionError:
            if "address already in use" not in self.service.log().lower():
                raise
            self.service.proc.wait(30)
            return False

    def call(self, method: str, path: str, body: dict[str, Any] | None = None,
             timeout: float = 60) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.base + path, data=data, method=method,
            headers={"content-type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())


@pytest.fixture
def servers() -> Iterator[list[Api]]:
    made: list[Api] = []
    yield made
    for api in made:
        api.service.stop()


def test_question_answered_recorded_and_delivered(
    ledgers: Ledgers, tmp_path: Path, servers: list[Api]
) -> None:
    api = Api(ledgers, tmp_path / "api.log", gather_seconds=0)
    servers.append(api)
    status, body = api.call("POST", "/questions",
                            {"thread_id": "chat-1", "question": "What is SQLite?"})
    assert status == 200
    assert body["answer"].startswith("SQLite keeps a database in one file")
    invocation = tsg(ledgers.db, "get", logical_task_id(body["invocation_id"]), "--extras")
    task = invocation["task"]
    assert (task["status"], task["terminal_code"], task["name"]) == (
        "succeeded", "completed", "research")
    assert task["delivery_status"] == "pending"
    nodes = tsg(ledgers.db, "children", task["id"], "--extras")["children"]
    assert sorted((n["name"], n["status"]) for n in nodes) == [
        ("answer", "succeeded"), ("gather", "succeeded"), ("plan", "succeeded")]

    assert api.call("POST", f"/invocations/{body['invocation_id']}/delivered") == (
        200, {"delivery": "delivered"})
    assert api.call("POST", "/invocations/req-unknown/delivered") == (
        409, {"detail": "TaskNotFound"})
    assert tsg(ledgers.db, "get", task["id"])["task"]["delivery_status"] == "delivered"
    assert api.call("GET", "/healthz") == (200, {"ok": True, "ledger_errors": 0})


def _kill_mid_gather(ledgers: Ledgers, tmp_path: Path, servers: list[Api]) -> str:
    """A server whose tools hang, SIGKILLed while `gather` runs; returns the lost invocation."""
    slow = Api(ledgers, tmp_path / "slow.log", gather_seconds=300)  # the tools hang
    servers.append(slow)
    answers: list[Any] = []

    def ask() -> None:
        try:
            answers.append(slow.call("POST", "/questions",
                                     {"thread_id": "chat-7", "question": "And Celery?"}, 120))
        except OSError as exc:  # the server dies under the request
            answers.append(exc)

    asker = threading.Thread(target=ask)
    asker.start()
    running = wait(lambda: tsg(ledgers.db, "tasks", "--status", "running")["task_ids"],
                   what="the run and its node attempt to be running")
    invocation: str = next(i for i in running
                           if tsg(ledgers.db, "get", i)["task"]["parent_id"] is None)
    wait(lambda: [(c["name"], c["status"]) for c in tsg(
        ledgers.db, "children", invocation, "--extras")["children"]]
        == [("plan", "succeeded"), ("gather", "running")], what="gather to run")
    slow.service.kill()  # SIGKILL mid-run
    asker.join(60)
    assert answers and isinstance(answers[0], OSError)
    return invocation


def test_killed_server_run_is_closed_and_its_thread_recovered(
    ledgers: Ledgers, tmp_path: Path, servers: list[Api]
) -> None:
    invocation = _kill_mid_gather(ledgers, tmp_path, servers)

    # Restarted while the tools still hang: recovery resumes the thread in the background and
    # the server answers meanwhile.
    busy = Api(ledgers, tmp_path / "busy.log", gather_seconds=300)
    servers.append(busy)
    preview, applied = json_lines(busy.service.log())  # the entrypoint's reconcile
    assert preview["reconcile"]["tasks_timed_out"] == 2 and applied["reconcile"]["applied"]
    lost = tsg(ledgers.db, "get", invocation)["task"]
    assert (lost["status"], lost["terminal_code"]) == ("timed_out", "owner_lost")
    first_recovery = wait(
        lambda: [t for t in tsg(ledgers.db, "tasks", "--status", "running")["task_ids"]
                 if tsg(ledgers.db, "get", t)["task"]["parent_id"] == invocation],
        what="the recovery run to start")[0]
    assert busy.call("GET", "/recovery")[1]["running"] is True
    assert busy.call("GET", "/healthz", timeout=10) == (200, {"ok": True, "ledger_errors": 0})
    assert busy.call("GET", "/recovery")[1]["running"] is True  # still resuming meanwhile
    assert "run lost (owner_lost): resuming thread chat-7" in busy.service.log()
    busy.service.kill()  # killed during recovery

    api = Api(ledgers, tmp_path / "api.log", gather_seconds=0)  # restarted; tools answer again
    servers.append(api)
    recovery = wait(lambda: (lambda r: r if r["passes"] and r["resumed"] else None)(
        api.call("GET", "/recovery")[1]), what="the background recovery to resume the thread")
    assert recovery["lost"] == ["chat-7"] and recovery["resumed"] == ["chat-7"]
    (run,) = recovery["runs"]
    assert run["outcome"] == "succeeded"
    assert logical_task_id(run["recovers"]) == first_recovery  # the dead claim, taken over

    # The recovery run finished the thread; the lineage runs from the lost run through the
    # dead recovery claim.
    resumed = tsg(ledgers.db, "get", logical_task_id(run["invocation_id"]), "--extras")["task"]
    assert resumed["parent_id"] == first_recovery
    assert tsg(ledgers.db, "get", first_recovery)["task"]["parent_id"] == invocation
    assert (resumed["status"], resumed["terminal_code"]) == ("succeeded", "completed")
    assert run["invocation_id"] == recovery_invocation_id(run["recovers"])
    # Its answer waits with the thread until the client acknowledges it.
    status, thread = api.call("GET", "/threads/chat-7")
    assert status == 200 and thread == {
        "answer": "Celery runs tasks in worker processes that take messages from a broker.",
        "next": [], "owed": run["invocation_id"]}
    assert resumed["delivery_status"] == "pending"
    assert api.call("POST", f"/invocations/{run['invocation_id']}/delivered") == (
        200, {"delivery": "delivered"})
    assert api.call("GET", "/threads/chat-7")[1]["owed"] is None
    assert tsg(ledgers.db, "doctor")["ok"] is True


def test_sigterm_drains_a_question_in_flight_and_the_next_start_answers_it(
    ledgers: Ledgers, tmp_path: Path, servers: list[Api]
) -> None:
    """The drain recipe: SIGTERM stops the question at its next step boundary (within the
    graceful-shutdown timeout), it answers 503, and the next start resumes the thread."""
    # node history is committed every heartbeat: a short one lets the test see gather start
    api = Api(ledgers, tmp_path / "drain.log", gather_seconds=3, TSG_HEARTBEAT_SECONDS="0.5")
    servers.append(api)
    answers: list[Any] = []
    asker = threading.Thread(target=lambda: answers.append(api.call(
        "POST", "/questions", {"thread_id": "chat-d", "question": "SQLite?"}, 60)))
    asker.start()
    (invocation,) = wait(lambda: tsg(ledgers.db, "tasks", "--thread", "chat-d")["task_ids"],
                         what="the question to run")
    wait(lambda: [(c["name"], c["status"]) for c in tsg(
        ledgers.db, "children", invocation, "--extras")["children"]]
        == [("plan", "succeeded"), ("gather", "running")], what="gather to run")
    os.killpg(api.service.proc.pid, signal.SIGTERM)  # as a container runtime stops it
    asker.join(60)
    assert answers == [(503, {"detail": {"thread_id": "chat-d"}})]
    assert api.service.proc.wait(30) in (0, -signal.SIGTERM)
    log = api.service.log()
    assert "Cancel" not in log and "Traceback" not in log, log  # drained, nothing cancelled
    drained = tsg(ledgers.db, "get", invocation)["task"]
    assert (drained["status"], drained["terminal_code"]) == ("cancelled", "interrupted")

    again = Api(ledgers, tmp_path / "again.log", gather_seconds=0)
    servers.append(again)
    recovery = wait(lambda: (lambda r: r if r["passes"] and r["resumed"] else None)(
        again.call("GET", "/recovery")[1]), what="the drained thread to be resumed")
    assert recovery["lost"] == [] and recovery["resumed"] == ["chat-d"]
    (run,) = recovery["runs"]
    assert run["outcome"] == "succeeded" and logical_task_id(run["recovers"]) == invocation
    status, thread = again.call("GET", "/threads/chat-d")
    assert status == 200 and thread["answer"].startswith("SQLite keeps")
    assert thread["owed"] == run["invocation_id"]
    # Both runs of the thread, found by its id: the drained one and the one that resumed it.
    runs = tsg(ledgers.db, "tasks", "--thread", "chat-d")["task_ids"]
    assert runs == [invocation, logical_task_id(run["invocation_id"])]


UNUSABLE = ("task-state-guard: the ledger cannot be used at worker start (UnsafeLocation, "
            "reason directory_writable_by_others)")


def _group_writable(ledgers: Ledgers) -> str:
    directory = ledgers.data / "group-writable"
    directory.mkdir()
    os.chmod(directory, 0o770)  # tsg refuses it: others could swap the ledger
    return str(directory / "tasks.sqlite")


@pytest.mark.sqlite_only(reason="a SQLite directory others could write")
def test_an_unusable_ledger_is_logged_once_and_the_server_serves(
    ledgers: Ledgers, tmp_path: Path, servers: list[Api]
) -> None:
    db = _group_writable(ledgers)  # started without the entrypoint (its tsg would refuse)
    api = Api(ledgers, tmp_path / "api.log", gather_seconds=0, db=db)
    servers.append(api)
    status, body = api.call("POST", "/questions", {"thread_id": "c", "question": "SQLite?"})
    assert status == 200 and body["answer"].startswith("SQLite keeps")
    log = api.service.log()
    assert [line for line in log.splitlines() if "the ledger cannot be used" in line] == [
        UNUSABLE + "; nothing is recorded until it can. Set require_ledger "
        "(TSG_REQUIRE_LEDGER=1) to refuse to start instead."], log
    assert db not in log and "group-writable" not in log
    assert not os.path.exists(db)  # nothing was created
    assert api.call("GET", "/healthz")[1]["ledger_errors"] > 0  # counted, not hidden


@pytest.mark.sqlite_only(reason="a SQLite directory others could write")
def test_require_ledger_refuses_to_start_the_server(
    ledgers: Ledgers, tmp_path: Path, servers: list[Api]
) -> None:
    db = _group_writable(ledgers)
    api = Api(ledgers, tmp_path / "api.log", gather_seconds=0, db=db, started=False,
              TSG_REQUIRE_LEDGER="1")
    servers.append(api)
    code = api.service.proc.wait(120)
    log = api.service.log()
    assert code != 0 and "Application startup complete" not in log, log
    assert UNUSABLE in log and "require_ledger is set: the worker does not start" in log
    assert db not in log and not os.path.exists(db)
