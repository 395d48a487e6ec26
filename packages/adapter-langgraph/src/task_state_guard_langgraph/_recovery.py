"""Crash recovery: resume the checkpointer threads whose last invocation was lost."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from task_state_guard.integration import codes as c

from ._ids import logical_task_id, recovery_invocation_id
from ._invocation import METADATA_KEY, Invocation
from ._threads import athread_ids, thread_ids
from .callbacks import logger

if TYPE_CHECKING:
    from ._recorder import Recorder


@dataclass(frozen=True)
class Recovery:
    """One thread handled by :meth:`GuardedGraph.recover`."""

    thread_id: str
    #: Invocation id of the new (recovering) invocation.
    invocation_id: str
    #: Invocation id of the lost invocation it recovers (its ledger parent).
    recovers: str
    #: ``"succeeded"``, ``"interrupted"``, ``"failed"`` or ``"cancelled"``.
    outcome: str
    #: Exception class name when the resumed run raised (the run's error is not re-raised).
    error: str | None = None


class RecoveryMixin:
    """``recover()``/``arecover()`` of :class:`~task_state_guard_langgraph.GuardedGraph`."""

    _graph: Any
    _rec: Recorder

    if TYPE_CHECKING:  # provided by GuardedGraph
        _begin: Callable[..., Invocation | None]
        _end: Callable[..., None]

        @property
        def ledger(self) -> Any: ...

        @property
        def last_outcome(self) -> str | None: ...

    def _thread_ids(self, saver: Any) -> list[str]:
        if self._nothing_lost():
            return []
        return thread_ids(saver)

    def _nothing_lost(self) -> bool:
        """True when the ledger holds no ``timed_out`` task at all: no invocation can be lost,
        so the checkpointer is not read."""
        ledger = self.ledger
        return ledger is not None and not ledger.find_task_ids(c.TIMED_OUT, limit=1)

    def _lost_from_checkpoint(self, tup: Any) -> str | None:
        """The lost invocation id recorded in a thread's latest checkpoint, if it is lost."""
        if tup is None:
            return None
        lost = (tup.metadata or {}).get(METADATA_KEY)
        if lost is None:
            return None  # never ran under the guard: no proof it is not running elsewhere
        task = self._rec.get(logical_task_id(str(lost)))
        if task is None or task.status != c.TIMED_OUT:
            return None  # unknown, or still running / closed by its own process
        return str(lost)

    @staticmethod
    def _resumable(state: Any) -> bool:
        if not state.next:
            return False  # the thread finished
        # A pending interrupt waits for a human; a failed task is not a crash.
        return not any(t.interrupts or t.error is not None for t in state.tasks)

    def _lost_invocation(self, saver: Any, thread_id: str) -> str | None:
        """Invocation id of the thread's last invocation when it is lost and resumable."""
        lookup = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
        lost = self._lost_from_checkpoint(saver.get_tuple(lookup))
        if lost is None:
            return None
        state = self._graph.get_state({"configurable": {"thread_id": thread_id}})
        return lost if self._resumable(state) else None

    async def _alost_invocation(self, saver: Any, thread_id: str) -> str | None:
        lookup = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
        try:
            tup = await saver.aget_tuple(lookup)
        except NotImplementedError:
            tup = saver.get_tuple(lookup)
        lost = self._lost_from_checkpoint(tup)
        if lost is None:
            return None
        state = await self._graph.aget_state({"configurable": {"thread_id": thread_id}})
        return lost if self._resumable(state) else None

    async def _athread_ids(self, saver: Any) -> list[str]:
        if await asyncio.to_thread(self._nothing_lost):
            return []
        return await athread_ids(saver)

    def _claim(
        self, config: dict[str, Any] | None, thread_id: str, lost: str
    ) -> tuple[Invocation, str] | None:
        """Start the recovering invocation of ``lost`` (None: another process claimed it)."""
        base = dict(config or {})
        base["configurable"] = {**(base.get("configurable") or {}), "thread_id": thread_id}
        new_id = recovery_invocation_id(lost)
        run = self._begin(None, base, new_id, lost, claim=True)
        return None if run is None else (run, new_id)

    def _resumed(
        self,
        run: Invocation,
        thread_id: str,
        new_id: str,
        lost: str,
        exc: Exception | None,
        out: Any,
    ) -> Recovery:
        """Close the recovering invocation; its error is reported, not raised."""
        self._end(run, exc, out)
        error = None if exc is None else type(exc).__name__
        if error is not None:
            logger.warning("recovery: the resumed run raised %s", error)
        return Recovery(thread_id, new_id, lost, str(self.last_outcome), error)

    def recover(
        self,
        config: dict[str, Any] | None = None,
        *,
        thread_ids: list[str] | None = None,
        **kwargs: Any,
    ) -> list[Recovery]:
        """Resume the threads whose last invocation was lost in a crash.

        Reconciles the ledger first (a dead owner's invocation becomes
        ``timed_out/owner_lost``), then, for every checkpointer thread whose last checkpoint
        was written by an invocation the ledger shows ``timed_out`` and that still has work
        (not finished, not waiting at an interrupt, not failed), runs ``invoke(None, ...)`` as
        a new invocation with id :func:`recovery_invocation_id` (lost id), recorded as a child
        of the lost invocation. Two processes recovering at once: only one wins each thread.
        ``config`` (callbacks, tags...) and ``kwargs`` (e.g. ``durability``) are passed to
        every resumed run. Errors of a resumed run are reported in the result, not raised.
        """
        saver = getattr(self._graph, "checkpointer", None)
        if saver is None or isinstance(saver, bool) or self.ledger is None:
            return []
        self._rec.rt.guarded_reconcile("reconcile")
        ids = thread_ids
        if ids is None:
            ids = self._rec.rt.policy.call("recover", lambda: self._thread_ids(saver)) or []
        results: list[Recovery] = []
        for thread_id in ids:
            lost = self._rec.rt.policy.call(
                "recover", partial(self._lost_invocation, saver, thread_id)
            )
            if lost is None:
                continue
            claimed = self._claim(config, thread_id, lost)
            if claimed is None:
                continue  # another process claimed this recovery
            run, new_id = claimed
            try:
                out = self._graph.invoke(None, run.config, **kwargs)
            except Exception as exc:
                results.append(self._resumed(run, thread_id, new_id, lost, exc, None))
            else:
                results.append(self._resumed(run, thread_id, new_id, lost, None, out))
        return results

    async def arecover(
        self,
        config: dict[str, Any] | None = None,
        *,
        thread_ids: list[str] | None = None,
        **kwargs: Any,
    ) -> list[Recovery]:
        """Async :meth:`recover` (for async checkpointers such as ``AsyncSqliteSaver``):
        same selection and claims, each thread resumed with ``ainvoke(None, ...)``."""
        saver = getattr(self._graph, "checkpointer", None)
        if saver is None or isinstance(saver, bool) or self.ledger is None:
            return []
        self._rec.rt.guarded_reconcile("reconcile")
        errors = self._rec.rt.policy
        ids = thread_ids
        if ids is None:
            try:
                ids = await self._athread_ids(saver)
            except Exception as exc:
                errors.error("recover", exc)
                ids = []
        results: list[Recovery] = []
        for thread_id in ids:
            try:
                lost = await self._alost_invocation(saver, thread_id)
            except Exception as exc:
                errors.error("recover", exc)
                continue
            if lost is None:
                continue
            claimed = self._claim(config, thread_id, lost)
            if claimed is None:
                continue
            run, new_id = claimed
            try:
                out = await self._graph.ainvoke(None, run.config, **kwargs)
            except Exception as exc:
                results.append(self._resumed(run, thread_id, new_id, lost, exc, None))
            else:
                results.append(self._resumed(run, thread_id, new_id, lost, None, out))
        return results
