"""What the verdict tests of every adapter suite check from the outside: the operator's CLI
(a process of its own, with no adapter), the lost-job totals it reports, and the calls the test
apps' ``on_lost`` hooks recorded as JSON marker files (``lost-<id>``; a second call for one job
is written as ``lost-<id>.again``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

LOST_CODES = ("owner_lost", "restart_stale", "deadline_exceeded")


def tsg(db: str, *args: str) -> dict[str, Any]:
    """Run ``tsg --db DB ARGS`` and return its JSON line (it must succeed, silently)."""
    done = subprocess.run([sys.executable, "-m", "task_state_guard", "--db", db, *args],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0 and done.stderr == "", (done.stdout, done.stderr)
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def lost_jobs(db: str) -> int:
    """Logical tasks closed as lost, from the monotonic totals (``tsg_outcomes_total``)."""
    closed = tsg(db, "status")["status"]["outcomes_total"]["task"]["timed_out"]
    return int(sum(closed[code] for code in LOST_CODES))


def hook_calls(directory: Path) -> dict[str, dict[str, Any]]:
    """The ``on_lost`` calls recorded in ``directory``, by job id; a job whose hook fired twice
    fails the test."""
    found = {}
    for path in directory.glob("lost-*"):
        assert not path.name.endswith(".again"), f"on_lost fired twice: {path.name}"
        if not path.name.endswith(".tmp"):
            found[path.name[5:]] = json.loads(path.read_text())
    return found
