"""Celery app run by the real `celery worker` subprocesses of tests/celery.

Configured from the environment so that each test gets its own queue and ledger:
TSGT_BROKER (Redis or RabbitMQ URL; results always go to Redis), TSGT_QUEUE,
TSGT_MARKERS (directory for marker files), TSGT_VISIBILITY (Redis visibility timeout,
seconds), TSGT_INSTALL (0 = no adapter), TSGT_EAGER (1 = task_always_eager), TSGT_BACKEND
(result backend URL instead of Redis, e.g. an SQLAlchemy URL), TSGT_TABLES (table-name prefix
of an SQL result backend), TSGT_TRACK_STARTED (1 = task_track_started), TSGT_ON_LOST (1 =
an ``on_lost`` hook that writes each lost task as JSON into the marker directory),
TSGT_SUCCESS_DELAY (seconds an application ``task_success`` receiver, connected before the
adapter's, spends on each ``tsgt.short`` task: instrumentation that delays the adapter's close
after Celery stored ``SUCCESS``), and the adapter's own TSG_* variables.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import task_state_guard_celery
from celery import Celery, chord, group, signals  # type: ignore[import-untyped]
from celery.exceptions import Ignore, Reject, SoftTimeLimitExceeded  # type: ignore[import-untyped]

RESULT_BACKEND = "redis://127.0.0.1:6379/5"


def make_app(
    broker: str,
    queue: str,
    *,
    visibility_timeout: float | None = None,
    eager: bool = False,
    register: bool = True,
    backend: str | None = None,
    tables: str | None = None,
    track_started: bool = False,
) -> Celery:
    """A Celery app bound to one queue, with the Redis result backend (or ``backend``).

    Clients send tasks by name and need no task definitions (``register=False``).
    """
    # Results go to Redis unless told otherwise (a RabbitMQ broker keeps its results there).
    if backend is None:
        backend = broker if broker.startswith("redis://") else RESULT_BACKEND
    app = Celery("tsgt", broker=broker, backend=backend, set_as_current=False)
    if tables:
        app.conf.database_table_names = {"task": f"{tables}_task", "group": f"{tables}_group"}
    app.conf.task_track_started = track_started
    transport: dict[str, Any] = {}
    if visibility_timeout is not None:
        transport = {
            "visibility_timeout": visibility_timeout,
            "unacked_restore_interval": 1,
            "unacked_restore_throttle": 1,
        }
    app.conf.update(
        task_default_queue=queue,
        task_default_routing_key=queue,
        worker_prefetch_multiplier=1,
        broker_transport_options=transport,
        result_backend_transport_options=transport,
        result_expires=600,
        task_always_eager=eager,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=True,
        worker_redirect_stdouts=False,
    )
    if register:
        _register(app)
    return app


def _marker(name: str, text: str) -> None:
    directory = os.environ.get("TSGT_MARKERS")
    if directory:
        path = os.path.join(directory, name)
        if name.startswith("lost-") and os.path.exists(path):
            path += ".again"  # a hook that fired twice for one job
        with open(path + ".tmp", "w") as fh:
            fh.write(text)
        os.replace(path + ".tmp", path)


def _register(app: Celery) -> None:
    @app.task(name="tsgt.ok")
    def ok() -> str:
        return "ok"

    @app.task(name="tsgt.deliver", tsg_delivery=True)
    def deliver() -> str:
        return "answer"

    @app.task(name="tsgt.deliver_inside", bind=True, tsg_delivery=True)
    def deliver_inside(self: Any) -> str:
        # Inside the running task the mark is kept until the task's own close.
        marked = task_state_guard_celery.mark_delivered(self.request.id, app=app)
        return "deferred" if marked is None else "written"

    @app.task(name="tsgt.fail")
    def fail() -> None:
        raise ValueError("user secret that must never reach the ledger")

    @app.task(name="tsgt.retry_twice", bind=True, max_retries=5)
    def retry_twice(self: Any, countdown: float = 0.2) -> str:
        if self.request.retries < 2:
            raise self.retry(countdown=countdown)
        return "done"

    @app.task(
        name="tsgt.autoretry",
        autoretry_for=(KeyError,),
        max_retries=2,
        retry_kwargs={"countdown": 0.2},
        retry_backoff=False,
        retry_jitter=False,
    )
    def autoretry() -> None:
        raise KeyError("always")

    @app.task(name="tsgt.sleep", bind=True)
    def sleep(self: Any, seconds: float, marker: str = "") -> str:
        if marker:
            _marker(marker, str(os.getpid()))
        time.sleep(seconds)
        return "slept"

    @app.task(
        name="tsgt.sleep_late",
        bind=True,
        acks_late=True,
        reject_on_worker_lost=True,
    )
    def sleep_late(self: Any, seconds: float, marker: str = "", again: float = 0.0) -> str:
        redelivered = bool((self.request.delivery_info or {}).get("redelivered"))
        if redelivered:
            directory = os.environ.get("TSGT_MARKERS", "")
            if marker and os.path.exists(os.path.join(directory, marker + ".again")):
                return "extra"  # a further copy (short visibility timeouts): finish at once
            if marker:
                _marker(marker + ".again", str(os.getpid()))
            time.sleep(again)
            return "second"
        if marker:
            _marker(marker, str(os.getpid()))
        time.sleep(seconds)
        return "first"

    @app.task(
        name="tsgt.sleep_retry_lost",
        bind=True,
        retry_on_worker_lost=True,
        default_retry_delay=0.3,
        max_retries=3,
    )
    def sleep_retry_lost(self: Any, seconds: float, marker: str = "") -> str:
        if self.request.retries == 0:
            if marker:
                _marker(marker, str(os.getpid()))
            time.sleep(seconds)
            return "first"
        return "retried"

    @app.task(name="tsgt.soft_limited", soft_time_limit=0.5)
    def soft_limited() -> None:
        try:
            time.sleep(10)
        except SoftTimeLimitExceeded:
            raise

    @app.task(name="tsgt.hard_limited", time_limit=1)
    def hard_limited() -> None:
        time.sleep(10)

    @app.task(name="tsgt.reject")
    def reject() -> None:
        raise Reject("no", requeue=False)

    # With early acks the message is gone: a requeue asked for requeues nothing.
    @app.task(name="tsgt.reject_requeue_acked")
    def reject_requeue_acked() -> None:
        raise Reject("again", requeue=True)

    # Reject(requeue=True) only requeues an unacknowledged message: acks_late.
    @app.task(name="tsgt.reject_once", bind=True, acks_late=True)
    def reject_once(self: Any) -> str:
        if not (self.request.delivery_info or {}).get("redelivered"):
            raise Reject("again", requeue=True)
        return "accepted"

    @app.task(name="tsgt.ignore")
    def ignore() -> None:
        raise Ignore()

    # Task.replace(): the replacement runs under the same task id (and may run before or
    # after the replaced task's own postrun).
    @app.task(name="tsgt.replaced", bind=True)
    def replaced(self: Any, pause: float = 0.0) -> Any:
        if pause:
            time.sleep(pause)
        raise self.replace(app.signature("tsgt.replacement", args=[pause]))

    @app.task(name="tsgt.replacement")
    def replacement(pause: float = 0.0) -> str:
        if pause:
            time.sleep(pause)
        return "replacement"

    # Task.replace() with canvases: the replaced id runs last (a chain's last task, a chord's
    # body, the accumulate task of a group), the tasks before it under new ids.
    @app.task(name="tsgt.add")
    def add(x: int, y: int = 0) -> int:
        return x + y

    @app.task(name="tsgt.boom")
    def boom(*_: Any) -> None:
        raise ValueError("boom")

    @app.task(name="tsgt.total")
    def total(values: list[int]) -> int:
        return sum(values)

    def canvas(kind: str, pause: float, marker: str) -> Any:
        a = app.signature
        if kind == "chain":
            return a("tsgt.add", args=[1, 1]) | a("tsgt.add", args=[10])
        if kind == "group":
            return group(a("tsgt.add", args=[1, 1]), a("tsgt.add", args=[2, 2]))
        if kind == "chord":
            return chord([a("tsgt.add", args=[1, 1]), a("tsgt.add", args=[2, 2])],
                         a("tsgt.total"))
        if kind == "chain_group":
            return a("tsgt.add", args=[1, 1]) | group(a("tsgt.add", args=[1]),
                                                      a("tsgt.add", args=[2]))
        if kind == "nested":  # second order: the chain's last task replaces itself again
            return a("tsgt.add", args=[1, 1]) | a("tsgt.replace_inner")
        if kind == "chain_fail":
            return a("tsgt.add", args=[1, 1]) | a("tsgt.boom") | a("tsgt.add", args=[1])
        if kind == "group_fail":
            return group(a("tsgt.add", args=[1, 1]), a("tsgt.boom"), a("tsgt.sleep", args=[1]))
        if kind == "chain_sleep":
            return a("tsgt.sleep", args=[pause, marker], immutable=True) | a("tsgt.ok",
                                                                             immutable=True)
        raise ValueError(kind)

    @app.task(name="tsgt.replace_with", bind=True)
    def replace_with(self: Any, kind: str, pause: float = 0.0, marker: str = "") -> Any:
        raise self.replace(canvas(kind, pause, marker))

    @app.task(name="tsgt.replace_inner", bind=True)
    def replace_inner(self: Any, value: int) -> Any:
        raise self.replace(app.signature("tsgt.add", args=[value, 10])
                           | app.signature("tsgt.add", args=[100]))

    @app.task(name="tsgt.deadline", tsg_timeout=0.5)
    def deadline(seconds: float, marker: str = "") -> str:
        if marker:
            _marker(marker, str(os.getpid()))
        time.sleep(seconds)
        return "late"

    @app.task(name="tsgt.short")
    def short(seconds: float = 0.02) -> str:
        time.sleep(seconds)
        return "short"

    # Its application task_success receiver (see _slow_success) holds the pool child after
    # Celery stored SUCCESS and before the adapter's close.
    @app.task(name="tsgt.success_window")
    def success_window() -> str:
        return "stored"

    @app.task(name="tsgt bad name!")
    def badly_named() -> str:
        return "ok"


def _from_env() -> Celery:
    vis = os.environ.get("TSGT_VISIBILITY")
    app = make_app(
        os.environ.get("TSGT_BROKER", "redis://127.0.0.1:6379/5"),
        os.environ.get("TSGT_QUEUE", "tsgt-default"),
        visibility_timeout=float(vis) if vis else None,
        eager=os.environ.get("TSGT_EAGER") == "1",
        backend=os.environ.get("TSGT_BACKEND") or None,
        tables=os.environ.get("TSGT_TABLES") or None,
        track_started=os.environ.get("TSGT_TRACK_STARTED") == "1",
    )
    # Connected before install(): Celery calls receivers in the order they connected.
    signals.task_success.connect(_slow_success, weak=False, dispatch_uid="tsgt-slow-success")
    if os.environ.get("TSGT_INSTALL", "1") == "1":
        hook = _record_lost if os.environ.get("TSGT_ON_LOST") == "1" else None
        task_state_guard_celery.install(app, on_lost=hook)
    return app


def _slow_success(sender: Any = None, **_: Any) -> None:
    """An application's ``task_success`` receiver that runs before the adapter's."""
    name = getattr(sender, "name", None)
    if name == "tsgt.success_window":
        _marker(f"stored-{sender.request.id}", str(os.getpid()))
        time.sleep(120)  # the test SIGKILLs this pool child here
    elif name == "tsgt.short":
        time.sleep(float(os.environ.get("TSGT_SUCCESS_DELAY") or 0))


def _record_lost(lost: Any) -> None:
    """The test's ``on_lost`` hook: one JSON marker per lost task. A second call for the same
    task is recorded too (``.again``), so a test can prove the hook fired exactly once."""
    fields = {
        "framework_id": lost.framework_id,
        "task_id": lost.task_id,
        "name": lost.name,
        "code": lost.code,
        "pid": os.getpid(),
    }
    # by Celery id; a custom id is never stored, so such a job is named by its ledger id
    _marker(f"lost-{lost.framework_id or lost.task_id}", json.dumps(fields))


app = _from_env() if os.environ.get("TSGT_QUEUE") and os.environ.get("TSG_DB") else None
