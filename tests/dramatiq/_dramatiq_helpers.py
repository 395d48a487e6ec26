"""Helpers of the Dramatiq adapter tests: real CLI workers, producers, ledger polling."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import dramatiq
import pika  # type: ignore[import-untyped]
import redis
from dramatiq.brokers.rabbitmq import RabbitmqBroker
from dramatiq.brokers.redis import RedisBroker
from task_state_guard import Ledger, ReconcilePolicy, Task, TaskNotFound
from task_state_guard_dramatiq import logical_task_id

REDIS_URL = "redis://127.0.0.1:6379/13"  # DB 13: never shared with the Celery suite
RABBIT_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"
TESTS_DIR = Path(__file__).resolve().parent
APP = "tsg_dramatiq_test_app"
TERMINAL = frozenset({"succeeded", "failed", "timed_out", "cancelled"})

T = TypeVar("T")


def wait_for(fn: Callable[[], T | None], timeout: float, what: str, interval: float = 0.05) -> T:
    """Poll ``fn`` until it returns something truthy; fail with ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


@dataclass
class BrokerEnv:
    """One test's isolated broker namespace/queue and ledger (``db``: a SQLite path or a
    PostgreSQL URL with a schema of its own, see ``ledger_backends.ledger_target``)."""

    kind: str
    url: str
    queue: str
    namespace: str
    scratch: Path
    db: str

    @classmethod
    def new(cls, kind: str, tmp: Path, db: str | None = None) -> BrokerEnv:
        """A fresh namespace and queue; ``db`` defaults to a SQLite file under ``tmp``."""
        suffix = uuid.uuid4().hex[:12]
        scratch = tmp / "scratch"
        scratch.mkdir(parents=True, exist_ok=True)
        return cls(
            kind=kind,
            url=REDIS_URL if kind == "redis" else RABBIT_URL,
            queue=f"tsg_dramatiq_{suffix}",
            namespace=f"tsg-dramatiq-test-{suffix}",
            scratch=scratch,
            db=db or str(tmp / "ledger" / "tasks.sqlite"),
        )

    def app_environ(self, **extra: str) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            {
                "TSG_TEST_BROKER": self.kind,
                "TSG_TEST_URL": self.url,
                "TSG_TEST_NAMESPACE": self.namespace,
                "TSG_TEST_QUEUE": self.queue,
                "TSG_TEST_DIR": str(self.scratch),
                "TSG_DB": self.db,
                "PYTHONUNBUFFERED": "1",
            }
        )
        env.update(extra)
        return env

    def cleanup(self) -> None:
        if self.kind == "redis":
            client = redis.Redis.from_url(self.url)
            keys = list(client.scan_iter(match=f"{self.namespace}*", count=1000))
            if keys:
                client.delete(*keys)
            client.close()
        else:
            conn = pika.BlockingConnection(pika.URLParameters(self.url))
            try:
                channel = conn.channel()
                for name in (self.queue, f"{self.queue}.DQ", f"{self.queue}.XQ"):
                    channel.queue_delete(name)
            finally:
                conn.close()


class Producer:
    """Sends raw messages to the test app's actors (no middleware in the producer)."""

    def __init__(self, env: BrokerEnv) -> None:
        self.env = env
        self.broker: dramatiq.Broker
        if env.kind == "redis":
            self.broker = RedisBroker(  # type: ignore[no-untyped-call]
                url=env.url, namespace=env.namespace, middleware=[]
            )
        else:
            self.broker = RabbitmqBroker(url=env.url, middleware=[])
        self.broker.declare_queue(env.queue)

    def message(
        self, actor: str, *args: Any, timestamp_ms: int | None = None, **options: Any
    ) -> dramatiq.Message[Any]:
        msg: dramatiq.Message[Any] = dramatiq.Message(
            queue_name=self.env.queue, actor_name=actor, args=args, kwargs={}, options=options
        )
        if timestamp_ms is not None:
            msg = msg.copy(message_timestamp=timestamp_ms)
        return msg

    def send(self, actor: str, *args: Any, **options: Any) -> str:
        msg = self.message(actor, *args, **options)
        self.broker.enqueue(msg)
        return msg.message_id

    def close(self) -> None:
        self.broker.close()


