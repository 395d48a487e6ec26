"""Walk through the TaskStateGuard LangGraph adapter with the support agent.

    .venv/bin/python examples/langgraph_agent/run.py [--dir DIR]

1. a question: one invocation, one child per node attempt; the reply is delivered;
2. a refund: the graph stops at interrupt(); the question to the human is the delivery;
3. the human answers: the resume is a new invocation linked to the interrupted one;
4. a crash: a child process is SIGKILLed inside ``refund``; a new process starts the guard
   (the lost records become timed_out/owner_lost) and ``recover()`` finishes the thread.

Everything lives in a fresh private temporary directory unless ``--dir`` is given.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from langgraph.types import Command

sys.path.insert(0, str(Path(__file__).resolve().parent))

from agent import CRASH_FLAG_ENV, build
from task_state_guard_langgraph import guard


def show(ledger: Any, task_id: str, depth: int = 0) -> None:
    task = ledger.get_task(task_id)
    code = f"/{task.terminal_code}" if task.terminal_code else ""
    kind = "invocation" if task.delivery_required else "attempt"
    delivery = f"  delivery={task.delivery_status}" if task.delivery_required else ""
    print(f"    {'  ' * depth}{task.name} [{kind}] {task.status}{code}{delivery}")
    for child in sorted(ledger.children_of(task_id), key=lambda t: t.created_at):
        show(ledger, child.id, depth + 1)


def send_to_user(text: str) -> bool:
    """Stand-in for your transport (chat message, e-mail...); True = acknowledged."""
    print(f"    -> user: {text}")
    return True


def crash_child(work: Path) -> None:
    """Run the refund conversation in a child process that dies inside ``refund``."""
    code = (
        "import sys; sys.path.insert(0, sys.argv[1])\n"
        "from agent import build\n"
        "from langgraph.types import Command\n"
        "from task_state_guard_langgraph import guard\n"
        "app = guard(build(sys.argv[2]), db=sys.argv[3])\n"
        "cfg = {'configurable': {'thread_id': 'order-77'}}\n"
        "app.invoke({'request': 'refund order 77'}, cfg, invocation_id='req-4',"
        " durability='sync')\n"
        "app.invoke(Command(resume=True), cfg, invocation_id='req-5', durability='sync')\n"
    )
    flag = work / "crash-once"
    flag.write_text("")
    env = dict(os.environ, **{CRASH_FLAG_ENV: str(flag)})
    here = str(Path(__file__).resolve().parent)
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            here,
            str(work / "checkpoints.sqlite"),
            str(work / "tasks.sqlite"),
        ],
        env=env,
        check=False,
    )
    print(f"    child process exit status: {proc.returncode} (SIGKILL = -9)")


def main() -> None:
    parser = argparse.ArgumentParser(description="TaskStateGuard LangGraph agent demo")
    parser.add_argument("--dir", help="directory for the ledger and checkpoints")
    args = parser.parse_args()
    if args.dir:
        work = Path(args.dir)
        work.mkdir(mode=0o700, parents=True, exist_ok=True)
        run(work)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            run(Path(tmp))


def run(work: Path) -> None:
    db = str(work / "tasks.sqlite")
    app = guard(build(str(work / "checkpoints.sqlite")), db=db)

    print("1. a question")
    cfg = {"configurable": {"thread_id": "chat-1"}}
    out = app.invoke({"request": "What are your hours?"}, cfg, invocation_id="req-1")
    if send_to_user(out["reply"]):
        app.mark_delivered("req-1")
    show(app.ledger, app.logical_task_id("req-1"))

    print("2. a refund needs a human: interrupt()")
    cfg = {"configurable": {"thread_id": "order-42"}}
    out = app.invoke({"request": "Please refund order 42"}, cfg, invocation_id="req-2")
    question = out["__interrupt__"][0].value["question"]
    if send_to_user(question):  # the interrupted invocation delivers the question
        app.mark_delivered("req-2")
    show(app.ledger, app.logical_task_id("req-2"))

    print("3. the human approves: resume with Command(resume=True)")
    out = app.invoke(Command(resume=True), cfg, invocation_id="req-3")
    if send_to_user(out["reply"]):
        app.mark_delivered("req-3")
    show(app.ledger, app.logical_task_id("req-2"))  # req-3 is recorded under req-2
    app.close()

    print("4. crash: a worker process is SIGKILLed inside 'refund'")
    crash_child(work)
    app = guard(build(str(work / "checkpoints.sqlite")), db=db)  # reconciles at start-up
    print(f"    reconcile on start-up: {json.dumps(app.last_reconcile, sort_keys=True)}")
    show(app.ledger, app.logical_task_id("req-5"))
    for rec in app.recover(durability="sync"):
        print(f"    recovered thread {rec.thread_id}: {rec.outcome}")
        state = app.get_state({"configurable": {"thread_id": rec.thread_id}})
        if send_to_user(state.values["reply"]):
            app.mark_delivered(rec.invocation_id)
    show(app.ledger, app.logical_task_id("req-5"))
    print(f"    doctor: {json.dumps(app.ledger.doctor(), sort_keys=True)}")
    print(f"    ledger errors: {app.stats()['errors']}")
    app.close()


if __name__ == "__main__":
    main()
