"""Adapter settings: one set of names and defaults for every adapter.

Each setting is looked up, in order, as the adapter's explicit argument, the framework's own
configuration (for Celery ``app.conf.tsg_<name>``; adapters without a configuration object skip
this step), the ``TSG_<NAME>`` environment variable (an empty value counts as unset), and the
default below. A value that does not parse or is out of range raises :class:`ConfigurationError`
naming the setting and its source, never the value.

==============================  ====================================  ========================
setting                         environment variable                  default
==============================  ====================================  ========================
``db``                          ``TSG_DB``                            required
``active_grace_seconds``        ``TSG_ACTIVE_GRACE_SECONDS``          600
``delivery_grace_seconds``      ``TSG_DELIVERY_GRACE_SECONDS``        600
``heartbeat_seconds``           ``TSG_HEARTBEAT_SECONDS``             min(30, active grace / 4)
``reconcile_on_boot``           ``TSG_RECONCILE_ON_BOOT``             true
``reconcile_interval_seconds``  ``TSG_RECONCILE_INTERVAL_SECONDS``    0 (off)
``verdict_interval_seconds``    ``TSG_VERDICT_INTERVAL_SECONDS``      10
``strict``                      ``TSG_STRICT``                        false
``fail_lost_results``           ``TSG_FAIL_LOST_RESULTS``             true
``busy_timeout_ms``             ``TSG_BUSY_TIMEOUT_MS``               5000
``require_ledger``              ``TSG_REQUIRE_LEDGER``                false
``metrics_dir``                 ``TSG_METRICS_DIR``                   none (off)
==============================  ====================================  ========================

A ``*_seconds`` value given as text (environment, framework configuration) follows the command
line's one grammar: seconds (``90``, ``90.5``) or a number with one unit (``90s``, ``15m``,
``2h``, ``1d``); nothing else (no sign, spaces, exponent or ``_``). ``busy_timeout_ms`` as text
is ASCII digits.
``heartbeat_seconds=0`` turns the background heartbeat off; otherwise it must be below the
active grace. ``reconcile_interval_seconds`` is used by adapters with a long-lived worker loop
(Celery and Dramatiq workers: a periodic reconcile in the worker's main process).
``verdict_interval_seconds``: how often a running worker (a Celery worker's main process, each
Dramatiq worker process, a LangGraph process running ``start_recovery()``) checks for lost-job
verdicts owed to its framework and publishes them, whoever reconciled (``tsg reconcile``,
another host); each check is one indexed read (``LIMIT 1``) that writes nothing when nothing is
owed. Independent of ``reconcile_interval_seconds``; 0 turns the checks off (verdicts are then
published at a worker's start, after its own reconciles and on ``publish_verdicts()``).
``fail_lost_results=false`` stops adapters from writing a failure into the framework's result
backend for a job a reconcile found lost (the ``on_lost`` hook still fires).
``require_ledger=true`` makes a worker refuse to start when its ledger cannot be used (by
default it starts, logs the reason once at ERROR and records nothing until the ledger works).
``metrics_dir``: a directory where every process adds its counters (ledger errors, conflicts,
reconciles) to one shared file, for ``tsg metrics`` to expose summed over all processes
(:mod:`task_state_guard.metrics.adapter_counters`).
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any, Final, TypedDict

from ..durations import parse_count, parse_seconds
from ..model import MAX_SECONDS, InvalidInput
from ..store.backends import check_target, redact

DEFAULT_GRACE_SECONDS: Final = 600.0
MAX_DEFAULT_HEARTBEAT_SECONDS: Final = 30.0
#: How often a running worker checks for the verdicts owed to its framework, by default.
DEFAULT_VERDICT_INTERVAL_SECONDS: Final = 10.0
DEFAULT_BUSY_TIMEOUT_MS: Final = 5000

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})
_NAMES = (
    "db",
    "active_grace_seconds",
    "delivery_grace_seconds",
    "heartbeat_seconds",
    "reconcile_on_boot",
    "reconcile_interval_seconds",
    "verdict_interval_seconds",
    "strict",
    "fail_lost_results",
    "busy_timeout_ms",
    "require_ledger",
    "metrics_dir",
)


class SettingArgs(TypedDict, total=False):
    """The settings an adapter's install function takes as keywords (``None``: not given)."""

    active_grace_seconds: float | None
    delivery_grace_seconds: float | None
    heartbeat_seconds: float | None
    reconcile_on_boot: bool | None
    reconcile_interval_seconds: float | None
    verdict_interval_seconds: float | None
    strict: bool | None
    fail_lost_results: bool | None
    busy_timeout_ms: int | None
    require_ledger: bool | None
    metrics_dir: str | os.PathLike[str] | None


