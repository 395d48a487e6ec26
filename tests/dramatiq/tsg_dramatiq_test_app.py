"""Dramatiq app run by the tests with the real CLI: ``dramatiq tsg_dramatiq_test_app -p 2 -t 2``.

Configured entirely from the environment so every test gets its own broker namespace,
queue and ledger:

TSG_TEST_BROKER     redis | rabbitmq
TSG_TEST_URL        broker URL
TSG_TEST_NAMESPACE  Redis key namespace
TSG_TEST_QUEUE      queue of every actor
TSG_TEST_DIR        scratch directory (pid / marker files)
TSG_TEST_BACKOFF_MS min_backoff of the retrying actors
TSG_TEST_REDIS_HEARTBEAT_MS  Redis broker heartbeat_timeout (redelivery after a crash)
TSG_TEST_REDIS_MAINTENANCE  Redis broker maintenance_chance (0: a dead worker's messages are
                    never requeued)
TSG_TEST_RESULTS    1 = the Results middleware (Redis backend, namespace ``<namespace>-results``;
                    with RabbitMQ as the broker the results go to ``RESULTS_REDIS``),
                    HoldAfterResults and the ``stored_sleeper`` / ``stored_crash_once`` /
                    ``stored_hold`` actors (store_results=True)
TSG_TEST_ON_LOST    1 = an ``on_lost`` hook that writes each lost message as JSON (scratch dir)
TSG_DB, TSG_ACTIVE_GRACE_SECONDS, TSG_HEARTBEAT_SECONDS, TSG_STRICT ...  adapter
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import dramatiq
from dramatiq.brokers.rabbitmq import RabbitmqBroker
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import AsyncIO, CurrentMessage, Middleware, SkipMessage
from task_state_guard_dramatiq import install

QUEUE = os.environ["TSG_TEST_QUEUE"]
RESULTS_REDIS = "redis://127.0.0.1:6379/13"  # the Results backend of a RabbitMQ-broker run
SCRATCH = Path(os.environ["TSG_TEST_DIR"])
BACKOFF_MS = int(os.environ.get("TSG_TEST_BACKOFF_MS", "100"))


class SkipByName(Middleware):
    """Raises SkipMessage (without failing the message) for actors named ``skip_*``."""

    def before_process_message(self, broker: Any, message: Any) -> None:
        if message.actor_name.startswith("skip_"):
            raise SkipMessage("skipped by test middleware")


class DieBeforeAck(Middleware):
    """Kills its own worker process (SIGKILL) before the ack of the first run of a
    ``die_before_ack`` message: after the actor returned, before the broker settled it."""

    def before_ack(self, broker: Any, message: Any) -> None:
        if message.actor_name != "die_before_ack":
            return
        tag = message.args[0]
        killed = SCRATCH / f"killed-{tag}"
        if not killed.exists():
            killed.write_text(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGKILL)


class HoldAfterResults(Middleware):
    """Placed before Results in the list, so that its ``after_process_message`` runs right after
    Results stored the return value (Dramatiq calls after-hooks in reverse order), and before
    the TaskStateGuard middleware's hooks and the ack: on the first run of a ``stored_hold``
    message it writes ``held-<tag>`` (its pid) and holds the worker thread there until the test
    SIGKILLs the process."""

    def after_process_message(
        self, broker: Any, message: Any, *, result: Any = None, exception: Any = None
    ) -> None:
        if message.actor_name != "stored_hold" or exception is not None:
            return
        held = SCRATCH / f"held-{message.args[0]}"
        if held.exists():
            return  # a later run (the redelivered copy) goes on
        held.with_suffix(".tmp").write_text(str(os.getpid()))
        held.with_suffix(".tmp").replace(held)
        _sleep(300)


def _broker() -> dramatiq.Broker:
    kind = os.environ["TSG_TEST_BROKER"]
    url = os.environ["TSG_TEST_URL"]
    broker: dramatiq.Broker
    if kind == "redis":
        broker = RedisBroker(  # type: ignore[no-untyped-call]
            url=url,
            namespace=os.environ["TSG_TEST_NAMESPACE"],
            heartbeat_timeout=int(os.environ.get("TSG_TEST_REDIS_HEARTBEAT_MS", "60000")),
            maintenance_chance=int(os.environ.get("TSG_TEST_REDIS_MAINTENANCE", "1000")),
        )
    elif kind == "rabbitmq":
        broker = RabbitmqBroker(url=url)
    else:  # pragma: no cover
        raise RuntimeError(kind)
    broker.add_middleware(AsyncIO())
    broker.add_middleware(CurrentMessage())
    broker.add_middleware(SkipByName())
    broker.add_middleware(DieBeforeAck())
    if RESULTS:
        from dramatiq.results import Results
        from dramatiq.results.backends import RedisBackend

        backend = RedisBackend(url=url if kind == "redis" else RESULTS_REDIS,
                               namespace=os.environ["TSG_TEST_NAMESPACE"] + "-results")
        broker.add_middleware(HoldAfterResults())
        broker.add_middleware(Results(backend=backend))
    return broker


def _record_lost(lost: Any) -> None:
    """The test's ``on_lost`` hook: one JSON file per lost message (``.again`` for a second
    call)."""
    fields = {
        "framework_id": lost.framework_id,
        "task_id": lost.task_id,
        "name": lost.name,
        "code": lost.code,
        "pid": os.getpid(),
    }
    path = SCRATCH / f"lost-{lost.framework_id or lost.task_id}"
    if path.exists():  # a hook that fired twice for one message: the tests fail on it
        path = path.with_name(path.name + ".again")
    path.with_suffix(".tmp").write_text(json.dumps(fields))
    path.with_suffix(".tmp").replace(path)


RESULTS = os.environ.get("TSG_TEST_RESULTS") == "1"
broker = _broker()
# Settings from the TSG_* environment.
guard = install(broker, on_lost=_record_lost if os.environ.get("TSG_TEST_ON_LOST") == "1" else None)
dramatiq.set_broker(broker)


def _retries() -> int:
    message = CurrentMessage.get_current_message()
    assert message is not None
    return int(message.options.get("retries") or 0)


def _touch(name: str, text: str = "") -> None:
    (SCRATCH / name).write_text(text)


def _sleep(seconds: float) -> None:
    # Small steps so that async exceptions (TimeLimit, Shutdown) land promptly.
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.05)


@dramatiq.actor(queue_name=QUEUE, max_retries=0)
def ok() -> None:
    """Succeeds at once."""


@dramatiq.actor(queue_name=QUEUE, max_retries=0, tsg_delivery=True)
def deliver() -> None:
    """Succeeds; its logical task owes the user a delivery."""


@dramatiq.actor(queue_name=QUEUE, max_retries=0, tsg_delivery=True)
def deliver_inside() -> None:
    """Delivers from inside the actor (deferred until the logical task closes)."""
    message = CurrentMessage.get_current_message()
    assert message is not None
    guard.mark_delivered(message.message_id)


@dramatiq.actor(queue_name=QUEUE, max_retries=5, min_backoff=BACKOFF_MS, max_backoff=BACKOFF_MS)
def flaky(failures: int) -> None:
    """Fails its first ``failures`` attempts."""
    if _retries() < failures:
        raise ValueError("planned failure")


@dramatiq.actor(queue_name=QUEUE, max_retries=2, min_backoff=100, max_backoff=100)
def always_fail() -> None:
    raise ValueError("always")


@dramatiq.actor(queue_name=QUEUE, max_retries=5, min_backoff=100, throws=(KeyError,))
def throws_match() -> None:
    raise KeyError("expected")


@dramatiq.actor(queue_name=QUEUE, min_backoff=100, retry_when=lambda retries, exc: False)
def retry_when_no() -> None:
    raise ValueError("not retried")


@dramatiq.actor(queue_name=QUEUE, time_limit=400, max_retries=1, min_backoff=100, max_backoff=100)
def too_slow() -> None:
    _sleep(10)


@dramatiq.actor(queue_name=QUEUE, time_limit=400, max_retries=1, min_backoff=100, max_backoff=100)
def slow_first() -> None:
    """Exceeds its time limit on the first attempt only."""
    if _retries() == 0:
        _sleep(10)


@dramatiq.actor(
    queue_name=QUEUE, notify_shutdown=True, max_retries=3, min_backoff=100, max_backoff=100
)
def notified(tag: str) -> None:
    """Runs until a shutdown interrupts it (first attempt); later attempts finish at once."""
    if _retries() == 0:
        _touch(f"started-{tag}", str(os.getpid()))
        _sleep(30)


@dramatiq.actor(queue_name=QUEUE, max_age=1000, max_retries=0)
def aged() -> None:
    """Never runs when its message is older than 1 s (AgeLimit)."""


@dramatiq.actor(queue_name=QUEUE, max_retries=0)
def skip_me() -> None:
    """Skipped by SkipByName before it runs."""


@dramatiq.actor(queue_name=QUEUE, max_retries=0)
def crash_once(tag: str, seconds: float) -> None:
    """Writes its pid, then works ``seconds`` (later runs: 0.2 s); tests SIGKILL the first."""
    marker = SCRATCH / f"run-{tag}"
    runs = int(marker.read_text()) if marker.exists() else 0
    marker.write_text(str(runs + 1))
    _touch(f"pid-{tag}-{runs + 1}", str(os.getpid()))
    _sleep(seconds if runs == 0 else min(seconds, 0.2))


@dramatiq.actor(queue_name=QUEUE, max_retries=0)
def die_before_ack(tag: str) -> None:
    """Counts its runs; DieBeforeAck kills the process before the first run's ack."""
    marker = SCRATCH / f"run-{tag}"
    marker.write_text(str(int(marker.read_text()) + 1 if marker.exists() else 1))


