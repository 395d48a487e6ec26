"""Suite-wide fixtures: the ledger backend matrix (see ``ledger_backends``), and PostgreSQL
ledgers (``pg_url``, see ``pg_fixtures``) for any test directory.

Every test that uses the ``backend`` fixture, directly or through ``ledger_target`` (or a
directory's ``db`` fixture built on it), runs once per selected backend; its test id names the
backend (``test_x[sqlite]``, ``test_x[postgresql]``). A test that checks
something only the SQLite file has (file modes, sidecars, snapshots of the directory, the raw
file) carries ``@pytest.mark.sqlite_only(reason="...")`` and runs on SQLite alone; the reason
is required (a bare marker fails collection). Tests of SQLite storage itself live in
``tests/sqlite``.

In the conformance suite (``tests/core``, ``tests/contract``) a test that takes a private
directory (``tmp_path``, ``tmp_path_factory``, directly or through a fixture) is where a SQLite
ledger path is made, so it must run on the backend matrix (``backend``) or carry
``sqlite_only`` or ``postgresql_only`` with its reason; otherwise collection fails. A test
whose directory holds no ledger says so with ``@pytest.mark.no_ledger(reason="...")``.
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
        "markers",
        "sqlite_only(reason): runs on the SQLite backend only; the reason (required) says why",
    )
    config.addinivalue_line(
        "markers", "postgresql_only: needs a PostgreSQL ledger; runs when it is selected"
    )
    config.addinivalue_line(
        "markers",
        "no_ledger(reason): a conformance test whose private directory holds no ledger",
    )
    config.addinivalue_line(
        "markers",
        "service_wide: changes a service every test shares (restarts PostgreSQL, lowers a "
        "broker-wide RabbitMQ setting); scripts/dev.py test runs these alone, after the legs "
        "that run side by side",
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


TESTS = Path(__file__).resolve().parent
# The conformance suite: every test that makes a ledger runs on the backend matrix or says why.
MATRIX_DIRS = (TESTS / "core", TESTS / "contract")
PRIVATE_DIRECTORY = frozenset({"tmp_path", "tmp_path_factory"})
EXEMPTING_MARKERS = ("sqlite_only", "postgresql_only", "no_ledger")


def _reasonless(item: pytest.Item) -> list[str]:
    """The markers of ``item`` that must give a reason and do not."""
    return [
        mark.name for name in ("sqlite_only", "no_ledger") for mark in item.iter_markers(name)
        if not isinstance(mark.kwargs.get("reason"), str) or not mark.kwargs["reason"].strip()
    ]


def _off_the_matrix(item: pytest.Item) -> bool:
    """A conformance test that takes a private directory (where a SQLite ledger path is made)
    without running on the backend matrix or a marker that says why."""
    if not any(item.path.is_relative_to(folder) for folder in MATRIX_DIRS):
        return False
    names = set(getattr(item, "fixturenames", ()))
    if "backend" in names or not names & PRIVATE_DIRECTORY:
        return False
    return not any(item.get_closest_marker(name) for name in EXEMPTING_MARKERS)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    problems = [f"{item.nodeid}: {name} needs reason=\"...\""
                for item in items for name in _reasonless(item)]
    problems += [f"{item.nodeid}: takes a private directory (a SQLite ledger path) but runs "
                 "on no backend matrix: use the backend/db/ledger fixtures, or mark it "
                 "sqlite_only(reason=...) or no_ledger(reason=...)"
                 for item in items if _off_the_matrix(item)]
    if problems:
        raise pytest.UsageError("ledger backend rules:\n  " + "\n  ".join(problems))
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
