"""Draining a server's in-flight runs when its shutdown signal arrives.

ASGI servers (uvicorn, hypercorn) run the application's lifespan shutdown only after the
requests in flight have finished, or were cancelled when the graceful-shutdown timeout ran out:
a drain asked for from the lifespan shutdown comes too late. :func:`drain_on_signals`, called
from the lifespan startup (after the server installed its own signal handlers), puts a handler
in front of the server's: on ``SIGTERM`` (or ``SIGINT``) it asks every run of the guarded
graph to stop at its next step boundary, then lets the server's handler begin its graceful
shutdown. Each drained run raises ``GraphDrained`` to its request (answer it, e.g. 503 with
the thread id), closes ``cancelled/interrupted``, and the next start resumes it.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterable
from types import FrameType
from typing import Any, Protocol

#: The signals a server stops on.
SHUTDOWN_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Drainable(Protocol):
    def request_drain(self, reason: str = "shutdown") -> int: ...


def drain_on_signals(
    graph: Drainable, signals: Iterable[signal.Signals] = SHUTDOWN_SIGNALS
) -> Callable[[], None]:
    """Drain ``graph``'s runs on each of ``signals``, before the handler installed now (the
    server's) runs. Call it from the main thread (the lifespan startup of uvicorn and
    hypercorn runs there); returns a function that puts the previous handlers back (call it
    from the lifespan shutdown). Elsewhere (not the main thread) it installs nothing."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous: dict[signal.Signals, Any] = {}
    for sig in signals:
        before = signal.getsignal(sig)
        previous[sig] = before

        def handler(signum: int, frame: FrameType | None, before: Any = before) -> None:
            graph.request_drain("shutdown")
            if callable(before):
                before(signum, frame)
            elif before == signal.SIG_DFL:
                _default(signum)  # SIG_IGN: ignored, as before

        signal.signal(sig, handler)

    def restore() -> None:
        if threading.current_thread() is threading.main_thread():
            for sig, before in previous.items():
                signal.signal(sig, before)

    return restore


def _default(signum: int) -> None:
    """The default action of ``signum`` (terminate), as if no handler had been installed."""
    signal.signal(signum, signal.SIG_DFL)
    signal.raise_signal(signum)


__all__ = ["SHUTDOWN_SIGNALS", "drain_on_signals"]
