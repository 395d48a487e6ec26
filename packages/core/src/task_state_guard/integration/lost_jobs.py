"""Lost jobs: publishing the verdicts the ledger owes this framework (the verdict outbox).

Whoever closes a logical task of this framework as lost (any reconcile, the CLI, another host),
the ledger records a pending verdict in the same transaction. :meth:`LostJobs.publish_verdicts`
drains them: each claimed verdict becomes a :class:`LostTask`, handed first to the adapter's
result-backend writer (:attr:`LostJobs.fail_lost`, unless ``fail_lost_results`` is off) and then
to the user's ``on_lost`` hook, and is marked published. A verdict whose job the framework's
result store holds as succeeded is superseded instead (see :mod:`.successes`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from ..ops.verdicts import Verdict
from .handle import LedgerHandle
from .lost_task import LostHook, LostTask

if TYPE_CHECKING:
    from .successes import FrameworkSuccesses

#: Verdicts one drain step claims, and the lease it holds them for while it publishes.
VERDICT_BATCH = 100
VERDICT_LEASE_SECONDS = 60.0


class LostJobs:
    """Claiming, publishing and marking the verdicts owed to ``framework`` (``None``: none)."""

    def __init__(
        self, handle: LedgerHandle, framework: str | None, on_lost: LostHook | None
    ) -> None:
        if on_lost is not None and not callable(on_lost):
            raise TypeError("on_lost must be callable")
        self._handle = handle
        self._policy = handle.policy
        self.framework = framework
        #: The user's hook for lost jobs (see :class:`LostTask`).
        self.on_lost: LostHook | None = on_lost
        #: The adapter's writer of a failure into the framework's result backend.
        self.fail_lost: LostHook | None = None
        #: How :meth:`publish_verdicts` publishes one claimed verdict: True when published
        #: (it is then marked), False to give it back for a later drain. ``None``: the
        #: default, :meth:`notify_lost` of its :class:`LostTask` (result backend, then
        #: ``on_lost``). An adapter that publishes otherwise (LangGraph: report and resume
        #: the lost thread) sets its own and keeps the claim, lease and marking here.
        self.publish_verdict: Callable[[Verdict], bool] | None = None
        #: Consulted before each publish: a verdict whose job the framework holds as succeeded
        #: is marked published without being published (superseded; see :mod:`.successes`).
        self.successes: FrameworkSuccesses | None = None

    def _label(self) -> str:
        if self.framework is None:
            raise TypeError("this runtime has no framework label: it is owed no verdicts")
        return self.framework

    def claim_verdicts(
        self,
        *,
        limit: int = VERDICT_BATCH,
        lease_seconds: float = VERDICT_LEASE_SECONDS,
        task_ids: Iterable[str] | None = None,
    ) -> list[Verdict]:
        """Claim pending verdicts owed to this framework (see ``Ledger.claim_verdicts``): for an
        adapter that publishes in its own way (LangGraph resumes a lost thread); then
        :meth:`mark_published` or :meth:`release_verdicts`. Raises ledger errors."""
        return self._handle.ledger.claim_verdicts(
            self._label(), limit=limit, lease_seconds=lease_seconds, task_ids=task_ids
        )

    def mark_published(self, verdicts: Iterable[Verdict]) -> int:
        """Mark claimed verdicts published; returns how many changed (raises ledger errors)."""
        done = self._handle.ledger.mark_verdicts_published([v.task_id for v in verdicts])
        proc = self._handle.state()
        with proc.lock:
            proc.published += done
        if self._policy.on_count is not None:
            for _ in range(done):
                self._policy.on_count("tsg_adapter_verdicts_published_total", {})
        return done

    def release_verdicts(self, verdicts: Iterable[Verdict]) -> int:
        """Give claimed verdicts back unpublished, for the next drain (raises ledger errors)."""
        return self._handle.ledger.release_verdicts(verdicts)

    @staticmethod
    def lost_task(verdict: Verdict) -> LostTask:
        """The :class:`LostTask` the hook receives for a verdict."""
        return LostTask(verdict.framework_id, verdict.task_id, verdict.name, verdict.code,
                        verdict.thread_id)

    def publish_verdicts(self) -> int:
        """Drain the verdicts owed to this framework: claim a batch with a lease, publish each
        (:meth:`notify_lost`), mark it published; until none is left. Returns how many this
        call published. Raises ledger errors (the boot and periodic drains run it under the
        error policy).

        At least once across crashes (a process that dies between publishing and marking
        leaves the verdict to the next drain once its lease expired), exactly once otherwise;
        two live processes never hold the same verdict. A verdict whose result-backend write
        failed is released and this drain stops (the next one retries it); an ``on_lost`` hook
        that raises is counted and not called again for that verdict. Each verdict is published
        by :attr:`publish_verdict` when the adapter set one (an exception it raises is counted
        under ``publish_verdict:<Class>`` and the verdict given back).

        Before each publish the adapter's success check, when it has one, is consulted: a
        verdict whose job the framework's result store holds as succeeded is marked published
        without a result-backend write or ``on_lost`` (superseded: counted apart, not in the
        returned number), and one whose check raised is given back like a failed write.
        """
        if self.framework is None:
            return 0
        published = superseded = 0
        successes = self.successes
        try:
            while True:
                batch = self.claim_verdicts()
                failed: list[Verdict] = []
                for verdict in batch:
                    known = False if successes is None else successes.supersedes(verdict)
                    if known:
                        superseded += 1
                    elif known is None or not self._publish_one(verdict):
                        failed.append(verdict)
                    else:
                        published += self.mark_published([verdict])
                if failed:
                    self.release_verdicts(failed)
                if failed or len(batch) < VERDICT_BATCH:
                    return published
        finally:
            if successes is not None:
                successes.log_superseded(superseded)

    def guarded_publish(self, where: str = "publish_verdicts") -> int | None:
        """:meth:`publish_verdicts` under the error policy (``None`` on error)."""
        return self._policy.call(where, self.publish_verdicts)

    def _publish_one(self, verdict: Verdict) -> bool:
        custom = self.publish_verdict
        if custom is None:
            return self.notify_lost(self.lost_task(verdict))
        try:
            return bool(custom(verdict))
        except Exception as exc:
            self._policy.record("publish_verdict", exc)
            return False

    def notify_lost(self, lost: LostTask) -> bool:
        """Write the failure into the result backend (unless ``fail_lost_results`` is off),
        then call ``on_lost``. An error of either is counted (``fail_lost_result:<Class>``,
        ``on_lost:<Class>``) and logged once per kind, never raised. Returns False when the
        result-backend write failed (the hook was not called: publish again later)."""
        writer = self.fail_lost
        if writer is not None and self._handle.settings.fail_lost_results:
            try:
                writer(lost)
            except Exception as exc:
                self._policy.record("fail_lost_result", exc)
                return False
        hook = self.on_lost
        if hook is not None:
            try:
                hook(lost)
            except Exception as exc:
                self._policy.record("on_lost", exc)
        return True


__all__ = ["VERDICT_BATCH", "VERDICT_LEASE_SECONDS", "LostHook", "LostJobs", "LostTask"]
