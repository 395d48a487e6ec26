"""The recorded invocations of a guarded graph: each run's start and end in the ledger.

A sync run writes on its caller's thread. An async run writes on the event loop itself when
that needs no wait (a SQLite ledger whose write lock is free: :meth:`~._recorder.Recorder.now`),
else in its own lane on a writer thread (:class:`~._recorder.Lane`), so the event loop never
waits for the ledger. A run starts with the invocation's running record committed and ends with
its close (and its node history) in one write.
"""

from __future__ import annotations

import asyncio
import copy
import threading
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from langgraph.errors import GraphDrained
from langgraph.runtime import RunControl

from ._ids import logical_task_id, stored_thread
from ._invocation import Invocation, finish_unstarted, with_handler
from ._recorder import Lane, Recorder
from ._retries import RetryOracle
from .callbacks import AsyncGuardCallbackHandler, GuardCallbackHandler, invocation_handler


class Runs:
    """Starts and ends the recorded invocations of one guarded graph.

    ``name`` labels the invocations; ``record_nodes=False`` records them without a callback
    handler (no node attempts). :meth:`view` is the object of a ``with_config`` copy: the
    calling thread's last invocation and outcome are its own, the rest is shared.
    """

    def __init__(
        self, recorder: Recorder, oracle: RetryOracle, *, name: str | None, record_nodes: bool
    ) -> None:
        self._rec = recorder
        self._oracle = oracle
        self._name = name
        self._record_nodes = record_nodes
        self._local = threading.local()
        # Shared with every view(): per process, not per view.
        self._drained_here: set[str] = set()

    def view(self) -> Runs:
        """These runs, with a calling-thread record of their own (see the class docstring)."""
        bound = copy.copy(self)
        bound._local = threading.local()
        return bound

    @property
    def last_invocation_id(self) -> str | None:
        """Invocation id of the last invocation started by the calling thread."""
        return getattr(self._local, "invocation_id", None)

    @property
    def last_outcome(self) -> str | None:
        """Outcome of the calling thread's last finished invocation."""
        return getattr(self._local, "outcome", None)

    @property
    def drained_here(self) -> set[str]:
        """Ledger ids of the invocations drained by this live process (its recovery passes
        leave them to the next start, or to another process)."""
        return self._drained_here

    # -- one run ----------------------------------------------------------------------------

    def begin(
        self, config: dict[str, Any] | None, invocation_id: str | None, parent: str | None
    ) -> Invocation:
        inv = str(invocation_id) if invocation_id is not None else str(uuid.uuid4())
        self._local.invocation_id = inv
        run = self.open_run(config, inv, parent, False, GuardCallbackHandler)
        assert run is not None
        return run

    async def abegin(
        self, config: dict[str, Any] | None, invocation_id: str | None, parent: str | None
    ) -> Invocation:
        """:meth:`begin` for async runs; the invocation's running record is committed before
        this returns. On the event loop itself when that needs no wait (:meth:`Recorder.now`),
        else in the invocation's lane on a writer thread."""
        inv = str(invocation_id) if invocation_id is not None else str(uuid.uuid4())
        self._local.invocation_id = inv
        lane = self._rec.lane()
        opener = self.open_run
        if parent is None or self._rec.rt.handle.on_file():
            if parent is not None:  # a read of a SQLite file: it never waits for a writer
                parent = self.known_parent(inv, parent)
            done, run, failed = self._rec.now(
                lane, (), self.started, config, inv, parent, False, AsyncGuardCallbackHandler,
                lane)
            if done:
                assert run is not None
                if failed is None:
                    return run
                run.abandon()  # its start was not written: the run goes on unrecorded
                self._rec.rt.policy.error("open", failed)
                return Invocation(inv, None, None, with_handler(config, None, inv), self._rec,
                                  lane)
            opener = self.started
        future = lane.submit(opener, config, inv, parent, False, AsyncGuardCallbackHandler, lane)
        try:
            run = await asyncio.shield(asyncio.wrap_future(future))
        except asyncio.CancelledError:
            # The caller gave up while the start was being written: close it once it is.
            future.add_done_callback(finish_unstarted)
            raise
        assert run is not None
        return run

    def known_parent(self, inv: str, parent: str | None) -> str | None:
        """``parent`` when the ledger has it (and it is not the invocation itself), else
        None."""
        if parent == logical_task_id(inv) or (
            parent is not None and self._rec.get(parent) is None
        ):
            return None
        return parent

    def open_run(
        self,
        config: dict[str, Any] | None,
        inv: str,
        parent: str | None,
        claim: bool,
        handler_cls: type[GuardCallbackHandler],
        lane: Lane | None = None,
        *,
        recovery: bool = False,
    ) -> Invocation | None:
        """Start the invocation ``inv`` (a child of ledger task ``parent``, if the ledger has
        it). ``claim``: None when it exists already (recovery lost the race)."""
        return self.started(config, inv, self.known_parent(inv, parent), claim, handler_cls,
                            lane, recovery=recovery)

    def started(
        self,
        config: dict[str, Any] | None,
        inv: str,
        parent: str | None,
        claim: bool,
        handler_cls: type[GuardCallbackHandler],
        lane: Lane | None = None,
        *,
        recovery: bool = False,
    ) -> Invocation | None:
        """:meth:`open_run` under ``parent``, known to the ledger (or None): one write."""
        own = logical_task_id(inv)
        opened = self._rec.open(
            own,
            parent_id=parent,
            name=self._name,
            claim_errors=not claim,
            framework_id=inv,
            thread_id=stored_thread(config),
        )
        if not opened and claim:
            return None
        lane = lane if lane is not None else self._rec.lane()
        # Not opened: run unrecorded (ledger down, or invocation id reused); no handler.
        task_id = own if opened else None
        handler: GuardCallbackHandler | None = None
        if opened and self._record_nodes:
            handler = invocation_handler(handler_cls, self._rec, inv, own, self._oracle, lane)
        cfg = with_handler(config, handler, inv)
        return Invocation(inv, task_id, handler, cfg, self._rec, lane, recovery=recovery)

    def end(self, run: Invocation, exc: BaseException | None, output: Any = None) -> str:
        outcome = run.finish(exc, output)
        self.finished(run, exc, outcome)
        return outcome

    async def aend(self, run: Invocation, exc: BaseException | None, output: Any = None) -> str:
        """:meth:`end` for async runs: the closing write on the event loop itself when that
        needs no wait (:meth:`Recorder.now`), else in the invocation's lane (where it completes
        even when the caller is cancelled meanwhile)."""
        lane = run.lane if run.lane is not None else self._rec.lane()
        if run.task_id is None:
            outcome = run.finish(exc, output)  # nothing to write
        else:
            done, closed, failed = self._rec.now(lane, run.commit_locks(), run.finish, exc,
                                                 output)
            if done:
                assert closed is not None
                outcome = closed
                if failed is not None:
                    self._rec.rt.policy.error("close", failed)
            else:
                # Submitted before any await: the close is written however often the caller
                # is cancelled while it waits (an anyio cancel scope cancels every await in it
                # again).
                future = lane.submit(run.finish, exc, output)
                outcome = await asyncio.shield(asyncio.wrap_future(future))
        self.finished(run, exc, outcome)
        return outcome

    def finished(self, run: Invocation, exc: BaseException | None, outcome: str) -> None:
        self._local.outcome = outcome
        if isinstance(exc, GraphDrained) and run.task_id is not None:
            # Drained by this live process: its recovery passes leave it to the next start
            # (or to another process).
            self._drained_here.add(run.task_id)

    def invoke(
        self,
        call: Callable[..., Any],
        input: Any,
        config: dict[str, Any] | None,
        invocation_id: str | None,
        previous: str | None,
        kwargs: dict[str, Any],
    ) -> Any:
        """``call`` (the compiled graph's ``invoke``) as one recorded invocation, a child of
        ledger task ``previous`` (the run it continues), if any."""
        run = self.begin(config, invocation_id, previous)
        try:
            out = call(input, run.config, **controlled(run, kwargs))
        except BaseException as exc:
            self.end(run, exc)
            raise
        self.end(run, None, out)
        return out

    async def ainvoke(
        self,
        call: Callable[..., Awaitable[Any]],
        input: Any,
        config: dict[str, Any] | None,
        invocation_id: str | None,
        previous: str | None,
        kwargs: dict[str, Any],
    ) -> Any:
        """:meth:`invoke` for ``call``, the compiled graph's ``ainvoke``."""
        run = await self.abegin(config, invocation_id, previous)
        try:
            out = await call(input, run.config, **controlled(run, kwargs))
        except BaseException as exc:
            await self.aend(run, exc)
            raise
        await self.aend(run, None, out)
        return out

    # -- every open run ---------------------------------------------------------------------

    def request_drain(self, reason: str) -> int:
        """Ask every open run of this process to stop at its next step boundary; returns how
        many were asked."""
        asked = 0
        for run in self._rec.open_runs():
            if run.control is not None and not run.drain_requested:
                run.control.request_drain(reason)
                asked += 1
        return asked

    async def close_open(self, grace: float) -> None:
        """Let the cancelled callers close their runs (a few loop turns), then close the rest
        in their lanes and wait for those writes."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        while self._rec.open_runs() and loop.time() < deadline:
            await asyncio.sleep(0.01)
        closes = []
        for run in self._rec.open_runs():
            lane = run.lane if run.lane is not None else self._rec.lane()
            closes.append(asyncio.wrap_future(lane.submit(run.finish, asyncio.CancelledError())))
        if closes:
            await asyncio.gather(*closes, return_exceptions=True)


def controlled(run: Invocation, kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` with the run's ``RunControl`` (the caller's, else one of its own), so that
    :meth:`GuardedGraph.request_drain` can drain it."""
    control = kwargs.get("control")
    if control is None:
        control = RunControl()
        kwargs = {**kwargs, "control": control}
    run.control = control
    return kwargs
