"""One recorded invocation, and the config a guarded invocation runs with."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future
from typing import Any

from langchain_core.callbacks import BaseCallbackManager
from task_state_guard.integration import Closing
from task_state_guard.integration import codes as c

from ._lineage import METADATA_KEY
from ._recorder import Lane, Recorder
from ._retries import classify_error
from .callbacks import GuardCallbackHandler


class Invocation:
    """Book-keeping for one running invocation.

    ``lane``: where the ledger writes of an async run go, in order (see :class:`Lane`).
    ``recovery``: a run started by recovery; it has no caller, so a cancellation is the
    process stopping it: it closes ``cancelled/interrupted`` like a drained run and the next
    recovery resumes the thread again. So does a run asked to drain (``control``) that its
    server cancels before it reached a step boundary.
    """

    def __init__(
        self,
        invocation_id: str,
        task_id: str | None,
        handler: GuardCallbackHandler | None,
        config: dict[str, Any],
        recorder: Recorder,
        lane: Lane | None = None,
        *,
        recovery: bool = False,
    ) -> None:
        self.invocation_id = invocation_id
        self.task_id = task_id
        self.handler = handler
        self.config = config
        self.lane = lane
        self.recovery = recovery
        self._rec = recorder
        #: The run's ``RunControl`` (its drain), when it has one.
        self.control: Any = None
        self._done = False
        self._closing = threading.Lock()  # one close, whichever thread comes first
        if task_id is not None:
            recorder.opened(self)

    @property
    def drain_requested(self) -> bool:
        """Whether the run was asked to drain (its process is stopping)."""
        return bool(getattr(self.control, "drain_requested", False))

    @property
    def done(self) -> bool:
        """Whether the run was closed (or its close is being written)."""
        return self._done

    def commit_locks(self) -> tuple[threading.RLock, ...]:
        """The locks :meth:`finish` takes around its write (the node history's commit)."""
        return () if self.handler is None else (self.handler.history.commit_lock,)

    def abandon(self) -> None:
        """Forget a run whose start was not written after all (its transaction failed at the
        commit): nothing held, not open, never closed."""
        self._done = True
        if self.task_id is not None:
            self._rec.rt.release(self.task_id)
            self._rec.closed(self)

    def finish(self, exc: BaseException | None, output: Any = None) -> str:
        """Close leftover attempts and the invocation; returns the outcome label."""
        with self._closing:
            if self._done:
                return "done"
            self._done = True
        if exc is None:
            status, code = c.SUCCEEDED, c.COMPLETED
            if self.handler is not None:
                interrupted = self.handler.interrupted
            else:
                interrupted = bool(
                    getattr(output, "interrupts", None)
                    or (isinstance(output, dict) and output.get("__interrupt__"))
                )
            outcome = "interrupted" if interrupted else c.SUCCEEDED
            leftover: c.Outcome = (c.CANCELLED, None)
        else:
            status, code = classify_error(exc)
            if status == c.SUCCEEDED:  # a stray ParentCommand at the top is a failure
                status, code = c.FAILED, c.WORKER_FAILED
            elif code == c.CALLER_CANCELLED and (self.recovery or self.drain_requested):
                # Stopped with its process (a recovery run, or a run asked to drain that the
                # server then cancelled): resumable, like a drain.
                code = c.INTERRUPTED
            outcome = status
            leftover = (c.CANCELLED, c.CALLER_CANCELLED if status == c.CANCELLED else None)
        closings: list[Closing] = []
        if self.handler is not None:
            closings = self.handler.take_open(*leftover)
        if self.task_id is not None:
            closings.append((self.task_id, status, code, False))
        # The node history, leftover attempts and the invocation close: one transaction.
        try:
            if self.handler is not None:
                self.handler.finish(closings)
            else:
                self._rec.close_many(closings)
        finally:
            self._rec.closed(self)
        return outcome


def with_handler(
    config: dict[str, Any] | None, handler: GuardCallbackHandler | None, invocation_id: str
) -> dict[str, Any]:
    cfg: dict[str, Any] = dict(config or {})
    callbacks = cfg.get("callbacks")
    if handler is None:
        pass
    elif callbacks is None:
        cfg["callbacks"] = [handler]
    elif isinstance(callbacks, list):
        cfg["callbacks"] = [*callbacks, handler]
    elif isinstance(callbacks, BaseCallbackManager):
        manager = callbacks.copy()
        manager.add_handler(handler, inherit=True)
        cfg["callbacks"] = manager
    else:
        cfg["callbacks"] = [*callbacks, handler]
    metadata = dict(cfg.get("metadata") or {})
    metadata[METADATA_KEY] = invocation_id
    cfg["metadata"] = metadata
    return cfg


def thread_config(config: dict[str, Any] | None) -> dict[str, Any] | None:
    configurable = (config or {}).get("configurable") or {}
    thread_id = configurable.get("thread_id")
    if thread_id is None:
        return None
    inner: dict[str, Any] = {"thread_id": thread_id, "checkpoint_ns": ""}
    if configurable.get("checkpoint_id"):
        inner["checkpoint_id"] = configurable["checkpoint_id"]
    return {"configurable": inner}


def finish_unstarted(future: Future[Any]) -> None:
    """Done-callback of a start (or a recovery claim) whose caller stopped waiting: once it is
    written, close it as cancelled (a recovery run: ``cancelled/interrupted``, resumable)."""
    run = None if future.cancelled() or future.exception() else future.result()
    if isinstance(run, Invocation):
        run.finish(asyncio.CancelledError())
