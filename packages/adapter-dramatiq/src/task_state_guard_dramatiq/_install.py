"""``install``: put the middleware outermost on a broker, idempotently (``add_outermost``,
``find`` and ``uninstall`` live beside the middleware, which uninstalls itself with them)."""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Unpack

from task_state_guard.integration import LostHook, SettingArgs

from .middleware import TaskStateGuardMiddleware, add_outermost, find, uninstall

if TYPE_CHECKING:
    from dramatiq.broker import Broker

__all__ = ["find", "install", "uninstall"]

logger = logging.getLogger("task_state_guard_dramatiq")


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
    ``TaskLostError`` was stored in the ``Results`` backend (when configured); never for a
    message whose return value the ``Results`` backend holds (it is closed succeeded).
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
    add_outermost(broker, middleware)
    return middleware
