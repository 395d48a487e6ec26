#!/usr/bin/env python3
"""Take the README's screenshots of `tsg serve`'s pages (docs/images/serve-*.png).

Builds a demonstration ledger through the public API on a simulated clock (a day of Celery,
Dramatiq and LangGraph jobs: successes, failures, a retry, lost jobs after a worker crash,
owed deliveries; now: running work, queued work, and two jobs whose owner process has
exited), serves it, and captures each page in headless Chromium (the browser tests' DevTools
client, tests/web/cdp_client.py).

    .venv/bin/python scripts/web_screenshots.py            # writes docs/images/serve-*.png
    .venv/bin/python scripts/web_screenshots.py --out /tmp/shots
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "web"))

from cdp_client import Chromium  # noqa: E402
from task_state_guard import Ledger  # noqa: E402
from task_state_guard.integration import AdapterRuntime, resolve_settings  # noqa: E402
from task_state_guard.integration.ids import job_task_id  # noqa: E402

JOBS = (  # (framework, name, delivery owed)
    ("celery", "reports.render_pdf", True),
    ("celery", "billing.charge_card", False),
    ("celery", "mail.send_digest", False),
    ("dramatiq", "etl.import_orders", False),
    ("dramatiq", "search.reindex", False),
    ("langgraph", "support_agent", True),
)

_OWNER_EXITS = """
import sys
from task_state_guard import Ledger
with Ledger(sys.argv[1]) as ledger:
    for task_id in sys.argv[2:]:
        ledger.start_task(task_id)  # owned by this process, which then exits
"""


class Clock:
    def __init__(self, start: float) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


def _framework_id(framework: str, rng: random.Random) -> str:
    if framework == "langgraph":
        return f"thread-{rng.randrange(10**6)}:run-{rng.randrange(10**4)}"
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def _runtimes(ledger: Ledger) -> dict[str, AdapterRuntime]:
    """One adapter runtime per framework on the demo ledger: a job it opens owes its framework
    a verdict when it is closed as lost."""
    settings = resolve_settings(db_required=False, heartbeat_seconds=0)
    return {framework: AdapterRuntime(settings, logger=logging.getLogger("tsg-screenshots"),
                                      ledger=ledger, framework=framework)
            for framework in ("celery", "dramatiq", "langgraph")}


def _job(ledger: Ledger, clock: Clock, rng: random.Random, framework: str, name: str,
         owed: bool, outcome: str, runtime: AdapterRuntime) -> str:
    fid = _framework_id(framework, rng)
    root = job_task_id(framework, fid)
    runtime.open_logical(root, delivery_required=owed, name=name, framework_id=fid)
    attempts = 2 if outcome == "retried" else 1
    for number in range(attempts):
        attempt = ledger.create_task(parent_id=root, delivery_required=False, name=name)
        ledger.start_task(attempt.id, owner=False)
        clock.now += rng.uniform(0.5, 40)
        if number + 1 < attempts:
            ledger.close_task_settled(attempt.id, "failed", code="retry_scheduled")
            clock.now += 5
            continue
        state, code = {"succeeded": ("succeeded", "worker_completed"),
                       "retried": ("succeeded", "worker_completed"),
                       "failed": ("failed", "worker_failed"),
                       "lost": ("timed_out", "owner_lost"),
                       "time_limit": ("timed_out", "time_limit_exceeded"),
                       "cancelled": ("cancelled", "revoked")}[outcome]
        ledger.close_task_settled(attempt.id, state, code=code)
        ledger.close_task_settled(root, state, code=code)
    if owed and outcome in ("succeeded", "retried") and rng.random() < 0.9:
        ledger.set_delivery(root, "delivered", code="transport_acknowledged")
    return root


def build(db: str) -> str:
    """The demonstration ledger; returns the ledger id of a lost job (shown on the job page)."""
    rng = random.Random(7)
    now = time.time()
    clock = Clock(now - 23.5 * 3600)
    lost: list[str] = []
    with Ledger(db, clock=clock) as ledger:
        runtimes = _runtimes(ledger)
        while clock.now < now - 600:
            hour = (clock.now - (now - 24 * 3600)) / 3600
            framework, name, owed = rng.choice(JOBS)
            crash = 14.0 <= hour < 14.4  # a worker host was lost around then
            outcome = "lost" if crash else rng.choices(
                ["succeeded", "retried", "failed", "time_limit", "cancelled"],
                [88, 5, 4, 2, 1])[0]
            root = _job(ledger, clock, rng, framework, name, owed, outcome, runtimes[framework])
            if outcome == "lost":
                lost.append(root)
            clock.now += rng.expovariate(1 / (60 if 8 <= hour % 24 < 20 else 180))
        clock.now = now - 240
        running = []
        for framework, name, owed in rng.sample(JOBS, 4):
            root = job_task_id(framework, _framework_id(framework, rng))
            ledger.create_task(task_id=root, name=name, delivery_required=owed)
            ledger.start_task(root, owner=False)
            attempt = ledger.create_task(parent_id=root, delivery_required=False, name=name)
            running.append(attempt.id)
            clock.now += 30
        ledger.start_task(running[0], owner=False)
        ledger.start_task(running[1], owner=False)
        for framework, name, _owed in rng.sample(JOBS, 3):
            ledger.create_task(task_id=job_task_id(framework, _framework_id(framework, rng)),
                               name=name)
        # The adapters published the verdicts of all but the last two lost jobs.
        ledger.mark_verdicts_published(lost[:-2])
    # Two attempts owned by a process that has exited: what a SIGKILLed worker leaves.
    subprocess.run([sys.executable, "-c", _OWNER_EXITS, db, *running[2:]], check=True)
    return lost[-1] if lost else running[2]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "images")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="tsg-shots-") as tmp:
        folder = Path(tmp) / "ledger"
        folder.mkdir(mode=0o700)
        db = str(folder / "tasks.sqlite")
        job = build(db)
        server = subprocess.Popen(
            [sys.executable, "-m", "task_state_guard", "--db", db, "serve", "--listen",
             "127.0.0.1:0", "--no-token"], stdout=subprocess.PIPE, text=True,
            env={k: v for k, v in os.environ.items() if not k.startswith("TSG_")},
        )
        assert server.stdout is not None
        base = "http://" + json.loads(server.stdout.readline())["listen"]
        browser = Chromium(Path(tmp), width=1280, height=860)
        try:
            page = browser.page()
            page.scripts(False)  # no countdown ticking in the pictures
            for name, path in (("overview", "/"), ("stuck", "/stuck?sort=activity"),
                               ("job", f"/job?id={job}&kind=ledger")):
                page.goto(base + path)
                shot = page.screenshot(args.out / f"serve-{name}.png")
                print(shot.relative_to(ROOT) if shot.is_relative_to(ROOT) else shot)
        finally:
            browser.close()
            server.send_signal(signal.SIGTERM)
            server.wait(30)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
