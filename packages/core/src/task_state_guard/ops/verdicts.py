"""The verdict outbox: lost logical tasks owed to the adapters of the framework that opened them.

A close that declares an adapter's logical task lost (a ``timed_out`` close with one of
:data:`~task_state_guard.model.LOST_CODES`) records a ``pending`` verdict in the same statement
(the schema's trigger, or on PostgreSQL a reconcile pass's own set-based statement), whoever
makes the close: ``tsg reconcile``, an adapter's boot or periodic pass, another host. Adapters of
that framework drain them: :func:`claim` takes a batch with a lease (two live publishers never
hold the same verdict; an expired lease can be claimed again), the adapter publishes each one
(result backend, ``on_lost``), then :func:`mark_published` (or :func:`release` to give a
verdict back for a later drain). Publishing is therefore at least once across crashes (a
publisher that dies between its publish and its mark leaves the verdict to the next claim
once the lease expired) and exactly once otherwise.

The rules are here (what may be claimed, for how long, in which order and batches); each
backend's ``queries`` writes the statements in its own SQL (PostgreSQL's claim skips the rows
another claim holds). Nothing here returns an aggregate with ids; :func:`counts` is counts
only.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..model import (
    FRAMEWORK_LABELS,
    LOST_CODES,
    InvalidInput,
    canonical_id,
    check_framework,
    check_seconds,
    is_canonical,
    is_valid_name,
    is_valid_thread_id,
)
from ..rules import sql_set as sql_list

if TYPE_CHECKING:
    from ..store.protocol import Database

#: Most verdicts one claim may take.
MAX_CLAIM = 10_000
_CHUNK = 500  # ids per statement


@dataclass(frozen=True, slots=True)
class Verdict:
    """One pending verdict a publisher claimed (in-process only: it carries ids).

    ``task_id``: the logical task's ledger id; ``framework``: the framework it is owed to;
    ``framework_id``: the framework's own id of the job where one was stored (a canonical
    UUID), else ``None``; ``name``: the name label; ``code``: why it was lost (``owner_lost``,
    ``restart_stale`` or ``deadline_exceeded``); ``recorded_at``: when the close was made;
    ``claim``/``lease_until``: this claim's token and the ledger-clock time its lease ends;
    ``thread_id``: the job's thread where one was stored, else ``None``.
    """

    task_id: str
    framework: str
    framework_id: str | None
    name: str | None
    code: str
    recorded_at: float
    claim: str
    lease_until: float
    #: The framework's thread of the job where one was stored (a LangGraph thread id).
    thread_id: str | None = None


def current(db: Database) -> bool:
    """True when the ledger's layout has the outbox (an older layout, read in place by a
    read-only open, has none: it owes no verdicts)."""
    return db.layout.has_outbox


def _chunks(ids: list[str]) -> Iterable[list[str]]:
    for start in range(0, len(ids), _CHUNK):
        yield ids[start : start + _CHUNK]


def _ids(task_ids: Iterable[Any], what: str) -> list[str]:
    if isinstance(task_ids, str | bytes) or not isinstance(task_ids, Iterable):
        raise InvalidInput(f"{what} must be an iterable")
    return list(dict.fromkeys(canonical_id(t) for t in task_ids))


def _finite(value: Any) -> bool:
    return type(value) in (int, float) and math.isfinite(value)


def _verdict(row: tuple[Any, ...], claim_token: str, lease_until: float) -> Verdict | None:
    """A claimed row as a Verdict; None when it fails validation (doctor reports it)."""
    task_id, fid, name, code, framework, recorded, thread = row
    if not (
        type(task_id) is str and is_canonical(task_id)
        and (fid is None or (type(fid) is str and is_canonical(fid)))
        and (name is None or (type(name) is str and is_valid_name(name)))
        and code in LOST_CODES and framework in FRAMEWORK_LABELS and _finite(recorded)
        and (thread is None or is_valid_thread_id(thread))
    ):
        return None
    return Verdict(task_id, framework, fid, name, code, float(recorded), claim_token, lease_until,
                   thread)



def _claimable(db: Database, label: str) -> bool:
    with db.read() as conn:
        return bool(db.queries.any_claimable(conn, label, db.now()))


def claimable(db: Database, framework: str) -> bool:
    """Whether a pending verdict of ``framework`` is free to claim now (its lease free or
    expired): one read transaction, an index probe with ``LIMIT 1``; it writes nothing and
    takes no write lock. An older layout (no outbox) owes none."""
    label = check_framework(framework)
    if label is None:
        raise InvalidInput("framework must be given")
    return current(db) and _claimable(db, label)


def claim(
    db: Database,
    framework: str,
    *,
    limit: int = 100,
    lease_seconds: float = 60.0,
    task_ids: Iterable[Any] | None = None,
) -> list[Verdict]:
    """Claim up to ``limit`` pending verdicts of ``framework`` whose lease is free or expired,
    oldest first, for ``lease_seconds`` (one write transaction); ``task_ids`` restricts the
    claim to those logical tasks. A claimed verdict is not handed to another claim until its
    lease ends."""
    label = check_framework(framework)
    if label is None:
        raise InvalidInput("framework must be given")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_CLAIM:
        raise InvalidInput("limit must be an integer from 1 to 10000")
    lease = check_seconds(lease_seconds, "lease_seconds", allow_zero=False)
    only = None if task_ids is None else _ids(task_ids, "task_ids")
    if only is not None and not only:
        return []
    if only is None and not _claimable(db, label):
        return []  # a drain that finds nothing owed, the usual case, takes no write lock
    token = secrets.token_hex(16)
    found: list[Verdict] = []
    with db.write() as conn:
        now = db.now()
        until = now + lease
        groups: list[list[str] | None] = [None] if only is None else list(_chunks(only))
        left = limit
        for group in groups:
            if left <= 0:
                break
            seqs = db.queries.claim_verdicts(conn, label, now, until, token, group, left)
            left -= len(seqs)
            for start in range(0, len(seqs), _CHUNK):
                part = seqs[start : start + _CHUNK]
                for row in db.queries.claimed(conn, part, db.layout.has_threads):
                    verdict = _verdict(tuple(row), token, until)
                    if verdict is not None:
                        found.append(verdict)
    return found


def _update(db: Database, ids: list[str], token: str | None = None) -> int:
    """Publish (``token`` None: with the clock) or release (``token``'s leases) ``ids``."""
    done = 0
    if not ids:
        return 0
    with db.write() as conn:
        now = db.now() if token is None else 0.0
        for group in _chunks(ids):
            if token is None:
                done += db.queries.publish_verdicts(conn, now, group)
            else:
                done += db.queries.release_verdicts(conn, token, group)
    return done


def mark_published(db: Database, task_ids: Iterable[Any]) -> int:
    """Mark the pending verdicts of ``task_ids`` published (whoever holds their lease; one
    already published stays as it is); returns how many changed. One write transaction."""
    return _update(db, _ids(task_ids, "task_ids"))


def release(db: Database, verdicts: Iterable[Verdict]) -> int:
    """Give claimed verdicts back unpublished (their lease ends now, if still this claim's);
    returns how many were released."""
    if isinstance(verdicts, str | bytes) or not isinstance(verdicts, Iterable):
        raise InvalidInput("verdicts must be an iterable of Verdict objects")
    by_claim: dict[str, list[str]] = {}
    for verdict in verdicts:
        if not isinstance(verdict, Verdict):
            raise InvalidInput("verdicts must be Verdict objects")
        by_claim.setdefault(verdict.claim, []).append(verdict.task_id)
    return sum(_update(db, ids, token) for token, ids in by_claim.items())


def counts(db: Database, conn: Any, now: float) -> tuple[dict[str, dict[str, int]], Any]:
    """Verdicts by state and framework (every framework, zeros included) and the age of the
    oldest pending one (None when none, or when the layout has no outbox); counts only."""
    by_state = {state: dict.fromkeys(sorted(FRAMEWORK_LABELS), 0)
                for state in ("pending", "published")}
    oldest: float | None = None
    if current(db):
        for framework, state, count, first in db.queries.verdict_counts(conn):
            if state not in by_state or framework not in FRAMEWORK_LABELS:
                continue  # only a tampered row has such values; doctor reports it
            by_state[state][framework] += int(count)
            if state == "pending" and _finite(first) and (oldest is None or first < oldest):
                oldest = float(first)
    age = None if oldest is None else round(max(0.0, now - oldest), 3)
    return by_state, age


def consistency_sql(fin: Callable[[str], str]) -> str:
    """Doctor's count of outbox findings, one SQL expression per backend (``fin``: the dialect's
    finite-number test of a column): a verdict whose task is missing, was not closed as lost,
    or belongs to another framework; a malformed verdict (state, times, lease); and a logical
    task an adapter opened that was closed as lost without its verdict."""
    lost = sql_list(LOST_CODES)
    return f"""SELECT (SELECT count(*) FROM tsg_verdicts v LEFT JOIN tsg_tasks t
        ON t.seq = v.task_seq
    WHERE t.seq IS NULL OR t.framework IS NULL OR v.framework <> t.framework
        OR v.framework NOT IN {sql_list(FRAMEWORK_LABELS)}
        OR t.status <> 'timed_out' OR t.terminal_code IS NULL OR t.terminal_code NOT IN {lost}
        OR v.state NOT IN ('pending','published') OR NOT {fin("v.recorded_at")}
        OR v.recorded_at <> t.ended_at
        OR (v.state = 'published') <> (v.published_at IS NOT NULL)
        OR (v.published_at IS NOT NULL AND NOT ({fin("v.published_at")}
            AND v.published_at >= v.recorded_at))
        OR (v.lease_until IS NULL) <> (v.claim IS NULL)
        OR (v.state = 'published' AND v.claim IS NOT NULL)
        OR (v.claim IS NOT NULL AND (length(v.claim) <> 32 OR NOT {fin("v.lease_until")})))
    + (SELECT count(*) FROM tsg_tasks t WHERE t.framework IS NOT NULL
        AND t.status = 'timed_out' AND t.terminal_code IN {lost}
        AND NOT EXISTS (SELECT 1 FROM tsg_verdicts v WHERE v.task_seq = t.seq))"""


__all__ = [
    "MAX_CLAIM", "Verdict", "claim", "claimable", "consistency_sql", "counts", "current",
    "mark_published", "release",
]
