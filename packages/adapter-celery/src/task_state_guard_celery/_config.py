"""Settings: explicit arguments, then ``app.conf.tsg_*``, then ``TSG_*`` environment."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


@dataclass(frozen=True)
class Settings:
    """Resolved adapter settings."""

    db: str
    active_grace_seconds: float
    delivery_grace_seconds: float
    heartbeat_seconds: float
    reconcile_on_boot: bool
    strict: bool
    busy_timeout_ms: int


def _conf_get(app: Any, key: str) -> Any:
    try:
        return app.conf.get(key)
    except Exception:  # a broken config object must not break install
        return None


def _pick(explicit: Any, app: Any, key: str) -> Any:
    if explicit is not None:
        return explicit
    value = _conf_get(app, f"tsg_{key}")
    if value is not None:
        return value
    return os.environ.get(f"TSG_{key.upper()}")


def _as_float(value: Any, key: str, default: float, *, minimum: float = 0.0) -> float:
    if value is None or value == "":
        return default
    try:
        result = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"task-state-guard-celery: {key} must be a number") from None
    if not result > minimum or result != result or result == float("inf"):
        raise ValueError(f"task-state-guard-celery: {key} must be a finite number > {minimum}")
    return result


def _as_bool(value: Any, key: str, default: bool) -> bool:
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(f"task-state-guard-celery: {key} must be a boolean")


def resolve(
    app: Any,
    *,
    db: str | os.PathLike[str] | None,
    active_grace_seconds: float | None,
    delivery_grace_seconds: float | None,
    heartbeat_seconds: float | None,
    reconcile_on_boot: bool | None,
    strict: bool | None,
    busy_timeout_ms: int | None,
) -> Settings:
    """Resolve every setting from its three sources (argument, app.conf, env)."""
    db_value = _pick(os.fspath(db) if db is not None else None, app, "db")
    if not db_value:
        raise ValueError(
            "task-state-guard-celery: no ledger path; pass install(app, db=...), "
            "set app.conf.tsg_db or the TSG_DB environment variable"
        )
    active = _as_float(
        _pick(active_grace_seconds, app, "active_grace_seconds"), "active_grace_seconds", 600.0
    )
    delivery = _as_float(
        _pick(delivery_grace_seconds, app, "delivery_grace_seconds"),
        "delivery_grace_seconds",
        600.0,
    )
    # Heartbeats must come well inside the active grace.
    heartbeat = _as_float(
        _pick(heartbeat_seconds, app, "heartbeat_seconds"),
        "heartbeat_seconds",
        min(30.0, active / 4.0),
    )
    boot = _as_bool(_pick(reconcile_on_boot, app, "reconcile_on_boot"), "reconcile_on_boot", True)
    strict_value = _as_bool(_pick(strict, app, "strict"), "strict", False)
    busy = int(_as_float(_pick(busy_timeout_ms, app, "busy_timeout_ms"), "busy_timeout_ms", 5000))
    return Settings(
        db=str(db_value),
        active_grace_seconds=active,
        delivery_grace_seconds=delivery,
        heartbeat_seconds=heartbeat,
        reconcile_on_boot=boot,
        strict=strict_value,
        busy_timeout_ms=busy,
    )
