"""Fixtures of the deployment and example-project tests (helpers: deploy_helpers.py).

A test that takes ``ledgers`` runs once per ledger backend (``[sqlite]``: a file on the
volume, ``[postgresql]``: a URL naming a schema of the test's own); one that checks the
volume's files or directories carries ``sqlite_only``."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from deploy_helpers import Ledgers


@pytest.fixture
def ledgers(tmp_path: Path, backend: str, ledger_target: str) -> Iterator[Ledgers]:
    """A private data directory (like a mounted volume) for ledgers and checkpoints, and the
    test's ledger on its backend."""
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    yield Ledgers(data, None if backend == "sqlite" else ledger_target)
