"""Ref-counted heartbeats: one daemon thread per process beats every held task.

A job holds its running tasks while it runs (:meth:`Heartbeats.hold`) and releases them after
(:meth:`Heartbeats.release`); the thread (started by the first hold, when ``heartbeat_seconds``
> 0) beats every held task every ``heartbeat_seconds`` in one write.
"""

from __future__ import annotations

from ..heartbeat import Heartbeater
from .handle import LedgerHandle, ProcessState


class Heartbeats:
    """This process's held tasks and their heartbeat thread (state in the shared handle)."""

    def __init__(self, handle: LedgerHandle) -> None:
        self._handle = handle

    def hold(self, *task_ids: str) -> None:
        """Heartbeat ``task_ids`` until released (counted: hold twice, release twice)."""
        proc = self._handle.state()
        with proc.lock:
            proc.refs.update(task_ids)
            start = proc.heartbeater is None and self._handle.settings.heartbeat_seconds > 0
        if start:
            self._start(proc)

    def release(self, *task_ids: str) -> None:
        """Undo one :meth:`hold` of each of ``task_ids``."""
        proc = self._handle.state()
        with proc.lock:
            refs = proc.refs
            for task_id in task_ids:
                left = refs.get(task_id, 0) - 1
                if left > 0:
                    refs[task_id] = left
                else:
                    refs.pop(task_id, None)

    def held(self, task_id: str) -> bool:
        """True while a job of this process holds ``task_id``."""
        proc = self._handle.state()
        with proc.lock:
            return task_id in proc.refs

    def _held_ids(self) -> list[str]:
        proc = self._handle.state()
        with proc.lock:
            return list(proc.refs)

    def _start(self, proc: ProcessState) -> None:
        try:
            hb = Heartbeater(
                self._handle.ledger, interval_seconds=self._handle.settings.heartbeat_seconds,
                source=self._held_ids,
            )
        except Exception as exc:
            self._handle.policy.error("heartbeat", exc)
            return
        with proc.lock:
            if proc.heartbeater is not None:
                return
            proc.heartbeater = hb
        hb.start()

    def resume(self) -> None:
        """Start the thread again when tasks are held and it does not run (after a stop)."""
        proc = self._handle.state()
        with proc.lock:
            start = (proc.heartbeater is None and bool(proc.refs)
                     and self._handle.settings.heartbeat_seconds > 0)
        if start:
            self._start(proc)

    def stop_heartbeats(self, *, where: str = "heartbeat", forget: bool = False) -> None:
        """Stop this process's heartbeat thread (held tasks stay held and :meth:`hold`
        restarts it; ``forget``: held tasks are forgotten too). An error is counted under
        ``where``."""
        proc = self._handle.state()
        with proc.lock:
            hb, proc.heartbeater = proc.heartbeater, None
            if forget:
                proc.refs.clear()
        if hb is not None:
            with self._handle.policy.guarded(where):
                hb.stop()


__all__ = ["Heartbeats"]
