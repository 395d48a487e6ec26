"""States, reason codes, the Task record, errors and input validation."""

from __future__ import annotations

import hashlib
import math
import re
import uuid
from dataclasses import dataclass
from enum import Enum, StrEnum
from typing import Any

from . import reasons


class TaskStatus(StrEnum):
    """Task lifecycle states."""

    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"


class DeliveryStatus(StrEnum):
    """Delivery lifecycle states."""

    PENDING = "pending"
    DELIVERED = "delivered"
    FAILED = "failed"
    NOT_APPLICABLE = "not_applicable"


#: The states a task can still leave (the active set) and the states it ends in (the terminal
#: set): every statement and check that names either set renders it from here
#: (``rules.ACTIVE_SQL``, ``rules.TERMINAL_SQL``).
ACTIVE_STATES = frozenset({TaskStatus.QUEUED.value, TaskStatus.RUNNING.value})
TASK_STATES = frozenset(s.value for s in TaskStatus)
TERMINAL_STATES = TASK_STATES - ACTIVE_STATES
DELIVERY_STATES = frozenset(s.value for s in DeliveryStatus)
DELIVERY_CLOSED = DELIVERY_STATES - {DeliveryStatus.PENDING.value}

#: What a person calls a task: a ``"task"`` is a job somebody asked for (a root, or a child
#: that owes its own delivery, such as a LangGraph resume or recovery run); an ``"attempt"``
#: is one execution of a job (a child that owes nobody a delivery).
TASK_KINDS = ("task", "attempt")
#: The SQL test for an attempt, on a row of ``tsg_tasks``.
ATTEMPT_SQL = "(parent_id IS NOT NULL AND delivery_required = 0)"
#: The SQL expression of a row's kind (``{row}``: ``""``, or ``"NEW."`` in a trigger), as the
#: outcome totals record it.
TASK_KIND_SQL = (
    "CASE WHEN {row}parent_id IS NULL OR {row}delivery_required = 1 THEN 'task' "
    "ELSE 'attempt' END"
)


def task_kind(is_root: object, owes_delivery: object) -> str:
    """``"task"`` or ``"attempt"`` (see :data:`TASK_KINDS`) from a row's two facts."""
    return "task" if is_root or owes_delivery else "attempt"


class TaskCode(StrEnum):
    """Reason codes of task closes (:data:`TASK_CODES` says which state takes which)."""

    COMPLETED = "completed"
    WORKER_COMPLETED = "worker_completed"
    WORKER_FAILED = "worker_failed"
    RETRY_SCHEDULED = "retry_scheduled"
    WORKER_LOST = "worker_lost"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    RESTART_STALE = "restart_stale"
    TIME_LIMIT_EXCEEDED = "time_limit_exceeded"
    OWNER_LOST = "owner_lost"
    CALLER_CANCELLED = "caller_cancelled"
    REVOKED = "revoked"
    INTERRUPTED = "interrupted"
    SKIPPED = "skipped"
    REJECTED = "rejected"
    IGNORED = "ignored"


class DeliveryCode(StrEnum):
    """Reason codes of delivery closes (:data:`DELIVERY_CODES` says which state takes which)."""

    TRANSPORT_ACKNOWLEDGED = "transport_acknowledged"
    DELIVERY_GRACE_EXPIRED = "delivery_grace_expired"
    TRANSPORT_FAILED = "transport_failed"
    INTERNAL_TASK = "internal_task"


def _codes(*codes: StrEnum) -> frozenset[str]:
    return frozenset(code.value for code in codes)


_T, _D = TaskCode, DeliveryCode
#: Reason codes accepted for each terminal task state.
TASK_CODES: dict[str, frozenset[str]] = {
    TaskStatus.SUCCEEDED.value: _codes(_T.COMPLETED, _T.WORKER_COMPLETED),
    TaskStatus.FAILED.value: _codes(_T.WORKER_FAILED, _T.RETRY_SCHEDULED, _T.WORKER_LOST),
    TaskStatus.TIMED_OUT.value: _codes(
        _T.DEADLINE_EXCEEDED, _T.RESTART_STALE, _T.TIME_LIMIT_EXCEEDED, _T.OWNER_LOST),
    TaskStatus.CANCELLED.value: _codes(
        _T.CALLER_CANCELLED, _T.REVOKED, _T.INTERRUPTED, _T.SKIPPED, _T.REJECTED, _T.IGNORED),
}
#: Reason codes accepted for each closed delivery state.
DELIVERY_CODES: dict[str, frozenset[str]] = {
    DeliveryStatus.DELIVERED.value: _codes(_D.TRANSPORT_ACKNOWLEDGED),
    DeliveryStatus.FAILED.value: _codes(_D.DELIVERY_GRACE_EXPIRED, _D.TRANSPORT_FAILED),
    DeliveryStatus.NOT_APPLICABLE.value: _codes(_D.INTERNAL_TASK),
}


