"""The web view's reuse of expensive reads (`task_state_guard.web.cache`): what is kept, for how
long, within which bounds, and that concurrent identical requests share one read. The clock is
injected: no test here waits for time to pass."""

from __future__ import annotations

import threading
import time

import pytest
from task_state_guard.web.cache import Cache


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _read(clock: _Clock, cost: float, value: str) -> str:
    clock.now += cost
    return value


def test_an_expensive_read_is_reused_while_fresh_and_a_cheap_one_never() -> None:
    clock = _Clock()
    cache: Cache[str] = Cache(clock=clock)
    assert cache.get("a", lambda: _read(clock, 0.3, "first"), len) == "first"
    clock.now += 2.9  # reused for min(5 s, 10 x 0.3 s) = 3 s
    assert cache.get("a", lambda: _read(clock, 0.3, "second"), len) == "first"
    clock.now += 0.2
    assert cache.get("a", lambda: _read(clock, 0.3, "third"), len) == "third"
    assert cache.get("b", lambda: _read(clock, 0.01, "cheap"), len) == "cheap"
    assert cache.get("b", lambda: _read(clock, 0.01, "fresh"), len) == "fresh"
    assert cache.reads == 4
    clock.now += 1.0
    assert cache.get("c", lambda: _read(clock, 3.0, "slow"), len) == "slow"
    clock.now += 4.9  # at most 5 s however slow
    assert cache.get("c", lambda: _read(clock, 0.3, "again"), len) == "slow"
    clock.now += 0.2
    assert cache.get("c", lambda: _read(clock, 0.3, "again"), len) == "again"


def test_entries_and_bytes_stay_within_their_bounds() -> None:
    clock = _Clock()
    cache: Cache[str] = Cache(clock=clock, max_entries=3, max_bytes=100)
    for n in range(10):
        cache.get(n, lambda n=n: _read(clock, 0.5, str(n) * 30), len)
        entries, size = cache.sizes()
        assert entries <= 3 and size <= 100
    assert cache.sizes() == (3, 90)
    cache.get("big", lambda: _read(clock, 0.5, "x" * 101), len)  # larger than the budget
    assert cache.sizes() == (3, 90)
    before = cache.reads
    assert cache.get(9, lambda: "never read", len) == "9" * 30  # the most recent is kept
    assert cache.reads == before


def test_concurrent_identical_requests_share_one_read_and_its_error() -> None:
    cache: Cache[str] = Cache()
    started, release = threading.Event(), threading.Event()
    answers: list[str] = []

    def slow() -> str:
        started.set()
        release.wait(30)
        return "shared"

    def ask() -> None:
        answers.append(cache.get("page", slow, len))

    threads = [threading.Thread(target=ask) for _ in range(6)]
    threads[0].start()
    assert started.wait(30)
    for thread in threads[1:]:
        thread.start()
    time.sleep(1.0)  # the others reach the read in progress (a cheap read is never kept)
    release.set()
    for thread in threads:
        thread.join(30)
    assert answers == ["shared"] * 6 and cache.reads == 1

    failing = threading.Event()

    def broken() -> str:
        failing.wait(30)
        raise OSError("the ledger is gone")

    errors: list[BaseException] = []

    def ask_broken() -> None:
        try:
            cache.get("broken", broken, len)
        except OSError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=ask_broken) for _ in range(3)]
    for thread in threads:
        thread.start()
    failing.set()
    for thread in threads:
        thread.join(30)
    assert len(errors) == 3
    with pytest.raises(OSError):  # an error is never kept: the next request reads again
        cache.get("broken", broken, len)