class ConfigurationError(InvalidInput, ValueError):
    """A setting is missing, does not parse, or is out of range."""


@dataclass(frozen=True, repr=False)
class Settings:
    """Resolved adapter settings (see the module docstring)."""

    db: str
    active_grace_seconds: float
    delivery_grace_seconds: float
    heartbeat_seconds: float
    reconcile_on_boot: bool
    reconcile_interval_seconds: float
    strict: bool
    busy_timeout_ms: int
    fail_lost_results: bool = True
    require_ledger: bool = False
    metrics_dir: str | None = None
    verdict_interval_seconds: float = DEFAULT_VERDICT_INTERVAL_SECONDS

    def __repr__(self) -> str:
        """Every setting, the ledger URL without its password."""
        shown = ", ".join(
            f"{f.name}={redact(self.db) if f.name == 'db' else getattr(self, f.name)!r}"
            for f in fields(self)
        )
        return f"Settings({shown})"


def env_name(name: str) -> str:
    """The environment variable of setting ``name``."""
    return "TSG_" + name.upper()


FrameworkConfig = Callable[[str], Any]


def _lookup(
    name: str,
    explicit: Mapping[str, Any],
    framework: FrameworkConfig | None,
    environ: Mapping[str, str],
) -> tuple[Any, str]:
    value = explicit.get(name)
    if value is not None:
        return value, name
    if framework is not None:
        try:
            value = framework(name)
        except Exception:  # a broken configuration object reads as "not configured"
            value = None
        if value is not None:
            return value, f"the framework option tsg_{name}"
    raw = environ.get(env_name(name))
    if raw is not None and raw.strip() != "":
        return raw, env_name(name)
    return None, name


def _seconds(value: Any, source: str, *, allow_zero: bool) -> float:
    """A number of seconds: a Python number, or text in the CLI's one duration grammar."""
    low = ">= 0" if allow_zero else "> 0"
    if isinstance(value, str):
        try:
            return parse_seconds(value, source, allow_zero=allow_zero)
        except InvalidInput:
            raise ConfigurationError(
                f"task-state-guard: {source} must be a duration {low}: seconds (90, 90.5) or "
                "a number with one unit (90s, 15m, 2h, 1d)"
            ) from None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigurationError(f"task-state-guard: {source} must be a number of seconds")
    number = float(value)
    if not math.isfinite(number) or number < 0 or number > MAX_SECONDS or (
        number == 0 and not allow_zero
    ):
        raise ConfigurationError(
            f"task-state-guard: {source} must be a finite number of seconds {low}"
        )
    return number


def _flag(value: Any, source: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        text = value.strip().lower()
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
    raise ConfigurationError(
        f"task-state-guard: {source} must be a boolean (1/0, true/false, yes/no, on/off)"
    )


def _milliseconds(value: Any, source: str) -> int:
    """A whole number of milliseconds up to 600000: a whole ``int`` or ``float``, or text of
    ASCII digits."""
    number: int | None = None
    if isinstance(value, str):
        with contextlib.suppress(InvalidInput):
            number = parse_count(value, source)
    elif isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, float) and value.is_integer():
        number = int(value)
    if number is None or not 0 <= number <= 600_000:
        raise ConfigurationError(
            f"task-state-guard: {source} must be a whole number of milliseconds <= 600000"
        )
    return number


