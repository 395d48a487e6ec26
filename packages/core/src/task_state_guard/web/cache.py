"""Recent results of the web view's expensive reads, reused for a few seconds (thread-safe).

A read is kept only when it was expensive: one that took ``cost`` seconds (at least
``min_cost``) is reused for ``min(max_age, 10 * cost)`` seconds, so a ledger whose overview
takes 2 s is read at most every 5 s however many tabs and scrapers ask, while a small ledger
(a few milliseconds a read) is read afresh on every request. Concurrent requests for the same
key share one read: the first computes, the others wait for its result (or its error).

Bounded: at most ``max_entries`` results and ``max_bytes`` bytes of them (as the caller
measures a result); the least recently used go first, and a result larger than the whole
budget is never kept. Nothing here touches the ledger: the caller's ``compute`` does.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

T = TypeVar("T")

#: How long, at most, a result is reused; how expensive a read must be to be kept at all; how
#: many seconds of reuse each second of reading buys.
MAX_AGE = 5.0
MIN_COST = 0.1
AGE_PER_COST = 10.0
MAX_ENTRIES = 64
MAX_BYTES = 16 * 1024 * 1024


class _Flight:
    """One read in progress: the others asking for its key wait on ``done``."""

    __slots__ = ("done", "error", "value")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.value: Any = None
        self.error: BaseException | None = None


class Cache(Generic[T]):
    """Results by key (page and query), reused while fresh; one read per key at a time."""

    def __init__(self, *, max_age: float = MAX_AGE, min_cost: float = MIN_COST,
                 max_entries: int = MAX_ENTRIES, max_bytes: int = MAX_BYTES,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_age = max_age
        self.min_cost = min_cost
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: OrderedDict[Hashable, tuple[T, int, float]] = OrderedDict()
        self._bytes = 0
        self._flights: dict[Hashable, _Flight] = {}
        self.reads = 0  # how many times ``compute`` ran (for the tests and benchmarks)

    def get(self, key: Hashable, compute: Callable[[], T], size: Callable[[T], int]) -> T:
        """The fresh result kept under ``key``, the result of the read in progress for it, or
        ``compute()`` (kept when expensive; its exception reaches every waiting caller)."""
        with self._lock:
            kept = self._entries.get(key)
            if kept is not None and kept[2] > self._clock():
                self._entries.move_to_end(key)
                return kept[0]
            flight = self._flights.get(key)
            leader = flight is None
            if flight is None:
                flight = self._flights[key] = _Flight()
                self.reads += 1
        if not leader:
            flight.done.wait()
            if flight.error is not None:
                raise flight.error
            value: T = flight.value
            return value
        started = self._clock()
        try:
            value = compute()
        except BaseException as exc:
            flight.error = exc
            raise
        else:
            flight.value = value
            self._keep(key, value, size(value), self._clock() - started)
            return value
        finally:
            with self._lock:
                self._flights.pop(key, None)
            flight.done.set()

    def _keep(self, key: Hashable, value: T, nbytes: int, cost: float) -> None:
        if cost < self.min_cost or nbytes > self.max_bytes:
            return
        with self._lock:
            self._drop(key)
            self._entries[key] = (value, nbytes, self._clock() + min(
                self.max_age, AGE_PER_COST * cost))
            self._bytes += nbytes
            now = self._clock()
            for stale in [k for k, (_v, _n, until) in self._entries.items() if until <= now]:
                self._drop(stale)
            while len(self._entries) > self.max_entries or self._bytes > self.max_bytes:
                self._drop(next(iter(self._entries)))

    def _drop(self, key: Hashable) -> None:
        kept = self._entries.pop(key, None)
        if kept is not None:
            self._bytes -= kept[1]

    def sizes(self) -> tuple[int, int]:
        """How many results are kept, and their bytes."""
        with self._lock:
            return len(self._entries), self._bytes


__all__ = ["MAX_AGE", "Cache"]
