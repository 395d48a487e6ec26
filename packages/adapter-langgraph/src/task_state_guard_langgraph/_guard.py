"""The guarded graph: a compiled LangGraph graph whose invocations are recorded in the ledger.

:func:`~._install.guard` creates it. The class keeps the public surface; the work is done by
the objects it holds: :class:`~._runs.Runs` (each run's start and end), :class:`~._edits.Lineage`
(the lineage reads of continuing runs and state edits), the recovery pass (:mod:`._recovery`,
over a :class:`~._recovery_types.RecoveryScope`) and its background runner (:mod:`._runner`).
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncGenerator, Generator, Sequence
from typing import Any, cast

from langchain_core.runnables import RunnableConfig
from langchain_core.runnables.config import merge_configs
from task_state_guard import Ledger, Task
from task_state_guard.integration import AdapterRuntime, AdapterSurface
from task_state_guard.integration import codes as c

from . import _batch
from ._delivery import settle_recovered_by
from ._edits import Lineage
from ._ids import INVOCATIONS, logical_task_id
from ._recorder import Recorder
from ._recovery import arecover_pass, recover_pass
from ._recovery_resume import drain
from ._recovery_types import PassArgs, RecoveredHook, RecoveryReport, RecoveryScope
from ._retries import RetryOracle
from ._runner import STOP_SECONDS, RecoveryRunner
from ._runner import start as start_runner
from ._runs import Runs, controlled

#: The framework label of this adapter's invocations (their lost verdicts are owed to it).
FRAMEWORK = "langgraph"
#: How long :meth:`GuardedGraph.aclose` lets cancelled callers close their own runs.
CLOSE_GRACE = 1.0

__all__ = ["FRAMEWORK", "GuardedGraph"]


class GuardedGraph(AdapterSurface):
    """A compiled graph whose invocations and node attempts are recorded in the ledger.

    Create it with :func:`guard`. ``invoke``/``ainvoke``/``stream``/``astream`` take the same
    arguments as the compiled graph plus an optional ``invocation_id``; every other attribute
    (``get_state``, ``update_state``, ``nodes``...) is the compiled graph's.
    ``mark_delivered``, ``mark_delivery_failed``, ``reconcile``, ``stats`` and ``settings`` are
    the core's :class:`~task_state_guard.integration.AdapterSurface` (one meaning in every
    adapter); the ids are invocation ids.
    """

    adapter_name = FRAMEWORK
    id_scheme = INVOCATIONS

    def __init__(
        self,
        graph: Any,
        recorder: Recorder,
        *,
        name: str | None,
        record_nodes: bool = True,
    ) -> None:
        self._graph = graph
        self._rec = recorder
        self._lineage = Lineage(graph, recorder)
        self.runtime: AdapterRuntime = recorder.rt
        label = name if name is not None else getattr(graph, "name", None)
        self._runs = Runs(recorder, RetryOracle(graph), name=label, record_nodes=record_nodes)
        self._defaults: dict[str, Any] = {}
        # Shared with every with_config() copy: per process, not per view.
        self._seen_cancelled: set[str] = set()
        self._recovery_controls: set[Any] = set()
        self._runners: list[RecoveryRunner] = []
        self.on_recovered: RecoveredHook | None = None

    def _merged(self, config: dict[str, Any] | None) -> dict[str, Any] | None:
        if not self._defaults:
            return config
        return dict(merge_configs(cast(RunnableConfig, self._defaults), cast(Any, config)))

    def with_config(self, config: dict[str, Any] | None = None, **kwargs: Any) -> GuardedGraph:
        """A guarded graph whose runs merge ``config`` (and ``kwargs``: ``tags``,
        ``callbacks``, ``configurable``...) into the config of every call, like
        ``Runnable.with_config``; it shares this one's ledger, threads and counters."""
        bound = copy.copy(self)
        bound._runs = self._runs.view()
        merged = merge_configs(
            cast(RunnableConfig, self._defaults), cast(Any, {**(config or {}), **kwargs})
        )
        bound._defaults = dict(merged)
        return bound

    # -- pass-through -----------------------------------------------------------------------

    @property
    def graph(self) -> Any:
        """The wrapped compiled graph (calls on it are not recorded)."""
        return self._graph

    @property
    def ledger(self) -> Ledger | None:
        """The ledger (``None`` when it cannot be opened)."""
        return self._rec.rt.ledger_or_none()

    @property
    def last_reconcile(self) -> dict[str, Any] | None:
        """The report of this process's last reconcile (counts only)."""
        return self._rec.rt.last_reconcile

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self._graph, name)

    # -- ids, delivery, errors --------------------------------------------------------------

    @staticmethod
    def logical_task_id(invocation_id: str) -> str:
        """Ledger id of the invocation task for ``invocation_id`` (deterministic uuid5); a
        static method, so ``GuardedGraph.logical_task_id(...)`` works without an instance."""
        return logical_task_id(invocation_id)

    def mark_delivered(self, framework_id: str) -> Task | None:
        """The core's ``mark_delivered`` (see :class:`AdapterSurface`); for a recovery run,
        also the pending deliveries of the runs it recovers (the lost run, a dead recovery
        before it): its answer is theirs."""
        task = super().mark_delivered(framework_id)
        settle_recovered_by(self._rec.rt, framework_id, (c.DELIVERED, c.TRANSPORT_ACKNOWLEDGED))
        return task

    def mark_delivery_failed(self, framework_id: str) -> Task | None:
        """The core's ``mark_delivery_failed``; for a recovery run, the runs it recovers too
        (see :meth:`mark_delivered`)."""
        task = super().mark_delivery_failed(framework_id)
        settle_recovered_by(self._rec.rt, framework_id, (c.DELIVERY_FAILED, c.TRANSPORT_FAILED))
        return task

    @property
    def last_invocation_id(self) -> str | None:
        """Invocation id of the last invocation started by the calling thread."""
        return self._runs.last_invocation_id

    @property
    def last_outcome(self) -> str | None:
        """Outcome of the calling thread's last finished invocation: ``succeeded``,
        ``interrupted``, ``failed`` or ``cancelled``."""
        return self._runs.last_outcome

    def close(self, timeout: float = STOP_SECONDS) -> None:
        """Stop background recovery (its resumed runs are drained: the next start resumes
        them; a thread runner is waited for up to ``timeout``), finish queued writes, stop the
        heartbeat and writer threads; close the ledger if :func:`guard` opened it. In an
        async app use ``await app.aclose()``."""
        self.stop_recovery(timeout)
        self._rec.shutdown()

    async def aclose(self, timeout: float = STOP_SECONDS) -> None:
        """:meth:`close` for async apps: waits (up to ``timeout``) for background recovery's
        resumed runs to drain at their next step boundary, then cancels the rest (closed
        ``cancelled/interrupted``: resumed again at the next start), never blocking the loop.

        Runs whose callers were cancelled (a server's graceful-shutdown timeout cancels its
        requests, then shuts the application down) are closed ``cancelled/caller_cancelled``
        before the writer threads stop: each run still open after :data:`CLOSE_GRACE` seconds
        is closed so here (its caller is gone with the server)."""
        await self.astop_recovery(timeout)
        await self._runs.close_open(min(CLOSE_GRACE, timeout))
        await asyncio.to_thread(self._rec.shutdown)

    def request_drain(self, reason: str = "shutdown") -> int:
        """Ask every run of this process to stop at its next step boundary (LangGraph's
        ``RunControl.request_drain``): each raises ``GraphDrained`` to its caller, closes
        ``cancelled/interrupted`` and the next recovery resumes it (its result goes to
        ``on_recovered``). Safe from any thread and from a signal handler; returns how many
        runs were asked. Runs started afterwards are not affected. Under a server, call it
        when the shutdown signal arrives: :func:`drain_on_signals`."""
        return self._runs.request_drain(reason)

    uninstall = close

    def __enter__(self) -> GuardedGraph:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the four entry points --------------------------------------------------------------

    def invoke(
        self,
        input: Any,
        config: dict[str, Any] | None = None,
        *,
        invocation_id: str | None = None,
        **kwargs: Any,
    ) -> Any:
        """``graph.invoke`` recorded as one invocation (see the package README)."""
        config = self._merged(config)
        previous = self._lineage.previous(input, config, kwargs)
        return self._runs.invoke(self._graph.invoke, input, config, invocation_id, previous,
                                 kwargs)

    async def ainvoke(
        self,
        input: Any,
        config: dict[str, Any] | None = None,
        *,
        invocation_id: str | None = None,
        **kwargs: Any,
    ) -> Any:
        """``graph.ainvoke`` recorded as one invocation; a cancelled run ends ``cancelled``."""
        config = self._merged(config)
        previous = await self._lineage.aprevious(input, config, kwargs)
        return await self._runs.ainvoke(self._graph.ainvoke, input, config, invocation_id,
                                        previous, kwargs)

    def stream(
        self,
        input: Any,
        config: dict[str, Any] | None = None,
        *,
        invocation_id: str | None = None,
        **kwargs: Any,
    ) -> Generator[Any, None, None]:
        """``graph.stream`` recorded as one invocation.

        The invocation starts at the first ``next()``; closing the iterator early ends it
        ``cancelled/caller_cancelled``.
        """
        config = self._merged(config)
        previous = self._lineage.previous(input, config, kwargs)
        run = self._runs.begin(config, invocation_id, previous)
        try:
            yield from self._graph.stream(input, run.config, **controlled(run, kwargs))
        except BaseException as exc:
            self._runs.end(run, exc)
            raise
        self._runs.end(run, None)

    async def astream(
        self,
        input: Any,
        config: dict[str, Any] | None = None,
        *,
        invocation_id: str | None = None,
        **kwargs: Any,
    ) -> AsyncGenerator[Any, None]:
        """``graph.astream`` recorded as one invocation (see :meth:`stream`)."""
        config = self._merged(config)
        previous = await self._lineage.aprevious(input, config, kwargs)
        run = await self._runs.abegin(config, invocation_id, previous)
        try:
            async for chunk in self._graph.astream(input, run.config, **controlled(run, kwargs)):
                yield chunk
        except BaseException as exc:
            await self._runs.aend(run, exc)
            raise
        await self._runs.aend(run, None)

    async def astream_events(
        self,
        input: Any,
        config: dict[str, Any] | None = None,
        *,
        invocation_id: str | None = None,
        version: str = "v2",
        **kwargs: Any,
    ) -> AsyncGenerator[Any, None]:
        """``graph.astream_events`` recorded as one invocation (see :meth:`stream`)."""
        config = self._merged(config)
        previous = await self._lineage.aprevious(input, config, kwargs)
        run = await self._runs.abegin(config, invocation_id, previous)
        try:
            async for event in self._graph.astream_events(
                input, run.config, version=version, **kwargs
            ):
                yield event
        except BaseException as exc:
            await self._runs.aend(run, exc)
            raise
        await self._runs.aend(run, None)

    def batch(
        self,
        inputs: Sequence[Any],
        config: dict[str, Any] | Sequence[dict[str, Any] | None] | None = None,
        *,
        invocation_ids: Sequence[str] | None = None,
        return_exceptions: bool = False,
        **kwargs: Any,
    ) -> list[Any]:
        """:meth:`invoke` for each input (one recorded invocation each), in threads like
        ``Runnable.batch`` (``max_concurrency`` of the first config bounds them); outputs in
        input order. ``config``: one for all, or one per input; ``invocation_ids`` likewise
        one per input."""
        return _batch.batch(self.invoke, inputs, config, invocation_ids=invocation_ids,
                            return_exceptions=return_exceptions, kwargs=kwargs)

    async def abatch(
        self,
        inputs: Sequence[Any],
        config: dict[str, Any] | Sequence[dict[str, Any] | None] | None = None,
        *,
        invocation_ids: Sequence[str] | None = None,
        return_exceptions: bool = False,
        **kwargs: Any,
    ) -> list[Any]:
        """:meth:`ainvoke` for each input concurrently (see :meth:`batch`)."""
        return await _batch.abatch(self.ainvoke, inputs, config, invocation_ids=invocation_ids,
                                   return_exceptions=return_exceptions, kwargs=kwargs)


    # -- state edits ------------------------------------------------------------------------

    def update_state(
        self,
        config: dict[str, Any],
        values: Any,
        as_node: str | None = None,
        task_id: str | None = None,
    ) -> Any:
        """The graph's ``update_state``; the new checkpoint keeps the thread's lineage."""
        edited = self._lineage.edit_config(self._merged(config))
        return self._graph.update_state(edited, values, as_node, task_id)

    async def aupdate_state(
        self,
        config: dict[str, Any],
        values: Any,
        as_node: str | None = None,
        task_id: str | None = None,
    ) -> Any:
        """The graph's ``aupdate_state``; the new checkpoint keeps the thread's lineage."""
        edited = await self._lineage.aedit_config(self._merged(config))
        return await self._graph.aupdate_state(edited, values, as_node, task_id)

    def bulk_update_state(self, config: dict[str, Any], supersteps: Sequence[Any]) -> Any:
        """The graph's ``bulk_update_state``; the new checkpoints keep the thread's lineage."""
        edited = self._lineage.edit_config(self._merged(config))
        return self._graph.bulk_update_state(edited, supersteps)

    async def abulk_update_state(
        self, config: dict[str, Any], supersteps: Sequence[Any]
    ) -> Any:
        """The graph's ``abulk_update_state``; the new checkpoints keep the lineage."""
        edited = await self._lineage.aedit_config(self._merged(config))
        return await self._graph.abulk_update_state(edited, supersteps)

    # -- background recovery ----------------------------------------------------------------

    def start_recovery(
        self,
        config: dict[str, Any] | None = None,
        *,
        thread_ids: list[str] | None = None,
        max_concurrency: int | None = None,
        **kwargs: Any,
    ) -> RecoveryRunner:
        """Run recovery in the background and return at once (the server answers while it
        runs): a first pass now, then one every ``reconcile_interval_seconds`` when that is
        above 0 (it replaces the plain periodic reconcile :func:`guard` started), and one as
        soon as the verdict drain (every ``verdict_interval_seconds``, default 10 s; 0: off)
        finds a lost-run verdict owed to LangGraph, whoever reconciled. On an event loop it is
        a task of that loop (:meth:`arecover`); elsewhere a daemon thread (:meth:`recover`).
        Arguments as for :meth:`recover`. Calling it again while a runner is alive returns that
        runner. :meth:`close`/:meth:`aclose` stop it."""
        args = PassArgs(config, thread_ids, max_concurrency, kwargs)
        return start_runner(self, self._rec.rt, self._runners, args)

    def stop_recovery(self, timeout: float = STOP_SECONDS) -> None:
        """Stop background recovery (see :meth:`RecoveryRunner.stop`)."""
        for runner in self._runners:
            runner.stop(timeout)

    async def astop_recovery(self, timeout: float = STOP_SECONDS) -> None:
        """Stop background recovery and wait (up to ``timeout``) for its drained runs."""
        for runner in self._runners:
            await runner.astop(timeout)

    # -- recovery ---------------------------------------------------------------------------

    def _recovering(self) -> RecoveryScope:
        return RecoveryScope(self._graph, self._rec, self._runs, self._seen_cancelled,
                             self._recovery_controls, self)

    def recover(
        self,
        config: dict[str, Any] | None = None,
        *,
        thread_ids: list[str] | None = None,
        max_concurrency: int | None = None,
        **kwargs: Any,
    ) -> RecoveryReport:
        """One recovery pass in the calling thread (see :mod:`._recovery` and the README).

        Reconciles the ledger, then examines every checkpointer thread (or ``thread_ids``):
        a thread whose last invocation was lost is reported (``on_lost``) and, when it still
        has work, resumed; a drained one is resumed; one cancelled by its caller is reported
        in ``.cancelled``. Each resumption is ``invoke(None, ...)`` as a new invocation
        :func:`~task_state_guard_langgraph.recovery_invocation_id`, a child of the one it
        recovers; at most ``max_concurrency`` (default 4) run at once, in threads. ``config``
        and ``kwargs`` (e.g. ``durability``) go to every resumed run; its error is reported,
        not raised, and its result handed to ``on_recovered``. Returns a
        :class:`RecoveryReport`.
        """
        args = PassArgs(config, thread_ids, max_concurrency, kwargs)
        return recover_pass(self._recovering(), args)

    async def arecover(
        self,
        config: dict[str, Any] | None = None,
        *,
        thread_ids: list[str] | None = None,
        max_concurrency: int | None = None,
        **kwargs: Any,
    ) -> RecoveryReport:
        """:meth:`recover` for async checkpointers (``AsyncSqliteSaver``, ``AsyncPostgresSaver``):
        the same pass, every ledger call on a worker thread (the event loop keeps serving),
        each thread resumed with ``ainvoke(None, ...)``, at most ``max_concurrency`` at once."""
        args = PassArgs(config, thread_ids, max_concurrency, kwargs)
        return await arecover_pass(self._recovering(), args)

    def drain_recoveries(self, reason: str = "shutdown") -> int:
        """Ask every resumed run of this process to stop at its next step boundary (it closes
        ``cancelled/interrupted`` and the next recovery resumes it); returns how many."""
        return drain(self._recovery_controls, reason)

    def publish_verdicts(self) -> int:
        """Publish the lost-run verdicts owed to LangGraph now: one recovery pass
        (:meth:`recover`: each lost thread reported with its thread id and resumed where it
        has work). Returns how many verdicts it published."""
        return len(self.recover().reported)

    async def apublish_verdicts(self) -> int:
        """:meth:`publish_verdicts` as an :meth:`arecover` pass."""
        return len((await self.arecover()).reported)
