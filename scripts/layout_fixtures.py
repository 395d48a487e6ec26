"""Write the SQLite ledgers of earlier builds that ``tests/core/test_earlier_layouts.py`` opens.

A file keeps the exact text of the statements that created it, so a layout is only tested
against a migration when a file was written by the build that wrote that layout: for each
commit below, ``git archive`` exports its core package (standard library only, no install),
the system Python writes a small ledger with it through the public API (a queued task, a
running one with a failed child, a closed and delivered one), and the file is stored gzipped
under ``tests/core/fixtures/layouts/`` as ``<layout>-<commit>.sqlite.gz``.

Run from the repository root, with the history present (a full clone)::

    python3 scripts/layout_fixtures.py

``LAYOUTS`` names the last commit of main that wrote each stored text of a layout (found by
writing a fresh ledger with every commit that changed the core and grouping the files by
their schema text); ``REFUSED`` holds a development snapshot whose layout was changed again
before its version number was final (it must be refused, unchanged).
"""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "core" / "fixtures" / "layouts"

#: layout name -> the commit whose core wrote it.
LAYOUTS = {
    "v2": "ba47583",
    "v3": "2eb6a88",
    "v4": "596b3b2",
    "v5": "6ccdd40",
    "v6": "c808a6b",  # the checks' lines broken after IN, as every layout before rules.py
    "v6-rendered": "09bece6",  # the same layout rendered from rules.py on one line
    "v7": "cd372bd",
}
REFUSED = {"v3-snapshot": "6737902"}

_WRITE = r"""
import sys
from task_state_guard import Ledger
ledger = Ledger(sys.argv[1])
ledger.create_task(delivery_required=True)
running = ledger.create_task(delivery_required=True)
ledger.start_task(running.id)
done = ledger.create_task(delivery_required=True)
ledger.start_task(done.id)
ledger.close_task(done.id, "succeeded")
ledger.set_delivery(done.id, "delivered")
child = ledger.create_task(parent_id=running.id)
ledger.start_task(child.id)
ledger.close_task(child.id, "failed")
ledger.close()
"""


def write(name: str, commit: str, scratch: Path) -> Path:
    """The gzipped ledger that ``commit``'s core writes, as ``OUT/<name>-<commit>.sqlite.gz``."""
    tree = scratch / commit
    tree.mkdir(mode=0o700)
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", commit, "packages/core/src"],
        check=True, capture_output=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    db = tree / "ledger" / "tasks.sqlite"
    db.parent.mkdir(mode=0o700)
    env = {**os.environ, "PYTHONPATH": str(tree / "packages" / "core" / "src")}
    subprocess.run([sys.executable, "-c", _WRITE, str(db)], check=True, env=env, cwd=scratch)
    target = OUT / f"{name}-{commit}.sqlite.gz"
    with gzip.GzipFile(target, "wb", mtime=0) as out:
        out.write(db.read_bytes())
    return target


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        os.chmod(scratch, 0o700)
        for name, commit in {**LAYOUTS, **REFUSED}.items():
            print(write(name, commit, scratch).relative_to(ROOT))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
