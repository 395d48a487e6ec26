"""Fixtures of the cross-adapter contract suite: every row runs once per adapter."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from drivers import DRIVERS

_SETTINGS_ENV = (
    "TSG_DB",
    "TSG_ACTIVE_GRACE_SECONDS",
    "TSG_DELIVERY_GRACE_SECONDS",
    "TSG_HEARTBEAT_SECONDS",
    "TSG_RECONCILE_ON_BOOT",
    "TSG_RECONCILE_INTERVAL_SECONDS",
    "TSG_VERDICT_INTERVAL_SECONDS",
    "TSG_STRICT",
    "TSG_BUSY_TIMEOUT_MS",
    "TSG_FAIL_LOST_RESULTS",
    "TSG_REQUIRE_LEDGER",
    "TSG_METRICS_DIR",
)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in _SETTINGS_ENV:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(params=sorted(DRIVERS))
def driver(request: pytest.FixtureRequest) -> Iterator[Any]:
    drv = DRIVERS[request.param]()
    try:
        yield drv
    finally:
        if getattr(drv, "guard", None) is not None:
            drv.close()


@pytest.fixture
def db(ledger_target: str, backend: str) -> str:
    """A fresh ledger on each backend (a SQLite path in a private directory, or a URL)."""
    if backend == "sqlite":
        Path(ledger_target).parent.mkdir(mode=0o700)
    return ledger_target


@pytest.fixture
def broken_db(tmp_path: Path) -> str:
    """A ledger path that can never be opened (its directory is a regular file)."""
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    return str(blocker / "tasks.sqlite")