@dataclass
class CliWorker:
    """A real ``dramatiq`` CLI (2 processes x 2 threads by default) running the test app."""

    env: BrokerEnv
    extra_env: dict[str, str] = field(default_factory=dict)
    processes: int = 2
    threads: int = 2
    shutdown_timeout_ms: int = 10000
    log_path: Path | None = None
    proc: subprocess.Popen[bytes] | None = None
    #: None: a session of its own; N: join process group N (a "host" of several workers in
    #: this session, killed together)
    group: int | None = None

    def start(self, wait: bool = True) -> CliWorker:
        index = 0
        while True:
            path = self.env.scratch.parent / f"worker-{index}.log"
            if not path.exists():
                break
            index += 1
        self.log_path = path
        self._log = open(path, "wb")  # noqa: SIM115 - closed in stop()
        self.started_at = time.time()
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "dramatiq",
                APP,
                "-p",
                str(self.processes),
                "-t",
                str(self.threads),
                "--path",
                str(TESTS_DIR),
                "--worker-shutdown-timeout",
                str(self.shutdown_timeout_ms),
            ],
            env=self.env.app_environ(**self.extra_env),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=str(self.env.scratch),
            start_new_session=self.group is None,
            process_group=self.group,
        )
        if wait:
            self.wait_ready()
        return self

    def log(self) -> str:
        assert self.log_path is not None
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = 30.0) -> None:
        def ready() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"dramatiq exited early:\n{self.log()}")
            return self.log().count("Worker process is ready for action.") >= self.processes

        wait_for(ready, timeout, "the dramatiq worker processes to boot")

    def worker_pids(self) -> list[int]:
        assert self.proc is not None
        out = subprocess.run(
            ["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True, check=False
        ).stdout
        return [int(p) for p in out.split()]

    def stop(self, timeout: float = 30.0) -> int | None:
        """Graceful stop (SIGTERM to the CLI), SIGKILL of the whole group on timeout."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill_group()
        self._log.close()
        return self.proc.returncode

    def kill_group(self) -> None:
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.group or self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def wait_exit(self, timeout: float) -> int:
        assert self.proc is not None
        code = self.proc.wait(timeout)
        self._log.close()
        return code


def get(ledger: Ledger, task_id: str) -> Task | None:
    try:
        return ledger.get_task(task_id)
    except TaskNotFound:
        return None


def parent_of(ledger: Ledger, message_id: str) -> Task | None:
    return get(ledger, logical_task_id(message_id))


def attempts_of(ledger: Ledger, message_id: str) -> list[Task]:
    """The attempts of a message, in creation order."""
    try:
        children = ledger.children_of(logical_task_id(message_id))
    except TaskNotFound:
        return []
    return sorted(children, key=lambda t: (t.created_at, t.started_at or 0.0))


def wait_closed(ledger: Ledger, message_id: str, timeout: float = 30.0) -> Task:
    """Wait until the logical task of ``message_id`` is terminal."""

    def closed() -> Task | None:
        task = parent_of(ledger, message_id)
        return task if task is not None and task.status in TERMINAL else None

    return wait_for(closed, timeout, f"logical task of {message_id} to close")


def outcomes(tasks: list[Task]) -> list[tuple[str, str | None]]:
    return [(t.status, t.terminal_code) for t in tasks]


def assert_healthy(ledger: Ledger) -> None:
    report = ledger.doctor()
    assert report["healthy"] is True, report


class BackgroundReconciler:
    """Runs ``reconcile`` with a short active grace in a thread, as an operator's cron would."""

    def __init__(self, db: str, active_grace: float, interval: float = 0.2) -> None:
        self.db = db
        self.policy = ReconcilePolicy(
            active_grace_seconds=active_grace, delivery_grace_seconds=600.0
        )
        self.interval = interval
        self.runs = 0
        self.reports: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.error: BaseException | None = None

    def _run(self) -> None:
        ledger = Ledger(self.db)
        try:
            while not self._stop.wait(self.interval):
                self.reports.append(ledger.reconcile(self.policy))
                self.runs += 1
        except BaseException as exc:  # pragma: no cover - surfaced by stop()
            self.error = exc
        finally:
            ledger.close()

    def __enter__(self) -> BackgroundReconciler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        if self.error is not None:
            raise self.error


def iter_lines(text: str, needle: str) -> Iterator[str]:
    return (line for line in text.splitlines() if needle in line)