def _directory(value: Any, source: str) -> str:
    if isinstance(value, str | os.PathLike):
        text = os.fspath(value)
        if isinstance(text, str) and text and "\0" not in text:
            return text
    raise ConfigurationError(f"task-state-guard: {source} must be a directory path")


def resolve_settings(
    *,
    framework: FrameworkConfig | None = None,
    environ: Mapping[str, str] | None = None,
    db_required: bool = True,
    **explicit: Any,
) -> Settings:
    """Resolve every setting (explicit keyword > ``framework(name)`` > environment > default).

    ``framework`` returns the framework's configured value of a setting name, or ``None``.
    ``db_required=False`` lets an adapter that was handed an open ledger go without a path.
    """
    unknown = set(explicit) - set(_NAMES)
    if unknown:
        raise ConfigurationError("task-state-guard: unknown setting " + sorted(unknown)[0])
    env: Mapping[str, str] = os.environ if environ is None else environ

    def get(name: str) -> tuple[Any, str]:
        return _lookup(name, explicit, framework, env)

    db, source = get("db")
    if db is None:
        if db_required:
            raise ConfigurationError(
                "task-state-guard: no ledger path; pass db=..., set the framework option "
                "tsg_db or the TSG_DB environment variable"
            )
        db = ""
    elif isinstance(db, str | os.PathLike):
        db = os.fspath(db)
        if not isinstance(db, str) or not db:
            raise ConfigurationError(f"task-state-guard: {source} must be a non-empty path")
        try:
            check_target(db)  # a URL of a scheme no backend opens is never a path
        except InvalidInput as exc:
            raise ConfigurationError(
                f"task-state-guard: {source} must be a path or a postgresql:// URL",
                reason=exc.reason) from None
    else:
        raise ConfigurationError(f"task-state-guard: {source} must be a path")

    value, source = get("active_grace_seconds")
    active = DEFAULT_GRACE_SECONDS if value is None else _seconds(value, source, allow_zero=False)
    value, source = get("delivery_grace_seconds")
    delivery = (
        DEFAULT_GRACE_SECONDS if value is None else _seconds(value, source, allow_zero=False)
    )
    value, source = get("heartbeat_seconds")
    if value is None:
        heartbeat = min(MAX_DEFAULT_HEARTBEAT_SECONDS, active / 4.0)
    else:
        heartbeat = _seconds(value, source, allow_zero=True)
        if heartbeat >= active:
            raise ConfigurationError(
                f"task-state-guard: {source} must be below the active grace (0 turns it off)"
            )
    value, source = get("reconcile_on_boot")
    boot = True if value is None else _flag(value, source)
    value, source = get("reconcile_interval_seconds")
    interval = 0.0 if value is None else _seconds(value, source, allow_zero=True)
    value, source = get("verdict_interval_seconds")
    verdict_interval = (
        DEFAULT_VERDICT_INTERVAL_SECONDS if value is None
        else _seconds(value, source, allow_zero=True)
    )
    value, source = get("strict")
    strict = False if value is None else _flag(value, source)
    value, source = get("fail_lost_results")
    fail_lost = True if value is None else _flag(value, source)
    value, source = get("busy_timeout_ms")
    busy = DEFAULT_BUSY_TIMEOUT_MS if value is None else _milliseconds(value, source)
    value, source = get("require_ledger")
    required = False if value is None else _flag(value, source)
    value, source = get("metrics_dir")
    metrics_dir = None if value is None else _directory(value, source)
    return Settings(
        db=str(db),
        active_grace_seconds=active,
        delivery_grace_seconds=delivery,
        heartbeat_seconds=heartbeat,
        reconcile_on_boot=boot,
        reconcile_interval_seconds=interval,
        strict=strict,
        busy_timeout_ms=busy,
        fail_lost_results=fail_lost,
        require_ledger=required,
        metrics_dir=metrics_dir,
        verdict_interval_seconds=verdict_interval,
    )


__all__ = [
    "DEFAULT_GRACE_SECONDS",
    "DEFAULT_VERDICT_INTERVAL_SECONDS",
    "ConfigurationError",
    "SettingArgs",
    "Settings",
    "env_name",
    "resolve_settings",
]