def codes_registered(status: Any, code: Any, delivery: Any, delivery_code: Any) -> bool:
    """A row's reason codes belong to its states (``None``: no code yet): the registry rule
    every read of a stored row and doctor apply."""
    return (code is None or code in TASK_CODES.get(status, ())) and (
        delivery_code is None or delivery_code in DELIVERY_CODES.get(delivery, ()))


#: Codes only the ledger itself writes, on its own events.
RESERVED_CODES = frozenset({"created", "started"})
#: The ``timed_out`` codes that declare work *lost*: the ledger itself proved that nobody runs
#: it any more (its owner died, it went stale past the active grace, or it passed its
#: deadline). Closing a logical task an adapter opened with one of these records a pending
#: verdict for that adapter's framework in the same transaction (the verdict outbox), and a
#: lost attempt the broker will still redeliver keeps its logical task fresh (see reconcile).
#: The schema's verdict trigger is written from this set: changing it is a new layout version.
LOST_CODES = _codes(_T.DEADLINE_EXCEEDED, _T.OWNER_LOST, _T.RESTART_STALE)
#: The frameworks whose adapters open logical tasks (a closed set of labels, never user data):
#: a lost verdict is routed to the adapters of the framework that opened the task.
FRAMEWORK_LABELS = frozenset({"celery", "dramatiq", "langgraph"})
#: A verdict is ``pending`` until an adapter of its framework published it.
VERDICT_STATES = ("pending", "published")

#: A name label (framework task, actor, graph or node name), a payload fingerprint (SHA-256,
#: lowercase hex) and a canonical task id: what a stored value must match (doctor checks them).
NAME_RE = re.compile(r"[A-Za-z0-9_<][A-Za-z0-9_.:/<>\-]{0,199}")
HASH_RE = re.compile(r"[0-9a-f]{64}")
CANONICAL_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
MAX_SECONDS = 10.0**10  # about 317 years: bounds every duration input


class Liveness(Enum):
    """What a probe of an owner token proves: the process that started a task is alive,
    provably dead (its liveness lock was released), or unknown."""

    ALIVE = "alive"
    DEAD = "dead"
    UNKNOWN = "unknown"


class LedgerError(Exception):
    """Base class of every error the ledger raises on purpose.

    ``reason`` names the rule a storage, location or usage error broke, from the closed
    vocabulary in :mod:`task_state_guard.reasons` (never a path, id or value); ``None`` for
    errors about a task or a value (``TaskNotFound``, a refused transition, a malformed id).
    """

    reason: str | None = None

    def __init__(self, *args: object, reason: str | None = None) -> None:
        super().__init__(*args)
        if reason is not None:
            if reason not in reasons.ALL:
                raise ValueError("reason is not in the closed vocabulary")
            self.reason = reason

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_error, (type(self), self.args, self.reason))


def _rebuild_error(
    cls: type[LedgerError], args: tuple[object, ...], reason: str | None
) -> LedgerError:
    """Unpickle a ledger error with its reason (a keyword ``args`` alone cannot carry)."""
    return cls(*args, reason=reason)


class InvalidInput(LedgerError):
    """An argument is malformed, out of range or not allowed for the requested state."""


class TaskNotFound(LedgerError):
    """No task has the given id."""


class StateConflict(LedgerError):
    """The transition is not allowed from the task's current state, or the storage is unusable.

    Storage and identity problems (:class:`StorageError`, :class:`LedgerBusy`) are subclasses,
    as in 0.1.0, where they were raised as ``StateConflict`` itself.
    """


def error_category(exc: LedgerError) -> str:
    """The 0.1.0 error name the CLI prints (and the web view shows) for ``exc``."""
    for category in (InvalidInput, TaskNotFound, StateConflict):
        if isinstance(exc, category):
            return category.__name__
    return "StateConflict"


