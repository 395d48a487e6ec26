"""The error policy every adapter applies to ledger calls made from framework hooks.

A ledger call inside a hook must never break the user's job. So a failure is

* counted under ``"<where>:<ExceptionClass>"`` (``where`` names the hook or operation),
* logged once per kind and reason, at warning level, with the exception's class name and,
  for a storage or location error, its fixed reason from :mod:`task_state_guard.reasons`
  only (ledger errors never echo values, paths or exception texts into logs),
* and raised again only in strict mode (meant for tests).

A *conflict* is different: the ledger refused to rewrite a terminal record (for example a late
completion after a reconcile timed the task out). It is the ledger protecting history, not a
failure, so it is counted by kind and logged once, and never raised.

Counters belong to one process: a forked child starts with empty counters. ``on_count`` (set by
the runtime when a metrics directory is configured) hears of each increment, so the counts of
every process can be summed outside it (:mod:`task_state_guard.metrics.adapter_counters`).
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import TypeVar

from ..model import LedgerError
from ..process import THIS

T = TypeVar("T")
#: Told of each increment: ``(family, labels)`` of ``task_state_guard.metrics.adapter_counters``.
CountListener = Callable[[str, Mapping[str, str]], None]


class Guarded:
    """The block of :meth:`ErrorPolicy.guarded`: an ``Exception`` raised in it goes through
    :meth:`ErrorPolicy.error` (counted and logged; swallowed unless strict). A plain class,
    not a generator: one is entered around every framework hook."""

    __slots__ = ("_policy", "_where")

    def __init__(self, policy: ErrorPolicy, where: str) -> None:
        self._policy = policy
        self._where = where

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool:
        if not isinstance(exc, Exception):
            return False  # none, or not an Exception (KeyboardInterrupt, SystemExit): as is
        try:
            self._policy.error(self._where, exc)
        except BaseException as raised:
            if raised is exc:
                return False  # strict: the block's exception goes on, as it was raised
            raise
        return True


class ErrorPolicy:
    """Counts, logs once per kind and (in strict mode) raises ledger errors of hooks."""

    def __init__(self, logger: logging.Logger, *, strict: bool, subject: str = "job") -> None:
        self.logger = logger
        self.strict = strict
        self.subject = subject
        self._lock = threading.Lock()
        self._pid = THIS.pid
        self._errors: Counter[str] = Counter()
        self._logged: set[tuple[str, str | None]] = set()
        self._conflicts: Counter[str] = Counter()
        #: Hears of each counted error and conflict (must never raise).
        self.on_count: CountListener | None = None

    def _own(self) -> None:
        if self._pid != THIS.pid:  # forked: the parent's counts are not this process's
            self._lock = threading.Lock()
            self._pid = THIS.pid
            self._errors = Counter()
            self._logged = set()
            self._conflicts = Counter()

    def record(self, where: str, exc: BaseException) -> None:
        """Count ``exc`` under its kind and log the first of each kind and reason; never raises.

        The reason is a ledger error's fixed ``reason`` (never a path or a value); other
        exceptions have none.
        """
        self._own()
        kind = f"{where}:{type(exc).__name__}"
        reason = exc.reason if isinstance(exc, LedgerError) else None
        with self._lock:
            self._errors[kind] += 1
            first = (kind, reason) not in self._logged
            self._logged.add((kind, reason))
        if self.on_count is not None:
            self.on_count("tsg_adapter_ledger_errors_total",
                          {"hook": where, "error": type(exc).__name__})
        if first:
            self.logger.warning(
                "task-state-guard: ledger error (%s%s); the %s runs on. "
                "Further errors of this kind are counted, not logged.",
                kind,
                "" if reason is None else f", reason {reason}",
                self.subject,
            )

    def error(self, where: str, exc: BaseException) -> None:
        """:meth:`record` ``exc``, then raise it again in strict mode."""
        self.record(where, exc)
        if self.strict:
            raise exc

    def conflict(self, kind: str) -> None:
        """Count a refused rewrite of a terminal record; log the first of each kind."""
        self._own()
        with self._lock:
            self._conflicts[kind] += 1
            first = self._conflicts[kind] == 1
        if self.on_count is not None:
            self.on_count("tsg_adapter_conflicts_total", {"kind": kind})
        if first:
            self.logger.warning(
                "task-state-guard: %s refused: the record is already closed otherwise "
                "(e.g. by a reconcile) and keeps its first outcome. Further refusals of this "
                "kind are counted, not logged.",
                kind,
            )

    def guarded(self, where: str) -> Guarded:
        """Apply the policy to any ``Exception`` raised in the block."""
        return Guarded(self, where)

    def call(self, where: str, fn: Callable[[], T]) -> T | None:
        """Run ``fn``; on an ``Exception`` apply the policy and return ``None``."""
        try:
            return fn()
        except Exception as exc:
            self.error(where, exc)
            return None

    def errors(self) -> dict[str, int]:
        """Errors counted in this process, by ``"<where>:<ExceptionClass>"``."""
        self._own()
        with self._lock:
            return dict(self._errors)

    def conflicts(self) -> dict[str, int]:
        """Refused rewrites counted in this process, by kind."""
        self._own()
        with self._lock:
            return dict(self._conflicts)


__all__ = ["CountListener", "ErrorPolicy", "Guarded"]
