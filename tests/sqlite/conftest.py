"""Tests of SQLite storage itself: the file and its directory (modes, symbolic and hard links,
sidecars, the owner locks), its layouts and their migrations (0.1.0's file and the files earlier
builds wrote, ``tests/fixtures``), damaged and newer files, and dry-run's byte-for-byte
promise. Each opens a SQLite path of its own (no backend matrix: PostgreSQL's storage has
``tests/postgres``); the helpers are the core suite's (``tests/core/core_helpers.py``)."""

from __future__ import annotations

import sys
from pathlib import Path

CORE = str(Path(__file__).resolve().parents[1] / "core")
if CORE not in sys.path:
    sys.path.insert(0, CORE)
