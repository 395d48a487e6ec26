"""Redelivery windows: how long a lost attempt's job may still come back from its broker.

An adapter derives its broker's window (how long after a dead worker's last sign of life the
broker puts an unacknowledged message back in its queue) from the broker's own configuration and
hands it to :meth:`~task_state_guard.integration.AdapterRuntime.claim_attempt`; the runtime
records it with the attempt's start, plus the active grace (the time a requeued message may wait
for a free worker before its new attempt starts). Reconcile then closes the lost attempt at once
but keeps its logical task fresh until that bound has passed, so a job that will run again is
never declared lost before its window.
"""

from __future__ import annotations

import math
from typing import Any


def config_seconds(value: Any, default: float) -> float:
    """A broker setting read as seconds: ``value`` when it is a finite number >= 0 (or text of
    one), else ``default`` (a broker library's own default)."""
    try:
        number = float(value) if value is not None else float(default)
    except (TypeError, ValueError):
        return float(default)
    return number if math.isfinite(number) and number >= 0 else float(default)


__all__ = ["config_seconds"]
