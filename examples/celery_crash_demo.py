"""TaskStateGuard crash-recovery demo with a real Celery worker.

    python3 scripts/dev.py demo          # starts Redis when it is not running, then this
    python examples/celery_crash_demo.py  # needs Redis on 127.0.0.1:6379 (results only)

The broker is kombu's ``filesystem://`` transport (no broker server); task results go to Redis
(database 8, or ``TSG_DEMO_RESULTS``) with ``task_track_started=True``, as in a typical app, so
the demo can show what a user of ``AsyncResult`` sees. What it does, in a private temporary
directory that it deletes at the end (and it forgets its own results in Redis):

1. starts a real ``celery worker`` (prefork, 2 processes), with
   ``task_state_guard_celery.install(app, on_lost=...)`` in the app module;
2. sends two quick tasks and one long task; the long task's ``AsyncResult.state`` is
   ``STARTED``;
3. SIGKILLs the whole worker while the long task runs (no signal fires; nothing in the
   worker can record anything): the backend still says ``STARTED`` and ``get()`` would wait
   forever;
4. restarts the worker: before it takes its first task, its boot step reconciles the
   ledger, and the lost attempt - and its logical task - are closed ``timed_out/owner_lost``
   at once, because the process that owned them is provably dead (no 600 s wait); the
   adapter writes ``FAILURE`` with ``TaskLostError`` into the result backend and calls the
   ``on_lost`` hook: ``STARTED -> FAILURE``;
5. sends two more tasks, which succeed;
6. runs a later ``tsg reconcile`` with a short delivery grace, which closes the killed task's
   deliveries (owed to nobody) ``not_applicable``, and runs ``doctor``: no delivery is left
   pending.

The ledger is shown with the ``task-state-guard status --format text`` command at each step.
The demo's task arguments are fixed, synthetic numbers; nothing else is stored.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DEMO_DELIVERY_GRACE = 2.0
RESULTS = os.environ.get("TSG_DEMO_RESULTS", "redis://127.0.0.1:6379/8")

# --------------------------------------------------------------------------- worker side
# `celery -A celery_crash_demo worker` imports this module with TSG_DEMO_DIR set.

app: Any = None

if os.environ.get("TSG_DEMO_DIR"):
    import logging

    import task_state_guard_celery
    from celery import Celery  # type: ignore[import-untyped]

    _dir = Path(os.environ["TSG_DEMO_DIR"])
    app = Celery("demo", broker="filesystem://", backend=RESULTS, set_as_current=False)
    app.conf.update(
        broker_transport_options={
            "data_folder_in": str(_dir / "broker"),
            "data_folder_out": str(_dir / "broker"),
            "processed_folder": str(_dir / "processed"),
            "control_folder": str(_dir / "control"),
            "store_processed": False,
            "polling_interval": 0.1,
        },
        worker_prefetch_multiplier=1,
        worker_enable_remote_control=False,
        task_track_started=True,
        result_expires=3600,
        broker_connection_retry_on_startup=True,
    )

    def on_lost(lost: task_state_guard_celery.LostTask) -> None:
        """Called in the worker for each task a reconcile found lost (after FAILURE was
        written into the result backend): alert, re-enqueue, or whatever the app needs."""
        logging.getLogger("demo").warning(
            "on_lost hook: task %s (%s) was lost: %s", lost.framework_id, lost.name, lost.code
        )

    # One line covers the worker's main process and every pool child.
    task_state_guard_celery.install(
        app, db=str(_dir / "ledger" / "tasks.sqlite"), on_lost=on_lost
    )

    @app.task(name="demo.add")
    def add(x: int, y: int) -> int:
        return x + y

    @app.task(name="demo.long_report")
    def long_report(seconds: float) -> str:
        time.sleep(seconds)
        return "report ready"


# --------------------------------------------------------------------------- demo driver


def _say(text: str = "") -> None:
    print(text, flush=True)


def _banner(text: str) -> None:
    _say()
    _say("=" * 72)
    _say(text)
    _say("=" * 72)


class _Demo:
    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "broker").mkdir()
        (root / "processed").mkdir()
        (root / "ledger").mkdir(mode=0o700)
        self.db = str(root / "ledger" / "tasks.sqlite")
        self.env = dict(os.environ)
        self.env.update(
            {
                "TSG_DEMO_DIR": str(root),
                "PYTHONPATH": os.pathsep.join(
                    [str(HERE)] + [p for p in self.env.get("PYTHONPATH", "").split(os.pathsep) if p]
                ),
                "PYTHONDONTWRITEBYTECODE": "1",
            }
        )
        self.workers: list[subprocess.Popen[bytes]] = []
        self.logs: list[Path] = []
        # The client (this process) publishes with the same app definition.
        os.environ["TSG_DEMO_DIR"] = str(root)
        sys.path.insert(0, str(HERE))
        import celery_crash_demo as worker_module

        self.app = worker_module.app

    def start_worker(self) -> subprocess.Popen[bytes]:
        log = self.root / f"worker{len(self.workers)}.log"
        cmd = [
            sys.executable, "-m", "celery", "-A", "celery_crash_demo", "worker",
            "-P", "prefork", "-c", "2", "-n", f"demo{len(self.workers)}@%h",
            "--without-gossip", "--without-mingle", "--without-heartbeat", "-l", "INFO",
        ]
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                cmd, env=self.env, cwd=str(self.root), stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )
        self.workers.append(proc)
        self.logs.append(log)
        deadline = time.monotonic() + 60
        while " ready." not in log.read_text(errors="replace"):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the worker did not start:\n" + log.read_text(errors="replace"))
            time.sleep(0.05)
        return proc

    def status(self, title: str) -> None:
        _banner(title)
        out = subprocess.run(
            [sys.executable, "-m", "task_state_guard", "--db", self.db, "status", "--format",
             "text"],
            env=self.env, capture_output=True, text=True, check=False,
        )
        _say(out.stdout.rstrip())

    def ledger_view(self, celery_id: str, label: str) -> None:
        import task_state_guard_celery
        from task_state_guard import Ledger

        with Ledger(self.db) as ledger:
            parent = ledger.get_task(task_state_guard_celery.logical_task_id(celery_id))
            attempts = sorted(ledger.children_of(parent.id), key=lambda t: t.created_at)
        _say(f"  {label}: logical task {parent.status}/{parent.terminal_code or '-'}"
             f" (delivery {parent.delivery_status})")
        for n, attempt in enumerate(attempts, 1):
            _say(f"    attempt {n}: {attempt.status}/{attempt.terminal_code or '-'}")

    def wait(self, what: str, predicate: Any, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if predicate():
                    return
            except Exception:
                pass
            time.sleep(0.1)
        raise SystemExit(f"timed out waiting for {what}")

    def backend_view(self, result: Any, label: str) -> None:
        """What a user of Celery sees: the result backend's state (and get() once settled)."""
        state = result.state
        _say(f"  {label}: Celery AsyncResult.state = {state}")
        if state == "FAILURE":
            try:
                result.get(timeout=5, propagate=True)
            except Exception as exc:
                _say(f"    AsyncResult.get() raises {type(exc).__name__}{exc.args!r}")
        elif state == "STARTED":
            _say("    (AsyncResult.get() would wait for it)")

    def task_status(self, celery_id: str) -> str:
        import task_state_guard_celery
        from task_state_guard import Ledger

        with Ledger(self.db) as ledger:
            return str(ledger.get_task(task_state_guard_celery.logical_task_id(celery_id)).status)

    def attempt_running(self, celery_id: str) -> bool:
        import task_state_guard_celery
        from task_state_guard import Ledger

        with Ledger(self.db) as ledger:
            parent = task_state_guard_celery.logical_task_id(celery_id)
            return any(str(t.status) == "running" for t in ledger.children_of(parent))

    def stop(self) -> None:
        for proc in self.workers:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                    proc.wait(20)
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(10)


