"""Node history: a run's node attempts, buffered in the process and committed in batches.

An invocation's start and end are durable writes of their own; its node attempts are history.
Each node attempt that starts or ends is kept in the invocation's :class:`NodeHistory` and
committed, in one write with whatever else is due, at the first of:

* the invocation's end (the attempts, their closes and the invocation's close: one
  transaction on SQLite, one per batch of statements on PostgreSQL);
* the next tick of the process's :class:`HistoryFlusher` (every ``heartbeat_seconds``), so a
  live view of the ledger lags by at most one heartbeat; an attempt still running then is
  written running, owned by this process and held (heartbeaten) until its close;
* a call of :func:`~task_state_guard_langgraph.heartbeat` from inside a node.

An attempt written running whose process dies is closed ``timed_out/owner_lost`` by the next
reconcile, as before. Attempts that died in the buffer are written by recovery from the
checkpoint (``_node_replay``). Timestamps are the commit's: an attempt started and ended
between two commits is recorded with both times equal to the commit's.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence

from task_state_guard import LedgerError, StorageError
from task_state_guard.integration import AdapterRuntime, Closing
from task_state_guard.integration.attempts import AttemptSpec
from task_state_guard.integration.child_attempts import end_with_history

#: A node attempt to record: (attempt id, parent task id, name).
Start = tuple[str, str, str | None]


def write_history(
    rt: AdapterRuntime,
    starts: Sequence[Start],
    closings: Sequence[Closing],
    *,
    owner: bool = True,
    where: str = "close",
) -> set[str]:
    """Record ``starts`` (in order: a parent before its children) and close ``closings``
    (innermost first) in one transaction; returns the ids of the attempts recorded running.

    An attempt that starts and closes in the same write is recorded from its close alone:
    closed at that moment, never started (the ledger never claims a start time it does not
    know), written as its final row with the others of its run (the core's
    ``end_with_history``). One still running is started (owned by this process with
    ``owner``), in start order. A start the ledger refuses is skipped and counted under
    ``open``; the closes are judged and counted as ``close_tasks`` does. When the write itself
    fails nothing of it was committed and the error is raised."""
    closing_ids = {closing[0] for closing in closings}
    rt.release(*closing_ids)
    if not starts or all(start[0] in closing_ids for start in starts):
        # Every attempt closed (an invocation's end): one end attempt, no group.
        end_with_history(rt, [(*start, None) for start in starts], closings, where=where)
        return set()
    written: set[str] = set()
    rest = {closing[0]: closing for closing in closings}
    with rt.ledger.atomic():
        # In start order (the ledger lists a task's children so): runs of attempts that
        # closed already are recorded together, one still running is started on its own.
        done: list[Start] = []
        for start in starts:
            if start[0] in closing_ids:
                done.append(start)
                continue
            _record(rt, done, rest, where)
            done = []
            if _start(rt, start, owner):
                written.add(start[0])
        _record(rt, done, rest, where)
        rt.close_tasks(list(rest.values()), where=where)
    return written


def _record(rt: AdapterRuntime, done: Sequence[Start], rest: dict[str, Closing],
            where: str) -> None:
    """Record the attempts of ``done`` closed (their closes taken from ``rest``)."""
    if done:
        end_with_history(rt, [(*start, None) for start in done],
                         [rest.pop(start[0]) for start in done], where=where)


def _start(rt: AdapterRuntime, start: Start, owner: bool) -> bool:
    """Record one attempt running; False when the ledger refused it (counted)."""
    task_id, parent_id, name = start
    try:
        if owner:
            rt.claim_attempt(AttemptSpec(parent_id, name, attempt_id=task_id))
        else:
            rt.start_task(
                task_id, parent_id=parent_id, delivery_required=False, name=name, owner=False
            )
    except StorageError:
        raise  # the write itself failed: nothing of it commits
    except LedgerError as exc:  # an id recorded already, a parent that is not
        rt.policy.error("open", exc)
        return False
    return True


class NodeHistory:
    """The buffered node attempts of one invocation (see the module docstring)."""

    __slots__ = (
        "_ended",
        "_flusher",
        "_flushing",
        "_held",
        "_live",
        "_lock",
        "_owner",
        "_rt",
        "_starts",
    )

    def __init__(self, rt: AdapterRuntime, *, owner: bool, flusher: HistoryFlusher | None) -> None:
        self._rt = rt
        self._owner = owner
        self._lock = threading.Lock()
        # One commit at a time, in event order (reentrant: an event loop's end takes it first,
        # without waiting, then commits: ``commit_lock``).
        self._flushing = threading.RLock()
        self._starts: list[Start] = []
        self._ended: list[Closing] = []
        self._held: set[str] = set()
        self._flusher = flusher
        self._live = False  # registered with the flusher

    @property
    def commit_lock(self) -> threading.RLock:
        """Held while the history is committed (:meth:`flush`, :meth:`finish`)."""
        return self._flushing

    def start(self, task_id: str, parent_id: str, name: str | None) -> None:
        """A node attempt started (recorded at the next commit)."""
        with self._lock:
            self._starts.append((task_id, parent_id, name))
            register = not self._live and self._flusher is not None
            self._live = True
        if register:
            assert self._flusher is not None
            self._flusher.register(self)

    def end(self, closing: Closing) -> None:
        """A node attempt ended (its close is committed at the next commit)."""
        with self._lock:
            self._ended.append(closing)

    def flush(self) -> None:
        """Commit what is buffered now (the flusher's tick, ``heartbeat()``): attempts still
        running are written running and held. An error is counted; the batch waits for the
        next commit."""
        with self._flushing:
            starts, ended = self._take()
            if not starts and not ended:
                return
            try:
                written = write_history(self._rt, starts, ended, owner=self._owner)
            except Exception as exc:
                with self._lock:  # nothing was written: back to the front of the buffer
                    self._starts[:0] = starts
                    self._ended[:0] = ended
                self._rt.policy.record("node_history", exc)  # never raised: a background tick
                return
            closed = {closing[0] for closing in ended}
            running = [t for t in written if t not in closed]
            with self._lock:
                self._held.update(running)
                self._held.difference_update(closed)
            if running:
                self._rt.hold(*running)

    def finish(self, closings: Sequence[Closing]) -> None:
        """The invocation's end: the buffered attempts, their closes and ``closings`` (the
        attempts left open, innermost first, then the invocation) in one write. When it fails,
        ``closings`` and the closes of attempts already written are tried on their own (the
        history still buffered is counted as lost under ``node_history``)."""
        with self._lock:
            registered, self._live = self._live, False
        if registered and self._flusher is not None:
            self._flusher.unregister(self)
        with self._flushing:
            starts, ended = self._take()
            every = [*ended, *closings]
            try:
                write_history(self._rt, starts, every, owner=self._owner)
            except Exception as exc:
                with self._lock:
                    held, self._held = self._held, set()
                # The invocation's close (and the attempts written earlier) on their own.
                self._rt.close_tasks([c for c in every if c[0] in held or not c[3]])
                self._rt.policy.error("node_history", exc)
            with self._lock:
                self._held.clear()

    def _take(self) -> tuple[list[Start], list[Closing]]:
        with self._lock:
            starts, self._starts = self._starts, []
            ended, self._ended = self._ended, []
        return starts, ended


class HistoryFlusher:
    """Commits the node history of every running invocation of a process each
    ``interval`` seconds, from one daemon thread that runs while invocations are."""

    def __init__(self, rt: AdapterRuntime, interval: float) -> None:
        self._rt = rt
        self.interval = interval
        self._lock = threading.Lock()
        self._live: set[NodeHistory] = set()
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        self._wake = threading.Event()
        self._stopped = False

    def register(self, history: NodeHistory) -> None:
        """Flush ``history`` on every tick until it is unregistered."""
        if self.interval <= 0:
            return
        with self._lock:
            if self._pid != os.getpid():  # a forked child: the parent's thread is not here
                self._pid, self._thread, self._live = os.getpid(), None, set()
                self._wake = threading.Event()
            self._live.add(history)
            if self._thread is None and not self._stopped:
                self._thread = threading.Thread(
                    target=self._run, name="tsg-node-history", daemon=True
                )
                self._thread.start()

    def unregister(self, history: NodeHistory) -> None:
        with self._lock:
            self._live.discard(history)

    def _run(self) -> None:
        idle = 0
        while True:
            self._wake.wait(self.interval)
            with self._lock:
                live = list(self._live)
                idle = 0 if live else idle + 1
                if self._stopped or idle >= 2:  # nothing ran for two ticks: stop
                    self._thread = None
                    return
            for history in live:
                history.flush()

    def stop(self) -> None:
        """Stop the thread (at its next wake-up) and flush what is buffered now."""
        with self._lock:
            self._stopped = True
            live = list(self._live)
            thread, self._thread = self._thread, None
        self._wake.set()
        for history in live:
            history.flush()
        if thread is not None and thread is not threading.current_thread():
            thread.join(5.0)


__all__ = ["HistoryFlusher", "NodeHistory", "Start", "write_history"]
