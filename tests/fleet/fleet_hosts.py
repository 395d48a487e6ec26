"""A "host" of the fleet tests (not a test module): one process group holding a real
``celery worker`` (the group leader) and a real ``dramatiq`` CLI, SIGKILLed together as a
machine that vanished."""

from __future__ import annotations

import json
import os
import signal
from typing import Any

from _dramatiq_helpers import BrokerEnv, CliWorker
from celery_harness import Scenario


class Host:
    """One "machine": a Celery worker (the group leader) and a Dramatiq CLI in its group, both
    reconciling every ``interval`` seconds; ``celery_env`` / ``dramatiq_env``: their extra
    environment."""

    def __init__(self, celery: Scenario, dramatiq: BrokerEnv, interval: str,
                 dramatiq_env: dict[str, str], **celery_env: Any) -> None:
        self.celery = celery.start_worker(group=0, TSG_RECONCILE_INTERVAL_SECONDS=interval,
                                          **celery_env)
        self.dramatiq = CliWorker(dramatiq, extra_env=dramatiq_env, group=self.celery.pid)
        self.dramatiq.start()

    @property
    def group(self) -> int:
        return self.celery.pid

    def members(self, pid: int) -> bool:
        try:
            return os.getpgid(pid) == self.group
        except ProcessLookupError:
            return False

    def periodic_closes(self) -> int:
        """Tasks timed out by this host's periodic reconciles (their counts-only log lines)."""
        total = 0
        for log in (self.celery.log(), self.dramatiq.log()):
            for line in log.splitlines():
                if "task-state-guard: reconcile (periodic_reconcile) " in line:
                    report = json.loads(line.split("task-state-guard: reconcile "
                                                   "(periodic_reconcile) ", 1)[1])
                    total += report["tasks_timed_out"]
        return total

    def kill(self) -> None:
        """SIGKILL the whole group at once, as a vanished machine."""
        os.killpg(self.group, signal.SIGKILL)
        self.celery.proc.wait(10)
        assert self.dramatiq.proc is not None
        self.dramatiq.proc.wait(10)
