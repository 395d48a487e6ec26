"""Write the ledgers of earlier builds that the tests of earlier layouts migrate.

A file keeps the exact text of the statements that created it, so a layout is only tested
against a migration when a file was written by the build that wrote that layout: for each
commit below, ``git archive`` exports its core package (standard library only, no install),
this interpreter writes a small ledger with it through the public API (a queued task, a
running one with a failed child, a closed and delivered one), and the file is stored gzipped
under ``tests/fixtures/layouts/`` as ``<layout>-<commit>.sqlite.gz``.

With ``--postgresql URL`` (a database such as ``postgresql://postgres@127.0.0.1:5432/test``)
it writes the PostgreSQL layouts too: the core and the PostgreSQL package of each commit in
``PG_LAYOUTS`` write the same tasks into a scratch schema, ``pg_dump --inserts`` saves it (as
``pg-v<N>-<commit>.sql.gz``, the schema named ``tsg_layout_fixture``) and the schema is
dropped. Run from the repository root, with the history present (a full clone), by the
project's interpreter (the PostgreSQL builds need psycopg)::

    .venv/bin/python scripts/layout_fixtures.py [--postgresql URL]

``LAYOUTS`` names a commit of main that wrote each stored text of a layout (found by
writing a fresh ledger with every commit that changed the core and grouping the files by
their schema text); ``REFUSED`` holds a development snapshot whose layout was changed again
before its version number was final (it must be refused, unchanged).
"""

from __future__ import annotations

import argparse
import gzip
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "layouts"

#: layout name -> a commit whose core wrote it (the first with that stored text).
LAYOUTS = {
    "v2": "ba47583",
    "v3": "2eb6a88",
    "v4": "596b3b2",
    "v5": "6ccdd40",
    "v6": "c808a6b",  # the checks' lines broken after IN, as every layout before rules.py
    "v6-rendered": "09bece6",  # the same layout rendered from rules.py on one line
    "v7": "cd372bd",
    "v8": "37672fd",  # rendered from v7's text by a regular expression, as no build since
}
REFUSED = {"v3-snapshot": "6737902"}
#: PostgreSQL layout version -> the last commit whose PostgreSQL package wrote it.
PG_LAYOUTS = {3: "b9d969a", 4: "18f73ab", 5: "f7312c2", 6: "ae51dda", 7: "41abc7d",
              8: "dfdebe7", 9: "4cb6b2f"}
PG_SCHEMA = "tsg_layout_fixture"

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


def export(commit: str, scratch: Path, *packages: str) -> dict[str, str]:
    """Export ``packages``' sources at ``commit``; the environment that imports them first."""
    tree = scratch / commit
    tree.mkdir(mode=0o700, exist_ok=True)
    sources = [f"packages/{package}/src" for package in packages]
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", commit, *sources], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    return {**os.environ, "PYTHONPATH": os.pathsep.join(str(tree / s) for s in sources)}


def write(name: str, commit: str, scratch: Path) -> Path:
    """The gzipped ledger that ``commit``'s core writes, as ``OUT/<name>-<commit>.sqlite.gz``."""
    env = export(commit, scratch, "core")
    db = scratch / commit / "ledger" / "tasks.sqlite"
    db.parent.mkdir(mode=0o700)
    subprocess.run([sys.executable, "-c", _WRITE, str(db)], check=True, env=env, cwd=scratch)
    target = OUT / f"{name}-{commit}.sqlite.gz"
    with gzip.GzipFile(target, "wb", mtime=0) as out:
        out.write(db.read_bytes())
    return target


def write_pg(version: int, commit: str, base: str, scratch: Path) -> Path:
    """The gzipped ``pg_dump`` of the schema ``commit``'s PostgreSQL package writes."""
    env = export(commit, scratch, "core", "backend-postgres")
    url = f"{base}{'&' if '?' in base else '?'}schema={PG_SCHEMA}"
    database = base.split("?", 1)[0]
    drop = ["psql", database, "-qc", f"DROP SCHEMA IF EXISTS {PG_SCHEMA} CASCADE"]
    subprocess.run(drop, check=True, capture_output=True)
    try:
        subprocess.run([sys.executable, "-c", _WRITE, url], check=True, env=env, cwd=scratch)
        dump = subprocess.run(
            ["pg_dump", "--schema", PG_SCHEMA, "--inserts", "--no-owner", "--no-privileges",
             database],
            check=True, capture_output=True,
        ).stdout
    finally:
        subprocess.run(drop, check=True, capture_output=True)
    # Plain SQL only: newer pg_dump brackets its output with psql's \\restrict meta-commands.
    dump = b"".join(line for line in dump.splitlines(keepends=True) if not line.startswith(b"\\"))
    target = OUT / f"pg-v{version}-{commit}.sql.gz"
    with gzip.GzipFile(target, "wb", mtime=0) as out:
        out.write(dump)
    return target


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--postgresql", metavar="URL", help="also the PostgreSQL layouts")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        os.chmod(scratch, 0o700)
        for name, commit in {**LAYOUTS, **REFUSED}.items():
            print(write(name, commit, scratch).relative_to(ROOT))
        for version, commit in PG_LAYOUTS.items() if args.postgresql else ():
            print(write_pg(version, commit, args.postgresql, scratch).relative_to(ROOT))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
