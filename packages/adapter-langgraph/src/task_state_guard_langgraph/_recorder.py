"""The LangGraph side of the core's adapter runtime: graph events become ledger calls.

A translation, no choreography of its own: an invocation starts with the runtime's
``begin_task`` (created and started in one write, with its thread id) and ends with
``end_tasks``: its leftover node attempts and its close, in one write (with its buffered node
history, :mod:`._node_buffer`). Node attempts are history: buffered in the process and
committed with the invocation's end, the next heartbeat or a ``heartbeat()`` call.

Async runs write on the event loop itself when that needs no wait (:meth:`Recorder.now`: a
SQLite ledger whose write lock is free, a transaction that waits for no one and takes ~0.1 ms),
else through per-invocation lanes on writer threads (:class:`Lane`).
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
from task_state_guard.integration import AdapterRuntime, Closing, name_label
from task_state_guard.integration.child_attempts import end_tasks

from ._node_buffer import HistoryFlusher

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

    def reserve(self) -> bool:
        """Claim the lane for a call made on the calling thread (:meth:`Recorder.now`): False
        when a call of the lane is queued or running (the new one must come after it)."""
        with self._lock:
            if self._busy:
                return False
            self._busy = True
            return True

    def release(self) -> None:
        """End :meth:`reserve`'s claim; calls submitted meanwhile run now, in order."""
        with self._lock:
            if not self._queue:
                self._busy = False
                return
        self._rec.pool().submit(self._drain)

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
        #: Commits the buffered node history of running invocations every heartbeat.
        self.history = HistoryFlusher(runtime, runtime.settings.heartbeat_seconds)
        self._writer: ThreadPoolExecutor | None = None
        self._writer_pid = 0
        self._writer_lock = threading.Lock()
        #: Runs recorded as started and not closed yet (see :meth:`open_runs`).
        self._open: set[Any] = set()
        self._open_lock = threading.Lock()

    # -- the runs this process holds open ----------------------------------------------------

    def opened(self, run: Any) -> None:
        """``run`` was recorded as started: it is open until :meth:`closed`."""
        with self._open_lock:
            self._open.add(run)

    def closed(self, run: Any) -> None:
        with self._open_lock:
            self._open.discard(run)

    def open_runs(self) -> list[Any]:
        """The runs recorded as started by this process and not closed yet."""
        with self._open_lock:
            return list(self._open)

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

    def now(
        self,
        lane: Lane,
        locks: Sequence[threading.RLock],
        fn: Callable[..., T],
        *args: Any,
    ) -> tuple[bool, T | None, Exception | None]:
        """``fn(*args)`` (the writes of one step of ``lane``'s invocation) on the calling
        thread, an event loop's, in one write transaction begun at once
        (``AdapterRuntime.write_now``), when nothing makes it wait: the lane has no call
        queued or running (the invocation's writes keep their order), each of ``locks`` is
        free, and so is the ledger's write lock (a SQLite ledger only).

        Returns ``(False, None, None)`` when something would wait: nothing was done, the
        caller submits the step to the lane instead. Else ``(True, result, failed)``:
        ``failed`` is the error of the transaction's commit when that failed (nothing of it
        was written; ``fn``'s own error is raised, its writes rolled back)."""
        if not lane.reserve():
            return False, None, None
        taken: list[threading.RLock] = []
        try:
            for lock in locks:
                if not lock.acquire(blocking=False):
                    return False, None, None
                taken.append(lock)
            ran = False
            result: T | None = None
            try:
                with self.rt.write_now() as began:
                    if not began:
                        return False, None, None
                    result = fn(*args)
                    ran = True
            except Exception as exc:
                if not ran:
                    raise
                return True, result, exc
            return True, result, None
        finally:
            for lock in reversed(taken):
                lock.release()
            lane.release()

    def shutdown(self) -> None:
        """Commit the buffered node history, finish queued writes, stop the writer threads,
        then close the runtime."""
        self.history.stop()
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
        name: object,
        claim_errors: bool = True,
        framework_id: str | None = None,
        thread_id: str | None = None,
    ) -> bool:
        """Start the invocation ``task_id`` and hold it (heartbeats) until it is closed; True
        when this call started it.

        An invocation is a job of its own (under ``parent_id`` when it continues another run),
        created and started in one write (the runtime's ``begin_task``); ``framework_id``
        (the invocation id) is stored only when it is a canonical UUID, ``thread_id`` (the
        LangGraph thread) as given. Its node attempts are history (:mod:`._node_buffer`).

        A task that exists but is no longer ``queued`` cannot be started again: counted as
        ``open:StateConflict`` unless ``claim_errors`` is False (used by ``recover()``, where
        losing the claim to another process is normal). Any other ledger error is counted as
        ``open:<Class>``.
        """
        label = name_label(name)
        try:
            self.rt.begin_task(task_id, parent_id=parent_id, name=label,
                               framework_id=framework_id, thread_id=thread_id,
                               owner=self.owner)
            self.rt.hold(task_id)
        except StateConflict as exc:
            if claim_errors:
                self.rt.policy.error("open", exc)
            return False
        except Exception as exc:
            self.rt.policy.error("open", exc)
            return False
        return True

    def close_many(self, closings: Sequence[Closing]) -> None:
        """Close several tasks (innermost first) in one transaction; each is judged on its own
        (a refused close is counted as a conflict and never rewrites a terminal record)."""
        end_tasks(self.rt, closings)
