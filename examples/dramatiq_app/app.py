"""A small Dramatiq app recorded by TaskStateGuard.

Run the worker (Redis on 127.0.0.1:6379, ledger path in TSG_DB):

    TSG_DB=/tmp/tsg-dramatiq-demo/tasks.sqlite \
        .venv/bin/dramatiq app -p 2 -t 2 --path examples/dramatiq_app

``install`` runs here, where the broker is built and *before* the actors below are
declared, so ``tsg_delivery=True`` is a known actor option and the middleware is outermost.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import dramatiq
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import CurrentMessage
from task_state_guard_dramatiq import install

REDIS_URL = os.environ.get("DEMO_REDIS_URL", "redis://127.0.0.1:6379/14")
NAMESPACE = os.environ.get("DEMO_NAMESPACE", "tsg-dramatiq-demo")
OUTBOX = Path(os.environ.get("DEMO_OUTBOX", os.path.dirname(os.environ.get("TSG_DB", ".")) or "."))

broker = RedisBroker(  # type: ignore[no-untyped-call]
    url=REDIS_URL,
    namespace=NAMESPACE,
    # Redis hands a crashed worker's unacked messages back only after its heartbeat timeout
    # (default 60 s) *and* a lucky "maintenance" call (0.1 % of fetches): minutes. The demo
    # shortens both so the crash scenario converges in seconds. See the adapter README.
    heartbeat_timeout=int(os.environ.get("DEMO_REDIS_HEARTBEAT_MS", "60000")),
    maintenance_chance=int(os.environ.get("DEMO_REDIS_MAINTENANCE", "1000")),
)
broker.add_middleware(CurrentMessage())
guard = install(broker)  # db from TSG_DB; graces from TSG_* variables
dramatiq.set_broker(broker)


def _message_id() -> str:
    message = CurrentMessage.get_current_message()
    assert message is not None
    return message.message_id


def _retries() -> int:
    message = CurrentMessage.get_current_message()
    assert message is not None
    return int(message.options.get("retries") or 0)


def send_to_user(user: str, text: str) -> bool:
    """A stand-in transport: appends to an outbox file and 'acknowledges'."""
    with open(OUTBOX / "outbox.txt", "a", encoding="utf-8") as fh:
        fh.write(f"to {user}: {text}\n")
    return True


@dramatiq.actor(max_retries=3, min_backoff=500, max_backoff=1000, tsg_delivery=True)
def answer(user: str, question: str) -> None:
    """Answers a user; its logical task owes the user a delivery."""
    reply = f"{len(question.split())} words received"
    if send_to_user(user, reply):
        # Only the transport's acknowledgement makes a delivery (a broker ack does not).
        # Inside the actor the mark is applied when the logical task closes.
        guard.mark_delivered(_message_id())


@dramatiq.actor(max_retries=3, min_backoff=500, max_backoff=1000)
def fetch_feed(feed: str) -> None:
    """Fails its first attempt (a flaky upstream); Retries runs it again."""
    if _retries() == 0:
        raise ConnectionError("upstream hiccup")


@dramatiq.actor(max_retries=1, min_backoff=200, max_backoff=200)
def doomed() -> None:
    """Always fails: retried once, then dead-lettered."""
    raise RuntimeError("this job cannot succeed")


@dramatiq.actor(max_retries=0)
def nightly_report(seconds: float) -> None:
    """A long job; the demo SIGKILLs the worker process running it once."""
    pid_file = OUTBOX / "report.pid"
    if not pid_file.exists():
        pid_file.write_text(str(os.getpid()))
        time.sleep(seconds)
    else:
        time.sleep(0.2)  # the redelivered run after the crash
