"""The Celery crash demo runs end to end and shows STARTED -> FAILURE for the killed task."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def test_celery_crash_demo_shows_started_then_failure(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, str(REPO / "examples" / "celery_crash_demo.py")],
        capture_output=True, text=True, cwd=str(tmp_path), timeout=300, check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    states = [line.strip() for line in lines if "long task: Celery AsyncResult.state" in line]
    assert states == [
        "long task: Celery AsyncResult.state = STARTED",  # running
        "long task: Celery AsyncResult.state = STARTED",  # SIGKILLed: nobody told the backend
        "long task: Celery AsyncResult.state = FAILURE",  # after the restart's boot reconcile
    ]
    raised = [line for line in lines if "AsyncResult.get() raises" in line]
    assert len(raised) == 1 and "TaskLostError(" in raised[0] and "'owner_lost')" in raised[0]
    hook = [line for line in lines if "on_lost hook was called: task " in line]
    assert len(hook) == 1 and hook[0].endswith("(demo.long_report) was lost: owner_lost")
    # Ids appear only where the user's own hook printed one; aggregates never carry any.
    for line in lines:
        if line not in hook:
            assert not UUID.search(line), line
    assert '"tasks_timed_out": 2' in out.stdout or '"tasks_timed_out":2' in out.stdout
    assert '{"healthy": true, "task_count": 10}' in out.stdout
