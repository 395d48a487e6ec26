"""What a recovery pass reports (:class:`Recovery`, :class:`RecoveryReport`), what it runs with
(:class:`PassArgs`) and what it works on (:class:`RecoveryScope`); the pass is in
:mod:`._recovery`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from task_state_guard.integration import LostTask

if TYPE_CHECKING:
    from langgraph.runtime import RunControl
    from task_state_guard import Ledger

    from ._recorder import Recorder
    from ._runs import Runs

LOST = "lost"
DRAINED = "drained"
CANCELLED = "cancelled"

#: Resumed runs of one recovery pass that run at the same time, unless told otherwise.
DEFAULT_CONCURRENCY = 4

RecoveredHook = Callable[["Recovery"], object]


@dataclass(frozen=True)
class Recovery:
    """One thread resumed by a recovery pass."""

    thread_id: str
    #: Invocation id of the new (recovering) invocation: it carries the delivery obligation.
    invocation_id: str
    #: Invocation id of the invocation it recovers (its ledger parent), when known: ``None``
    #: for a continuation that died before writing a checkpoint under an id that is not a
    #: canonical UUID (only its ledger id, :attr:`recovers_task_id`, is known).
    recovers: str | None
    #: ``"succeeded"``, ``"interrupted"``, ``"failed"`` or ``"cancelled"``.
    outcome: str
    #: Exception class name when the resumed run raised (the run's error is not re-raised).
    error: str | None = None
    #: Why the thread was resumed: ``"lost"`` or ``"drained"``.
    cause: str = LOST
    #: Ledger id of the recovered invocation.
    recovers_task_id: str = field(default="", compare=False)
    #: What the resumed run returned (in memory only, never stored): the result it owes.
    output: Any = field(default=None, compare=False, repr=False)


class RecoveryReport(list[Recovery]):
    """What one recovery pass did: a list of the :class:`Recovery` of each thread it resumed,
    plus :attr:`lost`, :attr:`cancelled`, :attr:`claimed_elsewhere` and :attr:`resumed`.

    ``lost``: the threads whose loss this pass reported, in the order examined, whether or
    not they could be resumed (a thread waiting at an interrupt or whose task failed is lost
    but not resumed). ``reported``: every :class:`~task_state_guard.integration.LostTask` this
    pass handed to ``on_lost``, one per lost-run verdict it published (a lost run no checkpoint
    leads to, e.g. ``durability="exit"`` on a new thread, with the thread it was recorded
    with). A verdict
    another process holds is that process's to report. ``cancelled``: threads whose last run
    was cancelled by its caller with work left (never resumed). ``claimed_elsewhere``: threads
    another process was resuming first.
    """

    lost: list[str]
    reported: list[LostTask]
    cancelled: list[str]
    claimed_elsewhere: int

    def __init__(self) -> None:
        super().__init__()
        self.lost = []
        self.reported = []
        self.cancelled = []
        self.claimed_elsewhere = 0

    @property
    def resumed(self) -> list[str]:
        """The thread ids this pass resumed, in order."""
        return [r.thread_id for r in self]


@dataclass(frozen=True)
class PassArgs:
    """What a recovery pass runs with (the arguments of :meth:`GuardedGraph.recover`)."""

    config: dict[str, Any] | None
    thread_ids: list[str] | None
    max_concurrency: int | None
    kwargs: dict[str, Any]




class HookOwner(Protocol):
    """Whoever holds the ``on_recovered`` hook (the guarded graph)."""

    on_recovered: RecoveredHook | None


@dataclass(frozen=True)
class RecoveryScope:
    """What the functions of a recovery pass work on, handed to each explicitly: the compiled
    ``graph``, the recorder ``rec``, the ``runs`` that start and end the recovering
    invocations, and the state every pass of one guarded graph shares."""

    graph: Any
    rec: Recorder
    runs: Runs
    #: Ledger ids of the cancelled heads already logged (each is logged once per process).
    seen_cancelled: set[str]
    #: The drain controls of the resumed runs still going (stopping recovery drains them).
    controls: set[RunControl]
    #: Its ``on_recovered`` is read as each resumed run ends.
    owner: HookOwner

    def ledger(self) -> Ledger | None:
        """The ledger (``None`` when it cannot be opened)."""
        return self.rec.rt.ledger_or_none()


__all__ = [
    "CANCELLED",
    "DEFAULT_CONCURRENCY",
    "DRAINED",
    "LOST",
    "HookOwner",
    "PassArgs",
    "RecoveredHook",
    "Recovery",
    "RecoveryReport",
    "RecoveryScope",
]
