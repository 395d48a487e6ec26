"""A worker process for the PostgreSQL tests: ``python pg_worker.py MODE URL [ARGS...]``.

Modes:
  hold N        create N tasks, start them with this process as owner, print one JSON line
                with their ids, then sleep until killed.
  reconcile T   wait until the wall clock reaches T (a shared start line), reconcile once
                (active grace 3600 s), print the report as JSON.
  close T IDS   wait until T, close each comma-separated id ``succeeded``; print the ids
                whose close returned (closed, or an identical repeat) and how many were
                refused as conflicts.
  open T        wait until T, open the ledger (creating or migrating it), print its schema
                version.
  resume FILE   start a task as owner, print its id, wait until FILE exists, then heartbeat
                and close it and start a second owned task; print the error names (or
                null) of the first two and the second task's id, then sleep.
  fork          start a task as owner, fork a child that starts a second task as its own
                owner and exits normally (every finaliser runs); then check this process's
                connection still works, print both ids and the child's exit code, and sleep.
"""

from __future__ import annotations

import json
import os
import sys
import time

from task_state_guard import Ledger, LedgerError, StateConflict
from task_state_guard.ops.reconcile import ReconcilePolicy


def _wait(until: float) -> None:
    while time.time() < until:
        time.sleep(0.001)


def main(argv: list[str]) -> None:
    mode, url = argv[0], argv[1]
    if mode == "hold":
        ledger = Ledger(url)
        ids = []
        for _ in range(int(argv[2])):
            task = ledger.create_task(timeout_seconds=3600, name="fleet.job")
            ledger.start_task(task.id)
            ids.append(task.id)
        print(json.dumps(ids), flush=True)
        while True:
            time.sleep(60)
    elif mode == "reconcile":
        ledger = Ledger(url)
        ledger.status()  # connected before the start line
        _wait(float(argv[2]))
        report = ledger.reconcile(ReconcilePolicy(3600, 3600))
        print(json.dumps(report), flush=True)
    elif mode == "close":
        ledger = Ledger(url)
        ledger.status()
        _wait(float(argv[2]))
        won: list[str] = []
        refused = 0
        for tid in argv[3].split(","):
            try:
                ledger.close_task(tid, "succeeded", code="worker_completed")
                won.append(tid)  # closed here, or found closed succeeded (identical repeat)
            except StateConflict:
                refused += 1
        print(json.dumps({"won": won, "refused": refused}), flush=True)
    elif mode == "open":
        _wait(float(argv[2]))
        ledger = Ledger(url)
        print(json.dumps({"schema_version": ledger.schema_version}), flush=True)
    elif mode == "resume":
        ledger = Ledger(url)
        first = ledger.start_task(ledger.create_task().id)
        print(json.dumps(first.id), flush=True)
        while not os.path.exists(argv[2]):
            time.sleep(0.01)
        errors: list[str | None] = []
        for write in (lambda: ledger.heartbeat(first.id),
                      lambda: ledger.close_task(first.id, "succeeded")):
            try:
                write()
                errors.append(None)
            except LedgerError as exc:
                errors.append(type(exc).__name__)
        second = ledger.start_task(ledger.create_task().id)
        print(json.dumps({"errors": errors, "second": second.id}), flush=True)
        while True:
            time.sleep(60)
    elif mode == "fork":
        ledger = Ledger(url)
        mine, theirs = ledger.create_task(), ledger.create_task()
        ledger.start_task(mine.id)
        pid = os.fork()
        if pid == 0:
            ledger.start_task(theirs.id)  # a connection and an owner token of its own
            ledger.heartbeat(theirs.id)
            return  # a normal exit: the interpreter finalises the inherited objects too
        _, status = os.waitpid(pid, 0)
        assert ledger.get_task(mine.id).status == "running"  # the parent's session lives on
        print(json.dumps({"mine": mine.id, "theirs": theirs.id,
                          "child_exit": os.waitstatus_to_exitcode(status)}), flush=True)
        while True:
            time.sleep(60)
    else:
        raise SystemExit("unknown mode")


if __name__ == "__main__":
    main(sys.argv[1:])
