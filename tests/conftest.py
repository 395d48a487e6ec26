"""Suite-wide fixtures: the ledger backend matrix (see ``ledger_backends``), and PostgreSQL
ledgers (``pg_url``, see ``pg_fixtures``) for any test directory.

Every test that uses the ``backend`` fixture, directly or through ``ledger_target`` (or a
directory's ``db`` fixture built on it), runs once per selected backend; its test id names the
backend (``test_x[sqlite]``, ``test_x[postgresql]``). A test that checks
something only the SQLite file has (file modes, sidecars, snapshots of the directory, the raw
file) carries ``@pytest.mark.sqlite_only`` and runs on SQLite alone.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

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
    # Module scope: a module's tests run grouped by backend (``[sqlite]`` first, then
    # ``[postgresql]``), so a module-scoped fixture (one real worker for the module) can be
    # built once per backend.
    metafunc.parametrize("backend", backends or ["unselected"], scope="module")


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
