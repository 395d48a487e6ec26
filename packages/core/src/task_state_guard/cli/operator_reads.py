"""The CLI's per-task reads for operators: ``get``, ``children`` and ``tasks``.

JSON (the default) keeps the earlier outputs byte for byte: ``get`` adds ``events`` only with
``--events``, ``tasks`` prints ``task_ids`` unless rows are asked for (``--details``, or
``--format text``, which renders the same rows as a table). These outputs carry ids on purpose.
``--celery``/``--dramatiq``/``--langgraph ID`` name a job by its framework id instead of a
ledger id; the CLI has already turned it into the ledger id (``args.task_id``), and prints
only what the ledger holds (a framework id only where one is stored), never the typed id.
Without them, the id of ``get``/``children`` is a ledger id or the job id of any framework
(one task, else ``TaskNotFound``, or ``ambiguous_id`` when it names several).
``get --langgraph ID`` that names no invocation shows the latest run of LangGraph thread
``ID`` (and ``thread_runs``, the ids of its runs); ``tasks --thread ID`` lists a thread's runs.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from ..ledger import Ledger
from ..model import TaskNotFound, is_valid_thread_id
from ..ops.task_list import DEFAULT_LIMIT
from . import text as cli_text


def run(ledger: Ledger, args: argparse.Namespace, values: dict[str, Any]) -> dict[str, Any] | str:
    """Run ``get``, ``children`` or ``tasks``; a dict is printed as JSON, a str as it is."""
    text = args.format == "text"
    if getattr(args, "any_id", False):  # `get ID`: a ledger id, or a job id of any framework
        from ..integration.lookup import find_any

        args.task_id = find_any(ledger, args.task_id).id
    if args.command == "get":
        task_id, runs = _get_target(ledger, args)
        task = ledger.get_task(task_id)
        events = ledger.events_of(task_id) if args.events else None
        if text:
            return cli_text.task_detail(task, time.time(), events)
        out: dict[str, Any] = {"ok": True, "task": task.to_dict(extras=args.extras)}
        if runs is not None:
            out["thread_runs"] = runs
        if events is not None:
            out["events"] = [event.to_dict() for event in events]
        return out
    if args.command == "children":
        children = ledger.children_of(args.task_id)
        if text:
            return cli_text.children(children, time.time())
        return {"ok": True, "children": [t.to_dict(extras=args.extras) for t in children]}
    if not values["rows"]:
        ids = ledger.find_task_ids(
            args.status, stale_seconds=values["stale"], limit=values["limit"],
            name=args.name, older_than_seconds=values["older"], task_id=args.task_id,
            thread_id=args.thread,
        )
        return {"ok": True, "task_ids": ids}
    listing = ledger.list_tasks(
        status=args.status, name=args.name, attempts=bool(args.attempts),
        stale_seconds=values["stale"], older_than_seconds=values["older"],
        limit=values["limit"] or DEFAULT_LIMIT, task_id=args.task_id,
        contradicted=bool(args.contradicted), thread_id=args.thread,
    )
    if text:
        return cli_text.listing(listing, attempts=bool(args.attempts))
    return {"ok": True, "more": listing.more, "tasks": [item.to_dict() for item in listing.tasks]}


def _get_target(ledger: Ledger, args: argparse.Namespace) -> tuple[str, list[str] | None]:
    """The ledger id ``get`` shows: the one named; for ``--langgraph ID`` that names no
    invocation, the latest run recorded on thread ``ID``, with the ids of all its runs
    (oldest first). A thread with no run is the invocation's ``TaskNotFound``."""
    thread = getattr(args, "thread_of_job", None)
    if thread is None or not is_valid_thread_id(thread):
        return args.task_id, None
    try:
        ledger.get_task(args.task_id)
    except TaskNotFound:
        runs = ledger.find_task_ids(None, thread_id=thread)
        if runs:
            return runs[-1], runs
        raise
    return args.task_id, None
