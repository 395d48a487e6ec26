"""Suite-wide fixtures: the ledger backend matrix (see ``ledger_backends``), and PostgreSQL
ledgers (``pg_url``, see ``pg_fixtures``) for any test directory.

Every test that uses the ``backend`` fixture, directly or through ``ledger_target`` (or a
directory's ``db`` fixture built on it), runs once per selected backend; its test id names the
backend (``test_x[sqlite]``, ``test_x[postgresql]``). A test that checks
something only the SQLite file has (file modes, sidecars, snapshots of the directory, the raw
file) carries ``@pytest.mark.sqlite_only`` and runs on SQLite alone.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import ledger_backends
from pg_fixtures import pg_stale_cleanup, pg_url

__all__ = ["pg_stale_cleanup", "pg_url"]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--backend",
        choices=("sqlite", "postgresql", "all"),
        default=None,
        help="ledger backend(s) of the conformance suite (default: $"
        f"{ledger_backends.ENV_VAR} or all)",
    )


def _selected(config: pytest.Config) -> tuple[str, ...]:
    return ledger_backends.selected(config.getoption("--backend"))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "sqlite_only: checks SQLite storage itself; runs on the SQLite backend only"
    )
    config.addinivalue_line(
        "markers", "postgresql_only: needs a PostgreSQL ledger; runs when it is selected"
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "backend" not in metafunc.fixturenames:
        return
    backends = list(_selected(metafunc.config))
    if metafunc.definition.get_closest_marker("sqlite_only"):
        backends = [b for b in backends if b == "sqlite"]
    if metafunc.definition.get_closest_marker("postgresql_only"):
        backends = [b for b in backends if b == "postgresql"]
    # A test no selected backend may run is deselected below, never reported as skipped.
    metafunc.parametrize("backend", backends or ["unselected"], scope="function")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    keep, drop = [], []
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is not None and callspec.params.get("backend") == "unselected":
            drop.append(item)
        else:
            keep.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.fixture
def ledger_target(backend: str, tmp_path: Path) -> Iterator[str]:
    """A fresh ledger location on the test's backend (a path, or a URL with its own schema)."""
    with ledger_backends.ledger_target(backend, tmp_path) as target:
        yield target


class PerBackend:
    """Resources a module's tests share, built once per ledger backend on first use."""

    def __init__(self, stack: contextlib.ExitStack) -> None:
        self._stack = stack
        self._made: dict[str, Any] = {}

    def get(
        self, backend: str, make: Callable[[str], contextlib.AbstractContextManager[Any]]
    ) -> Any:
        """The module's resource on ``backend`` (``make(backend)`` entered the first time);
        it is left when the module's tests are done."""
        if backend not in self._made:
            self._made[backend] = self._stack.enter_context(make(backend))
        return self._made[backend]


@pytest.fixture(scope="module")
def per_backend() -> Iterator[PerBackend]:
    """One real worker (or another costly resource) per backend for a module's tests: a
    test's function-scoped fixture asks ``per_backend.get(backend, make)``."""
    with contextlib.ExitStack() as stack:
        yield PerBackend(stack)
