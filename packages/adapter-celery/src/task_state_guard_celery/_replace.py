"""``Task.replace()``: the replaced task's logical task follows its replacement to the end.

How Celery links a replacement to the task it replaces (``Task.replace`` in
``celery/app/task.py``): the replacement signature is frozen with the replaced task's id, so the
task that finally runs under that id is the replacement's *last* task: the signature itself, a
chain's last task, or the body of a chord (a group is turned into a chord whose body,
``celery.accumulate``, collects its results). Every message of the replacement carries
``replaced_task_nesting`` one above the replaced task's. The tasks before the last one run under
new ids: a chain's earlier tasks carry the rest of the chain (``request.chain``), a chord's
header tasks carry its body (``request.chord``); the next message is published by the task
before it (the next chain task) or by the chord's last header task to finish (the body).

The adapter follows that link, not the first message:

* when a task is replaced, and whenever a task that works for a replaced task publishes a
  message whose path leads to it (the message runs under the replaced id, or its ``chain`` or
  ``chord`` holds that id), it queues a placeholder under the replaced task's logical task: the
  replacement's attempt when the message runs under the replaced id, else a *stage* attempt for
  that message, which then carries the replaced ids in its ``tsg_replaced`` header;
* the delivery of a stage message claims its stage attempt (owned by its process, heartbeaten)
  and closes it with its own outcome. A queued or running stage keeps the replaced logical task
  open and fresh until the task under its own id runs and closes it with its outcome;
* a stage that ends without success (its task failed, hit a time limit, was lost with its pool
  child, revoked, rejected or cancelled) ends the replaced task the same way, as Celery fails
  the rest of a chain and a chord's body, and cancels what of the replacement was still queued;
  a stage that is ignored (plain ``Ignore``) ends it ``cancelled/ignored`` only when nothing of
  the replacement is still queued or running (a replaced stage has queued its own replacement);
* a stage whose worker dies with no signal is closed ``timed_out/owner_lost`` by a reconcile;
  the replaced task, with no live or queued stage left, is then judged on its own: lost, never
  ``ignored``.

A requeued stage (``Reject(requeue=True)``, an ``acks_late`` redelivery) claims a fresh stage
attempt when it comes back; until then the replaced task is judged on its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from task_state_guard.integration import AdapterRuntime, Closing, name_label
from task_state_guard.integration.replacement import Endings, job_open, replaced_endings
from task_state_guard.integration.supervisor import first_open

from ._ids import logical_task_id, replace_attempt_id, stage_attempt_id, stage_fallback_id
from ._request import REPLACED_KEY, Attempt, attempt_timeout, nesting, replaced_ids, retries

_CANVAS_KEYS = ("chain", "chord")


def _count(value: Any) -> int:
    try:
        return max(0, int(value or 0))
    except (TypeError, ValueError):
        return 0


def downstream_ids(body: Any) -> set[str]:
    """Every task id in the ``chain`` and ``chord`` a message carries (protocol 2 body)."""
    embed = body[2] if isinstance(body, list | tuple) and len(body) == 3 else None
    if not isinstance(embed, dict):
        return set()
    found: set[str] = set()
    stack: list[Any] = [embed.get(key) for key in _CANVAS_KEYS]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            options = item.get("options")
            if isinstance(options, dict):
                task_id = options.get("task_id")
                if isinstance(task_id, str) and task_id:
                    found.add(task_id)
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return found


class ReplaceLinks:
    """Follows ``Task.replace()`` replacements for one guard (see the module docstring)."""

    def __init__(self, runtime: AdapterRuntime, app: Any) -> None:
        self.rt = runtime
        self.app = app

    # ------------------------------------------------------------------ publishing

    def on_publish(self, ctx: Any, att: Attempt, headers: dict[str, Any], body: Any) -> None:
        """A message published while the task of ``ctx`` runs: queue what it stands for."""
        depth = _count(headers.get("replaced_task_nesting"))
        linked = list(att.stages)
        celery_id = getattr(ctx, "id", None)
        if isinstance(celery_id, str) and celery_id and depth > nesting(ctx):
            linked.append(celery_id)  # this task is being replaced by what it publishes
        target = headers.get("id")
        if not linked or not isinstance(target, str) or not target:
            return
        downstream: set[str] | None = None
        carried: list[str] = []
        for replaced in linked:
            if target == replaced:
                if depth > 0:  # the replacement's last task, under the replaced id
                    self._queue(replace_attempt_id(replaced, depth), replaced, headers)
                continue
            if downstream is None:
                downstream = downstream_ids(body)
            if replaced in downstream:
                carried.append(replaced)
                placeholder = stage_attempt_id(
                    replaced, target, _count(headers.get("retries")), depth
                )
                self._queue(placeholder, replaced, headers)
        if carried:
            headers[REPLACED_KEY] = carried

    def _queue(self, attempt_id: str, replaced: str, headers: Mapping[str, Any]) -> None:
        task = self.app.tasks.get(headers.get("task"))
        self.rt.queue_attempt(
            attempt_id,
            logical_task_id(replaced),
            name=name_label(headers.get("task")),
            timeout_seconds=attempt_timeout(task) if task is not None else None,
        )

    def queue_retry(self, ctx: Any, celery_id: str, task: Any) -> None:
        """A retry published by the main process (``retry_on_worker_lost``): queue its stages."""
        for replaced in self.waiting(ctx, celery_id):
            self.rt.queue_attempt(
                stage_attempt_id(replaced, celery_id, retries(ctx) + 1, nesting(ctx)),
                logical_task_id(replaced),
                name=name_label(getattr(task, "name", None)),
                timeout_seconds=attempt_timeout(task),
            )

    # ------------------------------------------------------------------ executing

    def waiting(self, ctx: Any, celery_id: str) -> list[str]:
        """The replaced tasks still open that this delivery works for (read before the prerun
        transaction: the ledger reads outside of it)."""
        return [
            replaced  # a closed one (an earlier stage failed) waits no more
            for replaced in dict.fromkeys(replaced_ids(ctx))
            if replaced != celery_id and job_open(self.rt, logical_task_id(replaced))
        ]

    @staticmethod
    def stages(ctx: Any, celery_id: str, waiting: Iterable[str]) -> dict[str, tuple[str, str]]:
        """The stage attempts this delivery claims under the ``waiting`` replaced tasks: Celery
        id -> (the replaced logical task, the stage placeholder queued for this message)."""
        return {
            replaced: (
                logical_task_id(replaced),
                stage_attempt_id(replaced, celery_id, retries(ctx), nesting(ctx)),
            )
            for replaced in waiting
        }

    @staticmethod
    def stage_closings(stages: Mapping[str, str], status: str, code: str) -> list[Closing]:
        """Closes of a delivery's stage attempts, with the delivery's own outcome."""
        return [(stage, status, code, True) for stage in stages.values()]

    def end_replaced(self, replaced: Iterable[str], status: str, code: str) -> Endings:
        """Closes that end replaced tasks whose replacement ended without success (see
        :func:`~task_state_guard.integration.replacement.replaced_endings`). Reads the ledger:
        call it outside of a transaction."""
        return replaced_endings(self.rt, map(logical_task_id, replaced), (status, code))

    # ------------------------------------------------------------------ main process

    def delivery_stages(self, ctx: Any, celery_id: str, attempt: str | None) -> dict[str, str]:
        """The open stage attempts of one delivery, as the main process can find them."""
        stages: dict[str, str] = {}
        for replaced in replaced_ids(ctx):
            candidates = [stage_attempt_id(replaced, celery_id, retries(ctx), nesting(ctx))]
            if attempt is not None:
                candidates.insert(0, stage_fallback_id(replaced, attempt))
            found = first_open(self.rt, candidates)
            if found is not None:
                stages[replaced] = found
        return stages

    def end_delivery(
        self,
        ctx: Any,
        celery_id: str,
        attempt: str | None,
        status: str,
        code: str,
        *,
        settle: bool,
        where: str,
    ) -> None:
        """A delivery ended in the main process: close its stages; with ``settle`` (the task
        itself ended, and not in success) also end the replaced tasks waiting on it."""
        replaced = replaced_ids(ctx)
        if not replaced:
            return
        stages = self.delivery_stages(ctx, celery_id, attempt)
        closings = self.stage_closings(stages, status, code)
        skipped: frozenset[str] = frozenset()
        if settle:
            endings = self.end_replaced(replaced, status, code)
            closings += endings.closings
            skipped = endings.if_queued
        self.rt.close_tasks(closings, where=where, if_queued=skipped)


__all__ = ["ReplaceLinks", "downstream_ids"]
