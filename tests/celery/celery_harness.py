"""Harness for the Celery adapter tests: real `celery worker` subprocesses, real Redis.

Redis must listen on 127.0.0.1:6379 (CI starts it); a missing Redis fails the suite. A
scenario can use RabbitMQ (127.0.0.1:5672) as its broker instead; results stay in Redis.
Every test gets its own queue name, ledger and worker(s); the suite uses Redis DB 5 so that
other suites sharing the server never see its keys. A test whose scenario comes from the
``scenario``/``any_broker`` fixtures (or ``ledger_on``) runs once per ledger backend
(``[sqlite]``: a file in a private directory, ``[postgresql]``: a URL naming a schema of the
test's own); the workers get it through ``TSG_DB``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import ledger_backends
import pytest
import redis
from task_state_guard import Ledger, ReconcilePolicy, Task

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(HERE))

from tsg_celery_testapp import make_app  # noqa: E402

REDIS_DB = 5
BROKER = f"redis://127.0.0.1:6379/{REDIS_DB}"

import task_state_guard_celery  # noqa: E402
from verdict_checks import hook_calls  # noqa: E402


def require_service(port: int, what: str) -> None:
    """Fail (CI starts every service: a missing one is a failure, never a skip)."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except OSError as exc:
        pytest.fail(f"{what} is required at 127.0.0.1:{port} for tests/celery: {exc!r}")


@contextlib.contextmanager
def ledger_on(backend: str, tmp: Path) -> Iterator[str]:
    """A fresh ledger on ``backend`` for a scenario: a path in a private (0700) directory, or a
    PostgreSQL URL with a schema of its own (dropped afterwards)."""
    with ledger_backends.ledger_target(backend, tmp) as target:
        if backend == "sqlite":
            Path(target).parent.mkdir(mode=0o700)
        yield target


def wait_for(
    predicate: Callable[[], Any], timeout: float = 20.0, interval: float = 0.05, what: str = ""
) -> Any:
    """Poll ``predicate`` until it returns a truthy value; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = predicate()
        except Exception as exc:  # the ledger may not exist yet
            last = exc
        else:
            if last:
                return last
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what or predicate!r}; last={last!r}")


class Worker:
    """One `celery worker` subprocess (its own session, so it can be killed as a group)."""

    def __init__(
        self,
        env: dict[str, str],
        args: list[str],
        log_path: Path,
        wrap: list[str] | None = None,
        group: int | None = None,
    ) -> None:
        """``group``: 0 = lead a new process group, N = join group N (a "host" of several
        workers, killed together; both in this session), None = a session of its own."""
        self.log_path = log_path
        self._log = open(log_path, "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [
                *(wrap or []),
                sys.executable,
                "-m",
                "celery",
                "-A",
                "tsg_celery_testapp",
                "worker",
                *args,
            ],
            env=env,
            cwd=str(HERE),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=group is None,
            process_group=group,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = 40.0) -> None:
        def ready() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"worker exited early:\n{self.log()}")
            return " ready." in self.log()

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ready():
                return
            time.sleep(0.05)
        raise AssertionError(f"worker not ready:\n{self.log()}")

    def sigkill(self) -> None:
        """SIGKILL the worker's main process only (its pool children die with it)."""
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self, graceful: bool = False) -> None:
        """Stop the worker: SIGKILL its process group (tests assert before stopping)."""
        if graceful and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(15)
        # Leftovers of this worker's own process group only.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        if self.proc.poll() is None:
            self.proc.wait(10)
        self._log.close()


