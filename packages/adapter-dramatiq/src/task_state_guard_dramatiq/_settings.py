"""Settings of the Dramatiq adapter: explicit arguments first, then ``TSG_*`` environment."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["Settings", "resolve_settings"]

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off", ""})

DEFAULT_ACTIVE_GRACE_SECONDS = 600.0
DEFAULT_DELIVERY_GRACE_SECONDS = 600.0
MAX_HEARTBEAT_INTERVAL_SECONDS = 30.0


@dataclass(frozen=True)
class Settings:
    """Resolved adapter settings (see :func:`resolve_settings`)."""

    db: str
    active_grace_seconds: float
    delivery_grace_seconds: float
    heartbeat_interval_seconds: float
    reconcile_on_boot: bool
    reconcile_interval_seconds: float | None
    strict: bool


def _env_float(env: Mapping[str, str], key: str) -> float | None:
    raw = env.get(key)
    if raw is None or raw.strip() == "":
        return None
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{key} must be a number of seconds") from None
    return value


def _env_bool(env: Mapping[str, str], key: str) -> bool | None:
    raw = env.get(key)
    if raw is None:
        return None
    lowered = raw.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ValueError(f"{key} must be a boolean (1/0, true/false, yes/no, on/off)")


def _positive(value: float, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{what} must be a number of seconds")
    value = float(value)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{what} must be a finite number of seconds greater than zero")
    return value


def resolve_settings(
    *,
    db: str | os.PathLike[str] | None = None,
    active_grace_seconds: float | None = None,
    delivery_grace_seconds: float | None = None,
    heartbeat_interval_seconds: float | None = None,
    reconcile_on_boot: bool | None = None,
    reconcile_interval_seconds: float | None = None,
    strict: bool | None = None,
    environ: Mapping[str, str] | None = None,
) -> Settings:
    """Resolve every setting from its argument, else its ``TSG_*`` variable, else the default.

    - ``db`` / ``TSG_DB``: required.
    - ``active_grace_seconds`` / ``TSG_ACTIVE_GRACE_SECONDS``: 600.
    - ``delivery_grace_seconds`` / ``TSG_DELIVERY_GRACE_SECONDS``: 600.
    - ``heartbeat_interval_seconds`` / ``TSG_HEARTBEAT_INTERVAL_SECONDS``:
      min(30, active grace / 5).
    - ``reconcile_on_boot`` / ``TSG_RECONCILE_ON_BOOT``: true.
    - ``reconcile_interval_seconds`` / ``TSG_RECONCILE_INTERVAL_SECONDS``: off (0).
    - ``strict`` / ``TSG_STRICT``: false.
    """
    env: Mapping[str, str] = os.environ if environ is None else environ

    if db is None:
        db = env.get("TSG_DB") or None
    if db is None:
        raise ValueError("no ledger path: pass db=... or set TSG_DB")
    db_path = os.fspath(db)
    if not db_path:
        raise ValueError("the ledger path must not be empty")

    if active_grace_seconds is None:
        active_grace_seconds = _env_float(env, "TSG_ACTIVE_GRACE_SECONDS")
    active = _positive(
        DEFAULT_ACTIVE_GRACE_SECONDS if active_grace_seconds is None else active_grace_seconds,
        "active_grace_seconds",
    )

    if delivery_grace_seconds is None:
        delivery_grace_seconds = _env_float(env, "TSG_DELIVERY_GRACE_SECONDS")
    delivery = _positive(
        DEFAULT_DELIVERY_GRACE_SECONDS
        if delivery_grace_seconds is None
        else delivery_grace_seconds,
        "delivery_grace_seconds",
    )

    if heartbeat_interval_seconds is None:
        heartbeat_interval_seconds = _env_float(env, "TSG_HEARTBEAT_INTERVAL_SECONDS")
    if heartbeat_interval_seconds is None:
        heartbeat = min(MAX_HEARTBEAT_INTERVAL_SECONDS, active / 5.0)
    else:
        heartbeat = _positive(heartbeat_interval_seconds, "heartbeat_interval_seconds")
    if heartbeat >= active:
        raise ValueError("heartbeat_interval_seconds must be well below active_grace_seconds")

    if reconcile_on_boot is None:
        reconcile_on_boot = _env_bool(env, "TSG_RECONCILE_ON_BOOT")
    boot = True if reconcile_on_boot is None else bool(reconcile_on_boot)

    if reconcile_interval_seconds is None:
        reconcile_interval_seconds = _env_float(env, "TSG_RECONCILE_INTERVAL_SECONDS")
    interval: float | None
    if reconcile_interval_seconds is None or reconcile_interval_seconds == 0:
        interval = None
    else:
        interval = _positive(reconcile_interval_seconds, "reconcile_interval_seconds")

    if strict is None:
        strict = _env_bool(env, "TSG_STRICT")
    return Settings(
        db=db_path,
        active_grace_seconds=active,
        delivery_grace_seconds=delivery,
        heartbeat_interval_seconds=heartbeat,
        reconcile_on_boot=boot,
        reconcile_interval_seconds=interval,
        strict=bool(strict),
    )
