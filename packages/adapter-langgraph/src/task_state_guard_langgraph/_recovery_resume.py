"""Resuming a claimed thread: ``invoke(None)`` (or ``ainvoke``) as the recovering invocation,
with a drain control of its own; its result goes to ``on_recovered`` (a failing hook is counted,
never raised) and into the pass's :class:`~._recovery_types.RecoveryReport`."""

from __future__ import annotations

import inspect
import threading
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any

from langgraph.runtime import RunControl

from ._invocation import Invocation
from ._recovery_find import Finding
from ._recovery_types import LOST, Recovery, RecoveryScope
from .callbacks import logger


@dataclass(frozen=True)
class Claim:
    """A finding whose resumption this process claimed, with the run it started."""

    finding: Finding
    run: Invocation


def _control(
    scope: RecoveryScope, kwargs: dict[str, Any]
) -> tuple[dict[str, Any], RunControl | None]:
    """The resumed run's kwargs with a drain control of its own (the caller's, if given):
    stopping the recovery drains it, so the next start resumes it again."""
    if kwargs.get("control") is not None:
        return kwargs, None
    control = RunControl()
    with _CONTROLS_LOCK:
        scope.controls.add(control)
    return {**kwargs, "control": control}, control


def _release(scope: RecoveryScope, control: RunControl | None) -> None:
    if control is not None:
        with _CONTROLS_LOCK:
            scope.controls.discard(control)


def drain(controls: set[RunControl], reason: str) -> int:
    """Ask every resumed run of this process to stop at its next step boundary (it closes
    ``cancelled/interrupted`` and the next recovery resumes it); returns how many."""
    with _CONTROLS_LOCK:
        running = list(controls)
    for control in running:
        control.request_drain(reason)
    return len(running)


def _recovery(claim: Claim, outcome: str, exc: BaseException | None, out: Any) -> Recovery:
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


def resume(scope: RecoveryScope, claim: Claim, kwargs: dict[str, Any]) -> Recovery:
    run_kwargs, control = _control(scope, kwargs)
    claim.run.control = run_kwargs["control"]
    try:
        try:
            out = scope.graph.invoke(None, claim.run.config, **run_kwargs)
        except Exception as exc:
            recovery = _recovery(claim, scope.runs.end(claim.run, exc), exc, None)
        except BaseException as exc:
            scope.runs.end(claim.run, exc)
            raise
        else:
            recovery = _recovery(claim, scope.runs.end(claim.run, None, out), None, out)
    finally:
        _release(scope, control)
    _delivered_to_hook(scope, recovery)
    return recovery


async def aresume(scope: RecoveryScope, claim: Claim, kwargs: dict[str, Any]) -> Recovery:
    run_kwargs, control = _control(scope, kwargs)
    claim.run.control = run_kwargs["control"]
    try:
        try:
            out = await scope.graph.ainvoke(None, claim.run.config, **run_kwargs)
        except Exception as exc:
            outcome = await scope.runs.aend(claim.run, exc)
            recovery = _recovery(claim, outcome, exc, None)
        except BaseException as exc:
            await scope.runs.aend(claim.run, exc)
            raise
        else:
            outcome = await scope.runs.aend(claim.run, None, out)
            recovery = _recovery(claim, outcome, None, out)
    finally:
        _release(scope, control)
    result = _delivered_to_hook(scope, recovery)
    if result is not None:
        try:
            await result
        except Exception as exc:
            scope.rec.rt.policy.record("on_recovered", exc)
    return recovery


def _delivered_to_hook(scope: RecoveryScope, recovery: Recovery) -> Awaitable[Any] | None:
    """Hand a resumed run's result to ``on_recovered`` (its awaitable, if it returned one,
    is for the caller to await); a failing hook is counted, never raised."""
    hook = scope.owner.on_recovered
    if hook is None:
        _warn_no_hook()
        return None
    try:
        result = hook(recovery)
    except Exception as exc:
        scope.rec.rt.policy.record("on_recovered", exc)
        return None
    return result if inspect.isawaitable(result) else None


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


__all__ = ["Claim", "aresume", "drain", "resume"]
