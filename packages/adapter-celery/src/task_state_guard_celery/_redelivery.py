"""How long the broker may still hand an ``acks_late`` task to another worker after the worker
running it died: the attempt's redelivery window, derived from the app's broker configuration.

A task acknowledged early (Celery's default) is gone with its worker: no window. An
``acks_late`` message stays unacknowledged, and the broker puts it back in its queue:

* **Redis** (kombu's ``redis`` transport, Sentinel included): a delivered message sits in the
  ``unacked`` index; a sweep (``restore_visible``) in the event loop of any live consumer of the
  broker restores those older than ``visibility_timeout`` (default 3600 s). The sweep is called
  every ``unacked_restore_interval`` seconds (default 10) and scans only on every
  ``unacked_restore_throttle``-th call (default 10): about 100 s more by default.
* **SQS**: the message becomes visible again when its ``visibility_timeout`` ends (kombu's
  default 1800 s); no sweep.
* **AMQP** (RabbitMQ): the broker requeues an unacknowledged message as soon as the consumer's
  connection is gone: at once when the worker process dies on a living host, and for a host that
  vanished once the broker missed two heartbeats (``broker_heartbeat``, Celery's default 120 s;
  with heartbeats off, RabbitMQ's own proposal of 60 s is assumed).
* Any other transport: unknown, no window (the grace rules alone judge the job).

The window is counted from the attempt's last sign of life (its start or latest heartbeat). It
is an upper bound for Redis and SQS, whose clocks start when the message was delivered (no later
than the start), and for AMQP, whose clock starts when the worker died (no earlier than its
last heartbeat). The runtime adds the active grace, the time a redelivered message may wait in
its queue for a free worker before its new attempt starts.
"""

from __future__ import annotations

from typing import Any

from task_state_guard.integration.redelivery import config_seconds

#: RabbitMQ's server-side heartbeat proposal, assumed when the client turns heartbeats off.
AMQP_SERVER_HEARTBEAT = 60.0


def broker_window(app: Any) -> float | None:
    """Seconds after a dead worker's last sign of life within which the broker of ``app`` puts
    an unacknowledged message back in its queue; ``None`` when unknown."""
    try:
        with app.connection_for_write() as conn:  # builds the transport; connects to nothing
            kind = conn.transport.driver_type
    except Exception:  # an unknown or unloadable transport: no window
        return None
    options = dict(app.conf.broker_transport_options or {})
    if kind == "redis":
        from kombu.transport.redis import Channel

        timeout = config_seconds(options.get("visibility_timeout"), Channel.visibility_timeout)
        interval = config_seconds(options.get("unacked_restore_interval"),
                           Channel.unacked_restore_interval)
        if interval <= 0:  # kombu falls back to its default then
            interval = float(Channel.unacked_restore_interval)
        throttle = max(1.0, config_seconds(options.get("unacked_restore_throttle"),
                                    Channel.unacked_restore_throttle))
        return timeout + interval * throttle
    if kind == "sqs":
        from kombu.transport.SQS import Channel as SQSChannel

        return config_seconds(options.get("visibility_timeout"),
                              SQSChannel.default_visibility_timeout)
    if kind == "amqp":
        heartbeat = config_seconds(app.conf.broker_heartbeat, 0.0)
        return 2 * (heartbeat if heartbeat > 0 else AMQP_SERVER_HEARTBEAT)
    return None



__all__ = ["AMQP_SERVER_HEARTBEAT", "broker_window"]
