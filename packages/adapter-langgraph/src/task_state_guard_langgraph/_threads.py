"""Which checkpointer threads ``recover()`` looks at, read without walking every checkpoint.

A thread's checkpoints are many (one per step of every invocation); ``recover()`` needs only
the thread ids, then one latest-checkpoint read per thread. The savers LangGraph ships keep
checkpoints keyed by ``(thread_id, checkpoint_ns, checkpoint_id)``, so the distinct thread ids
come from that key: a skip scan on the primary-key index in SQLite and PostgreSQL (one index
probe per thread), the top-level keys of the in-memory saver. Any other saver falls back to
``saver.list(None)``, which reads every checkpoint.
"""

from __future__ import annotations

from typing import Any

#: Next thread id after the previous one, one index probe each (a loose index scan): the
#: cost follows the number of threads, not of checkpoints.
_SKIP_SCAN = (
    "WITH RECURSIVE t(id) AS ("
    " SELECT (SELECT MIN(thread_id) FROM checkpoints)"
    " UNION ALL"
    " SELECT (SELECT MIN(thread_id) FROM checkpoints WHERE thread_id > t.id)"
    " FROM t WHERE t.id IS NOT NULL"
    ") SELECT id FROM t WHERE id IS NOT NULL"
)


def _kind(saver: Any) -> str:
    names = {cls.__module__ + "." + cls.__name__ for cls in type(saver).__mro__}
    if "langgraph.checkpoint.sqlite.SqliteSaver" in names:
        return "sqlite"
    if "langgraph.checkpoint.postgres.PostgresSaver" in names:
        return "postgres"
    if "langgraph.checkpoint.memory.InMemorySaver" in names:
        return "memory"
    return "other"


def thread_ids(saver: Any) -> list[str]:
    """Distinct thread ids of the saver's top-level checkpoints, sorted."""
    kind = _kind(saver)
    if kind == "sqlite":
        with saver.cursor(transaction=False) as cur:
            cur.execute(_SKIP_SCAN)
            return [str(row[0]) for row in cur.fetchall()]
    if kind == "postgres":
        with saver._cursor() as cur:
            cur.execute(_SKIP_SCAN)
            return [str(row["id"]) for row in cur.fetchall()]
    if kind == "memory":
        return sorted(str(t) for t, spaces in list(saver.storage.items()) if spaces.get(""))
    seen: dict[str, None] = {}
    for tup in saver.list(None):
        cfg = tup.config.get("configurable", {})
        if cfg.get("checkpoint_ns", "") == "":
            seen.setdefault(str(cfg["thread_id"]), None)
    return list(seen)


async def athread_ids(saver: Any) -> list[str]:
    """:func:`thread_ids` for async savers (``AsyncSqliteSaver``, ``AsyncPostgresSaver``)."""
    names = {cls.__module__ + "." + cls.__name__ for cls in type(saver).__mro__}
    if "langgraph.checkpoint.sqlite.aio.AsyncSqliteSaver" in names:
        await saver.setup()
        async with saver.lock, saver.conn.execute(_SKIP_SCAN) as cur:
            return [str(row[0]) for row in await cur.fetchall()]
    if "langgraph.checkpoint.postgres.aio.AsyncPostgresSaver" in names:
        async with saver._cursor() as cur:
            await cur.execute(_SKIP_SCAN)
            return [str(row["id"]) for row in await cur.fetchall()]
    if _kind(saver) != "other":
        return thread_ids(saver)
    seen: dict[str, None] = {}
    async for tup in saver.alist(None):
        cfg = tup.config.get("configurable", {})
        if cfg.get("checkpoint_ns", "") == "":
            seen.setdefault(str(cfg["thread_id"]), None)
    return list(seen)
