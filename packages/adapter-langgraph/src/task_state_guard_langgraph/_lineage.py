"""Which invocation last ran a thread: read from the thread's checkpoints, then the ledger.

Every checkpoint a guarded run writes names its invocation in its metadata (``METADATA_KEY``);
a checkpoint written by ``update_state`` through the guarded graph names the invocation whose
state it edits. An invocation that continues a thread (input ``None`` or a ``Command``, a
recovery, a run with ``durability="exit"``) is recorded as a child of the invocation named by
the thread's latest checkpoint, so one that died before writing a checkpoint of its own is
found in the ledger only. The thread's last invocation (its *head*) is therefore: the
invocation the latest checkpoint names (walking back over hand edits that name none), then,
while it has continuations, its latest continuation.

The checkpointer gives the thread, the ledger the invocations; each invocation is also recorded
with its thread id, which reports the lost runs no checkpoint leads to with their thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, cast

from task_state_guard import Task
from task_state_guard.integration import codes as c

from ._ids import logical_task_id, recovery_id_for_task

#: Key under ``config["metadata"]`` (and so in every checkpoint's metadata) that holds the
#: invocation id. Deliberately not ``run_id``: LangGraph treats a repeated metadata
#: ``run_id`` as re-entry and ignores new input.
METADATA_KEY = "tsg_invocation_id"

#: Checkpoint sources written by edits (``update_state``, ``bulk_update_state``, forks): a
#: checkpoint of these without an invocation id continues the lineage of its parent.
EDIT_SOURCES = frozenset({"update", "fork"})
_MAX_EDITS = 32
_MAX_CONTINUATIONS = 256


@dataclass(frozen=True)
class Link:
    """One invocation of a thread's lineage: its ledger record, and its invocation id when
    known (the one the checkpoint names, a recovery's derived id, or a canonical UUID the
    ledger stored)."""

    task: Task
    invocation_id: str | None


@dataclass(frozen=True)
class Head:
    """A thread's lineage from the invocation its latest checkpoint names down to its last
    invocation (the head: ``task``, ``invocation_id``)."""

    path: tuple[Link, ...]

    @property
    def task(self) -> Task:
        return self.path[-1].task

    @property
    def invocation_id(self) -> str | None:
        return self.path[-1].invocation_id


def _named(tup: Any) -> str | None:
    value = (tup.metadata or {}).get(METADATA_KEY)
    return None if value is None else str(value)


def _edit_parent(tup: Any) -> Any:
    """The parent checkpoint's config when ``tup`` is an edit naming no invocation."""
    metadata = tup.metadata or {}
    if metadata.get(METADATA_KEY) is None and metadata.get("source") in EDIT_SOURCES:
        return tup.parent_config
    return None


def _invocation_of(tup: Any) -> Generator[Any, Any, str | None]:
    """The walk of :func:`checkpoint_invocation`: yields the config of each parent checkpoint
    it needs, and is sent that checkpoint (the saver's sync or async read)."""
    for _ in range(_MAX_EDITS):
        if tup is None:
            return None
        named = _named(tup)
        parent = _edit_parent(tup)
        if named is not None or parent is None:
            return named
        tup = yield parent
    return None


def checkpoint_invocation(saver: Any, tup: Any) -> str | None:
    """The invocation a thread's latest checkpoint ``tup`` belongs to (``None``: the thread
    never ran under the guard). Edits made on the raw graph name none: their parents are read
    until one does."""
    walk = _invocation_of(tup)
    try:
        parent = next(walk)
        while True:
            parent = walk.send(saver.get_tuple(parent))
    except StopIteration as done:
        return cast("str | None", done.value)


async def acheckpoint_invocation(saver: Any, tup: Any) -> str | None:
    """:func:`checkpoint_invocation` with the saver's async reads."""
    walk = _invocation_of(tup)
    try:
        parent = next(walk)
        while True:
            parent = walk.send(await aget_tuple(saver, parent))
    except StopIteration as done:
        return cast("str | None", done.value)


async def aget_tuple(saver: Any, config: Any) -> Any:
    """``saver.aget_tuple(config)``; a saver without async reads is read in a worker thread."""
    try:
        return await saver.aget_tuple(config)
    except NotImplementedError:
        return await asyncio.to_thread(saver.get_tuple, config)


def thread_head(
    get: Callable[[str], Task | None],
    children: Callable[[str], list[Task]],
    named: str,
) -> Head | None:
    """The head of the thread whose latest checkpoint names ``named`` (ledger reads only;
    ``None`` when the ledger does not know that invocation)."""
    task = get(logical_task_id(named))
    if task is None:
        return None
    path = [Link(task, named)]
    for _ in range(_MAX_CONTINUATIONS):
        if task.status in c.ACTIVE:
            break  # a live process runs it (a reconcile just kept it)
        later = [t for t in children(task.id) if t.delivery_required]
        if not later:
            break
        following = later[-1]
        recovery = recovery_id_for_task(task.id)
        known = recovery if logical_task_id(recovery) == following.id else following.framework_id
        task = following
        path.append(Link(task, known))
    return Head(tuple(path))


def resume_pending(tup: Any) -> bool:
    """True when a ``Command(resume=...)`` value is saved with the checkpoint but its run died
    before using it: ``invoke(None)`` resumes with it, past the interrupt."""
    return any(write[1] == "__resume__" for write in (getattr(tup, "pending_writes", None) or ()))


__all__ = [
    "EDIT_SOURCES",
    "METADATA_KEY",
    "Head",
    "Link",
    "acheckpoint_invocation",
    "aget_tuple",
    "checkpoint_invocation",
    "resume_pending",
    "thread_head",
]
