"""The CLI's per-task reads for operators: ``get``, ``children`` and ``tasks``.

JSON (the default) keeps the earlier outputs byte for byte: ``get`` adds ``events`` only with
``--events``, ``tasks`` prints ``task_ids`` unless rows are asked for (``--details``, or
``--format text``, which renders the same rows as a table). These outputs carry ids on purpose.
``--celery``/``--dramatiq``/``--langgraph ID`` name a job by its framework id instead of a
ledger id; the CLI has already turned it into the ledger id (``args.task_id``), and prints
only what the ledger holds (a framework id only where one is stored), never the typed id.
Without them, the id of ``get``/``children`` is a ledger id or the job id of any framework
(one task, else ``TaskNotFound``, or ``ambiguous_id`` when it names several).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from ..ledger import Ledger
from ..ops.task_list import DEFAULT_LIMIT
from . import text as cli_text


def run(ledger: Ledger, args: argparse.Namespace, values: dict[str, Any]) -> dict[str, Any] | str:
    """Run ``get``, ``children`` or ``tasks``; a dict is printed as JSON, a str as it is."""
    text = args.format == "text"
    if getattr(args, "any_id", False):  # `get ID`: a ledger id, or a job id of any framework
        from ..integration.lookup import find_any

        args.task_id = find_any(ledger, args.task_id).id
    if args.command == "get":
        task = ledger.get_task(args.task_id)
        events = ledger.events_of(args.task_id) if args.events else None
        if text:
            return cli_text.task_detail(task, time.time(), events)
        out: dict[str, Any] = {"ok": True, "task": task.to_dict(extras=args.extras)}
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
        )
        return {"ok": True, "task_ids": ids}
    listing = ledger.list_tasks(
        status=args.status, name=args.name, attempts=bool(args.attempts),
        stale_seconds=values["stale"], older_than_seconds=values["older"],
        limit=values["limit"] or DEFAULT_LIMIT, task_id=args.task_id,
        contradicted=bool(args.contradicted),
    )
    if text:
        return cli_text.listing(listing, attempts=bool(args.attempts))
    return {"ok": True, "more": listing.more, "tasks": [item.to_dict() for item in listing.tasks]}
