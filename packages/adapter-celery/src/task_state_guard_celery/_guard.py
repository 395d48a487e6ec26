"""The Celery guard: public API and signal wiring; the receivers live in ``_child``/``_main``.

Model: the logical task (one Celery task id) is a parent ledger task with the deterministic id
``uuid5(NAMESPACE, "celery-task:" + id)``; every execution attempt is its own internal child.
A retry closes the attempt ``failed/retry_scheduled`` and leaves a queued placeholder attempt
under the parent, which the next delivery claims (a delivery that finds it claimed records a
fresh attempt of its own). Everything that touches the ledger goes through the core's
:class:`~task_state_guard.integration.AdapterRuntime`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from celery import signals  # type: ignore[import-untyped]
from task_state_guard import Ledger
from task_state_guard.integration import (
    AdapterRuntime,
    AdapterSurface,
    LostHook,
    LostTask,
    Settings,
)

from ._child import ChildReceivers
from ._ids import IDS
from ._lost import fail_in_backend, succeeded_in_backend
from ._main import MainReceivers
from ._replace import ReplaceLinks
from ._request import TOKEN_KEY, attempt_of

log = logging.getLogger("task_state_guard_celery")

# (signal, receiver method name, signal label) wired by install()/uninstall().
_WIRING: tuple[tuple[Any, str, str], ...] = (
    (signals.task_received, "_on_task_received", "task_received"),
    (signals.task_prerun, "_on_task_prerun", "task_prerun"),
    (signals.task_success, "_on_task_success", "task_success"),
    (signals.task_failure, "_on_task_failure", "task_failure"),
    (signals.task_retry, "_on_task_retry", "task_retry"),
    (signals.task_postrun, "_on_task_postrun", "task_postrun"),
    (signals.task_revoked, "_on_task_revoked", "task_revoked"),
    (signals.before_task_publish, "_on_before_publish", "before_task_publish"),
    (signals.worker_before_create_process, "_on_before_fork", "worker_before_create_process"),
)


class SignalWiring:
    """A guard's signal receivers (``CeleryGuard.wiring``): connected by ``install()``,
    disconnected by ``uninstall()``, each under one dispatch uid per app and signal."""

    def __init__(self, guard: CeleryGuard) -> None:
        self._guard = guard
        self.connected = False

    def _dispatch_uid(self, label: str) -> str:
        return f"task_state_guard_celery:{id(self._guard.app)}:{label}"

    def connect(self) -> None:
        """Connect every receiver (strong references)."""
        for signal, method, label in _WIRING:
            signal.connect(
                getattr(self._guard, method), weak=False, dispatch_uid=self._dispatch_uid(label)
            )
        self.connected = True

    def disconnect(self) -> None:
        """Disconnect every receiver."""
        for signal, _method, label in _WIRING:
            signal.disconnect(dispatch_uid=self._dispatch_uid(label))
        self.connected = False


class CeleryGuard(AdapterSurface):
    """Records a Celery app's task lifecycle in a TaskStateGuard ledger.

    Create it with :func:`task_state_guard_celery.install`; do not instantiate directly.
    ``mark_delivered``, ``mark_delivery_failed``, ``reconcile``, ``stats`` and ``settings``
    are the core's :class:`~task_state_guard.integration.AdapterSurface` (one meaning in every
    adapter); the ids are Celery task ids. ``wiring`` holds the signal receivers that
    :func:`~task_state_guard_celery.install` connects and ``uninstall`` disconnects.
    """

    adapter_name = "celery"
    id_scheme = IDS

    def __init__(
        self,
        app: Any,
        settings: Settings,
        on_lost: LostHook | None = None,
        *,
        uninstall: Callable[[CeleryGuard], None] | None = None,
    ) -> None:
        self.app = app
        # What uninstall() does: install() passes its own (which also forgets the guard and
        # its boot step); a guard made otherwise only disconnects and closes.
        self._uninstall = unwire if uninstall is None else uninstall
        self.runtime = AdapterRuntime(
            settings, logger=log, subject="task", framework="celery", on_lost=on_lost,
            adapter=self.adapter_name,
        )
        self.runtime.fail_lost = self._fail_lost_result
        # A job whose SUCCESS the result backend holds is never reported lost: this guard's
        # reconciles close it succeeded, and a verdict another reconcile recorded is superseded.
        self.runtime.framework_success = self._succeeded_in_backend
        links = ReplaceLinks(self.runtime, app)
        self._child = ChildReceivers(self.runtime, self._ours, links)
        self._main = MainReceivers(self.runtime, self._ours, links)
        self.wiring = SignalWiring(self)
        # Receivers (bound methods, connected with weak=False).
        self._on_task_received = self._main.on_received
        self._on_task_prerun = self._child.on_prerun
        self._on_task_success = self._child.on_success
        self._on_task_postrun = self._child.on_postrun
        self._on_task_revoked = self._main.on_revoked
        self._on_before_publish = self._child.on_before_publish
        self._on_before_fork = self._main.on_before_fork

    # ------------------------------------------------------------------ public API

    @property
    def ledger(self) -> Ledger:
        """This process's ledger (opened lazily; a forked child opens its own)."""
        return self.runtime.ledger

    @property
    def installed(self) -> bool:
        """Whether the guard's receivers are connected."""
        return self.wiring.connected

    @property
    def last_boot_report(self) -> dict[str, Any] | None:
        """The report of this process's last reconcile (counts only)."""
        return self.runtime.last_reconcile

    def uninstall(self) -> None:
        """Disconnect every receiver and the boot step, stop heartbeats, close the ledger."""
        self._uninstall(self)

    close = uninstall

    # ------------------------------------------------------------------ receivers

    def _ours(self, sender: Any) -> bool:
        app = getattr(sender, "app", None)
        return app is None or app is self.app

    def _fail_lost_result(self, lost: LostTask) -> None:
        fail_in_backend(self.app, lost)

    def _succeeded_in_backend(self, lost: LostTask) -> bool:
        return succeeded_in_backend(self.app, lost)

    # ------------------------------------------------------------------ shared signals

    def _on_task_failure(
        self,
        sender: Any = None,
        task_id: str | None = None,
        exception: BaseException | None = None,
        **_: Any,
    ) -> None:
        if sender is None or not self._ours(sender):
            return
        ctx = getattr(sender, "request", None)
        att = attempt_of(ctx) if ctx is not None else None
        if att is not None and not att.closed:
            self._child.on_failure(ctx, exception)  # the executing process
        elif task_id and exception is not None:
            self._main.on_failure(sender, ctx, task_id, exception)

    def _on_task_retry(
        self, sender: Any = None, request: Any = None, reason: Any = None, **_: Any
    ) -> None:
        if sender is None or not self._ours(sender):
            return
        ctx = request
        if ctx is None or attempt_of(ctx) is None:
            own = getattr(sender, "request", None)
            if own is not None and attempt_of(own) is not None:
                ctx = own
        celery_id = getattr(ctx, "id", None)
        if not celery_id:
            return
        if attempt_of(ctx) is not None and reason is not None:
            self._child.on_retry(sender, ctx, celery_id)
        else:
            self._main.on_retry(sender, ctx, celery_id, reason)


def unwire(guard: CeleryGuard) -> None:
    """Disconnect ``guard``'s receivers and close its runtime, if connected (idempotent)."""
    if guard.installed:
        guard.wiring.disconnect()
        guard.runtime.close()


__all__ = ["TOKEN_KEY", "CeleryGuard", "unwire"]
