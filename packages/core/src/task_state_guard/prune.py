"""Retention (E6): delete whole closed task trees older than a cut-off, in bounded batches."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from .model import InvalidInput, check_seconds

if TYPE_CHECKING:
    from .ledger import Ledger

BATCH = 500

_ROOTS = (
    "SELECT seq, id, updated_at FROM tsg_tasks "
    "WHERE parent_id IS NULL AND delivery_closed_at IS NOT NULL AND updated_at <= ? "
    "AND (updated_at > ? OR (updated_at = ? AND seq > ?)) ORDER BY updated_at, seq LIMIT ?"
)
_TREE = (
    "WITH RECURSIVE tree(seq, id) AS ("
    " SELECT seq, id FROM tsg_tasks WHERE seq = ?"
    " UNION ALL SELECT c.seq, c.id FROM tsg_tasks c JOIN tree ON c.parent_id = tree.id)"
    " SELECT t.seq, t.status, t.delivery_status, t.updated_at FROM tree"
    " JOIN tsg_tasks t ON t.seq = tree.seq"
)
_TERMINAL = frozenset({"succeeded", "failed", "timed_out", "cancelled"})


def prune(ledger: Ledger, older_than_seconds: float, *, dry_run: bool = False) -> dict[str, Any]:
    """Delete closed trees (every task terminal and delivery-closed, last change before the
    cut-off) with their events; each batch is its own transaction. Counts only."""
    age = check_seconds(older_than_seconds, "older_than_seconds", allow_zero=True)
    if not isinstance(dry_run, bool):
        raise InvalidInput("dry_run must be a boolean")
    counts = {"trees_deleted": 0, "tasks_deleted": 0, "events_deleted": 0, "trees_retained": 0}
    cutoff: float | None = None
    last_updated, last_seq = -math.inf, -1
    while True:
        context = ledger._read(query_only=True) if dry_run else ledger._write()
        with context as conn:
            if cutoff is None:
                cutoff = ledger._now() - age
            roots = conn.execute(
                _ROOTS, (cutoff, last_updated, last_updated, last_seq, BATCH)
            ).fetchall()
            for root_seq, _root_id, updated in roots:
                last_updated, last_seq = updated, root_seq
                tree = conn.execute(_TREE, (root_seq,)).fetchall()
                closed = all(
                    status in _TERMINAL and delivery != "pending" and when <= cutoff
                    for _seq, status, delivery, when in tree
                )
                if not closed:
                    counts["trees_retained"] += 1
                    continue
                seqs = sorted((row[0] for row in tree), reverse=True)
                events = 0
                for start in range(0, len(seqs), 500):
                    chunk = seqs[start : start + 500]
                    marks = ",".join("?" * len(chunk))
                    events += conn.execute(
                        f"SELECT count(*) FROM tsg_events WHERE task_seq IN ({marks})", chunk
                    ).fetchone()[0]
                    if not dry_run:
                        conn.execute(f"DELETE FROM tsg_events WHERE task_seq IN ({marks})", chunk)
                if not dry_run:
                    conn.executemany("DELETE FROM tsg_tasks WHERE seq = ?", [(s,) for s in seqs])
                counts["trees_deleted"] += 1
                counts["tasks_deleted"] += len(seqs)
                counts["events_deleted"] += events
        if len(roots) < BATCH:
            break
    return {"dry_run": dry_run, "applied": not dry_run, **counts}