@dramatiq.actor(queue_name=QUEUE, max_retries=0)
def sleeper(seconds: float) -> None:
    _sleep(seconds)


@dramatiq.actor(queue_name=QUEUE, max_retries=0)
async def async_ok() -> None:
    await asyncio.sleep(0.01)


@dramatiq.actor(queue_name=QUEUE, max_retries=5, min_backoff=BACKOFF_MS, max_backoff=BACKOFF_MS)
async def async_flaky(tag: str, failures: int) -> None:
    # CurrentMessage's context does not reach the event loop thread: count in a file.
    await asyncio.sleep(0.01)
    marker = SCRATCH / f"async-{tag}"
    runs = int(marker.read_text()) if marker.exists() else 0
    marker.write_text(str(runs + 1))
    if runs < failures:
        raise ValueError("planned failure")


@dramatiq.actor(queue_name=QUEUE, max_retries=0)
async def async_fail() -> None:
    await asyncio.sleep(0.01)
    raise ValueError("async failure")


if RESULTS:

    @dramatiq.actor(queue_name=QUEUE, max_retries=0, store_results=True)
    def stored_sleeper(tag: str, seconds: float) -> str:
        """Writes its pid, then sleeps; its result (or failure) goes to the Results backend."""
        _touch(f"pid-{tag}", str(os.getpid()))
        _sleep(seconds)
        return "slept"

    @dramatiq.actor(queue_name=QUEUE, max_retries=0, store_results=True)
    def stored_hold(tag: str) -> str:
        """Counts its runs (``run-<tag>``) and returns ``"done"``; HoldAfterResults holds its
        first run after Results stored that value, before the ack."""
        marker = SCRATCH / f"run-{tag}"
        marker.write_text(str(int(marker.read_text()) + 1 if marker.exists() else 1))
        return "done"

    @dramatiq.actor(queue_name=QUEUE, max_retries=0, store_results=True)
    def stored_crash_once(tag: str, seconds: float) -> str:
        """``crash_once`` with a stored result: ``"run <n>"``, n the run that finished."""
        crash_once.fn(tag, seconds)
        return f"run {(SCRATCH / f'run-{tag}').read_text()}"
