"""Fixtures of the deployment and example-project tests (helpers: deploy_helpers.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from deploy_helpers import Ledgers


@pytest.fixture
def ledgers(tmp_path: Path) -> Ledgers:
    """A private data directory (like a mounted volume) for ledgers and checkpoints."""
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    return Ledgers(data)
