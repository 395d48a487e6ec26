"""The LangGraph side of the core's adapter runtime: graph and node events become ledger calls.

Transitions share one ledger write per node boundary: the close of a node attempt that just
ended (and its ``not_applicable`` delivery; the core's *end attempt*) is committed together
with the start of the next attempt (the core's *begin attempt*; both one statement on
PostgreSQL, ``Ledger.end_and_begin_attempt``), or with the invocation's close. The
invocation's start is one write too (its create and start: ``begin_attempt`` with
``attempt=False``). A starting attempt is always committed before its
node runs, so after a crash the ledger shows which attempt was running; an attempt that had
ended but whose close was still waiting for the next boundary shows as running too (never as
succeeded). Each commit on the caller's thread hands the GIL to the checkpointer's background
writer; halving the commits per node removes most of that wait.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

from task_state_guard import StateConflict
from task_state_guard.integration import AdapterRuntime, AttemptSpec, Closing, name_label

T = TypeVar("T")

#: At most this many threads run the ledger writes of async runs (per guarded graph and
#: process). They start only as lanes need them (an idle one is reused first), so there are as
#: many as invocations had a write in flight at once: each its own database connection, no
#: shared writer that unrelated requests queue behind.
WRITER_THREADS = 32


class Lane:
    """Ledger calls of one async invocation: run in submission order, one at a time, on the
    recorder's writer threads. Different invocations' lanes run side by side, each on a thread
    (and connection) of its own while it has a write in flight, so one slow write (a row or
    ledger locked by another process) holds up its own invocation only."""

    def __init__(self, recorder: Recorder) -> None:
        self._rec = recorder
        self._lock = threading.Lock()
        self._queue: deque[tuple[Callable[..., Any], tuple[Any, ...], Future[Any]]] = deque()
        self._busy = False

    def submit(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        """Run ``fn(*args)`` after every call submitted to this lane before it."""
        future: Future[T] = Future()
        with self._lock:
            self._queue.append((fn, args, future))
            if self._busy:
                return future
            self._busy = True
        try:
            self._rec.pool().submit(self._drain)
        except BaseException:
            with self._lock:
                self._busy = False
            raise
        return future

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Await ``fn(*args)`` run in this lane. A cancelled caller stops waiting; the call
        itself still completes."""
        return await asyncio.wrap_future(self.submit(fn, *args))

    def _drain(self) -> None:
        while True:
            with self._lock:
                if not self._queue:
                    self._busy = False
                    return
                fn, args, future = self._queue.popleft()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = fn(*args)
            except BaseException as exc:
                future.set_exception(exc)
            else:
                future.set_result(result)


