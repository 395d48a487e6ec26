"""What ``tsg metrics`` prints and ``tsg serve`` answers on ``/metrics``: the ledger's
families and the adapters' summed counters (read-only; the commands and the web app share it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import adapter_counters
from .prometheus import format_prometheus

if TYPE_CHECKING:
    from ..ledger import Ledger


def metrics_text(
    ledger: Ledger, *, active_grace_seconds: float | None = None, metrics_dir: str | None = None
) -> str:
    """What ``tsg metrics`` prints: the ledger's families (``Ledger.status()``) and, with a
    metrics directory, the adapters' counters summed over every process that counted into it."""
    text = format_prometheus(ledger.status(active_grace_seconds=active_grace_seconds))
    if metrics_dir is not None:
        text += adapter_counters.format_directory(metrics_dir)
    return text


__all__ = ["metrics_text"]
