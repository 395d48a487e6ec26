"""A recovering "server" process of the two-servers test (not a test module).

argv: ledger, checkpoints (a SQLite file or a ``postgresql://`` URL), a go file, an output
file. The process guards the crash graph (which reconciles the ledger), says ``ready``, waits
until the go file exists (so that two servers recover at once), runs one recovery pass and
writes, as JSON lines to the output file, each ``on_lost`` call, each ``on_recovered`` call and
the pass's report.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

from lg_crash_graph import builder, saver_at
from task_state_guard_langgraph import guard

if __name__ == "__main__":
    db, checkpoints, go, out = sys.argv[1:5]
    lock = threading.Lock()

    def write(kind: str, **fields: Any) -> None:
        with lock, Path(out).open("a") as f:
            f.write(json.dumps({"kind": kind, **fields}) + "\n")

    with saver_at(checkpoints) as saver:
        app = guard(
            builder(None).compile(checkpointer=saver, name="crashy"), db=db, strict=True,
            on_lost=lambda lost: write("on_lost", thread=lost.thread_id, task=lost.task_id),
            on_recovered=lambda r: write("on_recovered", thread=r.thread_id,
                                         log=r.output["log"]),
        )
        write("ready")
        deadline = time.monotonic() + 60
        while not Path(go).exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        report = app.recover(durability="sync")
        write("report", lost=report.lost, resumed=report.resumed,
              elsewhere=report.claimed_elsewhere, errors=app.stats()["errors"])
        app.close()
