"""A LangGraph "service" process of the fleet test (not a test module): the crash graph of
tests/langgraph with a PostgresSaver, guarded on a PostgreSQL ledger in the same database.

argv: ledger URL, checkpointer URL, marker path, thread id, invocation id. The ``slow`` node
writes the marker and blocks until the test SIGKILLs this process.
"""

from __future__ import annotations

import sys

from langgraph.checkpoint.postgres import PostgresSaver
from lg_crash_graph import builder
from task_state_guard_langgraph import guard

if __name__ == "__main__":
    db, checkpoints, marker, thread_id, invocation_id = sys.argv[1:6]
    with PostgresSaver.from_conn_string(checkpoints) as saver:
        app = guard(builder(marker).compile(checkpointer=saver, name="crashy"), db=db,
                    strict=True)
        app.invoke(
            {"log": []},
            {"configurable": {"thread_id": thread_id}},
            invocation_id=invocation_id,
            durability="sync",
        )
    raise SystemExit("unreachable: the node blocks until SIGKILL")
