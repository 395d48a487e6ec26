"""One driver per adapter: the same operations, translated to each framework.

Every driver runs real framework code in this process: Celery tasks through the guard's
signal receivers (eager execution: the task body runs in the calling process), Dramatiq
messages through a real ``dramatiq.Worker`` (worker threads on a StubBroker), LangGraph
invocations of a compiled graph. A job ``kind`` is one of:

``ok``            returns normally;
``fail``          raises ``ValueError``;
``mark``          calls ``mark_delivered(own id)`` inside the job and records what it returned;
``mark_failed``   the same with ``mark_delivery_failed``;
``stats``         records ``stats()`` taken inside the job;
``close_parent``  closes its own logical task through another ledger connection first (as a
                  reconcile elsewhere would), so the job's own close of it is refused;
``reconcile_inside``  waits past a tiny active grace, then runs the adapter's ``reconcile`` with
                  an ``on_decision`` collector and records the decisions (its own job is then
                  stale: the pass closes it ``restart_stale``, as if its worker had hung).

``run(kind, job_id=...)`` gives the job a custom framework id (Celery ``task_id``, a Dramatiq
``message_id``, a LangGraph ``invocation_id``); by default the framework picks one.
"""

from __future__ import annotations

import logging
import time
import types
import uuid
from typing import Any

from task_state_guard import Ledger

Seen = dict[str, Any]


def _inside(adapter: Any, kind: str, fid: str, seen: Seen, db: str | None) -> None:
    if kind == "fail":
        raise ValueError("private text")
    if kind == "mark":
        seen[fid] = adapter.mark_delivered(fid)
    elif kind == "mark_failed":
        seen[fid] = adapter.mark_delivery_failed(fid)
    elif kind == "stats":
        seen[fid] = adapter.stats()
    elif kind == "reconcile_inside":
        time.sleep(0.2)
        found: list[Any] = []
        adapter.reconcile(on_decision=found.append)
        seen[fid] = found
    elif kind == "close_parent":
        assert db is not None
        with Ledger(db) as other:
            other.close_task(adapter.logical_task_id(fid), "cancelled", code="caller_cancelled")


class CeleryDriver:
    name = "celery"
    logger = "task_state_guard_celery"
    has_framework_config = True
    logical_delivers_by_default = False
    stores_framework_id = True  # eager task ids are uuid4 strings
    publishes_in_reconcile = True  # a reconcile drains the verdicts it made
    attempts_are_history = False  # an attempt is written when it starts

    def __init__(self) -> None:
        self.seen: Seen = {}
        self.db: str | None = None

    def install(self, db: str | None, conf: dict[str, Any] | None = None, **settings: Any) -> Any:
        import task_state_guard_celery as tsgc
        from celery import Celery  # type: ignore[import-untyped]

        self.db = db
        app = Celery(f"contract{uuid.uuid4().hex[:8]}", broker="memory://",
                     backend="cache+memory://", set_as_current=False)
        app.conf.task_always_eager = True
        for key, value in (conf or {}).items():
            app.conf[f"tsg_{key}"] = value
        driver = self

        @app.task(name="contract.job", bind=True, shared=False)
        def job(self: Any, kind: str) -> str:
            _inside(driver.guard, kind, self.request.id, driver.seen, driver.db)
            return "done"

        @app.task(name="contract.deliver", bind=True, shared=False, tsg_delivery=True)
        def deliver(self: Any, kind: str) -> str:
            _inside(driver.guard, kind, self.request.id, driver.seen, driver.db)
            return "done"

        self.app = app
        self.guard = tsgc.install(app, db=db, **settings)
        return self.guard

    def boot(self) -> None:
        """What a worker does when it boots (the guard's boot step)."""
        from task_state_guard_celery import ReconcileOnBoot

        ReconcileOnBoot.start(types.SimpleNamespace(), types.SimpleNamespace(app=self.app))

    def run(self, kind: str, *, deliver: bool = False, job_id: str | None = None) -> str:
        task = self.app.tasks["contract.deliver" if deliver else "contract.job"]
        result = task.apply(args=(kind,), task_id=job_id)
        return str(result.id)

    def strict_raised(self, caplog: Any) -> bool:
        # Celery's signal dispatcher catches the receiver's exception and logs it.
        return any(
            r.exc_info and type(r.exc_info[1]).__name__ == "StorageError"
            and r.exc_info[1].reason == "directory_not_a_directory"
            for r in caplog.records
        )

    def close(self) -> None:
        self.guard.uninstall()


