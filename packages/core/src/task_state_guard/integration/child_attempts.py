"""Child attempts: attempts that begin under a task that is running already, in this process.

A job whose steps run inside it (a LangGraph invocation's node attempts, and the nodes of a
subgraph under the node attempt that runs it) records each step as an attempt under the
running task, with an id of its own choosing. Such an adapter

* begins each step with :func:`begin_child`: one write, committed before the step runs, that
  may carry the closes of the steps that ended since the last write (their closes wait for the
  next boundary, so a step costs one write, not two); the attempt is held (heartbeaten) from
  then on;
* releases an attempt as soon as it ends (``runtime.release``), keeping its close for the next
  :func:`begin_child`, or for :func:`end_tasks`;
* ends with :func:`end_tasks`: the steps still open and the job itself, closed in one write.

An adapter that keeps its steps as history (recorded after they ran, not before) writes
steps that started and ended since its last write with :func:`end_with_history`: recorded and
closed in the write that closes the others.

Both functions work on an :class:`~task_state_guard.integration.AdapterRuntime` through its
public methods only, for any adapter.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..model import StateConflict
from .attempts import AttemptSpec
from .closing import Closing, Queued
from .runtime import AdapterRuntime


def begin_child(
    runtime: AdapterRuntime,
    parent_id: str,
    attempt_id: str,
    *,
    name: str | None,
    ended: Sequence[Closing] = (),
    owner: bool = True,
    where: str = "close",
) -> str:
    """Begin the attempt ``attempt_id`` under ``parent_id`` (a task that is running already)
    and hold it until it is released; returns its id.

    ``ended``: closes of tasks that ended since the last write (innermost first; see
    ``AdapterRuntime.close_tasks``), released here and committed in the same write, before the
    start. With ``owner`` the attempt is owned by this process and the write is one
    transaction on SQLite and one statement on PostgreSQL (``AdapterRuntime.close_and_claim``,
    or ``claim_attempt`` when nothing ended); without, it is one transaction (``close_tasks``
    and ``start_task`` with no owner).

    A refused close is counted as ``close_tasks`` does (under ``where``) and never undoes the
    start. A refused start raises why (``StateConflict``: ``attempt_id`` exists and is no
    longer queued; ``TaskNotFound``: ``parent_id`` does not exist); the closes are committed
    all the same. When the shared write itself fails (nothing was written), the closes are
    written on their own, then the start on its own, which raises its own error if it fails too.
    """
    if ended:
        runtime.release(*(closing[0] for closing in ended))
    if not owner:
        _start_unowned(runtime, parent_id, attempt_id, name, ended, where)
        runtime.hold(attempt_id)
        return attempt_id
    begun: str | None = None
    spec = AttemptSpec(parent_id, name, attempt_id=attempt_id)
    if ended:
        try:
            begun = runtime.close_and_claim(ended, spec, where=where)
        except Exception:
            runtime.close_tasks(ended, where=where)  # nothing was written: the closes alone
    if begun is None:
        # Nothing ended, the shared write failed, or it refused the start: the start alone
        # (a refusal is explained by the error it raises).
        begun = runtime.claim_attempt(spec)
    runtime.hold(begun)
    return begun


def _start_unowned(
    runtime: AdapterRuntime,
    parent_id: str,
    attempt_id: str,
    name: str | None,
    ended: Sequence[Closing],
    where: str,
) -> None:
    def start() -> None:
        runtime.start_task(
            attempt_id, parent_id=parent_id, delivery_required=False, name=name, owner=False
        )

    if not ended:
        start()
        return
    refused: StateConflict | None = None
    try:
        with runtime.ledger.atomic():
            runtime.close_tasks(ended, where=where)
            try:
                start()
            except StateConflict as exc:  # the closes still commit
                refused = exc
    except Exception:
        runtime.close_tasks(ended, where=where)  # nothing was written: the closes alone
        start()
    if refused is not None:
        raise refused


def end_tasks(
    runtime: AdapterRuntime, closings: Sequence[Closing], *, where: str = "close"
) -> int:
    """Release the tasks of ``closings`` and close them in one write, innermost first (a job's
    ended and leftover child attempts, then the job itself); returns how many were closed.
    Refused closes and errors are handled as ``AdapterRuntime.close_tasks`` does."""
    if not closings:
        return 0
    runtime.release(*(closing[0] for closing in closings))
    return runtime.close_tasks(closings, where=where)


def end_with_history(
    runtime: AdapterRuntime,
    queue: Sequence[Queued],
    closings: Sequence[Closing],
    *,
    where: str = "close",
) -> int:
    """Record the attempts of ``queue`` (``(attempt_id, parent_id, name, timeout_seconds)``,
    in order: a parent before its children) and close ``closings`` (innermost first) in one
    write; an attempt of ``queue`` that ``closings`` closes is recorded closed, never started
    (the ledger claims no start time it does not know). Returns how many tasks were closed;
    refused steps and errors are handled as ``AdapterRuntime.close_tasks`` does.

    Both backends write it as one *end attempt* (PostgreSQL, whose statements see no row they
    insert themselves, as one transaction of a statement per nesting depth of ``queue`` and
    one for the closes). Releases nothing: the caller releases the tasks it held first."""
    return runtime.close_tasks(closings, where=where, queue=queue)


__all__ = ["begin_child", "end_tasks", "end_with_history"]
