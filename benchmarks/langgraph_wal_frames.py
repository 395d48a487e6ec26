"""Pages a guarded LangGraph invocation writes to a SQLite ledger, by b-tree.

A 10-node graph (no checkpointer, no-op nodes) is guarded on a fresh ledger, run ``--warm``
times so the ledger holds history, and then ``--count`` more times with automatic
checkpointing off; the write-ahead log then holds every page those invocations wrote. Each
frame's page is mapped to its table or index through SQLite's ``dbstat`` table. Node history
on (the default) and off, one after the other. Prints one JSON object. Deterministic for one
tree (no timing): a before/after that moves a count here moves the work every commit does.

    .venv/bin/python benchmarks/langgraph_wal_frames.py [--warm 3000] [--count 100]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import gc
import json
import shutil
import sqlite3
import struct
import tempfile
from pathlib import Path
from typing import Any

from langgraph_overhead import build
from task_state_guard_langgraph import guard

WAL_HEADER = 32
FRAME_HEADER = 24


def frames_by_tree(db: str) -> list[str]:
    """The b-tree (table or index name) of every frame in ``db``'s write-ahead log."""
    copy = db + ".copy"
    shutil.copy(db, copy)
    shutil.copy(db + "-wal", copy + "-wal")
    conn = sqlite3.connect(copy)
    try:
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
        owner = dict(conn.execute("SELECT pageno, name FROM dbstat"))
    finally:
        conn.close()
    wal = Path(db + "-wal").read_bytes()
    names = []
    offset = WAL_HEADER
    while offset + FRAME_HEADER + page_size <= len(wal):
        page = struct.unpack(">I", wal[offset:offset + 4])[0]
        names.append("page 1 (header)" if page == 1 else owner.get(page, "other"))
        offset += FRAME_HEADER + page_size
    return names


def measure(root: Path, record_nodes: bool, warm: int, count: int) -> dict[str, Any]:
    db = str(root / f"ledger-{record_nodes}.sqlite")
    app = guard(build(), db=db, strict=True, record_nodes=record_nodes)
    try:
        for _ in range(warm):
            app.invoke({"n": 0})
        for conn in [o for o in gc.get_objects() if isinstance(o, sqlite3.Connection)]:
            with contextlib.suppress(sqlite3.ProgrammingError):  # a closed connection
                conn.execute("PRAGMA wal_autocheckpoint = 0")
        with sqlite3.connect(db) as conn:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        for _ in range(count):
            app.invoke({"n": 0})
        names = frames_by_tree(db)
    finally:
        app.close()
    by_tree = collections.Counter(names)
    return {
        "frames_per_invocation": round(len(names) / count, 2),
        "by_tree": {name: round(n / count, 2) for name, n in by_tree.most_common()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warm", type=int, default=3000)
    parser.add_argument("--count", type=int, default=100)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        result = {
            "benchmark": "langgraph_wal_frames",
            "nodes": 10,
            "warm_invocations": args.warm,
            "invocations": args.count,
            "node_history": measure(Path(tmp), True, args.warm, args.count),
            "invocations_only": measure(Path(tmp), False, args.warm, args.count),
        }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
