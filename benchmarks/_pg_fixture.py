"""A large PostgreSQL ledger loaded with ``COPY``: ``scale.py``'s task mix, the rows and events
the API writes.

Per block of 20 tasks (``scale.block_rows``): 3 running (by default 2 with a stale heartbeat
and 1 whose owner is dead: lost; ``lost_share`` below 0.15 leaves some of them running fresh),
1 queued, 8 closed roots each with one closed internal child (2 of those roots still wait for
their delivery). The rows go in with ``COPY`` (the insert trigger still writes every
``created`` event; the later events are copied), under one live owner (the returned holder
ledger, which holds its session lock as a real owner does: keep it open while measuring) and
one dead one (a token nobody ever locked). The outcome totals of the closed rows are seeded as
a migration seeds them, so ``status`` counts what the API would have counted. Shared by
``postgres_vs_sqlite.py`` and ``pg_scale.py``.
"""

from __future__ import annotations

import math
import os
import sys
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import scale  # noqa: E402
from task_state_guard import Ledger  # noqa: E402

#: The rows per ``COPY`` transaction, in blocks of 20 tasks.
BATCH_BLOCKS = 5000


def lost_in_block(block: int, lost_share: float) -> int:
    """How many of block ``block``'s 3 running tasks are lost so that ``lost_share`` of all
    tasks are (spread evenly over the blocks; at most 0.15, every running task)."""
    per_block = min(max(lost_share, 0.0), 0.15) * 20
    return math.floor((block + 1) * per_block + 1e-9) - math.floor(block * per_block + 1e-9)


def build(url: str, size: int, *, lost_share: float = 0.15, vacuum: bool = False,
          progress: bool = False) -> tuple[float, Ledger]:
    """Bulk-load ``size`` tasks (whole blocks of 20) into the PostgreSQL ledger at ``url``;
    returns (the clock value used as "now", the holder: this process's live owner).

    ``vacuum``: end with ``VACUUM (ANALYZE)`` of the ledger's tables (what autovacuum leaves
    on a ledger that grew over time: hint bits set, the visibility map current), else a plain
    ``ANALYZE``."""
    import psycopg
    from psycopg import sql
    from task_state_guard import rules
    from task_state_guard_postgres.url import parse

    now = time.time()
    holder = Ledger(url)
    probe = holder.create_task(name="bench.owner")
    holder.start_task(probe.id)  # takes this process's owner lock, as a worker does
    target = parse(url)
    schema = sql.Identifier(target.schema)
    with psycopg.connect(target.conninfo, autocommit=False) as conn:
        conn.execute(sql.SQL("SET search_path TO {}").format(schema))
        live = conn.execute("SELECT owner FROM tsg_tasks WHERE id = %s", (probe.id,)).fetchone()
        assert live is not None
        holder.close_task(probe.id, "cancelled", code="caller_cancelled")
        dead = uuid.uuid4().hex  # a token nobody ever locked: its owner is provably gone
        first = conn.execute("SELECT coalesce(max(seq), 0) + 1 FROM tsg_tasks").fetchone()
        assert first is not None
        conn.commit()
        blocks = size // 20
        seq = int(first[0])
        started = time.perf_counter()
        # PostgreSQL's insert trigger writes the created event alone: this plain session does
        # not set the trigger's gate (a SQLite build earlier in the same process may have set
        # scale's flag for its own layout's trigger).
        sqlite_flag, scale.INSERT_WRITES_STARTED = scale.INSERT_WRITES_STARTED, False
        for start in range(0, blocks, BATCH_BLOCKS):
            rows: list[tuple[object, ...]] = []
            events: list[tuple[object, ...]] = []
            for block in range(start, min(blocks, start + BATCH_BLOCKS)):
                lost = lost_in_block(block, lost_share)
                for stored in scale.block_rows(now, block, blocks, live[0], dead, lost):
                    rows.append((seq, *stored))
                    events.extend((seq, *e) for e in scale.later_events(stored))
                    seq += 1
            with conn.cursor() as cur:
                with cur.copy(f"COPY tsg_tasks(seq, {scale.INSERT_COLUMNS}) FROM STDIN") as copy:
                    for row in rows:
                        copy.write_row(row)
                with cur.copy("COPY tsg_events(task_seq, step, kind, state, code, at) "
                              "FROM STDIN") as copy:
                    for ev in events:
                        copy.write_row(ev)
            conn.commit()
            if progress:
                done = min(blocks, start + BATCH_BLOCKS) * 20
                print(f"loaded {done}/{blocks * 20} tasks in {time.perf_counter() - started:.0f} s",
                      file=sys.stderr, flush=True)
        scale.INSERT_WRITES_STARTED = sqlite_flag
        conn.execute("SELECT setval(pg_get_serial_sequence('tsg_tasks', 'seq'), %s)", (seq,))
        # The closed rows' outcome totals, as the layout's migration seeds them (the insert
        # trigger counts none: rows inserted closed never pass through a close).
        conn.execute("DELETE FROM tsg_totals")
        conn.execute("INSERT INTO tsg_totals(event, kind, state, code, total) "
                     + rules.TOTALS_SELECT.format(tasks="tsg_tasks"))
        conn.commit()
    with psycopg.connect(target.conninfo, autocommit=True) as conn:
        for table in ("tsg_tasks", "tsg_events", "tsg_totals"):
            name = sql.Identifier(target.schema, table)
            conn.execute(sql.SQL("VACUUM (ANALYZE) {}" if vacuum else "ANALYZE {}").format(name))
    return now, holder


__all__ = ["BATCH_BLOCKS", "build", "lost_in_block"]