def _redis_reachable() -> bool:
    import redis

    client = redis.Redis.from_url(RESULTS, socket_connect_timeout=2)
    try:
        return bool(client.ping())
    except redis.exceptions.RedisError:
        return False
    finally:
        client.close()


def main() -> int:
    if not _redis_reachable():
        _say("The demo keeps Celery's task results in Redis (127.0.0.1:6379, or TSG_DEMO_RESULTS),")
        _say("which is not reachable. `python3 scripts/dev.py demo` starts it for you.")
        return 2
    root = Path(tempfile.mkdtemp(prefix="tsg-celery-demo-"))
    demo: _Demo | None = None
    sent: list[Any] = []
    try:
        demo = _Demo(root)
        _banner("1. Start a real Celery worker (prefork, filesystem:// transport)")
        first = demo.start_worker()
        _say(f"  worker pid {first.pid} is ready; the ledger lives in a private temp dir")

        quick = [demo.app.send_task("demo.add", args=[n, n]) for n in (1, 2)]
        long_job = demo.app.send_task("demo.long_report", args=[600])
        sent.extend([*quick, long_job])
        for result in quick:
            demo.wait("quick tasks", lambda r=result: demo.task_status(r.id) == "succeeded")
        demo.wait("the long task to start", lambda: demo.attempt_running(long_job.id))
        demo.wait("STARTED in the result backend", lambda: long_job.state == "STARTED")
        demo.status("2. Two quick tasks succeeded; the long task is running")
        demo.backend_view(long_job, "long task")
        _say("  (Counts include each logical task and its attempts: one Celery task that ran")
        _say("  once is two ledger records, the logical task and attempt 1.)")

        _banner("3. SIGKILL the whole worker mid-task")
        os.kill(first.pid, signal.SIGKILL)
        first.wait(10)
        time.sleep(0.5)  # its pool children die with it (PR_SET_PDEATHSIG)
        _say(f"  sent SIGKILL to worker pid {first.pid}: no Celery signal fires, nothing")
        _say("  in the worker can record anything. The ledger still says 'running',")
        _say("  and the result backend still says STARTED:")
        demo.ledger_view(long_job.id, "long task")
        demo.backend_view(long_job, "long task")
        demo.status("4. Ledger after the crash, before any restart (the owner is dead)")

        _banner("5. Restart the worker: it reconciles on boot, before consuming")
        second = demo.start_worker()
        marker = "task-state-guard: reconcile (reconcile_on_boot) "
        boot = [line for line in demo.logs[-1].read_text().splitlines() if marker in line]
        report = json.loads(boot[0].split(marker, 1)[1]) if boot else {}
        _say(f"  worker pid {second.pid} is ready; its boot reconcile report:")
        _say("  " + json.dumps(report, sort_keys=True))
        demo.ledger_view(long_job.id, "long task")
        demo.backend_view(long_job, "long task")
        hook = [line.split("on_lost hook: ", 1)[1] for line in
                demo.logs[-1].read_text().splitlines() if "on_lost hook: " in line]
        _say(f"  the worker's on_lost hook was called: {hook[0] if hook else 'no'}")
        _say("  The lost attempt is closed timed_out/owner_lost at once (its owner process is")
        _say("  provably dead), without waiting for the 600 s active grace. Its logical task")
        _say("  is closed too: the filesystem:// transport removes a message when the worker")
        _say("  receives it, so it can never be redelivered after a SIGKILL. (With Redis and")
        _say("  acks_late the logical task would stay open and the redelivered message would")
        _say("  run as a new attempt of it.) The result backend still said STARTED, so the")
        _say("  adapter wrote FAILURE with TaskLostError(owner_lost): STARTED -> FAILURE.")
        demo.status("6. Ledger after the restart, before the new worker takes its first task")

        more = [demo.app.send_task("demo.add", args=[n, 10]) for n in (3, 4)]
        sent.extend(more)
        for result in more:
            demo.wait("new tasks", lambda r=result: demo.task_status(r.id) == "succeeded")
        demo.status("7. Tasks sent after the restart succeeded")

        _say("  Every attempt, and every task that owes nobody a delivery, closed its delivery")
        _say("  not_applicable together with the task. Only the killed task's two records are")
        _say("  still pending: the worker died before it could close anything, and reconcile")
        _say("  closes a terminal task's delivery once the delivery grace has passed.")

        time.sleep(DEMO_DELIVERY_GRACE)
        _banner(f"8. A later reconcile (here with a {DEMO_DELIVERY_GRACE:g} s delivery grace)")
        out = subprocess.run(
            [sys.executable, "-m", "task_state_guard", "--db", demo.db, "reconcile",
             "--delivery-grace-seconds", f"{DEMO_DELIVERY_GRACE:g}"],
            env=demo.env, capture_output=True, text=True, check=False,
        )
        _say("  " + out.stdout.strip())

        from task_state_guard import Ledger

        with Ledger(demo.db) as ledger:
            doctor = ledger.doctor()
            pending = ledger.status()["deliveries"]["pending"]
        _banner("9. doctor (counts only)")
        _say("  " + json.dumps({"healthy": doctor["healthy"], "task_count": doctor["task_count"]},
                              sort_keys=True))
        _say(f"  pending deliveries: {pending} (no task here owes anybody a delivery)")
        _say("  Nothing unknown was turned into success: the killed report is timed_out.")
        _say("  A task declared with tsg_delivery=True would keep its delivery pending until")
        _say("  the application confirms it (mark_delivered) or the grace expires (failed).")
        ok = long_job.state == "FAILURE" and all(r.state == "SUCCESS" for r in quick + more)
        return 0 if doctor["healthy"] and pending == 0 and ok else 1
    finally:
        if demo is not None:
            demo.stop()
        for result in sent:  # the demo's own results only
            with contextlib.suppress(Exception):
                result.forget()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
