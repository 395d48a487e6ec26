"""``install`` / ``uninstall``: put the middleware outermost on a broker, idempotently."""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Unpack

from task_state_guard.integration import LostHook, SettingArgs

from .middleware import ACTOR_OPTION, TaskStateGuardMiddleware

if TYPE_CHECKING:
    from dramatiq.broker import Broker

__all__ = ["find", "install", "uninstall"]

logger = logging.getLogger("task_state_guard_dramatiq")


def find(broker: Broker) -> TaskStateGuardMiddleware | None:
    """The TaskStateGuard middleware installed on ``broker``, if any."""
    for mw in broker.middleware:
        if isinstance(mw, TaskStateGuardMiddleware):
            return mw
    return None


def install(
    broker: Broker,
    db: str | os.PathLike[str] | None = None,
    *,
    on_lost: LostHook | None = None,
    **settings: Unpack[SettingArgs],
) -> TaskStateGuardMiddleware:
    """Add a :class:`TaskStateGuardMiddleware` as the **outermost** middleware of ``broker``.

    Idempotent: if the broker already has one, that instance is returned unchanged (a
    warning is logged when different settings were asked for). Each setting comes from the
    argument, then the ``TSG_<NAME>`` environment variable, then the default shared by every
    adapter; a bad value raises ``ConfigurationError``. Call it where the broker is built,
    **before** any actor module is imported: ``@dramatiq.actor(tsg_delivery=True)`` is
    validated against the broker's actor options at declaration time.

    No ledger connection is opened here (each worker process opens its own after fork).
    ``on_lost`` is called with a :class:`~task_state_guard.integration.LostTask` (message id,
    ledger id, actor name, code) for each message a reconcile found lost, after a
    ``TaskLostError`` was stored in the ``Results`` backend (when configured).
    """
    middleware = TaskStateGuardMiddleware(db, on_lost=on_lost, **settings)
    existing = find(broker)
    if existing is not None:
        if existing.settings != middleware.settings:
            logger.warning(
                "TaskStateGuard is already installed on this broker with other settings; "
                "keeping the installed middleware (uninstall first to change them)."
            )
        return existing
    if broker.middleware:
        broker.add_middleware(middleware, before=type(broker.middleware[0]))
        if broker.middleware[0] is not middleware:  # pragma: no cover - defensive
            broker.middleware.remove(middleware)
            broker.middleware.insert(0, middleware)
    else:
        broker.add_middleware(middleware)
    middleware._broker = broker
    return middleware


def uninstall(broker: Broker) -> bool:
    """Remove the middleware that :func:`install` added; ``True`` if there was one.

    Stops its heartbeat and periodic-reconcile threads in this process, closes its ledger
    handle, and withdraws the ``tsg_delivery`` actor option unless another middleware still
    declares it. Actors already declared keep their options (Dramatiq does not re-validate).
    """
    middleware = find(broker)
    if middleware is None:
        return False
    broker.middleware.remove(middleware)
    middleware._broker = None
    middleware.after_worker_shutdown(broker, None)  # type: ignore[arg-type]
    middleware.runtime.close()
    if not any(ACTOR_OPTION in mw.actor_options for mw in broker.middleware):
        broker.actor_options.discard(ACTOR_OPTION)
    return True
