"""Recovery: resume the threads whose last invocation was lost or drained, report the others.

One pass: reconcile the ledger (a dead process's invocations become ``timed_out``), list the
checkpointer's threads, find each thread's head (:mod:`._lineage`) and classify it:

- ``timed_out`` (**lost**: its process died, or it went stale): reported (``on_lost``) and,
  when the thread still has work, resumed;
- ``cancelled/interrupted`` (**drained**: ``RunControl.request_drain()``, or a resumed run
  stopped with its process): resumed, not reported as lost;
- ``cancelled/caller_cancelled`` (the caller gave up, e.g. a client disconnected mid-stream)
  with work left: reported in :attr:`RecoveryReport.cancelled`, never resumed (a cancel is
  the caller's decision).

Resuming is ``invoke(None)`` as a new invocation, a child of the head, whose id is derived from
the head's ledger id: starting it is the claim (exactly one process wins it). A claim that
died with its process is itself a lost head, and the next pass takes the thread over from it.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

from langgraph.runtime import RunControl
from task_state_guard.integration import LostTask
from task_state_guard.integration import codes as c

from . import _node_replay as replay
from ._ids import recovery_id_for_task
from ._invocation import Invocation, finish_unstarted
from ._lineage import (
    Head,
    acheckpoint_invocation,
    aget_tuple,
    checkpoint_invocation,
    resume_pending,
    thread_head,
)
from ._threads import athread_ids, thread_ids
from ._verdicts import claim_lineage, pending_threads, publish_unplaced
from ._verdicts import publish as publish_claimed
from ._verdicts import report as report_lost
from .callbacks import AsyncGuardCallbackHandler, GuardCallbackHandler, logger

if TYPE_CHECKING:
    from ._recorder import Recorder
    from ._runs import Runs

LOST = "lost"
DRAINED = "drained"
CANCELLED = "cancelled"

#: Resumed runs of one recovery pass that run at the same time, unless told otherwise.
DEFAULT_CONCURRENCY = 4

RecoveredHook = Callable[["Recovery"], object]


@dataclass(frozen=True)
class Recovery:
    """One thread resumed by a recovery pass."""

    thread_id: str
    #: Invocation id of the new (recovering) invocation: it carries the delivery obligation.
    invocation_id: str
    #: Invocation id of the invocation it recovers (its ledger parent), when known: ``None``
    #: for a continuation that died before writing a checkpoint under an id that is not a
    #: canonical UUID (only its ledger id, :attr:`recovers_task_id`, is known).
    recovers: str | None
    #: ``"succeeded"``, ``"interrupted"``, ``"failed"`` or ``"cancelled"``.
    outcome: str
    #: Exception class name when the resumed run raised (the run's error is not re-raised).
    error: str | None = None
    #: Why the thread was resumed: ``"lost"`` or ``"drained"``.
    cause: str = LOST
    #: Ledger id of the recovered invocation.
    recovers_task_id: str = field(default="", compare=False)
    #: What the resumed run returned (in memory only, never stored): the result it owes.
    output: Any = field(default=None, compare=False, repr=False)


class RecoveryReport(list[Recovery]):
    """What one recovery pass did: a list of the :class:`Recovery` of each thread it resumed,
    plus :attr:`lost`, :attr:`cancelled`, :attr:`claimed_elsewhere` and :attr:`resumed`.

    ``lost``: the threads whose loss this pass reported, in the order examined, whether or
    not they could be resumed (a thread waiting at an interrupt or whose task failed is lost
    but not resumed). ``reported``: every :class:`~task_state_guard.integration.LostTask` this
    pass handed to ``on_lost``, one per lost-run verdict it published (a lost run no checkpoint
    leads to, e.g. ``durability="exit"`` on a new thread, with the thread it was recorded
    with). A verdict
    another process holds is that process's to report. ``cancelled``: threads whose last run
    was cancelled by its caller with work left (never resumed). ``claimed_elsewhere``: threads
    another process was resuming first.
    """

    lost: list[str]
    reported: list[LostTask]
    cancelled: list[str]
    claimed_elsewhere: int

    def __init__(self) -> None:
        super().__init__()
        self.lost = []
        self.reported = []
        self.cancelled = []
        self.claimed_elsewhere = 0

    @property
    def resumed(self) -> list[str]:
        """The thread ids this pass resumed, in order."""
        return [r.thread_id for r in self]


@dataclass(frozen=True)
class PassArgs:
    """What a recovery pass runs with (the arguments of :meth:`RecoveryMixin.recover`)."""

    config: dict[str, Any] | None
    thread_ids: list[str] | None
    max_concurrency: int | None
    kwargs: dict[str, Any]


@dataclass(frozen=True)
class _Finding:
    thread_id: str
    head: Head
    #: ``LOST``, ``DRAINED``, ``CANCELLED``, or ``None``: nothing to do for the thread itself
    #: (a lost run earlier on its lineage may still be owed a report).
    kind: str | None
    #: ``invoke(None)`` would run something: work left, no failed task, no interrupt waiting
    #: for a human (unless its answer is saved).
    resumable: bool
    #: The thread has work left at all.
    work_left: bool
    #: The node attempts of the lost runs on the lineage, from the checkpoints (by invocation
    #: id): written by the process that claims their verdicts.
    lost_nodes: dict[str, list[replay.LostNode]] = field(default_factory=dict)


@dataclass(frozen=True)
class _Claim:
    finding: _Finding
    run: Invocation


def _kind(head: Head) -> str | None:
    task = head.task
    if task.status == c.TIMED_OUT:
        return LOST
    if task.status == c.CANCELLED and task.terminal_code == c.INTERRUPTED:
        return DRAINED
    if task.status == c.CANCELLED and task.terminal_code == c.CALLER_CANCELLED:
        return CANCELLED
    return None


def _finding(
    thread_id: str, head: Head, kind: str | None, state: Any, tup: Any,
    lost_nodes: dict[str, list[replay.LostNode]],
) -> _Finding:
    if state is None:
        return _Finding(thread_id, head, kind, False, False, lost_nodes)
    work_left = bool(state.next)
    failed = any(t.error is not None for t in state.tasks)
    waiting = any(t.interrupts for t in state.tasks) and not resume_pending(tup)
    return _Finding(
        thread_id, head, kind, work_left and not failed and not waiting, work_left, lost_nodes
    )


def _lineage_lost(head: Head) -> bool:
    return any(link.task.status == c.TIMED_OUT for link in head.path)


class RecoveryMixin:
    """``recover()``/``arecover()`` of :class:`~task_state_guard_langgraph.GuardedGraph`."""

    _graph: Any
    _rec: Recorder
    _runs: Runs
    _recovery_controls: set[RunControl]
    _seen_cancelled: set[str]
    on_recovered: RecoveredHook | None

    if TYPE_CHECKING:  # provided by GuardedGraph

        @property
        def ledger(self) -> Any: ...

    # -- examining a thread -----------------------------------------------------------------

    def _nothing_to_recover(self) -> bool:
        """True when the ledger holds no ``timed_out`` and no ``cancelled`` task at all: no
        invocation can be lost, drained or abandoned, so the checkpointer is not read."""
        ledger = self.ledger
        return ledger is not None and not any(
            ledger.find_task_ids(status, limit=1) for status in (c.TIMED_OUT, c.CANCELLED)
        )

    def _head(self, named: str) -> tuple[Head, str | None] | None:
        rt = self._rec.rt
        head = thread_head(rt.get, self._rec.children, named)
        if head is None:
            return None  # unknown to the ledger: no proof it is not running elsewhere
        kind = _kind(head)
        if kind == DRAINED and head.task.id in self._runs.drained_here:
            kind = None  # a drain by this live process is left to the next start
        if kind is None and not _lineage_lost(head):
            return None
        return head, kind

    def _examine(self, saver: Any, thread_id: str) -> _Finding | None:
        tup = saver.get_tuple({"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}})
        named = checkpoint_invocation(saver, tup)
        found = None if named is None else self._head(named)
        if found is None:
            return None
        state = None
        if found[1] is not None:
            state = self._graph.get_state({"configurable": {"thread_id": thread_id}})
        lost_nodes = replay.read(self._graph, thread_id, found[0])
        return _finding(thread_id, *found, state, tup, lost_nodes)

    async def _aexamine(self, saver: Any, thread_id: str) -> _Finding | None:
        tup = await aget_tuple(
            saver, {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
        )
        named = await acheckpoint_invocation(saver, tup)
        found = None if named is None else await self._rec.call(self._head, named)
        if found is None:
            return None
        state = None
        if found[1] is not None:
            state = await self._graph.aget_state({"configurable": {"thread_id": thread_id}})
        lost_nodes = await replay.aread(self._graph, thread_id, found[0])
        return _finding(thread_id, *found, state, tup, lost_nodes)

    # -- settling a finding: claim, report ----------------------------------------------------

    def _settle(
        self,
        finding: _Finding,
        config: dict[str, Any] | None,
        report: RecoveryReport,
        handler_cls: type[GuardCallbackHandler],
    ) -> Invocation | None:
        """Report the lost runs of the thread's lineage whose verdicts this process claims,
        and claim the thread's resumption when it can be resumed (ledger writes: off the
        event loop in async passes). Returns the claimed run."""
        rt = self._rec.rt
        claimed = claim_lineage(rt, finding.head)
        # The node history the lost runs' processes took with them, from the checkpoints.
        rt.policy.call("node_replay", partial(replay.write_claimed, rt, claimed,
                                              finding.lost_nodes))
        lost = report_lost(rt, claimed, finding.thread_id)
        if lost:
            report.lost.append(finding.thread_id)
            report.reported.extend(lost)
        run: Invocation | None = None
        if finding.kind == CANCELLED and finding.work_left:
            report.cancelled.append(finding.thread_id)
            if finding.head.task.id not in self._seen_cancelled:
                self._seen_cancelled.add(finding.head.task.id)
                logger.info(
                    "recovery: a thread's last run was cancelled by its caller with work left; "
                    "it is reported, not resumed"
                )
        elif finding.kind in (LOST, DRAINED) and finding.resumable:
            run = self._claim(finding, config, handler_cls)
            if run is None:
                report.claimed_elsewhere += 1
                logger.info("recovery: another process is resuming a thread; left to it")
        # Published once the resumption is claimed (by this process or another).
        publish_claimed(rt, claimed)
        return run

    def _claim(
        self,
        finding: _Finding,
        config: dict[str, Any] | None,
        handler_cls: type[GuardCallbackHandler],
    ) -> Invocation | None:
        """Start the recovering invocation (None: another process started it first)."""
        base = dict(config or {})
        base["configurable"] = {
            **(base.get("configurable") or {}), "thread_id": finding.thread_id
        }
        head = finding.head.task
        return self._runs.open_run(
            base, recovery_id_for_task(head.id), head.id, True, handler_cls, recovery=True
        )

    # -- resuming -----------------------------------------------------------------------------

    def _control(self, kwargs: dict[str, Any]) -> tuple[dict[str, Any], RunControl | None]:
        """The resumed run's kwargs with a drain control of its own (the caller's, if given):
        stopping the recovery drains it, so the next start resumes it again."""
        if kwargs.get("control") is not None:
            return kwargs, None
        control = RunControl()
        with _CONTROLS_LOCK:
            self._recovery_controls.add(control)
        return {**kwargs, "control": control}, control

    def _release(self, control: RunControl | None) -> None:
        if control is not None:
            with _CONTROLS_LOCK:
                self._recovery_controls.discard(control)

    def drain_recoveries(self, reason: str = "shutdown") -> int:
        """Ask every resumed run of this process to stop at its next step boundary (it closes
        ``cancelled/interrupted`` and the next recovery resumes it); returns how many."""
        with _CONTROLS_LOCK:
            controls = list(self._recovery_controls)
        for control in controls:
            control.request_drain(reason)
        return len(controls)

    def _recovery(
        self, claim: _Claim, outcome: str, exc: BaseException | None, out: Any
    ) -> Recovery:
        error = None if exc is None else type(exc).__name__
        if error is not None:
            logger.warning("recovery: the resumed run raised %s", error)
        finding = claim.finding
        return Recovery(
            finding.thread_id,
            claim.run.invocation_id,
            finding.head.invocation_id,
            outcome,
            error,
            finding.kind or LOST,  # only lost and drained threads are resumed
            finding.head.task.id,
            out,
        )

    def _resume(self, claim: _Claim, kwargs: dict[str, Any]) -> Recovery:
        run_kwargs, control = self._control(kwargs)
        claim.run.control = run_kwargs["control"]
        try:
            try:
                out = self._graph.invoke(None, claim.run.config, **run_kwargs)
            except Exception as exc:
                recovery = self._recovery(claim, self._runs.end(claim.run, exc), exc, None)
            except BaseException as exc:
                self._runs.end(claim.run, exc)
                raise
            else:
                recovery = self._recovery(claim, self._runs.end(claim.run, None, out), None, out)
        finally:
            self._release(control)
        self._delivered_to_hook(recovery)
        return recovery

    async def _aresume(self, claim: _Claim, kwargs: dict[str, Any]) -> Recovery:
        run_kwargs, control = self._control(kwargs)
        claim.run.control = run_kwargs["control"]
        try:
            try:
                out = await self._graph.ainvoke(None, claim.run.config, **run_kwargs)
            except Exception as exc:
                outcome = await self._runs.aend(claim.run, exc)
                recovery = self._recovery(claim, outcome, exc, None)
            except BaseException as exc:
                await self._runs.aend(claim.run, exc)
                raise
            else:
                outcome = await self._runs.aend(claim.run, None, out)
                recovery = self._recovery(claim, outcome, None, out)
        finally:
            self._release(control)
        result = self._delivered_to_hook(recovery)
        if result is not None:
            try:
                await result
            except Exception as exc:
                self._rec.rt.policy.record("on_recovered", exc)
        return recovery

    def _delivered_to_hook(self, recovery: Recovery) -> Awaitable[Any] | None:
        """Hand a resumed run's result to ``on_recovered`` (its awaitable, if it returned one,
        is for the caller to await); a failing hook is counted, never raised."""
        hook = self.on_recovered
        if hook is None:
            _warn_no_hook()
            return None
        try:
            result = hook(recovery)
        except Exception as exc:
            self._rec.rt.policy.record("on_recovered", exc)
            return None
        return result if inspect.isawaitable(result) else None

    # -- the passes ---------------------------------------------------------------------------

    def recover(
        self,
        config: dict[str, Any] | None = None,
        *,
        thread_ids: list[str] | None = None,
        max_concurrency: int | None = None,
        **kwargs: Any,
    ) -> RecoveryReport:
        """One recovery pass in the calling thread (see the module docstring and the README).

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
        return self._recover_pass(PassArgs(config, thread_ids, max_concurrency, kwargs))

    def _recover_pass(self, args: PassArgs) -> RecoveryReport:
        report = RecoveryReport()
        if self.ledger is None:
            return report
        policy = self._rec.rt.policy
        # guard()'s own pass logs at INFO; a recovery pass that changed nothing, at DEBUG.
        self._rec.rt.guarded_reconcile("reconcile", quiet_when_unchanged=True)
        saver = getattr(self._graph, "checkpointer", None)
        if saver is None or isinstance(saver, bool):  # no threads: every lost run is unplaced
            if args.thread_ids is None:
                policy.call("recover", partial(self._report_unplaced, report))
            return report
        config, kwargs = args.config, args.kwargs
        ids = args.thread_ids
        if ids is None:
            ids = policy.call("recover", partial(self._thread_ids, saver)) or []
        limit = max(1, args.max_concurrency or DEFAULT_CONCURRENCY)
        with ThreadPoolExecutor(limit, thread_name_prefix="tsg-recovery") as pool:
            futures = []

            def examine(thread_id: str) -> None:
                finding = policy.call("recover", partial(self._examine, saver, thread_id))
                if finding is None:
                    return
                run = policy.call(
                    "recover",
                    partial(self._settle, finding, config, report, GuardCallbackHandler),
                )
                if run is not None:
                    claim = _Claim(finding, run)
                    futures.append(pool.submit(self._resume, claim, kwargs))

            for thread_id in ids:
                examine(thread_id)
            if args.thread_ids is None:
                for thread_id in policy.call("recover", self._late_threads) or []:
                    examine(thread_id)
                policy.call("recover", partial(self._report_unplaced, report))
            report.extend(f.result() for f in futures)
        return report

    def _late_threads(self) -> list[str]:
        """The threads recorded with verdicts still pending after the pass over every thread
        (see :func:`._verdicts.pending_threads`)."""
        return pending_threads(self._rec.rt)

    def _report_unplaced(self, report: RecoveryReport) -> None:
        """After a pass over every thread: the lost runs no thread led to."""
        report.reported.extend(publish_unplaced(self._rec.rt))

    def _thread_ids(self, saver: Any) -> list[str]:
        return [] if self._nothing_to_recover() else thread_ids(saver)

    async def _athread_ids(self, saver: Any) -> list[str]:
        if await self._rec.call(self._nothing_to_recover):
            return []
        return await athread_ids(saver)

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
        return await self._arecover_pass(PassArgs(config, thread_ids, max_concurrency, kwargs))

    async def _arecover_pass(self, args: PassArgs) -> RecoveryReport:
        report = RecoveryReport()
        if await self._rec.call(self._no_ledger):
            return report
        errors = self._rec.rt.policy
        await self._rec.call(
            partial(self._rec.rt.guarded_reconcile, "reconcile", quiet_when_unchanged=True))
        saver = getattr(self._graph, "checkpointer", None)
        if saver is None or isinstance(saver, bool):  # no threads: every lost run is unplaced
            if args.thread_ids is None:
                await self._rec.call(
                    partial(errors.call, "recover", partial(self._report_unplaced, report)))
            return report
        config, kwargs = args.config, args.kwargs
        ids = args.thread_ids
        if ids is None:
            try:
                ids = await self._athread_ids(saver)
            except Exception as exc:
                errors.error("recover", exc)
                ids = []
        gate = asyncio.Semaphore(max(1, args.max_concurrency or DEFAULT_CONCURRENCY))
        resumes: list[asyncio.Task[Recovery]] = []

        async def resume(claim: _Claim) -> Recovery:
            try:
                return await self._aresume(claim, kwargs)
            finally:
                gate.release()

        async def examine(thread_id: str) -> None:
            try:
                finding = await self._aexamine(saver, thread_id)
            except Exception as exc:
                errors.error("recover", exc)
                return
            if finding is None:
                return
            # A slot first: a claimed run always starts (never held by a full gate).
            await gate.acquire()
            settling = self._rec.pool().submit(
                self._settle, finding, config, report, AsyncGuardCallbackHandler
            )
            try:
                run = await asyncio.shield(asyncio.wrap_future(settling))
            except asyncio.CancelledError:
                settling.add_done_callback(finish_unstarted)  # a claim made meanwhile
                raise
            except Exception as exc:
                errors.error("recover", exc)
                run = None
            if run is None:
                gate.release()
                return
            resumes.append(asyncio.ensure_future(resume(_Claim(finding, run))))

        try:
            for thread_id in ids:
                await examine(thread_id)
            if args.thread_ids is None:
                try:
                    late = await self._rec.call(self._late_threads)
                except Exception as exc:
                    errors.error("recover", exc)
                    late = []
                for thread_id in late:
                    await examine(thread_id)
                try:
                    await self._rec.call(self._report_unplaced, report)
                except Exception as exc:
                    errors.error("recover", exc)
            report.extend(await asyncio.gather(*resumes))
        except BaseException:
            for task in resumes:
                task.cancel()  # a resumed run stopped with its pass closes resumable
            await asyncio.gather(*resumes, return_exceptions=True)
            raise
        return report

    def _no_ledger(self) -> bool:
        return self.ledger is None

    def publish_verdicts(self) -> int:
        """Publish the lost-run verdicts owed to LangGraph now: one recovery pass
        (:meth:`recover`: each lost thread reported with its thread id and resumed where it
        has work). Returns how many verdicts it published."""
        return len(self.recover().reported)

    async def apublish_verdicts(self) -> int:
        """:meth:`publish_verdicts` as an :meth:`arecover` pass."""
        return len((await self.arecover()).reported)


_CONTROLS_LOCK = threading.Lock()
_warned = threading.Event()


def _warn_no_hook() -> None:
    if not _warned.is_set():
        _warned.set()
        logger.warning(
            "recovery: a resumed run's result is owed to the user of the run it recovers and "
            "no on_recovered hook is set; deliver it from the RecoveryReport and mark it, or "
            "reconcile fails its delivery after the delivery grace"
        )


__all__ = [
    "CANCELLED",
    "DEFAULT_CONCURRENCY",
    "DRAINED",
    "LOST",
    "PassArgs",
    "RecoveredHook",
    "Recovery",
    "RecoveryMixin",
    "RecoveryReport",
]