class Recorder:
    """Ledger writes for one guarded graph (or one stand-alone callback handler).

    ``owner=True`` makes the process the owner of every task it starts, so a new process's
    reconcile closes them ``timed_out/owner_lost`` as soon as this one is dead.
    """

    def __init__(self, runtime: AdapterRuntime, *, owner: bool = True) -> None:
        self.rt = runtime
        self.owner = owner
        self._writer: ThreadPoolExecutor | None = None
        self._writer_pid = 0
        self._writer_lock = threading.Lock()

    # -- the writer threads of async runs ---------------------------------------------------

    def pool(self) -> ThreadPoolExecutor:
        """The writer threads of this process (started as lanes need them, up to
        :data:`WRITER_THREADS`): async entry points never touch the ledger on the event
        loop."""
        with self._writer_lock:
            if self._writer is None or self._writer_pid != os.getpid():
                # A forked child never uses the parent's (dead) threads.
                self._writer = ThreadPoolExecutor(
                    WRITER_THREADS, thread_name_prefix="tsg-ledger-writer"
                )
                self._writer_pid = os.getpid()
            return self._writer

    def lane(self) -> Lane:
        """A new lane (one per async invocation)."""
        return Lane(self)

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Await ``fn(*args)`` on a writer thread, unordered with any other call (reads, and
        writes that need no order)."""
        return await asyncio.wrap_future(self.pool().submit(fn, *args))

    def shutdown(self) -> None:
        """Finish queued writes, stop the writer threads, then close the runtime."""
        with self._writer_lock:
            writer, self._writer = self._writer, None
            mine = self._writer_pid == os.getpid()
        if writer is not None and mine:
            writer.shutdown(wait=True)
        self.rt.close()

    @property
    def strict(self) -> bool:
        """Whether ledger errors are raised (strict mode)."""
        return self.rt.policy.strict

    def beat(self, task_ids: Iterable[str]) -> int:
        """Heartbeat the given running tasks now (one transaction)."""
        ids = [t for t in task_ids if t]
        if not ids:
            return 0
        return int(self.rt.policy.call("heartbeat", lambda: self.rt.ledger.heartbeat_many(ids))
                   or 0)

    def get(self, task_id: str) -> Any:
        """The task, or None when it is missing or the ledger fails (counted)."""
        return self.rt.policy.call("lookup", lambda: self.rt.get(task_id))

    def children(self, task_id: str) -> list[Any]:
        """The direct children of ``task_id``, oldest first (raises ledger errors)."""
        return self.rt.ledger.children_of(task_id)

    def open(
        self,
        task_id: str,
        *,
        parent_id: str | None,
        delivery_required: bool,
        name: object,
        claim_errors: bool = True,
        closings: Sequence[Closing] = (),
        framework_id: str | None = None,
    ) -> bool:
        """Create ``task_id`` (idempotent) and start it, in one transaction; True when this
        call started it (it is then heartbeaten until closed). ``closings`` (see
        :meth:`close_many`) are committed in the same transaction, before the start.
        ``framework_id`` (an invocation id) is stored only when it is a canonical UUID.

        A task that exists but is no longer ``queued`` cannot be started again: counted as
        ``open:StateConflict`` unless ``claim_errors`` is False (used by ``recover()``, where
        losing the claim to another process is normal).
        """
        try:
            if closings:
                self._close_and_start(closings, task_id, parent_id, delivery_required, name)
            else:
                self._start(task_id, parent_id, delivery_required, name, framework_id)
        except StateConflict as exc:
            if claim_errors:
                self.rt.policy.error("open", exc)
            return False
        except Exception as exc:
            self.rt.policy.error("open", exc)
            return False
        self.rt.hold(task_id)
        return True

    def _start(
        self,
        task_id: str,
        parent_id: str | None,
        delivery_required: bool,
        name: object,
        framework_id: str | None = None,
    ) -> None:
        if parent_id is not None and not delivery_required and self.owner:
            # A node attempt: the core's *begin attempt* under its parent, which exists and is
            # running already (one statement on PostgreSQL).
            self.rt.claim_attempt(AttemptSpec(parent_id, name_label(name), attempt_id=task_id))
            return
        if delivery_required and self.owner:
            # An invocation: created and started in one write (one statement on PostgreSQL).
            self.rt.begin_task(
                task_id, parent_id=parent_id, name=name_label(name), framework_id=framework_id
            )
            return
        self.rt.start_task(
            task_id,
            parent_id=parent_id,
            delivery_required=delivery_required,
            name=name_label(name),
            owner=self.owner,
            framework_id=framework_id,
        )

    def _close_and_start(
        self,
        closings: Sequence[Closing],
        task_id: str,
        parent_id: str | None,
        delivery_required: bool,
        name: object,
    ) -> None:
        self.rt.release(*(closing[0] for closing in closings))
        if parent_id is not None and not delivery_required and self.owner:
            # A node boundary: the ended attempts' close and the next attempt's start as one
            # write (one statement on PostgreSQL).
            try:
                begun = self.rt.close_and_claim(
                    closings, AttemptSpec(parent_id, name_label(name), attempt_id=task_id)
                )
            except Exception:
                # Nothing was written: the closes on their own, then the start on its own.
                self.rt.close_tasks(closings, where="close")
                self._start(task_id, parent_id, delivery_required, name)
                return
            if begun is None:  # refused: the start on its own explains why
                self._start(task_id, parent_id, delivery_required, name)
            return
        refused: StateConflict | None = None
        try:
            with self.rt.ledger.atomic():
                self.rt.close_tasks(closings, where="close")
                try:
                    self._start(task_id, parent_id, delivery_required, name)
                except StateConflict as exc:  # the closes still commit
                    refused = exc
        except Exception:
            # The shared commit failed: the closes on their own, then the start on its own.
            self.rt.close_tasks(closings, where="close")
            self._start(task_id, parent_id, delivery_required, name)
        if refused is not None:
            raise refused

    def close(self, task_id: str, status: str, code: str | None, *, internal: bool) -> None:
        """Close one task (see :meth:`close_many`)."""
        self.close_many(((task_id, status, code, internal),))

    def close_many(self, closings: Sequence[Closing]) -> None:
        """Close several tasks (innermost first) in one transaction; each is judged on its own
        (a refused close is counted as a conflict and never rewrites a terminal record)."""
        if closings:
            self.rt.release(*(closing[0] for closing in closings))
            self.rt.close_tasks(closings, where="close")
