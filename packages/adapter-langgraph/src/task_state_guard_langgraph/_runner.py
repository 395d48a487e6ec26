"""Recovery beside serving: ``start_recovery()`` runs recovery passes in the background.

Started on an event loop, the passes are a task of that loop (``arecover``: every ledger call
on a worker thread, resumed runs as concurrent ``ainvoke``); started outside one, a daemon
thread (``recover``: resumed runs in a small thread pool). The first pass starts at once; with
``reconcile_interval_seconds`` > 0 another follows each interval. With
``verdict_interval_seconds`` > 0 (the default: 10 s) the runtime's verdict drain checks that
often whether a lost-run verdict is owed to LangGraph (one read, whoever reconciled: an
operator's ``tsg reconcile``, another process) and, when one is, wakes the runner for a pass
at once: a pass is what publishes LangGraph's verdicts (it knows the threads to report and
resume). Stopping drains the resumed runs still going (they stop at their next step boundary,
close ``cancelled/interrupted`` and the next start resumes them).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Generator
from typing import TYPE_CHECKING, Any

from ._recovery_types import PassArgs
from .callbacks import logger

if TYPE_CHECKING:
    from task_state_guard.integration import AdapterRuntime

    from ._recorder import Recorder
    from ._recovery_types import RecoveryReport

#: How long stopping waits for drained resumed runs to reach their step boundary.
STOP_SECONDS = 30.0


class RecoveryRunner:
    """Handle of the background recovery started by :meth:`GuardedGraph.start_recovery`.

    ``report``: the last finished pass's :class:`RecoveryReport` (``None`` before the first
    ends); ``passes``: passes finished; ``running``: a pass is in progress. ``wait(timeout)``
    blocks until the first pass ended; ``await runner`` waits for it on the loop and returns
    its report.
    """

    def __init__(self, app: Any, args: PassArgs, interval: float, woken: bool = False) -> None:
        self._app = app
        self._args = args
        self._interval = interval
        #: Whether the verdict drain wakes this runner (it then waits for that between passes
        #: even without an interval).
        self._woken = woken
        self._first = threading.Event()
        self._stop = threading.Event()
        self._poke = threading.Event()  # a thread runner's wake-up (a pass owed, or stop)
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self.report: RecoveryReport | None = None
        self.passes = 0
        self.running = False

    # -- starting ---------------------------------------------------------------------------

    def _start(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is not None:
            self._loop, self._wake = loop, asyncio.Event()
            self._task = loop.create_task(self._run_task(), name="tsg-recovery")
            return
        self._thread = threading.Thread(target=self._run_thread, name="tsg-recovery", daemon=True)
        self._thread.start()

    def _done(self, report: RecoveryReport | None) -> None:
        if report is not None:
            self.report = report
        self.passes += 1
        self.running = False
        self._first.set()

    async def _run_task(self) -> None:
        args = self._args
        try:
            while not self._stop.is_set():
                self.running = True
                report = None
                try:
                    report = await self._app.arecover(
                        args.config, thread_ids=args.thread_ids,
                        max_concurrency=args.max_concurrency, **args.kwargs)
                except Exception as exc:
                    self._rec.rt.policy.error("recover", exc)
                finally:
                    self._done(report)
                if self._interval <= 0 and not self._woken:
                    return
                assert self._wake is not None
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self._timeout)
                self._wake.clear()
        finally:
            self.running = False
            self._first.set()

    def _run_thread(self) -> None:
        args = self._args
        try:
            while not self._stop.is_set():
                self.running = True
                report = None
                try:
                    report = self._app.recover(
                        args.config, thread_ids=args.thread_ids,
                        max_concurrency=args.max_concurrency, **args.kwargs)
                except Exception as exc:
                    self._rec.rt.policy.error("recover", exc)
                finally:
                    self._done(report)
                if self._interval <= 0 and not self._woken:
                    return
                self._poke.wait(self._timeout)
                self._poke.clear()
        finally:
            self.running = False
            self._first.set()

    @property
    def _timeout(self) -> float | None:
        """How long to wait for a wake-up between passes (None: until woken)."""
        return self._interval if self._interval > 0 else None

    def wake(self) -> None:
        """Run a pass now (after the one in progress, if any): the verdict drain calls it
        when a verdict is owed to LangGraph. Safe from any thread."""
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None:
            if not loop.is_closed():
                loop.call_soon_threadsafe(wake.set)
        else:
            self._poke.set()

    @property
    def _rec(self) -> Recorder:
        rec: Recorder = self._app._rec
        return rec

    # -- waiting ----------------------------------------------------------------------------

    @property
    def alive(self) -> bool:
        """True while passes may still run (not stopped, and not finished for good)."""
        if self._task is not None:
            return not self._task.done()
        return self._thread is not None and self._thread.is_alive()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the first pass ended (or the runner stopped); False on timeout."""
        return self._first.wait(timeout)

    def __await__(self) -> Generator[Any, None, RecoveryReport | None]:
        return self._first_report().__await__()

    async def _first_report(self) -> RecoveryReport | None:
        while not self._first.is_set():
            await asyncio.sleep(0.05)
        return self.report

    # -- stopping ---------------------------------------------------------------------------

    def _request_stop(self) -> None:
        self._stop.set()
        self._poke.set()
        self._rec.rt.stop_verdict_drain()
        if self._loop is not None and self._wake is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._wake.set)
        drained = self._app.drain_recoveries("shutdown")
        if drained:
            logger.info("recovery: stopping; %d resumed run(s) drained", drained)

    def stop(self, timeout: float = STOP_SECONDS) -> None:
        """Stop the passes; the resumed runs still going are drained. A thread runner is
        joined (up to ``timeout``); a loop runner is cancelled (use :meth:`astop` on the loop
        to let its runs reach their step boundary first)."""
        self._request_stop()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        if self._task is not None and not self._task.done():
            self._task.cancel()

    async def astop(self, timeout: float = STOP_SECONDS) -> None:
        """Stop the passes and wait (up to ``timeout``) for the drained runs to end."""
        self._request_stop()
        if self._task is not None and not self._task.done():
            done, _ = await asyncio.wait({self._task}, timeout=timeout)
            if not done:
                self._task.cancel()
                await asyncio.gather(self._task, return_exceptions=True)
        elif self._thread is not None:
            await asyncio.to_thread(self._thread.join, timeout)


def start(
    app: Any, rt: AdapterRuntime, runners: list[RecoveryRunner], args: PassArgs
) -> RecoveryRunner:
    """Start background recovery for the guarded graph ``app`` (its
    :meth:`~task_state_guard_langgraph.GuardedGraph.start_recovery`), unless a runner of
    ``runners`` is still alive: that one is returned. ``runners`` then holds the new one."""
    alive = [r for r in runners if r.alive]
    if alive:
        return alive[0]
    interval = rt.settings.reconcile_interval_seconds
    if interval > 0:
        rt.stop_periodic_reconcile()
    woken = rt.settings.verdict_interval_seconds > 0
    runner = RecoveryRunner(app, args, interval, woken)
    runners[:] = [runner]
    runner._start()
    if woken:  # this runner's wake-up, not a previous runner's that ended on its own
        rt.stop_verdict_drain()
        rt.start_verdict_drain("verdict_drain", drain=runner.wake)
    return runner
