"""Fixtures of the PostgreSQL backend tests (helpers live in ``pg_helpers``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pg_helpers import Workers


@pytest.fixture
def workers() -> Iterator[Workers]:
    pool = Workers()
    try:
        yield pool
    finally:
        pool.kill_all()
