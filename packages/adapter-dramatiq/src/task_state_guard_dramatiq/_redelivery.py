"""How long a Dramatiq broker may still hand a message to another worker after the worker
running it died: the attempt's redelivery window, derived from the broker's configuration.

Dramatiq acknowledges a message only after it was processed, on every broker, so the message of
a worker that died is redelivered:

* **Redis** (``RedisBroker``): each worker process writes a heartbeat with every broker
  command; a process silent for ``heartbeat_timeout`` (default 60,000 ms) counts as dead, and
  its unacknowledged messages go back to their queue during *maintenance*, which any live
  consumer's command triggers with a chance of ``maintenance_chance`` in a million (default
  1,000). An idle consumer issues about one command per ``dramatiq_worker_timeout`` (1 s), so
  maintenance comes about every 1,000 s of one idle consumer, sooner with more: the window allows
  three times that (95 % for a single consumer). ``maintenance_chance=0`` never requeues: the
  message is lost after the heartbeat timeout.
* **RabbitMQ** (``RabbitmqBroker``): the broker requeues an unacknowledged message as soon as the
  consumer's connection is gone: at once when the process dies on a living host, and for a host
  that vanished once the broker missed two heartbeats (pika's ``heartbeat`` parameter, e.g.
  ``?heartbeat=30`` in the URL; unset, the server's proposal of 60 s).
* Any other broker (the in-memory ``StubBroker``): no window.

The window is counted from the attempt's last sign of life (its start or latest heartbeat); the
runtime adds the active grace, the time a requeued message may wait for a free worker.
"""

from __future__ import annotations

import os
from typing import Any

from task_state_guard.integration.redelivery import config_seconds

#: RabbitMQ's server-side heartbeat proposal, used when the client does not set one.
AMQP_SERVER_HEARTBEAT = 60.0
#: How often an idle Dramatiq consumer issues a broker command (seconds).
_POLL_SECONDS = config_seconds(os.getenv("dramatiq_worker_timeout"), 1000.0) / 1000.0  # noqa: SIM112 (Dramatiq's own name)
#: Multiples of the expected wait for maintenance the window allows.
_MAINTENANCE_ALLOWANCE = 3.0


def broker_window(broker: Any) -> float | None:
    """Seconds after a dead worker's last sign of life within which ``broker`` puts its
    unacknowledged messages back in their queue; ``None`` when unknown."""
    kind = type(broker).__name__
    if kind == "RedisBroker":
        from dramatiq.brokers.redis import MAINTENANCE_SCALE

        heartbeat = config_seconds(getattr(broker, "heartbeat_timeout", None), 60_000.0) / 1000.0
        chance = config_seconds(getattr(broker, "maintenance_chance", None), 0.0)
        if chance <= 0:
            return heartbeat
        return heartbeat + _MAINTENANCE_ALLOWANCE * MAINTENANCE_SCALE / chance * _POLL_SECONDS
    if kind == "RabbitmqBroker":
        parameters = getattr(broker, "parameters", None)
        if isinstance(parameters, list | tuple):
            parameters = parameters[0] if parameters else None
        proposed = getattr(parameters, "heartbeat", None)  # None: the server's; or a callable
        seconds = config_seconds(None if callable(proposed) else proposed, 0.0)
        return 2 * (seconds if seconds > 0 else AMQP_SERVER_HEARTBEAT)
    return None



__all__ = ["AMQP_SERVER_HEARTBEAT", "broker_window"]
