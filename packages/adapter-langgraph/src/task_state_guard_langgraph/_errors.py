"""Counting and once-per-kind logging of ledger errors (the user's graph never breaks)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TypeVar

logger = logging.getLogger("task_state_guard_langgraph")

T = TypeVar("T")


class ErrorLog:
    """Counts ledger errors by kind and logs the first one of each kind.

    With ``strict=True`` the error is re-raised instead (meant for tests).
    """

    def __init__(self, *, strict: bool = False) -> None:
        self.strict = strict
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}

    def record(self, operation: str, exc: BaseException) -> None:
        """Count ``exc`` under ``"<operation>:<ExceptionClass>"``; log it if it is new."""
        kind = f"{operation}:{type(exc).__name__}"
        with self._lock:
            first = kind not in self._counts
            self._counts[kind] = self._counts.get(kind, 0) + 1
        if first:
            # Only the class name: ledger errors must not echo values into logs.
            logger.warning(
                "TaskStateGuard ledger error (%s); the graph keeps running. "
                "Further errors of this kind are counted, not logged.",
                kind,
            )

    def call(self, operation: str, fn: Callable[[], T]) -> T | None:
        """Run ``fn``; on any ``Exception`` record it and return ``None`` (raise if strict)."""
        try:
            return fn()
        except Exception as exc:
            self.record(operation, exc)
            if self.strict:
                raise
            return None

    def counts(self) -> dict[str, int]:
        """A copy of the counters, ``{"<operation>:<ExceptionClass>": n}``."""
        with self._lock:
            return dict(self._counts)

    def total(self) -> int:
        """Number of errors recorded so far."""
        with self._lock:
            return sum(self._counts.values())
