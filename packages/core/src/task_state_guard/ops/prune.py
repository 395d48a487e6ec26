"""Retention: delete whole closed task trees older than a cut-off, in bounded batches."""

from __future__ import annotations

import contextlib
import math
from collections import defaultdict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..model import TERMINAL_STATES, InvalidInput, check_seconds
from . import verdicts

if TYPE_CHECKING:
    from ..store.protocol import Database

BATCH = 2000  # roots per transaction

#: A progress callback: ``(done, total)`` once before the first batch and after each batch.
ProgressCallback = Callable[[int, int], object]


def _closed_trees(
    db: Database, conn: Any, roots: list[int], cutoff: float, outbox: bool
) -> tuple[dict[int, tuple[list[int], int]], int]:
    """Return every fully closed tree (root -> its task seqs and its number of events), and
    how many trees must stay because some task in them is still open or recent, or still owes
    its framework a verdict (a pending verdict is never pruned before it was published)."""
    members: dict[int, list[int]] = defaultdict(list)
    events: dict[int, int] = defaultdict(int)
    keep: set[int] = set()
    for root, seq, status, delivery, updated, event_count, owed in db.queries.trees(
        conn, roots, outbox
    ):
        members[root].append(seq)
        events[root] += event_count
        if (status not in TERMINAL_STATES or delivery == "pending" or not updated <= cutoff
                or owed):
            keep.add(root)
    trees = {r: (members[r], events[r]) for r in roots if r in members and r not in keep}
    return trees, len(keep)


def _hold(
    db: Database, conn: Any, roots: list[int], trees: dict[int, tuple[list[int], int]],
) -> tuple[dict[int, tuple[list[int], int]], int]:
    """Where other writers run beside a pass (the backend holds rows, not the database): hold
    the rows of the closed trees, then look for children the first reading did not see. A
    child committed under one of them before the hold shows in that second reading (its tree
    stays); a child added after it waits for this transaction and then finds its parent gone;
    a tree with a row held elsewhere stays for the next pass. What the first reading judged
    cannot have changed meanwhile: a closed task's states are final, and a verdict is owed only
    by a close. Return the trees that may go and how many more stay."""
    wanted = [seq for members, _ in trees.values() for seq in members]
    holding = db.queries.hold_for_delete(conn, wanted)
    if holding is None:  # the write transaction holds the whole database
        return trees, 0
    held, children = holding
    whole = {r: trees[r] for r in roots if r in trees and set(trees[r][0]) <= held}
    root_of = {seq: root for root, (members, _) in whole.items() for seq in members}
    grown = {root_of[parent] for parent, child in children
             if parent in root_of and child not in root_of}
    final = {r: tree for r, tree in whole.items() if r not in grown}
    return final, len(trees) - len(final)


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
            context = db.read() if dry_run else db.write()
            with context as conn:
                if cutoff is None:
                    cutoff = db.now() - age
                    if progress is not None:
                        total = db.queries.count_prunable(conn, cutoff)
                        progress(0, total)
                roots = db.queries.prunable_roots(conn, cutoff, (last_updated, last_seq), BATCH)
                if not roots:
                    break
                last_seq, last_updated = roots[-1]
                seqs = [r[0] for r in roots]
                trees, kept = _closed_trees(db, conn, seqs, cutoff, outbox)
                if not dry_run and trees:
                    trees, also_kept = _hold(db, conn, seqs, trees)
                    kept += also_kept
                doomed = sorted((seq for members, _ in trees.values() for seq in members),
                                reverse=True)
                events = sum(count for _, count in trees.values())
                if not dry_run and doomed:  # children first: they reference parents
                    db.queries.delete_tasks(conn, doomed)
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
