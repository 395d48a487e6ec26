"""Adapter privacy runs (registered through privacy_hooks.adapter_privacy_run).

Each run drives one adapter for real with a canary in every place user data can appear - graph
state / task arguments, results, exception messages, invocation ids - and returns the text the
run produced (CLI output and every log record). test_privacy.py then scans the ledger files and
that text for the canary and the host name.
"""

from __future__ import annotations

import contextlib
import io
import logging
from collections.abc import Iterator

from task_state_guard.cli import commands as cli

from .privacy_hooks import adapter_privacy_run


@contextlib.contextmanager
def captured_logs() -> Iterator[list[str]]:
    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            # Our packages' records only: the frameworks' own logs are theirs to keep.
            if record.name.startswith("task_state_guard"):
                records.append(self.format(record) + repr(record.args))

    handler = Keep(level=logging.DEBUG)
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield records
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)


def cli_outputs(db: str, task_ids: list[str]) -> list[str]:
    outputs = []
    commands = [["status"], ["metrics"], ["status", "--format", "text"], ["doctor"],
                ["tasks", "--status", "succeeded"], ["tasks", "--status", "failed"]]
    commands += [["get", tid] for tid in task_ids] + [["children", tid] for tid in task_ids]
    for args in commands:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            cli.main(["--db", db, *args])
        outputs.append(out.getvalue())
    return outputs


@adapter_privacy_run("langgraph")
def langgraph_run(db: str, canary: str) -> list[str]:
    from typing import TypedDict

    from langgraph.graph import END, START, StateGraph
    from langgraph.types import RetryPolicy
    from task_state_guard_langgraph import guard

    class State(TypedDict):
        text: str

    def answer(state: State) -> State:
        return {"text": f"reply to {state['text']} {canary}"}

    attempts = []

    def flaky(state: State) -> State:
        attempts.append(1)
        if len(attempts) < 2:
            raise ValueError(f"transient failure mentioning {canary}")
        return {"text": state["text"]}

    def boom(state: State) -> State:
        raise RuntimeError(f"fatal failure mentioning {canary} and {state['text']}")

    ok = StateGraph(State)
    ok.add_node("answer", answer)
    ok.add_node("flaky", flaky, retry_policy=RetryPolicy(
        max_attempts=3, initial_interval=0.01, jitter=False, retry_on=ValueError))
    ok.add_edge(START, "answer")
    ok.add_edge("answer", "flaky")
    ok.add_edge("flaky", END)
    bad = StateGraph(State)
    bad.add_node("boom", boom)
    bad.add_edge(START, "boom")
    bad.add_edge("boom", END)
    ids = []
    with captured_logs() as logs:
        app = guard(ok.compile(), db=db, strict=True)
        out = app.invoke({"text": f"prompt {canary}"}, invocation_id=f"request {canary}")
        assert canary in out["text"]
        app.mark_delivered(f"request {canary}")
        ids.append(str(app.logical_task_id(f"request {canary}")))
        failing = guard(bad.compile(), db=db, strict=True)
        try:
            failing.invoke({"text": f"prompt {canary}"}, invocation_id=f"failing {canary}")
        except RuntimeError:
            pass
        else:  # pragma: no cover
            raise AssertionError("the failing graph did not fail")
        failing.mark_delivery_failed(f"failing {canary}")
        ids.append(str(failing.logical_task_id(f"failing {canary}")))
        app.close()
        failing.close()
    outputs = cli_outputs(db, ids)
    assert any('"status":"succeeded"' in o for o in outputs)
    assert any('"status":"failed"' in o for o in outputs)
    return outputs + logs


@adapter_privacy_run("dramatiq")
def dramatiq_run(db: str, canary: str) -> list[str]:
    import dramatiq
    from dramatiq.brokers.stub import StubBroker
    from dramatiq.middleware import CurrentMessage
    from task_state_guard_dramatiq import install, uninstall

    broker = StubBroker()
    broker.add_middleware(CurrentMessage())
    guard = install(broker, db=db, strict=True)
    previous = dramatiq.get_broker() if hasattr(dramatiq, "get_broker") else None
    dramatiq.set_broker(broker)
    message_ids: list[str] = []

    @dramatiq.actor(broker=broker, tsg_delivery=True, max_retries=0, queue_name="privacy")
    def answer(question: str, secret: str) -> str:
        message = CurrentMessage.get_current_message()
        assert message is not None
        guard.mark_delivered(message.message_id)
        return f"answer to {question} with {secret}"

    @dramatiq.actor(broker=broker, max_retries=1, min_backoff=10, max_backoff=20,
                    queue_name="privacy")
    def explode(payload: str) -> None:
        raise RuntimeError(f"failure mentioning {payload}")

    worker = dramatiq.Worker(broker, worker_threads=2, worker_timeout=50)
    with captured_logs() as logs:
        worker.start()
        try:
            for i in range(3):
                message_ids.append(answer.send(f"q{i} {canary}", canary).message_id)
            message_ids.append(explode.send(f"payload {canary}").message_id)
            broker.join("privacy", fail_fast=False, timeout=30_000)
            worker.join()
        finally:
            worker.stop()
            uninstall(broker)
            if previous is not None:
                dramatiq.set_broker(previous)
    ids = [str(guard.logical_task_id(m)) for m in message_ids]
    outputs = cli_outputs(db, ids)
    assert any('"delivery_status":"delivered"' in o for o in outputs)
    assert any('"status":"failed"' in o for o in outputs)
    return outputs + logs


@adapter_privacy_run("celery")
def celery_run(db: str, canary: str) -> list[str]:
    """Eager mode: the adapter records in the calling process (no broker needed here; the
    adapter's own suite covers real prefork workers)."""
    from celery import Celery
    from task_state_guard_celery import install

    app = Celery("privacy", broker="memory://", backend="cache+memory://")
    app.conf.task_always_eager = True
    app.conf.task_eager_propagates = False
    guard = install(app, db=db, strict=True)

    @app.task(tsg_delivery=True)
    def answer(question: str, secret: str) -> str:
        return f"answer to {question} with {secret}"

    @app.task
    def explode(payload: str) -> None:
        raise RuntimeError(f"failure mentioning {payload}")

    ids = []
    with captured_logs() as logs:
        result = answer.delay(f"question {canary}", canary)
        assert canary in result.get()
        guard.mark_delivered(result.id)
        ids.append(str(guard.logical_task_id(result.id)))
        failed = explode.delay(f"payload {canary}")
        assert failed.failed()
        ids.append(str(guard.logical_task_id(failed.id)))
    outputs = cli_outputs(db, ids)
    assert any('"delivery_status":"delivered"' in o for o in outputs)
    assert any('"status":"failed"' in o for o in outputs)
    return outputs + logs
