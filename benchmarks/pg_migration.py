"""A large PostgreSQL ledger of an earlier layout migrated to this release's, timed.

For each earlier layout asked for (``--from 3 9``: the oldest PostgreSQL layout and the
previous one):

1. N tasks (default 1,000,000) are built once in this release's layout with
   ``_pg_fixture.build`` (``scale.py``'s task mix: a tenth lost running tasks, loaded with
   ``COPY``);
2. that layout's ``pg_dump`` fixture (``tests/fixtures/layouts/pg-v<N>-<commit>.sql.gz``: the
   schema the build of that layout wrote, with its functions and triggers) is restored into a
   scratch schema, emptied, and given the built rows: every column that layout has, of the
   tasks, their events and (from layout 4) the outcome totals and verdicts, copied with the
   row triggers off (``session_replication_role = replica``: the events come from the build,
   as the API wrote them), then ``VACUUM (ANALYZE)``;
3. ``tsg init`` in a fresh process migrates it to this release's layout: wall, client CPU,
   client peak RSS and the server CPU of its backends. The migration is one transaction that
   takes the tasks table's lock: the ledger's writers wait for it that long;
4. ``tsg doctor`` in a fresh process must call the migrated ledger healthy, with every task
   still there.

Prints one JSON object; the scratch schemas are dropped at the end.

    .venv/bin/python benchmarks/pg_migration.py [--size 1000000] [--from 3 9] [--pg URL]
        [--out FILE]
"""

from __future__ import annotations

import argparse
import glob
import gzip
import json
import os
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import _bench  # noqa: E402
import _pg_fixture  # noqa: E402
from pg_scale import cli, sizes  # noqa: E402

LAYOUTS = os.path.join(os.path.dirname(HERE), "tests", "fixtures", "layouts")
DUMPED_SCHEMA = "tsg_layout_fixture"  # the schema name inside every dump
#: The tables whose rows are copied (those the layout has); tsg_meta and tsg_migrations stay
#: the dump's own.
COPIED = ("tsg_tasks", "tsg_events", "tsg_totals", "tsg_verdicts")


def dump_of(version: int) -> str:
    (path,) = glob.glob(os.path.join(LAYOUTS, f"pg-v{version}-*.sql.gz"))
    return path


def _columns(conn: Any, schema: str, table: str) -> list[str]:
    rows = conn.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_schema = %s "
        "AND table_name = %s ORDER BY ordinal_position", (schema, table)).fetchall()
    return [str(r[0]) for r in rows]


def earlier_layout(version: int, source_url: str) -> tuple[str, dict[str, Any]]:
    """A scratch schema in layout ``version`` holding the rows of ``source_url``'s ledger;
    its URL and what was copied."""
    import psycopg

    url = _bench.pg_url(_bench.split_url(source_url)[0], prefix=f"tsgmig{version}")
    base, schema = _bench.split_url(url)
    _, source = _bench.split_url(source_url)
    assert schema and source
    with open(dump_of(version), "rb") as handle:
        text = gzip.decompress(handle.read()).decode()
    started = time.perf_counter()
    copied: dict[str, int] = {}
    with psycopg.connect(base) as conn:  # one transaction, committed on leaving
        conn.execute(text.replace(DUMPED_SCHEMA, schema))  # type: ignore[arg-type]
        conn.execute("SET LOCAL session_replication_role = replica")  # no row triggers
        tables = [t for t in COPIED if _columns(conn, schema, t)]
        conn.execute("TRUNCATE " + ", ".join(f'"{schema}".{t}' for t in tables))
        for table in tables:
            theirs = set(_columns(conn, source, table))
            cols = ", ".join(c for c in _columns(conn, schema, table) if c in theirs)
            cur = conn.execute(f'INSERT INTO "{schema}".{table} ({cols}) '
                               f'SELECT {cols} FROM "{source}".{table}')
            copied[table] = cur.rowcount
        conn.execute(f"SELECT setval(pg_get_serial_sequence('\"{schema}\".tsg_tasks', 'seq'), "
                     f'(SELECT max(seq) FROM "{schema}".tsg_tasks))')
    with psycopg.connect(base, autocommit=True) as conn:
        for table in tables:
            conn.execute(f'VACUUM (ANALYZE) "{schema}".{table}')
        stored = conn.execute(f'SELECT max(version) FROM "{schema}".tsg_migrations').fetchone()
    assert stored is not None and stored[0] == version, stored
    return url, {"rows": copied, "seconds": round(time.perf_counter() - started, 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=1_000_000)
    parser.add_argument("--from", dest="versions", type=int, nargs="+", default=[3, 9],
                        help="the earlier layouts to migrate from (their dumps must exist)")
    parser.add_argument("--pg", default=_bench.PG_BASE, help="PostgreSQL database URL (no schema)")
    parser.add_argument("--out", help="also write the JSON to this file")
    args = parser.parse_args()
    size = args.size // 20 * 20
    report: dict[str, Any] = {"benchmark": "pg_migration", **_bench.stamp(),
                              "fixture": {"tasks": size}, "migrations": {}}
    source = _bench.pg_url(args.pg, prefix="tsgmigsrc")
    started = time.perf_counter()
    _now, holder = _pg_fixture.build(source, size, lost_share=0.10, vacuum=True)
    holder.close()
    report["fixture"]["load_seconds"] = round(time.perf_counter() - started, 1)
    try:
        for version in args.versions:
            url, copy = earlier_layout(version, source)
            try:
                entry: dict[str, Any] = {"dump": os.path.basename(dump_of(version)),
                                         "copy": copy, "size_before": sizes(url)}
                entry["migrate"] = cli(url, "init")
                entry["doctor"] = cli(url, "doctor")
                result = entry["doctor"].get("result") or {}
                entry["doctor_healthy"] = result.get("healthy") is True
                entry["tasks_after"] = sizes(url)["tasks"]
                entry["every_task_kept"] = entry["tasks_after"] == copy["rows"]["tsg_tasks"]
                report["migrations"][f"v{version}"] = entry
                print(f"[pg_migration] v{version}: migrate "
                      f"{entry['migrate'].get('seconds')} s, doctor healthy "
                      f"{entry['doctor_healthy']}", file=sys.stderr, flush=True)
            finally:
                _bench.drop_pg_schema(url)
    finally:
        _bench.drop_pg_schema(source)
    report["loadavg_1m_at_end"] = _bench.loadavg()
    ok = all(e["doctor_healthy"] and e["every_task_kept"] and "error" not in e["migrate"]
             for e in report["migrations"].values())
    text = json.dumps(report, sort_keys=True)
    if args.out:
        with open(args.out, "w") as handle:
            handle.write(text + "\n")
    print(text)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
