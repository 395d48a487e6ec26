"""install()/uninstall() and the worker boot step that reconciles before consuming."""

from __future__ import annotations

import os
import threading
from typing import Any, Unpack

from celery import bootsteps  # type: ignore[import-untyped]
from celery.concurrency.thread import TaskPool as ThreadPool  # type: ignore[import-untyped]
from task_state_guard.integration import LostHook, SettingArgs, resolve_settings

from ._guard import CeleryGuard, unwire

_lock = threading.RLock()
_guards: dict[int, CeleryGuard] = {}


class ReconcileOnBoot(bootsteps.StartStopStep):  # type: ignore[misc]
    """Worker boot step, in the main process before consuming: open the ledger (an unusable
    one is logged once at ERROR; with ``require_ledger`` this step raises and Celery stops the
    worker: "Unrecoverable error"), reconcile it, publish the verdicts owed to Celery; then,
    until the worker stops, every ``verdict_interval_seconds`` (default 10 s) check for
    verdicts owed to Celery (one read) and publish them, whoever reconciled, and every
    ``reconcile_interval_seconds`` (when above 0) reconcile and publish again. A worker step:
    it runs in the worker's main process only, never in a pool child. With the threads pool a
    PostgreSQL ledger keeps one statement connection per pool thread (``--concurrency``),
    unless its URL sets ``connections=``.

    Custom worker steps start before the Consumer step (which is ``last``), so this
    runs before the worker receives its first message. Reconcile is idempotent, so
    several workers booting at once on one host are fine.
    """

    name = "task_state_guard_celery.ReconcileOnBoot"

    def start(self, parent: Any) -> None:
        guard = guard_for(getattr(parent, "app", None))
        if guard is not None:
            guard.runtime.connections = pool_threads(parent)
            guard.runtime.boot("reconcile_on_boot")
            guard.runtime.start_periodic_reconcile()
            guard.runtime.start_verdict_drain()

    def stop(self, parent: Any) -> None:
        guard = guard_for(getattr(parent, "app", None))
        if guard is not None:
            guard.runtime.stop_periodic_reconcile()
            guard.runtime.stop_verdict_drain()


def pool_threads(worker: Any) -> int | None:
    """How many of ``worker``'s jobs run at once in its main process: its concurrency with
    the threads pool; None (one) with any other (a prefork child runs one job at a time)."""
    pool = getattr(worker, "pool_cls", None)
    concurrency = getattr(worker, "concurrency", None)
    if not (isinstance(pool, type) and issubclass(pool, ThreadPool)):
        return None
    return concurrency if isinstance(concurrency, int) and concurrency > 0 else None


def guard_for(app: Any) -> CeleryGuard | None:
    """The guard installed on ``app`` in this process, if any."""
    if app is None:
        return None
    with _lock:
        guard = _guards.get(id(app))
    return guard if guard is not None and guard.app is app else None


def installed_guards() -> list[CeleryGuard]:
    """Every guard installed in this process."""
    with _lock:
        return list(_guards.values())


def install(
    app: Any,
    db: str | os.PathLike[str] | None = None,
    *,
    on_lost: LostHook | None = None,
    **settings: Unpack[SettingArgs],
) -> CeleryGuard:
    """Record ``app``'s tasks in the ledger at ``db``; idempotent per app.

    ``on_lost`` is called with a :class:`~task_state_guard.integration.LostTask` (Celery task
    id, ledger id, task name, code) for each task a reconcile found lost, after ``FAILURE`` was
    written into the result backend (see ``task_state_guard_celery.TaskLostError``).

    Each setting comes from the argument, then ``app.conf.tsg_<name>``, then the
    ``TSG_<NAME>`` environment variable, then the default shared by every adapter (see
    :mod:`task_state_guard.integration.settings`); a bad value raises ``ConfigurationError``.
    Call it in the module that defines the app: the worker's main process and every
    pool child then record. A second call for the same app returns the first guard.
    """
    with _lock:
        existing = guard_for(app)
        if existing is not None:
            return existing
        resolved = resolve_settings(
            framework=lambda name: app.conf.get(f"tsg_{name}"), db=db, **settings
        )
        guard = CeleryGuard(app, resolved, on_lost, uninstall=uninstall_guard)
        guard.wiring.connect()
        app.steps["worker"].add(ReconcileOnBoot)
        _guards[id(app)] = guard
        return guard


def uninstall_guard(guard: CeleryGuard) -> None:
    """Undo :func:`install` for ``guard``'s app (idempotent); ``guard.uninstall()`` of an
    installed guard calls it."""
    with _lock:
        if _guards.get(id(guard.app)) is guard:
            del _guards[id(guard.app)]
            guard.app.steps["worker"].discard(ReconcileOnBoot)
        unwire(guard)


def uninstall(app: Any) -> None:
    """Uninstall the guard of ``app`` if one is installed (idempotent)."""
    guard = guard_for(app)
    if guard is not None:
        uninstall_guard(guard)
