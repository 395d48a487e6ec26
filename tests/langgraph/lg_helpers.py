"""Shared helpers for tests/langgraph (graphs are built per test; these only inspect)."""

from __future__ import annotations

import operator
from typing import Annotated, Any, TypedDict

from task_state_guard import Ledger


class State(TypedDict, total=False):
    log: Annotated[list[str], operator.add]
    answer: str


def tree(ledger: Ledger, task_id: str) -> dict[str, Any]:
    """The ledger subtree under ``task_id`` as nested dicts (children in creation order: the
    ledger's order, which also orders node attempts recorded in one write)."""
    task = ledger.get_task(task_id)
    children = sorted(ledger.children_of(task_id), key=lambda t: t.created_at)
    return {
        "id": task.id,
        "name": task.name,
        "status": str(task.status),
        "code": task.terminal_code,
        "delivery_required": task.delivery_required,
        "delivery": str(task.delivery_status),
        "delivery_code": task.delivery_code,
        "children": [tree(ledger, c.id) for c in children],
    }


def shape(node: dict[str, Any]) -> tuple[Any, ...]:
    """(name, status, code, (children...)) for compact assertions."""
    return (
        node["name"],
        node["status"],
        node["code"],
        tuple(shape(c) for c in node["children"]),
    )


def assert_healthy(ledger: Ledger) -> None:
    report = ledger.doctor()
    assert report["healthy"] is True, report


def attempts(node: dict[str, Any]) -> list[dict[str, Any]]:
    return list(node["children"])
