"""Doctor on PostgreSQL counts broken parent links, missing parents and children older than
their parent, in one join: the foreign key can be bypassed (``session_replication_role``),
and a cycle needs an out-of-order link."""

from __future__ import annotations

import uuid

import psycopg
from pg_fixtures import PG_BASE
from pg_helpers import schema_of
from task_state_guard import Ledger


def _tamper(url: str, *statements: tuple[str, tuple[str, ...]]) -> None:
    with psycopg.connect(PG_BASE, autocommit=False) as conn:
        conn.execute(f'SET search_path TO "{schema_of(url)}"')
        conn.execute("SET LOCAL session_replication_role = replica")  # no foreign-key checks
        for statement, params in statements:
            assert conn.execute(statement, params).rowcount == 1


def test_missing_parents_misordered_children_and_cycles_are_counted(pg_url: str) -> None:
    with Ledger(pg_url) as ledger:
        root = ledger.create_task(name="job").id
        child = ledger.create_task(name="job", parent_id=root).id
        grandchild = ledger.create_task(name="job", parent_id=child).id
        orphans = [ledger.create_task(name="job", parent_id=root).id for _ in range(2)]
        healthy = ledger.doctor()
        assert healthy["healthy"] is True
        assert healthy["foreign_key_violation_count"] == 0
        _tamper(pg_url,
                *(("UPDATE tsg_tasks SET parent_id = %s WHERE id = %s", (str(uuid.uuid4()), orphan))
                  for orphan in orphans),
                ("UPDATE tsg_tasks SET parent_id = %s WHERE id = %s", (grandchild, child)))
        report = ledger.doctor()
    assert report["foreign_key_violation_count"] == 2  # the orphans' parents are gone
    assert report["parent_order_violation_count"] == 1  # the child under its own child
    assert report["parent_cycle_count"] == 1  # child -> grandchild -> child
    assert report["healthy"] is False
    assert report["checks_not_run"] == {}
