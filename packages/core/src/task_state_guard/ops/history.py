"""Outcomes over time: logical tasks closed per time bucket, by outcome. Counts only, no ids.

A job counts once, when its logical task (a root) closed, under one outcome: ``succeeded``,
``failed``, ``lost`` (timed out with one of ``model.LOST_CODES``: its owner died, a restart
found it stale, or its deadline passed), ``timed_out`` (a time limit) or ``cancelled``. The
counts come from the tasks still in the ledger: history that ``tsg prune`` deleted is not in
them (the monotonic totals of ``tsg status`` keep it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..model import LOST_CODES, InvalidInput, check_seconds

if TYPE_CHECKING:
    from ..store.protocol import Database

OUTCOMES = ("succeeded", "failed", "lost", "timed_out", "cancelled")
MAX_BUCKETS = 500

@dataclass(frozen=True, slots=True)
class OutcomeHistory:
    """Closes per bucket: ``counts[outcome][i]`` jobs closed in
    ``[start + i * bucket_seconds, start + (i + 1) * bucket_seconds)``."""

    start: float
    bucket_seconds: float
    counts: dict[str, list[int]]

    @property
    def buckets(self) -> int:
        """The number of buckets."""
        return len(self.counts[OUTCOMES[0]])


def outcome_of(status: Any, code: Any) -> str | None:
    """The outcome a closed job counts under (None for a state that is not terminal)."""
    if status == "timed_out":
        return "lost" if code in LOST_CODES else "timed_out"
    return status if status in OUTCOMES else None


def outcome_history(db: Database, *, window_seconds: float, buckets: int) -> OutcomeHistory:
    """Logical tasks closed in the last ``window_seconds``, in ``buckets`` equal buckets ending
    now (the ledger's clock)."""
    window, width = checked_window(window_seconds, buckets)
    with db.read() as conn:
        now = db.now()
        closes = db.queries.root_closes(conn, now - window, width, now)
    return history_of(now - window, width, buckets, closes)


def checked_window(window_seconds: float, buckets: int) -> tuple[float, float]:
    """``(window, bucket width)`` in seconds; :class:`InvalidInput` for a bad value."""
    window = check_seconds(window_seconds, "window_seconds", allow_zero=False)
    if isinstance(buckets, bool) or not isinstance(buckets, int) or not 1 <= buckets <= MAX_BUCKETS:
        raise InvalidInput("buckets is out of range")
    return window, window / buckets


def history_of(start: float, width: float, buckets: int,
               closes: list[tuple[Any, Any, Any, int]]) -> OutcomeHistory:
    """The history of ``closes``: ``(bucket, state, code, count)`` rows as
    :meth:`~task_state_guard.store.queries.Queries.root_closes` gives them."""
    counts = {outcome: [0] * buckets for outcome in OUTCOMES}
    for index, status, code, count in closes:
        _add(counts, index, status, code, int(count))
    return OutcomeHistory(start, width, counts)


def _add(counts: dict[str, list[int]], index: Any, status: Any, code: Any, count: int) -> None:
    outcome = outcome_of(status, code)
    if outcome is None or not isinstance(index, int | float) or not math.isfinite(index):
        return  # only a tampered row has such values; doctor reports the file
    slot = min(max(int(index), 0), len(counts[outcome]) - 1)
    counts[outcome][slot] += count


__all__ = ["OUTCOMES", "OutcomeHistory", "checked_window", "history_of", "outcome_history",
           "outcome_of"]
