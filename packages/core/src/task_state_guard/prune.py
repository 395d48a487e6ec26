"""Retention: delete whole closed task trees older than a cut-off, in bounded batches."""

from __future__ import annotations

import contextlib
import math
from collections import defaultdict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from . import verdicts
from .model import TERMINAL_STATES, InvalidInput, check_seconds

if TYPE_CHECKING:
    from .store import Database

BATCH = 2000  # roots per transaction

# Candidate roots: delivery closed, last change before the cut-off (a partial index).
_ROOTS = (
    "SELECT seq, delivery_updated_at FROM tsg_tasks "
    "WHERE parent_id IS NULL AND delivery_status != 'pending' AND delivery_updated_at <= ? "
    "AND (delivery_updated_at, seq) > (?, ?) ORDER BY delivery_updated_at, seq LIMIT ?"
)


# Progress only: how many candidate roots the pass will examine (the same partial index).
_COUNT_ROOTS = (
    "SELECT count(*) FROM tsg_tasks "
    "WHERE parent_id IS NULL AND delivery_status != 'pending' AND delivery_updated_at <= ?"
)

#: A progress callback: ``(done, total)`` once before the first batch and after each batch.
ProgressCallback = Callable[[int, int], object]


# A task whose lost verdict no adapter has published yet (current layout only).
_OWED = "(SELECT count(*) FROM tsg_verdicts v WHERE v.task_seq = t.seq AND v.state = 'pending')"


def _trees_sql(count: int, outbox: bool) -> str:
    marks = ",".join("?" * count)
    return (
        "WITH RECURSIVE tree(root, seq, id) AS ("
        f" SELECT seq, seq, id FROM tsg_tasks WHERE seq IN ({marks})"
        " UNION ALL SELECT tree.root, c.seq, c.id FROM tsg_tasks c"
        " JOIN tree ON c.parent_id = tree.id)"
        " SELECT tree.root, t.seq, t.status, t.delivery_status,"
        " CASE WHEN t.updated_at > t.delivery_updated_at THEN t.updated_at"
        " ELSE t.delivery_updated_at END,"
        " (SELECT count(*) FROM tsg_events e WHERE e.task_seq = t.seq),"
        f" {_OWED if outbox else '0'}"
        " FROM tree JOIN tsg_tasks t ON t.seq = tree.seq"
    )


def _closed_trees(
    conn: Any, roots: list[int], cutoff: float, outbox: bool
) -> tuple[list[list[int]], int, int]:
    """Return the task seqs of every fully closed tree, the number of their events, and how
    many trees must stay because some task in them is still open or recent, or still owes its
    framework a verdict (a pending verdict is never pruned before it was published)."""
    members: dict[int, list[int]] = defaultdict(list)
    events: dict[int, int] = defaultdict(int)
    keep: set[int] = set()
    for root, seq, status, delivery, updated, event_count, owed in conn.execute(
        _trees_sql(len(roots), outbox), roots
    ):
        members[root].append(seq)
        events[root] += event_count
        if (status not in TERMINAL_STATES or delivery == "pending" or not updated <= cutoff
                or owed):
            keep.add(root)
    trees = [members[r] for r in roots if r in members and r not in keep]
    return trees, sum(events[r] for r in roots if r in members and r not in keep), len(keep)


def prune(
    db: Database, older_than_seconds: float, *, dry_run: bool = False,
    progress: ProgressCallback | None = None,
) -> dict[str, Any]:
    """Delete closed trees (every task terminal and delivery-closed, last change before the
    cut-off) with their events; each batch is its own transaction. Counts only.

    ``progress(done, total)`` (optional) gets the candidate roots examined so far: once with
    ``(0, total)``, counted when the pass begins, and after each batch; ``total`` is corrected
    to ``done`` should other writers have added or removed candidates meanwhile, so the last
    call has ``done == total``. An exception it raises stops the pass; batches already
    committed stay deleted.
    """
    age = check_seconds(older_than_seconds, "older_than_seconds", allow_zero=True)
    if not isinstance(dry_run, bool):
        raise InvalidInput("dry_run must be a boolean")
    if progress is not None and not callable(progress):
        raise InvalidInput("progress must be callable")
    done = total = 0
    counts = {"trees_deleted": 0, "tasks_deleted": 0, "events_deleted": 0, "trees_retained": 0}
    cutoff: float | None = None
    last_updated, last_seq = -math.inf, -1
    outbox = verdicts.current(db)
    with contextlib.nullcontext() if dry_run else db.bulk():
        while True:
            context = db.read(query_only=True) if dry_run else db.write()
            with context as conn:
                if cutoff is None:
                    cutoff = db.now() - age
                    if progress is not None:
                        total = int(conn.execute(_COUNT_ROOTS, (cutoff,)).fetchone()[0])
                        progress(0, total)
                roots = conn.execute(_ROOTS, (cutoff, last_updated, last_seq, BATCH)).fetchall()
                if not roots:
                    break
                last_seq, last_updated = roots[-1]
                trees, events, kept = _closed_trees(conn, [r[0] for r in roots], cutoff, outbox)
                doomed = sorted((seq for tree in trees for seq in tree), reverse=True)
                if not dry_run and doomed:
                    keys = [(seq,) for seq in doomed]  # children first: they reference parents
                    conn.executemany("DELETE FROM tsg_events WHERE task_seq = ?", keys)
                    # their published verdicts go with them (a pending one kept its tree)
                    conn.executemany("DELETE FROM tsg_verdicts WHERE task_seq = ?", keys)
                    conn.executemany("DELETE FROM tsg_tasks WHERE seq = ?", keys)
                counts["trees_deleted"] += len(trees)
                counts["tasks_deleted"] += len(doomed)
                counts["events_deleted"] += events
                counts["trees_retained"] += kept
            done += len(roots)
            if progress is not None:
                progress(done, max(done, total))
            if len(roots) < BATCH:
                break
    if progress is not None and done < total:
        progress(done, done)  # others removed candidates meanwhile: the pass is complete
    return {"dry_run": dry_run, "applied": not dry_run, **counts}