class StorageError(StateConflict):
    """The database is unusable, unwritable, full, foreign, replaced or opened read-only."""


class LedgerBusy(StorageError):
    """Another connection held the database lock past the busy timeout."""


class UnsafeLocation(InvalidInput):
    """The database location breaks the path or permission policy (links, modes, owners,
    network filesystems, or a non-POSIX host without ``allow_external_acl=True``)."""


def canonical_id(value: object, what: str = "task id") -> str:
    """Return the canonical lowercase hyphenated form of a UUID, or raise InvalidInput."""
    if type(value) is str and CANONICAL_RE.fullmatch(value):
        return value
    if isinstance(value, uuid.UUID):
        return str(value)
    if not isinstance(value, str) or len(value) != 36:
        raise InvalidInput(f"{what} must be a canonical UUID")
    try:
        parsed = uuid.UUID(value)
    except ValueError:
        raise InvalidInput(f"{what} must be a canonical UUID") from None
    text = str(parsed)
    if text != value.lower():
        raise InvalidInput(f"{what} must be a canonical UUID")
    return text


def check_state(value: object, allowed: frozenset[str], what: str) -> str:
    """Return ``value`` as a plain string when it is one of ``allowed``."""
    if isinstance(value, str) and value in allowed:
        return str(value)
    raise InvalidInput(f"unknown {what}")


def check_code_shape(code: object) -> str | None:
    """Reject codes that are not strings (registry membership is checked later)."""
    if code is None:
        return None
    if not isinstance(code, str):
        raise InvalidInput("code must be a string")
    return str(code)


def check_code(code: str | None, state: str, registry: dict[str, frozenset[str]]) -> None:
    """Raise InvalidInput unless ``code`` belongs to ``state`` in ``registry``."""
    if code is not None and code not in registry.get(state, frozenset()):
        raise InvalidInput("reason code does not belong to the requested state")


def check_seconds(
    value: object, what: str, *, allow_zero: bool, maximum: float | None = MAX_SECONDS
) -> float:
    """Return a finite, non-negative duration in seconds, at most ``maximum`` (None: any)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidInput(f"{what} must be a number")
    try:
        number = float(value)
    except OverflowError:  # an int too large for a float
        raise InvalidInput(f"{what} is out of range") from None
    if not math.isfinite(number) or number < 0 or (maximum is not None and number > maximum):
        raise InvalidInput(f"{what} is out of range")
    if number == 0 and not allow_zero:
        raise InvalidInput(f"{what} must be positive")
    return number


def check_snapshot_limit(value: object) -> int:
    """Validate the snapshot size limit (bytes) of a read-only open."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 4096:
        raise InvalidInput("snapshot_max_bytes must be an integer of at least 4096")
    return value


def check_name(value: object) -> str | None:
    """Return a valid name label (framework task, actor, graph or node name) or None."""
    if value is None:
        return None
    if isinstance(value, str) and NAME_RE.fullmatch(value):
        return str(value)
    raise InvalidInput("name must be an identifier label")


def check_framework(value: object) -> str | None:
    """Return a framework label from :data:`FRAMEWORK_LABELS`, or None."""
    if value is None:
        return None
    if isinstance(value, str) and value in FRAMEWORK_LABELS:
        return str(value)
    raise InvalidInput("unknown framework")


def check_payload_hash(value: object) -> str | None:
    """Return a lowercase SHA-256 hex digest or None."""
    if value is None:
        return None
    if isinstance(value, str) and HASH_RE.fullmatch(value):
        return str(value)
    raise InvalidInput("payload_hash must be a lowercase SHA-256 hex digest")


def is_canonical(value: str) -> bool:
    """Tell whether ``value`` is a canonical lowercase UUID string."""
    return bool(CANONICAL_RE.fullmatch(value))


def is_payload_hash(value: str) -> bool:
    """Tell whether ``value`` is a lowercase SHA-256 hex digest."""
    return bool(HASH_RE.fullmatch(value))


#: The longest thread id stored (characters).
THREAD_ID_MAX = 256


def is_valid_thread_id(value: object) -> bool:
    """Whether ``value`` is a thread id the ledger stores: a string of 1 to
    :data:`THREAD_ID_MAX` printable characters (a framework's thread, as its user named it)."""
    return type(value) is str and 0 < len(value) <= THREAD_ID_MAX and value.isprintable()


