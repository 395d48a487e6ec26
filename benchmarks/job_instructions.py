"""Guarded jobs for an instruction count: ``job_cost.py``'s harness, no timing, no probe.

Opens a fresh SQLite ledger, runs a warm-up, then ``jobs`` guarded jobs of one flow through
the framework's own hooks (Dramatiq: a ``StubBroker``'s middleware; Celery: ``Task.apply()``),
or (``tasks``) the one-task path alone: ``create_task``, ``start_task``, ``close_task`` and
``set_delivery`` of a root task that owes its delivery.
Meant to run under callgrind twice, the difference being the jobs' cost alone::

    for n in 200 1200; do PYTHONHASHSEED=0 valgrind --tool=callgrind \\
        --callgrind-out-file=/tmp/cg.celery.$n .venv/bin/python \\
        benchmarks/job_instructions.py celery $n; done
    # instructions a job = (I(1200) - I(200)) / 1000 (callgrind_annotate's "PROGRAM TOTALS")

Any interpreter whose environment has the adapters runs it (a baseline's ``.venv`` measures
that tree's packages). ``--profile`` prints cProfile's top frames (own time) instead.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from job_cost import Harness

WARMUP = 50


class _Tasks:
    """The one-task path of a root task owing its delivery, one call per transition."""

    def __init__(self, db: str | None) -> None:
        from task_state_guard import Ledger

        if db is None:
            raise SystemExit("tasks: no --plain variant (there is no framework to run alone)")
        self.ledger = Ledger(db)

    def job(self) -> None:
        led = self.ledger
        task = led.create_task(delivery_required=True)
        led.start_task(task.id, owner=False)
        led.close_task(task.id, "succeeded")
        led.set_delivery(task.id, "delivered")

    def close(self) -> None:
        self.ledger.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("flow", choices=("celery", "dramatiq", "tasks"))
    parser.add_argument("jobs", type=int)
    parser.add_argument("--plain", action="store_true", help="no adapter (the framework alone)")
    parser.add_argument("--profile", type=int, default=0, metavar="TOP",
                        help="print cProfile's TOP frames by own time")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tsg-ji-") as root:
        db = None if args.plain else os.path.join(root, "tasks.sqlite")
        harness: Harness | _Tasks = (
            _Tasks(db) if args.flow == "tasks" else Harness(args.flow, db))
        try:
            for _ in range(WARMUP):
                harness.job()
            if args.profile:
                prof = cProfile.Profile()
                prof.enable()
            for _ in range(args.jobs):
                harness.job()
            if args.profile:
                prof.disable()
                pstats.Stats(prof).sort_stats("tottime").print_stats(args.profile)
        finally:
            harness.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