class DramatiqDriver:
    name = "dramatiq"
    logger = "task_state_guard_dramatiq"
    has_framework_config = False
    logical_delivers_by_default = False
    stores_framework_id = True  # message ids are uuid4 strings
    attempts_are_history = False  # an attempt is written when it starts
    publishes_in_reconcile = True

    def __init__(self) -> None:
        self.seen: Seen = {}
        self.db: str | None = None
        self.worker: Any = None

    def install(self, db: str | None, conf: dict[str, Any] | None = None, **settings: Any) -> Any:
        import dramatiq
        from dramatiq.brokers.stub import StubBroker
        from dramatiq.middleware import CurrentMessage
        from task_state_guard_dramatiq import install

        assert not conf
        self.db = db
        broker = StubBroker(fail_fast_default=False)
        broker.add_middleware(CurrentMessage())
        self.broker = broker
        self.guard = install(broker, db=db, **settings)
        driver = self

        def body(kind: str) -> None:
            message = CurrentMessage.get_current_message()
            assert message is not None
            _inside(driver.guard, kind, message.message_id, driver.seen, driver.db)

        queue = f"contract{uuid.uuid4().hex[:8]}"
        self.job = dramatiq.actor(body, broker=broker, actor_name=f"{queue}.job", queue_name=queue,
                                  max_retries=0)
        self.deliver = dramatiq.actor(body, broker=broker, actor_name=f"{queue}.deliver",
                                      queue_name=queue, max_retries=0, tsg_delivery=True)
        self.queue = queue
        return self.guard

    def boot(self) -> None:
        import dramatiq

        self.worker = dramatiq.Worker(self.broker, worker_threads=1, worker_timeout=50)
        self.worker.start()

    def run(self, kind: str, *, deliver: bool = False, job_id: str | None = None) -> str:
        if self.worker is None:
            self.boot()
        actor = self.deliver if deliver else self.job
        message = actor.message(kind)
        if job_id is not None:
            message = message.copy(message_id=job_id)
        self.broker.enqueue(message)
        self.broker.join(self.queue)
        self.worker.join()
        return str(message.message_id)

    def strict_raised(self, caplog: Any) -> bool:
        return any("Unexpected failure in before_process_message" in r.getMessage()
                   for r in caplog.records)

    def close(self) -> None:
        if self.worker is not None:
            self.worker.stop()
        self.guard.uninstall()
        self.broker.close()


class LangGraphDriver:
    name = "langgraph"
    logger = "task_state_guard_langgraph"
    has_framework_config = False
    logical_delivers_by_default = True  # an invocation always answers somebody
    stores_framework_id = False  # invocation ids are not stored (thread ids are)
    publishes_in_reconcile = False  # its recovery passes publish (they know the threads)
    # node attempts are buffered and committed with the invocation's end or a heartbeat
    attempts_are_history = True

    def __init__(self) -> None:
        self.seen: Seen = {}
        self.db: str | None = None
        self.raised: list[BaseException] = []

    def install(self, db: str | None, conf: dict[str, Any] | None = None, **settings: Any) -> Any:
        from typing import TypedDict

        from langgraph.graph import START, StateGraph
        from task_state_guard_langgraph import guard

        assert not conf
        self.db = db

        class State(TypedDict):
            kind: str
            fid: str

        driver = self

        def work(state: State) -> dict[str, Any]:
            _inside(driver.guard, state["kind"], state["fid"], driver.seen, driver.db)
            return {}

        builder = StateGraph(State)
        builder.add_node("work", work)
        builder.add_edge(START, "work")
        self.guard = guard(builder.compile(), db=db, **settings)
        return self.guard

    def boot(self) -> None:
        """guard() itself is the boot: it reconciled when it was created."""

    def run(self, kind: str, *, deliver: bool = False, job_id: str | None = None) -> str:
        fid = uuid.uuid4().hex if job_id is None else job_id
        try:
            self.guard.invoke({"kind": kind, "fid": fid}, invocation_id=fid)
        except Exception as exc:
            self.raised.append(exc)
        return fid

    def strict_raised(self, caplog: Any) -> bool:
        return any(type(exc).__name__ == "StorageError"
                   and getattr(exc, "reason", None) == "directory_not_a_directory"
                   for exc in self.raised)

    def close(self) -> None:
        self.guard.uninstall()


DRIVERS = {"celery": CeleryDriver, "dramatiq": DramatiqDriver, "langgraph": LangGraphDriver}

logging.getLogger("dramatiq").setLevel(logging.CRITICAL)
