"""The adapter README's ``setup_once`` recipe: two servers setting up LangGraph's
``AsyncPostgresSaver`` on a fresh database at the same time both succeed (LangGraph's own
``setup()`` run twice at once fails with ``UniqueViolation``). The code run is the README's."""

from __future__ import annotations

import asyncio
import re
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from lg_procs import PG_SERVER

README = Path(__file__).resolve().parents[2] / "packages" / "adapter-langgraph" / "README.md"


def _recipe() -> Any:
    text = README.read_text()
    found = re.search(r"<!-- setup-once -->\n```python\n(.*?)```", text, re.DOTALL)
    assert found, "the README lost its setup_once recipe"
    namespace: dict[str, Any] = {}
    exec(compile(found.group(1), str(README), "exec"), namespace)
    return namespace["setup_once"]


@pytest.mark.postgresql_only(reason="LangGraph's PostgreSQL checkpointer")
def test_two_servers_set_up_a_fresh_database_at_once(backend: str) -> None:
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

    setup_once = _recipe()

    async def server(url: str) -> None:
        async with AsyncPostgresSaver.from_conn_string(url) as saver:
            await setup_once(saver, url)

    for _ in range(5):
        name = f"tsgt_lg_setup_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(PG_SERVER + "test", autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{name}"')
        try:
            url = PG_SERVER + name

            async def both(url: str = url) -> None:
                await asyncio.wait_for(asyncio.gather(server(url), server(url)), 60)

            asyncio.run(both())
            with psycopg.connect(url) as conn:
                tables = {row[0] for row in conn.execute(
                    "SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}
            assert {"checkpoints", "checkpoint_writes", "checkpoint_migrations"} <= tables
        finally:
            with psycopg.connect(PG_SERVER + "test", autocommit=True) as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