class Scenario:
    """Per-test environment: queue, ledger, marker directory, workers, client app."""

    def __init__(
        self,
        tmp: Path,
        *,
        db: str | None = None,
        queue: str | None = None,
        queues: list[str] | None = None,
        broker: str = BROKER,
        backend: str | None = None,
        track_started: bool = False,
    ) -> None:
        self.tmp = tmp
        self.broker = broker
        #: an SQL result backend URL (per-test tables), else Redis
        self.backend = backend
        self.tables = f"tsgt_{uuid.uuid4().hex[:10]}" if backend else None
        if backend:
            self._drop_leftover_tables()
        self.track_started = track_started
        self.queue = queue or f"tsgt-{uuid.uuid4().hex[:12]}"
        #: queues a worker started by this scenario consumes (a shared worker serves
        #: several tests, each with its own queue)
        self.queues = queues or [self.queue]
        if db is None:
            ledger_dir = tmp / "ledger"
            ledger_dir.mkdir(mode=0o700)
            db = str(ledger_dir / "tasks.sqlite")
        self.db = db
        self.markers = tmp / "markers"
        self.markers.mkdir(exist_ok=True)
        self.workers: list[Worker] = []
        self.grace = 600.0
        self.heartbeat = 0.3
        self._ledger: Ledger | None = None
        self._apps: list[Any] = []
        self.client = self.app()

    def app(self, *, visibility_timeout: float | None = None) -> Any:
        app = make_app(
            self.broker, self.queue, visibility_timeout=visibility_timeout, register=False,
            backend=self.backend, tables=self.tables, track_started=self.track_started,
        )
        self._apps.append(app)
        return app

    @property
    def ledger(self) -> Ledger:
        if self._ledger is None:
            self._ledger = Ledger(self.db)
        return self._ledger

    def env(self, **extra: Any) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            {
                "PYTHONPATH": os.pathsep.join(
                    [str(HERE)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
                ),
                "TSGT_BROKER": self.broker,
                "TSGT_QUEUE": self.queue,
                "TSGT_MARKERS": str(self.markers),
                "TSG_DB": self.db,
                "TSG_ACTIVE_GRACE_SECONDS": str(self.grace),
                "TSG_DELIVERY_GRACE_SECONDS": "600",
                "TSG_HEARTBEAT_SECONDS": str(self.heartbeat),
                "PYTHONDONTWRITEBYTECODE": "1",
                "TSGT_BACKEND": self.backend or "",
                "TSGT_TABLES": self.tables or "",
                "TSGT_TRACK_STARTED": "1" if self.track_started else "",
            }
        )
        env.update({k: str(v) for k, v in extra.items()})
        return env

    def start_worker(
        self,
        *,
        pool: str = "prefork",
        concurrency: int = 2,
        ready: bool = True,
        wrap: list[str] | None = None,
        group: int | None = None,
        **extra_env: Any,
    ) -> Worker:
        args = [
            "-P",
            pool,
            "-c",
            str(concurrency),
            "-Q",
            ",".join(self.queues),
            "-n",
            f"w{len(self.workers)}-{self.queue}@%h",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
            "-l",
            "INFO",
        ]
        log_path = self.tmp / f"worker{len(self.workers)}.log"
        worker = Worker(self.env(**extra_env), args, log_path, wrap, group)
        self.workers.append(worker)
        if ready:
            worker.wait_ready()
        return worker

    def send(self, name: str, *args: Any, **options: Any) -> Any:
        return self.client.send_task(name, args=list(args), queue=self.queue, **options)

    def marker(self, name: str, timeout: float = 20.0) -> int:
        path = self.markers / name
        wait_for(path.exists, timeout, what=f"marker {name}")
        return int(path.read_text())

    # --- ledger views ---------------------------------------------------------

    def parent(self, celery_id: str) -> Task:
        return self.ledger.get_task(task_state_guard_celery.logical_task_id(celery_id))

    def attempts(self, celery_id: str) -> list[Task]:
        tasks = self.ledger.children_of(task_state_guard_celery.logical_task_id(celery_id))
        return sorted(tasks, key=lambda t: (t.created_at, t.id))

    def outcome(
        self, celery_id: str
    ) -> tuple[tuple[str, str | None], list[tuple[str, str | None]]]:
        parent = self.parent(celery_id)
        return (
            (str(parent.status), parent.terminal_code),
            [(str(a.status), a.terminal_code) for a in self.attempts(celery_id)],
        )

    def wait_parent(self, celery_id: str, status: str, timeout: float = 30.0) -> Task:
        def done() -> Task | None:
            parent = self.parent(celery_id)
            return parent if str(parent.status) == status else None

        return wait_for(done, timeout, what=f"parent {status}")  # type: ignore[no-any-return]

    def wait_attempts(
        self, celery_id: str, predicate: Callable[[list[Task]], bool], timeout: float = 30.0
    ) -> list[Task]:
        def done() -> list[Task] | None:
            attempts = self.attempts(celery_id)
            return attempts if predicate(attempts) else None

        return wait_for(done, timeout, what="attempts")  # type: ignore[no-any-return]

    def reconcile(
        self, active_grace: float | None = None, delivery_grace: float = 600.0
    ) -> dict[str, Any]:
        policy = ReconcilePolicy(
            active_grace_seconds=self.grace if active_grace is None else active_grace,
            delivery_grace_seconds=delivery_grace,
        )
        return self.ledger.reconcile(policy)

    def lost_hook_calls(self) -> dict[str, dict[str, Any]]:
        """What the workers' ``on_lost`` hooks received (TSGT_ON_LOST=1), by Celery id (by
        ledger id for a custom id, which is never stored); a second call for one job fails."""
        return hook_calls(self.markers)

    def _drop_leftover_tables(self) -> None:
        """Celery's SQL backend names its indexes without the table prefix, so the tables a
        killed earlier run left behind would make this test's table creation fail: drop them
        (only tables of this suite, ``tsgt_*``, that own one of those index names)."""
        import sqlalchemy

        assert self.backend is not None
        engine = sqlalchemy.create_engine(self.backend.removeprefix("db+"))
        try:
            with engine.begin() as conn:
                rows = conn.execute(sqlalchemy.text(
                    "SELECT DISTINCT tablename FROM pg_indexes WHERE schemaname = 'public' "
                    "AND indexname LIKE 'ix_celery_%' AND tablename LIKE 'tsgt\\_%'"
                )).fetchall()
                for (table,) in rows:
                    conn.execute(sqlalchemy.text(f'DROP TABLE IF EXISTS "{table}"'))
        finally:
            engine.dispose()

    def _drop_tables(self) -> None:
        """Drop this test's tables of the SQL result backend (never anything else)."""
        import sqlalchemy

        assert self.backend is not None
        engine = sqlalchemy.create_engine(self.backend.removeprefix("db+"))
        try:
            with engine.begin() as conn:
                for suffix in ("task", "group"):
                    conn.execute(sqlalchemy.text(f'DROP TABLE IF EXISTS "{self.tables}_{suffix}"'))
        finally:
            engine.dispose()

    def assert_healthy(self) -> None:
        report = self.ledger.doctor()
        assert report["healthy"], report

    def close(self) -> None:
        for worker in self.workers:
            worker.stop()
        # Remove this test's queues and bindings (never anything else in the DB).
        client = redis.Redis(host="127.0.0.1", port=6379, db=REDIS_DB)
        try:
            for queue in {self.queue, *self.queues}:
                client.delete(
                    queue, f"_kombu.binding.{queue}", f"_kombu.binding_permanent.{queue}"
                )
        finally:
            client.close()
        if not self.broker.startswith("redis://"):
            with contextlib.suppress(Exception), self.client.connection_for_write() as conn:
                for queue in {self.queue, *self.queues}:
                    conn.default_channel.queue_delete(queue)
        if self.tables:
            self._drop_tables()
        for app in self._apps:
            with contextlib.suppress(Exception):
                app.close()
        if self._ledger is not None:
            self._ledger.close()
