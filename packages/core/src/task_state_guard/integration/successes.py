"""Jobs the framework knows succeeded are never declared lost.

A worker process can die after its framework recorded a job's success (a result backend holds
the job's return value) and before the adapter's close of the job committed: the ledger then
still has the job running under a dead process, and a reconcile would close it lost, owe the
framework a verdict, write a failure into the result backend and call the user's ``on_lost``
(which often re-enqueues the job: a job that succeeded runs twice).

An adapter whose framework keeps results sets a *success check* on its runtime
(:attr:`AdapterRuntime.framework_success <.runtime.AdapterRuntime.framework_success>`): a
callable that receives the candidate job as a :class:`~.lost_task.LostTask` (its framework id,
ledger id, name label, the lost code a reconcile would give it) and returns True when the
framework's result store holds a success for it. It is consulted in two places:

* **before an applied reconcile of this runtime** (:meth:`FrameworkSuccesses.settle`): a dry
  run names what the pass would close; for each job of this framework it would close lost (or
  whose lost attempt it would close) and whose success the framework holds, the lost attempts and
  the job are closed ``succeeded/worker_completed`` in one write, before the real pass runs.
  The job is left open (only its lost attempts close) while another of its attempts is still
  active: that attempt's own close settles it;
* **before a verdict is published** (:meth:`FrameworkSuccesses.supersedes`): a reconcile that
  could not ask (an operator's ``tsg reconcile``, a process of another framework, a check that
  failed) may have closed such a job lost already. A terminal record is never rewritten, so the
  job stays closed as it was, but its verdict is marked published without a result-backend
  write and without ``on_lost``: it is *superseded*.

A check that raises is counted under ``framework_success:<Class>`` and logged once per kind; the
job is then treated as not known to have succeeded by the reconcile (the normal pass decides),
and its verdict is given back unpublished for a later drain (so ``on_lost`` is never called for
a job whose result store could not be consulted). Counts only are logged and counted
(``tsg_adapter_framework_successes_total``, ``where`` ``reconcile`` or ``verdict``); never ids.

A job is recognised by its ledger id: the logical task id its framework's id scheme
(:data:`~.ids.FRAMEWORKS`) computes from the stored framework id.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..model import ACTIVE_STATES, LOST_CODES, LedgerError, TaskNotFound
from ..process import THIS
from . import codes
from .handle import LedgerHandle
from .ids import FRAMEWORKS, IdScheme
from .lost_task import LostTask

if TYPE_CHECKING:
    from ..ops.reconcile import DecisionCallback, ReconcileDecision, ReconcilePolicy
    from ..ops.verdicts import Verdict

#: The success check: True when the framework's result store holds a success for the job.
SuccessCheck = Callable[[LostTask], bool]

_WHERE = "framework_success"
_FAMILY = "tsg_adapter_framework_successes_total"


@dataclass
class _Job:
    """A job of this framework that a reconcile pass would close lost, or whose lost attempts
    it would close."""

    task_id: str
    framework_id: str | None
    name: str | None
    code: str
    itself: bool = False  # the pass would close the job itself
    attempts: list[str] = field(default_factory=list)


def _is_job(scheme: IdScheme, task_id: str, framework_id: str | None) -> bool:
    if framework_id is None:
        return False
    try:
        return scheme.logical_task_id(framework_id) == task_id
    except LedgerError:
        return False


class FrameworkSuccesses:
    """The success check of one runtime, and what it changes (see the module docstring)."""

    def __init__(self, handle: LedgerHandle, framework: str | None) -> None:
        self._handle = handle
        self._policy = handle.policy
        self.framework = framework
        #: The adapter's success check (``None``: the framework keeps no results to consult).
        self.check: SuccessCheck | None = None
        self._lock = threading.Lock()
        self._pid = THIS.pid
        self._counts: Counter[str] = Counter()

    # ------------------------------------------------------------------ counts

    def counts(self) -> dict[str, int]:
        """This process's counts: ``reconcile`` (jobs closed succeeded instead of lost) and
        ``verdict`` (lost-job verdicts superseded)."""
        with self._lock:
            if self._pid != THIS.pid:
                return {"reconcile": 0, "verdict": 0}
            return {"reconcile": self._counts["reconcile"], "verdict": self._counts["verdict"]}

    def _count(self, where: str, n: int) -> None:
        if n <= 0:
            return
        with self._lock:
            if self._pid != THIS.pid:  # forked: the parent's counts are not this process's
                self._pid, self._counts = THIS.pid, Counter()
            self._counts[where] += n
        if self._policy.on_count is not None:
            for _ in range(n):
                self._policy.on_count(_FAMILY, {"where": where})

    # ------------------------------------------------------------------ the check

    def ask(self, lost: LostTask) -> bool | None:
        """The check's answer for ``lost``: True/False, or None when it raised (counted under
        ``framework_success:<Class>``, logged once per kind, never raised)."""
        check = self.check
        if check is None or lost.framework_id is None:
            return False
        try:
            return bool(check(lost))
        except Exception as exc:
            self._policy.record(_WHERE, exc)
            return None

    # ------------------------------------------------------------------ before a reconcile

    def settle(self, policy: ReconcilePolicy) -> int:
        """Before an applied reconcile: close ``succeeded/worker_completed`` the jobs (and their
        lost attempts) the pass would close lost while the framework holds their success.
        Returns how many jobs were closed so. Runs under the error policy (``framework_success``):
        a failure leaves the real pass to decide alone."""
        scheme = FRAMEWORKS.get(self.framework) if self.framework is not None else None
        if self.check is None or scheme is None:
            return 0
        closed = self._policy.call(_WHERE, lambda: self._settle(scheme, policy))
        return closed or 0

    def _succeeded(
        self, scheme: IdScheme, found: list[ReconcileDecision]
    ) -> list[tuple[str, list[str]]]:
        """Among a dry run's decisions ``found``: each job of this framework whose success the
        framework holds, with the tasks :meth:`settle` closes succeeded for it (its lost
        attempts, then the job unless another of its attempts is still active)."""
        settled = []
        for job in self._candidates(scheme, found):
            if self.ask(LostTask(job.framework_id, job.task_id, job.name, job.code)) is not True:
                continue
            ids = list(job.attempts)
            if job.itself or not self._still_running(job):
                ids.append(job.task_id)
            settled.append((job.task_id, ids))
        return settled

    def preview(
        self, policy: ReconcilePolicy, on_decision: DecisionCallback | None
    ) -> dict[str, object]:
        """A dry run of the applied reconcile of this runtime, counts as it would apply them:
        the tasks :meth:`settle` would close succeeded first are left out of every count (the
        apply's pass never sees them) and not handed to ``on_decision``. Writes nothing. A
        failing check leaves the core's dry run as it is."""
        led = self._handle.ledger
        found: list[ReconcileDecision] = []
        report: dict[str, object] = dict(
            led.reconcile(policy, dry_run=True, on_decision=found.append))
        scheme = FRAMEWORKS.get(self.framework) if self.framework is not None else None
        settled: list[tuple[str, list[str]]] = []
        if self.check is not None and scheme is not None:
            settled = self._policy.call(_WHERE, lambda: self._succeeded(scheme, found)) or []
        gone = {task_id for _, ids in settled for task_id in ids}
        # The apply's pass never sees them: each was examined active and timed out, then its
        # delivery examined in the same pass (closed by a decision, or retained).
        dropped = [d for d in found if d.task_id in gone]
        timed_out = sum(1 for d in dropped if d.kind == "task")
        less = {"active_examined": timed_out, "tasks_timed_out": timed_out,
                "pending_delivery_examined": timed_out, "pending_delivery_retained": timed_out}
        for d in dropped:
            if d.kind == "delivery":
                key = "deliveries_failed" if d.status == "failed" else "deliveries_not_applicable"
                less[key] = less.get(key, 0) + 1
                less["pending_delivery_retained"] -= 1
        for key, n in less.items():
            count = report.get(key)
            if isinstance(count, int):
                report[key] = count - n
        if on_decision is not None:
            for d in found:
                if d.task_id not in gone:
                    on_decision(d)
        return report

    def _settle(self, scheme: IdScheme, policy: ReconcilePolicy) -> int:
        led = self._handle.ledger
        found: list[ReconcileDecision] = []
        led.reconcile(policy, dry_run=True, on_decision=found.append)
        closed = 0
        for job_id, ids in self._succeeded(scheme, found):
            closes = [(task_id, codes.SUCCEEDED, codes.WORKER_COMPLETED) for task_id in ids]
            # Each close is judged on its own: one a concurrent pass made first is left as it is.
            ended = led.end_attempt(closes)
            if job_id in ended.closed:
                closed += 1
        if closed:
            self._count("reconcile", closed)
            self._handle.logger.info(
                "task-state-guard: %d job(s) closed succeeded instead of lost: the framework's "
                "results hold their success", closed)
        return closed

    def _candidates(self, scheme: IdScheme, found: list[ReconcileDecision]) -> list[_Job]:
        """The jobs of this framework among a dry run's decisions, each with the lost attempts
        the pass would close under it."""
        jobs: dict[str, _Job | None] = {}
        led = self._handle.ledger
        for d in found:
            if d.kind != "task" or d.code not in LOST_CODES:
                continue
            if _is_job(scheme, d.task_id, d.framework_id):
                job = jobs.get(d.task_id)
                if job is None:
                    job = jobs[d.task_id] = _Job(d.task_id, d.framework_id, d.name, d.code)
                job.itself, job.code = True, d.code
                continue
            if d.parent_id is None:
                continue
            if d.parent_id not in jobs:
                try:
                    parent = led.get_task(d.parent_id)
                except TaskNotFound:
                    parent = None
                jobs[d.parent_id] = (
                    _Job(parent.id, parent.framework_id, parent.name, d.code)
                    if parent is not None and not parent.is_terminal
                    and _is_job(scheme, parent.id, parent.framework_id) else None)
            job = jobs[d.parent_id]
            if job is not None:
                job.attempts.append(d.task_id)
        return [job for job in jobs.values() if job is not None]

    def _still_running(self, job: _Job) -> bool:
        """Whether another attempt of the job (one the pass keeps) is queued or running."""
        lost = set(job.attempts)
        return any(child.status in ACTIVE_STATES and child.id not in lost
                   for child in self._handle.ledger.children_of(job.task_id))

    # ------------------------------------------------------------------ before a publish

    def supersedes(self, verdict: Verdict) -> bool | None:
        """Before ``verdict`` is published: True when the framework holds its job's success
        (the verdict is then marked published here, without a result-backend write or
        ``on_lost``, and counted); False when it is to be published; None when the check
        raised (give the verdict back for a later drain)."""
        if self.check is None or verdict.framework_id is None:
            return False
        known = self.ask(LostTask(verdict.framework_id, verdict.task_id, verdict.name,
                                  verdict.code))
        if known is not True:
            return known
        self._handle.ledger.mark_verdicts_published([verdict.task_id])
        self._count("verdict", 1)
        return True

    def log_superseded(self, n: int) -> None:
        """Log, counts only, that a drain superseded ``n`` verdicts."""
        if n:
            self._handle.logger.info(
                "task-state-guard: %d lost-job verdict(s) superseded: the framework's results "
                "hold their job's success (no failure written, on_lost not called)", n)


__all__ = ["FrameworkSuccesses", "SuccessCheck"]