def check_thread_id(value: object) -> str:
    """``value`` as a stored thread id; anything else is ``InvalidInput``."""
    if not is_valid_thread_id(value):
        raise InvalidInput(f"thread id must be 1-{THREAD_ID_MAX} printable characters")
    assert isinstance(value, str)
    return value


def is_valid_name(value: str) -> bool:
    """Tell whether ``value`` is an acceptable name label."""
    return bool(NAME_RE.fullmatch(value))


def payload_fingerprint(data: str | bytes) -> str:
    """Return the SHA-256 hex digest of ``data`` (a ``str`` is encoded as UTF-8).

    The digest is pseudonymous, not anonymous: low-entropy content can be guessed offline.
    """
    if isinstance(data, str):
        try:
            return hashlib.sha256(data.encode("utf-8")).hexdigest()
        except UnicodeEncodeError:
            raise InvalidInput("payload text must be encodable as UTF-8") from None
    if not isinstance(data, bytes | bytearray | memoryview):
        raise InvalidInput("payload must be str or bytes")
    return hashlib.sha256(data).hexdigest()


#: The keys of :meth:`Task.to_dict`, in 0.1.0's set (``payload_hash`` only on request).
TASK_DICT_KEYS = (
    "id", "parent_id", "status", "delivery_status", "delivery_required", "has_payload_hash",
    "timeout_seconds", "created_at", "started_at", "updated_at", "ended_at", "deadline_at",
    "delivery_updated_at", "terminal_code", "delivery_code", "version",
)
#: Extra keys :meth:`Task.to_dict` adds with ``extras=True``.
TASK_EXTRA_KEYS = ("name", "heartbeat_at", "has_owner", "framework_id")


@dataclass(frozen=True, slots=True)
class Task:
    """One task row as stored in the ledger.

    ``updated_at`` is the last task-state change or heartbeat; ``delivery_updated_at`` the last
    delivery change (``created_at`` until the delivery closes); ``version`` counts state and
    delivery changes (0 at creation; idempotent repeats and heartbeats leave it unchanged).
    ``name``, ``heartbeat_at``, ``has_owner`` and ``framework_id`` (the framework's own id of
    the job when it is a canonical UUID, e.g. a Celery task id; else ``None``) are this
    version's additions.
    """

    id: str
    parent_id: str | None
    status: TaskStatus
    delivery_status: DeliveryStatus
    delivery_required: bool
    payload_hash: str | None
    timeout_seconds: float | None
    created_at: float
    started_at: float | None
    updated_at: float
    ended_at: float | None
    deadline_at: float | None
    delivery_updated_at: float
    terminal_code: str | None
    delivery_code: str | None
    version: int
    name: str | None = None
    heartbeat_at: float | None = None
    has_owner: bool = False
    framework_id: str | None = None

    @property
    def is_terminal(self) -> bool:
        """True once the task reached a terminal state."""
        return self.status in TERMINAL_STATES

    @property
    def has_payload_hash(self) -> bool:
        """True when an optional payload fingerprint is stored."""
        return self.payload_hash is not None

    def to_dict(
        self, include_payload_hash: bool = False, *, extras: bool = False
    ) -> dict[str, Any]:
        """Return a JSON-ready mapping with 0.1.0's keys.

        The fingerprint itself only with ``include_payload_hash=True``; ``extras=True`` adds
        ``name``, ``heartbeat_at``, ``has_owner`` and ``framework_id``.
        """
        out: dict[str, Any] = {
            "id": self.id,
            "parent_id": self.parent_id,
            "status": self.status.value,
            "delivery_status": self.delivery_status.value,
            "delivery_required": self.delivery_required,
            "has_payload_hash": self.has_payload_hash,
            "timeout_seconds": self.timeout_seconds,
            "created_at": self.created_at,
            "started_at": self.started_at,
            "updated_at": self.updated_at,
            "ended_at": self.ended_at,
            "deadline_at": self.deadline_at,
            "delivery_updated_at": self.delivery_updated_at,
            "terminal_code": self.terminal_code,
            "delivery_code": self.delivery_code,
            "version": self.version,
        }
        if include_payload_hash:
            out["payload_hash"] = self.payload_hash
        if extras:
            out["name"] = self.name
            out["heartbeat_at"] = self.heartbeat_at
            out["has_owner"] = self.has_owner
            out["framework_id"] = self.framework_id
        return out
