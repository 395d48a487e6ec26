"""A process killed while it built a new ledger leaves its hidden temporary behind; the next
creation of the same ledger removes the stale ones and nothing else."""

from __future__ import annotations

import os
import time
from pathlib import Path

from task_state_guard import Ledger


def _leftover(directory: Path, name: str, age: float, suffix: str = "") -> Path:
    path = directory / f".{name}.{os.urandom(8).hex()}.tsg-new{suffix}"
    path.write_bytes(b"SQLite format 3\x00 half-built")
    past = time.time() - age
    os.utime(path, (past, past))
    return path


def test_stale_temporaries_of_the_same_ledger_are_removed_when_it_is_created(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "ledgers"
    directory.mkdir(mode=0o700)
    stale = _leftover(directory, "tasks.sqlite", 3600)
    stale_wal = Path(str(stale) + "-wal")
    stale_wal.write_bytes(b"")
    os.utime(stale_wal, (time.time() - 3600,) * 2)
    fresh = _leftover(directory, "tasks.sqlite", 5)  # maybe another process building now
    other = _leftover(directory, "other.sqlite", 3600)  # another ledger's: not ours to judge
    unrelated = directory / ".tasks.sqlite.not-hex.tsg-new"
    unrelated.write_bytes(b"keep")
    os.utime(unrelated, (time.time() - 3600,) * 2)

    ledger = Ledger(str(directory / "tasks.sqlite"))
    try:
        assert ledger.doctor()["healthy"] is True
    finally:
        ledger.close()
    assert not stale.exists() and not stale_wal.exists()
    assert fresh.exists() and other.exists() and unrelated.exists()


def test_an_existing_ledger_is_opened_without_touching_anything_beside_it(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "ledgers"
    directory.mkdir(mode=0o700)
    Ledger(str(directory / "tasks.sqlite")).close()
    stale = _leftover(directory, "tasks.sqlite", 3600)
    Ledger(str(directory / "tasks.sqlite")).close()
    assert stale.exists()  # only a creation cleans up after a dead creation
