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
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

from . import _recovery_claim as claim
from . import _recovery_find as find
from . import _recovery_resume as resume
from ._invocation import finish_unstarted
from ._recovery_types import DEFAULT_CONCURRENCY, PassArgs, Recovery, RecoveryReport, RecoveryScope
from ._threads import athread_ids, thread_ids
from ._verdicts import pending_threads, publish_unplaced
from .callbacks import AsyncGuardCallbackHandler, GuardCallbackHandler


def recover_pass(scope: RecoveryScope, args: PassArgs) -> RecoveryReport:
    """One pass in the calling thread (:meth:`GuardedGraph.recover`): reconcile, examine each
    thread, settle each finding, resume the claimed threads in a pool of threads."""
    report = RecoveryReport()
    if scope.ledger() is None:
        return report
    policy = scope.rec.rt.policy
    # guard()'s own pass logs at INFO; a recovery pass that changed nothing, at DEBUG.
    scope.rec.rt.guarded_reconcile("reconcile", quiet_when_unchanged=True)
    saver = getattr(scope.graph, "checkpointer", None)
    if saver is None or isinstance(saver, bool):  # no threads: every lost run is unplaced
        if args.thread_ids is None:
            policy.call("recover", partial(_report_unplaced, scope, report))
        return report
    config, kwargs = args.config, args.kwargs
    ids = args.thread_ids
    if ids is None:
        ids = policy.call("recover", partial(_thread_ids, scope, saver)) or []
    limit = max(1, args.max_concurrency or DEFAULT_CONCURRENCY)
    with ThreadPoolExecutor(limit, thread_name_prefix="tsg-recovery") as pool:
        futures = []

        def examine(thread_id: str) -> None:
            finding = policy.call("recover", partial(find.examine, scope, saver, thread_id))
            if finding is None:
                return
            run = policy.call(
                "recover",
                partial(claim.settle, scope, finding, config, report, GuardCallbackHandler),
            )
            if run is not None:
                claimed = resume.Claim(finding, run)
                futures.append(pool.submit(resume.resume, scope, claimed, kwargs))

        for thread_id in ids:
            examine(thread_id)
        if args.thread_ids is None:
            for thread_id in policy.call("recover", partial(_late_threads, scope)) or []:
                examine(thread_id)
            policy.call("recover", partial(_report_unplaced, scope, report))
        report.extend(f.result() for f in futures)
    return report


def _late_threads(scope: RecoveryScope) -> list[str]:
    """The threads recorded with verdicts still pending after the pass over every thread
    (see :func:`._verdicts.pending_threads`)."""
    return pending_threads(scope.rec.rt)


def _report_unplaced(scope: RecoveryScope, report: RecoveryReport) -> None:
    """After a pass over every thread: the lost runs no thread led to."""
    report.reported.extend(publish_unplaced(scope.rec.rt))


def _thread_ids(scope: RecoveryScope, saver: Any) -> list[str]:
    return [] if find.nothing_to_recover(scope) else thread_ids(saver)


async def _athread_ids(scope: RecoveryScope, saver: Any) -> list[str]:
    if await scope.rec.call(find.nothing_to_recover, scope):
        return []
    return await athread_ids(saver)


async def arecover_pass(scope: RecoveryScope, args: PassArgs) -> RecoveryReport:
    """:func:`recover_pass` on the event loop (:meth:`GuardedGraph.arecover`): every ledger
    call on a writer thread, each claimed thread resumed with ``ainvoke``."""
    report = RecoveryReport()
    if await scope.rec.call(_no_ledger, scope):
        return report
    errors = scope.rec.rt.policy
    await scope.rec.call(
        partial(scope.rec.rt.guarded_reconcile, "reconcile", quiet_when_unchanged=True))
    saver = getattr(scope.graph, "checkpointer", None)
    if saver is None or isinstance(saver, bool):  # no threads: every lost run is unplaced
        if args.thread_ids is None:
            await scope.rec.call(
                partial(errors.call, "recover", partial(_report_unplaced, scope, report)))
        return report
    config, kwargs = args.config, args.kwargs
    ids = args.thread_ids
    if ids is None:
        try:
            ids = await _athread_ids(scope, saver)
        except Exception as exc:
            errors.error("recover", exc)
            ids = []
    gate = asyncio.Semaphore(max(1, args.max_concurrency or DEFAULT_CONCURRENCY))
    resumes: list[asyncio.Task[Recovery]] = []

    async def resuming(claimed: resume.Claim) -> Recovery:
        try:
            return await resume.aresume(scope, claimed, kwargs)
        finally:
            gate.release()

    async def examine(thread_id: str) -> None:
        try:
            finding = await find.aexamine(scope, saver, thread_id)
        except Exception as exc:
            errors.error("recover", exc)
            return
        if finding is None:
            return
        # A slot first: a claimed run always starts (never held by a full gate).
        await gate.acquire()
        settling = scope.rec.pool().submit(
            claim.settle, scope, finding, config, report, AsyncGuardCallbackHandler
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
        resumes.append(asyncio.ensure_future(resuming(resume.Claim(finding, run))))

    try:
        for thread_id in ids:
            await examine(thread_id)
        if args.thread_ids is None:
            try:
                late = await scope.rec.call(_late_threads, scope)
            except Exception as exc:
                errors.error("recover", exc)
                late = []
            for thread_id in late:
                await examine(thread_id)
            try:
                await scope.rec.call(_report_unplaced, scope, report)
            except Exception as exc:
                errors.error("recover", exc)
        report.extend(await asyncio.gather(*resumes))
    except BaseException:
        for task in resumes:
            task.cancel()  # a resumed run stopped with its pass closes resumable
        await asyncio.gather(*resumes, return_exceptions=True)
        raise
    return report


def _no_ledger(scope: RecoveryScope) -> bool:
    return scope.ledger() is None


__all__ = ["arecover_pass", "recover_pass"]
